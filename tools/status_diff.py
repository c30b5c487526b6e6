"""Differential check of the native entry points' argument checks between two builds of the CPU library.

For a refactor of the checks (csrc/checks/*.h) that must not change behaviour: record, for thousands of
well-formed, empty and malformed calls (wrong arity, dtypes, shapes, scalar values/dtypes/ranks, null
pointers, and random pairs of those, which exercise the order of the checks), the status each entry
point returns and a digest of every buffer after the call (so outputs, in-place updates and status
outputs are compared too), then compare two recordings.

    python tools/status_diff.py record LIB.so out.json [--pairs N] [--ops REGEX] [--device cuda] [--ok-only]
    python tools/status_diff.py compare old.json new.json [--status-only]

On a GPU host (torch with CUDA), the CUDA library against the CPU library of the same tree:
    python3 tools/status_diff.py record bitsandbytes_ms/libbitsandbytes_ms_cpu.so cpu.json
    python3 tools/status_diff.py record bitsandbytes_ms/libbitsandbytes_ms_cuda.so cuda.json --device cuda
    python3 tools/status_diff.py compare cpu.json cuda.json --status-only   # drop --status-only: bytes too

Covers the blockwise, 4-bit (fourbit_ops), optim, weightonly and int8 entry points (the fused cint8_linear_* and
cint8_mixed_mm_dequant_* included), and well-formed calls on edge values (edge_ops: subnormal blocks, NaN/inf rows).  Calls go straight through ctypes with the
AOT signature (no MindSpore); buffers are over-allocated so that a call a library wrongly accepts
cannot write outside them.  Run each `record` in its own process (one library per process).
"""

from __future__ import annotations

import argparse
import ctypes as ct
import hashlib
import importlib.util
import json
import os
import random
import re
import sys
import types
from pathlib import Path

import warnings

import numpy as np

# dtype name -> (numpy dtype for sizing/filling, itemsize)
DT = {
    "float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "float64": np.float64,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "bool": np.bool_,
}
ALL_DTYPES = list(DT) + ["none", "complex64"]
ROOT = Path(__file__).resolve().parents[1]
SFX = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class P:
    """One param: a tensor (shape, dtype) or a 0-d scalar (value)."""

    def __init__(self, shape, dtype, value=None, init=None, null=False):
        self.shape, self.dtype, self.value, self.init, self.null = tuple(shape), dtype, value, init, null

    def copy(self, **kw):
        q = P(self.shape, self.dtype, self.value, self.init, self.null)
        for k, v in kw.items():
            setattr(q, k, v)
        return q


def S(v, dtype=None):
    if dtype is None:
        dtype = "bool" if isinstance(v, bool) else "int64" if isinstance(v, int) else "float64"
    return P((), dtype, value=v)


def code():
    return P((256,), "float32", init=lambda: np.linspace(-1, 1, 256, dtype=np.float32))


# ---- well-formed templates, per entry point --------------------------------------------------------
def blockwise_ops():
    for sfx, dt in SFX.items():
        for n, bs in ((1000, 64), (0, 64), (300, 256)):
            nb = -(-n // bs)
            yield f"cquantize_blockwise_{sfx}", [code(), P((n,), dt), S(bs), P((n,), "uint8"), P((nb,), "float32")]
            yield f"cdequantize_blockwise_{sfx}", [code(), P((n,), "uint8"), P((nb,), "float32", init="absmax"), S(bs),
                                                    P((n,), dt)]


def op_table():
    """bitsandbytes_ms/_native_table.py, loaded without the package's __init__ (no mindnlp, no native library).  It imports
    mindspore, for dtype constants the entry point names do not need (a GPU host without MindSpore gets a
    stand-in), and the package's utils.py (the one dtype map; numpy and mindspore only): both modules are loaded
    from the package directory under a bare package of their own, so the table's relative import finds utils."""
    try:
        import mindspore  # noqa: F401
    except ImportError:
        stub = types.ModuleType("mindspore")
        stub.__getattr__ = lambda attr: f"mindspore.{attr}"
        sys.modules["mindspore"] = stub
    pkg = sys.modules.get("bnb_ms_ops_pkg")
    if pkg is None:
        pkg = types.ModuleType("bnb_ms_ops_pkg")
        pkg.__path__ = [str(ROOT / "bitsandbytes_ms")]  # submodules come from there; its __init__ never runs
        sys.modules[pkg.__name__] = pkg
    return importlib.import_module("bnb_ms_ops_pkg._native_table")


def optim_ops():
    ops = op_table()
    for opt, names in ops.OPTIM_32BIT_NAMES.items():
        two, mult = opt in ("adam", "ademamix"), 2 if opt == "ademamix" else 1
        for name, dt in zip(names, SFX.values()):
            for n in (300, 0):
                for max_unorm in (0.0, 1.0):
                    s2 = P((n,), "float32", init="state") if two else None
                    un = P((1,), "float32") if max_unorm else None
                    hp = [S(0.9), S(0.999), S(0.5), S(2.0), S(1e-8), S(0.01), S(3), S(1e-3), S(1.0), S(False)]
                    yield name, [P((n,), dt), P((n,), dt), P((mult * n,), "float32", init="state"), s2, un, S(max_unorm),
                                 S(0.0)] + hp + [P((1,), "int32")]
    for opt, names in ops.OPTIM_8BIT_BLOCKWISE_NAMES.items():
        two, mult = opt in ("adam", "ademamix"), 2 if opt == "ademamix" else 1
        for name, dt in zip(names, SFX.values()):
            for n in (300, 0):
                nb = -(-n // 256)
                s2 = P((n,), "uint8") if two else None
                q2 = code() if two else None
                a2 = P((nb,), "float32", init="absmax") if two else None
                hp = [S(0.9), S(0.999), S(0.5), S(2.0), S(1e-8), S(3), S(1e-3), S(0.01), S(1.0), S(False)]
                yield name, [P((n,), dt), P((n,), dt), P((mult * n,), "uint8"), s2, code(), q2,
                             P((mult * nb,), "float32", init="absmax"), a2] + hp + [P((1,), "int32")]


def weightonly_ops():
    for sfx, dt in SFX.items():
        for bits in (8, 4):
            qd = "int8" if bits == 8 else "uint8"
            for N, K, M in ((8, 33, 3), (8, 32, 1), (0, 16, 2), (4, 0, 2)):
                rb = K if bits == 8 else (K + 1) // 2
                yield f"cquantize_weight_only_int{bits}_{sfx}", [P((N, K), dt), P((N, rb), qd), P((N,), "float32")]
                yield f"cdequantize_weight_only_int{bits}_{sfx}", [P((N, rb), qd), P((N,), "float32", init="absmax"),
                                                                   S(K), P((N, K), dt)]
                yield f"cgemm_weight_only_int{bits}_{sfx}", [P((M, K), dt), P((N, rb), qd),
                                                             P((N,), "float32", init="absmax"), P((M, N), dt)]


def int8_ops():
    for sfx, dt in SFX.items():
        # cint8_vector_quant dispatches on A's dtype (one entry point); (4, 0) and (0, 16): empty
        for shape in ((5, 33), (2, 3, 16), (16,), (0, 16), (4, 0)):
            rows, cols = numel(shape[:-1]), shape[-1]
            for thr in (0.0, 2.0):
                yield "cint8_vector_quant", [P(shape, dt), S(thr, "float32"), P(shape, "int8"),
                                             P((rows if cols else 0,), "float32"), P((cols,), "uint8")]
        for shape in ((3, 33), (2, 3, 8), (1, 8), (0, 8), (4, 0)):
            rows, cols = numel(shape[:-1]), shape[-1]
            for bias in (None, "float32", "float16", "bfloat16"):
                yield f"cdequant_mm_int32_{sfx}", [P(shape, "int32", init="ints"), P((rows if cols else 0,), "float32",
                                                   init="absmax"), P((cols,), "float32", init="absmax"),
                                                   None if bias is None else P((cols,), bias), P(shape, dt)]
    for sfx, dt in SFX.items():
        # cint8_mixed_mm_dequant_<sfx>: C i32[..., N], row_stats, col_stats, bias | none, A T[..., K], CB i8[N, K],
        # col_flags u8[K] (random bytes: most columns flagged) -> out T[..., N]; rows or N = 0 is empty
        for lead, N, K in (((3,), 8, 33), ((2, 3), 5, 16), ((1,), 8, 1), ((0,), 8, 16), ((3,), 0, 16), ((3,), 4, 0)):
            rows = numel(lead)
            for bias in (None, "float16"):
                yield f"cint8_mixed_mm_dequant_{sfx}", [
                    P(lead + (N,), "int32", init="ints"), P((rows,), "float32", init="absmax"),
                    P((N,), "float32", init="absmax"), None if bias is None else P((N,), bias), P(lead + (K,), dt),
                    P((N, K), "int8"), P((K,), "uint8"), P(lead + (N,), dt)]
        # cint8_linear_<sfx>: A T[..., K], CB i8[N, K], SCB f32[N], bias | none, threshold -> out T[..., N],
        # col_flags u8[K]; rows, N or K = 0 is empty (flags zeroed; K = 0: out zeroed); K = 131071 the largest K
        for lead, N, K in (((3,), 8, 33), ((2, 3), 5, 16), ((1,), 8, 1), ((0,), 8, 16), ((3,), 0, 16), ((3,), 4, 0),
                           ((1,), 1, 131071), ((1,), 1, 131072)):
            for thr, bias in ((0.0, None), (2.0, "float32")):
                yield f"cint8_linear_{sfx}", [
                    P(lead + (K,), dt), P((N, K), "int8"), P((N,), "float32", init="absmax"),
                    None if bias is None else P((N,), bias), S(thr, "float32"), P(lead + (N,), dt), P((K,), "uint8")]
    # cigemmlt_32: A i8[..., K], B i8[N, K] -> out i32[..., N]; M or N = 0 is empty; the entry point counts
    # M = numel(A) / K, 0 for K = 0, so A (3, 0) wants out (0, N); K = 131071 is the largest K taken
    for a_shape, n, o_shape in (((3, 33), 5, None), ((2, 3, 16), 4, None), ((1, 8), 1, None), ((0, 16), 3, None),
                                ((3, 16), 0, None), ((3, 0), 5, (0, 5)), ((3, 0), 5, None), ((1, 131071), 1, None),
                                ((1, 131072), 1, None)):
        k = a_shape[-1]
        yield "cigemmlt_32", [P(a_shape, "int8"), P((n, k), "int8"), P(o_shape or a_shape[:-1] + (n,), "int32")]
        if k <= 33:  # the op table's row: + has_error i32[1] (3-param ctypes callers get failures as the status)
            yield "cigemmlt_32", [P(a_shape, "int8"), P((n, k), "int8"), P(o_shape or a_shape[:-1] + (n,), "int32"),
                                  P((1,), "int32")]


def _values(x, dt):
    """init for a param of dtype ``dt`` holding the float32 values ``x`` (bf16 as its bits, rounded to nearest even)."""
    x = np.asarray(x, np.float32)
    if dt == "bfloat16":
        b = x.view(np.uint32)
        return lambda: ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return lambda: x.astype(DT[dt])


def _edge_blocks(n, bs, seed):
    """Blocks of subnormals next to zeros (1/absmax overflows), tiny normal ones, ordinary ones and a NaN."""
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    for b, s in enumerate(range(0, n, bs)):
        x[s:s + bs] *= (1e-41, 3e-39, 1e-44, 1.0, 1e-40)[b % 5]
    x[::7] = 0.0
    x[min(n - 1, 4 * bs + 1)] = np.nan
    return x


def edge_ops():
    """Well-formed calls on edge values (issue 15 item 6), so that `compare` checks their bytes across builds and
    between the CPU and the CUDA library: blockwise blocks whose 1/absmax overflows, 8-bit optimizer states that
    start from such blocks, weight-only rows holding NaN / +-inf / all-NaN."""
    for sfx, dt in SFX.items():
        for n, bs in ((1000, 64), (5000, 256), (70000, 4096)):
            x = _edge_blocks(n, bs, n)
            yield f"cquantize_blockwise_{sfx}", [code(), P((n,), dt, init=_values(x, dt)), S(bs), P((n,), "uint8"),
                                                 P((-(-n // bs),), "float32")]
        for bits in (8, 4):
            W = np.random.default_rng(bits).standard_normal((9, 33)).astype(np.float32)
            W[1, 3], W[2, 0], W[3, 5], W[4, :], W[5, :] = np.nan, np.inf, -np.inf, np.nan, 0.0
            yield f"cquantize_weight_only_int{bits}_{sfx}", [P((9, 33), dt, init=_values(W, dt)),
                                                             P((9, 33 if bits == 8 else 17), "int8" if bits == 8 else "uint8"),
                                                             P((9,), "float32")]
    ops = op_table()
    for opt, names in ops.OPTIM_8BIT_BLOCKWISE_NAMES.items():
        two, mult = opt in ("adam", "ademamix"), 2 if opt == "ademamix" else 1
        for name, dt in zip(names, SFX.values()):
            n = 256 * 6 + 17
            nb = -(-n // 256)
            g = np.nan_to_num(_edge_blocks(n, 256, 7), nan=0.0)
            zeros_u8 = P((mult * n,), "uint8", init=lambda k=mult * n: np.zeros(k, np.uint8))
            zeros_am = P((mult * nb,), "float32", init=lambda k=mult * nb: np.zeros(k, np.float32))
            s2 = P((n,), "uint8", init=lambda: np.zeros(n, np.uint8)) if two else None
            a2 = P((nb,), "float32", init=lambda: np.zeros(nb, np.float32)) if two else None
            hp = [S(0.9), S(0.999), S(0.5), S(2.0), S(1e-8), S(1), S(1e-3), S(0.0), S(1.0), S(False)]
            yield name, [P((n,), dt, init=_values(g, dt)), P((n,), dt), zeros_u8, s2, code(), code() if two else None,
                         zeros_am, a2] + hp + [P((1,), "int32")]


def code4():
    return P((16,), "float32", init=lambda: np.linspace(-1, 1, 16, dtype=np.float32))


def fourbit_ops():
    for sfx, dt in SFX.items():
        for qt in ("fp4", "nf4"):
            for n, bs in ((1000, 64), (0, 64), (301, 32)):
                nb = -(-n // bs)
                yield f"cquantize_blockwise_{sfx}_{qt}", [code4(), P((n,), dt), S(bs), P(((n + 1) // 2, 1), "uint8"),
                                                          P((nb,), "float32")]
                yield f"cdequantize_blockwise_{sfx}_{qt}", [code4(), P(((n + 1) // 2,), "uint8"),
                                                            P((nb,), "float32", init="absmax"), S(bs), S(n), P((n,), dt)]
        # (M, N, K, blocksize): M or N = 0 is empty; K = 0 writes zeros
        for M, N, K, bs in ((1, 8, 64, 64), (3, 5, 33, 32), (0, 8, 64, 64), (2, 0, 64, 64), (2, 4, 0, 64)):
            nb = -(-(N * K) // bs)
            wb = (N * K + 1) // 2
            yield f"cgemm_4bit_inference_naive_{sfx}", [P((M, K), dt), P((wb,), "uint8"), P((nb,), "float32", init="absmax"),
                                                        code4(), S(bs), S(N), P((M, N), dt)]
            for nested in (False, True):
                for bias in (None, dt):
                    if nested:
                        am = [P((nb,), "uint8"), P((-(-nb // 256),), "float32", init="absmax"), code(), S(0.25, "float32")]
                    else:
                        am = [P((nb,), "float32", init="absmax"), None, None, None]
                    yield f"clinear_4bit_{sfx}", [P((M, K), dt), P((wb,), "uint8"), am[0], code4(), am[1], am[2], am[3],
                                                  None if bias is None else P((N,), bias), S(bs), S(256), S(N), P((M, N), dt)]


def templates():
    for gen in (blockwise_ops, fourbit_ops, optim_ops, weightonly_ops, int8_ops, edge_ops):
        yield from gen()


# ---- mutations ------------------------------------------------------------------------------------
def numel(shape):
    return int(np.prod(shape)) if shape else 1


def single_mutations(args):
    """(label, function(args) -> args) for one change of one param."""
    muts = [("drop last", lambda a: a[:-1]), ("extra", lambda a: a + [P((4,), "float32")])]
    for i, p in enumerate(args):
        def put(i=i, **kw):
            return lambda a: [q.copy(**kw) if j == i and q is not None else q for j, q in enumerate(a)]

        if p is None:
            muts.append((f"{i} given", lambda a, i=i: a[:i] + [P((4,), "float32")] + a[i + 1:]))
            continue
        muts.append((f"{i} none", lambda a, i=i: a[:i] + [None] + a[i + 1:]))
        muts.append((f"{i} null", put(null=True)))
        for d in ALL_DTYPES:
            if d != p.dtype:
                muts.append((f"{i} dtype {d}", put(dtype=d)))
        if p.value is not None:  # scalar
            vals = [0, -1, 1, 2, 7, 64, 63, 0.5, 64.5, -0.0, float("nan"), float("inf"), 2.0**62, True, False]
            for v in vals:
                for d in ("int64", "int32", "float32", "float64", "bool"):
                    muts.append((f"{i} value {v!r} {d}", put(value=v, dtype=d)))
            muts.append((f"{i} shape (1,)", put(shape=(1,))))
            muts.append((f"{i} shape (2,)", put(shape=(2,))))
        else:
            sh = p.shape
            cands = {(), (1,) + sh, (numel(sh),), sh[:-1] + (sh[-1] + 1,) if sh else (2,)}
            if sh and sh[-1] > 0:
                cands.add(sh[:-1] + (sh[-1] - 1,))
            if sh:
                cands.add((0,) + sh[1:])
                cands.add(sh + (1,))
                cands.add(sh[:-1] + (2 * sh[-1],))
            if len(sh) == 2:
                cands.add((sh[1], sh[0]))
                cands.add((sh[0] * sh[1],))
            for s in sorted(cands - {sh}):
                muts.append((f"{i} shape {s}", put(shape=s)))
    return muts


# ---- calling --------------------------------------------------------------------------------------
ARGTYPES = [ct.c_int, ct.POINTER(ct.c_void_p), ct.POINTER(ct.c_int), ct.POINTER(ct.POINTER(ct.c_int64)),
            ct.POINTER(ct.c_char_p), ct.c_void_p, ct.c_void_p]


def fill(p, rng, nbytes):
    """Deterministic contents for a param's buffer (nbytes long)."""
    buf = np.zeros(nbytes, np.uint8)
    if p.value is not None:
        d = DT.get(p.dtype, np.float64)
        v = np.array(p.value).astype(d if d is not np.uint16 else np.float32)
        raw = v.tobytes()
        buf[: len(raw)] = np.frombuffer(raw, np.uint8)
        return buf
    if p.init is not None and not isinstance(p.init, str):
        raw = p.init().tobytes()
    elif p.init == "ints":  # int32 GEMM results for mm dequant
        raw = rng.integers(-(2**20), 2**20, nbytes // 4, dtype=np.int32).tobytes()
    elif p.dtype in ("float32", "float16", "float64"):
        k = nbytes // np.dtype(DT[p.dtype]).itemsize
        x = rng.standard_normal(k)
        if p.init == "absmax":
            x = np.abs(x) + 0.5
        if p.init == "state":
            x = np.abs(x) * 0.1
        raw = x.astype(DT[p.dtype]).tobytes()
    elif p.dtype == "bfloat16":
        k = nbytes // 2
        raw = (rng.standard_normal(k).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    elif p.dtype in ("int32", "int64", "bool"):
        raw = b""
    else:
        raw = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    raw = raw[:nbytes]
    buf[: len(raw)] = np.frombuffer(raw, np.uint8)
    return buf


def aot_args(ptrs, shapes, dts):
    """The AOT signature's first five arguments for params at ``ptrs`` (None: null) of ``shapes`` and dtype
    names ``dts`` -- (nparam, params, ndims, shapes, dtypes) -- and what must stay alive while they are used."""
    n = len(ptrs)
    params = (ct.c_void_p * n)(*ptrs)
    ndims = (ct.c_int * n)(*[len(s) for s in shapes])
    keep = [(ct.c_int64 * max(1, len(s)))(*s) for s in shapes]
    shp = (ct.POINTER(ct.c_int64) * n)(*[ct.cast(k, ct.POINTER(ct.c_int64)) for k in keep])
    dtp = (ct.c_char_p * n)(*[d.encode() for d in dts])
    return (n, params, ndims, shp, dtp), keep


class Lib:
    """One library; device "cuda" puts every buffer (scalars too, as MindSpore's GPU runtime may) in
    device memory through torch and passes torch's current stream."""

    def __init__(self, path, device="host"):
        self.dll = ct.CDLL(os.path.abspath(path))
        self.fns = {}
        self.torch = None
        if device != "host":
            import torch

            self.torch, self.device = torch, torch.device(device)

    def call(self, name, args, seed):
        if name not in self.fns:
            fn = getattr(self.dll, name)
            fn.restype, fn.argtypes = ct.c_int, ARGTYPES
            self.fns[name] = fn
        rng = np.random.default_rng(seed)
        bufs, ptrs, shapes, dts, keep = [], [], [], [], []
        for p in args:
            if p is None:
                bufs.append(None); ptrs.append(None); shapes.append(()); dts.append("none")
                continue
            nbytes = 4 * max(64, numel(p.shape) * 8) + 64  # generous: a wrongly accepted call stays inside
            b = fill(p, rng, nbytes)
            if self.torch is not None:
                b = self.torch.from_numpy(b).to(self.device)
            bufs.append(b)
            ptrs.append(None if p.null else (b.ctypes.data if self.torch is None else b.data_ptr()))
            shapes.append(p.shape)
            dts.append(p.dtype)
        arrays, keep = aot_args(ptrs, shapes, dts)
        stream = None
        if self.torch is not None and self.device.type == "cuda":
            stream = self.torch.cuda.current_stream().cuda_stream
        rc = self.fns[name](*arrays, stream, None)
        if self.torch is not None:
            try:
                if self.device.type == "cuda":
                    self.torch.cuda.synchronize()
                bufs = [None if b is None else b.cpu().numpy() for b in bufs]
            except RuntimeError as e:  # a kernel fault: report it (the next calls will fail too)
                return rc, f"device error: {e}"[:200]
        h = hashlib.sha1()
        for b in bufs:
            h.update(b"-" if b is None else b.tobytes())
        return rc, h.hexdigest()[:16]


def record(lib_path, out, pairs, ops_re, device, ok_only=False):
    warnings.simplefilter("ignore")  # casts of nan/inf/huge scalars to integer dtypes
    lib = Lib(lib_path, device)
    res = {}
    rnd = random.Random(1234)
    for t, (name, args) in enumerate(templates()):
        if ops_re and not re.search(ops_re, name):
            continue
        muts = [] if ok_only else single_mutations(args)
        cases = [("ok", lambda a: a)] + muts
        for _ in range(pairs if muts else 0):
            (l1, f1), (l2, f2) = rnd.sample(muts, 2)
            cases.append((f"{l1} + {l2}", lambda a, f1=f1, f2=f2: f2(f1(a))))
        for label, f in cases:
            key = f"{name}#{t} {label}"
            try:
                a = f(list(args))
            except Exception as e:  # a mutation that does not apply to this template
                res[key] = f"skip {type(e).__name__}"
                continue
            res[key] = lib.call(name, a, seed=len(res))
    with open(out, "w") as fh:
        json.dump(res, fh, indent=0, sort_keys=True)
    statuses = {}
    for v in res.values():
        if isinstance(v, (list, tuple)):
            statuses[v[0]] = statuses.get(v[0], 0) + 1
    print(f"{len(res)} calls recorded to {out}; statuses: {dict(sorted(statuses.items()))}")


def compare(a_path, b_path, status_only):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    keys = sorted(set(a) | set(b))

    def view(v):
        return v[0] if status_only and isinstance(v, list) else v

    diff = [k for k in keys if view(a.get(k)) != view(b.get(k))]
    for k in diff[:50]:
        print(f"DIFF {k}: {a.get(k)} -> {b.get(k)}")
    print(f"{len(keys)} calls, {len(diff)} differ")
    return 1 if diff else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("lib")
    r.add_argument("out")
    r.add_argument("--pairs", type=int, default=300, help="random pairs of mutations per template")
    r.add_argument("--ops", default="", help="regex of entry point names")
    r.add_argument("--device", default="host", help='"host" (numpy buffers) or a torch device ("cuda", "cpu")')
    r.add_argument("--ok-only", action="store_true", help="only the well-formed calls (their output bytes), no mutations")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--status-only", action="store_true", help="compare statuses, not buffer digests")
    ns = ap.parse_args()
    if ns.cmd == "record":
        record(ns.lib, ns.out, ns.pairs, ns.ops, ns.device, ns.ok_only)
        return 0
    return compare(ns.a, ns.b, ns.status_only)


if __name__ == "__main__":
    sys.exit(main())
