"""The weight-only format's one door (W8A16 / W4A16: int8 or int4 weights with per-row scales, activations in
their own float dtype): quantize_weight_only, dequantize_weight_only and gemm_weight_only, each with its graph form
beside it (``_graph``). :mod:`bitsandbytes_ms.functional` re-exports every name here; this module imports neither it
nor any other format."""

from __future__ import annotations

import math
from typing import Optional, Tuple

import mindspore as ms
from mindspore import Tensor

from .. import _graph, _ops
from .._formats_common import (FLOAT_DTYPES, WEIGHT_ONLY_NATIVE_MAX_ROWS, _check_dtype, _check_out, _check_tensor,
                               _contiguous, _empty_np, _numel)
from .._ops import tag as _tag
from .._hostcall import write_out as _write


# ---- weight-only int8/int4 (W8A16/W4A16) ----

def _check_bits(bits, fn: str) -> int:
    if bits not in (8, 4) or isinstance(bits, bool):
        raise ValueError(f"{fn}: `bits` must be 8 or 4; got {bits!r}")
    return int(bits)


def quantize_weight_only(W: Tensor, bits: int = 8) -> Tuple[Tensor, Tensor]:
    """Per-output-channel symmetric weight quantization for weight-only linears (W8A16 / W4A16, the
    scheme of ChatGLM-6B's quantized checkpoints).

    ``scale[n] = max_k |W[n, k]| / qmax`` (qmax = 127 for int8, 7 for int4), ``q = round(W / scale)``
    (half to even; 0 for an all-zero row). int4 values are packed two per byte, row by row: ``k`` even
    in the high nibble, ``k+1`` in the low one, as two's-complement nibbles; odd K pads each row.

    Args:
        W: [N, K] float32/float16/bfloat16 weight (out_features, in_features); non-contiguous is copied.
        bits: 8 or 4.

    Returns:
        (q, scale): q int8 [N, K] (bits=8) or uint8 [N, (K+1)//2] (bits=4); scale fp32 [N].

    Raises:
        ValueError: W not a 2-D float tensor, bits not 8/4.
    """
    if _graph.compiling(W):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.quantize_weight_only(W, bits)
    fn = "quantize_weight_only"
    _check_dtype(W, FLOAT_DTYPES, fn, "W")
    bits = _check_bits(bits, fn)
    if len(W.shape) != 2:
        raise ValueError(f"{fn}: `W` must be 2-D [out_features, in_features]; got shape {tuple(W.shape)}")
    N, K = (int(s) for s in W.shape)
    if N * K == 0:
        q = _empty_np((N, K if bits == 8 else (K + 1) // 2), ms.int8 if bits == 8 else ms.uint8)
        return q, _empty_np((N,), ms.float32)  # a K = 0 weight: scale 0 per row (what the kernel writes)
    return _ops.quantize_weight_only(_contiguous(W), bits)


def _check_weight_only(q: Tensor, scale: Tensor, K: int, bits: int, fn: str) -> None:
    _check_dtype(q, (ms.int8,) if bits == 8 else (ms.uint8,), fn, "q")
    _check_dtype(scale, (ms.float32,), fn, "scale")
    N = _numel(scale)
    width = K if bits == 8 else (K + 1) // 2
    if len(q.shape) != 2 or tuple(q.shape) != (N, width):
        raise ValueError(f"{fn}: `q` must have shape [{N}, {width}] for {N} output channels, K={K}, bits={bits}; "
                         f"got {tuple(q.shape)}")


def _scale_f32(scale: Tensor, fn: str) -> Tensor:
    _check_tensor(scale, fn, "scale")
    if scale.dtype in (ms.float16, ms.bfloat16):  # checkpoints (ChatGLM) store the scale in half precision
        scale = ms.ops.cast(scale, ms.float32)
    return _contiguous(ms.ops.reshape(scale, (-1,)))


def dequantize_weight_only(q: Tensor, scale: Tensor, in_features: Optional[int] = None, bits: int = 8,
                           dtype=ms.float32, out: Optional[Tensor] = None) -> Tensor:
    """``W'[n, k] = q[n, k] * scale[n]`` (fp32, rounded to ``dtype``): inverse of :func:`quantize_weight_only`.

    Args:
        q, scale: from :func:`quantize_weight_only` (scale may be fp16/bf16; it is widened to fp32).
        in_features: K (needed for int4 with odd K; default ``q.shape[1]`` (int8) or ``2*q.shape[1]`` (int4)).
        bits: 8 or 4. dtype: result dtype (float32/float16/bfloat16). out: optional [N, K] tensor of ``dtype``.

    Raises:
        ValueError: wrong dtypes/shapes, bits not 8/4.
    """
    if _graph.compiling(q):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.dequantize_weight_only(q, scale, in_features, bits, dtype, out)
    fn = "dequantize_weight_only"
    bits = _check_bits(bits, fn)
    _check_tensor(q, fn, "q")
    scale = _scale_f32(scale, fn)
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{fn}: `dtype` must be float32, float16 or bfloat16; got {dtype}")
    K = int(in_features) if in_features is not None else (int(q.shape[-1]) * (1 if bits == 8 else 2))
    _check_weight_only(q, scale, K, bits, fn)
    N = _numel(scale)
    _check_out(out, (N, K), dtype, fn)
    if N * K == 0:
        return _write(out, _empty_np((N, K), dtype), fn)
    return _write(out, _ops.dequantize_weight_only(_contiguous(q), scale, K, bits, dtype), fn)


def gemm_weight_only(A: Tensor, q: Tensor, scale: Tensor, bits: int = 8, bias: Optional[Tensor] = None,
                     out: Optional[Tensor] = None, in_features: Optional[int] = None) -> Tensor:
    """Weight-only linear ``A @ (q * scale[:, None]).T (+ bias)`` in A's dtype (W8A16 / W4A16).

    Up to :data:`WEIGHT_ONLY_NATIVE_MAX_ROWS` rows of ``A`` the native kernel streams the int weight once,
    widens it in registers and accumulates in fp32 (``scale`` applied to each dot product); more rows
    dequantize the weight to fp32 (native) and use MindSpore's matmul (fp32), then round to A's dtype.

    Args:
        A: [..., K] float32/float16/bfloat16 activations.
        q, scale: from :func:`quantize_weight_only` ([N, K] int8 or [N, (K+1)//2] uint8; [N] scale).
        bits: 8 or 4. bias: optional [N] (added in fp32). out: optional [..., N] tensor of A's dtype.
        in_features: the weight's K, when known (int4 packs K = 2j - 1 and 2j into the same j bytes a row, so
            ``q`` alone cannot tell them apart); A's last dimension must equal it.

    Raises:
        ValueError: wrong dtypes/shapes, bits not 8/4.
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.gemm_weight_only(A, q, scale, bits, bias, out, in_features)
    fn = "gemm_weight_only"
    bits = _check_bits(bits, fn)
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    _check_tensor(q, fn, "q")
    scale = _scale_f32(scale, fn)
    if len(A.shape) == 0:
        raise ValueError(f"{fn}: `A` must have at least one dimension")
    K = int(A.shape[-1])
    if in_features is not None and K != int(in_features):
        raise ValueError(f"{fn}: `A` must have last dimension in_features = {int(in_features)}; got shape "
                         f"{tuple(A.shape)}")
    _check_weight_only(q, scale, K, bits, fn)
    N = _numel(scale)
    if bias is not None:
        _check_tensor(bias, fn, "bias")
        if _numel(bias) != N:
            raise ValueError(f"{fn}: `bias` must have {N} elements; got {_numel(bias)}")
    out_shape = tuple(A.shape[:-1]) + (N,)
    _check_out(out, out_shape, A.dtype, fn)
    rows = _numel(A) // K if K else int(math.prod(A.shape[:-1]))
    if rows * N == 0:
        return _write(out, _empty_np(out_shape, A.dtype), fn)
    O = ms.ops  # MindSpore ops throughout: the result is tagged once, at the return
    b32 = None if bias is None else O.cast(O.reshape(bias, (-1,)), ms.float32)
    if K == 0:  # empty dot products: 0 (+ bias); the entry point counts no rows in a [..., 0] A
        res = _empty_np(out_shape, ms.float32)
        res = O.cast(res if b32 is None else O.add(res, b32), A.dtype)
    elif rows <= WEIGHT_ONLY_NATIVE_MAX_ROWS:
        res = _ops.gemm_weight_only(_contiguous(A), _contiguous(q), scale, bits)
        if b32 is not None:
            res = O.cast(O.add(O.cast(res, ms.float32), b32), A.dtype)
    else:
        W = _ops.dequantize_weight_only(_contiguous(q), scale, K, bits, ms.float32)
        res = O.matmul(O.cast(O.reshape(A, (rows, K)), ms.float32), O.transpose(W, (1, 0)))
        if b32 is not None:
            res = O.add(res, b32)
        res = O.cast(O.reshape(res, out_shape), A.dtype)
    return _write(out, _tag(res, (A,)), fn)
