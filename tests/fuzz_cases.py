"""The bad-input suite's cases, run inside a worker process (tests/fuzz_worker.py).

A case gets plain params (shapes, dtype names, seeds, flags; drawn by hypothesis in tests/test_fuzz_*.py),
builds its inputs from them, makes the call under test and classifies what happened (see tests/fuzz_pool.py):
``ok`` when the result equals the numpy reference (``bitsandbytes_ms._reference``, or a direct numpy
computation of the documented formula), ``clear`` when a bad input raised an exception that names the argument
and what was expected, ``wrong`` otherwise. Each case decides itself, from its params, whether the input is
valid (then any exception is wrong) or not (then it must raise a clear error).
"""

from __future__ import annotations

import contextlib
import io
import math
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()

import mindnlp  # noqa: E402,F401  (before torch: torch is mindtorch)
import torch  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
import bitsandbytes_ms.nn  # noqa: E402,F401
from bitsandbytes_ms import _reference as R  # noqa: E402
from bitsandbytes_ms import cextension  # noqa: E402
from bitsandbytes_ms import functional as F  # noqa: E402
from fuzz_classify import Outcome, Raised, call, clarity, differ, expect_error, must, outcome  # noqa: E402

CASES: Dict[str, Callable[..., Outcome]] = {}
PACKAGE = str(Path(bnb.__file__).resolve().parent)
FLOATS = ("float32", "float16", "bfloat16")


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def run(name: str, params: Dict[str, Any]) -> Outcome:
    try:
        return CASES[name](**params)
    except Raised as r:  # a valid input raised: wrong, whatever the message
        return "wrong", f"valid input raised {r.describe()}"
    except Exception as e:  # noqa: BLE001  (the case itself failed: reported as wrong so it is looked at)
        return "wrong", f"case {name} failed: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"


# ---------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------
SPECIALS = ("none", "nan", "inf", "-inf", "subnormal", "zero", "negzero", "huge", "tiny_block", "mixed")


def values(shape, seed: int, special: str = "none", scale: float = 1.0) -> np.ndarray:
    """float32 values of ``shape``: normal(0, scale) with a pattern of special values."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    flat = x.reshape(-1)
    if flat.size == 0 or special == "none":
        return x
    pick = rng.integers(0, flat.size, size=max(1, flat.size // 7))
    if special == "nan":
        flat[pick] = np.nan
    elif special == "inf":
        flat[pick] = np.inf
    elif special == "-inf":
        flat[pick] = -np.inf
    elif special == "subnormal":
        flat[pick] = np.float32(1e-40) * rng.standard_normal(pick.size).astype(np.float32)
    elif special == "zero":
        flat[:] = 0.0
    elif special == "negzero":
        flat[pick] = -0.0
    elif special == "huge":
        flat[pick] = np.float32(3e38) * np.sign(rng.standard_normal(pick.size)).astype(np.float32)
    elif special == "tiny_block":  # a whole array of subnormals next to zeros: 1/absmax overflows
        flat[:] = (rng.standard_normal(flat.size) * 1e-41).astype(np.float32)
        flat[::3] = 0.0
    elif special == "mixed":
        flat[pick[::3]] = np.nan
        flat[pick[1::3]] = np.inf
        flat[pick[2::3]] = -0.0
    return x


def ms_dtype(name: str):
    return getattr(ms, name)


def tensor(x: np.ndarray, dtype: str, view: str = "none"):
    """(ms.Tensor of ``x`` in ``dtype`` seen through ``view``, the float32 values it holds as a contiguous
    numpy array). Views: none, T (last two axes swapped), step (every other element of the last axis), offset
    (the last axis from its second element)."""
    if dtype in FLOATS:
        t = ms.Tensor(x).astype(ms_dtype(dtype))
    else:
        t = ms.Tensor(x.astype(np.float64)).astype(ms_dtype(dtype))
    if view == "T" and t.ndim >= 2:
        t = t.swapaxes(-1, -2)
    elif view == "step" and t.ndim >= 1:
        t = t[..., ::2]
    elif view == "offset" and t.ndim >= 1:
        t = t[..., 1:]
    vals = t.astype(ms.float32).asnumpy() if dtype in FLOATS else t.asnumpy()
    return t, np.array(vals, order="C", copy=True)  # (ascontiguousarray would make a 0-d array 1-d)


def viewed_shape(shape, view: str):
    shape = tuple(shape)
    if view == "T" and len(shape) >= 2:
        return shape[:-2] + (shape[-1], shape[-2])
    if view == "step" and shape:
        return shape[:-1] + ((shape[-1] + 1) // 2,)
    if view == "offset" and shape:
        return shape[:-1] + (max(0, shape[-1] - 1),)
    return shape


def to_np(t) -> np.ndarray:
    return t.astype(ms.float32).asnumpy() if t.dtype == ms.bfloat16 else t.asnumpy()


def blocksize_arg(kind: str, value: int):
    return {"int": value, "float": float(value), "bool": True, "str": str(value), "none": None}[kind]


# ---------------------------------------------------------------------------------------------
# functional: blockwise 8-bit
# ---------------------------------------------------------------------------------------------
@case
def blockwise(shape, dtype, view, blocksize, bs_kind, special, seed, nested, code_len, code_dtype):
    x = values(shape, seed, special)
    t, xv = tensor(x, dtype, view)
    bs = blocksize_arg(bs_kind, blocksize)
    code_np = F.create_dynamic_map().asnumpy()
    if code_len != 256:
        code_np = np.resize(code_np, code_len)
    code = ms.Tensor(code_np).astype(ms_dtype(code_dtype))
    problems = []
    if dtype not in FLOATS:
        problems.append(f"A of dtype {dtype}")
    if bs_kind != "int" or blocksize not in F.BLOCKWISE_BLOCKSIZES:
        problems.append(f"blocksize {bs!r}")
    if code_len != 256 or code_dtype != "float32":
        problems.append(f"a code of {code_len} {code_dtype}")
    res = call(lambda: F.quantize_blockwise(t, code=code, blocksize=bs, nested=nested))
    if problems:
        return expect_error(res, ", ".join(problems))
    q, state = must(res)
    rq, ra = R.quantize_blockwise(xv, code_np, blocksize)
    back = must(call(lambda: F.dequantize_blockwise(q, state)))
    if nested:
        amax = R.dequantize_blockwise(to_np(state.absmax), to_np(state.state2.absmax), code_np, blocksize) \
            + np.float32(state.offset.asnumpy())
        want_back = R.dequantize_blockwise(rq, amax.astype(np.float32), code_np, blocksize, dtype)
        got_amax = None
    else:
        want_back = R.dequantize_blockwise(rq, ra, code_np, blocksize, dtype)
        got_amax = differ(to_np(state.absmax), ra, "absmax")
    # the documented bound, straight from numpy: within half the code's largest gap of each block's absmax
    bound = None
    finite = np.isfinite(xv)
    if not nested and xv.size and finite.all():
        err = np.abs(to_np(back).astype(np.float64) - xv)
        lim = 0.5 * np.max(np.diff(code_np)) * np.repeat(ra, blocksize)[: xv.size].reshape(xv.shape) * 1.01
        tol16 = np.abs(xv) * (2.0**-8 if dtype == "bfloat16" else 2.0**-11 if dtype == "float16" else 0) + 1.5e-45
        if not (err <= lim + tol16).all():
            i = np.argmax(err - lim - tol16)
            bound = f"round trip error {err.reshape(-1)[i]!r} above the bound at {i} (x {xv.reshape(-1)[i]!r})"
    return outcome(differ(q.asnumpy(), rq, "codes"), got_amax, differ(to_np(back), to_np_dt(want_back), "dequantized"),
                   f"dequantized dtype {back.dtype}" if back.dtype != ms_dtype(dtype) else None, bound,
                   f"codes shape {tuple(q.shape)}" if tuple(q.shape) != tuple(t.shape) else None)


def to_np_dt(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype != np.float32 else a


@case
def dequantize_blockwise_args(n, blocksize, absmax_len, absmax_dtype, a_dtype, out_shape, seed):
    """dequantize_blockwise with an explicit absmax (no quant_state) and possibly wrong sizes."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 256, n).astype(np.uint8)
    amax = (np.abs(rng.standard_normal(absmax_len)) + 0.1).astype(np.float32)
    A = ms.Tensor(q) if a_dtype == "uint8" else ms.Tensor(q.astype(np.int32)).astype(ms_dtype(a_dtype))
    out = None if out_shape is None else ms.Tensor(np.zeros(out_shape, np.float32))
    res = call(lambda: F.dequantize_blockwise(A, absmax=ms.Tensor(amax).astype(ms_dtype(absmax_dtype)),
                                              blocksize=blocksize, out=out))
    nb = -(-n // blocksize) if blocksize else 0
    problems = []
    if a_dtype != "uint8":
        problems.append(f"A of dtype {a_dtype}")
    if blocksize not in F.BLOCKWISE_BLOCKSIZES:
        problems.append(f"blocksize {blocksize}")
    elif absmax_len != nb:
        problems.append(f"{absmax_len} absmax for {nb} blocks")
    if absmax_dtype != "float32":
        problems.append(f"absmax of dtype {absmax_dtype}")
    if out_shape is not None and tuple(out_shape) != (n,):
        problems.append(f"out of shape {out_shape}")
    if problems:
        return expect_error(res, ", ".join(problems))
    got = must(res)
    want = R.dequantize_blockwise(q, amax, F.create_dynamic_map().asnumpy(), blocksize)
    return outcome(differ(got.asnumpy(), want, "dequantized"))


# ---------------------------------------------------------------------------------------------
# functional: 4-bit
# ---------------------------------------------------------------------------------------------
@case
def fourbit(shape, dtype, view, blocksize, quant_type, compress, storage, special, seed):
    x = values(shape, seed, special)
    t, xv = tensor(x, dtype, view)
    n = xv.size
    item = {"uint8": 1, "int8": 1, "float16": 2, "bfloat16": 2, "int16": 2, "float32": 4, "int32": 4}.get(storage, 1)
    problems = []
    if dtype not in FLOATS:
        problems.append(f"A of dtype {dtype}")
    if blocksize not in F.FOURBIT_BLOCKSIZES:
        problems.append(f"blocksize {blocksize}")
    if quant_type not in ("nf4", "fp4"):
        problems.append(f"quant_type {quant_type!r}")
    if storage not in {F.dtype_name(d) for d in F.FOURBIT_STORAGE}:
        problems.append(f"quant_storage {storage}")
    elif ((n + 1) // 2) % item:
        problems.append(f"{(n + 1) // 2} bytes as {storage}")
    res = call(lambda: F.quantize_4bit(t, blocksize=blocksize, compress_statistics=compress, quant_type=quant_type,
                                       quant_storage=ms_dtype(storage)))
    if problems:
        return expect_error(res, ", ".join(problems))
    packed, qs = must(res)
    code = F.get_4bit_type(quant_type).asnumpy()
    rp, ra = R.quantize_4bit(xv, code, blocksize)
    raw = F._as_uint8(packed).asnumpy().reshape(-1, 1)
    back = must(call(lambda: F.dequantize_4bit(packed, qs)))
    amax = to_np(F._absmax_4bit(qs)) if n else np.zeros(0, np.float32)
    want_back = R.dequantize_4bit(rp, amax, code, blocksize, n, dtype, fp4=quant_type == "fp4").reshape(xv.shape)
    bound = None
    if n and np.isfinite(xv).all() and not compress:
        srt = np.sort(code)
        err = np.abs(to_np(back).astype(np.float64) - xv)
        lim = 0.5 * np.max(np.diff(srt)) * np.repeat(ra, blocksize)[:n].reshape(xv.shape) * 1.01
        tol = np.abs(xv) * (2.0**-8 if dtype == "bfloat16" else 2.0**-11 if dtype == "float16" else 0) + 1e-37
        if not (err <= lim + tol).all():
            i = int(np.argmax(err - lim - tol))
            bound = f"round trip error {err.reshape(-1)[i]!r} above the bound at {i} (x {xv.reshape(-1)[i]!r})"
    return outcome(differ(raw, rp, "packed bytes"), None if compress else differ(amax, ra, "absmax"),
                   differ(to_np(back), to_np_dt(want_back), "dequantized"), bound,
                   f"dequantized shape {tuple(back.shape)}" if tuple(back.shape) != tuple(t.shape) else None)


@case
def gemv4(N, K, rows, dtype, blocksize, quant_type, compress, k_delta, code_len, absmax_dtype, seed, fn):
    """gemv_4bit / linear_4bit / matmul_4bit on a quantized [N, K] weight; an activation of K + k_delta
    features, or a quant_state whose code or absmax was replaced, must be refused."""
    k_delta = max(k_delta, -K)
    W = values((N, K), seed, "none", 0.1)
    wt = ms.Tensor(W).astype(ms_dtype(dtype))
    packed, qs = F.quantize_4bit(wt, blocksize=blocksize, compress_statistics=compress, quant_type=quant_type)
    problems = []
    if code_len != 16:
        qs.code = ms.Tensor(np.resize(qs.code.asnumpy(), code_len))
        problems.append(f"a quant_state code of {code_len} entries")
    if absmax_dtype != "float32" and not compress:
        qs.absmax = qs.absmax.astype(ms_dtype(absmax_dtype))
        problems.append(f"absmax of dtype {absmax_dtype}")
    if k_delta:
        problems.append(f"{K + k_delta} features for K = {K}")
    A = values((rows, K + k_delta), seed + 1)
    at = ms.Tensor(A).astype(ms_dtype(dtype))
    if fn == "gemv_4bit":
        res = call(lambda: F.gemv_4bit(at, packed.t(), state=qs))
    elif fn == "linear_4bit":
        res = call(lambda: F.linear_4bit(at, packed, qs))
    else:
        res = call(lambda: bnb.matmul_4bit(torch.tensor(at.asnumpy() if dtype != "bfloat16" else A).to(
            getattr(torch, dtype)), packed.t(), quant_state=qs))
    if problems:
        return expect_error(res, ", ".join(problems))
    got = must(res)
    code = F.get_4bit_type(quant_type).asnumpy()
    Wd = R.dequantize_4bit(F._as_uint8(packed).asnumpy(), to_np(F._absmax_4bit(qs)), code, blocksize, N * K,
                           fp4=quant_type == "fp4").reshape(N, K).astype(np.float64)
    a64 = at.astype(ms.float32).asnumpy().astype(np.float64)
    ref = a64 @ Wd.T
    scale = np.abs(a64) @ np.abs(Wd).T
    ulp = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    # fp32 accumulation, and where a path dequantizes the weight to the compute dtype first, its rounding
    w_round = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    tol = (1e-5 + w_round) * scale + 2 * ulp * np.abs(ref) + 1e-30
    return outcome(_within(to_np(got), ref, tol, fn, scale),
                   f"{fn} dtype {got.dtype}" if got.dtype != ms_dtype(dtype) else None)


def _within(got, ref, tol, what, scale=None):
    """None if ``got`` is within ``tol`` of the float64 ``ref``, else why not. Equal non-finite values match; an
    inf or NaN where the terms' magnitudes ``scale`` exceed FLT_MAX is a legitimate fp32 overflow of a partial
    sum (as in any fp32 matmul)."""
    got = np.asarray(got, np.float64)
    if got.shape != ref.shape:
        return f"{what}: shape {got.shape}, expected {ref.shape}"
    with np.errstate(invalid="ignore"):
        bad = ~((np.abs(got - ref) <= tol) | (got == ref) | (np.isnan(got) & np.isnan(ref)))
        if scale is not None:
            bad &= ~(~np.isfinite(got) & (np.asarray(scale) > 3.4e38))  # inf, or inf - inf = NaN
    if not bad.any():
        return None
    i = tuple(int(v) for v in np.argwhere(bad)[0])
    return f"{what}: {int(bad.sum())} of {bad.size} outside the fp32 bound, first {i}: {got[i]!r} vs {ref[i]!r}"


# ---------------------------------------------------------------------------------------------
# functional: LLM.int8()
# ---------------------------------------------------------------------------------------------
@case
def int8_quant(shape, dtype, threshold, special, seed, view):
    x = values(shape, seed, special, 3.0)
    t, xv = tensor(x, dtype, view)
    problems = []
    if dtype not in FLOATS:
        problems.append(f"A of dtype {dtype}")
    if not len(shape):
        problems.append("a 0-d A")
    if isinstance(threshold, float) and (threshold < 0 or math.isnan(threshold)):
        problems.append(f"threshold {threshold}")
    res = call(lambda: F.int8_vectorwise_quant(t, threshold=threshold))
    if problems:
        return expect_error(res, ", ".join(problems))
    CA, SCA, cols = must(res)
    rq, rs, rf = R.int8_vector_quant(xv, threshold, dtype)
    want_cols = np.nonzero(rf)[0]
    return outcome(differ(CA.asnumpy(), rq, "codes"), differ(SCA.asnumpy().reshape(-1), rs, "row stats"),
                   None if threshold == 0.0 else differ(cols.asnumpy(), want_cols, "outlier columns"))


@case
def int8_matmul(M, K, N, a_dtype, b_dtype, k_delta, seed, lead):
    rng = np.random.default_rng(seed)
    A = rng.integers(-128, 128, tuple(lead) + (M, K), dtype=np.int8)
    B = rng.integers(-128, 128, (N, K + k_delta), dtype=np.int8)
    At = ms.Tensor(A) if a_dtype == "int8" else ms.Tensor(A.astype(np.float32)).astype(ms_dtype(a_dtype))
    Bt = ms.Tensor(B) if b_dtype == "int8" else ms.Tensor(B.astype(np.float32)).astype(ms_dtype(b_dtype))
    problems = []
    if a_dtype != "int8":
        problems.append(f"A of dtype {a_dtype}")
    if b_dtype != "int8":
        problems.append(f"B of dtype {b_dtype}")
    if k_delta:
        problems.append(f"B with {K + k_delta} columns for K = {K}")
    res = call(lambda: F.int8_linear_matmul(At, Bt))
    if problems:
        return expect_error(res, ", ".join(problems))
    got = must(res).asnumpy()
    exact = A.astype(np.int64) @ B.astype(np.int64).T
    return outcome(differ(got.astype(np.int64), ((exact + 2**31) % 2**32) - 2**31, "int32 product"),
                   f"dtype {got.dtype}" if got.dtype != np.int32 else None)


@case
def int8_linear(rows, K, N, dtype, threshold, bias, special, seed):
    """F.int8_linear (the Linear8bitLt inference forward) against the reference's composition."""
    W = values((N, K), seed, "none", 0.1)
    CB, SCB, _ = F.int8_vectorwise_quant(ms.Tensor(W))
    A = values((rows, K), seed + 1, special, 2.0)
    at = ms.Tensor(A).astype(ms_dtype(dtype))
    b = None if bias is None else ms.Tensor(values((N,), seed + 2)).astype(ms_dtype(bias))
    res = call(lambda: F.int8_linear(at, CB, SCB, b, threshold))
    got, cols = must(res)
    av = at.astype(ms.float32).asnumpy()
    want, flags = R.int8_linear(av, CB.asnumpy(), SCB.asnumpy(),
                                None if b is None else b.astype(ms.float32).asnumpy(), threshold, dtype)
    return outcome(differ(to_np(got), to_np_dt(np.asarray(want)), "int8_linear"))


# ---------------------------------------------------------------------------------------------
# functional: weight-only
# ---------------------------------------------------------------------------------------------
@case
def weight_only(N, K, bits, dtype, special, seed, rows, k_delta, in_features):
    k_delta = max(k_delta, -K)
    W = values((N, K), seed, special)
    wt = ms.Tensor(W).astype(ms_dtype(dtype)) if dtype in FLOATS else ms.Tensor(W.astype(np.int32))
    problems = []
    if bits not in (8, 4):
        problems.append(f"bits {bits!r}")
    if dtype not in FLOATS:
        problems.append(f"W of dtype {dtype}")
    res = call(lambda: F.quantize_weight_only(wt, bits))
    if problems:
        return expect_error(res, ", ".join(problems))
    q, s = must(res)
    wv = wt.astype(ms.float32).asnumpy()
    rq, rs = R.quantize_weight_only(wv, bits)
    d = must(call(lambda: F.dequantize_weight_only(q, s, K, bits)))
    A = values((rows, K + k_delta), seed + 1)
    at = ms.Tensor(A).astype(ms_dtype(dtype))
    gres = call(lambda: F.gemm_weight_only(at, q, s, bits, in_features=K if in_features else None))
    ambiguous = bits == 4 and k_delta and (K + k_delta + 1) // 2 == (K + 1) // 2 and not in_features
    if k_delta and not ambiguous:
        g = expect_error(gres, f"{K + k_delta} features for K = {K}")
    elif ambiguous:  # q cannot tell K from K +- 1 without in_features: the kernel takes the activation's K
        g = ("ok", "") if not isinstance(gres, Raised) else ("wrong", f"raised {gres.describe()}")
    else:
        got = to_np(must(gres)).astype(np.float64)
        ref = R.gemm_weight_only(at.astype(ms.float32).asnumpy(), rq, rs, bits).astype(np.float64)
        Wd = R.dequantize_weight_only(rq, rs, K, bits).astype(np.float64)
        scale = np.abs(at.astype(ms.float32).asnumpy().astype(np.float64)) @ np.abs(Wd).T
        ulp = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
        g = outcome(_within(got, ref, 1e-5 * scale + 2 * ulp * np.abs(ref) + 1e-30, "gemm_weight_only", scale))
    return outcome(differ(q.asnumpy(), rq, "codes"), differ(s.asnumpy(), rs, "scales"),
                   differ(d.asnumpy(), R.dequantize_weight_only(rq, rs, K, bits), "dequantized"),
                   g[1] if g[0] == "wrong" else None)


# ---------------------------------------------------------------------------------------------
# functional: optimizers
# ---------------------------------------------------------------------------------------------
_NAMES_32 = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")


@case
def optim32(name, dtype, n, g_delta, s1_dtype, step, special, seed, lr, max_unorm, view):
    rng = np.random.default_rng(seed)
    p = values((n,), seed, "none")
    g_delta = max(g_delta, -n)
    g = values((n + g_delta,), seed + 1, special)
    two = name in ("adam", "ademamix", "lamb")
    mult = 2 if name == "ademamix" else 1
    s1 = (np.abs(rng.standard_normal(mult * n)) * 0.1).astype(np.float32)
    s2 = (np.abs(rng.standard_normal(n)) * 0.1).astype(np.float32) if two else None
    def as_dtype(a):
        return ms.Tensor(a.astype(np.float64)).astype(ms_dtype(dtype))

    if view == "step":  # the parameter is every other element of a longer buffer
        base = ms.Parameter(as_dtype(np.repeat(p, 2)))
        P = base[::2]
    else:
        P = ms.Parameter(as_dtype(p))
    G = as_dtype(g)
    S1 = ms.Tensor(s1).astype(ms_dtype(s1_dtype))
    S2 = None if s2 is None else ms.Tensor(s2)
    un = ms.Tensor(np.zeros(1, np.float32)) if max_unorm else None
    problems = []
    if name not in _NAMES_32:
        problems.append(f"optimizer {name!r}")
    if dtype not in FLOATS:
        problems.append(f"p of dtype {dtype}")
    if g_delta:
        problems.append(f"g of {n + g_delta} elements for {n}")
    if s1_dtype != "float32":
        problems.append(f"state1 of dtype {s1_dtype}")
    if step < 1:
        problems.append(f"step {step}")
    beta1, beta2, eps, wd = 0.9, 0.999, 1e-8, 0.01
    res = call(lambda: F.optimizer_update_32bit(name, G, P, S1, beta1, eps, step, lr, S2, beta2, 0.5, 2.0, wd,
                                                1.0, un, max_unorm))
    if problems:
        return expect_error(res, ", ".join(problems))
    must(res)
    pv = ms.Tensor(p).astype(ms_dtype(dtype)).astype(ms.float32).asnumpy()
    gv = G.astype(ms.float32).asnumpy()
    rp, rs1, rs2, _ = R.optimizer_update_32bit(name, gv, pv, s1.reshape(mult, n) if mult == 2 else s1, s2, beta1,
                                               beta2, 0.5, 2.0, eps, wd, step, lr, 1.0, max_unorm, p_dtype=dtype)
    rs1 = np.asarray(rs1).reshape(-1)
    gotp = to_np(P) if view != "step" else to_np(base)[::2]
    tol = dict(rtol=1e-6, atol=1e-7) if max_unorm else {}
    return outcome(differ(gotp.astype(np.float32), np.asarray(rp).astype(np.float32), "p", **tol),
                   differ(S1.asnumpy(), rs1, "state1", **tol),
                   None if s2 is None else differ(S2.asnumpy(), rs2, "state2", **tol))


@case
def optim8(name, dtype, n, special, seed, step, lr, absmax_delta):
    rng = np.random.default_rng(seed)
    p = values((n,), seed)
    g = values((n,), seed + 1, special)
    two = name in ("adam", "ademamix", "lamb")
    mult = 2 if name == "ademamix" else 1
    nb = -(-n // 256)
    q1 = F.create_dynamic_map(signed=True)
    q2 = F.create_dynamic_map(signed=False)
    s1 = rng.integers(0, 256, mult * n).astype(np.uint8)
    s2 = rng.integers(0, 256, n).astype(np.uint8) if two else None
    a1 = (np.abs(rng.standard_normal(mult * nb + absmax_delta)) * 0.01).astype(np.float32)
    a2 = (np.abs(rng.standard_normal(nb)) * 0.01).astype(np.float32) if two else None
    P = ms.Parameter(ms.Tensor(p).astype(ms_dtype(dtype)))
    G = ms.Tensor(g).astype(ms_dtype(dtype))
    S1 = ms.Tensor(s1.reshape((2, n)) if mult == 2 else s1)
    S2 = None if s2 is None else ms.Tensor(s2)
    A1 = ms.Tensor(a1.reshape(2, nb) if mult == 2 and not absmax_delta else a1)
    A2 = None if a2 is None else ms.Tensor(a2)
    res = call(lambda: F.optimizer_update_8bit_blockwise(name, G, P, S1, S2, 0.9, 0.999, 0.5, 2.0, 1e-8, step, lr,
                                                         q1, q2 if two else None, A1, A2, 0.01, 1.0))
    if absmax_delta:
        return expect_error(res, f"absmax1 of {mult * nb + absmax_delta} values for {mult * nb} blocks")
    must(res)
    pv = ms.Tensor(p).astype(ms_dtype(dtype)).astype(ms.float32).asnumpy()
    rp, rq1, rq2, ra1, ra2 = R.optimizer_update_8bit_blockwise(
        name, G.astype(ms.float32).asnumpy(), pv, s1.reshape(S1.shape), s2, 0.9, 0.999, 0.5, 2.0, 1e-8, step, lr,
        q1.asnumpy(), q2.asnumpy() if two else None, a1.reshape(A1.shape), a2, 0.01, 1.0, p_dtype=dtype)
    got = to_np(P).astype(np.float32)
    swallowed = np.isnan(G.astype(ms.float32).asnumpy()) & np.isfinite(got)  # issue 34: never a finite update
    return outcome("p finite where the gradient is NaN" if swallowed.any() else None,
                   differ(got, np.asarray(rp).astype(np.float32), "p"),
                   differ(S1.asnumpy(), rq1, "state1"), differ(A1.asnumpy(), ra1, "absmax1"),
                   None if s2 is None else differ(S2.asnumpy(), rq2, "state2"))


# ---------------------------------------------------------------------------------------------
# QuantState.from_dict / optimizer state dicts
# ---------------------------------------------------------------------------------------------
@case
def quant_state_dict(packed, nested, drop, corrupt, seed):
    W = values((16, 64), seed)
    _, qs = F.quantize_4bit(ms.Tensor(W), quant_type="nf4", compress_statistics=nested)
    d = qs.as_dict(packed=packed)
    what = []
    from bitsandbytes_ms.utils import pack_dict_to_tensor, unpack_tensor_to_dict

    inner_key = "quant_state.bitsandbytes__nf4"
    inner = unpack_tensor_to_dict(d[inner_key]) if packed else d
    for k in drop:
        for where in (d, inner):
            if k in where:
                where.pop(k)
                what.append(f"no {k!r}")
    if corrupt == "dtype":
        inner["dtype"] = "float31"
        what.append("dtype 'float31'")
    elif corrupt == "blocksize":
        inner["blocksize"] = "sixty-four"
        what.append("blocksize 'sixty-four'")
    elif corrupt == "unknown_key":
        d["weight.spare"] = ms.Tensor(np.zeros(1, np.float32))
        what.append("an unknown key")
    elif corrupt == "two_packed":
        d["quant_state.bitsandbytes__fp4"] = d.get(inner_key, pack_dict_to_tensor({"a": 1}))
        what.append("two packed entries")
    if packed and inner_key in d:
        d[inner_key] = pack_dict_to_tensor(inner)
    res = call(lambda: F.QuantState.from_dict(d))
    if what:
        return expect_error(res, ", ".join(what))
    got = must(res)
    return outcome(None if got == qs else "rebuilt state differs")


_OPTIMS = ("Adam", "AdamW", "Adam8bit", "AdamW8bit", "SGD", "SGD8bit", "Lion", "Lion8bit", "RMSprop8bit",
           "Adagrad8bit", "LAMB", "LARS", "AdEMAMix8bit", "PagedAdamW8bit")


def _optimizer(name, params, **kw):
    cls = getattr(bnb.optim, name)
    if name.startswith(("SGD", "LARS")):
        kw.setdefault("momentum", 0.9)
        kw.setdefault("lr", 0.01)
    return cls(params, **kw)


@case
def optim_args(name, arg, value):
    """An optimizer constructor with one hyper-parameter out of its range (torch's and upstream's checks)."""
    p = ms.Parameter(ms.Tensor(np.ones((64, 64), np.float32)), name="w")
    res = call(lambda: _optimizer(name, [p], **{arg: value}))
    bad = {
        "lr": lambda v: not isinstance(v, (int, float)) or v < 0 or v != v,
        "eps": lambda v: not isinstance(v, (int, float)) or v < 0 or v != v,
        "weight_decay": lambda v: not isinstance(v, (int, float)) or v < 0 or v != v,
        # upstream checks every beta's range and reads the first 2 (AdEMAMix: 3); more are ignored
        "betas": lambda v: (not isinstance(v, tuple) or len(v) < (3 if name.startswith("AdEMAMix") else 2)
                            or any(not 0.0 <= b < 1.0 for b in v)),
    }[arg](value)
    if name.startswith(("SGD", "LARS", "RMSprop", "Adagrad")) and arg == "betas":
        return expect_error(res, "betas for an optimizer without them")
    if bad:
        return expect_error(res, f"{arg}={value!r}")
    must(res)
    return "ok", ""


@case
def optim_load(name, corrupt, seed):
    """load_state_dict of a corrupted state dict: a clear error naming what is missing or wrong."""
    rng = np.random.default_rng(seed)
    p = ms.Parameter(ms.Tensor(rng.standard_normal((64, 64)).astype(np.float32)), name="w")
    opt = _optimizer(name, [p])
    opt.step(grads=[ms.Tensor(rng.standard_normal((64, 64)).astype(np.float32))])
    sd = opt.state_dict()
    what = None
    if corrupt == "no_state":
        sd.pop("state")
        what = "no 'state'"
    elif corrupt == "no_param_groups":
        sd.pop("param_groups")
        what = "no 'param_groups'"
    elif corrupt == "no_params":
        sd["param_groups"][0].pop("params")
        what = "a group without 'params'"
    elif corrupt == "group_count":
        sd["param_groups"].append(dict(sd["param_groups"][0]))
        what = "two groups for one"
    elif corrupt == "param_count":
        sd["param_groups"][0]["params"] = list(sd["param_groups"][0]["params"]) + [99]
        what = "two params for one"
    elif corrupt == "state_shape":
        st = next(iter(sd["state"].values()))
        k = next(k for k, v in st.items() if hasattr(v, "shape") and len(v.shape) >= 1 and v.shape[0] > 1)
        st[k] = st[k][:1]
        what = f"state {k!r} of another shape"
    elif corrupt == "other_optimizer":
        other = "SGD" if name != "SGD" else "Adam"
        q = ms.Parameter(ms.Tensor(np.ones((64, 64), np.float32)), name="w2")
        o2 = _optimizer(other, [q])
        o2.step(grads=[ms.Tensor(np.ones((64, 64), np.float32))])
        sd = o2.state_dict()
        what = f"a state dict of {other}"
    elif corrupt == "not_a_dict":
        sd = [1, 2, 3]
        what = "a list"
    res = call(lambda: opt.load_state_dict(sd))
    if what is None:
        must(res)
        return "ok", ""
    if corrupt == "other_optimizer" and not isinstance(res, Raised):
        # torch and upstream accept another optimizer's dict when its keys fit; check the state survived
        return "ok", ""
    return expect_error(res, what)


# ---------------------------------------------------------------------------------------------
# nn
# ---------------------------------------------------------------------------------------------
_LAYERS: Dict[Tuple, Any] = {}


def _layer(kind, in_f, out_f, bias, seed):
    key = (kind, in_f, out_f, bias, seed)
    if key not in _LAYERS:
        torch.manual_seed(seed)
        np.random.seed(seed)
        if kind == "Linear4bit":
            m = bnb.nn.Linear4bit(in_f, out_f, bias=bias, quant_type="nf4").to("cpu")
        elif kind == "Linear4bit_fp4_dq":
            m = bnb.nn.Linear4bit(in_f, out_f, bias=bias, quant_type="fp4", compress_statistics=True).to("cpu")
        elif kind == "Linear8bitLt":
            m = bnb.nn.Linear8bitLt(in_f, out_f, bias=bias, has_fp16_weights=False, threshold=6.0).to("cpu")
        elif kind == "LinearWeightOnly8":
            m = bnb.nn.LinearWeightOnly(in_f, out_f, bias=bias, bits=8).to("cpu")
        elif kind == "LinearWeightOnly4":
            m = bnb.nn.LinearWeightOnly(in_f, out_f, bias=bias, bits=4).to("cpu")
        else:
            m = bnb.nn.LinearFP.from_linear(torch.nn.Linear(in_f, out_f, bias=bias))
        _LAYERS[key] = m
    return _LAYERS[key]


def _weight_of(kind, m):
    """The float64 [out, in] weight the layer computes with."""
    if kind.startswith("Linear4bit"):
        return F.dequantize_4bit(m.weight.data, m.weight.quant_state).astype(ms.float32).asnumpy().astype(np.float64)
    if kind == "Linear8bitLt":
        CB, SCB = m.weight.data, m.weight.SCB
        return CB.asnumpy().astype(np.float64) * SCB.asnumpy()[:, None].astype(np.float64) / 127.0
    if kind.startswith("LinearWeightOnly"):
        return F.dequantize_weight_only(m.weight.data, m.weight_scale, m.in_features, m.bits).asnumpy().astype(np.float64)
    return m.weight.asnumpy().astype(np.float64)


@case
def linear_forward(kind, in_f, out_f, bias, lead, features_delta, dtype, special, seed, rank0, train=True):
    m = _layer(kind, in_f, out_f, bias, seed)
    m.train(train)
    shape = tuple(lead) + (in_f + features_delta,)
    x = values(shape, seed + 1, special)
    problems = []
    if rank0:
        xt = torch.tensor(1.5)
        problems.append("a 0-d input")
    elif dtype in FLOATS:
        xt = torch.tensor(x).to(getattr(torch, dtype))
    else:
        xt = torch.tensor(x.astype(np.float64)).to(getattr(torch, dtype))
        problems.append(f"input of dtype {dtype}")
    if features_delta and not rank0:
        problems.append(f"{in_f + features_delta} features for in_features = {in_f}")
    if kind == "LinearFP" and dtype in FLOATS and dtype != "float32":
        problems.append(f"a {dtype} input to a float32 LinearFP")
    res = call(lambda: m(xt))
    if problems:
        return expect_error(res, ", ".join(problems))
    got = must(res)
    if got.dtype != xt.dtype or tuple(got.shape) != tuple(lead) + (out_f,):
        return "wrong", f"output {tuple(got.shape)} {got.dtype} for input {tuple(xt.shape)} {xt.dtype}"
    xv = xt.to(torch.float32).asnumpy().astype(np.float64)
    W = _weight_of(kind, m)
    b = None if m.bias is None else m.bias.to(torch.float32).asnumpy().astype(np.float64)
    g = got.to(torch.float32).asnumpy().astype(np.float64)
    if kind == "Linear8bitLt" and not train:  # inference: int8 activations, the reference forward bit for bit
        # (training mode on CPU runs upstream's MatMul8bitFp: the dequantized weight in floating point)
        want, _ = R.int8_linear(xt.to(torch.float32).asnumpy(), m.weight.data.asnumpy(), m.weight.SCB.asnumpy(),
                                None if b is None else m.bias.asnumpy(), 6.0, dtype)
        return outcome(differ(g.astype(np.float32), to_np_dt(np.asarray(want)), "Linear8bitLt forward"))
    ref = xv @ W.T + (0.0 if b is None else b)
    if not np.isfinite(xv).all():  # non-finite input: those rows are non-finite, the others as usual
        ok_rows = np.isfinite(xv).all(axis=-1)
        fin = np.isfinite(g)
        if not (~fin[~ok_rows]).any(axis=-1).all():
            return "wrong", "a row holding NaN/inf gave a finite output"
        g, ref, xv = g[ok_rows], ref[ok_rows], xv[ok_rows]
    scale = np.abs(xv) @ np.abs(W).T + (0.0 if b is None else np.abs(b))
    ulp = {"float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    lo = 2.0**-7 if dtype == "bfloat16" or kind.startswith("Linear4bit") and dtype != "float32" else 2.0**-10 \
        if dtype == "float16" else 1e-5
    return outcome(_within(g, ref, lo * scale + 2 * ulp * np.abs(ref) + 1e-30, f"{kind} forward", scale))


_EMB: Dict[Tuple, Any] = {}


@case
def embedding(kind, num, dim, idx_shape, idx_dtype, bad, seed):
    key = (kind, num, dim)
    if key not in _EMB:
        torch.manual_seed(0)
        np.random.seed(0)
        e = getattr(bnb.nn, kind)(num, dim)
        _EMB[key] = e if kind == "Embedding" else e.to("cpu")
        _EMB[key + ("table",)] = np.stack([_EMB[key](torch.tensor([i])).to(torch.float32).asnumpy()[0]
                                           for i in range(num)])
    e, table = _EMB[key], _EMB[key + ("table",)]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, num, idx_shape)
    problems = []
    if bad and idx.size:
        flat = idx.reshape(-1)
        flat[rng.integers(0, flat.size)] = {"neg": -1, "past": num, "far": 10**6, "min": -num}[bad]
        problems.append(f"index {bad}")
    if idx_dtype not in ("int32", "int64"):
        problems.append(f"indices of dtype {idx_dtype}")
    it = torch.tensor(idx).to(getattr(torch, idx_dtype))
    res = call(lambda: e(it))
    if problems:
        return expect_error(res, ", ".join(problems))
    got = must(res)
    return outcome(differ(got.to(torch.float32).asnumpy(), table[idx].reshape(tuple(idx_shape) + (dim,)), kind))


# ---------------------------------------------------------------------------------------------
# raw lib calls (the op table through MindSpore) and the C ABI (ctypes, guard pages)
# ---------------------------------------------------------------------------------------------
def _status_diff():
    import importlib.util
    import sys

    if "bnb_ms_status_diff" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bnb_ms_status_diff", Path(PACKAGE).parent / "tools" /
                                                      "status_diff.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    return sys.modules["bnb_ms_status_diff"]


_TEMPLATES = None


def templates():
    global _TEMPLATES
    if _TEMPLATES is None:
        _TEMPLATES = list(_status_diff().templates())
    return _TEMPLATES


def _np_dtype(name):
    return {"bfloat16": np.float32}.get(name, _status_diff().DT.get(name, np.float32))


@case
def lib_call(template, mutation, seed):
    """One row of the op table through ``lib.<name>`` (ops.Custom) with the inputs of a status_diff template,
    one of them changed: the entry point must refuse a malformed call with an error naming the op and what is
    wrong, or compute a well-formed one."""
    sd = _status_diff()
    name, args = templates()[template]
    muts = [("ok", lambda a: a)] + sd.single_mutations(args)
    label, mut = muts[mutation % len(muts)]
    if " null" in label or label in ("drop last", "extra"):
        label, mut = "ok", (lambda a: a)  # ops.Custom has no null pointers or other arity: the C ABI case does that
    try:
        a = mut(list(args))
    except Exception:  # noqa: BLE001  (a mutation that does not apply to this template)
        return "ok", "n/a"
    op = cextension._native_table.OPS[name]
    inputs = a[: len(op.inputs)]
    rng = np.random.default_rng(seed)
    vals = []
    for p in inputs:
        if p is None:
            vals.append(None)
        elif p.value is not None and not p.shape:
            vals.append(p.value if not isinstance(p.value, float) or p.dtype != "int64" else p.value)
        else:
            buf = sd.fill(p, rng, 4 * max(1, sd.numel(p.shape)) * 8 + 64)
            dt = p.dtype if p.dtype in sd.DT else "float32"
            n = sd.numel(p.shape)
            arr = np.frombuffer(buf.tobytes(), dtype=np.dtype(sd.DT[dt]))[:n].reshape(p.shape).copy()
            t = ms.Tensor(arr)
            if p.dtype == "bfloat16":
                t = ms.Tensor(arr.view(np.uint16).astype(np.float32)).astype(ms.bfloat16)
            vals.append(t)
    res = call(lambda: getattr(cextension.lib, name)(*vals))
    if label == "ok":
        edge = any(p is not None and p.value is None and (0 in p.shape or 131072 in p.shape) for p in a)
        if isinstance(res, Raised):
            # status_diff's calls with an empty dimension follow the C ABI's row count (numel / K, 0 for K = 0),
            # which the table's output shapes need not, and K = 131072 is one past the int8 GEMM's exact range:
            # a clear refusal is right there
            if edge and clarity(res.exc)[0]:
                return "clear", res.describe()
            return "wrong", f"{name} well-formed call raised {res.describe()}"
        return "ok", ""
    if isinstance(res, Raised):
        ok, why = clarity(res.exc)
        return ("clear", res.describe()) if ok else ("wrong", f"{name} [{label}]: unclear error ({why}): "
                                                                f"{res.describe()}")
    return "ok", f"accepted [{label}]"  # a change the entry point may take (another valid dtype or value)


@case
def c_abi(template, mutations, seed):
    """The AOT entry point straight through ctypes with one or two of a status_diff template's parameters
    changed, every buffer exactly its declared size and ending at a PROT_NONE guard page, so a read or write
    past a declared size faults (a crash). A nonzero status is the C ABI's clear error (csrc/aot.h); status 0
    means the entry point took the changed call (another valid dtype, value or size) within its buffers."""
    sd = _status_diff()
    name, args = templates()[template]
    muts = sd.single_mutations(args)
    a = list(args)
    labels = []
    try:
        for m in mutations:
            label, f = muts[m % len(muts)]
            a = f(a)
            labels.append(label)
    except Exception:  # noqa: BLE001
        return "ok", "n/a"
    rc = _guarded_call(sd, name, a, seed)
    return ("clear", f"status {rc}") if rc else ("ok", f"status 0 [{' + '.join(labels)}]")


_PAGE = 4096
_libc = None


def _guarded(nbytes: int):
    """(numpy uint8 view of nbytes ending at a PROT_NONE page, keep-alive object)."""
    import ctypes as ct
    import mmap

    global _libc
    if _libc is None:
        _libc = ct.CDLL(None, use_errno=True)
        _libc.mprotect.argtypes = [ct.c_void_p, ct.c_size_t, ct.c_int]
    pages = -(-max(nbytes, 1) // _PAGE)
    mm = mmap.mmap(-1, (pages + 1) * _PAGE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ct.addressof(ct.c_char.from_buffer(mm))
    if _libc.mprotect(base + pages * _PAGE, _PAGE, 0) != 0:
        raise OSError("mprotect failed")
    start = pages * _PAGE - nbytes
    view = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=start)
    return view, mm, base + start


def _guarded_call(sd, name, args, seed) -> int:
    import ctypes as ct

    rng = np.random.default_rng(seed)
    fn = getattr(cextension._dll, name)
    fn.restype, fn.argtypes = ct.c_int, sd.ARGTYPES
    keep, ptrs, shapes, dts = [], [], [], []
    for p in args:
        if p is None:
            ptrs.append(None); shapes.append(()); dts.append("none")  # noqa: E702
            continue
        item = np.dtype(sd.DT.get(p.dtype, np.float64)).itemsize if p.dtype in sd.DT else 8
        nbytes = max(1, sd.numel(p.shape)) * item
        view, mm, addr = _guarded(nbytes)
        view[:] = sd.fill(p, rng, max(nbytes, 16))[:nbytes]  # (fill writes a bf16 scalar as 4 bytes)
        keep.append((view, mm))
        ptrs.append(None if p.null else addr)
        shapes.append(p.shape)
        dts.append(p.dtype)
    arrays, dims = sd.aot_args(ptrs, shapes, dts)
    return fn(*arrays, None, None)


# ---------------------------------------------------------------------------------------------
# the CLI (bnb-ms), in this process: argparse errors and quantize's checks of its inputs
# ---------------------------------------------------------------------------------------------
@case
def cli(argv, setup):
    """``bnb-ms <argv>`` with a bad argument or a bad model: exit code 2 and one line saying what is wrong, no
    traceback (argparse's usage error or the job's ``bnb-ms quantize: error: ...``)."""
    import tempfile

    from bitsandbytes_ms.__main__ import main

    with tempfile.TemporaryDirectory() as tmp:
        argv = [a.replace("{tmp}", tmp) for a in argv]
        _cli_setup(setup, Path(tmp))
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            res = call(lambda: main(argv))
    text = err.getvalue().strip()
    if isinstance(res, Raised) and isinstance(res.exc, SystemExit):
        code = res.exc.code
    elif isinstance(res, Raised):
        return "wrong", f"bnb-ms {argv}: traceback {res.describe()}"
    else:
        code = res
    last = text.splitlines()[-1] if text else ""
    if code == 2 and ("error:" in last) and "Traceback" not in text:
        return "clear", last
    return "wrong", f"bnb-ms {argv} ({setup}): exit {code}, stderr {text[-400:]!r}, stdout {out.getvalue()[-300:]!r}"


def _cli_setup(setup: str, tmp: Path) -> None:
    import json

    if setup == "empty_dir":
        (tmp / "model").mkdir()
    elif setup == "bad_json":
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text("{not json")
    elif setup == "not_causal":
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    elif setup == "no_weights":
        (tmp / "model").mkdir()
        cfg = json.loads((Path(PACKAGE) / "default_model" / "config.json").read_text())
        (tmp / "model" / "config.json").write_text(json.dumps(cfg))
    elif setup == "text_file":
        (tmp / "model.gguf").write_text("not a gguf file")
        (tmp / "eval.txt").write_bytes(b"\xff\xfe\xfa not utf-8")
    elif setup == "file_in_the_way":
        (tmp / "blocker").write_text("x")



# ---------------------------------------------------------------------------------------------
# state across calls (issue 34): one layer called with a sequence of input dtypes
# ---------------------------------------------------------------------------------------------
@case
def linear4bit_dtype_sequence(dtypes, bias_dtype, compute_dtype, rows, seed):
    """Linear4bit called with inputs of the dtypes in turn: every call against the unfused formula from the
    dequantized weight and the bias the layer holds after the call (upstream casts the bias in place)."""
    rng = np.random.default_rng(seed)
    K, N = 64, 24
    m = bnb.nn.LinearNF4(K, N, bias=True, compute_dtype=None if compute_dtype == "none" else ms_dtype(compute_dtype))
    m.weight = bnb.nn.Params4bit(torch.tensor(values((N, K), seed) * 0.1), requires_grad=False, quant_type="nf4")
    m.bias = torch.nn.Parameter(torch.tensor(values((N,), seed + 1)).to(ms_dtype(bias_dtype)), requires_grad=False)
    m = m.to("cpu").eval()
    W = F.dequantize_4bit(m.weight, m.weight.quant_state).asnumpy().astype(np.float64)
    tol = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 6e-2}
    for i, dt in enumerate(dtypes):
        x = ms.Tensor(values((rows, K), seed + 2 + i)).astype(ms_dtype(dt))
        y = must(call(lambda: m(x)))
        cdt = m.compute_dtype or x.dtype
        xr = x.astype(cdt).astype(ms.float32).asnumpy().astype(np.float64)
        b = m.bias.astype(ms.float32).asnumpy().astype(np.float64)
        ref, scale = xr @ W.T + b, np.abs(xr) @ np.abs(W).T + np.abs(b)
        worst = max((tol[d] for d in (dt, str(cdt).split(".")[-1]) if d in tol), default=1e-4)
        err = float(np.max(np.abs(to_np(y).astype(np.float64) - ref) / scale))
        if y.dtype != x.dtype or not err < worst:
            return "wrong", f"call {i} ({dt} input after {dtypes[:i]}): dtype {y.dtype}, relative error {err:.3g}"
    return "ok", ""


# ---------------------------------------------------------------------------------------------
# issue 34 classes, generated: state across calls and weight mutation, out buffers, code-map and optimizer
# arguments, numerics at the edge
# ---------------------------------------------------------------------------------------------
_FOURBIT_KINDS = {"Linear4bit-nf4": ("nf4", False), "Linear4bit-nf4-dq": ("nf4", True),
                  "Linear4bit-fp4": ("fp4", False), "Linear4bit-fp4-dq": ("fp4", True),
                  "LinearNF4": ("nf4", True), "LinearFP4": ("fp4", True)}
_SK, _SN = 64, 24  # the stateful layers' in / out features


def _truth(seed):
    """(float32 weight [N, K], float32 bias [N]) of a weight generation ``seed``."""
    return values((_SN, _SK), seed, "none", 0.1), values((_SN,), seed + 7)


def _build(kind, seed, bias, compute_dtype="none", bias_dtype="float32"):
    """A fresh layer of ``kind`` holding the weights of generation ``seed`` (quantized, on the CPU)."""
    W, b = _truth(seed)
    cdt = None if compute_dtype == "none" else ms_dtype(compute_dtype)
    if kind in _FOURBIT_KINDS:
        qt, dq = _FOURBIT_KINDS[kind]
        if kind in ("LinearNF4", "LinearFP4"):
            m = getattr(bnb.nn, kind)(_SK, _SN, bias=bias, compute_dtype=cdt)
        else:
            m = bnb.nn.Linear4bit(_SK, _SN, bias=bias, compute_dtype=cdt, quant_type=qt, compress_statistics=dq)
        m.weight = bnb.nn.Params4bit(torch.tensor(W), requires_grad=False, quant_type=qt, compress_statistics=dq,
                                     blocksize=64)
    elif kind.startswith("Linear8bitLt"):
        m = bnb.nn.Linear8bitLt(_SK, _SN, bias=bias, has_fp16_weights=False, threshold=float(kind.split("-")[1]))
        m.weight = bnb.nn.Int8Params(torch.tensor(W), requires_grad=False, has_fp16_weights=False)
    elif kind.startswith("LinearWeightOnly"):
        m = bnb.nn.LinearWeightOnly(_SK, _SN, bias=bias, bits=int(kind[-1]))
        m.weight.data = torch.tensor(W)
    else:
        m = bnb.nn.LinearFP.from_linear(torch.nn.Linear(_SK, _SN, bias=bias))
        m.weight.data = torch.tensor(W)
    if bias:
        m.bias = torch.nn.Parameter(torch.tensor(b).to(ms_dtype(bias_dtype)), requires_grad=False)
    return m.to("cpu").eval()


def _deq_weight(kind, m):
    """The float64 [N, K] weight a freshly built layer ``m`` computes with."""
    if kind in _FOURBIT_KINDS:
        return F.dequantize_4bit(m.weight.data, m.weight.quant_state).astype(ms.float32).asnumpy().astype(np.float64)
    return _weight_of(kind.split("-")[0].replace("LinearWeightOnly", "LinearWeightOnly"), m)


def _quantized_tensors(kind, m):
    """The tensors that hold a quantized layer's weight (an in-place edit must rewrite all of them)."""
    if kind in _FOURBIT_KINDS:
        qs = m.weight.quant_state
        ts = [m.weight.data, qs.absmax]
        if qs.nested:
            ts += [qs.state2.absmax] + ([qs.offset] if isinstance(qs.offset, ms.Tensor) else [])
        return ts
    if kind.startswith("Linear8bitLt"):
        return [m.weight.data, m.state.SCB if m.state.SCB is not None else m.weight.SCB]
    if kind.startswith("LinearWeightOnly"):
        return [m.weight.data, m.weight_scale.data]
    return [m.weight.data]


_WORST = {"float32": 0, "float16": 1, "bfloat16": 2}
_LO = {"float32": 1e-5, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def _dtname(dt) -> str:
    return str(dt).split(".")[-1]


def _check_call(kind, m, x, y, W, b):
    """None if the layer's output ``y`` for ``x`` is within the layer's bound of the float64 formula with the
    current truth ``W`` / ``b`` (b rounded to the dtype the layer holds it in: upstream casts it in place)."""
    dt = _dtname(x.dtype)
    if _dtname(y.dtype) != dt or tuple(y.shape) != tuple(x.shape[:-1]) + (_SN,):
        return f"output {tuple(y.shape)} {y.dtype} for input {tuple(x.shape)} {x.dtype}"
    cdt = dt
    if kind in _FOURBIT_KINDS and m.compute_dtype is not None:
        cdt = _dtname(m.compute_dtype)
    used = [dt, cdt] + ([_dtname(m.bias.dtype)] if m.bias is not None else [])
    worst = max(used, key=_WORST.get)
    lo = _LO[worst]
    if kind in _FOURBIT_KINDS and worst != "float32":
        lo = 2.0**-7
    xr = x.astype(ms_dtype(cdt)).astype(ms.float32).asnumpy().astype(np.float64)
    ref = xr @ W.T + (0.0 if b is None else b)
    scale = np.abs(xr) @ np.abs(W).T + (0.0 if b is None else np.abs(b))
    tol = lo * scale + 2 * _LO[worst] * np.abs(ref) + 1e-30
    if kind.startswith("Linear8bitLt") and not m.training:  # int8 activations: half a step of each row's absmax
        xh = x.astype(ms.float16).astype(ms.float32).asnumpy().astype(np.float64)
        tol = tol + 0.51 * np.max(np.abs(xh), axis=-1, keepdims=True) / 127.0 * np.abs(W).sum(axis=1) + 2.0**-9 * scale
    return _within(to_np(y), ref, tol, f"{kind} forward", scale)


def _check_input_grad(kind, m, x, W):
    """None if the gradient of sum(m(x)) w.r.t. the fp32 input ``x`` is W's column sums within the layer's
    bound (its compute dtype's rounding of the dequantized weight), else why not."""
    res = call(lambda: ms.value_and_grad(lambda t: m(t).sum())(x))
    if isinstance(res, Raised):
        return f"gradient raised {res.describe()}"
    g = to_np(res[1]).astype(np.float64)
    cdt = _dtname(m.compute_dtype) if kind in _FOURBIT_KINDS and m.compute_dtype is not None else "float32"
    lo = 2.0**-7 if cdt != "float32" else 1e-5
    want = np.broadcast_to(W.sum(axis=0), g.shape)
    tol = lo * np.abs(W).sum(axis=0) + 1e-6
    if g.shape != x.shape or not (np.abs(g - want) <= tol).all():
        return f"input gradient off by {float(np.max(np.abs(g - want))):.3g} (bound {float(tol.min()):.3g})"
    return None


def _mutate(kind, m, op, arg, bias):
    """Applies one weight/bias mutation ``op`` to ``m``; returns the new truth (W seed or None, bias or None)."""
    if op == "load":  # load_state_dict of another layer's weights
        m.load_state_dict(_build(kind, arg, bias).state_dict())
        return arg, None
    if op == "inplace_w":  # the quantized tensors rewritten in place (same objects)
        src = _build(kind, arg, bias)
        for dst, s in zip(_quantized_tensors(kind, m), _quantized_tensors(kind, src)):
            dst.copy_(s.reshape(dst.shape))
        return arg, None
    if op == "assign_w":  # `.data =` (and, for 4-bit, the new weight's quant_state with it)
        src = _build(kind, arg, bias)
        m.weight.data = src.weight.data.clone()
        if kind in _FOURBIT_KINDS:
            m.weight.quant_state = src.weight.quant_state
        elif kind.startswith("Linear8bitLt"):
            m.weight.SCB = src.weight.SCB if src.weight.SCB is not None else src.state.SCB
            m.state.SCB = m.weight.SCB
            m.state.CB = None
        elif kind.startswith("LinearWeightOnly"):
            m.weight_scale.data = src.weight_scale.data.clone()
        return arg, None
    if op == "inplace_b" and m.bias is not None:
        new = values((_SN,), arg + 11)
        m.bias.data.copy_(torch.tensor(new).to(m.bias.dtype))
        return None, new
    if op == "assign_b" and m.bias is not None:
        new = values((_SN,), arg + 13)
        m.bias.data = torch.tensor(new)
        return None, new
    if op == "grad":  # requires_grad toggles of the float parameters
        for p in (m.bias, m.weight if kind == "LinearFP" else None):
            if p is not None:
                p.requires_grad_(bool(arg % 2))
    elif op == "train":
        m.train(bool(arg % 2))
    return None, None


@case
def layer_state_sequence(kind, bias, compute_dtype, bias_dtype, steps, seed):
    """One layer driven through a random sequence of calls (input dtypes, row counts, bad inputs) and weight /
    bias mutations (load_state_dict, in-place edits, ``.data =``, requires_grad and train toggles): every call
    against the float64 formula of the weights the layer should hold now (dequantized from a freshly built
    layer), so a cache keyed on an earlier call's dtype, shape, address or weight shows as a wrong result."""
    if kind == "LinearFP":  # torch.nn.Linear semantics: no compute dtype, a bias in the weight's dtype
        compute_dtype, bias_dtype = "none", "float32"
    m = _build(kind, seed, bias, compute_dtype, bias_dtype)
    W = _deq_weight(kind, _build(kind, seed, bias))
    # the bias as the layer should hold it: rounded through every dtype it was cast to (upstream casts in place)
    b = _rounded(_truth(seed)[1], m.bias.dtype) if bias else None
    for i, (op, dt, arg) in enumerate(steps):
        where = f"step {i} {op}({dt}, {arg}) of {steps}"
        bdt = None if m.bias is None else m.bias.dtype
        if op == "grad_call":  # a gradient w.r.t. the input between lean calls: d sum(y) / dx = column sums of W
            if kind.startswith("LinearWeightOnly"):
                continue  # inference only (documented)
            problem = _check_input_grad(kind, m, ms.Tensor(values((2, _SK), seed + 100 + i)), W)
            if problem:
                return "wrong", f"{where}: {problem}"
            continue
        if op in ("call", "bad_call"):
            x = ms.Tensor(values((arg, _SK + (op == "bad_call")), seed + 100 + i)).astype(ms_dtype(dt))
            res = call(lambda: m(x))
            if op == "bad_call" or (kind == "LinearFP" and dt != "float32"):
                kind_, detail = expect_error(res, f"{where}: a bad input")
                if kind_ == "wrong":
                    return "wrong", detail
                continue
            if isinstance(res, Raised):
                return "wrong", f"{where}: raised {res.describe()}"
            if b is not None and m.bias.dtype != bdt:
                b = _rounded(b, m.bias.dtype)
            problem = _check_call(kind, m, x, res, W, b)
            if problem:
                return "wrong", f"{where}: {problem}"
        else:
            res = call(lambda: _mutate(kind, m, op, arg, bias))
            if isinstance(res, Raised):
                return "wrong", f"{where}: raised {res.describe()}"
            wseed, newb = res
            if wseed is not None:
                W = _deq_weight(kind, _build(kind, wseed, bias))
                if op == "load" and bias:
                    newb = _truth(wseed)[1]
            if newb is not None:
                b = _rounded(newb, m.bias.dtype)
    return "ok", ""


def _rounded(a, dt) -> np.ndarray:
    """float64 ``a`` rounded to the MindSpore dtype ``dt``."""
    return ms.Tensor(a.astype(np.float32)).astype(dt).astype(ms.float32).asnumpy().astype(np.float64)


from fuzz_strategies import EDGE_KINDS, MAP_ARGS as _MAP_ARGS, OUT_BUFFERS  # noqa: E402,F401  (the generators' tables)


def _out_call(fn, rows, cols, seed, buf=None, name=None):
    """(result, the tensor of the result that buffer ``name`` receives) of ``fn`` on inputs from ``seed``."""
    x = ms.Tensor(values((rows, cols), seed))
    kw = {} if name is None else {name: buf}
    if fn.startswith("quantize_blockwise"):
        nested = fn.endswith("nested")
        q, st = F.quantize_blockwise(x, blocksize=64, nested=nested, **kw)
        # the absmax buffer receives the float32 block absmax, nested or not (issue 34)
        amax = F.quantize_blockwise(x, blocksize=64)[1].absmax
        return (q, st), {"out": q, "absmax": amax}.get(name)
    if fn == "dequantize_blockwise":
        q, st = F.quantize_blockwise(x, blocksize=64)
        r = F.dequantize_blockwise(q, st, **kw)
        return r, r
    if fn == "quantize_4bit":
        p, st = F.quantize_4bit(x, blocksize=64, quant_type="nf4", **kw)
        return (p, st), {"out": p, "absmax": st.absmax}.get(name)
    if fn == "dequantize_4bit":
        p, st = F.quantize_4bit(x, blocksize=64, quant_type="nf4")
        r = F.dequantize_4bit(p, st, **kw)
        return r, r
    rng = np.random.default_rng(seed)
    a = ms.Tensor(rng.integers(-128, 128, (rows, cols), dtype=np.int8))
    b = ms.Tensor(rng.integers(-128, 128, (5, cols), dtype=np.int8))
    if fn == "int8_linear_matmul":
        r = F.int8_linear_matmul(a, b, **kw)
        return r, r
    if fn == "int8_mm_dequant":
        c = F.int8_linear_matmul(a, b)
        rs = ms.Tensor(np.abs(values((rows,), seed + 1)) + 0.1)
        cs = ms.Tensor(np.abs(values((5,), seed + 2)) + 0.1)
        r = F.int8_mm_dequant(c, rs, cs, **kw)
        return r, r
    r = F.int8_double_quant(x, **kw)
    return r, {"out_row": r[0], "out_col": r[1], "row_stats": r[2], "col_stats": r[3]}.get(name)


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and differ(a, b, "") is None


def _result_arrays(res):
    """The arrays a functional's result holds (tensors of a tuple, a QuantState's absmax)."""
    items = res if isinstance(res, tuple) else (res,)
    out = []
    for r in items:
        if isinstance(r, ms.Tensor):
            out.append(to_np(r))
        elif isinstance(r, F.QuantState):
            out.append(to_np(r.absmax))
    return out


@case
def out_buffer(fn, name, defect, other_dtype, rows, cols, seed):
    """A functional given a preallocated buffer ``name`` that is right or has one defect (dtype, size, shape,
    a strided view, a numpy array, not an array at all): it raises a clear error naming the buffer, or
    computes the right result into it (the result without the buffer, bit for bit)."""
    ref, want = _out_call(fn, rows, cols, seed)
    if want is None:
        return "ok", "n/a"
    shape, dt = tuple(want.shape), want.dtype
    n = int(np.prod(shape))
    if defect == "dtype" and other_dtype == _dtname(dt):
        defect = "none"
    if defect in ("short", "shape") and n == 0:
        defect = "long"
    make = {"none": lambda: F.empty(shape, dt), "dtype": lambda: F.empty(shape, ms_dtype(other_dtype)),
            "short": lambda: F.empty((n - 1,), dt), "long": lambda: F.empty((n + 3,), dt),
            "shape": lambda: F.empty(shape[::-1] if len(set(shape)) > 1 else (n,), dt),
            "strided": lambda: F.empty(shape[:-1] + (2 * shape[-1],), dt)[..., ::2] if shape else F.empty(shape, dt),
            "numpy": lambda: np.zeros(shape, to_np(want).dtype), "list": lambda: [0] * n}
    buf = make[defect]()
    res = call(lambda: _out_call(fn, rows, cols, seed, buf, name))
    upstream_refuses = fn == "int8_double_quant"  # 0.50.2: "does not support pre-allocated ..."
    if defect == "none" and not upstream_refuses:
        got, _ = must(res)
    elif isinstance(res, Raised):
        return expect_error(res, f"{fn}({name}=<{defect}>)")
    else:
        if upstream_refuses:
            return "wrong", f"{fn} accepted a preallocated {name} (upstream refuses it)"
        got, _ = res
    problems = [None if all(_same(g, w) for g, w in zip(_result_arrays(got), _result_arrays(ref)))
                else f"{fn}({name}=<{defect}>): result differs from the call without the buffer"]
    held = to_np(buf) if isinstance(buf, ms.Tensor) else np.asarray(buf)
    if held.size != n or held.dtype != to_np(want).dtype or not _same(held.reshape(-1), to_np(want).reshape(-1)):
        problems.append(f"{fn}({name}=<{defect}>): accepted, but the buffer ({held.shape} {held.dtype}) does not "
                        f"hold the result ({shape} {dt})")
    return outcome(*problems)


def _map_surely_valid(fn, kw) -> bool:
    """Combinations upstream 0.50.2 computes a proper code from (they must be accepted)."""
    import inspect

    sig = inspect.signature(getattr(F, fn)).parameters
    kw = {**{a: sig[a].default for a in _MAP_ARGS[fn]}, **kw}
    def is_int(v):
        return type(v) is int

    def is_bool(v):
        return type(v) is bool

    if fn == "create_dynamic_map":
        return (is_bool(kw["signed"]) and kw["total_bits"] == 8 and is_int(kw["max_exponent_bits"])
                and 1 <= kw["max_exponent_bits"] <= 7)
    if fn == "create_normal_map":
        o = kw["offset"]
        return type(o) is float and 0.6 <= o <= 0.99 and is_bool(kw["use_extra_value"])
    if fn == "create_fp8_map":
        e, p, t, s = kw["exponent_bits"], kw["precision_bits"], kw["total_bits"], kw["signed"]
        return (is_bool(s) and all(is_int(v) for v in (e, p, t)) and t == 8 and 2 <= e <= 5 and p >= 1
                and e + p + int(s) == t)
    return is_bool(kw["signed"]) and is_int(kw["total_bits"]) and 2 <= kw["total_bits"] <= 8 and is_bool(kw["add_zero"])


@case
def code_map(fn, kw):
    """A code-map constructor on random arguments: an accepted call gives finite float32 entries inside
    [-1, 1] (and a combination upstream computes properly is accepted); a refused one raises a clear
    ValueError/TypeError naming one of its arguments."""
    res = call(lambda: getattr(F, fn)(**kw))
    if isinstance(res, Raised):
        if _map_surely_valid(fn, kw):
            return "wrong", f"{fn}({kw}) refused a valid combination: {res.describe()}"
        ok, why = clarity(res.exc)
        named = any(a in str(res.exc) for a in _MAP_ARGS[fn])
        if ok and named and isinstance(res.exc, (ValueError, TypeError)):
            return "clear", res.describe()
        return "wrong", f"{fn}({kw}): unclear error ({why or 'names none of its arguments'}): {res.describe()}"
    v = res.asnumpy()
    problems = []
    if res.dtype != ms.float32 or v.ndim != 1 or v.size == 0:
        problems.append(f"{fn}({kw}): {v.shape} {res.dtype}")
    elif not np.isfinite(v).all():
        problems.append(f"{fn}({kw}): {int((~np.isfinite(v)).sum())} non-finite entries")
    elif np.abs(v).max() > 1.0:
        problems.append(f"{fn}({kw}): entries outside [-1, 1] (max |v| {np.abs(v).max()!r})")
    return outcome(*problems)


_HYPER_OWNERS = {  # hyper-parameter -> the optimizers that take it
    "lr": None, "eps": ("Adam", "AdamW", "Adam8bit", "AdamW8bit", "RMSprop8bit", "Adagrad8bit", "LAMB", "AdEMAMix8bit",
                        "PagedAdamW8bit"),
    "weight_decay": None, "momentum": ("SGD", "SGD8bit", "RMSprop8bit", "LARS"),
    "alpha": ("RMSprop8bit", "AdEMAMix8bit"), "dampening": ("SGD", "SGD8bit", "LARS"),
    "nesterov": ("SGD", "SGD8bit", "LARS"),
    "min_8bit_size": None, "max_unorm": ("LAMB", "LARS"), "t_alpha": ("AdEMAMix8bit",), "t_beta3": ("AdEMAMix8bit",),
    "percentile_clipping": (), "block_wise": (),  # not parameters of upstream 0.50.2's optimizers
}


def _hyper_verdict(name, arg, v) -> str:
    """'valid' (must be accepted and give a finite update), 'invalid' (must raise a clear error) or 'either'
    (a clear error or a finite update), after torch.optim and upstream 0.50.2's checks. ``inf`` is a number
    torch accepts (its update is not finite): 'accept'."""
    owners = _HYPER_OWNERS[arg]
    if owners is not None and name not in owners:
        return "invalid"  # an argument the optimizer does not take: TypeError naming it
    if isinstance(v, (bool, str)) and arg != "nesterov":
        return "either"  # torch compares them (True is 1; a string fails its comparison); float() takes both
    num = isinstance(v, (int, float)) and not isinstance(v, bool)
    if arg in ("lr", "eps", "weight_decay", "momentum"):
        if not num or v != v or v < 0:
            return "invalid"
        if v == float("inf"):
            return "accept"
        if arg == "momentum" and v >= 1.0:
            return "either"  # upstream's 1-state optimizers take momentum as a beta (< 1); torch accepts it
        if arg == "momentum" and v == 0 and name == "LARS":
            return "either"
        return "valid"
    if arg == "alpha":
        if name.startswith("RMSprop"):  # upstream: alpha is beta1 of the 1-state update, alpha == 0 unsupported
            return "valid" if num and 0 < v < 1 else "invalid" if not num or v != v or v < 0 else "either"
        return "valid" if num and 0 <= v < 1e3 else "invalid" if not num or v != v else "either"
    if arg == "nesterov":  # needs a momentum and no dampening (the case's momentum is 0.9); LARS ignores it
        return "either" if v or not isinstance(v, bool) else "valid"
    if arg in ("dampening", "max_unorm"):
        return "valid" if num and 0 <= v <= 1 else "invalid" if not num or v != v else "either"
    if arg == "min_8bit_size":
        return "valid" if type(v) is int and v >= 0 else "either"
    if arg in ("t_alpha", "t_beta3"):
        return "valid" if v is None or (type(v) is int and v >= 1) else "either"
    return "invalid"


@case
def optim_hyper(name, arg, value, seed):
    """An optimizer built with one random hyper-parameter value and stepped once: a valid value gives a finite
    update, an invalid one a clear error naming the argument (torch.optim / upstream 0.50.2's rules)."""
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal((64, 64)).astype(np.float32)
    p = ms.Parameter(ms.Tensor(p0), name="w")
    verdict = _hyper_verdict(name, arg, value)

    def build_and_step():
        kw = {arg: value}
        if name.startswith(("SGD", "LARS")):
            kw.setdefault("momentum", 0.9)
            kw.setdefault("lr", 0.01)
        opt = getattr(bnb.optim, name)([p], **kw)
        for _ in range(2):
            opt.step(grads=[ms.Tensor(rng.standard_normal((64, 64)).astype(np.float32))])
        return opt

    res = call(build_and_step)
    what = f"{name}({arg}={value!r})"
    if isinstance(res, Raised):
        if verdict in ("valid", "accept"):
            return "wrong", f"{what}: a valid value refused: {res.describe()}"
        ok, why = clarity(res.exc)
        if ok and (arg in str(res.exc) or _SIGNATURE_NAMES(res.exc)):
            return "clear", res.describe()
        return "wrong", f"{what}: unclear error ({why or 'does not name the argument'}): {res.describe()}"
    if verdict == "invalid":
        return "wrong", f"{what}: accepted an invalid value"
    got = to_np(p)
    if verdict != "accept" and not np.isfinite(got).all():
        return "wrong", f"{what}: accepted, and the update is not finite ({int((~np.isfinite(got)).sum())} values)"
    return "ok", ""


def _SIGNATURE_NAMES(exc) -> bool:
    """Python's own call check names the argument (``unexpected keyword argument 'x'``)."""
    return isinstance(exc, TypeError) and "keyword argument" in str(exc)


def _edge_block(kind, n, rng) -> np.ndarray:
    """``n`` float32 values of one edge ``kind`` (a whole block of it)."""
    x = rng.standard_normal(n).astype(np.float32)
    tiny = np.finfo(np.float32).tiny
    if kind == "zeros":
        x[:] = 0.0
    elif kind == "negzeros":
        x[:] = -0.0
        x[::2] = 0.0
    elif kind == "subnormal":
        x = (x * 1e-41).astype(np.float32)
    elif kind == "subnormal_zeros":  # the case: 1/absmax overflows; a 0 must stay 0
        x = (x * 3e-40).astype(np.float32)
        x[rng.integers(0, n, max(1, n // 3))] = 0.0
    elif kind == "min_normal":
        x = (np.sign(x) * tiny * rng.integers(1, 4, n)).astype(np.float32)
        x[::5] = 0.0
    elif kind in ("inf", "-inf", "nan"):
        x[rng.integers(0, n, max(1, n // 9))] = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan}[kind]
        x[::7] = 0.0
    elif kind == "huge":
        x = (x * 1e38).astype(np.float32)
        x[rng.integers(0, n)] = np.float32(3.4e38)
    elif kind == "huge_and_tiny":
        x[::2] = np.clip(x[::2], -1.1, 1.1) * np.float32(3e38)
        x[1::2] *= np.float32(1e-39)
        x[::11] = 0.0
    elif kind == "one_value":
        x[:] = np.float32(rng.standard_normal())
    return x


def _zeros_kept(xv, back, absmax_of_elem) -> Optional[str]:
    """An exact 0 in a block with a finite absmax dequantizes to 0 (issue 34)."""
    z = (xv == 0) & np.isfinite(absmax_of_elem)
    if z.any() and (back[z] != 0).any():
        i = int(np.flatnonzero(z & (back != 0))[0])
        return f"a 0 dequantized to {back.reshape(-1)[i]!r} (block absmax {absmax_of_elem.reshape(-1)[i]!r})"
    return None


@case
def edge_blocks(fn, dtype, blocksize, kinds, seed, threshold=0.0):
    """Arrays built of whole blocks of edge values (subnormals, zeros, -0, inf, NaN, huge, huge next to tiny)
    through blockwise 8-bit, 4-bit and int8 row-wise quantization: codes, scales and the round trip against the
    numpy reference (NaN where it gives NaN), and every exact 0 of a block with a finite absmax stays 0."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([_edge_block(k, blocksize, rng) for k in kinds]) if kinds else np.zeros(0, np.float32)
    t, xv = tensor(x.reshape(len(kinds), blocksize) if fn == "int8" else x, dtype)
    if fn == "blockwise":
        code = F.create_dynamic_map().asnumpy()
        q, st = must(call(lambda: F.quantize_blockwise(t, blocksize=blocksize)))
        rq, ra = R.quantize_blockwise(xv, code, blocksize)
        back = to_np(must(call(lambda: F.dequantize_blockwise(q, st))))
        want = to_np_dt(R.dequantize_blockwise(rq, ra, code, blocksize, dtype))
        # the dynamic code's bin of 0 is not 0 (upstream: a 0 in a normal block comes back as ~2e-5 * absmax);
        # in a block whose 1/absmax overflows (absmax below FLT_MIN) or of zeros it must be exactly 0
        per = np.repeat(np.where(ra < np.finfo(np.float32).tiny, ra, np.inf), blocksize)[: xv.size]
        return outcome(differ(q.asnumpy(), rq, "codes"), differ(to_np(st.absmax), ra, "absmax"),
                       differ(back, want, "dequantized"), _zeros_kept(xv, back, per))
    if fn.startswith("fourbit"):
        qt = fn.split("_")[1]
        code = F.get_4bit_type(qt).asnumpy()
        packed, qs = must(call(lambda: F.quantize_4bit(t, blocksize=blocksize, quant_type=qt)))
        rp, ra = R.quantize_4bit(xv, code, blocksize)
        back = to_np(must(call(lambda: F.dequantize_4bit(packed, qs))))
        want = to_np_dt(R.dequantize_4bit(rp, ra, code, blocksize, xv.size, dtype, fp4=qt == "fp4").reshape(xv.shape))
        per = np.repeat(ra, blocksize)[: xv.size]
        return outcome(differ(F._as_uint8(packed).asnumpy().reshape(-1, 1), rp, "packed bytes"),
                       differ(to_np(qs.absmax), ra, "absmax"), differ(back, want, "dequantized"),
                       _zeros_kept(xv, back, per))
    CA, SCA, cols = must(call(lambda: F.int8_vectorwise_quant(t, threshold=threshold)))
    rq, rs, rf = R.int8_vector_quant(xv, threshold, dtype)
    zero = (xv == 0) & np.isfinite(rs)[:, None]
    return outcome(differ(CA.asnumpy(), rq, "codes"), differ(SCA.asnumpy().reshape(-1), rs, "row stats"),
                   None if threshold == 0.0 else differ(cols.asnumpy(), np.nonzero(rf)[0], "outlier columns"),
                   "a 0 got a nonzero int8 code" if (CA.asnumpy()[zero] != 0).any() else None)


_EMB_N, _EMB_D = 20, 64


def _build_embedding(kind, seed):
    """A fresh embedding of ``kind`` holding the table of generation ``seed`` (quantized, on the CPU)."""
    torch.manual_seed(0)
    e = getattr(bnb.nn, kind)(_EMB_N, _EMB_D)
    W = values((_EMB_N, _EMB_D), seed)
    e.load_state_dict({"weight": torch.tensor(W)}, strict=False)
    return e.to("cpu")


def _embedding_tensors(kind, e):
    if kind == "Embedding8bit":
        return [e.weight.data, e.weight.SCB]
    if kind.startswith("EmbeddingNF4") or kind.startswith("EmbeddingFP4"):
        return [e.weight.data, e.weight.quant_state.absmax]
    return [e.weight.data]


@case
def embedding_state_sequence(kind, steps, seed):
    """An embedding looked up with random indices between table mutations (load_state_dict + .to, in-place edits
    of the stored tensors, ``.data =``): every lookup equals a freshly built embedding's rows, bit for bit."""
    e = _build_embedding(kind, seed)
    everything = torch.tensor(np.arange(_EMB_N))
    table = to_np(_build_embedding(kind, seed)(everything))
    rng = np.random.default_rng(seed)
    for i, (op, arg) in enumerate(steps):
        where = f"step {i} {op}({arg}) of {steps}"
        src = _build_embedding(kind, arg) if op in ("load", "inplace_w", "assign_w") else None
        if op == "call":
            idx = rng.integers(0, _EMB_N, (arg % 3 + 1, arg % 5 + 1))
            res = call(lambda: e(torch.tensor(idx)))
            if isinstance(res, Raised):
                return "wrong", f"{where}: raised {res.describe()}"
            bad = differ(to_np(res), table[idx], f"{where}: {kind} rows")
            if bad:
                return "wrong", bad
            continue
        if op == "load":
            res = call(lambda: e.load_state_dict({"weight": torch.tensor(values((_EMB_N, _EMB_D), arg))},
                                                 strict=False) and e.to("cpu"))
        elif op == "inplace_w":
            res = call(lambda: [d.copy_(s.reshape(d.shape)) for d, s in zip(_embedding_tensors(kind, e),
                                                                            _embedding_tensors(kind, src))])
        else:
            def assign():
                e.weight.data = src.weight.data.clone()
                if kind == "Embedding8bit":
                    e.weight.SCB = src.weight.SCB
                elif kind.startswith(("EmbeddingNF4", "EmbeddingFP4")):
                    e.weight.quant_state = src.weight.quant_state
            res = call(assign)
        if isinstance(res, Raised):
            return "wrong", f"{where}: raised {res.describe()}"
        table = to_np(src(everything))
    return "ok", ""
