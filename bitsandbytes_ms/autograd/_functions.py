"""Autograd functions (MatMul8bitLt, MatMul8bitFp, matmul; MatMul4Bit and matmul_4bit re-exported from the 4-bit
format, :mod:`bitsandbytes_ms.formats.fourbit`, which holds them beside the 4-bit layer's door) -- built on
:mod:`bitsandbytes_ms.functional`.

Names: ``_ms`` / ``_msops`` / ``_msnn`` are MindSpore and its ``ops`` / ``nn``; ``_F`` is
:mod:`bitsandbytes_ms.functional`, which calls the op layer (:mod:`bitsandbytes_ms._ops`; here only its `tag`)."""

import math as _math
import os as _os
import warnings as _warnings
from dataclasses import dataclass as _dataclass
from typing import Optional as _Optional

import numpy as _np
import mindspore as _ms
from mindspore import Tensor as _Tensor
from mindspore import nn as _msnn
from mindspore import ops as _msops
from mindspore.common.api import _pynative_executor

from .. import _graph, _hostcall
from .. import functional as _F
from .._ops import tag as _tag_device
from .._formats_common import _needs_input_grad
from ..cextension import BNB_BACKEND as _BNB_BACKEND
from ..formats.fourbit import (  # noqa: F401  (upstream's names here; the 4-bit autograd form is the format's)
    MatMul4Bit, _dequant_weight_f32, _forward_4bit, _grad_4bit, _mm, _mm_nt, matmul_4bit)
from ..utils import Singleton as _Singleton


















# ---- int8 (LLM.int8(): MatmulLtState, MatMul8bitLt, MatMul8bitFp, matmul) ----
class GlobalOutlierPooler(_Singleton):
    """Upstream's singleton collecting outlier feature indices across layers of one model dimension
    (``GlobalOutlierPooler.get_instance()``; ``add_outliers(idx, feature_dim)``, ``get_current_outlier_idx()``)."""

    def initialize(self):
        self.outliers = set()
        self.model_dim = None

    def add_outliers(self, outlier_idx, feature_dim):
        if self.model_dim is None:
            self.model_dim = feature_dim
        if feature_dim != self.model_dim:
            return  # outliers of another dimension (e.g. the second FFN layer) are not pooled
        idx = outlier_idx.asnumpy() if hasattr(outlier_idx, "asnumpy") else _np.asarray(outlier_idx)
        self.outliers.update(int(i) for i in idx.reshape(-1))

    def get_current_outlier_idx(self):
        return _Tensor(_np.array(sorted(self.outliers), dtype=_np.int64))


@_dataclass
class MatmulLtState:
    """State of an LLM.int8() matmul (upstream ``bitsandbytes.autograd._functions.MatmulLtState``):
    the quantized weight ``CB`` (int8 [N, K]) and its row scales ``SCB`` (float32 [N]), the outlier
    ``threshold``, ``idx`` (outlier columns of the last forward), and the training flags."""

    # upstream's dataclass fields, in its order (positional and keyword construction land where upstream puts them);
    # the unannotated ones are class attributes, as upstream
    force_no_igemmlt: bool = False
    CB: _Optional[_Tensor] = None
    SB: _Optional[_Tensor] = None
    SCB: _Optional[_Tensor] = None
    SBt: _Optional[_Tensor] = None
    CBt: _Optional[_Tensor] = None
    subB: _Optional[_Tensor] = None
    outlier_pool: _Optional[GlobalOutlierPooler] = None
    has_accumulated_gradients = False
    threshold = 0.0
    idx: _Optional[_Tensor] = None
    is_training = True
    has_fp16_weights = True
    use_pool = False

    # deprecated (always None, a FutureWarning on reading), as upstream keeps them for TGI / vLLM
    _deprecated_fields = frozenset({"CxB", "CxBt", "formatB", "_tile_indices"})

    def __getattr__(self, name):
        if name in MatmulLtState._deprecated_fields:
            _warnings.warn(f"MatmulLtState.{name} is deprecated and will be removed in the next bitsandbytes release.",
                           FutureWarning, stacklevel=2)
            return None
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def reset_grads(self):
        self.CB = None
        self.SB = None
        self.SCB = None
        self.SBt = None
        self.CBt = None

    @property
    def tile_indices(self):
        _warnings.warn("MatmulLtState.tile_indices is deprecated and always None", FutureWarning, stacklevel=2)
        return None

    def _set_outlier_flags(self, flags, like) -> None:
        """Records the fused forward's uint8 outlier flags; ``idx`` is made from them when first read."""
        d = self.__dict__
        d["idx"] = None
        d["_idx_flags"] = (flags, like)


def _state_idx_get(self):
    d = self.__dict__
    pending = d.get("_idx_flags")
    if pending is not None:
        flags, like = pending
        f = flags if isinstance(flags, _np.ndarray) else flags.asnumpy()
        d["idx"] = _F._tag(_Tensor(_np.nonzero(f)[0].astype(_np.int64)), (like,))
        d["_idx_flags"] = None
    return d.get("idx")


def _state_idx_set(self, value):
    self.__dict__["_idx_flags"] = None
    self.__dict__["idx"] = value


# `idx` (the outlier columns of the last forward) is a dataclass field whose value the fused inference
# forward leaves as flags until someone reads it (turning flags into an index tensor costs more than the
# fused call's own overhead).
MatmulLtState.idx = property(_state_idx_get, _state_idx_set)


def _zeros(shape, dtype, like=()):
    t = _F._empty_np(shape, dtype)
    _tag_device(t, like=like)
    return t


def _quantize_weight(B: _Tensor, state: MatmulLtState) -> None:
    """Upstream's weight handling: (re)quantize B row-wise when it holds fp weights that may have changed
    (training, has_fp16_weights) or when there is no CB/SCB yet. An int8 B is taken as already quantized."""
    if B.dtype == _ms.int8:
        if state.CB is None:
            state.CB = B
        if state.SCB is None:
            raise ValueError("matmul: `B` is int8 but `state.SCB` is None; pass the row scales in state.SCB")
        return
    if state.has_fp16_weights or state.CB is None or state.SCB is None:
        if state.is_training or state.CB is None or state.SCB is None:
            state.reset_grads()
            state.CB, state.SCB, _ = _F.int8_vectorwise_quant(_as_quant_input(_F._contiguous(B)))


def _as_quant_input(t: _Tensor) -> _Tensor:
    """Upstream quantizes float32 weights and activations after casting them to float16 (so the int8
    codes and scales match upstream's bytes); bfloat16 is quantized as is, since float16 could
    overflow it (upstream casts it too)."""
    return _d(_msops.cast(t, _ms.float16), (t,)) if t.dtype == _ms.float32 else t


def _d(t, like=()):
    """A result (a tensor or a tuple) tagged with mindtorch's ``_device`` (mindtorch's Tensor methods require it)."""
    return _tag_device(t, like)


def _dequant_weight(state: MatmulLtState) -> _Tensor:
    """CB * SCB / 127 in float32 ([N, K])."""
    cb = _msops.cast(state.CB, _ms.float32)  # MindSpore ops only: an intermediate, never tagged
    scale = _msops.mul(_msops.reshape(state.SCB, (-1, 1)), float(_np.float32(1.0 / 127.0)))
    return _msops.mul(cb, scale)


def _int8_forward(A: _Tensor, B: _Tensor, bias: _Optional[_Tensor], state: MatmulLtState) -> _Tensor:
    """The forward of :class:`MatMul8bitLt`: out = A @ W.T (+ bias) in A's dtype, W quantized row-wise
    and A row-wise (vector-wise, LLM.int8()); with ``state.threshold > 0`` the outlier columns of A are
    multiplied in A's dtype against the dequantized weight columns. As upstream, float32 activations are
    quantized after a cast to float16 (same int8 codes as upstream); bfloat16 ones in their own dtype
    (upstream casts them to float16 too, which can overflow)."""
    _quantize_weight(B, state)
    N = int(state.CB.shape[0])
    shape = tuple(A.shape)
    if _math.prod(shape) == 0:
        return _zeros(shape[:-1] + (N,), A.dtype, (A,))
    A2 = _d(_msops.reshape(_F._contiguous(A), (-1, shape[-1])), (A,))
    Aq = _as_quant_input(A2)
    if state.threshold > 0.0:
        CA, SCA, outlier_cols = _F.int8_vectorwise_quant(Aq, threshold=state.threshold)
        state.idx = outlier_cols
        out, _ = _F.int8_mixed_scaled_mm(A2, CA, state.CB, SCA, state.SCB, outlier_cols, bias)
    else:
        CA, SCA, _ = _F.int8_vectorwise_quant(Aq)
        out = _F.int8_scaled_mm(CA, state.CB, SCA, state.SCB, bias=bias, dtype=A.dtype)
    out = _d(_msops.reshape(out, shape[:-1] + (N,)), (A,))
    return out


def _int8_forward_fused(A: _Tensor, B: _Tensor, out: _Optional[_Tensor], bias: _Optional[_Tensor],
                        state: MatmulLtState) -> _Tensor:
    """:func:`_int8_forward` in one native call (``cint8_linear_<dtype>`` through the
    :class:`~bitsandbytes_ms.functional.Int8LinearPlan` cached on ``state``: a host call where active), bit
    for bit the same result; used at inference (no gradient being recorded, CPU library), where
    MatMul8bitLt's custom bprop is not needed. ``state.idx`` is set (lazily) as the unfused forward sets it."""
    _quantize_weight(B, state)
    if _math.prod(tuple(A.shape)) == 0 or int(state.CB.shape[0]) == 0:
        res = _int8_forward(A, B, bias, state)  # nothing to compute: the unfused path's result
    else:
        plan = _F.int8_linear_plan(state, state.CB, state.SCB, "matmul")
        # the unfused forward's branch: outlier columns only for threshold > 0 (0, negative or NaN: none)
        threshold = float(state.threshold) if state.threshold > 0.0 else 0.0
        res, flags = plan(A, bias, threshold, "matmul")
        if threshold > 0.0:
            state._set_outlier_flags(flags, A)
    return _F._write(out, res)


#: The fused inference forward (``BNB_MS_INT8_FUSED=0`` switches it off, for comparisons).
FUSED_INFERENCE = _os.environ.get("BNB_MS_INT8_FUSED", "1") != "0"


def _use_fused() -> bool:
    """True where :func:`matmul` may run the fused forward: CPU library, no gradient being recorded."""
    return FUSED_INFERENCE and _BNB_BACKEND == "CPU" and not _pynative_executor.requires_grad()


def _fp_forward(A: _Tensor, B: _Tensor, bias: _Optional[_Tensor], state: MatmulLtState) -> _Tensor:
    """The forward of :class:`MatMul8bitFp`: A @ dequant(quant(W)).T (+ bias), computed in float32 and
    returned in A's dtype (upstream's CPU training path)."""
    _quantize_weight(B, state)
    N = int(state.CB.shape[0])
    shape = tuple(A.shape)
    if _math.prod(shape) == 0:
        return _zeros(shape[:-1] + (N,), A.dtype, (A,))
    a = _msops.cast(_msops.reshape(A, (-1, shape[-1])), _ms.float32)  # MindSpore ops: one tag, at the return
    out = _msops.matmul(a, _msops.transpose(_dequant_weight(state), (1, 0)))
    if bias is not None:
        out = _msops.add(out, _msops.reshape(_msops.cast(bias, _ms.float32), (1, -1)))
    return _d(_msops.reshape(_msops.cast(out, A.dtype), shape[:-1] + (N,)), (A,))


def _backward(A, B, bias, dout, state: MatmulLtState):
    """Gradients of out = A @ W.T + bias: grad_A = dout @ dequant(CB) (in A's dtype), grad_B = dout.T @ A
    (float32 matmul, in B's dtype, when B holds float weights with has_fp16_weights; zeros for an int8 B),
    grad_bias = sum of dout over rows."""
    N = int(state.CB.shape[0])
    K = int(A.shape[-1])
    d = _msops.cast(_msops.reshape(dout, (-1, N)), _ms.float32)  # MindSpore ops: the gradients tagged at the return
    if _math.prod(A.shape) == 0:
        gA, gB = _msops.zeros_like(A), _msops.zeros_like(B)
    else:
        gA = _msops.reshape(_msops.cast(_msops.matmul(d, _dequant_weight(state)), A.dtype), A.shape)
        if B.dtype != _ms.int8 and state.has_fp16_weights:
            gB = _msops.matmul(_msops.transpose(d, (1, 0)), _msops.cast(_msops.reshape(A, (-1, K)), _ms.float32))
            if tuple(B.shape) != tuple(gB.shape):  # B given as a transposed view
                gB = _msops.transpose(gB, (1, 0))
            gB = _msops.reshape(_msops.cast(gB, B.dtype), B.shape)
        else:
            gB = _msops.zeros_like(B)
    if bias is None:
        return _d((gA, gB), (A,))
    return _d((gA, gB, _msops.reshape(_msops.cast(_msops.reduce_sum(d, 0), bias.dtype), bias.shape)), (A,))


class _Int8MatmulCell(_msnn.Cell):
    """A MindSpore cell with a custom ``bprop``: MindSpore's autograd (``mindspore.value_and_grad``,
    which mindtorch's ``autograd.value_and_grad`` also uses) calls ``bprop`` instead of differentiating
    through the int8 kernels."""

    def __init__(self, state: MatmulLtState, forward):
        super().__init__(auto_prefix=False)
        self.state = state
        self._forward = forward

    def construct(self, A, B):
        return self._forward(A, B, None, self.state)

    def bprop(self, A, B, out, dout):
        return _backward(A, B, None, dout, self.state)


class _Int8MatmulBiasCell(_Int8MatmulCell):
    def construct(self, A, B, bias):
        return self._forward(A, B, bias, self.state)

    def bprop(self, A, B, bias, out, dout):
        return _backward(A, B, bias, dout, self.state)


class _Function:
    """``apply(A, B, out=None, bias=None, state=None)`` as upstream's ``torch.autograd.Function``s, and their
    ``forward(ctx, ...)`` / ``backward(ctx, grad_output)`` static methods for code that drives them by hand."""

    @staticmethod
    def _ctx_forward(fwd, ctx, A, B, out, bias, state):
        state = state or MatmulLtState()
        ctx.is_empty = _math.prod(A.shape) == 0
        ctx.A, ctx.B, ctx.bias, ctx.state = A, B, bias, state
        ctx.grad_shape, ctx.dtype_A = tuple(A.shape), A.dtype
        ctx.dtype_bias = None if bias is None else bias.dtype
        res = fwd(A, B, bias, state)
        _tag_device(res, like=(A,))
        return _F._write(out, res)

    @staticmethod
    def backward(ctx, grad_output):
        """Upstream's five gradients ``(grad_A, grad_B, None, grad_bias, None)`` (:func:`_backward`'s); None where
        ``ctx.needs_input_grad`` (if set) asks for none."""
        need = _needs_input_grad(ctx)
        grads = _backward(ctx.A, ctx.B, ctx.bias, grad_output, ctx.state)
        gbias = grads[2] if ctx.bias is not None else None
        return (grads[0] if need[0] else None, grads[1] if need[1] else None, None,
                gbias if need[3] else None, None)

    @staticmethod
    def _apply(fwd, A, B, out, bias, state):
        """PyNative ``apply``: the forward ``fwd`` as a Cell whose ``bprop`` is :func:`_backward`."""
        state = state or MatmulLtState()
        cell = _Int8MatmulBiasCell(state, fwd) if bias is not None else _Int8MatmulCell(state, fwd)
        res = cell(A, B, bias) if bias is not None else cell(A, B)
        _tag_device(res, like=(A,))
        return _F._write(out, res)


# ``apply`` is a static method of each class, not one classmethod of the base: MindSpore's graph parser binds a
# classmethod's ``cls`` to the first argument, so ``MatMul8bitLt.apply(...)`` inside mindspore.jit would fail.
class MatMul8bitLt(_Function):
    """LLM.int8() matmul ``A @ B.T + bias`` (upstream ``MatMul8bitLt``): int8 GEMM of row-wise quantized
    A and W, outlier columns (``state.threshold > 0``) in float32. Backward: see :func:`_backward`."""

    @staticmethod
    def apply(A, B, out=None, bias=None, state=None):
        if _graph.compiling(A):  # in a graph: the forward (the Cell with its bprop cannot be made there)
            return _graph.matmul_8bit(A, B, state, bias, out is not None, "lt")
        return _Function._apply(_int8_forward, A, B, out, bias, state)

    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, state=None):
        """Upstream's ``MatMul8bitLt.forward(ctx, A, B, out, bias, state)`` (no autograd recording)."""
        return _Function._ctx_forward(_int8_forward, ctx, A, B, out, bias, state)


class MatMul8bitFp(_Function):
    """``A @ dequant(quant(B)).T + bias`` in float (upstream ``MatMul8bitFp``, its CPU training path)."""

    @staticmethod
    def apply(A, B, out=None, bias=None, state=None):
        if _graph.compiling(A):
            return _graph.matmul_8bit(A, B, state, bias, out is not None, "fp")
        return _Function._apply(_fp_forward, A, B, out, bias, state)

    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, state=None):
        """Upstream's ``MatMul8bitFp.forward(ctx, A, B, out, bias, state)`` (no autograd recording)."""
        return _Function._ctx_forward(_fp_forward, ctx, A, B, out, bias, state)


def matmul(A: _Tensor, B: _Tensor, out: _Optional[_Tensor] = None, state: _Optional[MatmulLtState] = None,
           threshold: float = 0.0, bias: _Optional[_Tensor] = None) -> _Tensor:
    """``A @ B.T (+ bias)`` through LLM.int8() (upstream ``bitsandbytes.matmul``).

    Args:
        A: activations [..., K] (float16/bfloat16/float32).
        B: weight [N, K], float (quantized on the fly) or int8 with ``state.SCB``/``state.CB`` set.
        out: optional tensor that receives the result.
        state: :class:`MatmulLtState` (a fresh one when None); it caches CB/SCB between calls.
        threshold: outlier threshold; > 0 sets ``state.threshold``.
        bias: optional [N].

    As upstream on CPU, ``state.is_training`` selects :class:`MatMul8bitFp` (dequantized float matmul);
    otherwise :class:`MatMul8bitLt` (int8 GEMM). At inference (CPU library, no gradient being recorded)
    MatMul8bitLt's forward runs as one native call (``functional.int8_linear``'s ``cint8_linear_<dtype>``,
    through a host call in PyNative mode), with the same bytes.

    Raises:
        ValueError: A not a float tensor, B not 2-D, inner dimensions differ.
    """
    fn = "matmul"
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the forward (bitsandbytes_ms/_graph.py; no autograd cell)
        return _graph.graph_matmul(A, B, state, threshold, bias)
    _F._check_dtype(A, _F.FLOAT_DTYPES, fn, "A")
    _F._check_dtype(B, _F.FLOAT_DTYPES + (_ms.int8,), fn, "B")
    if B.ndim != 2:
        raise ValueError(f"{fn}: `B` must be 2-D [N, K]; got shape {tuple(B.shape)}")
    # An int8 B with state.CB set is a stand-in for the quantized weight (upstream passes CB or CB.t());
    # the weight used is state.CB [N, K].
    W = state.CB if (state is not None and B.dtype == _ms.int8 and state.CB is not None) else B
    if A.ndim < 1 or A.shape[-1] != W.shape[1]:
        raise ValueError(f"{fn}: inner dimensions do not match: `A` {tuple(A.shape)} @ `B`.T {tuple(W.shape)}")
    if bias is not None:
        _F._check_dtype(bias, _F.FLOAT_DTYPES, fn, "bias")
    state = state or MatmulLtState()
    if threshold > 0.0:
        state.threshold = threshold
    if state.is_training:
        return MatMul8bitFp.apply(A, B, out, bias, state)
    if _use_fused():
        return _int8_forward_fused(A, B, out, bias, state)
    return MatMul8bitLt.apply(A, B, out, bias, state)
