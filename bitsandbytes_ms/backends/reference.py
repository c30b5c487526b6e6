"""The reference backend: the kernels of :mod:`bitsandbytes_ms._ops` in numpy (``"reference"``).

Each kernel reads its tensors into numpy, runs the twin in :mod:`bitsandbytes_ms._reference` (the executable spec
the tests hold the native kernels to: the same bytes where the algorithm is deterministic; gemv/linear/weight-only
GEMMs accumulate in float64, so they agree to rounding) and hands the result back as MindSpore tensors. It is what
runs when the native library did not load (upstream's pure-torch ``default`` backend plays the same part): every
op works, slowly. In-place ops (the optimizers) write their results into the tensors' own memory.
"""

from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor

from .. import _hostcall, _ops
from .. import _reference as R
from ..utils import DTYPE_NAMES as _DTYPE_NAMES
from .._formats_common import as_uint8, code_4bit, storage_view

REF = ("reference",)


def _np(t):
    """A tensor's values as numpy (None stays None); 16/32-bit floats as float32 (fp16/bf16 widen exactly)."""
    if t is None:
        return None
    a = t.asnumpy()
    if t.dtype in (ms.float16, ms.bfloat16):
        a = a.astype(np.float32)
    return a


def _t(a: np.ndarray) -> Tensor:
    return Tensor(np.ascontiguousarray(a))


def _name(dtype) -> str:
    return _DTYPE_NAMES[dtype]


def _write_back(t: Tensor, values: np.ndarray) -> None:
    """Writes ``values`` into ``t``'s own memory (an in-place op's result)."""
    t.wait_pipeline()
    mem = _hostcall.own_memory(t, "reference", "in-place argument")
    values = np.asarray(values)
    if mem is not None:
        mem[...] = values.reshape(mem.shape).astype(mem.dtype)
        return
    src = ms.ops.cast(Tensor(np.ascontiguousarray(values.astype(np.float32) if t.dtype == ms.bfloat16 else values)),
                      t.dtype)
    t.copy_(ms.ops.reshape(src, tuple(t.shape)))


# ---- blockwise 8-bit ----
@_ops.quantize_blockwise.register(*REF)
def _(A, code, blocksize):
    q, absmax = R.quantize_blockwise(_np(A), _np(code), int(blocksize))
    return _t(q), _t(absmax)


@_ops.dequantize_blockwise.register(*REF)
def _(A, absmax, code, blocksize, dtype):
    return _t(R.dequantize_blockwise(_np(A), _np(absmax), _np(code), int(blocksize), _name(dtype)))


# ---- 4-bit ----
@_ops.quantize_4bit.register(*REF)
def _(A, blocksize, quant_type, quant_storage=ms.uint8):
    packed, absmax = R.quantize_4bit(_np(A), _np(code_4bit(quant_type)), int(blocksize))
    return storage_view(_t(packed), quant_storage), _t(absmax)


@_ops.dequantize_4bit.register(*REF)
def _(A, absmax, blocksize, quant_type, shape, dtype, code=None):
    n = int(np.prod(shape))
    code = code_4bit(quant_type) if code is None else code
    out = R.dequantize_4bit(_np(as_uint8(A)), _np(absmax), _np(code), int(blocksize), n, _name(dtype),
                            fp4=quant_type == "fp4")
    return _t(out.reshape(tuple(shape)))


@_ops.gemv_4bit.register(*REF)
def _(A, B, shapeB, absmax, code, blocksize):
    return _t(R.gemv_4bit(_np(A), _np(as_uint8(B)), _np(absmax), _np(code), int(blocksize), int(shapeB[0]),
                          _name(A.dtype)))


@_ops.linear_4bit.register(*REF)
def _(A, B, shapeB, absmax, code, blocksize, bias=None, absmax2=None, code2=None, offset=None, blocksize2=256,
      bf16_dot=False):
    args = (_np(A), _np(as_uint8(B)), _np(absmax), _np(code), int(blocksize), int(shapeB[0]))
    extra = dict(absmax2=_np(absmax2), code2=_np(code2), offset=None if offset is None else float(_np(offset)),
                 bias=_np(bias), blocksize2=int(blocksize2))
    if bf16_dot and A.dtype == ms.bfloat16:
        return ms.ops.cast(_t(R.linear_4bit_bf16dot(*args, **extra)), ms.bfloat16)
    return _t(R.linear_4bit(*args, **extra, dtype=_name(A.dtype)))


# ---- int8 ----
@_ops.int8_vectorwise_quant.register(*REF)
def _(A, threshold=0.0):
    CA, stats, flags = R.int8_vector_quant(_np(A), float(threshold), _name(A.dtype))
    return _t(CA), _t(stats), _t(flags)


@_ops.int8_linear_matmul.register(*REF)
def _(A, B):
    return _t(R.int8_gemm(_np(A), _np(B)))


@_ops.int8_mm_dequant.register(*REF)
def _(A, row_stats, col_stats, dtype=None, bias=None):
    return _t(R.int8_mm_dequant(_np(A), _np(row_stats), _np(col_stats), _np(bias), _name(dtype or ms.float16)))


@_ops.int8_mixed_mm_dequant.register(*REF)
def _(C, row_stats, col_stats, bias, A, CB, col_flags, dtype):
    return _t(R.int8_mixed_mm_dequant(_np(C), _np(row_stats), _np(col_stats), _np(bias), _np(A), _np(CB),
                                      _np(col_flags), _name(dtype)))


@_ops.int8_linear.register(*REF)
def _(A, CB, SCB, bias, threshold):
    out, flags = R.int8_linear(_np(A), _np(CB), _np(SCB), _np(bias), float(threshold), _name(A.dtype))
    return _t(out), _t(flags)


# ---- optimizers: in place ----
@_ops.optimizer_update_32bit.register(*REF)
def _(optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
      weight_decay, step, lr, gnorm_scale, skip_zeros=False):
    newp, s1, s2, unorm = R.optimizer_update_32bit(
        optimizer_name, _np(g).reshape(-1), _np(p).reshape(-1), _np(state1), _np(state2), float(beta1), float(beta2),
        float(beta3), float(alpha), float(eps), float(weight_decay), int(step), float(lr), float(gnorm_scale),
        float(max_unorm), _name(p.dtype))
    _write_back(p, newp)
    _write_back(state1, s1)
    if state2 is not None:
        _write_back(state2, s2)
    if unorm_vec is not None and unorm is not None:
        _write_back(unorm_vec, np.asarray(unorm, np.float32).reshape(1))
    return None


@_ops.optimizer_update_8bit_blockwise.register(*REF)
def _(optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
      absmax2, weight_decay, gnorm_scale, skip_zeros=False):
    newp, q1, q2, a1, a2 = R.optimizer_update_8bit_blockwise(
        optimizer_name, _np(g), _np(p), _np(state1), _np(state2), float(beta1), float(beta2), float(beta3),
        float(alpha), float(eps), int(step), float(lr), _np(qmap1), _np(qmap2), _np(absmax1), _np(absmax2),
        float(weight_decay), float(gnorm_scale), _name(p.dtype))
    for t, v in ((p, newp), (state1, q1), (state2, q2), (absmax1, a1), (absmax2, a2)):
        if t is not None:
            _write_back(t, v)
    return None


# ---- weight-only int8/int4, full-precision linear ----
@_ops.quantize_weight_only.register(*REF)
def _(W, bits):
    q, scale = R.quantize_weight_only(_np(W), int(bits))
    return _t(q), _t(scale)


@_ops.dequantize_weight_only.register(*REF)
def _(q, scale, K, bits, dtype):
    return _t(R.dequantize_weight_only(_np(q), _np(scale), int(K), int(bits), _name(dtype)))


@_ops.gemm_weight_only.register(*REF)
def _(A, q, scale, bits):
    return _t(R.gemm_weight_only(_np(A), _np(q), _np(scale), int(bits), _name(A.dtype)))


@_ops.gemm_fp.register(*REF)
def _(A, W, bias=None):
    return _t(R.gemm_fp(_np(A), _np(W), _np(bias), _name(A.dtype)))
