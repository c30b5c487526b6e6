"""Quantized linear layers as ``mindspore.nn.Cell`` s, for models written against ``mindspore.nn`` (not mindtorch).

:class:`Linear4bitCell` and :class:`Linear8bitLtCell` are the Cell forms of :class:`~bitsandbytes_ms.nn.Linear4bit`
and :class:`~bitsandbytes_ms.nn.Linear8bitLt`: the same numerics (their forwards call the same
:mod:`bitsandbytes_ms.autograd._functions` / :mod:`bitsandbytes_ms.functional` pieces, no kernel directly), in
PyNative mode and inside ``mindspore.jit`` / ``GRAPH_MODE`` (:mod:`bitsandbytes_ms._graph`), with the same bytes
as the mindtorch layers.

* The quantized weight and its quant state are ``Parameter`` s with ``requires_grad=False`` (``weight``, ``absmax``,
  and with double quantization ``nested_absmax`` / ``nested_offset``; ``SCB`` for int8), so
  ``mindspore.save_checkpoint`` / ``load_checkpoint`` keep them; the static part of the state (shape, blocksize,
  quant type, dtype) is the Cell's configuration, which the constructor re-creates.
* ``bias`` is a trainable ``Parameter``: QLoRA-style training keeps the quantized base frozen and trains the bias
  and/or an adapter beside the layer (see :class:`LoRAAdapter`); gradients flow through ``mindspore.value_and_grad``
  / ``nn.TrainOneStepCell`` by the layer's custom ``bprop`` (``dA = dout @ W``, W dequantized; the quantized
  weight gets none).
* Build one from a float weight: ``Linear4bitCell.from_dense(nn.Dense(...))`` / ``Linear8bitLtCell.from_dense``
  (MindSpore's ``Dense`` stores ``weight`` as [out, in], as torch's Linear does).

Limits in graph mode are :mod:`bitsandbytes_ms._graph`'s: uint8 quant storage (an int8 outlier threshold runs:
the fused LLM.int8() forward).

This module uses MindSpore's functional ``ops`` only, no Tensor methods or operators: importing
``bitsandbytes_ms.nn`` imports mindnlp, whose mindtorch replaces ``Tensor``'s methods with torch's, which need
mindtorch's device tag on every operand in PyNative mode (user code around these Cells is best written the same way,
or with tensors made by ``mindtorch``).
"""

from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

from .. import _graph
from .. import functional as F
from ..autograd import _functions as _autograd
from .._ops import tag as _tag_device
from ..formats import fourbit as _fourbit


def _weight_of(dense_or_weight):
    w = dense_or_weight.weight if isinstance(dense_or_weight, nn.Cell) else dense_or_weight
    return w if not isinstance(w, Parameter) else Tensor(w.asnumpy())


class _Frozen4bitMatmul(nn.Cell):
    """``A @ W.T + bias`` for the 4-bit weight of a :class:`Linear4bitCell`, with :func:`formats.fourbit._grad_4bit` as its
    backward (no gradient for the weight and its state)."""

    def __init__(self, layer):
        super().__init__(auto_prefix=False)
        self.has_bias = layer.bias is not None
        self.shape = (layer.out_features, layer.in_features)
        self.code, self.code2, self.blocksize2 = layer._code, layer._code2, layer._blocksize2
        self.blocksize, self.quant_type, self.weight_dtype = layer.blocksize, layer.quant_type, layer.weight_dtype
        self.nested = layer.compress_statistics
        self.quant_state = layer.quant_state

    def _state(self, A, absmax, nested_absmax, nested_offset):
        """The QuantState over the layer's Parameters in PyNative; in a graph, a state dict
        (:func:`bitsandbytes_ms._graph.graph_state`) over the values the graph passes in."""
        if not _graph.compiling(A):
            return self.quant_state
        if self.nested:
            return _graph.graph_state(absmax, self.shape, self.code, self.blocksize, self.quant_type,
                                      self.weight_dtype, nested_offset,
                                      _graph.graph_state(nested_absmax, None, self.code2, self.blocksize2, None,
                                                         ms.float32))
        return _graph.graph_state(absmax, self.shape, self.code, self.blocksize, self.quant_type, self.weight_dtype)

    def construct(self, A, weight, absmax, nested_absmax, nested_offset, bias):
        if not _graph.compiling(A):  # PyNative after mindnlp's import: mindtorch's ops need the tag
            _tag_device((A, bias), like=(A,))
        state = self._state(A, absmax, nested_absmax, nested_offset)
        if self.has_bias:
            return _fourbit._forward_4bit(A, weight, state, bias)
        return _fourbit._forward_4bit(A, weight, state, None)

    def bprop(self, A, weight, absmax, nested_absmax, nested_offset, bias, out, dout):
        # _grad_4bit's computation in MindSpore's functional ops (fourbit.graph_grad_4bit): the bprop's tensors
        # carry no mindtorch device tag, and MindSpore resolves every call in a bprop graph, even in dead branches
        state = self._state(dout, absmax, nested_absmax, nested_offset)
        if self.has_bias:
            dA, dbias = _fourbit.graph_grad_4bit(A, weight, state, dout, bias)
        else:
            dA, _ = _fourbit.graph_grad_4bit(A, weight, state, dout, None)
            dbias = ops.zeros_like(bias)
        return (dA, ops.zeros_like(weight), ops.zeros_like(absmax), ops.zeros_like(nested_absmax),
                ops.zeros_like(nested_offset), dbias)


class Linear4bitCell(nn.Cell):
    """4-bit (NF4/FP4) linear layer as a ``mindspore.nn.Cell`` (upstream ``bnb.nn.Linear4bit``'s arguments).

    Args:
        input_features, output_features: K and N.
        bias: whether the layer has a (trainable) bias.
        compute_dtype: as upstream's; the forward runs in the input's dtype (as :class:`~bitsandbytes_ms.nn.Linear4bit`
            does on CPU when no compute dtype is set), so only None is accepted here.
        compress_statistics: double quantization of absmax (upstream's default True).
        quant_type: ``"fp4"`` (upstream's default) or ``"nf4"``.
        blocksize: 4-bit blocksize (default 64).
        weight: optional [N, K] float weight to quantize (default: MindSpore's Dense initialisation).
        dtype: dtype of the original weight (the state's dtype; default float32).
    """

    def __init__(self, input_features, output_features, bias=True, compute_dtype=None, compress_statistics=True,
                 quant_type="fp4", blocksize=64, weight=None, bias_init=None, dtype=ms.float32):
        super().__init__()
        if compute_dtype is not None:
            raise ValueError("Linear4bitCell: `compute_dtype` must be None (the forward runs in the input's dtype)")
        self.in_features, self.out_features = int(input_features), int(output_features)
        if weight is None:
            weight = nn.Dense(self.in_features, self.out_features, has_bias=False, dtype=dtype).weight
        w = ops.cast(_weight_of(weight), dtype)
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"Linear4bitCell: `weight` must be [{self.out_features}, {self.in_features}]; got "
                             f"{tuple(w.shape)}")
        packed, qs = F.quantize_4bit(w, blocksize=blocksize, compress_statistics=compress_statistics,
                                     quant_type=quant_type)
        self.quant_type, self.blocksize, self.compress_statistics = quant_type, int(blocksize), bool(compress_statistics)
        self.weight_dtype = dtype
        self.weight = Parameter(packed, name="weight", requires_grad=False)
        self.absmax = Parameter(qs.absmax, name="absmax", requires_grad=False)
        self._code = qs.code
        if qs.nested:
            self.nested_absmax = Parameter(qs.state2.absmax, name="nested_absmax", requires_grad=False)
            self.nested_offset = Parameter(ops.cast(ops.reshape(qs.offset, ()), ms.float32), name="nested_offset",
                                           requires_grad=False)
            self._code2, self._blocksize2 = qs.state2.code, int(qs.state2.blocksize)
        else:  # placeholders, so the matmul cell has one signature
            self.nested_absmax = Parameter(Tensor(np.zeros(1, np.float32)), name="nested_absmax", requires_grad=False)
            self.nested_offset = Parameter(Tensor(np.float32(0.0)), name="nested_offset", requires_grad=False)
            self._code2, self._blocksize2 = None, None
        if bias:
            b = bias_init if bias_init is not None else Tensor(np.zeros(self.out_features, np.float32))
            self.bias = Parameter(ops.reshape(ops.cast(_weight_of(b), dtype), (self.out_features,)), name="bias")
        else:
            self.bias = None
        # the PyNative quant state reads the Parameters themselves (load_checkpoint updates them in place)
        self.quant_state = self._eager_state()
        self._matmul = _Frozen4bitMatmul(self)
        self._no_bias = Tensor(np.float32(0.0))

    @classmethod
    def from_dense(cls, dense, compress_statistics=True, quant_type="fp4", blocksize=64):
        """The quantized twin of an ``nn.Dense`` (its weight quantized, its bias copied)."""
        w = _weight_of(dense)
        has_bias = getattr(dense, "has_bias", getattr(dense, "bias", None) is not None)
        return cls(int(w.shape[1]), int(w.shape[0]), bias=has_bias, compress_statistics=compress_statistics,
                   quant_type=quant_type, blocksize=blocksize, weight=w, dtype=w.dtype,
                   bias_init=dense.bias if has_bias else None)

    def _eager_state(self):
        shape = (self.out_features, self.in_features)
        if not self.compress_statistics:
            return F.QuantState(absmax=self.absmax, shape=shape, code=self._code, blocksize=self.blocksize,
                                quant_type=self.quant_type, dtype=self.weight_dtype)
        state2 = F.QuantState(absmax=self.nested_absmax, code=self._code2, blocksize=self._blocksize2,
                              dtype=ms.float32)
        return F.QuantState(absmax=self.absmax, shape=shape, code=self._code, blocksize=self.blocksize,
                            quant_type=self.quant_type, dtype=self.weight_dtype, offset=self.nested_offset,
                            state2=state2)

    def construct(self, x):
        bias = self.bias if self.bias is not None else self._no_bias
        return self._matmul(x, self.weight, self.absmax, self.nested_absmax, self.nested_offset, bias)

    def extend_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"quant_type={self.quant_type}, blocksize={self.blocksize}, "
                f"compress_statistics={self.compress_statistics}")


class _FrozenInt8Matmul(nn.Cell):
    """LLM.int8() ``A @ W.T + bias`` for a frozen int8 weight, with ``dA = dout @ dequant(CB)`` as its backward."""

    def __init__(self, threshold, has_bias):
        super().__init__(auto_prefix=False)
        self.threshold, self.has_bias = threshold, has_bias

    def _forward(self, A, CB, SCB, bias):
        if _graph.compiling(A):
            return _graph.int8_forward(A, CB, SCB, bias, self.threshold)
        state = _autograd.MatmulLtState()
        state.CB, state.SCB, state.threshold, state.has_fp16_weights = CB, SCB, self.threshold, False
        return _autograd._int8_forward(A, CB, bias, state)

    def construct(self, A, CB, SCB, bias):
        if not _graph.compiling(A):
            _tag_device((A, bias), like=(A,))
        if self.has_bias:
            return self._forward(A, CB, SCB, bias)
        return self._forward(A, CB, SCB, None)

    def bprop(self, A, CB, SCB, bias, out, dout):
        if self.has_bias:
            dA, dbias = _graph.int8_backward(A, CB, SCB, dout, bias)
        else:
            dA, _ = _graph.int8_backward(A, CB, SCB, dout, None)
            dbias = ops.zeros_like(bias)
        return dA, ops.zeros_like(CB), ops.zeros_like(SCB), dbias


class Linear8bitLtCell(nn.Cell):
    """LLM.int8() linear layer as a ``mindspore.nn.Cell`` (upstream ``bnb.nn.Linear8bitLt``'s arguments, inference
    weights: ``has_fp16_weights=False``). The weight is quantized row-wise at construction (``CB`` int8 [N, K] as
    ``weight``, ``SCB`` float32 [N]), as :class:`~bitsandbytes_ms.nn.Linear8bitLt` does on its first move to a
    device; the forward is :class:`~bitsandbytes_ms.autograd.MatMul8bitLt`'s (``threshold > 0``: outlier columns in
    float32, in PyNative and graph mode alike).
    """

    def __init__(self, input_features, output_features, bias=True, has_fp16_weights=False, threshold=0.0,
                 weight=None, bias_init=None, dtype=ms.float32):
        super().__init__()
        if has_fp16_weights:
            raise ValueError("Linear8bitLtCell: `has_fp16_weights` must be False (a frozen int8 weight)")
        self.in_features, self.out_features = int(input_features), int(output_features)
        if weight is None:
            weight = nn.Dense(self.in_features, self.out_features, has_bias=False, dtype=dtype).weight
        w = ops.cast(_weight_of(weight), dtype)
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"Linear8bitLtCell: `weight` must be [{self.out_features}, {self.in_features}]; got "
                             f"{tuple(w.shape)}")
        CB, SCB, _ = F.int8_vectorwise_quant(_autograd._as_quant_input(w))
        self.threshold = float(threshold)
        self.weight = Parameter(CB, name="weight", requires_grad=False)
        self.SCB = Parameter(SCB, name="SCB", requires_grad=False)
        if bias:
            b = bias_init if bias_init is not None else Tensor(np.zeros(self.out_features, np.float32))
            self.bias = Parameter(ops.reshape(ops.cast(_weight_of(b), dtype), (self.out_features,)), name="bias")
        else:
            self.bias = None
        self._matmul = _FrozenInt8Matmul(self.threshold, self.bias is not None)
        self._no_bias = Tensor(np.float32(0.0))

    @classmethod
    def from_dense(cls, dense, threshold=0.0):
        """The int8 twin of an ``nn.Dense`` (its weight quantized row-wise, its bias copied)."""
        w = _weight_of(dense)
        has_bias = getattr(dense, "has_bias", getattr(dense, "bias", None) is not None)
        return cls(int(w.shape[1]), int(w.shape[0]), bias=has_bias, threshold=threshold, weight=w, dtype=w.dtype,
                   bias_init=dense.bias if has_bias else None)

    def construct(self, x):
        bias = self.bias if self.bias is not None else self._no_bias
        return self._matmul(x, self.weight, self.SCB, bias)

    def extend_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"threshold={self.threshold}")


class LoRAAdapter(nn.Cell):
    """``base(x) + scale * up(down(x))``: a frozen quantized ``base`` Cell (e.g. :class:`Linear4bitCell`) with a
    trainable low-rank adapter (QLoRA, Dettmers et al., arXiv 2305.14314). ``down`` starts random, ``up`` at zero,
    so the adapter starts as the base layer."""

    def __init__(self, base, r=8, alpha=16, seed=0):
        super().__init__()
        self.base = base
        k, n = base.in_features, base.out_features
        rng = np.random.RandomState(seed)
        self.lora_down = Parameter(Tensor((rng.randn(r, k) / np.sqrt(k)).astype(np.float32)), name="lora_down")
        self.lora_up = Parameter(Tensor(np.zeros((n, r), np.float32)), name="lora_up")
        self.scale = float(alpha) / float(r)
        self._mm = ops.MatMul(transpose_b=True)

    def construct(self, x):
        y = self.base(x)
        h = self._mm(self._mm(ops.reshape(ops.cast(x, ms.float32), (-1, x.shape[-1])), self.lora_down), self.lora_up)
        return ops.add(y, ops.cast(ops.reshape(ops.mul(h, self.scale), y.shape), y.dtype))
