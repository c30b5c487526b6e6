"""``LinearFP``: the fast path for the full-precision ``nn.Linear`` layers a quantized model keeps (``lm_head``).

mindtorch's ``nn.Linear`` runs MindSpore's ``dense``, which on the CPU is very slow at small batch (1 x 576 ->
49152, SmolLM2-135M's lm_head: ~200 ms against ~9 ms for ``MatMul(transpose_b=True)``) and rejects bfloat16.
A quantized model keeps ``lm_head`` in full precision (upstream's ``llm_int8_skip_modules`` default), so it
becomes the slowest layer of a decode step. ``LinearFP`` is an ``nn.Linear`` (same parameters, state dict,
``isinstance``) whose forward computes the same ``x @ W.T + b`` through
:func:`bitsandbytes_ms.functional.gemm_fp` (native ``cgemm_fp_*`` up to
:data:`~bitsandbytes_ms.functional.GEMM_FP_NATIVE_MAX_ROWS` rows, ``MatMul(transpose_b=True)`` above):

* inference (PyNative mode, no gradient being recorded, CPU library: :func:`bitsandbytes_ms._hostcall.active`)
  at up to the native row limit: ONE native call through the host-call bridge -- the activation's host copy,
  the weight's own memory (no copy), a result array handed to MindSpore without a copy;
* no gradient but no host calls (``BNB_MS_HOSTCALL=0``): the same kernel through ``ops.Custom``;
* a gradient being recorded (``mindspore.value_and_grad``), graph mode, or a dtype outside fp32/fp16/bf16:
  ``nn.Linear``'s own forward (differentiable; the fast path is inference only);
* an input whose dtype differs from the weight's: ``RuntimeError`` naming both, as torch (MindSpore's dense
  raised a C++ error).

:func:`use_fast_fp_layers` turns a model's plain ``nn.Linear`` layers into ``LinearFP`` in place (the class of
the module object is swapped: parameters, hooks and ties stay as they are); the integration
(:mod:`bitsandbytes_ms.integrations`) does that for the layers it keeps in full precision.
"""

from __future__ import annotations

import math as _math
from typing import Iterable as _Iterable, List as _List, Optional as _Optional

import mindnlp  # noqa: F401  (must precede `import torch`; makes torch = mindtorch)
import mindspore as _ms
import mindtorch as torch
import numpy as _np
from mindspore import context as _ms_context
from mindspore.common.api import _pynative_executor

from .. import _hostcall as _H
from .. import _launch_blocking
from ..backends import native as _native
from .. import functional as _F
from ..utils import dtype_name as _dtype_name
from .modules import _CudaGuard

_FLOAT = (_ms.float32, _ms.float16, _ms.bfloat16)
_ctx, _MODE = _ms_context._context, _ms_context.ms_ctx_param.mode


class LinearFP(_CudaGuard, torch.nn.Linear):
    """``nn.Linear`` with the native full-precision GEMV/GEMM forward (see the module docstring).

    Same constructor, parameters and state dict as ``torch.nn.Linear``; :meth:`from_linear` converts an
    existing layer in place. Without a CUDA device ``.cuda()`` / ``.to("cuda")`` raise one ``RuntimeError``
    saying so (as every layer in :mod:`bitsandbytes_ms.nn`)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)

    @classmethod
    def from_linear(cls, linear) -> "LinearFP":
        """Turns ``linear`` (exactly a ``torch.nn.Linear``) into a ``LinearFP`` in place and returns it: the
        module object, its parameters (and any weight tying), hooks and mode stay as they are."""
        if isinstance(linear, cls):
            return linear
        if type(linear) is not torch.nn.Linear:
            raise TypeError(f"LinearFP.from_linear: `linear` must be a torch.nn.Linear; got {type(linear).__name__}")
        linear.__class__ = cls
        return linear

    # per-instance caches, made on first use (from_linear does not run __init__)
    def _fp_state(self):
        st = self.__dict__.get("_fp_cache")
        if st is None:
            st = self.__dict__["_fp_cache"] = {"w": _H.DeviceView(), "b": _H.DeviceView(), "bound": {}}
        return st

    def __getstate__(self):  # copies and pickles drop the caches (views of this process's memory)
        state = super().__getstate__()
        state.pop("_fp_cache", None)
        return state

    def forward(self, x):
        if not _launch_blocking._state["done"]:
            _launch_blocking.ensure()  # MindSpore's async CPU mode: ~6x slower generation (see _launch_blocking)
        w = self.weight
        dt = x.dtype
        if dt != w.dtype:  # torch: "mat1 and mat2 must have the same dtype"; MindSpore's dense: a C++ error
            raise RuntimeError(f"LinearFP: `input` must have the weight's dtype {_dtype_name(w.dtype)}; got "
                               f"{_dtype_name(dt)}")
        b = self.bias
        if b is not None and b.dtype != w.dtype:
            # torch's linear refuses it ("self and mat2 must have the same dtype"), as does nn.Linear's own path here
            # (MindSpore's Dense, with a C++ stack); only the no-grad fast path accepted it (issue 34)
            raise RuntimeError(f"LinearFP: `bias` must have the weight's dtype {_dtype_name(w.dtype)}; got "
                               f"{_dtype_name(b.dtype)}")
        if dt not in _FLOAT:
            return super().forward(x)
        shape = x.shape
        if not len(shape) or len(w.shape) != 2 or shape[-1] != w.shape[1]:
            raise ValueError(f"LinearFP: `input` must have shape [..., {int(w.shape[-1])}] (the weight is "
                             f"{list(w.shape)}); got {list(shape)}")
        if _H.active():  # PyNative, no gradient recorded, CPU library
            if b is None or b.dtype in _FLOAT:
                rows = _math.prod(shape[:-1])
                if rows and _F.gemm_fp_uses_native(rows, dt):
                    return self._host_forward(x, w, b, dt, tuple(shape[:-1]) + (int(w.shape[0]),))
            return _F.gemm_fp(x, w, b)
        if _pynative_executor.requires_grad() or _ctx().get_param(_MODE) != _ms.PYNATIVE_MODE:
            return super().forward(x)  # differentiable (and traceable) path
        return _F.gemm_fp(x, w, b)

    def _host_forward(self, x, w, b, dt, out_shape):
        st = self._fp_state()
        xa = _H.host(x)  # first: waits for everything queued before (in-place weight updates included)
        wa = st["w"].get(w)
        if wa is None:
            wa = _H.host(w)
        ba = None
        if b is not None:
            ba = st["b"].get(b)
            if ba is None:
                ba = _H.host(b)
        out = _H.empty(out_shape, dt)
        call = st["bound"].get(dt)
        if call is None:
            call = st["bound"][dt] = _native.gemm_fp_entry(dt).bind(xa, wa, ba, out)
        else:
            call.set(0, xa)
            call.set(1, wa)
            call.set(2, ba)
            call.set(3, out)
        call()
        return _H.wrap(out)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", native"


def use_fast_fp_layers(model, names: _Optional[_Iterable[str]] = None) -> _List[str]:
    """Turns the plain ``torch.nn.Linear`` layers of ``model`` (all of them, or the named ones) into
    :class:`LinearFP` in place. Returns the names of the layers converted (subclasses of ``nn.Linear``,
    e.g. quantized or LoRA layers, are left alone)."""
    wanted = None if names is None else set(names)
    done = []
    for name, module in model.named_modules():
        if type(module) is torch.nn.Linear and (wanted is None or name in wanted):
            LinearFP.from_linear(module)
            done.append(name)
    return done
