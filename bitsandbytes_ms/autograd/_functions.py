"""Autograd functions (MatMul8bitLt, MatMul4Bit, matmul, matmul_4bit) — built on
:mod:`bitsandbytes_ms.functional`."""


# ---- 4-bit (MatMul4Bit, matmul_4bit) ----
import math as _math
import warnings as _warnings
from typing import Optional as _Optional

import mindspore as _ms
from mindspore import Tensor as _Tensor
from mindspore import nn as _msnn
from mindspore import ops as _msops

from .. import functional as _F
from ..cextension import tag_device as _tag_device


def _mm(a, b, like=()):
    """MindSpore matmul whose result carries a device tag (mindtorch needs one on every tensor)."""
    r = _msops.matmul(a, b)
    _tag_device(r, like=like)
    return r


def _dequant_weight_f32(B, quant_state):
    """The [N, K] weight as float32 (MindSpore's CPU MatMul has no bf16, so 4-bit matmuls run in fp32)."""
    W = _F.dequantize_4bit(B.reshape(-1, 1), quant_state)
    W = W.reshape(tuple(quant_state.shape))
    return W if W.dtype == _ms.float32 else W.astype(_ms.float32)


def _forward_4bit(A, B, quant_state, bias):
    """A[..., K] @ W[N, K]^T (+ bias) in A's dtype: the gemv kernel for a single row, otherwise
    dequantize to fp32, matmul in fp32, cast."""
    N = int(quant_state.shape[0])
    K = A.shape[-1]
    rows = int(_math.prod(A.shape[:-1]))
    if rows == 1 and A.dtype in _F.FLOAT_DTYPES:
        res = _F.gemv_4bit(A, B, state=quant_state)
        if bias is not None:
            res = (res.astype(_ms.float32) + bias.astype(_ms.float32)).astype(A.dtype)
        return res
    W = _dequant_weight_f32(B, quant_state)
    a = A.reshape(-1, K).astype(_ms.float32)
    res = _mm(a, W.T, (A,))
    if bias is not None:
        res = res + bias.astype(_ms.float32)
    return res.reshape(tuple(A.shape[:-1]) + (N,)).astype(A.dtype)


class MatMul4Bit(_msnn.Cell):
    """4-bit linear with a custom backward (upstream ``MatMul4Bit``): forward as
    :func:`matmul_4bit`; backward gives ``dA = dout @ W`` (W dequantized, fp32, cast to A's dtype)
    and ``dbias = sum(dout)`` over the leading dimensions. No gradient for the packed weight.

    ``MatMul4Bit.apply(A, B, out=None, bias=None, quant_state=None)`` mirrors upstream's call.
    Gradients come from MindSpore autograd (``mindspore.grad``/``value_and_grad``, or mindtorch's
    ``torch.autograd.value_and_grad``), which uses :meth:`bprop`.
    """

    def __init__(self, B, quant_state, has_bias: bool):
        super().__init__()
        self.B = B
        self.quant_state = quant_state
        self.has_bias = has_bias

    def construct(self, A, bias):
        _tag_device((A, bias), like=(A,))
        return _forward_4bit(A, self.B, self.quant_state, bias if self.has_bias else None)

    def bprop(self, A, bias, out, dout):
        _tag_device((A, bias, out, dout), like=(A,))  # autograd hands over tensors without mindtorch's device tag
        N = int(self.quant_state.shape[0])
        g = dout.reshape(-1, N).astype(_ms.float32)
        W = _dequant_weight_f32(self.B, self.quant_state)
        dA = _mm(g, W, (A,)).reshape(A.shape).astype(A.dtype)
        if self.has_bias:
            dbias = g.sum(axis=0).reshape(bias.shape).astype(bias.dtype)
        else:
            dbias = _msops.zeros_like(bias)
            _tag_device(dbias, like=(A,))
        return dA, dbias

    @staticmethod
    def apply(A, B, out=None, bias=None, quant_state=None):
        cell = MatMul4Bit(B, quant_state, bias is not None)
        res = cell(A, bias if bias is not None else _Tensor(0.0, _ms.float32))
        return _F._write(out, res)


def matmul_4bit(A, B, quant_state, out: _Optional[_Tensor] = None, bias: _Optional[_Tensor] = None):
    """``A @ dequantize_4bit(B, quant_state).T + bias`` (upstream ``bnb.matmul_4bit``).

    Args:
        A: [..., K] float activations.
        B: packed weight of a [N, K] matrix (``[(N*K+1)//2, 1]`` or its ``.t()``).
        quant_state: the weight's :class:`~bitsandbytes_ms.functional.QuantState` (2-D shape).
        out: optional [..., N] tensor of A's dtype.
        bias: optional [N].

    Single-row inputs use the native gemv kernel (reads the packed weight once); others dequantize
    to fp32 and use MindSpore's matmul. Differentiable w.r.t. ``A`` and ``bias`` (see :class:`MatMul4Bit`).

    Raises:
        ValueError: quant_state missing or not 2-D; K does not match.
    """
    if quant_state is None:
        raise ValueError("quant_state is required")
    if quant_state.shape is None or len(quant_state.shape) != 2:
        raise ValueError("matmul_4bit: quant_state.shape must be 2D [N, K]")
    N, Kq = (int(x) for x in quant_state.shape)
    K = A.shape[-1]
    if K == N and K != Kq:
        _warnings.warn(f"matmul_4bit: weight was quantized from a [K, N] tensor (quant_state.shape={list(quant_state.shape)}). "
                       "Re-quantize from the weight in [N, K] (out_features, in_features) orientation.",
                       DeprecationWarning, stacklevel=2)
        W = _dequant_weight_f32(B, quant_state)
        res = _mm(A.reshape(-1, K).astype(_ms.float32), W, (A,))
        if bias is not None:
            res = res + bias.astype(_ms.float32)
        return _F._write(out, res.reshape(tuple(A.shape[:-1]) + (Kq,)).astype(A.dtype))
    if K != Kq:
        raise ValueError(f"matmul_4bit: `A` must have last dimension {Kq} (quant_state.shape[1]); got {K}")
    if _math.prod(A.shape) == 0:
        return _F._write(out, _F._empty_np(tuple(A.shape[:-1]) + (N,), A.dtype))
    return MatMul4Bit.apply(A, B, out, bias, quant_state)
