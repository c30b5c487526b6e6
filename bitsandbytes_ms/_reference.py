"""Pure-numpy reference implementations of every native op (the executable spec).

Each function here computes, in numpy, exactly what the native entry point of the same name in
:mod:`bitsandbytes_ms._native_table` computes (same bytes where the algorithm is deterministic). Tests compare
the two on random inputs; upstream bitsandbytes' vectors (``compat_tests/fixtures``) pin both.

Floating-point inputs are taken as float32 arrays (fp16/bf16 values widen exactly); outputs in a
16-bit dtype are rounded to nearest even, as the kernels do.

Names: a numpy twin and the C++ kernels it is the twin of share one stem (docs/architecture.md, "Kernel names",
has the table). The twin is the bare stem; in ``csrc/cpu`` the function that picks the SIMD level bears the same
stem where there is one, its portable path is ``<stem>_portable`` and each SIMD path ``<stem>_<isa>``, the ISA
spelled as the ``BNB_MS_TARGET_*`` attribute the path is compiled with (``avx2``, ``avx512``, ``avx512vbmi``,
``avx512bf16``, ``avxvnni``, ``avx512vnni``; a class-template path is ``<Stem>Portable`` / ``<Stem><Isa>``). So
:func:`gemv_bf16_rows` is the twin of ``gemv_bf16_rows_portable`` and ``gemv_bf16_rows_avx512bf16``, and
:func:`quantize_blockwise` of ``quantize_blockwise`` (the dispatcher), ``quantize_blockwise_portable``,
``quantize_blockwise_avx2`` and ``quantize_blockwise_avx512``. A per-level piece of a family beside its main kernel
puts its part's name before the ISA (``int8_vector_quant_flags_avx2``, ``dequantize_4bit_row_avx2``). The stems
of the public ops are the ops' names (:mod:`bitsandbytes_ms._ops`).
"""

from __future__ import annotations

import math

import numpy as np

try:  # numpy has no bfloat16; ml_dtypes (a MindSpore dependency) provides it
    from ml_dtypes import bfloat16 as np_bfloat16
except ImportError:  # pragma: no cover
    np_bfloat16 = None

LUT_SIZE = 65536


def torch_linspace_f32(start: float, end: float, steps: int) -> np.ndarray:
    """``torch.linspace(start, end, steps)`` in float32, bit for bit, as PyTorch's CPU kernel
    computes it (upstream's code maps are built with it): ``step = (end - start) / (steps - 1)`` in
    float32, then ``start + step * i`` for the first half and ``end - step * (steps - 1 - i)`` for the
    second, each a fused multiply-add (one rounding). The float64 evaluation below is exact before
    its single rounding to float32 for any realistic ``steps``."""
    f32 = np.float32
    start32, end32 = f32(start), f32(end)
    if steps == 1:
        return np.array([start32], dtype=f32)
    step = np.float64(f32((end32 - start32) / f32(steps - 1)))
    idx = np.arange(steps, dtype=np.float64)
    lo = np.float64(start32) + step * idx
    hi = np.float64(end32) - step * (steps - 1 - idx)
    return np.where(idx < steps // 2, lo, hi).astype(f32)


def rows_2d(a: np.ndarray, K: int) -> np.ndarray:
    """``a [..., K]`` as ``[rows, K]`` (``reshape(-1, K)`` is ambiguous when K is 0)."""
    return a.reshape(int(math.prod(a.shape[:-1])), K)


def nan_bits16(x: np.ndarray, dtype: str) -> np.ndarray:
    """The 16-bit patterns the library gives the NaNs of float32 ``x`` (csrc/aot.h f32_to_fp16 / f32_to_bf16): sign
    and top payload bits kept, made quiet -- fp16 ``sign | 0x7e00 | payload >> 13`` (x86's vcvtps2ph, upstream's
    ``_Float16`` casts), bf16 ``bits >> 16 | 0x40``. numpy does not quiet a signalling NaN and ml_dtypes' bfloat16
    drops the payload, so their casts differ there."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    if dtype == "float16":
        return (((b >> 16) & 0x8000) | 0x7E00 | ((b >> 13) & 0x3FF)).astype(np.uint16)
    return ((b >> 16) | 0x40).astype(np.uint16)


def convert_span(x: np.ndarray, dtype: str) -> np.ndarray:
    """Rounds float32 values to ``dtype`` ("float32" | "float16" | "bfloat16"), NaNs as the library rounds them
    (:func:`nan_bits16`): csrc/cpu/simd_convert.h ``convert_span<float, D>`` (``convert_span_portable`` /
    ``_avx2`` / ``_avx512``; ``bnb_ms_convert``), i.e. the kernels' ``from_f32``."""
    if dtype == "float32":
        return x.astype(np.float32)
    if dtype not in ("float16", "bfloat16"):
        raise ValueError(dtype)
    x = np.asarray(x, np.float32)
    y = np.array(x.astype(np.float16 if dtype == "float16" else np_bfloat16))
    nan = np.isnan(x)
    if nan.any():
        y.view(np.uint16)[nan] = nan_bits16(x[nan], dtype)
    return y


# ---------------------------------------------------------------------------------------------
# Blockwise 8-bit quantization
# ---------------------------------------------------------------------------------------------
def quant_lut(code: np.ndarray) -> np.ndarray:
    """The 65536-bin grid on [-1, 1] -> index of the nearest code entry (ties to the lower index): the table of
    csrc/cpu/quant_lut.h's ``QuantLut`` (``get_quant_lut``)."""
    code = np.asarray(code, dtype=np.float32)
    mid = (np.float32(0.5) * (code[:-1] + code[1:])).astype(np.float32)
    i = np.arange(LUT_SIZE, dtype=np.float32)
    grid = (np.float32(-1.0) + (np.float32(2.0) * i) / np.float32(LUT_SIZE - 1)).astype(np.float32)
    return np.searchsorted(mid, grid, side="left").astype(np.uint8)


def quant_grid_index(v: np.ndarray) -> np.ndarray:
    """idx = trunc(fma((clamp(v) + 1) * 0.5, 65535, 0.5)) in float32 arithmetic; NaN clamps to -1 (the
    kernels' max(v, -1) returns -1 for NaN, as upstream's std::max does): csrc/cpu/quant_lut.h
    ``quant_grid_index`` (8 / 16 lanes: ``quant_grid_index8`` / ``quant_grid_index16``)."""
    v = np.clip(v.astype(np.float32), np.float32(-1.0), np.float32(1.0))
    v[np.isnan(v)] = np.float32(-1.0)
    t = ((v + np.float32(1.0)) * np.float32(0.5)).astype(np.float32)
    fused = (t.astype(np.float64) * (LUT_SIZE - 1) + 0.5).astype(np.float32)  # exact, then one rounding
    return fused.astype(np.int64)


def quant_block_scale(absmax: np.ndarray):
    """(pre, inv) per block: values are scaled as ``(x * pre) * inv``. pre = 1, inv = 1/absmax (upstream's);
    where 1/absmax overflows (absmax < 2^-128) the block is first scaled by 2^64 (exact), so it quantizes as
    at a normal magnitude (upstream's x * inf maps 0 to NaN, i.e. code 0). absmax 0 gives inv 1. (csrc/cpu/quant_lut.h
    ``quant_block_scale``.)"""
    absmax = np.asarray(absmax, dtype=np.float32)
    with np.errstate(over="ignore", divide="ignore"):
        inv = (np.float32(1.0) / np.where(absmax == 0, np.float32(1.0), absmax)).astype(np.float32)
    tiny = np.isinf(inv)
    pre = np.where(tiny, np.float32(2.0**64), np.float32(1.0)).astype(np.float32)
    inv[tiny] = (np.float32(1.0) / (absmax[tiny] * np.float32(2.0**64))).astype(np.float32)
    return pre, inv


def quantize_blockwise(A: np.ndarray, code: np.ndarray, blocksize: int, tiny_zeros: bool = True):
    """Returns (uint8 codes shaped like A, float32 absmax[ceil(n/blocksize)]). absmax ignores NaN (as the
    kernels' and upstream's max(absmax, |x|)); NaN takes code 0 as in the kernels. ``tiny_zeros=False``: the 8-bit
    optimizers' requantization, which keeps the grid's code for a 0 in a block of subnormals as well (it
    dequantizes to ~2e-5 x that subnormal absmax; the CPU and CUDA optimizer kernels were left so)."""
    flat = np.asarray(A, dtype=np.float32).reshape(-1)
    n = flat.size
    nblocks = -(-n // blocksize)
    pad = np.zeros(nblocks * blocksize, dtype=np.float32)
    pad[:n] = flat
    blocks = pad.reshape(nblocks, blocksize)
    absmax = np.nanmax(np.abs(blocks), axis=1, initial=0.0).astype(np.float32) if n else np.zeros(0, np.float32)
    pre, inv = quant_block_scale(absmax)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = ((blocks * pre[:, None]).astype(np.float32) * inv[:, None]).astype(np.float32)
    q = quant_lut(code)[quant_grid_index(scaled)]
    # in a block of subnormals an exact 0 takes the code entry nearest 0, so it dequantizes to 0 (the kernels'
    # lut->zero; its grid bin's code times a subnormal absmax would round to a nonzero subnormal)
    if tiny_zeros:
        tiny = (absmax < np.finfo(np.float32).tiny)[:, None]
        q[tiny & (blocks == 0)] = np.argmin(np.abs(np.asarray(code, np.float32)))
    q[absmax == 0] = 0
    return q.reshape(-1)[:n].reshape(np.shape(A)), absmax


def dequantize_blockwise(A: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int,
                         dtype: str = "float32") -> np.ndarray:
    """out = code[A] * absmax[block], rounded to ``dtype``."""
    q = np.asarray(A, dtype=np.uint8).reshape(-1)
    scale = np.repeat(np.asarray(absmax, dtype=np.float32), blocksize)[: q.size]
    vals = (np.asarray(code, dtype=np.float32)[q] * scale).astype(np.float32)
    return convert_span(vals, dtype).reshape(np.shape(A))


# ---- optim ----
# Reference optimizer updates (upstream bitsandbytes 0.50 CPU semantics, backends/cpu/ops.py):
# everything in float32; Python-side scalars (1-beta1, step sizes, ...) are computed in float64 and
# rounded to float32 once, as a PyTorch scalar meeting a float32 tensor is. Ops are not fused.
_f32 = np.float32

OPTIM_32BIT = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
OPTIM_8BIT_BLOCKWISE = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
OPTIM_BLOCKSIZE = 256


def update_elem(name, g, p, s1, s2, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr,
                gnorm_scale, eightbit, max_unorm=0.0, param_norm=0.0):
    """One update on float32 copies; returns (p, s1, s2, unorm or None). The rule of csrc/optim_rule.h
    ``update_elem`` (one element there, every element here)."""
    g = (g.astype(_f32) * _f32(gnorm_scale)).astype(_f32)
    p = p.astype(_f32).copy()
    c1 = 1.0 - beta1 ** step
    c2 = math.sqrt(1.0 - beta2 ** step)
    unorm = None

    def scale_of(update):
        nonlocal unorm
        if max_unorm <= 0.0:
            return 1.0
        unorm = float(np.sqrt(np.sum(update.astype(np.float64) ** 2)))
        if unorm > max_unorm * param_norm:
            return (max_unorm * param_norm) / unorm
        return 1.0

    if name in ("adam", "lamb"):
        s1 = s1 * _f32(beta1) + _f32(1.0 - beta1) * g
        s2 = s2 * _f32(beta2) + _f32(1.0 - beta2) * g * g
        if eightbit:
            denom = np.sqrt(s2) / _f32(c2) + _f32(eps)
            if weight_decay > 0.0:
                p = p * _f32(1.0 - lr * weight_decay)
            p = p + _f32(-lr / c1) * (s1 / denom)
        else:
            if weight_decay > 0.0:
                p = p * _f32(1.0 - lr * weight_decay)
            update = s1 / (np.sqrt(s2) + _f32(eps * c2))
            sc = scale_of(update)
            p = p + _f32((-lr * c2 / c1) * sc) * update
    elif name == "ademamix":
        m1 = s1[0] * _f32(beta1) + _f32(1.0 - beta1) * g
        m2 = s1[1] * _f32(beta3) + _f32(1.0 - beta3) * g
        s2 = s2 * _f32(beta2) + _f32(1.0 - beta2) * g * g
        s1 = np.stack([m1, m2])
        update = (m1 / _f32(c1) + _f32(alpha) * m2) / (np.sqrt(s2) / _f32(c2) + _f32(eps))
        if weight_decay > 0.0:
            p = p * _f32(1.0 - lr * weight_decay)
        p = p + _f32(-lr) * update
    elif name in ("momentum", "lars"):
        if eightbit or weight_decay > 0.0:
            g = g + _f32(weight_decay) * p
        s1 = g.copy() if step == 1 else s1 * _f32(beta1) + g
        sc = 1.0 if eightbit else scale_of(s1)
        p = p + _f32(-lr * sc) * s1
    elif name == "lion":
        if weight_decay > 0.0:
            p = p * _f32(1.0 - lr * weight_decay)
        update = s1 * _f32(beta1) + _f32(1.0 - beta1) * g
        p = p + _f32(-lr) * np.sign(update).astype(_f32)
        s1 = s1 * _f32(beta2) + _f32(1.0 - beta2) * g
    elif name == "rmsprop":
        if eightbit or weight_decay > 0.0:
            g = g + _f32(weight_decay) * p
        s1 = s1 * _f32(beta1) + _f32(1.0 - beta1) * g * g
        update = g / (np.sqrt(s1) + _f32(eps))
        sc = 1.0 if eightbit else scale_of(update)
        p = p + _f32(-lr * sc) * update
    elif name == "adagrad":
        if eightbit or weight_decay > 0.0:
            g = g + _f32(weight_decay) * p
        s1 = s1 + g * g
        p = p + _f32(-lr) * (g / (np.sqrt(s1) + _f32(eps)))
    else:
        raise ValueError(f"unsupported optimizer {name!r}")
    cast = lambda x: None if x is None else np.asarray(x, dtype=_f32)  # noqa: E731
    return cast(p), cast(s1), cast(s2), unorm


def optimizer_update_32bit(name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, weight_decay,
                           step, lr, gnorm_scale=1.0, max_unorm=0.0, p_dtype="float32"):
    """Returns (p in ``p_dtype``, state1, state2, unorm) after one 32-bit-state update (numpy copies)."""
    p32 = np.asarray(p, dtype=_f32)
    param_norm = float(np.sqrt(np.sum(p32.astype(np.float64) ** 2))) if max_unorm > 0.0 else 0.0
    s1 = np.asarray(state1, dtype=_f32)
    s2 = None if state2 is None else np.asarray(state2, dtype=_f32)
    newp, s1, s2, unorm = update_elem(name, np.asarray(g, dtype=_f32), p32, s1, s2, beta1, beta2, beta3,
                                      alpha, eps, weight_decay, step, lr, gnorm_scale, False, max_unorm,
                                      param_norm)
    return convert_span(newp, p_dtype), s1, s2, unorm


def optimizer_update_8bit_blockwise(name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr,
                                    qmap1, qmap2, absmax1, absmax2, weight_decay=0.0, gnorm_scale=1.0,
                                    p_dtype="float32"):
    """Returns (p, state1 u8, state2 u8 | None, absmax1, absmax2 | None) after one 8-bit blockwise update:
    dequantize (blocksize 256), update in float32, requantize with :func:`quantize_blockwise`.

    An element whose gradient is inf or NaN updates its parameter as upstream's CPU rule computes it (NaN
    stays NaN) and its states become 0 (they do not enter the block's absmax)."""
    bs = OPTIM_BLOCKSIZE
    shape = np.shape(p)
    n = int(np.prod(shape))
    if name == "ademamix":
        s1 = np.stack([dequantize_blockwise(np.asarray(state1)[i].reshape(-1), np.asarray(absmax1)[i], qmap1, bs)
                       for i in range(2)])
    else:
        s1 = dequantize_blockwise(np.asarray(state1).reshape(-1), absmax1, qmap1, bs)
    s2 = None
    if state2 is not None:
        s2 = dequantize_blockwise(np.asarray(state2).reshape(-1), absmax2, qmap2, bs)
    g32, p32 = np.asarray(g, dtype=_f32).reshape(-1), np.asarray(p, dtype=_f32).reshape(-1)
    bad = ~np.isfinite(g32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        newp, s1, s2, _ = update_elem(name, g32, p32, s1, s2, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr,
                                      gnorm_scale, True)
    if bad.any():
        s1[..., bad] = 0.0
        if s2 is not None:
            s2[bad] = 0.0
    if name == "ademamix":
        qs = [quantize_blockwise(s1[i], qmap1, bs, tiny_zeros=False) for i in range(2)]
        q1 = np.stack([q for q, _ in qs]).reshape(np.shape(state1))
        a1 = np.stack([a for _, a in qs])
    else:
        q1, a1 = quantize_blockwise(s1, qmap1, bs, tiny_zeros=False)
        q1 = q1.reshape(np.shape(state1))
    q2 = a2 = None
    if s2 is not None:
        q2, a2 = quantize_blockwise(s2, qmap2, bs, tiny_zeros=False)
        q2 = q2.reshape(np.shape(state2))
    return convert_span(newp, p_dtype).reshape(shape), q1, q2, a1, a2

# ---------------------------------------------------------------------------------------------
# ---- 4-bit (NF4/FP4) ----
# ---------------------------------------------------------------------------------------------
def fourbit_bounds(code: np.ndarray):
    """(midpoints of the code sorted by value (stable argsort), the sort order)."""
    code = np.asarray(code, dtype=np.float32)
    order = np.argsort(code, kind="stable")
    mid = ((code[order[:-1]] + code[order[1:]]) / np.float32(2.0)).astype(np.float32)
    return mid, order


def quantize_4bit(A: np.ndarray, code: np.ndarray, blocksize: int):
    """Upstream's default ``quantize_4bit`` (torch.bucketize on code midpoints) in numpy.
    Returns (uint8 packed [(n+1)//2, 1], float32 absmax[ceil(n/blocksize)])."""
    flat = np.asarray(A, dtype=np.float32).reshape(-1)
    n = flat.size
    full = n - n % blocksize
    blocks = flat[:full].reshape(-1, blocksize)
    with np.errstate(all="ignore"):
        absmax = np.abs(blocks).max(axis=1).astype(np.float32) if full else np.zeros(0, np.float32)
        inv = (np.float32(1.0) / np.maximum(absmax, np.float32(1e-38))).astype(np.float32)
        scaled = np.clip(blocks * inv[:, None], -1, 1).astype(np.float32).reshape(-1)
        if n % blocksize:
            am = np.maximum(np.abs(flat[full:]).max(), np.float32(1e-38)).astype(np.float32)
            absmax = np.concatenate([absmax, [am]]).astype(np.float32)
            scaled = np.concatenate([scaled, np.clip(flat[full:] / am, -1, 1).astype(np.float32)])
    if scaled.size % 2:
        scaled = np.concatenate([scaled, np.zeros(1, np.float32)])
    mid, order = fourbit_bounds(code)
    q = order[np.searchsorted(mid, scaled, side="left")].astype(np.uint8)
    return ((q[0::2] << 4) | q[1::2]).astype(np.uint8).reshape(-1, 1), absmax


def unpack_4bit(packed: np.ndarray, n: int) -> np.ndarray:
    p = np.asarray(packed, dtype=np.uint8).reshape(-1)
    q = np.empty(p.size * 2, np.uint8)
    q[0::2] = p >> 4
    q[1::2] = p & 15
    return q[:n]


def dequantize_4bit(packed: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int, n: int,
                    dtype: str = "float32", fp4: bool = False) -> np.ndarray:
    """out[i] = code[nibble i] * absmax[i // blocksize] in fp32, rounded to ``dtype``; flat [n].
    ``fp4``: code 8 decodes to -0.0 (bit 3 is the sign), as upstream's native CPU kernel. (A weight row at a time:
    ``dequantize_4bit_row_*``, ``decode4_rows_f32``.)"""
    q = unpack_4bit(packed, n)
    code = np.array(code, dtype=np.float32)
    if fp4 and code[8] == 0:
        code[8] = -0.0
    scale = np.repeat(np.asarray(absmax, dtype=np.float32), blocksize)[:n]
    return convert_span((np.asarray(code, np.float32)[q] * scale).astype(np.float32), dtype)


def gemv_4bit(A: np.ndarray, packed: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int, N: int,
              dtype: str = "float32") -> np.ndarray:
    """A[..., K] @ W[N, K]^T with W = dequantize_4bit (fp32 weights), accumulated in float64 then
    rounded to ``dtype`` (the kernel's 16-lane fp32 sum differs from this by rounding only). Twin of
    csrc/cpu/fourbit.cpp ``gemv_4bit`` (one row: ``gemv_4bit_portable`` / ``_avx2`` / ``_avx512``) and, for more
    rows, ``gemm_4bit`` (``gemm_4bit_avx512``; portable and AVX2: ``dequantize_4bit_row_*`` + ``dot_rows_*``)."""
    A = np.asarray(A, dtype=np.float32)
    K = A.shape[-1]
    W = dequantize_4bit(packed, absmax, code, blocksize, N * K).reshape(N, K).astype(np.float64)
    out = rows_2d(A, K).astype(np.float64) @ W.T
    return convert_span(out.astype(np.float32), dtype).reshape(A.shape[:-1] + (N,))


def nested_absmax(absmax_q: np.ndarray, code2: np.ndarray, absmax2: np.ndarray, offset, blocksize2: int) -> np.ndarray:
    """The fp32 absmax per block of a double-quant 4-bit weight: ``code2[q[b]] * absmax2[b // blocksize2] + offset``,
    an fp32 multiply, then an fp32 add (dequantize_blockwise + offset). Twin of csrc/cpu/fourbit.cpp
    ``nested_absmax_portable`` / ``_avx2`` / ``_avx512`` / ``_avx512vbmi``."""
    q = np.asarray(absmax_q).reshape(-1)
    return (np.asarray(code2, np.float32)[q] * np.asarray(absmax2, np.float32).reshape(-1)[
        np.arange(q.size) // blocksize2] + np.float32(offset)).astype(np.float32)


def linear_4bit(A: np.ndarray, packed: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int, N: int,
                absmax2=None, code2=None, offset=None, bias=None, blocksize2: int = 256,
                dtype: str = "float32") -> np.ndarray:
    """Twin of ``clinear_4bit_*`` (to rounding: the kernel sums in fp32 in its documented order, one order
    for one row and another for more rows): :func:`gemv_4bit` with the double-quant absmax decoded first
    (:func:`nested_absmax`) and ``bias`` added to the result rounded to ``dtype``, in float32, then rounded
    again."""
    if absmax2 is not None:
        absmax = nested_absmax(absmax, code2, absmax2, offset, blocksize2)
    out = gemv_4bit(A, packed, absmax, code, blocksize, N, dtype)
    if bias is not None:
        out = convert_span(out.astype(np.float32) + np.asarray(bias, np.float32), dtype)
    return out


# ---- int8 (LLM.int8()) ----
def bf16_round_bits(x, flush: bool = False) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), round to nearest even, NaN kept quiet; ``flush``: a bf16
    denormal (exponent field 0) becomes a zero of its sign (the bf16 dot-product kernel's inputs)."""
    b = np.ascontiguousarray(np.asarray(x, np.float32)).view(np.uint32)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    with np.errstate(over="ignore"):
        r = ((b + np.uint32(0x7FFF) + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    r = np.where(nan, ((b >> 16) | 0x40).astype(np.uint16), r)
    if flush:
        r = np.where((r & 0x7F80) == 0, r & 0x8000, r).astype(np.uint16)
    return r


def bf16_bits_f32(h) -> np.ndarray:
    """bfloat16 bit patterns -> float32 values."""
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(np.float32)


_FLT_MIN = np.float32(1.17549435e-38)


def linear_4bit_bf16dot(A: np.ndarray, packed: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int,
                        N: int, absmax2=None, code2=None, offset=None, bias=None, blocksize2: int = 256) -> np.ndarray:
    """Twin, bit for bit, of ``clinear_4bit_bf16dot_bf16`` (csrc/cpu/fourbit.cpp, "bf16 compute"): the bf16
    dot product as vdpbf16ps computes it. ``A`` [..., K] float32 (bf16 values; rounded to bf16 here anyway),
    ``bias`` [N] or None; returns the bf16 result's values as float32. x and w = bf16(code[q] * absmax)
    are rounded to nearest even with bf16 denormals flushed; per 32-element chunk, lane l takes the pair
    (2l, 2l+1): acc = ftz(fma(w_odd, x_odd, acc)), then acc = ftz(fma(w_even, x_even, acc)); the 16 lanes
    are reduced as v = a[l] + a[l+8], u = v[l] + v[l+4], (u0 + u2) + (u1 + u3); the result is rounded to
    bf16 (not flushed) and the bias added in float32 and rounded again. Up to 8 rows with K a multiple of 64 and
    of the blocksize (a power of two >= 64): the one-row kernel's arithmetic on each row instead
    (:func:`gemv_bf16_rows`)."""
    if absmax2 is not None:
        absmax = nested_absmax(absmax, code2, absmax2, offset, blocksize2)
    A = np.asarray(A, np.float32)
    K = A.shape[-1]
    lead = A.shape[:-1]
    x = bf16_bits_f32(bf16_round_bits(rows_2d(A, K), flush=True))
    if 1 <= x.shape[0] <= 8 and bf16_gemv_applies(K, blocksize) and N > 0:
        am = np.asarray(absmax, np.float32).reshape(-1)
        r = np.stack([gemv_bf16_rows(x[m], packed, am, code, blocksize, N) for m in range(x.shape[0])])
    else:
        r = dot_rows_bf16(x, packed, absmax, code, blocksize, N, K)
    out = bf16_bits_f32(bf16_round_bits(r))
    if bias is not None:
        b = bf16_bits_f32(bf16_round_bits(np.asarray(bias, np.float32).reshape(-1)))
        out = bf16_bits_f32(bf16_round_bits(out + b))
    return out.reshape(lead + (N,))


def bf16_gemv_applies(K: int, blocksize: int) -> bool:
    """Where one row runs the one-row kernel (csrc/cpu/fourbit.cpp ``bf16_gemv_applies``): K a multiple of 64 and
    of the blocksize, the blocksize a power of two >= 64."""
    K, blocksize = int(K), int(blocksize)
    return blocksize >= 64 and blocksize & (blocksize - 1) == 0 and K % blocksize == 0 and K % 64 == 0


def ftz32(a: np.ndarray) -> np.ndarray:
    """A result below FLT_MIN in magnitude as a zero of its sign (csrc/cpu/bf16_round.h ``ftz32``: vdpbf16ps' FTZ)."""
    return np.where(np.abs(a) < _FLT_MIN, np.copysign(np.float32(0), a), a).astype(np.float32)


def lanes_reduce(acc: np.ndarray) -> np.ndarray:
    """The 16 lanes' fixed reduction tree (csrc/cpu/fourbit.cpp ``lanes_reduce``): v = a[l] + a[l + 8],
    u = v[l] + v[l + 4], (u0 + u2) + (u1 + u3)."""
    v = acc[..., :8] + acc[..., 8:]
    u = v[..., :4] + v[..., 4:]
    return (u[..., 0] + u[..., 2]) + (u[..., 1] + u[..., 3])


def gemv_bf16_rows(x: np.ndarray, packed: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int,
                   N: int) -> np.ndarray:
    """Twin, bit for bit, of csrc/cpu/fourbit.cpp ``gemv_bf16_rows_portable`` / ``gemv_bf16_rows_avx512bf16``: one
    activation row (K a multiple of 64 and of the blocksize, a power of two >= 64): w = bf16(code[q]),
    each 128-element unit in halves h = 0, 1 of 64 elements (the last unit of K = 64 (2 j + 1): half 0 alone); lane l's chain s_h takes, from 0 in each unit,
    elements 4l + 2, 4l, 4l + 3, 4l + 1 of the half (its even-element vector, then its odd one; vdpbf16ps: the odd
    word of a pair first, ftz after each fma); acc_h += s_h * the absmax of the half's block (one fma); the lanes of
    acc_0 + acc_1 reduced as the table kernel's."""
    K = x.shape[0]
    wc = bf16_bits_f32(bf16_round_bits(np.asarray(code, np.float32), flush=True))
    q = unpack_4bit(np.asarray(packed, np.uint8).reshape(-1), N * K).reshape(N, K)
    l4 = 4 * np.arange(16)
    acc = [np.zeros((N, 16), np.float32), np.zeros((N, 16), np.float32)]
    am = absmax.reshape(N, K // blocksize)
    for u in range(0, K, 128):
        for h in (0, 1) if K - u >= 128 else (0,):  # a K of an odd number of 64s ends in a half unit
            base = u + 64 * h
            sv = np.zeros((N, 16), np.float32)
            for off in (2, 0, 3, 1):
                e = base + l4 + off  # [16] element per lane
                sv = ftz32(fma_f32(wc[q[:, e]], x[e][None, :], sv))
            acc[h] = fma_f32(sv, am[:, base // blocksize][:, None].astype(np.float32), acc[h])
    return lanes_reduce((acc[0] + acc[1]).astype(np.float32))


def dot_rows_bf16(x, packed, absmax, code, blocksize, N, K):
    """Twin, bit for bit, of csrc/cpu/fourbit.cpp ``dot_rows_bf16_portable`` / ``dot_rows_bf16_avx512bf16`` (the
    table kernel of :func:`linear_4bit_bf16dot`, with ``decode_row_bf16_*``'s weights): fp32 [M, N] before rounding."""
    w = bf16_bits_f32(bf16_round_bits(dequantize_4bit(packed, absmax, code, blocksize, N * K), flush=True))
    M, K32 = x.shape[0], -(-K // 32) * 32
    xp = np.zeros((M, K32), np.float32)
    xp[:, :K] = x
    wp = np.zeros((N, K32), np.float32)
    wp[:, :K] = w.reshape(N, K)
    xp = xp.reshape(M, K32 // 32, 16, 2)
    wp = wp.reshape(N, K32 // 32, 16, 2)
    acc = np.zeros((M, N, 16), np.float32)
    for c in range(K32 // 32):
        for e in (1, 0):
            acc = ftz32(fma_f32(wp[None, :, c, :, e], xp[:, None, c, :, e], acc))
    return lanes_reduce(acc)


def gemm_panel_bf16(x: np.ndarray, W: np.ndarray, bias=None) -> np.ndarray:
    """Twin, bit for bit, of ``gemm_panel_bf16`` (csrc/cpu/gemm_panel.h: the fused decoder's 4-bit prefill in
    bf16, ``cdecoder_*_fp32_bf16dot`` above 8 rows; ``gemm_panel_bf16_portable`` / ``gemm_panel_bf16_avx512bf16``): fp32 ``x`` [M, K] and ``W`` [N, K] rounded to bf16 (nearest
    even, bf16 denormals flushed; an odd K padded with 0); per output one chain over the pairs p, as vdpbf16ps
    runs it: acc = ftz(fma(w[2p+1], x[2p+1], acc)), then acc = ftz(fma(w[2p], x[2p], acc)); + ``bias`` [N]
    (fp32 add). Returns float32 [M, N]."""
    x = np.asarray(x, np.float32)
    W = np.asarray(W, np.float32)
    M, K = x.shape
    N, K2 = W.shape[0], -(-K // 2)
    xp = np.zeros((M, 2 * K2), np.float32)
    wp = np.zeros((N, 2 * K2), np.float32)
    xp[:, :K] = bf16_bits_f32(bf16_round_bits(x, flush=True))
    wp[:, :K] = bf16_bits_f32(bf16_round_bits(W, flush=True))
    xp, wp = xp.reshape(M, K2, 2), wp.reshape(N, K2, 2)
    acc = np.zeros((M, N), np.float32)
    for p in range(K2):
        for e in (1, 0):
            acc = fma_f32(wp[None, :, p, e], xp[:, None, p, e], acc)
            acc = np.where(np.abs(acc) < _FLT_MIN, np.copysign(np.float32(0), acc), acc).astype(np.float32)
    if bias is not None:
        acc = (acc + np.asarray(bias, np.float32).reshape(-1)).astype(np.float32)
    return acc


def int8_vector_quant(A: np.ndarray, threshold: float = 0.0, dtype: str = "float32"):
    """Twin of ``cint8_vector_quant``: returns (int8 CA shaped like A, float32 row_stats[rows],
    uint8 col_flags[K]). ``A`` holds the values (float32 widening of the input); ``dtype`` is the
    input dtype, to which the threshold is rounded before comparing (as torch compares). A row holding
    a NaN has a NaN row_stat and all-zero codes (upstream: torch.max propagates NaN)."""
    A = np.asarray(A, dtype=np.float32)
    K = A.shape[-1]
    a = A.reshape(int(np.prod(A.shape[:-1])), K)
    rows = a.shape[0]
    absa = np.abs(a)
    flags = np.zeros(K, np.uint8)
    outl = np.zeros_like(a, dtype=bool)
    if threshold > 0:
        thr = np.float32(convert_span(np.array([threshold], np.float32), dtype).astype(np.float32)[0])
        outl = absa >= thr
        flags = outl.any(axis=0).astype(np.uint8)
    masked = np.where(outl, np.float32(0), absa)
    stats = masked.max(axis=1).astype(np.float32) if K else np.zeros(rows, np.float32)
    # a NaN (never an outlier) makes the row's absmax NaN, as torch.max: the one quiet NaN 0x7fc00000
    stats[np.isnan(stats)] = np.float32(np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        # torch's `127.0 / row_stats` (scalar / tensor) is reciprocal(row_stats) * 127: two roundings
        scale = ((np.float32(1.0) / stats).astype(np.float32) * np.float32(127.0)).astype(np.float32)
        q = np.rint((a * scale[:, None]).astype(np.float32))
    q = np.where(np.isfinite(q), q, 0)
    q[outl] = 0
    if rows > 1 and flags.any():
        q[:, flags.astype(bool)] = 0
    return q.astype(np.int8).reshape(A.shape), stats, flags


def int8_gemm(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Twin of ``cigemmlt_32``: exact ``A @ B.T`` (int8 inputs, int32 result), A [..., K], B [N, K]."""
    A = np.asarray(A, np.int64)
    B = np.asarray(B, np.int64)
    return (A.reshape(-1, A.shape[-1]) @ B.T).astype(np.int32).reshape(A.shape[:-1] + (B.shape[0],))


MM_DEQUANT_SCALE = np.float32(6.200124e-05)


def int8_mm_dequant(A: np.ndarray, row_stats: np.ndarray, col_stats: np.ndarray, bias=None,
                    dtype: str = "float16") -> np.ndarray:
    """Twin of ``cdequant_mm_int32_<dtype>``: float(A) * (row * col) * 6.200124e-05 (+ bias), each
    step rounded in float32, then rounded to ``dtype``."""
    A = np.asarray(A, np.int32)
    a = A.reshape(-1, A.shape[-1]).astype(np.float32)
    rc = (np.asarray(row_stats, np.float32).reshape(-1, 1) * np.asarray(col_stats, np.float32).reshape(1, -1))
    v = ((a * rc.astype(np.float32)).astype(np.float32) * MM_DEQUANT_SCALE).astype(np.float32)
    if bias is not None:
        v = (v + np.asarray(bias, np.float32).reshape(1, -1)).astype(np.float32)
    return convert_span(v, dtype).reshape(A.shape)

INT8_DEQUANT_SCALE = np.float32(7.874015718698502e-3)  # float32(1 / 127)


MIXED_BLOCK = 192  # outlier columns per block of the outlier sum (torch's fp32 addmm on x86, see below)


def mixed_block_size(n_cols: int) -> int:
    """Outlier columns per block of :func:`int8_mixed_mm_dequant`'s sum: 192, or half of them (rounded up)
    when there are between 192 and 384 (exclusive) -- the k blocking of torch 2.13's fp32 GEMM measured on
    an AVX2 host (odd counts between 193 and 383 split differently there; not reproduced)."""
    return (n_cols + 1) // 2 if MIXED_BLOCK < n_cols < 2 * MIXED_BLOCK else MIXED_BLOCK


def add_x86(a, b) -> np.ndarray:
    """float32 ``a + b`` with x86's NaN rule spelled out: where ``a`` is NaN the result is ``a`` (quieted), where
    only ``b`` is, ``b``; inf - inf the default NaN. numpy's own ``a + b`` gives ``b``'s NaN in its SIMD loop and
    ``a``'s in its scalar one (and a compiler may swap the operands of an add), so the kernels' ``add_x86_*`` and
    this twin choose explicitly."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    with np.errstate(all="ignore"):
        r = np.asarray(a + b, np.float32)
    an = np.isnan(a)
    if np.any(an):
        r = np.where(an, (a.view(np.uint32) | np.uint32(0x00400000)).view(np.float32), r)
    return r


def fma_x86(a, b, c) -> np.ndarray:
    """:func:`fma_f32` (one rounding) where the result is a number; where it is NaN, the NaN of ``c + a * b``
    computed in two float32 steps, ``c``'s NaN first (:func:`add_x86`; x86's fma gives its addend's NaN first too),
    as the int8 kernels' ``fma_x86_portable`` / ``fma_x86_avx2`` / ``fma_x86_avx512``."""
    a, b, c = (np.asarray(v, np.float32) for v in (a, b, c))
    r = fma_f32(a, b, c)
    bad = np.isnan(r)
    if np.any(bad):
        with np.errstate(all="ignore"):
            r = np.where(bad, add_x86(c, (a * b).astype(np.float32)), r)
    return r


def int8_mixed_mm_dequant(C: np.ndarray, row_stats: np.ndarray, col_stats: np.ndarray, bias, A: np.ndarray,
                          CB: np.ndarray, col_flags: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """Twin of ``cint8_mixed_mm_dequant_<dtype>``: the int8 product ``C`` dequantized plus the outlier columns
    (``col_flags`` nonzero) of ``A`` times the dequantized weight columns. No flagged column: exactly
    :func:`int8_mm_dequant` in ``dtype``. Otherwise, in float32: ``d`` = the float32 mm dequant (+ bias),
    ``w[n, j] = (float(CB[n, j]) * col_stats[n]) * float32(1/127)`` (int8_vectorwise_dequant), and the
    flagged columns, ascending, in blocks of :func:`mixed_block_size` columns: per block ``acc`` starts at 0 and
    takes ``acc = fma(A[:, j], w[:, j], acc)`` column by column (:func:`fma_x86`), then ``d = d + acc``
    (:func:`add_x86`); ``out = dtype(d)``.
    For float32 this is upstream's ``output.addmm(subA, subB)`` bit for bit (torch 2.13's fp32 GEMM on an
    AVX2 host from 5 rows; fewer rows take another kernel there, which differs in the last bit).
    ``A`` holds the activation values (float32 widening of the input)."""
    C = np.asarray(C, np.int32)
    N = C.shape[-1]
    flags = np.asarray(col_flags).reshape(-1)
    cols = np.nonzero(flags)[0]
    if cols.size == 0:
        return int8_mm_dequant(C, row_stats, col_stats, bias, dtype)
    f32 = np.float32
    d = int8_mm_dequant(C, row_stats, col_stats, bias, "float32").reshape(-1, N)
    a = np.asarray(A, f32).reshape(d.shape[0], -1)
    cs = np.asarray(col_stats, f32).reshape(-1)
    with np.errstate(all="ignore"):
        w = ((np.asarray(CB, np.int8)[:, cols].astype(f32) * cs[:, None]).astype(f32) * INT8_DEQUANT_SCALE).astype(f32)
        bs = mixed_block_size(int(cols.size))
        for b0 in range(0, cols.size, bs):
            acc = np.zeros_like(d)
            for t in range(b0, min(cols.size, b0 + bs)):
                acc = fma_x86(a[:, cols[t]][:, None], w[:, t][None, :], acc)
            d = add_x86(d, acc)
    return convert_span(d, dtype).reshape(C.shape)


def int8_linear(A: np.ndarray, CB: np.ndarray, SCB: np.ndarray, bias=None, threshold: float = 0.0,
                dtype: str = "float32"):
    """Twin of ``cint8_linear_<dtype>`` (LLM.int8() linear forward): returns (out [..., N] in ``dtype``,
    uint8 col_flags [K]). ``A`` holds the activation values of dtype ``dtype``; float32 activations are
    quantized after rounding to float16 (``A.to(float16)`` upstream), others as they are; then
    :func:`int8_vector_quant` (outlier columns for ``threshold > 0``), :func:`int8_gemm` and, for
    ``threshold > 0``, :func:`int8_mixed_mm_dequant` on the unrounded activations, else :func:`int8_mm_dequant`."""
    A = np.asarray(A, np.float32)
    K = A.shape[-1]
    a = rows_2d(A, K)
    if dtype == "float32":
        q_in, q_dtype = a.astype(np.float16).astype(np.float32), "float16"
    else:
        q_in, q_dtype = a, dtype
    CA, SCA, flags = int8_vector_quant(q_in, threshold, q_dtype)
    C = int8_gemm(CA, CB)
    if threshold > 0:
        out = int8_mixed_mm_dequant(C, SCA, SCB, bias, a, CB, flags, dtype)
    else:
        out = int8_mm_dequant(C, SCA, SCB, bias, dtype)
    return out.reshape(A.shape[:-1] + (np.asarray(CB).shape[0],)), flags


# ---- weight-only int8/int4 (W8A16/W4A16) ----
from typing import Tuple  # noqa: E402


def quantize_weight_only(W: np.ndarray, bits: int) -> Tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric absmax: scale = max|W[n]| / qmax (qmax 127 or 7, fp32), q = round-half-even(W / scale)
    clamped (0 where scale == 0). int8 -> int8 [N, K]; int4 -> uint8 [N, (K+1)//2], two's-complement nibbles,
    k even in the high nibble, odd K padded with 0. Non-finite rows as torch: NaN propagates into the scale
    (the quiet NaN 0x7fc00000), and every code whose quotient is NaN (inf / inf, a NaN scale) is 0."""
    W = np.asarray(W, dtype=np.float32)
    N, K = W.shape
    qmax = np.float32(127.0 if bits == 8 else 7.0)
    scale = (np.abs(W).max(axis=1) if K else np.zeros(N)).astype(np.float32) / qmax
    scale = scale.astype(np.float32)
    scale[np.isnan(scale)] = np.float32("nan")
    with np.errstate(all="ignore"):
        q = np.where(scale[:, None] > 0, np.rint(W / scale[:, None]), 0.0)
    q = np.clip(np.nan_to_num(q, nan=0.0), -qmax, qmax).astype(np.int8)
    if bits == 8:
        return q, scale
    if K % 2:
        q = np.concatenate([q, np.zeros((N, 1), np.int8)], axis=1)
    u = q.view(np.uint8) & 0xF
    return ((u[:, 0::2] << 4) | u[:, 1::2]).astype(np.uint8), scale


def unpack_weight_only_int4(q: np.ndarray, K: int) -> np.ndarray:
    """uint8 [N, (K+1)//2] -> int8 [N, K] (sign-extended nibbles)."""
    q = np.asarray(q, dtype=np.uint8)
    out = np.empty((q.shape[0], q.shape[1] * 2), np.int8)
    out[:, 0::2] = q.view(np.int8) >> 4
    out[:, 1::2] = (q << 4).view(np.int8) >> 4
    return out[:, :K]


def dequantize_weight_only(q: np.ndarray, scale: np.ndarray, K: int, bits: int, dtype: str = "float32") -> np.ndarray:
    qi = np.asarray(q, np.int8) if bits == 8 else unpack_weight_only_int4(q, K)
    return convert_span((qi.astype(np.float32) * np.asarray(scale, np.float32)[:, None]).astype(np.float32), dtype)


def gemm_weight_only(A: np.ndarray, q: np.ndarray, scale: np.ndarray, bits: int, dtype: str = "float32") -> np.ndarray:
    """out[..., n] = scale[n] * sum_k A[..., k] q[n, k], accumulated in float64, rounded to ``dtype``
    (the kernel's 16-lane fp32 sum differs from this by rounding only)."""
    A = np.asarray(A, dtype=np.float32)
    K = A.shape[-1]
    qi = np.asarray(q, np.int8) if bits == 8 else unpack_weight_only_int4(q, K)
    out = (rows_2d(A, K).astype(np.float64) @ qi.astype(np.float64).T) * np.asarray(scale, np.float64)[None, :]
    return convert_span(out.astype(np.float32), dtype).reshape(A.shape[:-1] + (qi.shape[0],))


# ---- fused decoder layers (cdecoder_*_fp32, crms_norm_fp32) ----
# A linear spec is (W, absmax, code, absmax2, code2, offset, bias, blocksize, blocksize2) as in _native_table.LINEAR_SPEC:
# W fp32 [N, K], or the packed 4-bit bytes with fp32 absmax or double-quant codes.
def _spec_absmax(spec) -> np.ndarray:
    """A 4-bit linear spec's fp32 absmax per block (double quant: :func:`nested_absmax`)."""
    _W, absmax, _code, absmax2, code2, offset, _bias, _bs, bs2 = spec
    if absmax2 is None:
        return np.asarray(absmax, np.float32).reshape(-1)
    return nested_absmax(absmax, code2, absmax2, offset, int(bs2))


def linear_spec_weight(spec, N: int, K: int) -> np.ndarray:
    """The fp32 [N, K] weight a linear spec stands for (fp32, fp16/bf16 widened, or 4-bit dequantized)."""
    W, _absmax, code, _a2, _c2, _off, _bias, bs, _bs2 = spec
    W = np.asarray(W)
    if W.dtype.name in ("float32", "float16", "bfloat16"):  # (ml_dtypes' or MindSpore's bfloat16)
        return W.astype(np.float32).reshape(N, K)
    return dequantize_4bit(W, _spec_absmax(spec), code, int(bs), N * K).reshape(N, K)


def linear4_bf16_gemv_f32(x: np.ndarray, spec, N: int) -> np.ndarray:
    """Twin of the fused decoder's one-row bf16 GEMV (a 4-bit spec through ``cdecoder_*_fp32_bf16dot`` at one row,
    K a multiple of 64 and of the blocksize: csrc/cpu/fourbit.cpp ``linear4_bf16_gemv_f32``): x [K] rounded to
    bf16 (flushed), :func:`gemv_bf16_rows`'s fp32 result, the bias added in fp32 (not rounded to bf16)."""
    W, _absmax, code, _a2, _c2, _off, bias, bs, _bs2 = spec
    xb = bf16_bits_f32(bf16_round_bits(np.asarray(x, np.float32).reshape(1, -1), flush=True))[0]
    r = gemv_bf16_rows(xb, W, _spec_absmax(spec), code, int(bs), N)
    if bias is not None:
        r = (r + np.asarray(bias).astype(np.float32)).astype(np.float32)
    return r


def linear_spec(x: np.ndarray, spec, N: int) -> np.ndarray:
    """x [..., K] @ W.T + bias in float64, rounded to fp32; an int8 spec (CB, SCB, the threshold in the offset
    slot) gives :func:`int8_linear`'s bytes on fp32 x."""
    x = np.asarray(x, np.float32)
    K = x.shape[-1]
    W = np.asarray(spec[0])
    if W.dtype == np.int8:
        thr = 0.0 if spec[5] is None else float(np.asarray(spec[5], np.float32))
        bias = None if spec[6] is None else np.asarray(spec[6]).astype(np.float32)
        out, _ = int8_linear(rows_2d(x, K), W.reshape(N, K), np.asarray(spec[1], np.float32).reshape(N), bias, thr)
        return np.asarray(out, np.float32).reshape(x.shape[:-1] + (N,))
    out = rows_2d(x, K).astype(np.float64) @ linear_spec_weight(spec, N, K).astype(np.float64).T
    if spec[6] is not None:
        out = out + np.asarray(spec[6]).astype(np.float64)
    return out.astype(np.float32).reshape(x.shape[:-1] + (N,))


# ---- the fused decoder (cdecoder_*): the unfused model's rounding on MindSpore 2.7's CPU kernels (simd_math.h) ----
_LN2_MS = np.float32(0.693147)
_EXP_P = (np.float32(1.0) / np.float32(120), np.float32(1.0) / np.float32(24), np.float32(1.0) / np.float32(6))


def exp_ms(x) -> np.ndarray:
    """MindSpore's CPU exp (csrc/cpu/simd_math.h ``exp_ms_portable`` / ``exp_ms_avx2``): x clamped to
    [-87.3365478515625, 88.72283935546875], n = floor(x * log2(e) + 0.5), d = fma(-n, 0.693147f, x), a degree-5
    polynomial in fmas, times 2^(n-1), times 2 (n = -126 gives 0); NaN stays NaN."""
    x = np.asarray(x, np.float32)
    c = np.clip(x, np.float32(-87.3365478515625), np.float32(88.72283935546875))
    n = np.floor((c * np.float32(1.44269504088896341)).astype(np.float32) + np.float32(0.5)).astype(np.float32)
    d = fma_f32(-n, _LN2_MS, c)
    t = fma_f32(d, fma_f32(d, _EXP_P[0], _EXP_P[1]), _EXP_P[2])
    t = fma_f32(d, fma_f32(d, t, np.float32(0.5)), np.float32(1.0))
    e = fma_f32(d, t, np.float32(1.0))
    scale = ((n.astype(np.int32) + 126) << 23).astype(np.int32).view(np.float32)
    with np.errstate(over="ignore"):
        y = ((e * scale).astype(np.float32) * np.float32(2)).astype(np.float32)
    return np.where(np.isnan(x), x, y)


def r16(x) -> np.ndarray:
    """x rounded to fp16 and widened back (an fp16 model's op result: simd_math.h's r16 / round16)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def exp16(x) -> np.ndarray:
    """The exp of MindSpore's fp16 CPU kernels (Sigmoid, Softmax): glibc's expf of the fp32 value, rounded to fp16
    (expf's result here as the correctly rounded exp; fp16's rounding absorbs what they could differ by)."""
    return r16(np.exp(np.asarray(x, np.float32).astype(np.float64)).astype(np.float32))


def sigmoid16(x) -> np.ndarray:
    """MindSpore's fp16 Sigmoid on CPU: r16(1 / r16(1 + exp16(-x))) (simd_math.h's silu_mul_r16)."""
    x = np.asarray(x, np.float32)
    return r16(np.float32(1) / r16(np.float32(1) + exp16(-x)))


def softmax16(s) -> np.ndarray:
    """MindSpore's fp16 Softmax on CPU over the last axis (simd_math.h's softmax_row_r16): e = exp16(r16(s - max)),
    the sum of e in fp32 in order, p = r16(e / r16(sum))."""
    s = np.asarray(s, np.float32)
    e = exp16(r16(s - s.max(-1, keepdims=True)))
    tot = np.zeros(s.shape[:-1], np.float32)
    for j in range(s.shape[-1]):
        tot = (tot + e[..., j]).astype(np.float32)
    return r16(e / r16(tot)[..., None])


def softmax_sum(e: np.ndarray) -> np.ndarray:
    """MindSpore's Softmax sum over the last axis (simd_math.h's softmax_sum): 8 lanes over the whole 8-blocks,
    lanes added in order, the next 4 values (if 4 remain) as one ordered sum, then one by one."""
    e = np.asarray(e, np.float32)
    L = e.shape[-1]
    L8 = L // 8 * 8
    lanes = np.zeros(e.shape[:-1] + (8,), np.float32)
    for j in range(0, L8, 8):
        lanes = (lanes + e[..., j:j + 8]).astype(np.float32)
    tot = np.zeros(e.shape[:-1], np.float32)
    for k in range(8):
        tot = (tot + lanes[..., k]).astype(np.float32)
    j = L8
    if L - L8 >= 4:
        t4 = np.zeros_like(tot)
        for k in range(L8, L8 + 4):
            t4 = (t4 + e[..., k]).astype(np.float32)
        tot = (tot + t4).astype(np.float32)
        j = L8 + 4
    for k in range(j, L):
        tot = (tot + e[..., k]).astype(np.float32)
    return tot


def square_powf(x) -> np.ndarray:
    """glibc's powf(x, 2) (MindSpore's Pow): the rounded x * x, except where the exact square lies within 0.01 ulp
    of a tie, where libm's powf itself is called (it rounds ~0.07% of the squares the other way)."""
    import ctypes

    x = np.asarray(x, np.float32)
    p = (x * x).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        err = x.astype(np.float64) ** 2 - p.astype(np.float64)
        half = np.spacing(p).astype(np.float64) / 2
        near = ~(p >= np.float32(2.0 ** -100)) | ~np.isfinite(p) | (np.abs(np.abs(err) - half) <= 0.02 * half)
    if np.any(near):
        powf = ctypes.CDLL("libm.so.6").powf
        powf.restype, powf.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
        p = p.copy()
        p[near] = [powf(float(v), 2.0) for v in x[near]]
    return p


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """HF's LlamaRMSNorm in fp32 as MindSpore computes it for a rank >= 3 tensor: var = float(sum of
    powf(x, 2) in double) / H (fp32), then w * (x * (1 / sqrt(var + eps))) (w fp32, or fp16/bf16 widened)."""
    x = np.asarray(x, np.float32)
    ss = np.zeros(x.shape[:-1], np.float64)
    sq = square_powf(x).astype(np.float64)
    for i in range(x.shape[-1]):
        ss = ss + sq[..., i]
    var = (ss.astype(np.float32) / np.float32(x.shape[-1])).astype(np.float32)[..., None]
    return (np.asarray(w).astype(np.float32) * (x * (np.float32(1) / np.sqrt(var + np.float32(eps))))).astype(np.float32)


def _rope(v: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray, rope_scale: float) -> np.ndarray:
    """v [B, T, nh, D]; HF's rotate_half convention (default rope type); cos / sin as MindSpore's: the double
    function rounded."""
    f = pos.astype(np.float32)[..., None] * np.asarray(inv_freq, np.float32)  # [B, T, D/2]
    emb = np.concatenate([f, f], axis=-1).astype(np.float64)
    cos = (np.cos(emb).astype(np.float32) * np.float32(rope_scale)).astype(np.float32)[:, :, None, :]
    sin = (np.sin(emb).astype(np.float32) * np.float32(rope_scale)).astype(np.float32)[:, :, None, :]
    h = v.shape[-1] // 2
    rot = np.concatenate([-v[..., h:], v[..., :h]], axis=-1)
    return ((v * cos).astype(np.float32) + (rot * sin).astype(np.float32)).astype(np.float32)


def pv_chunk_end(c0: int, L: int) -> int:
    """MindSpore's BatchMatMul sums over L in chunks (decoder.cpp's pv_chunk_end): 384 while more than 768 remain,
    then two halves (the first ceil) or, at most 384 left, one."""
    rest = L - c0
    return c0 + 384 if rest > 768 else c0 + (rest + 1) // 2 if rest > 384 else L


def _chain(a: np.ndarray, b: np.ndarray, L: int) -> np.ndarray:
    """a [..., M, K] @ b [..., K, N] as MindSpore's BatchMatMul: one fma chain per chunk of K, chunks added."""
    out = None
    c0 = 0
    while c0 < L:
        c1 = pv_chunk_end(c0, L)
        acc = np.zeros(a.shape[:-1] + (b.shape[-1],), np.float32)
        for k in range(c0, c1):
            acc = fma_f32(a[..., :, k:k + 1], b[..., k:k + 1, :], acc)
        out = acc if out is None else (out + acc).astype(np.float32)
        c0 = c1
    return out


def decoder_attention(x, positions, key_mask, k_cache, v_cache, norm_w, inv_freq, q, k, v, o, past: int,
                      n_heads: int, eps: float, scaling: float, rope_scale: float = 1.0, window: int = 0,
                      q_norm_w=None, k_norm_w=None):
    """Twin of ``cdecoder_attention_fp32``: returns ``x + O(attention)`` [B, T, H] and writes the new keys and
    values into ``k_cache``/``v_cache`` [B, KVH, S_max, D] at [past, past + T) (in place, as the kernel does).
    q/k/v/o are linear specs; key_mask [B, >= past + T] (nonzero = attend; its first past + T columns) or None;
    window 0 = no sliding window. The attention in the prefill's order (scores one fma chain over d; the decode
    rows' scores, four chains in the kernel, agree within rounding)."""
    x = np.asarray(x, np.float32)
    B, T, H = x.shape
    KVH, D = k_cache.shape[1], k_cache.shape[3]
    L = past + T
    y = rms_norm(x, norm_w, eps)
    qs = linear_spec(y, q, n_heads * D).reshape(B, T, n_heads, D)
    ks = linear_spec(y, k, KVH * D).reshape(B, T, KVH, D)
    vs = linear_spec(y, v, KVH * D).reshape(B, T, KVH, D)
    if q_norm_w is not None:
        qs = rms_norm(qs, q_norm_w, eps)
    if k_norm_w is not None:
        ks = rms_norm(ks, k_norm_w, eps)
    pos = np.asarray(positions).reshape(B, T)
    qs, ks = _rope(qs, pos, inv_freq, rope_scale), _rope(ks, pos, inv_freq, rope_scale)
    k_cache[:, :, past:L] = ks.transpose(0, 2, 1, 3)
    v_cache[:, :, past:L] = vs.transpose(0, 2, 1, 3)
    rep = n_heads // KVH
    kk = np.repeat(k_cache[:, :, :L], rep, axis=1)  # [B, Hq, L, D]
    vv = np.repeat(v_cache[:, :, :L], rep, axis=1)
    s = (_chain(qs.transpose(0, 2, 1, 3), kk.transpose(0, 1, 3, 2), D) * np.float32(scaling)).astype(np.float32)
    qi = past + np.arange(T)[:, None]
    j = np.arange(L)[None, :]
    vis = j <= qi
    if window:
        vis = vis & (qi - j < window)
    vis = np.broadcast_to(vis, (B, 1, T, L))
    if key_mask is not None:
        vis = vis & (np.asarray(key_mask)[:, :L].reshape(B, 1, 1, L) != 0)
    s = np.where(vis, s, -np.inf).astype(np.float32)
    mx = s.max(-1, keepdims=True)
    e = np.where(vis, exp_ms(s - np.where(np.isfinite(mx), mx, 0)), 0.0).astype(np.float32)
    den = softmax_sum(e)[..., None]
    p = np.where(den > 0, e * (np.float32(1) / np.where(den > 0, den, 1)), 0.0).astype(np.float32)
    attn = _chain(p, vv, L).transpose(0, 2, 1, 3).reshape(B, T, n_heads * D)
    return (x + linear_spec(attn, o, H)).astype(np.float32)


def decoder_mlp(x, norm_w, gate, up, down, intermediate: int, eps: float):
    """Twin of ``cdecoder_mlp_fp32``: x + Down((g * sigmoid(g)) * Up(y)), g = Gate(y), y = RMSNorm(x),
    sigmoid = 1 / (1 + exp_ms(-g)) (MindSpore's SiLU as mindtorch composes it)."""
    x = np.asarray(x, np.float32)
    y = rms_norm(x, norm_w, eps)
    g = linear_spec(y, gate, intermediate)
    u = linear_spec(y, up, intermediate)
    sg = (np.float32(1) / (np.float32(1) + exp_ms(-g))).astype(np.float32)
    a = ((g * sg).astype(np.float32) * u).astype(np.float32)
    return (x + linear_spec(a, down, x.shape[-1])).astype(np.float32)


# ---- full-precision linear (cgemm_fp_*) ----
def fma_f32(a, b, c) -> np.ndarray:
    """float32 fused multiply-add ``round_f32(a * b + c)`` (one rounding), elementwise, exactly.

    ``a * b`` is exact in float64 (24 + 24 mantissa bits); ``s = p + c`` is rounded to float64, its error
    ``e`` recovered exactly (TwoSum) and ``s`` moved to round-to-odd (the odd neighbour on ``e``'s side
    when ``s`` is even and inexact); rounding a round-to-odd float64 to float32 is the correctly rounded
    result (53 >= 24 + 2 bits; Boldo & Melquiond). Non-finite sums are passed through."""
    a = np.asarray(a, np.float32).astype(np.float64)
    b = np.asarray(b, np.float32).astype(np.float64)
    c = np.asarray(c, np.float32).astype(np.float64)
    p = a * b
    s = p + c
    with np.errstate(invalid="ignore"):
        bb = s - p
        e = (p - (s - bb)) + (c - bb)
        fix = np.isfinite(s) & (e != 0) & ((s.view(np.int64) & 1) == 0)
    if np.any(fix):
        s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    with np.errstate(over="ignore"):  # beyond float32's range: inf, as the kernel's fma
        return s.astype(np.float32)


def gemm_fp(A: np.ndarray, W: np.ndarray, bias=None, dtype: str = "float32") -> np.ndarray:
    """Twin of ``cgemm_fp_*``: ``out[..., n] = A[..., k] @ W[n, k]^T (+ bias)``, in the kernel's order.

    With a = fp32(A[m]), w = fp32(W[n]) (fp16/bf16 widen exactly):
      acc[l] = 0 (l = 0..15); for k = 0..K-1: acc[k % 16] = fma(a[k], w[k], acc[k % 16])
      u[i] = acc[i] + acc[i + 8] (i < 8); t[i] = u[i] + u[i + 4] (i < 4); r = (t[0] + t[2]) + (t[1] + t[3])
      out = round_dtype(r) or round_dtype(r + fp32(bias[n]))      (float32 arithmetic throughout)
    """
    A = np.asarray(A, dtype=np.float32)
    W = np.asarray(W, dtype=np.float32)
    K = A.shape[-1]
    N = W.shape[0]
    a = rows_2d(A, K)
    acc = np.zeros((a.shape[0], N, 16), np.float32)
    for k0 in range(0, K, 16):
        L = min(16, K - k0)
        acc[:, :, :L] = fma_f32(a[:, None, k0:k0 + L], W[None, :, k0:k0 + L], acc[:, :, :L])
    u = acc[..., :8] + acc[..., 8:]
    t = u[..., :4] + u[..., 4:]
    r = (t[..., 0] + t[..., 2]) + (t[..., 1] + t[..., 3])
    if bias is not None:
        r = r + np.asarray(bias, np.float32).reshape(1, N)
    return convert_span(r.astype(np.float32), dtype).reshape(A.shape[:-1] + (N,))
