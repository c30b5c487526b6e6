"""Quantized modules, composed from :mod:`bitsandbytes_ms.autograd._functions`.

These layers are mindtorch modules (after ``import mindnlp``, ``torch.nn`` is mindtorch's), so they drop into
mindnlp models; all numerics live in :mod:`bitsandbytes_ms.functional` / :mod:`~bitsandbytes_ms.autograd._functions`.
Names: ``torch`` is mindtorch; ``_ms`` / ``_msops`` are MindSpore and its ``ops``; ``_F`` is
:mod:`bitsandbytes_ms.functional`; ``_autograd`` is :mod:`bitsandbytes_ms.autograd._functions`."""

import copy as _copy
import logging as _logging
import math as _math
from typing import Any as _Any, Dict as _Dict, Optional as _Optional

import numpy as _np
import mindnlp  # noqa: F401  (first: it makes `torch` resolve to mindtorch for transformers and us)
import mindspore as _ms
import mindtorch as torch
from mindspore import ops as _msops

from .. import _hostcall, _launch_blocking
from .. import functional as _F
from ..autograd import _functions as _autograd
from ..formats import fourbit as _fourbit
from .._ops import tag as _tag_device
from ..utils import dtype_from_name as _dtype_from_name
from ..optim import GlobalOptimManager as _GlobalOptimManager

_logger = _logging.getLogger(__name__)


def _device_type(device) -> _Optional[str]:
    """``"cuda"`` for ``"cuda:1"``, ``torch.device("cuda", 1)`` or ``1`` (an int is a CUDA index, as torch has it);
    None for None."""
    if device is None:
        return None
    if isinstance(device, int):
        return "cuda"
    return str(getattr(device, "type", device)).split(":")[0]


def _parse_to(args, kwargs):
    """What a ``.to(...)`` call asks for, parsed as torch parses it: ``(device_type, dtype)``, None where not given.

    Accepts ``.to(device)``, ``.to(dtype)``, ``.to(device, dtype)``, ``.to(tensor)`` (that tensor's device and
    dtype), keywords ``device=`` / ``dtype=``, and ignores ``non_blocking`` / ``copy`` / ``memory_format``. A
    device is a str (``"cuda:0"``), a ``torch.device`` or an int; ``device_type`` is its type (``"cpu"``,
    ``"cuda"``, ``"meta"``). Every layer and parameter here that overrides ``.to()`` parses it with this."""
    device, dtype = kwargs.get("device"), kwargs.get("dtype")
    for a in args:
        if isinstance(a, bool):  # non_blocking / copy given by position
            continue
        if isinstance(a, _ms.Tensor):
            device, dtype = getattr(a, "device", None), a.dtype
        elif isinstance(a, (str, int, torch.device)):
            device = a
        elif isinstance(a, _ms.dtype.Type):
            dtype = a
    return _device_type(device), dtype


def _asks_cuda(args, kwargs) -> bool:
    """Whether a ``.to(...)`` call names a CUDA device as a str or ``torch.device`` (an int index is accepted as
    mindtorch's own modules accept it: MindSpore places tensors by its device target)."""
    devices = [kwargs.get("device")] + [a for a in args if isinstance(a, (str, torch.device))]
    return any(d is not None and _device_type(d) == "cuda" for d in devices)


def _refuse_cuda(obj, call: str) -> None:
    """On a machine without a CUDA device (MindSpore's device target is not GPU), ``.cuda()`` / ``.to("cuda")`` of
    any layer or parameter here raises this one ``RuntimeError``, before anything is moved or quantized, as torch
    does without CUDA (mindtorch's own error was a MindSpore C++ stack, and some layers accepted the call)."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"{type(obj).__name__}.{call}: no CUDA device is available (MindSpore's device target is "
                           f"{_ms.get_context('device_target')}); use .cpu() or .to('cpu'), which quantize the weight "
                           f"here as .cuda() does upstream")


class _CudaGuard:
    """Mixin for the layers here (before ``torch.nn.Linear`` in the bases): ``.cuda()`` and ``.to(<cuda device>)``
    raise :func:`_refuse_cuda`'s error where no CUDA device is available; otherwise they are ``nn.Module``'s."""

    def cuda(self, device=None):
        _refuse_cuda(self, "cuda()")
        return super().cuda(device)

    def to(self, *args, **kwargs):
        if _asks_cuda(args, kwargs):
            _refuse_cuda(self, "to(...)")
        return super().to(*args, **kwargs)


class _ParamDevices:
    """``cpu()`` / ``cuda()`` / ``xpu()`` of the parameters that quantize themselves on a device move (Params4bit,
    Int8Params, Embedding8bit's weight): each goes through the class's ``to()``, as upstream's do; ``cuda()`` raises
    :func:`_refuse_cuda`'s error where there is no CUDA device, ``xpu()`` :func:`_to_xpu`'s. Before
    ``torch.nn.Parameter`` in the bases."""

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None, non_blocking=False):
        _refuse_cuda(self, "cuda()")
        return self.to("cuda" if device is None else device)

    def xpu(self, device=None, non_blocking=False):
        return _to_xpu(self, device)


# ---- 4-bit (Params4bit, Linear4bit, LinearFP4, LinearNF4) ----


class Params4bit(_ParamDevices, torch.nn.Parameter):
    """A weight that quantizes itself to 4 bits once (upstream ``bnb.nn.Params4bit``).

    Holds the full-precision data until :meth:`to` is called with a device (or :meth:`quantize`
    explicitly); after that the tensor holds the packed bytes ``[(n+1)//2, 1]`` and
    ``quant_state`` the :class:`~bitsandbytes_ms.functional.QuantState`. Later ``.to()``, ``copy``,
    ``deepcopy`` and further quantize requests keep the packed data and its state.
    Extra keyword arguments (``_device``, ``meta``, ``_requires_grad`` that Hugging Face passes from
    ``old_param.__dict__``) are accepted and ignored.
    """

    def __init__(self, data=None, requires_grad: bool = False, quant_state=None, blocksize: _Optional[int] = None,
                 compress_statistics: bool = True, quant_type: str = "fp4", quant_storage=_ms.uint8, module=None,
                 bnb_quantized: bool = False, **kwargs):
        if data is None:
            data = torch.empty(0)
        super().__init__(data, requires_grad)
        self.blocksize = 64 if blocksize is None else blocksize
        self.compress_statistics = compress_statistics
        self.quant_type = quant_type
        self.quant_state = quant_state
        self.quant_storage = quant_storage
        self.bnb_quantized = bnb_quantized
        self.module = module

    def _attrs(self) -> _Dict[str, _Any]:
        return dict(requires_grad=self.requires_grad, quant_state=self.quant_state, blocksize=self.blocksize,
                    compress_statistics=self.compress_statistics, quant_type=self.quant_type,
                    quant_storage=self.quant_storage, module=self.module, bnb_quantized=self.bnb_quantized)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["data"] = self.data
        state["requires_grad"] = self.requires_grad
        return state

    def __setstate__(self, state):
        state = dict(state)
        state.pop("data", None)
        self.requires_grad = state.pop("requires_grad", False)
        self.__dict__.update(state)

    def __reduce_ex__(self, protocol):
        # pickle / torch.save keep the subclass and its attributes (upstream relies on torch's Tensor pickling
        # for that; mindtorch's rebuilds a plain tensor). The state goes in the third slot so that a module
        # referring back to this parameter (``self.module``) pickles without a cycle.
        state = self.__getstate__()
        del state["data"]
        return (_rebuild_params4bit, (type(self), torch.Tensor(self.data), self.requires_grad), state)

    # Pass-through properties for the QuantState entries that appear as ``weight.<key>`` in a state dict,
    # so that code resolving dotted state-dict names with getattr (FSDP's _get_fqns) finds them (upstream #1405).
    def _qs_attr(self, name, nested=False):
        qs = self.__dict__.get("quant_state")
        if qs is None or (nested and qs.state2 is None):
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return qs

    absmax = property(lambda self: self._qs_attr("absmax").absmax)
    code = property(lambda self: self._qs_attr("code").code)
    quant_map = property(lambda self: self._qs_attr("quant_map").code)
    offset = property(lambda self: self._qs_attr("offset").offset)
    state2 = property(lambda self: self._qs_attr("state2").state2)
    nested_absmax = property(lambda self: self._qs_attr("nested_absmax", True).state2.absmax)
    nested_blocksize = property(lambda self: self._qs_attr("nested_blocksize", True).state2.blocksize)
    nested_quant_map = property(lambda self: self._qs_attr("nested_quant_map", True).state2.code)
    nested_dtype = property(lambda self: self._qs_attr("nested_dtype", True).state2.dtype)
    nested_offset = property(lambda self: self._qs_attr("nested_offset").offset)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """torch.chunk / torch.split of a Params4bit give Params4bit pieces with the same attributes (as upstream,
        for FSDP-style sharding). mindtorch dispatches here only with the patches
        ``mindtorch-torch-function-chunk``/``-split`` applied (``bitsandbytes_ms.register()``)."""
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if getattr(func, "__name__", None) not in ("chunk", "split"):
            return result
        src = args[0] if args else kwargs.get("input", kwargs.get("tensor"))
        attrs = src._attrs()

        def wrap(t):
            return cls(t, **attrs)

        return tuple(wrap(t) for t in result) if isinstance(result, (tuple, list)) else wrap(result)

    def __copy__(self):
        return type(self)(torch.Tensor(self.data), **self._attrs())

    def __deepcopy__(self, memo):
        attrs = self._attrs()
        attrs["quant_state"] = _copy.deepcopy(self.quant_state, memo)
        attrs["module"] = None
        new = type(self)(torch.Tensor(self.data.asnumpy().copy()) if self.dtype != _ms.bfloat16 else self.data.copy(),
                         **attrs)
        memo[id(self)] = new
        return new

    @classmethod
    def from_prequantized(cls, data, quantized_stats: _Dict[str, _Any], requires_grad: bool = False, device="cuda",
                          module=None, **kwargs) -> "Params4bit":
        """Rebuilds a quantized parameter from packed ``data`` and the ``weight.*`` entries of a
        state dict (``QuantState.as_dict(packed=True)`` keys). ``device`` defaults to ``"cuda"`` as upstream and is
        accepted and ignored, as by :meth:`QuantState.to`: MindSpore places tensors by its context (the CPU
        here), so a call written for a CUDA machine runs unchanged."""
        qs = _F.QuantState.from_dict(qs_dict=quantized_stats, device=device)
        self = cls(data, requires_grad=requires_grad, quant_state=qs, blocksize=qs.blocksize,
                   compress_statistics=qs.nested, quant_type=qs.quant_type, quant_storage=data.dtype,
                   module=module, bnb_quantized=True)
        if module is not None:
            module.quant_state = qs
        return self

    def quantize(self):
        """Quantizes the data (once) and returns ``self``."""
        if self.bnb_quantized:
            return self
        w = self.data
        if w.dtype not in _F.FLOAT_DTYPES:
            raise ValueError(f"Params4bit: cannot quantize data of dtype {w.dtype}")
        packed, state = _F.quantize_4bit(w, blocksize=self.blocksize, compress_statistics=self.compress_statistics,
                                         quant_type=self.quant_type, quant_storage=self.quant_storage)
        self.data = packed
        self.quant_state = state
        if self.module is not None:
            self.module.quant_state = state
        self.bnb_quantized = True
        return self

    _quantize = quantize  # upstream's private name (takes a device there)

    def to(self, *args, **kwargs):
        if _asks_cuda(args, kwargs):
            _refuse_cuda(self, "to(...)")
        dev_type, dtype = _parse_to(args, kwargs)
        if dev_type is not None and dev_type != "meta" and not self.bnb_quantized:
            return self.quantize()
        if self.bnb_quantized:
            if dtype is not None and self.quant_state is not None and dtype in _F.FLOAT_DTYPES:
                self.quant_state.dtype = dtype  # dequantize to the new dtype, as upstream
            return self
        res = super().to(*args, **kwargs)
        return type(self)(res, **self._attrs())


def _to_xpu(param, device):
    """Upstream's ``.xpu()`` moves (and quantizes) a weight onto an Intel XPU; there is none on MindSpore: a clear
    error, before anything is quantized (an explicit non-XPU ``device`` is an ordinary ``.to(device)``)."""
    if device is None or _device_type(device) == "xpu":
        raise RuntimeError(f"{type(param).__name__}.xpu(): bitsandbytes_ms has no Intel XPU backend (MindSpore: "
                           f"CPU, and its CUDA library); use .cpu(), .cuda() or .to(device)")
    return param.to(device)


def _rebuild_params4bit(cls, data, requires_grad):
    """Unpickling helper of :class:`Params4bit` (its attributes arrive through ``__setstate__``)."""
    return cls(data, requires_grad=requires_grad)


_LINEAR_DTYPES = (_ms.float32, _ms.float16, _ms.bfloat16)


def _check_input_dtype(layer, t, arg: str, dtypes, expected: str) -> str:
    """The first checks torch makes of a layer's input: a tensor (TypeError) of one of ``dtypes`` (RuntimeError,
    as torch raises; ``expected`` says what it wants). Returns the layer's name for further messages."""
    name = type(layer).__name__
    if not isinstance(t, _ms.Tensor):
        raise TypeError(f"{name}: `{arg}` must be a tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise RuntimeError(f"{name}: {expected}; got {_F.dtype_name(t.dtype)}")
    return name


def _loaded_tensor_error(key: str, t, dtypes, numel: _Optional[int], shape=None, what: str = ""):
    """Why a state-dict tensor cannot be what a layer needs at ``key`` (None when it can): one of ``dtypes`` and,
    when given, exactly ``numel`` elements / exactly ``shape``. Checked at load, so that a checkpoint that "matched
    all keys" never fails (or computes garbage) only at forward; the message names the key, the expected and the
    found."""
    names = " or ".join(_F.dtype_name(d) for d in dtypes)
    want = f" with shape {tuple(shape)}" if shape is not None else "" if numel is None else f" with {numel} elements"
    if (t.dtype not in dtypes or (shape is not None and tuple(t.shape) != tuple(shape))
            or (numel is not None and _math.prod(t.shape) != numel)):
        return (f"{key}: expected {what + ', ' if what else ''}{names}{want}; got {_F.dtype_name(t.dtype)} "
                f"shape {tuple(t.shape)}")
    return None


def _check_features(owner: str, **dims) -> None:
    """torch's nn.Linear refuses a negative size ("Trying to create tensor with negative dimension"); mindtorch's
    init failed in math with "math domain error" naming nothing (issue 34)."""
    for arg, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, (int, _np.integer)) or v < 0:
            raise RuntimeError(f"{owner}: `{arg}` must be a non-negative int; got {type(v).__name__} {v!r}")


def _check_compute_dtype(compute_dtype):
    """None or a float dtype (a name such as "float16" is resolved); anything else failed only at forward, with a
    KeyError inside mindtorch's Tensor.to."""
    if isinstance(compute_dtype, str):
        try:
            compute_dtype = _dtype_from_name(compute_dtype)
        except ValueError:
            pass  # refused below, naming the value
    if compute_dtype is not None and compute_dtype not in (_ms.float32, _ms.float16, _ms.bfloat16):
        raise TypeError(f"Linear4bit: `compute_dtype` must be None, float32, float16 or bfloat16; got {compute_dtype!r}")
    return compute_dtype


def _check_linear_input(layer, x) -> None:
    """What torch's ``linear`` requires of its input, checked before any kernel runs (torch raises
    RuntimeError for an integer or a 0-d input; without this an int64 input came back as truncated int64)."""
    name = _check_input_dtype(layer, x, "x", _LINEAR_DTYPES, "`x` must have dtype float32, float16 or bfloat16 "
                                                             "(the layer's weight is floating point)")
    if x.ndim == 0:
        raise RuntimeError(f"{name}: `x` must have at least 1 dimension, [..., {layer.in_features}]; got a 0-d tensor")


def fix_4bit_weight_quant_state_from_module(module) -> None:
    """Restores ``weight.quant_state`` from ``module.quant_state`` when a framework replaced the
    parameter object (upstream helper of the same name)."""
    if getattr(module.weight, "quant_state", None) is not None:
        return
    if getattr(module, "quant_state", None) is None:
        _logger.warning("FP4 quantization state not initialized. Please call .to() or .quantize() first.")
    if not isinstance(module.weight, Params4bit):
        module.weight = Params4bit(module.weight, quant_state=getattr(module, "quant_state", None),
                                   bnb_quantized=getattr(module, "quant_state", None) is not None, module=module)
    else:
        module.weight.quant_state = getattr(module, "quant_state", None)


class Linear4bit(_CudaGuard, torch.nn.Linear):
    """4-bit quantized linear layer (upstream ``bnb.nn.Linear4bit``; QLoRA, arXiv 2305.14314).

    The weight is a :class:`Params4bit`; it is quantized on ``.to(device)`` / ``.cuda()`` / ``.cpu()``,
    on :meth:`Params4bit.quantize`, or (unlike upstream, which fails) on the first forward. Without a CUDA device
    (MindSpore's CPU target) ``.cuda()`` / ``.to("cuda")`` raise one ``RuntimeError`` saying so, as every layer
    and parameter here does; ``.cpu()`` / ``.to("cpu")`` quantize.
    ``forward`` computes ``x @ W.T + b`` in ``compute_dtype`` (default: the input's dtype when it is
    fp32/bf16) through :func:`bitsandbytes_ms.matmul_4bit` and returns the input's dtype.

    ``state_dict`` holds ``weight`` (packed), ``bias`` and the quant state under upstream's keys
    (``weight.absmax``, ``weight.quant_map``, ``weight.nested_absmax``, ``weight.nested_quant_map``,
    ``weight.quant_state.bitsandbytes__<type>``); ``load_state_dict`` of it restores an identical layer.
    """

    def __init__(self, input_features, output_features, bias=True, compute_dtype=None, compress_statistics=True,
                 quant_type="fp4", quant_storage=_ms.uint8, device=None):
        _check_features(type(self).__name__, input_features=input_features, output_features=output_features)
        compute_dtype = _check_compute_dtype(compute_dtype)
        super().__init__(input_features, output_features, bias, device)
        self.weight = Params4bit(self.weight.data, requires_grad=False, compress_statistics=compress_statistics,
                                 quant_type=quant_type, quant_storage=quant_storage, module=self)
        self.compute_dtype = compute_dtype
        self.compute_type_is_set = compute_dtype is not None
        self.quant_state = None
        self.quant_storage = quant_storage

    def set_compute_type(self, x):
        if x.dtype in (_ms.float32, _ms.bfloat16):
            self.compute_dtype = x.dtype
        elif x.dtype == _ms.float16:
            if self.compute_dtype in (None, _ms.float32) and x.numel() == x.shape[-1]:
                _logger.warning("Input type into Linear4bit is torch.float16, but bnb_4bit_compute_dtype=torch.float32 "
                                "(default). This will lead to slow inference.")
            if self.compute_dtype in (None, _ms.float32) and x.numel() != x.shape[-1]:
                _logger.warning("Input type into Linear4bit is torch.float16, but bnb_4bit_compute_dtype=torch.float32 "
                                "(default). This will lead to slow inference or training speed.")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        qs = getattr(self.weight, "quant_state", None)
        if qs is not None:
            for k, v in qs.as_dict(packed=True).items():
                destination[prefix + "weight." + k] = v

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        wkey = prefix + "weight"
        qkeys = [k for k in state_dict if k.startswith(wkey + ".")]
        if wkey in state_dict and qkeys:
            stats = {k[len(wkey) + 1:]: state_dict[k] for k in qkeys}
            data = state_dict[wkey]
            qs = _F.QuantState.from_dict(qs_dict=stats)
            errs = self._quantized_weight_errors(qs, data, wkey)
            if errs:  # the layer is left as it was
                error_msgs.extend(errs)
                return
            self.weight = Params4bit.from_prequantized(torch.Tensor(data), stats, requires_grad=False, module=self)
            self.quant_state = self.weight.quant_state
            rest = {k: v for k, v in state_dict.items() if k != wkey and k not in qkeys}
            # the bias (and anything else) goes through the default path
            super()._load_from_state_dict(rest, prefix, local_metadata, False, missing_keys, unexpected_keys,
                                          error_msgs)
            if strict and self.bias is not None and prefix + "bias" not in state_dict:
                missing_keys.append(prefix + "bias")
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _quantized_weight_errors(self, qs, data, wkey):
        """Why a quantized checkpoint's weight (packed ``data`` and its QuantState) cannot be this layer's: the
        quantized shape must be [out_features, in_features] (a transposed or other layer's weight would compute
        garbage through matmul_4bit's deprecated [K, N] branch) and the packed bytes and absmax entries exactly
        what that shape and the blocksize need. Messages name the state-dict keys, as torch's size mismatches."""
        want = (int(self.out_features), int(self.in_features))
        shape = None if qs.shape is None else tuple(int(d) for d in qs.shape)
        src = f"{wkey}.quant_state.bitsandbytes__{qs.quant_type}"
        if shape != want:
            return [f"size mismatch for {wkey}: copying a 4-bit weight of shape {shape} ({src}), the shape in current "
                    f"model is {want} (out_features, in_features)"]
        try:
            _F._check_blocksize(qs.blocksize, _F.FOURBIT_BLOCKSIZES, src)
            if qs.nested:
                _F._check_blocksize(qs.state2.blocksize, _F.BLOCKWISE_BLOCKSIZES, src)
        except (TypeError, ValueError) as e:
            return [str(e)]
        nbytes = int(_math.prod(data.shape)) * _F._itemsize(data.dtype)
        keys = (f"the shape in {src}", f"{wkey}.absmax", f"{wkey}.nested_absmax")
        f32 = (_ms.float32,)
        checks = [(f"{wkey}.quant_map", qs.code, f32, 16, "the 16-entry 4-bit code"),
                  (f"{wkey}.absmax", qs.absmax, (_ms.uint8,) if qs.nested else f32, None,
                   "8-bit codes of the block absmax (nested)" if qs.nested else "the block absmax")]
        if qs.nested:
            checks += [(f"{wkey}.nested_absmax", qs.state2.absmax, f32, None, "the nested block absmax"),
                       (f"{wkey}.nested_quant_map", qs.state2.code, f32, 256, "the 256-entry 8-bit code")]
            if isinstance(qs.offset, _ms.Tensor):
                checks.append((f"{wkey}.nested_offset", qs.offset, f32, 1, "one offset"))
        errs = [e for e in (_loaded_tensor_error(k, t, d, n, what=w) for k, t, d, n, w in checks) if e]
        return errs + [f"size mismatch: {e}" for e in _F._4bit_size_errors(qs, nbytes, wkey, keys=keys)]

    def forward(self, x):
        if not _launch_blocking._state["done"]:
            _launch_blocking.ensure()  # MindSpore's async CPU mode: ~6x slower generation (see _launch_blocking)
        _check_linear_input(self, x)
        w = self.weight
        qs = getattr(w, "quant_state", None)
        if qs is None or not self.compute_type_is_set or not isinstance(w, Params4bit):
            self._prepare(x, qs)
            w = self.weight
            qs = w.quant_state
        # the 4-bit format's one door: the route of these dtypes (lean, compute dtype, full, autograd) is its choice
        return _fourbit.linear(x, w, qs, self.bias, self.compute_dtype, type(self).__name__)

    def _prepare(self, x, qs):
        """What the first forward sets: x's width checked, the compute dtype (from x, as upstream), and the weight
        quantized (or its quant state restored from the module). The forward reads the weight after it."""
        K = int(qs.shape[1]) if qs is not None and qs.shape is not None else int(self.in_features)
        if x.shape[-1] != K:  # (x has a dimension: _check_linear_input)  # never matmul_4bit's deprecated [K, N] branch: the weight is [N, K]
            raise ValueError(f"{type(self).__name__}: `x` must have last dimension {K} (in_features); got shape "
                             f"{tuple(x.shape)}")
        if not self.compute_type_is_set:
            self.set_compute_type(x)
            self.compute_type_is_set = True
        if not isinstance(self.weight, Params4bit) or getattr(self.weight, "quant_state", None) is None:
            if isinstance(self.weight, Params4bit) and not self.weight.bnb_quantized:
                self.weight.quantize()
            else:
                fix_4bit_weight_quant_state_from_module(self)
        if self.weight.quant_state is None:  # (fix_4bit_weight_quant_state_from_module warned: nothing to restore it from)
            raise ValueError("quant_state is required")  # matmul_4bit's words, as before the door served every call


class LinearFP4(Linear4bit):
    """:class:`Linear4bit` with ``quant_type="fp4"``."""

    def __init__(self, input_features, output_features, bias=True, compute_dtype=None, compress_statistics=True,
                 quant_storage=_ms.uint8, device=None):
        super().__init__(input_features, output_features, bias, compute_dtype, compress_statistics, "fp4",
                         quant_storage, device)


class LinearNF4(Linear4bit):
    """:class:`Linear4bit` with ``quant_type="nf4"`` (NormalFloat, QLoRA)."""

    def __init__(self, input_features, output_features, bias=True, compute_dtype=None, compress_statistics=True,
                 quant_storage=_ms.uint8, device=None):
        super().__init__(input_features, output_features, bias, compute_dtype, compress_statistics, "nf4",
                         quant_storage, device)


# ---- int8 (LLM.int8(): Int8Params, Linear8bitLt) ----

#: weights of more elements than this quantize in row chunks of about this size (see _quantize_rows_chunked)
_QUANT_CHUNK = 1 << 22


def _quantize_rows_chunked(data):
    """``int8_vectorwise_quant`` of a 2-D weight, a chunk of rows at a time: the same bytes (threshold 0: each row
    is quantized on its own), without the whole weight's float16 copy. Why: that copy came from MindSpore's memory
    pool, which keeps it after the call: an int8 lm_head made from SmolLM2's tied 113 MB fp32 embedding left ~54 MiB
    of RSS behind for good (issue 32's memory bar)."""
    R, K = int(data.shape[0]), int(data.shape[1])
    src = _hostcall.host_view(_hostcall.DeviceView(), data)  # the weight's own memory (asnumpy would copy it all)
    CB, SCB = _np.empty((R, K), _np.int8), _np.empty((R,), _np.float32)
    step = max(1, _QUANT_CHUNK // max(K, 1))
    for r0 in range(0, R, step):
        r1 = min(R, r0 + step)
        piece = _hostcall.wrap(_np.ascontiguousarray(src[r0:r1]))
        cb, scb, _ = _F.int8_vectorwise_quant(_autograd._as_quant_input(piece))
        CB[r0:r1] = _hostcall.host(cb)
        SCB[r0:r1] = _hostcall.host(scb)
    return _hostcall.wrap(CB), _hostcall.wrap(SCB)


def _as_mindtorch(t):
    if t is not None and not hasattr(t, "_device"):
        _tag_device(t)
    return t


class Int8Params(_ParamDevices, torch.nn.Parameter):
    """A weight for :class:`Linear8bitLt` (upstream ``bnb.nn.Int8Params``): holds float weights until it
    is quantized, then the int8 ``CB`` as its data with float32 row scales ``SCB``.

    Quantizes exactly once: on ``.to(device)``/``.cpu()``/``.cuda()`` (as upstream) or an explicit
    :meth:`quantize` (the CPU way), and never re-quantizes int8 data. Without a CUDA device ``.cuda()`` /
    ``.to("cuda")`` raise one ``RuntimeError`` saying so (as every layer here). Extra keyword arguments (the
    ``_device``/``meta``/``_requires_grad`` that transformers passes from ``old_param.__dict__``) are
    accepted and ignored.
    """

    def __init__(self, data=None, requires_grad=True, has_fp16_weights=False, CB=None, SCB=None, **kwargs):
        if data is None:
            data = torch.empty(0)
        _as_mindtorch(data)
        super().__init__(data, requires_grad)
        self.has_fp16_weights = has_fp16_weights
        self.CB = CB
        self.SCB = SCB

    @property
    def is_quantized(self) -> bool:
        return self.dtype == _ms.int8

    def quantize(self) -> "Int8Params":
        """Quantizes the float weights row-wise (``int8_vectorwise_quant``) in place: data becomes the
        int8 ``CB`` and ``SCB`` the row scales. No-op for ``has_fp16_weights=True`` or int8 data."""
        if self.has_fp16_weights or self.is_quantized or self.numel() == 0:
            return self
        data = _F._contiguous(self.data)
        if data.ndim == 2 and self.numel() > _QUANT_CHUNK:
            CB, SCB = _quantize_rows_chunked(data)
        else:
            CB, SCB, _ = _F.int8_vectorwise_quant(_autograd._as_quant_input(data))
        self.data = _as_mindtorch(CB)
        self.CB = self.data
        self.SCB = _as_mindtorch(SCB)
        return self

    _quantize = quantize

    def _with_attrs(self, data):
        new = Int8Params(data, requires_grad=self.requires_grad, has_fp16_weights=self.has_fp16_weights,
                         CB=self.CB, SCB=self.SCB)
        return new

    def __deepcopy__(self, memo):
        new = Int8Params(_as_mindtorch(self.data.clone()), requires_grad=self.requires_grad,
                         has_fp16_weights=self.has_fp16_weights,
                         CB=None, SCB=_copy.deepcopy(self.SCB, memo) if self.SCB is not None else None)
        if self.CB is not None:
            new.CB = new.data
        memo[id(self)] = new
        return new

    def __copy__(self):
        return Int8Params(self.data, requires_grad=self.requires_grad, has_fp16_weights=self.has_fp16_weights,
                          CB=self.CB, SCB=self.SCB)

    def __reduce_ex__(self, protocol):
        # pickle / torch.save: keep the class, the flags and SCB (mindtorch's Parameter pickles as a plain
        # tensor, which would drop them); CB is the data itself once quantized
        return (_rebuild_int8params, (self.data, self.requires_grad, self.has_fp16_weights,
                                      self.CB is not None, self.SCB))

    def to(self, *args, **kwargs):
        if _asks_cuda(args, kwargs):
            _refuse_cuda(self, "to(...)")
        dev_type, dtype = _parse_to(args, kwargs)
        if dev_type is not None and dev_type != "meta" and not self.is_quantized and not self.has_fp16_weights:
            return self.quantize()
        if dtype is not None and not self.is_quantized and dtype != self.dtype:
            return self._with_attrs(_as_mindtorch(self.data.to(dtype)))
        return self


def _rebuild_int8params(data, requires_grad, has_fp16_weights, has_cb, SCB):
    """Unpickles an :class:`Int8Params` (see ``Int8Params.__reduce_ex__``)."""
    p = Int8Params(_as_mindtorch(data), requires_grad=requires_grad, has_fp16_weights=has_fp16_weights,
                   SCB=_as_mindtorch(SCB))
    if has_cb:
        p.CB = p.data
    return p


class Linear8bitLt(_CudaGuard, torch.nn.Linear):
    """LLM.int8() linear layer (upstream ``bnb.nn.Linear8bitLt``): ``y = x @ W.T + b`` with W stored as
    int8 rows plus float32 row scales (``weight.SCB``), activations quantized row-wise per call, and
    (``threshold > 0``) outlier feature columns multiplied in float32.

    Args:
        input_features, output_features, bias: as ``nn.Linear``.
        has_fp16_weights: keep float weights (training); False quantizes them (inference).
        threshold: outlier threshold (LLM.int8() uses 6.0); 0 disables the mixed-precision split.
        index: kept for upstream compatibility.
        device: accepted (MindSpore places tensors by context).

    The weight is quantized by ``.to(device)``/``.cpu()`` (as upstream), :meth:`quantize`, or lazily by
    the first forward. Without a CUDA device ``.cuda()`` / ``.to("cuda")`` raise one ``RuntimeError`` saying so
    (as every layer here). ``state_dict`` holds ``weight`` (int8), ``SCB`` (float32 [out]) and
    ``weight_format`` (uint8 0 = "row"); such a dict loads into a fresh module (quantized or not).
    """

    def __init__(self, input_features, output_features, bias=True, has_fp16_weights=True, threshold=0.0,
                 index=None, device=None):
        _check_features(type(self).__name__, input_features=input_features, output_features=output_features)
        super().__init__(input_features, output_features, bias)
        self.state = _autograd.MatmulLtState()
        self.index = index
        self.state.threshold = threshold
        self.state.has_fp16_weights = has_fp16_weights
        if threshold > 0.0 and not has_fp16_weights:
            self.state.use_pool = True
        self.weight = Int8Params(self.weight.data, has_fp16_weights=has_fp16_weights,
                                 requires_grad=has_fp16_weights)

    def quantize(self) -> "Linear8bitLt":
        """Quantizes the weight now (CPU has no device move to trigger it). Returns self."""
        if isinstance(self.weight, Int8Params):
            self.weight.quantize()
        return self

    def to(self, *args, **kwargs):
        res = super().to(*args, **kwargs)
        dev_type, _ = _parse_to(args, kwargs)
        if dev_type is not None and isinstance(self.weight, Int8Params):
            # Int8Params.to only quantizes (MindSpore places tensors by context); _CudaGuard checked the device
            self.weight.to("meta" if dev_type == "meta" else "cpu")
        return res

    def init_8bit_state(self):
        self.state.CB = self.weight.CB
        self.state.SCB = self.weight.SCB
        self.weight.CB = None
        self.weight.SCB = None

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.state.has_fp16_weights or self.weight is None or self.weight.dtype != _ms.int8:
            return  # float (or tied/replaced plain) weight: no SCB to write
        scb = getattr(self.weight, "SCB", None)
        if scb is None:
            scb = self.state.SCB
        if scb is None:
            return
        destination[prefix + "SCB"] = scb
        fmt = torch.tensor(0, dtype=torch.uint8)
        destination[prefix + "weight_format"] = _as_mindtorch(fmt)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        scb_key, w_key, fmt_key = prefix + "SCB", prefix + "weight", prefix + "weight_format"
        if scb_key in state_dict and not isinstance(self.weight, Int8Params):
            # tied/replaced plain weight: loading row scales into it would silently mis-scale it (upstream
            # raises the same error when the weight has no SCB slot)
            raise RuntimeError("Loading a quantized checkpoint into non-quantized Linear8bitLt is not supported: "
                               f"{w_key} is a plain {type(self.weight).__name__} (tied or replaced), not Int8Params")
        if scb_key in state_dict and w_key in state_dict:
            fmt = state_dict.get(fmt_key)
            if fmt is not None and int(_np_scalar(fmt)) != 0:
                error_msgs.append(f"{fmt_key}: only weight_format 0 ('row') is supported; got {int(_np_scalar(fmt))}")
                return
            w = state_dict[w_key]
            if w.dtype != _ms.int8:
                error_msgs.append(f"{w_key}: a checkpoint with {scb_key} must hold an int8 weight; got {w.dtype}")
                return
            if tuple(w.shape) != tuple(self.weight.shape):
                error_msgs.append(f"size mismatch for {w_key}: copying a param with shape {tuple(w.shape)}, "
                                  f"the shape in current model is {tuple(self.weight.shape)}")
                return
            err = _loaded_tensor_error(scb_key, state_dict[scb_key], _F.FLOAT_DTYPES, int(w.shape[0]),
                                       what=f"one row scale per row of {w_key}")
            if err:
                error_msgs.append(err)
                return
            scb = _as_mindtorch(state_dict[scb_key].astype(_ms.float32).reshape(-1).copy())
            data = _as_mindtorch(w.copy())
            self.weight = Int8Params(data, requires_grad=False, has_fp16_weights=False, CB=data, SCB=scb)
            self.state.has_fp16_weights = False
            self.state.reset_grads()
        elif w_key in state_dict and isinstance(self.weight, Int8Params):
            w = state_dict[w_key]
            if w.dtype == _ms.int8:
                # int8 codes are nothing without their row scales, and the layer's own belong to its own codes
                error_msgs.append(f"{w_key}: an int8 (quantized) weight needs its row scales {scb_key}, which the "
                                  f"state dict lacks")
                return
            if self.weight.is_quantized or self.state.CB is not None:
                # a full-precision weight into a quantized layer: quantized again from it (copied into the int8
                # codes it would be truncated, and the old row scales would stay)
                want = (int(self.out_features), int(self.in_features))
                if tuple(w.shape) != want:
                    error_msgs.append(f"size mismatch for {w_key}: copying a param with shape {tuple(w.shape)}, "
                                      f"the shape in current model is {want}")
                    return
                self.weight = Int8Params(_as_mindtorch(torch.Tensor(w).clone()), requires_grad=False,
                                         has_fp16_weights=False).quantize()
                self.state.CB = self.state.SCB = None
                self.state.reset_grads()
                rest = {k: v for k, v in state_dict.items() if k != w_key}
                super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                              error_msgs)
                if w_key in missing_keys:
                    missing_keys.remove(w_key)
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for key in (scb_key, fmt_key):
            if key in unexpected_keys:
                unexpected_keys.remove(key)

    def forward(self, x):
        if not _launch_blocking._state["done"]:
            _launch_blocking.ensure()  # MindSpore's async CPU mode: ~6x slower generation (see _launch_blocking)
        st = self.state
        plan = st.__dict__.get("_int8_linear_plan")
        if plan is not None and not self.training:
            # the lean form of the fused inference call (matmul's _int8_forward_fused) once it has run for this
            # weight, bias and input dtype: what the code below would do is already done (weight quantized,
            # state.CB is the weight, bias in x's dtype), nothing has moved, and no gradient is being recorded
            w = self.weight
            bias = self.bias
            if (st.CB is w and plan.matches(w, st.SCB) and not st.has_fp16_weights and not st.is_training
                    and (bias is None or bias.dtype == x.dtype) and _autograd._use_fused() and _hostcall.active()):
                thr = float(st.threshold) if st.threshold > 0.0 else 0.0
                res = plan.fast(x, bias, thr)
                if res is not None:
                    if thr > 0.0:
                        st._set_outlier_flags(res[1], x)
                    return res[0]
        self.state.is_training = self.training
        w = self.weight
        if not self.state.has_fp16_weights and isinstance(w, Int8Params) and not w.is_quantized:
            w.quantize()
        if getattr(w, "CB", None) is not None:
            self.init_8bit_state()
        if self.state.SCB is None and w.dtype == _ms.int8:
            self.state.SCB = getattr(w, "SCB", None)
        if self.state.SCB is None and w.dtype == _ms.int8:
            raise RuntimeError("Linear8bitLt: int8 weight without SCB row scales")
        if w.dtype == _ms.int8:
            self.state.CB = w
        # as upstream, the bias is cast to the activations' dtype once, in place (weights are int8 already)
        if self.bias is not None and self.bias.dtype != x.dtype:
            self.bias.data = _as_mindtorch(self.bias.data.to(x.dtype))
        bias = self.bias
        if not isinstance(w, Int8Params) and w.dtype != _ms.int8:
            # a weight tied to (or replaced by) a plain float tensor, e.g. an input embedding: computed from its
            # current values in full precision, as upstream's fix of its #1634 (0.50.2 raises AttributeError);
            # an int8 copy kept in the state would go stale when the tensor changes
            return _linear_full_precision(x, w, bias)
        out = _autograd.matmul(x, w, bias=bias, state=self.state)
        # keep SCB reachable from the weight too (transformers reads `weight.SCB`)
        if w.dtype == _ms.int8 and getattr(w, "SCB", None) is None:
            w.SCB = self.state.SCB
        return out


def _linear_full_precision(x, w, bias):
    """``x @ w.T + bias`` in x's dtype, differentiable (bf16 through float32: MindSpore's CPU matmul has none)."""
    dt = x.dtype
    cdt = torch.float32 if dt == torch.bfloat16 else dt
    out = torch.nn.functional.linear(x.to(cdt), w.to(cdt), None if bias is None else bias.to(cdt))
    return out.to(dt)


def _np_scalar(t):
    return t.asnumpy().reshape(-1)[0] if hasattr(t, "asnumpy") else t


# ---- embeddings (Embedding, StableEmbedding, Embedding8bit, Embedding4bit, EmbeddingFP4, EmbeddingNF4) ----

def _xavier_uniform_fill(weight, padding_idx) -> None:
    """Xavier/Glorot uniform init of a [num_embeddings, embedding_dim] weight (fan_in = dim, fan_out = num,
    bound = sqrt(6 / (fan_in + fan_out)), as torch.nn.init.xavier_uniform_), padding row zeroed.
    mindtorch 0.5.1 has no torch.nn.init functions, so the values come from numpy's global generator."""
    num, dim = int(weight.shape[0]), int(weight.shape[1])
    bound = (6.0 / max(1, num + dim)) ** 0.5
    arr = _np.random.uniform(-bound, bound, size=(num, dim)).astype(_np.float32)
    if padding_idx is not None:
        arr[padding_idx] = 0.0
    new = torch.tensor(arr)
    if weight.dtype != _ms.float32:
        new = new.to(weight.dtype)
    weight.data = new


def _zero_padding_row(weight, padding_idx) -> None:
    if padding_idx is None:
        return
    arr = weight.data.astype(_ms.float32).asnumpy().copy()
    arr[padding_idx] = 0.0
    new = torch.tensor(arr)
    weight.data = new.to(weight.dtype) if weight.dtype != _ms.float32 else new


class Embedding(_CudaGuard, torch.nn.Embedding):
    """``torch.nn.Embedding`` whose weight always gets 32-bit optimizer state (upstream ``bnb.nn.Embedding``):
    the constructor registers ``{"optim_bits": 32}`` for ``weight`` with :class:`GlobalOptimManager`;
    parameters are initialised Xavier-uniform (padding row zero)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: _Optional[int] = None,
                 max_norm: _Optional[float] = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight=None, device=None) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                         _weight, device=device)
        _GlobalOptimManager.get_instance().register_module_override(self, "weight", {"optim_bits": 32})

    def reset_parameters(self) -> None:
        _xavier_uniform_fill(self.weight, self.padding_idx)

    def _fill_padding_idx_with_zero(self) -> None:
        _zero_padding_row(self.weight, self.padding_idx)

    def forward(self, input):
        return _embedding(self, input)


class StableEmbedding(_CudaGuard, torch.nn.Embedding):
    """Embedding + LayerNorm with 32-bit optimizer state (upstream ``bnb.nn.StableEmbedding``, from
    "8-bit Optimizers via Block-wise Quantization", arXiv 2110.02861): Xavier-uniform init, the
    embedding output goes through ``self.norm`` (a ``LayerNorm(embedding_dim)``) in float32 and is
    returned in the weight's dtype; ``weight`` is registered with :class:`GlobalOptimManager` for
    ``{"optim_bits": 32}``."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: _Optional[int] = None,
                 max_norm: _Optional[float] = None, norm_type: float = 2.0, scale_grad_by_freq: bool = False,
                 sparse: bool = False, _weight=None, device=None, dtype=None) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse,
                         _weight, device=device, dtype=dtype)
        self.norm = torch.nn.LayerNorm(embedding_dim, device=device)
        _GlobalOptimManager.get_instance().register_module_override(self, "weight", {"optim_bits": 32})

    def reset_parameters(self) -> None:
        _xavier_uniform_fill(self.weight, self.padding_idx)

    def _fill_padding_idx_with_zero(self) -> None:
        _zero_padding_row(self.weight, self.padding_idx)

    def forward(self, input):
        if _math.prod(input.shape) == 0:  # MindSpore's CPU LayerNorm rejects an empty batch
            _check_indices(self, input)
            return torch.zeros(tuple(input.shape) + (int(self.embedding_dim),), dtype=self.weight.dtype)
        emb = _embedding(self, input).to(torch.float32)  # layer norm always in full precision, as upstream
        return self.norm(emb).to(self.weight.dtype)


_INDEX_DTYPES = (_ms.int32, _ms.int64)


def _check_indices(mod, input) -> None:
    """torch's checks of embedding indices, before the lookup: an int32/int64 tensor (RuntimeError, as torch;
    the 8-/4-bit tables truncated float indices) holding indices in [0, num_embeddings) (IndexError, as torch;
    MindSpore's gather returned the last row for -1 and raised a C++ error past the end). The values are read
    in PyNative mode only (graph mode has none to read)."""
    name = _check_input_dtype(mod, input, "input", _INDEX_DTYPES, "expected tensor for argument #1 'indices' "
                              "(`input`) to have one of the following scalar types: Long, Int (int64, int32)")
    if _math.prod(input.shape) == 0 or _ms.get_context("mode") != _ms.PYNATIVE_MODE:
        return
    idx = input.asnumpy()
    num = int(mod.num_embeddings)
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= num:
        raise IndexError(f"{name}: index out of range in self: `input` holds index {lo if lo < 0 else hi}; expected "
                         f"indices in [0, {num})")


def _embedding(mod, input):
    """``F.embedding`` with the module's settings. MindSpore's CPU gather has no bfloat16 kernel: a bf16 table is
    gathered in float32 and the rows rounded back, which gives the same values (bf16 -> fp32 -> bf16 is exact)
    and keeps the gradient; with ``max_norm`` the renormalisation then applies to the looked-up rows only (it
    cannot write back into a bf16 weight)."""
    _check_indices(mod, input)
    w = mod.weight
    if w.dtype == torch.bfloat16:
        out = torch.nn.functional.embedding(input, w.to(torch.float32), mod.padding_idx, mod.max_norm, mod.norm_type,
                                            mod.scale_grad_by_freq, mod.sparse)
        return out.to(torch.bfloat16)
    return torch.nn.functional.embedding(input, w, mod.padding_idx, mod.max_norm, mod.norm_type,
                                         mod.scale_grad_by_freq, mod.sparse)


def _gather_rows(table, input):
    """table[input] for an integer index tensor of any shape -> [*input.shape, *table.shape[1:]] (a bfloat16
    table is gathered in float32: MindSpore's CPU gather has no bf16 kernel; the values are the same)."""
    idx = _msops.cast(_msops.reshape(input, (-1,)), _ms.int64)  # MindSpore ops throughout: one tag, at the return
    bf16 = table.dtype == _ms.bfloat16
    res = _msops.gather(_msops.cast(table, _ms.float32) if bf16 else table, idx, 0)
    if bf16:
        res = _msops.cast(res, _ms.bfloat16)
    return _tag_device(_msops.reshape(res, tuple(input.shape) + tuple(table.shape[1:])), (input,))


class _RowInt8Params(_ParamDevices, torch.nn.Parameter):
    """Weight of :class:`Embedding8bit`: full precision until ``.to(device)`` / ``.quantize()``, then int8
    rows ``[num, dim]`` with the fp32 row absmax in ``SCB`` (upstream's Int8Params with
    ``has_fp16_weights=False``: ``CB = round(W * 127 / absmax_row)``)."""

    def __init__(self, data=None, requires_grad: bool = False, SCB=None, **kwargs):
        if data is None:
            data = torch.empty(0)
        super().__init__(data, requires_grad)
        self.SCB = SCB

    def quantize(self):
        if self.dtype == _ms.int8:
            return self
        q, scale = _F.quantize_weight_only(self.data, bits=8)
        self.data = q
        self.SCB = scale * 127.0  # upstream keeps the absmax itself; scale = absmax / 127
        _tag_device(self.SCB)
        return self

    def to(self, *args, **kwargs):
        if _asks_cuda(args, kwargs):
            _refuse_cuda(self, "to(...)")
        dev_type, _ = _parse_to(args, kwargs)
        if dev_type not in (None, "meta"):
            return self.quantize()
        return self


class Embedding8bit(_CudaGuard, torch.nn.Embedding):
    """Int8 embedding (upstream ``bnb.nn.Embedding8bit``, LLM.int8()-style row quantization): rows are
    stored as int8 with one fp32 absmax per row (``weight.SCB``), quantized on ``.to(device)``; the
    output is ``int8_row * absmax / 127`` in the original dtype. Saving raises NotImplementedError, as upstream."""

    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)
        self.dtype = self.weight.data.dtype
        self.weight = _RowInt8Params(self.weight.data, requires_grad=False)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise NotImplementedError("Saving Embedding8bit module is not implemented")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "weight"
        if key in state_dict:
            w = state_dict[key]
            if tuple(w.shape) != (self.num_embeddings, self.embedding_dim):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(w.shape)}, "
                                  f"expected {(self.num_embeddings, self.embedding_dim)}")
                return
            self.weight = _RowInt8Params(torch.Tensor(w).to(self.dtype), requires_grad=False)
        elif strict:
            missing_keys.append(key)
        for k in state_dict:
            if k.startswith(prefix) and k != key and strict:
                unexpected_keys.append(k)

    def forward(self, input):
        if getattr(self.weight, "SCB", None) is None:  # quantized on the first forward, as Linear8bitLt's weight
            self.weight.quantize()  # (upstream raises here and asks for .cuda(), which has no CPU meaning)
        _check_indices(self, input)
        rows = _gather_rows(self.weight.data, input).astype(_ms.float32)
        stats = _gather_rows(self.weight.SCB.reshape(-1, 1), input).astype(_ms.float32)
        out = (rows * (stats / 127.0)).astype(self.dtype)
        _tag_device(out, like=(input,))
        return out


class Embedding4bit(torch.nn.Embedding):
    """4-bit (NF4/FP4) embedding (upstream ``bnb.nn.Embedding4bit``; QLoRA, arXiv 2305.14314): the weight is
    a :class:`Params4bit` (blocksize 64, no double quantization) quantized on ``.to(device)``. When
    ``embedding_dim`` is a multiple of the blocksize, only the looked-up rows (their packed bytes and absmax)
    are dequantized; otherwise the whole table is (with a warning at construction, as upstream).
    Saving raises NotImplementedError, as upstream."""

    def __init__(self, num_embeddings, embedding_dim, dtype=None, quant_type="fp4", quant_storage=_ms.uint8,
                 device=None):
        super().__init__(num_embeddings, embedding_dim, device=device, dtype=dtype)
        self.dtype = self.weight.data.dtype
        self.quant_state = None
        self.weight = Params4bit(self.weight.data, requires_grad=False, compress_statistics=None,
                                 quant_type=quant_type, quant_storage=quant_storage, module=self)
        if embedding_dim % self.weight.blocksize != 0:
            _logger.warning(f"Embedding size {embedding_dim} is not divisible by block size {self.weight.blocksize}. "
                            "This will lead to slow inference.")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise NotImplementedError("Saving Embedding4bit module is not implemented")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + "weight"
        if key in state_dict:
            w = state_dict[key]
            if tuple(w.shape) != (self.num_embeddings, self.embedding_dim):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(w.shape)}, "
                                  f"expected {(self.num_embeddings, self.embedding_dim)}")
                return
            old = self.weight
            self.weight = Params4bit(torch.Tensor(w).to(self.dtype), requires_grad=False,
                                     blocksize=old.blocksize, compress_statistics=old.compress_statistics,
                                     quant_type=old.quant_type, quant_storage=old.quant_storage, module=self)
            self.quant_state = None
        elif strict:
            missing_keys.append(key)

    def _forward_with_partial_dequantize(self, input):
        qs = self.weight.quant_state
        bs = qs.blocksize
        raw = _F._as_uint8(self.weight.data).reshape(self.num_embeddings, self.embedding_dim // 2)
        rows = _gather_rows(raw, input).reshape(-1, 1)
        absmax = _F._absmax_4bit(qs).reshape(self.num_embeddings, self.embedding_dim // bs)
        amax = _gather_rows(absmax, input).reshape(-1)
        state = _F.QuantState(absmax=amax, shape=tuple(input.shape) + (self.embedding_dim,), dtype=qs.dtype,
                              blocksize=bs, code=qs.code, quant_type=qs.quant_type)
        out = _F.dequantize_4bit(rows, state)
        return out.to(self.dtype)

    def forward(self, input):
        _check_indices(self, input)
        if not self.weight.bnb_quantized:
            self.weight.quantize()
        fix_4bit_weight_quant_state_from_module(self)
        if self.embedding_dim % self.weight.quant_state.blocksize == 0:
            return self._forward_with_partial_dequantize(input)
        W = _F.dequantize_4bit(self.weight.data, self.weight.quant_state)
        out = _gather_rows(W, input)
        return out.to(self.dtype)


class EmbeddingFP4(Embedding4bit):
    """:class:`Embedding4bit` with ``quant_type="fp4"``."""

    def __init__(self, num_embeddings, embedding_dim, dtype=None, quant_storage=_ms.uint8, device=None):
        super().__init__(num_embeddings, embedding_dim, dtype=dtype, quant_type="fp4", quant_storage=quant_storage,
                         device=device)


class EmbeddingNF4(Embedding4bit):
    """:class:`Embedding4bit` with ``quant_type="nf4"``."""

    def __init__(self, num_embeddings, embedding_dim, dtype=None, quant_storage=_ms.uint8, device=None):
        super().__init__(num_embeddings, embedding_dim, dtype=dtype, quant_type="nf4", quant_storage=quant_storage,
                         device=device)


# ---- weight-only int8/int4 linear (LinearWeightOnly) ----
class LinearWeightOnly(_CudaGuard, torch.nn.Linear):
    """Weight-only quantized linear (W8A16 / W4A16; ChatGLM-6B's quantized-checkpoint scheme): the weight
    is stored as int8 ``[out, in]`` (``bits=8``) or packed int4 ``[out, (in+1)//2]`` (``bits=4``) with one
    fp32 scale per output channel (``weight_scale``), and dequantized on the fly in the activation's dtype
    (:func:`bitsandbytes_ms.functional.gemm_weight_only`). Quantization happens on ``.to(device)``/``.cpu()``,
    :meth:`quantize`, loading a float ``weight`` followed by one of those, or the first forward.
    ``state_dict`` holds ``weight`` (int) and ``weight_scale``; loading them restores the layer exactly.
    Inference only (no gradient w.r.t. the input through the packed weight)."""

    def __init__(self, input_features: int, output_features: int, bias: bool = True, bits: int = 8, device=None,
                 dtype=None):
        if bits not in (8, 4):
            raise ValueError(f"LinearWeightOnly: `bits` must be 8 or 4; got {bits!r}")
        super().__init__(input_features, output_features, bias, device=device, dtype=dtype)
        self.bits = bits
        self.weight_scale = None

    @property
    def is_quantized(self) -> bool:
        return self.weight_scale is not None

    def quantize(self):
        if not self.is_quantized:
            q, scale = _F.quantize_weight_only(self.weight.data, self.bits)
            self.weight = torch.nn.Parameter(q, requires_grad=False)
            self.weight_scale = scale
        return self

    def to(self, *args, **kwargs):
        res = super().to(*args, **kwargs)
        dev_type, _ = _parse_to(args, kwargs)
        if dev_type not in (None, "meta"):
            self.quantize()
        return res

    def cpu(self):
        return self.to("cpu")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.weight_scale is not None:
            destination[prefix + "weight_scale"] = self.weight_scale

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        wkey, skey = prefix + "weight", prefix + "weight_scale"
        if skey in state_dict and wkey in state_dict:
            N, K = int(self.out_features), int(self.in_features)
            width = K if self.bits == 8 else (K + 1) // 2
            errs = [e for e in (
                _loaded_tensor_error(wkey, state_dict[wkey], (_ms.int8,) if self.bits == 8 else (_ms.uint8,),
                                     N * width, shape=(N, width), what=f"the int{self.bits} codes of a [{N}, {K}] weight"),
                _loaded_tensor_error(skey, state_dict[skey], _F.FLOAT_DTYPES, N, what="one scale per output row"))
                if e]
            if errs:  # the layer is left as it was
                error_msgs.extend(errs)
                return
            q = torch.Tensor(state_dict[wkey])
            self.weight = torch.nn.Parameter(q, requires_grad=False)
            self.weight_scale = torch.Tensor(state_dict[skey])
            rest = {k: v for k, v in state_dict.items() if k not in (wkey, skey)}
            super()._load_from_state_dict(rest, prefix, local_metadata, False, missing_keys, unexpected_keys,
                                          error_msgs)
            if strict and self.bias is not None and prefix + "bias" not in state_dict:
                missing_keys.append(prefix + "bias")
            return
        if wkey in state_dict and state_dict[wkey].dtype in (_ms.int8, _ms.uint8):
            # integer codes without their scales: taken as weights they would be ~100x too large
            error_msgs.append(f"{wkey}: an int{self.bits} (quantized) weight needs its scales {skey}, which the "
                              f"state dict lacks")
            return
        if wkey in state_dict and self.is_quantized:  # a float checkpoint into a quantized layer: re-quantize
            self.weight = torch.nn.Parameter(torch.Tensor(state_dict[wkey]))
            self.weight_scale = None
            rest = {k: v for k, v in state_dict.items() if k != wkey}
            super()._load_from_state_dict(rest, prefix, local_metadata, False, missing_keys, unexpected_keys,
                                          error_msgs)
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, x):
        _check_linear_input(self, x)
        self.quantize()
        bias = self.bias
        return _F.gemm_weight_only(x, self.weight.data, self.weight_scale, bits=self.bits,
                                   bias=None if bias is None else bias.data, in_features=self.in_features)


class OutlierAwareLinear(_CudaGuard, torch.nn.Linear):
    """Upstream's base class for linear layers that quantize their weight knowing the outlier dimensions:
    subclasses implement ``quantize_weight(w, outlier_idx)`` and ``forward_with_outliers(x, outlier_idx)``; the
    outlier indices come from :class:`bitsandbytes_ms.utils.OutlierTracer` (initialize it on the model first)."""

    def __init__(self, input_features, output_features, bias=True, device=None):
        super().__init__(input_features, output_features, bias, device)
        self.outlier_dim = None
        self.is_quantized = False

    def forward_with_outliers(self, x, outlier_idx):
        raise NotImplementedError("Please override the `forward_with_outliers(self, x, outlier_idx)` function")

    def quantize_weight(self, w, outlier_idx):
        raise NotImplementedError("Please override the `quantize_weights(self, w, outlier_idx)` function")

    def forward(self, x):
        from ..utils import OutlierTracer

        if self.outlier_dim is None:
            tracer = OutlierTracer.get_instance()
            if not tracer.is_initialized():
                _logger.warning("Please use OutlierTracer.initialize(model) before using the OutlierAwareLinear layer")
            self.outlier_dim = tracer.get_outliers(self.weight)
        if not self.is_quantized:
            w = self.quantize_weight(self.weight, self.outlier_dim)
            self.weight.data.copy_(w)
            self.is_quantized = True
        return self.forward_with_outliers(x, self.outlier_dim)
