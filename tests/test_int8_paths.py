"""Every CPU kernel path of the int8 ops gives the same result.

* int8 GEMM (``cigemmlt_32``): each path (scalar, AVX2, AVX-512, AVX-VNNI, AVX-512 VNNI, AMX-INT8) is forced
  with ``BNB_MS_INT8_GEMM`` in a subprocess and compared exactly with numpy's int64 product on shapes
  that cover every K/M/N tail of every path (K in 1..4095 around the 16/32/64-byte steps and the AVX2
  panels' 512-k blocks, M and N around the 4x3 register tile, the AVX2 6 x 16 panel tile used from 12
  rows on and the 16-row AMX tiles), extreme values (-128/127 everywhere, K up to the entry point's
  limit 131071 where the VNNI paths' u8 offset wraps int32) and 3-D/4-D A.
  The subprocess reports the path the library actually used (``bnb_ms_int8_gemm_path``): a path this
  CPU lacks is skipped with "CPU lacks <isa>", never silently tested on another path.
* vector quant / mm dequant: the SIMD levels (``BNB_MS_SIMD=scalar|avx2|avx512``) give identical bytes
  (NaN/inf/-0/subnormal inputs, outliers, every tail length), and equal the numpy reference
  (bitsandbytes_ms/_reference.py) wherever the input is NaN-free.

The subprocesses call the library through ctypes (tools/aot_ctypes.py), not MindSpore, so each one
starts in well under a second.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ml_dtypes import bfloat16

from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import cextension

ROOT = Path(__file__).resolve().parent.parent
TOOLS = str(ROOT / "tools")
LIB = str(cextension.LIBRARY_PATH)

GEMM_PATHS = ("scalar", "avx2", "avx512", "avxvnni", "avx512vnni", "amx")
ISA = {"scalar": "nothing", "avx2": "AVX2", "avx512": "AVX-512 (F/BW/VL/DQ)", "avxvnni": "AVX-VNNI",
       "avx512vnni": "AVX-512 VNNI", "amx": "AMX-INT8 (or the OS did not grant the AMX tile state)"}


def _env(**kw):
    env = dict(os.environ)
    for k in ("BNB_MS_SIMD", "BNB_MS_INT8_GEMM"):
        env.pop(k, None)
    env.update({k: v for k, v in kw.items() if v is not None})
    return env


def _run(code, env, *args):
    r = subprocess.run([sys.executable, "-c", code, LIB, TOOLS, *args], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


# ---------------------------------------------------------------------------------------------
# int8 GEMM, every path
# ---------------------------------------------------------------------------------------------
_GEMM = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from aot_ctypes import Aot
lib = Aot(sys.argv[1])
if lib.int8_gemm_path() != sys.argv[3]:  # the CPU lacks the requested path: report, test nothing
    print(json.dumps({"path": lib.int8_gemm_path()}))
    sys.exit(0)
rng = np.random.RandomState(0)
fails, n = [], 0

def check(A, B, what):
    global n
    n += 1
    out = np.full(A.shape[:-1] + (B.shape[0],), 0x5A5A5A5A, np.int32)  # garbage: unwritten outputs show
    rc = lib("cigemmlt_32", [A, B, out])
    ref = (A.reshape(-1, A.shape[-1]).astype(np.int64) @ B.T.astype(np.int64)).reshape(out.shape)
    if rc != 0 or not np.array_equal(out.astype(np.int64), ref):
        fails.append(f"{what}: A{A.shape} B{B.shape} rc={rc} wrong={int((out != ref).sum())}")

def rnd(*shape):
    return rng.randint(-128, 128, shape).astype(np.int8)

for K in (1, 3, 10, 63, 64, 65, 127, 128, 129, 4095):
    for M in (1, 2, 3, 4, 5, 11, 12, 15, 16, 17, 33):
        for N in (1, 2, 3, 15, 16, 17, 50):
            check(rnd(M, K), rnd(N, K), "random")
for M, N, K in ((32, 64, 128), (64, 96, 256), (48, 48, 192), (272, 40, 4095), (20, 300, 4500), (3, 1000, 2100),
                (40, 33, 2101), (41, 250, 1030)):
    check(rnd(M, K), rnd(N, K), "blocks")  # whole AMX tiles, several m-blocks, K blocks, thread chunks
for K in (1, 63, 64, 65, 4095, 131071):
    for a, b in ((-128, -128), (127, -128), (-128, 127), (127, 127)):
        for M, N in (((1, 1), (17, 3), (2, 17), (33, 50)) if K < 5000 else ((2, 3), (17, 2), (33, 3))):
            check(np.full((M, K), a, np.int8), np.full((N, K), b, np.int8), f"const({a},{b})")
A = rnd(5, 200); A[:, ::2] = -128; A[1] = 127
B = rnd(19, 200); B[:, 1::3] = -128
check(A, B, "mixed extremes")
check(rnd(2, 3, 129), rnd(17, 129), "3-D")
check(rnd(2, 2, 5, 65), rnd(33, 65), "4-D")
print(json.dumps({"path": lib.int8_gemm_path(), "path_m1": lib.int8_gemm_path(1), "path_m16": lib.int8_gemm_path(16),
                  "simd": lib.simd_level(), "cases": n, "nfail": len(fails), "fails": fails[:10]}))
"""


@pytest.mark.parametrize("path", GEMM_PATHS)
def test_int8_gemm_path_exact(path):
    res = json.loads(_run(_GEMM, _env(BNB_MS_INT8_GEMM=path), path))
    if res["path"] != path:
        pytest.skip(f"CPU lacks {ISA[path]} (the library used {res['path']})")
    # a forced path is used for every M (also below the automatic AMX row threshold)
    assert res["path_m1"] == res["path_m16"] == path
    assert res["cases"] == 10 * 11 * 7 + 8 + 4 * (5 * 4 + 1 * 3) + 3
    assert res["nfail"] == 0, res["fails"]


_CHOICE = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from aot_ctypes import Aot
lib = Aot(sys.argv[1])
print(json.dumps({"path": lib.int8_gemm_path(), "m1": lib.int8_gemm_path(1), "m7": lib.int8_gemm_path(7),
                  "m8": lib.int8_gemm_path(8), "simd": lib.simd_level(),
                  "features": int(lib.dll.bnb_ms_cpu_features())}))
"""


def _expected_auto(features, simd):
    names = cextension._CPU_FEATURE_BITS
    has = {n for i, n in enumerate(names) if features & (1 << i)}
    if simd == "avx512":
        if "amx_int8" in has:
            return "amx", ("avx512vnni" if "avx512_vnni" in has else "avx512")
        best = "avx512vnni" if "avx512_vnni" in has else "avx512"
        return best, best
    if simd == "avx2":
        best = "avxvnni" if "avx_vnni" in has else "avx2"
        return best, best
    return "scalar", "scalar"


@pytest.mark.parametrize("simd", [None, "avx2", "scalar"])
def test_int8_gemm_automatic_choice(simd):
    """Without BNB_MS_INT8_GEMM: amx > avx512vnni > avx512 > avxvnni > avx2 > scalar within the
    (BNB_MS_SIMD-lowered) SIMD level, AMX only from 8 rows of A; an unknown or unsupported name
    changes nothing."""
    res = json.loads(_run(_CHOICE, _env(BNB_MS_SIMD=simd)))
    big, small = _expected_auto(res["features"], res["simd"])
    assert (res["path"], res["m8"], res["m7"], res["m1"]) == (big, big, small, small)
    if simd == "scalar":
        assert res["path"] == "scalar"
    bogus = json.loads(_run(_CHOICE, _env(BNB_MS_SIMD=simd, BNB_MS_INT8_GEMM="no-such-path")))
    assert bogus == res


# ---------------------------------------------------------------------------------------------
# vector quant and mm dequant at every SIMD level
# ---------------------------------------------------------------------------------------------
_LEVELS = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from aot_ctypes import Aot, Typed
lib = Aot(sys.argv[1])
cases = np.load(sys.argv[3])
res = {"_level": np.array(lib.simd_level())}
keys = sorted({k.split("/")[0] for k in cases.files})
for key in keys:
    g = lambda name: cases[key + "/" + name]
    kind = str(g("kind"))
    if kind == "vq":
        A, dt = g("A"), str(g("dtype"))
        arg = A if dt == "float32" else Typed(A, dt)
        rows, cols = A.shape
        out = np.full(A.shape, 99, np.int8)
        stats = np.full(rows, -1.0, np.float32)
        flags = np.full(cols, 7, np.uint8)
        rc = lib("cint8_vector_quant", [arg, np.array(g("thr"), np.float32), out, stats, flags])
        assert rc == 0, (key, rc)
        res[key + "/CA"], res[key + "/stats"], res[key + "/flags"] = out, stats.view(np.uint32), flags
    else:
        A, rs, cs, odt = g("A"), g("rs"), g("cs"), str(g("out"))
        bdt = str(g("bias_dtype"))
        bias = None if bdt == "none" else (g("bias") if bdt == "float32" else Typed(g("bias"), bdt))
        out = np.full(A.shape, 0x7B, np.float32 if odt == "fp32" else np.uint16)
        oarg = out if odt == "fp32" else Typed(out, {"fp16": "float16", "bf16": "bfloat16"}[odt])
        rc = lib("cdequant_mm_int32_" + odt, [A, rs, cs, bias, oarg])
        assert rc == 0, (key, rc)
        res[key + "/out"] = out.view(np.uint32) if odt == "fp32" else oarg.array
np.savez(sys.argv[4], **res)
"""


def _bits16(x, dtype):
    return (x.astype(np.float16) if dtype == "float16" else x.astype(bfloat16)).view(np.uint16)


def _level_cases():
    """{key: dict(...)} inputs for both ops; `ref` marks NaN-free cases compared with the reference."""
    rng = np.random.RandomState(11)
    cases = {}
    shapes = [(1, 1), (1, 7), (3, 8), (2, 9), (5, 15), (4, 16), (3, 17), (2, 31), (2, 33), (7, 100), (1, 1000), (33, 130)]
    mats = []
    for rows, cols in shapes:
        x = (rng.randn(rows, cols) * rng.choice([0.01, 1.0, 3.0])).astype(np.float32)
        if cols > 4:  # planted outliers (6.0 exactly counts), -0.0, an all-zero row
            x[0, cols // 2] = 6.0
            x[-1, 1] = -11.5
            x[0, 0] = -0.0
        if rows > 2:
            x[1] = 0.0
        mats.append((x, True))
    sp = rng.randn(6, 37).astype(np.float32)
    sp[0, 3] = np.inf
    sp[1, :] = 1e-39          # subnormal row: 1/absmax overflows, all codes 0
    sp[2, 5] = -np.inf
    sp[3, 10:12] = 1e-41
    sp[4, :] = -0.0
    mats.append((sp, True))
    nan = sp.copy()
    nan[0, 7] = np.nan
    nan[5, :] = np.nan
    nan[2, 30] = np.nan
    mats.append((nan, False))
    for i, (x, ref) in enumerate(mats):
        for dt in ("float32", "float16", "bfloat16"):
            xv = x.copy()
            if dt == "float16":
                xv = np.where(np.isfinite(xv), np.clip(xv, -60000, 60000), xv)
            A = xv if dt == "float32" else _bits16(xv, dt)
            vals = xv if dt == "float32" else (A.view(np.float16) if dt == "float16" else A.view(bfloat16)).astype(np.float32)
            for thr in (0.0, 6.0):
                cases[f"vq{i:02d}_{dt}_{thr:g}"] = dict(kind="vq", A=A, dtype=dt, thr=np.float32(thr), vals=vals, ref=ref)
    # mm dequant
    j = 0
    for rows, cols in [(1, 1), (2, 7), (3, 8), (1, 9), (4, 15), (2, 16), (3, 17), (2, 33), (5, 100), (17, 70)]:
        A = rng.randint(-2**24, 2**24, (rows, cols)).astype(np.int32)
        A.flat[0] = 2**31 - 1
        A.flat[-1] = -2**31
        rs = (rng.rand(rows) * 10).astype(np.float32)
        cs = (rng.rand(cols) * 10).astype(np.float32)
        if cols > 5:
            cs[3] = 1e5  # fp16 overflow to inf
            cs[4] = 1e-9  # fp16 subnormal results
        for odt in ("fp32", "fp16", "bf16"):
            for bdt in ("none", "float32", "float16", "bfloat16"):
                b = (rng.randn(cols) * 3).astype(np.float32)
                bias = np.zeros(0, np.float32) if bdt == "none" else (b if bdt == "float32" else _bits16(b, bdt))
                bvals = None if bdt == "none" else (b if bdt == "float32" else (bias.view(np.float16) if bdt == "float16" else bias.view(bfloat16)).astype(np.float32))
                cases[f"mm{j:03d}"] = dict(kind="mm", A=A, rs=rs, cs=cs, out=odt, bias_dtype=bdt, bias=bias, bvals=bvals, ref=True)
                j += 1
    # special scales (inf/NaN/0/-0 stats, 0 * inf) and NaN-payload biases, apart so that no element
    # adds two NaNs (which NaN x86 returns then depends on operand order): level agreement only
    A = rng.randint(-1000, 1000, (4, 37)).astype(np.int32)
    A[0, :4] = 0
    rs = np.array([np.inf, np.nan, 0.0, 1e30], np.float32)
    cs = (rng.rand(37) * 2).astype(np.float32)
    cs[5] = np.nan
    cs[6] = np.inf
    cs[7] = -0.0
    good_rs, good_cs = (rng.rand(4) + 0.5).astype(np.float32), (rng.rand(37) + 0.5).astype(np.float32)
    nanb = {"float32": np.array([0x7FC12345, 0xFF800001, 0x7F800001], np.uint32).view(np.float32),
            "float16": np.array([0x7C01, 0xFE05, 0x7E00], np.uint16), "bfloat16": np.array([0x7F81, 0xFFC5, 0x7FC0], np.uint16)}
    for odt in ("fp32", "fp16", "bf16"):
        for bdt in ("float32", "float16", "bfloat16"):
            fb = rng.randn(37).astype(np.float32)
            b = fb if bdt == "float32" else _bits16(fb, bdt)
            cases[f"mm{j:03d}"] = dict(kind="mm", A=A, rs=rs, cs=cs, out=odt, bias_dtype=bdt, bias=b, bvals=None, ref=False)
            nb = b.copy()
            nb[[2, 9, 20]] = nanb[bdt]
            cases[f"mm{j + 1:03d}"] = dict(kind="mm", A=A, rs=good_rs, cs=good_cs, out=odt, bias_dtype=bdt, bias=nb,
                                           bvals=None, ref=False)
            j += 2
    return cases


def _save_cases(cases, path):
    flat = {}
    for key, c in cases.items():
        for name, v in c.items():
            if name in ("vals", "bvals", "ref"):
                continue
            flat[f"{key}/{name}"] = np.asarray(v)
    np.savez(path, **flat)


@pytest.fixture(scope="module")
def level_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("levels")
    cases = _level_cases()
    _save_cases(cases, d / "cases.npz")
    runs = {}
    for level in ("scalar", "avx2", "avx512"):
        out = d / f"{level}.npz"
        _run(_LEVELS, _env(BNB_MS_SIMD=level), str(d / "cases.npz"), str(out))
        runs[level] = dict(np.load(out))
    return cases, runs


def test_vq_mmdq_scalar_level_matches_reference(level_runs):
    cases, runs = level_runs
    got = runs["scalar"]
    assert str(got["_level"]) == "scalar"
    checked = 0
    for key, c in cases.items():
        if not c["ref"]:
            continue
        if c["kind"] == "vq":
            with np.errstate(all="ignore"):
                q, stats, flags = R.int8_vector_quant(c["vals"], float(c["thr"]), c["dtype"])
            np.testing.assert_array_equal(got[key + "/CA"], q, err_msg=key)
            np.testing.assert_array_equal(got[key + "/stats"], stats.view(np.uint32), err_msg=key)
            np.testing.assert_array_equal(got[key + "/flags"], flags, err_msg=key)
        else:
            dtype = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[c["out"]]
            with np.errstate(all="ignore"):
                ref = R.int8_mm_dequant(c["A"], c["rs"], c["cs"], c["bvals"], dtype)
            np.testing.assert_array_equal(got[key + "/out"], ref.view(np.uint32 if dtype == "float32" else np.uint16),
                                          err_msg=key)
        checked += 1
    assert checked == sum(c["ref"] for c in cases.values()) >= 190


@pytest.mark.parametrize("level", ["avx2", "avx512"])
def test_vq_mmdq_simd_levels_bit_identical(level_runs, level):
    cases, runs = level_runs
    got = runs[level]
    if str(got["_level"]) != level:
        pytest.skip(f"CPU lacks {'AVX2' if level == 'avx2' else 'AVX-512 (F/BW/VL/DQ)'} (ran at {got['_level']})")
    scalar = runs["scalar"]
    keys = [k for k in scalar if not k.startswith("_")]
    assert len(keys) == len(got) - 1 >= 380
    for k in keys:
        np.testing.assert_array_equal(got[k], scalar[k], err_msg=k)
