"""Blockwise 8-bit and 4-bit quantization, 8-bit dequantization and the 8-bit blockwise optimizer updates on
adversarial inputs: every SIMD level gives the portable path's bytes, and the portable path gives the numpy
reference's (bitsandbytes_ms/_reference.py) where that reference is defined (finite inputs, sorted codes).

The inputs aim at the places where a vectorised code search can part from the reference: values exactly on a
midpoint of the code (ties go to the lower index) and their float neighbours, values on and around the
65536-bin grid's bin edges (the multiply-add of the grid index), +-1, +-0, denormals and blocks of them
(absmax < 2^-128, scaled before the lookup), inf and NaN (in the
input, in the absmax, in the code), unsorted and duplicate codes, partial blocks, odd element counts and
blocksizes that are not multiples of the vector width. The kernels run through ctypes in subprocesses
(tests/_quant_levels.py), one per SIMD level (the level is fixed at library load)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from ml_dtypes import bfloat16

import mindspore as ms

from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import cextension
from bitsandbytes_ms import functional as F

ROOT = Path(__file__).resolve().parent.parent
DTYPES = ("float32", "float16", "bfloat16")
_NP = {"float32": np.float32, "float16": np.float16, "bfloat16": bfloat16}


def bits(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (float32) rounded to dtype (overflowing to inf), as its bit pattern."""
    with np.errstate(over="ignore"):
        y = np.ascontiguousarray(x.astype(_NP[dtype]))
    return y.view(np.uint32 if dtype == "float32" else np.uint16)


def codes8():
    dyn, udyn = F.create_dynamic_map(True).asnumpy(), F.create_dynamic_map(False).asnumpy()
    lin = F.create_linear_map(True).asnumpy()
    rng = np.random.RandomState(5)
    unsorted = rng.uniform(-1, 1, 256).astype(np.float32)
    bad = dyn.copy()
    bad[17], bad[200] = np.nan, np.inf
    return {"dyn": dyn, "udyn": udyn, "lin": lin, "unsorted": unsorted, "nan": bad}


def codes4():
    nf4, fp4 = F.get_4bit_type("nf4").asnumpy(), F.get_4bit_type("fp4").asnumpy()
    dup = nf4.copy()
    dup[3], dup[10] = dup[4], dup[9]
    unsorted = np.random.RandomState(6).uniform(-1, 1, 16).astype(np.float32)
    bad = nf4.copy()
    bad[5] = np.nan
    return {"nf4": nf4, "fp4": fp4, "dup": dup, "unsorted": unsorted, "nan": bad}


def inputs(n: int, bs: int, ties: np.ndarray, rng, special: bool) -> np.ndarray:
    """n float32 values: ties and their neighbours in blocks whose absmax is exactly 1 (so x * (1/absmax) == x),
    Gaussian values, and with `special` inf / NaN / +-0 / denormals / huge values."""
    x = rng.randn(n).astype(np.float32)
    t = ties[rng.randint(0, ties.size, n)]
    kind = rng.randint(0, 4, n)
    near = np.where(kind == 1, np.nextafter(t, np.float32(2)), np.where(kind == 2, np.nextafter(t, np.float32(-2)), t))
    tie_block = (np.arange(n) // bs) % 2 == 0
    x = np.where(tie_block, near, x).astype(np.float32)
    x[::bs] = np.where(tie_block[::bs], np.float32(1.0), x[::bs])  # absmax 1 in the tie blocks
    if special:
        sp = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, 3e38, -3e38, 65504.0, -1.0],
                      np.float32)
        pick = rng.rand(n) < 0.05
        x[pick] = sp[rng.randint(0, sp.size, pick.sum())]
    return x


def grid_ties() -> np.ndarray:
    """Values on and next to bin edges of the 65536-bin grid: fma(v + 1, 32767.5, 0.5) at (or one float away
    from) an integer, over the whole range."""
    k = np.arange(0, 65536, 7, dtype=np.float64)
    v = (k - 0.5) / 32767.5 - 1.0
    return np.clip(v, -1, 1).astype(np.float32)


def make_cases(rng):
    cases = {}

    def add(key, **fields):
        for f, v in fields.items():
            cases[f"{key}/{f}"] = np.asarray(v)

    i = 0
    for cname, code in codes8().items():
        mids = (np.float32(0.5) * (code[:-1] + code[1:])).astype(np.float32)
        ties = np.concatenate([mids[np.isfinite(mids)], grid_ties()])
        for dtype in DTYPES:
            for bs in (32, 64, 100, 256, 4096):
                for n, special, scale in ((5 * bs + 37, False, 1), (3 * bs + 1, True, 1), (31, True, 1),
                                          (2 * bs + 5, False, 1e-40)):  # subnormal blocks (absmax < 2^-128)
                    x = (inputs(n, bs, ties, rng, special) * np.float32(scale)).astype(np.float32)
                    add(f"q8:{i:04d}", kind="q8", dtype=dtype, bs=bs, x=bits(x, dtype), code=code, cname=cname,
                        special=special)
                    i += 1
        for dtype in DTYPES:
            for bs in (32, 100, 256, 4096):
                n = 3 * bs + 45
                am = (rng.rand(-(-n // bs)) * 4).astype(np.float32)
                if cname == "dyn":  # non-finite, zero and denormal scales (blocks 0..3; n has 4 blocks)
                    am[:4] = [np.inf, np.nan, 0.0, 1e-40]
                add(f"dq8:{i:04d}", kind="dq8", dtype=dtype, bs=bs, q=rng.randint(0, 256, n).astype(np.uint8),
                    code=code, absmax=am)
                i += 1
    for cname, code in codes4().items():
        order = np.argsort(code, kind="stable")
        mids = ((code[order[:-1]] + code[order[1:]]) / np.float32(2)).astype(np.float32)
        ties = mids[np.isfinite(mids)]
        for dtype in DTYPES:
            for bs in (2, 6, 64, 96, 4096):
                for n, special in ((5 * bs + 37, False), (3 * bs + 1, True), (33, True)):
                    x = inputs(n, bs, ties, rng, special)
                    add(f"q4:{i:04d}", kind="q4", dtype=dtype, bs=bs, x=bits(x, dtype), code=code, cname=cname,
                        special=special)
                    i += 1
    dyn, udyn = codes8()["dyn"], codes8()["udyn"]
    for opt in ("adam", "ademamix", "momentum", "rmsprop", "lion", "adagrad"):
        for dtype in DTYPES:
            for wd in (0.0, 0.01):
                n = 256 * 5 + 45
                g = (rng.randn(4, n) * 0.1).astype(np.float32)
                g[:, 256:512] = 0  # an all-zero block
                g[2, 700], g[2, 701], g[3, 5] = np.nan, np.inf, -np.inf
                g[1, 1000:1100] *= 1e-30
                add(f"opt:{i:04d}", kind="opt", dtype=dtype, bs=256, opt=opt, wd=wd,
                    p=bits(rng.randn(n).astype(np.float32), dtype), g=np.stack([bits(r, dtype) for r in g]),
                    code1=dyn, code2=udyn)
                i += 1
    return cases


def run_level(cases_path: Path, out: Path, level):
    env = dict(os.environ)
    env.pop("BNB_MS_SIMD", None)
    if level:
        env["BNB_MS_SIMD"] = level
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "_quant_levels.py"), str(cextension.LIBRARY_PATH),
                        str(cases_path), str(out)], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(np.load(out))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("quant_levels")
    cases = make_cases(np.random.RandomState(0))
    np.savez(d / "cases.npz", **cases)
    res = {"scalar": run_level(d / "cases.npz", d / "scalar.npz", "scalar"),
           "native": run_level(d / "cases.npz", d / "native.npz", None)}
    if int(res["native"]["_level"]) >= 2:  # AVX-512 machine: the AVX2 path too
        res["avx2"] = run_level(d / "cases.npz", d / "avx2.npz", "avx2")
    return cases, res


@pytest.mark.parametrize("kind", ["q8", "dq8", "q4", "opt"])
def test_every_simd_level_gives_the_portable_bytes(results, kind):
    cases, res = results
    ref = res["scalar"]
    assert int(ref["_level"]) == 0
    keys = [k for k in ref if k.startswith(kind + ":")]
    assert len(keys) > 20
    for level, out in res.items():
        bad = [k for k in keys if not np.array_equal(out[k], ref[k])]
        assert not bad, f"{level}: {len(bad)} of {len(keys)} outputs differ from the portable path, e.g. {bad[:5]}"


def test_portable_path_matches_the_numpy_reference(results):
    """Finite inputs with the sorted codes: codes and absmax equal _reference.quantize_blockwise /
    quantize_4bit (ties, grid edges and partial blocks included)."""
    cases, res = results
    out = res["scalar"]
    checked = 0
    for key in sorted({k.rsplit("/", 1)[0] for k in cases}):
        kind = str(cases[key + "/kind"])
        if kind not in ("q8", "q4") or bool(cases[key + "/special"]):
            continue
        if str(cases[key + "/cname"]) not in ("dyn", "udyn", "lin", "nf4", "fp4", "dup"):
            continue
        dtype, bs = str(cases[key + "/dtype"]), int(cases[key + "/bs"])
        x = cases[key + "/x"].view(_NP[dtype]).astype(np.float32)
        fn = R.quantize_blockwise if kind == "q8" else R.quantize_4bit
        q, am = fn(x, cases[key + "/code"], bs)
        np.testing.assert_array_equal(out[key + "/q"].reshape(-1), q.reshape(-1), err_msg=key)
        np.testing.assert_array_equal(out[key + "/absmax"], am.view(np.uint32), err_msg=key)
        checked += 1
    assert checked >= 130


def test_dequantize_matches_the_numpy_reference(results):
    cases, res = results
    out = res["scalar"]
    checked = 0
    for key in sorted({k.rsplit("/", 1)[0] for k in cases if k.startswith("dq8:")}):
        dtype, bs = str(cases[key + "/dtype"]), int(cases[key + "/bs"])
        am = cases[key + "/absmax"]
        if not np.all(np.isfinite(am)) or not np.all(np.isfinite(cases[key + "/code"])):
            continue
        ref = R.dequantize_blockwise(cases[key + "/q"], am, cases[key + "/code"], bs, dtype)
        np.testing.assert_array_equal(out[key + "/out"], bits(ref.astype(np.float32), dtype), err_msg=key)
        checked += 1
    assert checked > 10


def test_functional_api_takes_the_same_path():
    """quantize_blockwise / quantize_4bit through MindSpore give the helper's bytes (same library, same level)."""
    rng = np.random.RandomState(1)
    x = rng.randn(4099).astype(np.float32)
    q, st = F.quantize_blockwise(ms.Tensor(x), blocksize=256)
    rq, ram = R.quantize_blockwise(x, F.create_dynamic_map(True).asnumpy(), 256)
    np.testing.assert_array_equal(q.asnumpy(), rq)
    np.testing.assert_array_equal(st.absmax.asnumpy(), ram)
    q4, st4 = F.quantize_4bit(ms.Tensor(x), blocksize=64, quant_type="nf4")
    rq4, ram4 = R.quantize_4bit(x, F.get_4bit_type("nf4").asnumpy(), 64)
    np.testing.assert_array_equal(q4.asnumpy().reshape(-1), rq4.reshape(-1))
    np.testing.assert_array_equal(st4.absmax.asnumpy(), ram4)
