#!/usr/bin/env python3
"""Generate bit-exact reference fixtures from upstream bitsandbytes (PyTorch, CPU).

The fixtures let ``bitsandbytes_ms`` tests check agreement with upstream without
torch being installed.  This script never imports ``bitsandbytes_ms``.

Usage (from the repository root, with any Python 3.11):

    python tools/make_reference_vectors.py            # create env if needed, write fixtures
    python tools/make_reference_vectors.py --only int8,code_maps
    python tools/make_reference_vectors.py --check    # only load the written .npz with numpy

Run with the project interpreter, the script creates (once) a throwaway venv at
``~/.cache/bitsandbytes_ms/upstream-env`` holding the pinned upstream stack
(torch==2.13.0 CPU, bitsandbytes==0.50.2, numpy<2, scipy) and re-executes itself
inside it with ``--inside``.  Everything is deterministic: inputs are built with
``numpy.random.RandomState`` seeds derived from the case names, torch runs single
threaded with torch.compile disabled, and the .npz archives are written with fixed
zip timestamps, so a re-run produces byte-identical files.

Fixture layout (documented in compat_tests/fixtures/README.md):
  * every array is stored under ``<case>__<field>``; case names never contain "__";
  * ``__cases__`` is a 1-D numpy unicode array, one JSON object per case, holding the
    case's parameters, ``fields`` (field -> {"dtype": logical dtype, "shape": [...]})
    and, when upstream raised, ``error`` (and no arrays);
  * ``__meta__`` is a 0-d unicode array holding a JSON object with versions etc.;
  * bfloat16 arrays are stored as their raw uint16 bit patterns (logical dtype
    "bfloat16" in ``fields``), float16 as np.float16, float32 as np.float32.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(REPO, "compat_tests", "fixtures")
ENV_DIR = os.path.join(os.path.expanduser("~"), ".cache", "bitsandbytes_ms", "upstream-env")
PINS = ["torch==2.13.0", "bitsandbytes==0.50.2", "numpy<2", "scipy"]
STAMP = ".bnbms-pins.json"
TORCH_VERSION = "2.13.0"
BNB_VERSION = "0.50.2"
FIXTURES = ["code_maps", "blockwise_8bit", "int8", "fourbit", "optim_8bit", "int8_mixed"]


# --------------------------------------------------------------------------------------
# outer part: environment management (runs with the project's python, no torch needed)
# --------------------------------------------------------------------------------------


def env_python() -> str:
    return os.path.join(ENV_DIR, "bin", "python")


def env_is_ready() -> bool:
    stamp = os.path.join(ENV_DIR, STAMP)
    if not (os.path.exists(env_python()) and os.path.exists(stamp)):
        return False
    try:
        with open(stamp) as f:
            return json.load(f).get("pins") == PINS
    except (OSError, ValueError):
        return False


def ensure_env() -> float:
    """Create the upstream venv if missing; return the seconds spent (0 if cached)."""
    if env_is_ready():
        return 0.0
    if sys.version_info[:2] != (3, 11):
        raise SystemExit("the torch 2.13.0 CPU wheel is cp311: run this script with Python 3.11")
    t0 = time.time()
    if os.path.exists(ENV_DIR):
        shutil.rmtree(ENV_DIR)
    os.makedirs(os.path.dirname(ENV_DIR), exist_ok=True)
    print(f"[make_reference_vectors] creating {ENV_DIR} ...", flush=True)
    subprocess.check_call([sys.executable, "-m", "venv", ENV_DIR])
    # torch is pinned to 2.13.0: that CPU wheel is available locally; any other
    # version would download gigabytes.
    subprocess.check_call([env_python(), "-m", "pip", "install", "-q", *PINS])
    with open(os.path.join(ENV_DIR, STAMP), "w") as f:
        json.dump({"pins": PINS}, f)
    dt = time.time() - t0
    print(f"[make_reference_vectors] env created in {dt:.1f}s", flush=True)
    return dt


def check_outputs(out_dir: str, names) -> None:
    """Load every fixture with plain numpy (no pickle) and print a summary."""
    import numpy as np

    total = 0
    for name in names:
        path = os.path.join(out_dir, name + ".npz")
        if not os.path.exists(path):
            print(f"  {name}.npz: MISSING")
            continue
        size = os.path.getsize(path)
        total += size
        with np.load(path, allow_pickle=False) as z:
            cases = [json.loads(s) for s in z["__cases__"]]
            n_arrays = 0
            for c in cases:
                for field in c.get("fields", {}):
                    arr = z[f"{c['name']}__{field}"]
                    assert list(arr.shape) == c["fields"][field]["shape"], (c["name"], field)
                    n_arrays += 1
            n_err = sum(1 for c in cases if "error" in c)
            json.loads(str(z["__meta__"]))
        print(f"  {name}.npz: {size / 1024:8.1f} KiB, {len(cases):4d} cases ({n_err} upstream errors), {n_arrays} arrays")
    print(f"  total: {total / 1024:.1f} KiB")


def outer_main(args) -> None:
    t_env = ensure_env()
    cmd = [env_python(), os.path.abspath(__file__), "--inside", "--out", args.out]
    if args.only:
        cmd += ["--only", args.only]
    t0 = time.time()
    subprocess.check_call(cmd)
    t_gen = time.time() - t0
    print(f"[make_reference_vectors] env creation: {t_env:.1f}s ({'cached' if t_env == 0 else 'new'}), "
          f"generation: {t_gen:.1f}s")


# --------------------------------------------------------------------------------------
# inner part: runs inside the upstream venv
# --------------------------------------------------------------------------------------


def inner_main(args) -> None:  # noqa: C901 - a long but linear script
    # Determinism / frugality: single thread, no torch.compile (upstream's default
    # backend wraps a few pure-torch helpers in torch.compile and falls back to eager
    # when compilation fails; eager is the reference semantics).
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    import warnings

    warnings.filterwarnings("ignore")
    import numpy as np
    import scipy
    import torch

    torch.set_num_threads(1)
    import bitsandbytes
    import bitsandbytes.functional as F

    assert torch.__version__.split("+")[0] == TORCH_VERSION, torch.__version__
    assert bitsandbytes.__version__ == BNB_VERSION, bitsandbytes.__version__

    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    only = set(args.only.split(",")) if args.only else set(FIXTURES)

    try:
        avx512bf16 = bool(F.has_avx512bf16())
    except Exception:  # pragma: no cover
        avx512bf16 = False
    META = {
        "generator": "tools/make_reference_vectors.py",
        "bitsandbytes": bitsandbytes.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "python": sys.version.split()[0],
        "device": "cpu",
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bnb_has_avx512bf16": avx512bf16,
        "torch_num_threads": torch.get_num_threads(),
        "TORCHDYNAMO_DISABLE": os.environ.get("TORCHDYNAMO_DISABLE"),
        "bf16_storage": "bfloat16 arrays are stored as raw uint16 bit patterns",
    }

    DT = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
    LOGICAL = {
        torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
        torch.uint8: "uint8", torch.int8: "int8", torch.int32: "int32", torch.int64: "int64",
        torch.bool: "bool", torch.float64: "float64", torch.int16: "int16",
    }

    def seed_of(name: str) -> int:
        return zlib.crc32(name.encode()) & 0x7FFFFFFF

    def to_np(x):
        """torch tensor / numpy array / python scalar -> (numpy array, logical dtype)."""
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            logical = LOGICAL[t.dtype]
            if t.dtype == torch.bfloat16:
                return t.view(torch.int16).numpy().view(np.uint16).copy(), logical
            return t.numpy().copy(), logical
        a = np.asarray(x)
        return a, str(a.dtype)

    def err_str(e: BaseException) -> str:
        s = f"{type(e).__name__}: {e}"
        s = " ".join(s.split())
        return s[:400]

    class Case:
        def __init__(self, fx, name, params):
            assert "__" not in name and name not in fx.names, name
            self.fx = fx
            self.rec = {"name": name, **params, "fields": {}}
            fx.names.add(name)
            fx.cases.append(self.rec)

        def put(self, field, x):
            assert "__" not in field, field
            arr, logical = to_np(x)
            self.fx.arrays[f"{self.rec['name']}__{field}"] = arr
            self.rec["fields"][field] = {"dtype": logical, "shape": list(arr.shape)}
            return arr

        def note(self, **kw):
            self.rec.update(kw)

        def fail(self, e, what=None):
            if what is None:
                self.rec["error"] = err_str(e)
            else:
                self.rec.setdefault("errors", {})[what] = err_str(e)

    class Fixture:
        def __init__(self, name, description):
            self.name, self.description = name, description
            self.arrays, self.cases, self.names = {}, [], set()

        def case(self, name, **params) -> Case:
            return Case(self, name, params)

        def save(self):
            path = os.path.join(out_dir, self.name + ".npz")
            meta = dict(META, fixture=self.name, description=self.description)
            members = [
                ("__meta__", np.array(json.dumps(meta, sort_keys=True))),
                ("__cases__", np.array([json.dumps(c, sort_keys=True) for c in self.cases])),
            ] + list(self.arrays.items())
            tmp = path + ".tmp"
            # Deterministic zip (fixed timestamps, fixed order) readable by np.load.
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for key, arr in members:
                    buf = io.BytesIO()
                    np.lib.format.write_array(buf, np.array(arr, order="C", copy=True), allow_pickle=False)
                    info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
                    info.compress_type = zipfile.ZIP_DEFLATED
                    info.external_attr = 0o644 << 16
                    zf.writestr(info, buf.getvalue(), compresslevel=9)
            os.replace(tmp, path)
            n_err = sum(1 for c in self.cases if "error" in c or "errors" in c)
            print(f"  wrote {self.name}.npz: {os.path.getsize(path) / 1024:.1f} KiB, "
                  f"{len(self.cases)} cases, {len(self.arrays)} arrays, {n_err} with upstream errors", flush=True)

    def shape_tag(shape):
        return "x".join(str(s) for s in shape)

    def planted(name, shape, scale, zero_ranges=(), n_outliers=0, outlier_mult=(20.0, 60.0)):
        """randn*scale (float32) with zeroed flat ranges and a few large outliers."""
        rs = np.random.RandomState(seed_of(name))
        n = int(np.prod(shape))
        x = rs.randn(n) * scale
        for a, b in zero_ranges:
            x[min(a, n):min(b, n)] = 0.0
        if n_outliers:
            idx = rs.choice(n, n_outliers, replace=False)
            sign = rs.choice([-1.0, 1.0], n_outliers)
            x[idx] = sign * rs.uniform(*outlier_mult, n_outliers) * scale
        return x.astype(np.float32).reshape(shape)

    def tt(x, dtype):
        return torch.from_numpy(np.ascontiguousarray(x)).to(dtype)

    # ==================================================================================
    # 1. code maps
    # ==================================================================================
    def gen_code_maps():
        fx = Fixture("code_maps", "quantization code maps from bitsandbytes.functional")
        specs = [
            ("dynamic_signed", "create_dynamic_map()", lambda: F.create_dynamic_map()),
            ("dynamic_unsigned", "create_dynamic_map(signed=False)", lambda: F.create_dynamic_map(signed=False)),
            ("normal_default", "create_normal_map()", lambda: F.create_normal_map()),
            ("normal_no_extra", "create_normal_map(0.9677083, False)", lambda: F.create_normal_map(0.9677083, False)),
            ("fp8_default", "create_fp8_map()", lambda: F.create_fp8_map()),
            ("fp8_e4m3", "create_fp8_map(True, 4, 3, 8)", lambda: F.create_fp8_map(True, 4, 3, 8)),
            ("linear_signed", "create_linear_map(True, 8, True)", lambda: F.create_linear_map(True, 8, True)),
            ("linear_unsigned", "create_linear_map(False, 8, True)", lambda: F.create_linear_map(False, 8, True)),
            ("fourbit_nf4", "get_4bit_type('nf4', device='cpu')", lambda: F.get_4bit_type("nf4", device="cpu")),
            ("fourbit_fp4", "get_4bit_type('fp4', device='cpu')", lambda: F.get_4bit_type("fp4", device="cpu")),
            ("fourbit_int4", "get_4bit_type('int4', device='cpu')", lambda: F.get_4bit_type("int4", device="cpu")),
            ("fourbit_af4", "get_4bit_type('af4', device='cpu')", lambda: F.get_4bit_type("af4", device="cpu")),
            ("fourbit_af4_bs128", "get_4bit_type('af4', device='cpu', blocksize=128)",
             lambda: F.get_4bit_type("af4", device="cpu", blocksize=128)),
        ]
        for name, call, fn in specs:
            c = fx.case(name, kind="code_map", call=call)
            try:
                c.put("code", fn())
            except Exception as e:
                c.fail(e)
        fx.save()

    # ==================================================================================
    # 2. 8-bit blockwise
    # ==================================================================================
    def gen_blockwise_8bit():
        fx = Fixture("blockwise_8bit", "quantize_blockwise / dequantize_blockwise (CPU)")
        blocksizes = [32, 64, 128, 256, 512, 1024, 2048, 4096]
        # shape -> (scale, zero ranges (flat, half-open), n_outliers)
        shapes = {
            (1000,): (1.0, [(256, 512)], 3),
            (7, 300): (0.05, [(0, 128), (1024, 1280)], 3),
            (3, 5, 129): (30.0, [(1024, 1536)], 4),
            (2, 4096 + 17): (3.0, [(4096, 8192)], 6),
        }
        big = (2, 4096 + 17)
        inputs = {}
        for dt in DT:
            for shape, (scale, zr, no) in shapes.items():
                name = f"in_{dt}_{shape_tag(shape)}"
                x = planted(f"bw_{shape_tag(shape)}", shape, scale, zr, no)  # same values for all dtypes
                A = tt(x, DT[dt])
                c = fx.case(name, kind="input", dtype=dt, shape=list(shape), scale=scale,
                            zero_ranges=zr, n_outliers=no,
                            note="randn*scale (RandomState), flat zero ranges, outliers +-U(20,60)*scale; "
                                 "float32 rounded to dtype (RNE)")
                c.put("A", A)
                inputs[(dt, shape)] = (name, A)
            for shape in [(1000,), (7, 300)]:
                rname = f"inrand_{dt}_{shape_tag(shape)}"
                rs = np.random.RandomState(seed_of(f"bwrand_{shape_tag(shape)}"))
                A = tt(rs.rand(*shape).astype(np.float32), DT[dt])
                c = fx.case(rname, kind="input", dtype=dt, shape=list(shape),
                            note="uniform [0,1) (RandomState.rand) like torch.rand; float32 rounded to dtype")
                c.put("A", A)
                inputs[(dt, "rand", shape)] = (rname, A)

        def run_case(name, in_name, A, dt, bs, nested, code=None, code_name="dynamic_signed (default)", **extra):
            shape = tuple(A.shape)
            c = fx.case(name, kind="quantize_blockwise", input=in_name, dtype=dt, shape=list(shape),
                        blocksize=bs, nested=nested, code=code_name, **extra)
            try:
                kw = {} if code is None else {"code": code}
                q, qs = F.quantize_blockwise(A.clone(), blocksize=bs, nested=nested, **kw)
            except Exception as e:
                c.fail(e)
                return
            c.put("q", q)
            c.put("absmax", qs.absmax)
            if code is not None:
                c.put("code", qs.code)
            if nested:
                c.put("state2_absmax", qs.state2.absmax)
                c.put("offset", qs.offset)
                c.put("nested_code", qs.state2.code)
                c.note(nested_blocksize=int(qs.state2.blocksize))
            try:
                d = F.dequantize_blockwise(q, qs)
                assert d.dtype == A.dtype
                c.put("dequant", d)
            except Exception as e:
                c.fail(e, "dequantize_blockwise")

        for dt in DT:
            for bs in blocksizes:
                for shape in shapes:
                    in_name, A = inputs[(dt, shape)]
                    # size budget: the big shape only for a few blocksizes
                    sel_plain = shape != big or bs in (32, 64, 4096)
                    sel_nested = shape in ((1000,), (3, 5, 129)) or (shape == big and bs in (32, 256))
                    if sel_plain:
                        run_case(f"q_{dt}_bs{bs}_{shape_tag(shape)}", in_name, A, dt, bs, False)
                    if sel_nested:
                        run_case(f"q_{dt}_bs{bs}_{shape_tag(shape)}_nested", in_name, A, dt, bs, True)
            # explicit unsigned dynamic code on uniform [0,1) input
            ucode = F.create_dynamic_map(signed=False)
            for shape in [(1000,), (7, 300)]:
                in_name, A = inputs[(dt, "rand", shape)]
                for bs in (64, 256, 4096):
                    run_case(f"qu_{dt}_bs{bs}_{shape_tag(shape)}", in_name, A, dt, bs, False, code=ucode,
                             code_name="create_dynamic_map(signed=False)")
                run_case(f"qu_{dt}_bs256_{shape_tag(shape)}_nested", in_name, A, dt, 256, True, code=ucode,
                         code_name="create_dynamic_map(signed=False)")
        # probes: blocksizes outside 32..4096 (is anything refused on CPU?)
        in_name, A = inputs[("f32", (1000,))]
        for bs in (16, 100, 0, -64):
            run_case(f"probe_f32_bs{bs}_1000".replace("-", "m"), in_name, A, "f32", bs, False, probe=True)
        fx.save()

    # ==================================================================================
    # 3. int8
    # ==================================================================================
    def gen_int8():
        fx = Fixture("int8", "LLM.int8 helpers: int8_vectorwise_quant/dequant, int8_linear_matmul, int8_mm_dequant")
        # --- vectorwise quant ---
        shapes = [(1, 64), (17, 33), (128, 256)]
        for shape in shapes:
            rs = np.random.RandomState(seed_of(f"vq_{shape_tag(shape)}"))
            rows, cols = shape
            x = rs.randn(rows, cols).astype(np.float64)
            out_cols = sorted(set(int(v) for v in rs.choice(cols, min(3, cols), replace=False)))
            for col in out_cols:
                rmask = rs.rand(rows) < 0.4
                rmask[rs.randint(rows)] = True
                x[rmask, col] = rs.choice([-1.0, 1.0], rmask.sum()) * rs.uniform(10.0, 20.0, rmask.sum())
            x = x.astype(np.float32)
            for dt in DT:
                if shape == (128, 256):  # the large shape only for fp16 (both) and bf16 (6.0): size budget
                    thresholds = {"f16": (0.0, 6.0), "bf16": (6.0,), "f32": ()}[dt]
                    if not thresholds:
                        continue
                else:
                    thresholds = (0.0, 6.0)
                A = tt(x, DT[dt])
                in_name = f"in_{dt}_{shape_tag(shape)}"
                c = fx.case(in_name, kind="input", dtype=dt, shape=list(shape), planted_outlier_cols=out_cols,
                            note="randn; planted columns get +-U(10,20) in ~40% of rows (>=1 row)")
                c.put("A", A)
                for thr in thresholds:
                    c = fx.case(f"vq_{dt}_{shape_tag(shape)}_t{thr:g}", kind="int8_vectorwise_quant", input=in_name,
                                dtype=dt, shape=list(shape), threshold=thr)
                    try:
                        Ain = A.clone()
                        CA, stats, oc = F.int8_vectorwise_quant(Ain, threshold=thr)
                        assert torch.equal(Ain, A)  # upstream restores the outliers it zeroed
                    except Exception as e:
                        c.fail(e)
                        continue
                    c.put("CA", CA)
                    c.put("row_stats", stats)
                    c.note(outlier_cols_is_none=oc is None)
                    c.put("outlier_cols", oc if oc is not None else torch.empty(0, dtype=torch.int64))
                    if shape != (128, 256):
                        try:
                            c.put("dequant", F.int8_vectorwise_dequant(CA, stats))
                        except Exception as e:
                            c.fail(e, "int8_vectorwise_dequant")
        # int8_double_quant (expected to be CUDA-only in 0.50.x; record)
        x = planted("dq_17x33", (17, 33), 1.0)
        for dt in ("f16",):
            for thr in (0.0, 6.0):
                A = tt(x, DT[dt])
                c = fx.case(f"dq_{dt}_17x33_t{thr:g}", kind="int8_double_quant", dtype=dt, shape=[17, 33],
                            threshold=thr)
                try:
                    CA, CAt, SCA, SCAt, oc = F.int8_double_quant(A, threshold=thr)
                except Exception as e:
                    c.fail(e)
                    continue
                c.put("A", A)
                c.put("CA", CA)
                c.put("CAt", CAt)
                c.put("SCA", SCA)
                c.put("SCAt", SCAt)
                c.note(outlier_cols_is_none=oc is None)
                c.put("outlier_cols", oc if oc is not None else torch.empty(0, dtype=torch.int64))

        # --- int8_linear_matmul ---
        mm_specs = []
        for K in (1, 3, 10, 64):
            for M, N in ((1, 1), (5, 7), (33, 17)):
                mm_specs.append((f"mm_K{K}_M{M}_N{N}", (M, K), (N, K), "random"))
        mm_specs.append(("mm_K4095_M3_N5", (3, 4095), (5, 4095), "random"))
        mm_specs.append(("mm_K4095_M2_N3_sat", (2, 4095), (3, 4095), "saturated"))
        mm_specs.append(("mm_3d_2x3xK64_N5", (2, 3, 64), (5, 64), "random"))
        for name, sa, sb, mode in mm_specs:
            rs = np.random.RandomState(seed_of(name))
            if mode == "random":
                a = rs.randint(-128, 128, size=sa).astype(np.int8)
                b = rs.randint(-128, 128, size=sb).astype(np.int8)
            else:  # worst case magnitude: |sum| > 2**24
                a = np.full(sa, 127, np.int8)
                a[1::2] = -128
                b = np.full(sb, 127, np.int8)
                b[:, 0] = -127
            A, B = torch.from_numpy(a), torch.from_numpy(b)
            exact = np.matmul(a.astype(np.int64), b.astype(np.int64).T)
            c = fx.case(name, kind="int8_linear_matmul", A_shape=list(sa), B_shape=list(sb), mode=mode,
                        semantics="out = A @ B.T (int32)")
            c.put("A", A)
            c.put("B", B)
            try:
                out = F.int8_linear_matmul(A, B)
            except Exception as e:
                c.fail(e)
                continue
            c.put("out", out)
            eq = bool(np.array_equal(out.numpy().astype(np.int64), exact))
            c.note(upstream_equals_exact=eq)
            if not eq:
                c.put("exact", exact)

        # --- int8_mm_dequant ---
        for shape in ((1, 1), (5, 7), (33, 17), (2, 3, 7)):
            rs = np.random.RandomState(seed_of(f"mmdq_{shape_tag(shape)}"))
            a = rs.randint(-3_000_000, 3_000_000, size=shape).astype(np.int32)
            rows = int(np.prod(shape[:-1]))
            rstats = (np.abs(rs.randn(rows)) * 3 + 0.1).astype(np.float32)
            cstats = (np.abs(rs.randn(shape[-1])) * 3 + 0.1).astype(np.float32)
            bias = rs.randn(shape[-1]).astype(np.float16)
            for with_bias in (False, True):
                name = f"mmdq_{shape_tag(shape)}" + ("_bias" if with_bias else "")
                c = fx.case(name, kind="int8_mm_dequant", shape=list(shape), bias=with_bias)
                A = torch.from_numpy(a)
                c.put("A", A)
                c.put("row_stats", torch.from_numpy(rstats))
                c.put("col_stats", torch.from_numpy(cstats))
                if with_bias:
                    c.put("bias", torch.from_numpy(bias))
                try:
                    out = F.int8_mm_dequant(A, torch.from_numpy(rstats), torch.from_numpy(cstats),
                                            bias=torch.from_numpy(bias) if with_bias else None)
                except Exception as e:
                    c.fail(e)
                    continue
                c.put("out", out)
        fx.save()

    # ==================================================================================
    # 3b. LLM.int8() forward with outlier columns (Linear8bitLt at inference, fp32)
    # ==================================================================================
    def gen_int8_mixed():
        fx = Fixture("int8_mixed", "Linear8bitLt (has_fp16_weights=False, eval) fp32 forward with outlier columns: "
                                   "int8 part + torch addmm of the outlier columns (MatMul8bitLt)")
        import bitsandbytes as bnb

        # rows >= 5: torch's fp32 addmm on this host sums each output's outlier products with FMA in ascending
        # column order, in blocks of 192 columns, each block's sum added to the int8 part (1..4 rows take
        # another kernel; not recorded here).  200 outlier columns cover the block boundary.
        for rows, K, N, n_out, with_bias in ((8, 64, 40, 3, False), (16, 96, 48, 12, True), (37, 256, 24, 200, True),
                                             (6, 1000, 16, 420, False)):
            name = f"lt_{rows}x{K}x{N}_o{n_out}" + ("_bias" if with_bias else "")
            rs = np.random.RandomState(seed_of(name))
            x = rs.randn(rows, K).astype(np.float64)
            cols = rs.choice(K, n_out, replace=False)
            for col in cols:
                r = rs.randint(rows)
                x[r, col] = rs.choice([-1.0, 1.0]) * rs.uniform(6.5, 40.0)
            x[0, int(cols[0])] = 6.0  # exactly at the threshold (an outlier: |x| >= 6)
            W = (rs.randn(N, K) * 0.05).astype(np.float32)
            b = (rs.randn(N) * 0.1).astype(np.float32) if with_bias else None
            A = tt(x.astype(np.float32), torch.float32)
            lin = bnb.nn.Linear8bitLt(K, N, bias=with_bias, has_fp16_weights=False, threshold=6.0)
            lin.weight = bnb.nn.Int8Params(torch.from_numpy(W), requires_grad=False, has_fp16_weights=False)
            if with_bias:
                lin.bias = torch.nn.Parameter(torch.from_numpy(b), requires_grad=False)
            lin = lin.to("cpu").eval()
            c = fx.case(name, kind="linear8bitlt_forward", rows=rows, K=K, N=N, planted_outlier_cols=int(n_out),
                        threshold=6.0, bias=with_bias,
                        note="randn activations with one planted |x| in [6.5, 40) per outlier column (x[0, c0] = 6.0); "
                             "W randn*0.05 fp32, quantized by Int8Params (fp16 cast, int8_vectorwise_quant)")
            c.put("A", A)
            c.put("W", torch.from_numpy(W))
            if with_bias:
                c.put("bias", torch.from_numpy(b))
            c.put("CB", lin.weight.CB)  # (moved to lin.state by the first forward)
            c.put("SCB", lin.weight.SCB)
            with torch.no_grad():
                out = lin(A)
            c.put("idx", lin.state.idx)
            c.put("out", out)
        fx.save()

    # ==================================================================================
    # 4. 4-bit
    # ==================================================================================
    def gen_fourbit():
        fx = Fixture("fourbit", "quantize_4bit / dequantize_4bit / QuantState.as_dict / gemv_4bit / matmul_4bit (CPU)")
        blocksizes = [32, 64, 128, 256, 512, 1024, 2048, 4096]
        dts = list(DT)
        inputs = {}

        def get_input(dt, shape, scale=1.0):
            key = (dt, tuple(shape))
            if key not in inputs:
                base = f"fb_{shape_tag(shape)}"
                n = int(np.prod(shape))
                zr = [(n // 2 - n // 2 % 64, n // 2 - n // 2 % 64 + 64)] if n >= 256 else []
                x = planted(base, shape, scale, zr, max(1, n // 500))
                A = tt(x, DT[dt])
                name = f"in_{dt}_{shape_tag(shape)}"
                c = fx.case(name, kind="input", dtype=dt, shape=list(shape), scale=scale, zero_ranges=zr,
                            n_outliers=max(1, n // 500),
                            note="randn*scale (RandomState), one flat zero range, outliers +-U(20,60)*scale; "
                                 "float32 rounded to dtype (RNE)")
                c.put("A", A)
                inputs[key] = (name, A)
            return inputs[key]

        quant = {}

        def run_case(qt, dt, bs, cs, shape):
            in_name, A = get_input(dt, shape)
            name = f"q4_{qt}_{dt}_bs{bs}_{shape_tag(shape)}" + ("_cs" if cs else "")
            c = fx.case(name, kind="quantize_4bit", input=in_name, quant_type=qt, dtype=dt, blocksize=bs,
                        compress_statistics=cs, shape=list(shape), quant_storage="uint8")
            try:
                q, qs = F.quantize_4bit(A.clone(), blocksize=bs, compress_statistics=cs, quant_type=qt)
            except Exception as e:
                c.fail(e)
                return None
            c.put("packed", q)
            c.put("absmax", qs.absmax)
            c.note(packed_shape=list(q.shape), state_shape=list(qs.shape), state_dtype=str(qs.dtype),
                   state_blocksize=int(qs.blocksize))
            if cs:
                c.put("nested_absmax", qs.state2.absmax)
                c.put("nested_code", qs.state2.code)
                c.put("offset", qs.offset)
                c.note(nested_blocksize=int(qs.state2.blocksize))
            try:
                d = F.dequantize_4bit(q, qs)
                c.put("dequant", d)
            except Exception as e:
                c.fail(e, "dequantize_4bit")
            quant[name] = (c, q, qs)
            return name

        for qi, qt in enumerate(("nf4", "fp4")):
            for bi, bs in enumerate(blocksizes):
                rows = 7 if bs <= 256 else 2
                for cs in (False, True):
                    # (rows, bs-1): one dtype per (qt, bs, cs), rotating so each bs sees several dtypes
                    dt = dts[(bi + qi + (1 if cs else 0)) % 3]
                    run_case(qt, dt, bs, cs, (rows, bs - 1))
            for dt in dts:
                for bs in (64, 4096):
                    for cs in ((False, True) if bs == 64 else (False,)):
                        run_case(qt, dt, bs, cs, (64, 64))
                for bs in (32, 64, 256):
                    for cs in (False, True):
                        run_case(qt, dt, bs, cs, (1000,))

        # QuantState.as_dict(packed=True)
        for src in ("q4_nf4_f16_bs64_64x64_cs", "q4_fp4_bf16_bs64_64x64"):
            c0, q, qs = quant[src]
            c = fx.case(f"asdict_{src}", kind="quant_state_as_dict_packed", source=src)
            try:
                d = qs.as_dict(packed=True)
            except Exception as e:
                c.fail(e)
                continue
            keymap = {}
            for i, (k, v) in enumerate(d.items()):
                field = f"item{i}"
                keymap[k] = field
                c.put(field, v)
                if k.startswith("quant_state."):
                    c.note(packed_json=bytes(v.numpy().tolist()).decode("utf-8"))
            c.note(keys=list(d.keys()), key_to_field=keymap)

        # gemv_4bit / matmul_4bit: A (1, K), B (N, K) quantized from fp32 source
        for K in (64, 256):
            for N in (32, 100):
                rs = np.random.RandomState(seed_of(f"gemvB_{K}_{N}"))
                b16 = (rs.randn(N, K) * 0.5).astype(np.float16)  # values representable in fp16
                bname = f"gB_K{K}_N{N}"
                c = fx.case(bname, kind="input", shape=[N, K],
                            note="B source, stored as float16; it was upcast exactly to float32 before quantize_4bit")
                c.put("B", torch.from_numpy(b16))
                B32 = torch.from_numpy(b16.astype(np.float32))
                ra = np.random.RandomState(seed_of(f"gemvA_{K}"))
                a32 = ra.randn(1, K).astype(np.float32)
                for qt in ("nf4", "fp4"):
                    for cs in ((False, True) if (K, N) == (256, 100) else (False,)):
                        qname = f"gq_{qt}_K{K}_N{N}" + ("_cs" if cs else "")
                        cq = fx.case(qname, kind="quantize_4bit", input=bname, quant_type=qt, dtype="f32",
                                     blocksize=64, compress_statistics=cs, shape=[N, K])
                        try:
                            qB, st = F.quantize_4bit(B32.clone(), blocksize=64, quant_type=qt,
                                                     compress_statistics=cs)
                        except Exception as e:
                            cq.fail(e)
                            continue
                        cq.put("packed", qB)
                        cq.put("absmax", st.absmax)
                        if cs:
                            cq.put("nested_absmax", st.state2.absmax)
                            cq.put("nested_code", st.state2.code)
                            cq.put("offset", st.offset)
                            cq.note(nested_blocksize=int(st.state2.blocksize))
                        for dt in dts:
                            A = tt(a32, DT[dt])
                            c = fx.case(f"gemv_{qt}_{dt}_K{K}_N{N}" + ("_cs" if cs else ""), kind="gemv_4bit",
                                        quant=qname, dtype=dt, K=K, N=N, A_shape=[1, K],
                                        calls={"gemv": "F.gemv_4bit(A, packed, state=qs)",
                                               "matmul": "bnb.matmul_4bit(A, packed.t(), quant_state=qs)"},
                                        exactness="uses torch F.linear (BLAS); compare with a tolerance")
                            c.put("A", A)
                            try:
                                c.put("gemv", F.gemv_4bit(A, qB, state=st))
                            except Exception as e:
                                c.fail(e, "gemv_4bit")
                            try:
                                c.put("matmul", bitsandbytes.matmul_4bit(A, qB.t(), quant_state=st))
                            except Exception as e:
                                c.fail(e, "matmul_4bit")
        fx.save()

    # ==================================================================================
    # 5. optimizers
    # ==================================================================================
    def gen_optim():
        fx = Fixture("optim_8bit", "optimizer_update_8bit_blockwise / optimizer_update_32bit (CPU)")
        n = 4096 + 100
        blocksize = 256
        blocks = -(-n // blocksize)
        rs = np.random.RandomState(seed_of("optim"))
        p0 = (rs.randn(n) * 0.5).astype(np.float32)
        grads = []
        for s in range(3):
            g = (rs.randn(n) * 0.1).astype(np.float32)
            g[rs.choice(n, 50, replace=False)] = 0.0
            g[rs.choice(n, 5, replace=False)] *= 30.0
            grads.append(g)
        c = fx.case("init", kind="input", n=n, note="p0 = randn*0.5; g_s = randn*0.1 with 50 zeros and 5 x30 spikes")
        c.put("p0", torch.from_numpy(p0))
        for s, g in enumerate(grads, 1):
            c.put(f"g{s}", torch.from_numpy(g))
        qmap1 = F.create_dynamic_map(signed=True)
        qmap2 = F.create_dynamic_map(signed=False)

        # name -> (beta1, beta2, beta3, alpha, eps, lr, weight_decay, two_states)
        configs = {
            "adam": dict(beta1=0.9, beta2=0.999, beta3=0.0, alpha=0.0, eps=1e-8, lr=1e-3, weight_decay=0.0),
            "momentum": dict(beta1=0.9, beta2=0.0, beta3=0.0, alpha=0.0, eps=1e-8, lr=1e-2, weight_decay=0.0),
            "rmsprop": dict(beta1=0.99, beta2=0.0, beta3=0.0, alpha=0.0, eps=1e-8, lr=1e-2, weight_decay=0.0),
            "lion": dict(beta1=0.9, beta2=0.99, beta3=0.0, alpha=0.0, eps=1e-8, lr=1e-4, weight_decay=0.0),
            "adagrad": dict(beta1=0.0, beta2=0.0, beta3=0.0, alpha=0.0, eps=1e-10, lr=1e-2, weight_decay=0.0),
            "ademamix": dict(beta1=0.9, beta2=0.999, beta3=0.9999, alpha=5.0, eps=1e-8, lr=1e-3, weight_decay=0.0),
        }
        two_state = {"adam", "ademamix"}
        runs = [(name, name, cfg, 3) for name, cfg in configs.items()]
        runs.append(("adam_wd", "adam", dict(configs["adam"], weight_decay=0.01), 1))
        runs.append(("momentum_wd", "momentum", dict(configs["momentum"], weight_decay=0.01), 2))

        # ---- 8-bit blockwise: state starts as zeros (uint8) with zero absmax, as the optimizers do
        for tag, oname, cfg, steps in runs:
            c = fx.case(f"o8_{tag}", kind="optimizer_update_8bit_blockwise", optimizer_name=oname, n=n,
                        blocksize=blocksize, steps=steps, gnorm_scale=1.0, skip_zeros=False,
                        qmap1="create_dynamic_map(signed=True)",
                        qmap2="create_dynamic_map(signed=False)" if oname in two_state else None,
                        init="p=init__p0; state bytes 0, absmax 0 (like Optimizer8bit.init_state); "
                             "step s uses init__g<s> and step=s", **cfg)
            p = torch.from_numpy(p0.copy())
            if oname == "ademamix":
                s1 = torch.zeros((2, n), dtype=torch.uint8)
                a1 = torch.zeros((2, blocks), dtype=torch.float32)
            else:
                s1 = torch.zeros((n,), dtype=torch.uint8)
                a1 = torch.zeros((blocks,), dtype=torch.float32)
            if oname in two_state:
                s2 = torch.zeros((n,), dtype=torch.uint8)
                a2 = torch.zeros((blocks,), dtype=torch.float32)
            else:
                s2 = a2 = None
            try:
                for s in range(1, steps + 1):
                    g = torch.from_numpy(grads[s - 1])
                    F.optimizer_update_8bit_blockwise(
                        oname, g, p, s1, s2, cfg["beta1"], cfg["beta2"], cfg["beta3"], cfg["alpha"], cfg["eps"],
                        s, cfg["lr"], qmap1, qmap2 if s2 is not None else None, a1, a2,
                        weight_decay=cfg["weight_decay"], gnorm_scale=1.0, skip_zeros=False)
                    c.put(f"p_s{s}", p)
                    c.put(f"state1_s{s}", s1)
                    c.put(f"absmax1_s{s}", a1)
                    if s2 is not None:
                        c.put(f"state2_s{s}", s2)
                        c.put(f"absmax2_s{s}", a2)
            except Exception as e:
                c.fail(e)

        # ---- 32-bit: fp32 zero states; p after every step, states after the last step only
        for tag, oname, cfg, steps in runs:
            steps = min(steps, 2)
            c = fx.case(f"o32_{tag}", kind="optimizer_update_32bit", optimizer_name=oname, n=n, steps=steps,
                        gnorm_scale=1.0, max_unorm=0.0, skip_zeros=False,
                        init="p=init__p0; fp32 states zero; step s uses init__g<s> and step=s; "
                             "states stored after the last step only", **cfg)
            p = torch.from_numpy(p0.copy())
            s1 = torch.zeros((2, n) if oname == "ademamix" else (n,), dtype=torch.float32)
            s2 = torch.zeros((n,), dtype=torch.float32) if oname in two_state else None
            try:
                for s in range(1, steps + 1):
                    g = torch.from_numpy(grads[s - 1])
                    F.optimizer_update_32bit(
                        oname, g, p, s1, cfg["beta1"], cfg["eps"], s, cfg["lr"], state2=s2, beta2=cfg["beta2"],
                        beta3=cfg["beta3"], alpha=cfg["alpha"], weight_decay=cfg["weight_decay"], gnorm_scale=1.0)
                    c.put(f"p_s{s}", p)
                c.put(f"state1_s{steps}", s1)
                if s2 is not None:
                    c.put(f"state2_s{steps}", s2)
            except Exception as e:
                c.fail(e)
        fx.save()

    gens = {
        "code_maps": gen_code_maps,
        "blockwise_8bit": gen_blockwise_8bit,
        "int8": gen_int8,
        "fourbit": gen_fourbit,
        "optim_8bit": gen_optim,
        "int8_mixed": gen_int8_mixed,
    }
    t0 = time.time()
    print(f"[make_reference_vectors] bitsandbytes {bitsandbytes.__version__}, torch {torch.__version__}, "
          f"cpu capability {META['torch_cpu_capability']}, writing to {out_dir}", flush=True)
    for name in FIXTURES:
        if name in only:
            t1 = time.time()
            gens[name]()
            print(f"    ({time.time() - t1:.1f}s)", flush=True)
    print(f"[make_reference_vectors] generated in {time.time() - t0:.1f}s", flush=True)
    check_outputs(out_dir, [n for n in FIXTURES if n in only])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--inside", action="store_true", help="(internal) running inside the upstream venv")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: compat_tests/fixtures)")
    ap.add_argument("--only", default="", help="comma separated subset of: " + ",".join(FIXTURES))
    ap.add_argument("--check", action="store_true", help="only load and summarise existing fixtures")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)
    if args.check:
        check_outputs(args.out, [n for n in FIXTURES if not args.only or n in args.only.split(",")])
    elif args.inside:
        inner_main(args)
    else:
        outer_main(args)


if __name__ == "__main__":
    main()
