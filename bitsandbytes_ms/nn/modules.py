"""Quantized modules, composed from :mod:`bitsandbytes_ms.autograd._functions`."""


# ---- 4-bit (Params4bit, Linear4bit, LinearFP4, LinearNF4) ----
import copy as _copy
import logging as _logging
from typing import Any as _Any, Dict as _Dict, Optional as _Optional

import mindnlp  # noqa: F401,E402  (must precede `import torch`; makes torch = mindtorch)
import mindspore as _ms  # noqa: E402
import mindtorch as torch  # noqa: E402

from .. import functional as _F  # noqa: E402
from ..autograd._functions import matmul_4bit as _matmul_4bit  # noqa: E402

_logger = _logging.getLogger(__name__)


class Params4bit(torch.nn.Parameter):
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
    def from_prequantized(cls, data, quantized_stats: _Dict[str, _Any], requires_grad: bool = False, device="cpu",
                          module=None, **kwargs) -> "Params4bit":
        """Rebuilds a quantized parameter from packed ``data`` and the ``weight.*`` entries of a
        state dict (``QuantState.as_dict(packed=True)`` keys)."""
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
        device = kwargs.get("device", None)
        dtype = kwargs.get("dtype", None)
        for a in args:
            if isinstance(a, (str, getattr(torch, "device", str))) and not isinstance(a, bool):
                device = a
            elif a is not None and not isinstance(a, torch.Tensor):
                dtype = a
        dev_type = None if device is None else str(getattr(device, "type", device)).split(":")[0]
        if dev_type is not None and dev_type != "meta" and not self.bnb_quantized:
            return self.quantize()
        if self.bnb_quantized:
            if dtype is not None and self.quant_state is not None and dtype in _F.FLOAT_DTYPES:
                self.quant_state.dtype = dtype  # dequantize to the new dtype, as upstream
            return self
        res = super().to(*args, **kwargs)
        return type(self)(res, **self._attrs())

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None, non_blocking=False):
        return self.to("cuda" if device is None else device)


def fix_4bit_weight_quant_state_from_module(module) -> None:
    """Restores ``weight.quant_state`` from ``module.quant_state`` when a framework replaced the
    parameter object (upstream helper of the same name)."""
    if getattr(module.weight, "quant_state", None) is not None:
        return
    if getattr(module, "quant_state", None) is None:
        _logger.warning("FP4 quantization state not initialized. Please call .to() or .quantize() first.")
    if module.weight.shape[1] != 1 and module.weight.ndim == 2 and module.weight.shape[1] != 1:
        pass
    if not isinstance(module.weight, Params4bit):
        module.weight = Params4bit(module.weight, quant_state=getattr(module, "quant_state", None),
                                   bnb_quantized=getattr(module, "quant_state", None) is not None, module=module)
    else:
        module.weight.quant_state = getattr(module, "quant_state", None)


class Linear4bit(torch.nn.Linear):
    """4-bit quantized linear layer (upstream ``bnb.nn.Linear4bit``; QLoRA, arXiv 2305.14314).

    The weight is a :class:`Params4bit`; it is quantized on ``.to(device)`` / ``.cuda()`` / ``.cpu()``,
    on :meth:`Params4bit.quantize`, or (unlike upstream, which fails) on the first forward.
    ``forward`` computes ``x @ W.T + b`` in ``compute_dtype`` (default: the input's dtype when it is
    fp32/bf16) through :func:`bitsandbytes_ms.matmul_4bit` and returns the input's dtype.

    ``state_dict`` holds ``weight`` (packed), ``bias`` and the quant state under upstream's keys
    (``weight.absmax``, ``weight.quant_map``, ``weight.nested_absmax``, ``weight.nested_quant_map``,
    ``weight.quant_state.bitsandbytes__<type>``); ``load_state_dict`` of it restores an identical layer.
    """

    def __init__(self, input_features, output_features, bias=True, compute_dtype=None, compress_statistics=True,
                 quant_type="fp4", quant_storage=_ms.uint8, device=None):
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

    def forward(self, x):
        if not isinstance(self.weight, Params4bit) or getattr(self.weight, "quant_state", None) is None:
            if isinstance(self.weight, Params4bit) and not self.weight.bnb_quantized:
                self.weight.quantize()
            else:
                fix_4bit_weight_quant_state_from_module(self)
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        if not self.compute_type_is_set:
            self.set_compute_type(x)
            self.compute_type_is_set = True
        inp_dtype = x.dtype
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        bias = None if bias is None else bias.to(self.compute_dtype or inp_dtype)
        out = _matmul_4bit(x, self.weight.t(), quant_state=self.weight.quant_state, bias=bias)
        return out.to(inp_dtype)


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
