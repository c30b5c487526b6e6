"""Pure-numpy reference implementations of every native op (the executable spec).

Each function here computes, in numpy, exactly what the native entry point of the same name in
:mod:`bitsandbytes_ms._ops` computes (same bytes where the algorithm is deterministic). Tests compare
the two on random inputs; upstream bitsandbytes' vectors (``compat_tests/fixtures``) pin both.

Floating-point inputs are taken as float32 arrays (fp16/bf16 values widen exactly); outputs in a
16-bit dtype are rounded to nearest even, as the kernels do.
"""

from __future__ import annotations

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


def cast_out(x: np.ndarray, dtype: str) -> np.ndarray:
    """Rounds float32 values to ``dtype`` ("float32" | "float16" | "bfloat16")."""
    if dtype == "float32":
        return x.astype(np.float32)
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        return x.astype(np_bfloat16)
    raise ValueError(dtype)


# ---------------------------------------------------------------------------------------------
# Blockwise 8-bit quantization
# ---------------------------------------------------------------------------------------------
def quantize_lut(code: np.ndarray) -> np.ndarray:
    """The 65536-bin grid on [-1, 1] -> index of the nearest code entry (ties to the lower index)."""
    code = np.asarray(code, dtype=np.float32)
    mid = (np.float32(0.5) * (code[:-1] + code[1:])).astype(np.float32)
    i = np.arange(LUT_SIZE, dtype=np.float32)
    grid = (np.float32(-1.0) + (np.float32(2.0) * i) / np.float32(LUT_SIZE - 1)).astype(np.float32)
    return np.searchsorted(mid, grid, side="left").astype(np.uint8)


def grid_index(v: np.ndarray) -> np.ndarray:
    """idx = trunc(fma((clamp(v) + 1) * 0.5, 65535, 0.5)) in float32 arithmetic."""
    v = np.clip(v.astype(np.float32), np.float32(-1.0), np.float32(1.0))
    t = ((v + np.float32(1.0)) * np.float32(0.5)).astype(np.float32)
    fused = (t.astype(np.float64) * (LUT_SIZE - 1) + 0.5).astype(np.float32)  # exact, then one rounding
    return fused.astype(np.int64)


def quantize_blockwise(A: np.ndarray, code: np.ndarray, blocksize: int):
    """Returns (uint8 codes shaped like A, float32 absmax[ceil(n/blocksize)])."""
    flat = np.asarray(A, dtype=np.float32).reshape(-1)
    n = flat.size
    nblocks = -(-n // blocksize)
    pad = np.zeros(nblocks * blocksize, dtype=np.float32)
    pad[:n] = flat
    blocks = pad.reshape(nblocks, blocksize)
    absmax = np.abs(blocks).max(axis=1).astype(np.float32) if n else np.zeros(0, np.float32)
    safe = np.where(absmax == 0, np.float32(1.0), absmax)
    inv = (np.float32(1.0) / safe).astype(np.float32)
    scaled = (blocks * inv[:, None]).astype(np.float32)
    q = quantize_lut(code)[grid_index(scaled)]
    q[absmax == 0] = 0
    return q.reshape(-1)[:n].reshape(np.shape(A)), absmax


def dequantize_blockwise(A: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int,
                         dtype: str = "float32") -> np.ndarray:
    """out = code[A] * absmax[block], rounded to ``dtype``."""
    q = np.asarray(A, dtype=np.uint8).reshape(-1)
    scale = np.repeat(np.asarray(absmax, dtype=np.float32), blocksize)[: q.size]
    vals = (np.asarray(code, dtype=np.float32)[q] * scale).astype(np.float32)
    return cast_out(vals, dtype).reshape(np.shape(A))


# ---- int8 (LLM.int8()) ----
def int8_vector_quant(A: np.ndarray, threshold: float = 0.0, dtype: str = "float32"):
    """Twin of ``cint8_vector_quant``: returns (int8 CA shaped like A, float32 row_stats[rows],
    uint8 col_flags[K]). ``A`` holds the values (float32 widening of the input); ``dtype`` is the
    input dtype, to which the threshold is rounded before comparing (as torch compares)."""
    A = np.asarray(A, dtype=np.float32)
    K = A.shape[-1]
    a = A.reshape(-1, K)
    rows = a.shape[0]
    absa = np.abs(a)
    flags = np.zeros(K, np.uint8)
    outl = np.zeros_like(a, dtype=bool)
    if threshold > 0:
        thr = np.float32(cast_out(np.array([threshold], np.float32), dtype).astype(np.float32)[0])
        outl = absa >= thr
        flags = outl.any(axis=0).astype(np.uint8)
    masked = np.where(outl, np.float32(0), absa)
    stats = masked.max(axis=1).astype(np.float32) if K else np.zeros(rows, np.float32)
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
    return cast_out(v, dtype).reshape(A.shape)
