"""Quantized modules, composed from :mod:`bitsandbytes_ms.autograd._functions`."""


# ---- int8 (LLM.int8()) ----
# These layers are mindtorch modules (after `import mindnlp`, `torch.nn` is mindtorch's), so they drop
# into mindnlp models; all numerics live in bitsandbytes_ms.functional / autograd._functions.
import copy as _copy
import sys as _sys

if "mindnlp" not in _sys.modules and "torch" not in _sys.modules:
    import mindnlp  # noqa: F401  (must precede `import torch`: it makes `torch` resolve to mindtorch)
import torch  # noqa: E402  (mindtorch)

import mindspore as _ms  # noqa: E402

from .. import functional as _F  # noqa: E402
from ..autograd._functions import MatmulLtState, matmul  # noqa: E402
from ..cextension import tag_device as _tag_device  # noqa: E402

_PARAM_INTERNAL_KWARGS = ("_device", "meta", "_requires_grad", "param_info")


def _as_mindtorch(t):
    if t is not None and not hasattr(t, "_device"):
        _tag_device(t)
    return t


class Int8Params(torch.nn.Parameter):
    """A weight for :class:`Linear8bitLt` (upstream ``bnb.nn.Int8Params``): holds float weights until it
    is quantized, then the int8 ``CB`` as its data with float32 row scales ``SCB``.

    Quantizes exactly once: on ``.to(device)``/``.cpu()``/``.cuda()`` (as upstream) or an explicit
    :meth:`quantize` (the CPU way), and never re-quantizes int8 data. Extra keyword arguments (the
    ``_device``/``meta``/``_requires_grad`` that transformers passes from ``old_param.__dict__``) are
    accepted and ignored.
    """

    def __new__(cls, data=None, requires_grad=True, has_fp16_weights=False, CB=None, SCB=None, **kwargs):
        if data is None:
            data = torch.empty(0)
        _as_mindtorch(data)
        obj = super().__new__(cls, data, requires_grad)
        return obj

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
        CB, SCB, _ = _F.int8_vectorwise_quant(_F._contiguous(self.data))
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

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None, non_blocking=False):
        return self.to("cuda" if device is None else device)

    def to(self, *args, **kwargs):
        device = kwargs.get("device")
        dtype = kwargs.get("dtype")
        for a in args:
            if isinstance(a, (str, torch.device)):
                device = a
            elif isinstance(a, type(_ms.float32)):
                dtype = a
        dev_type = None if device is None else (device if isinstance(device, str) else device.type).split(":")[0]
        if dev_type is not None and dev_type != "meta" and not self.is_quantized and not self.has_fp16_weights:
            return self.quantize()
        if dtype is not None and not self.is_quantized and dtype != self.dtype:
            return self._with_attrs(_as_mindtorch(self.data.to(dtype)))
        return self


def _weight_scb(weight):
    """SCB of a weight that really is quantized (int8 with scales); None for plain/tied weights."""
    scb = getattr(weight, "SCB", None)
    return scb if (scb is not None and weight is not None and weight.dtype == _ms.int8) else None


class Linear8bitLt(torch.nn.Linear):
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
    the first forward. ``state_dict`` holds ``weight`` (int8), ``SCB`` (float32 [out]) and
    ``weight_format`` (uint8 0 = "row"); such a dict loads into a fresh module (quantized or not).
    """

    def __init__(self, input_features, output_features, bias=True, has_fp16_weights=True, threshold=0.0,
                 index=None, device=None):
        super().__init__(input_features, output_features, bias)
        self.state = MatmulLtState()
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
        device = kwargs.get("device", next((a for a in args if isinstance(a, (str, torch.device))), None))
        if device is not None and isinstance(self.weight, Int8Params):
            self.weight.to(device)
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
            scb = _as_mindtorch(state_dict[scb_key].astype(_ms.float32).reshape(-1).copy())
            data = _as_mindtorch(w.copy())
            self.weight = Int8Params(data, requires_grad=False, has_fp16_weights=False, CB=data, SCB=scb)
            self.state.has_fp16_weights = False
            self.state.reset_grads()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        for key in (scb_key, fmt_key):
            if key in unexpected_keys:
                unexpected_keys.remove(key)

    def forward(self, x):
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
        bias = self.bias
        if bias is not None and bias.dtype != x.dtype:
            bias = bias.to(x.dtype)
        out = matmul(x, w, bias=bias, state=self.state)
        # keep SCB reachable from the weight too (transformers reads `weight.SCB`)
        if w.dtype == _ms.int8 and getattr(w, "SCB", None) is None:
            w.SCB = self.state.SCB
        return out


def _np_scalar(t):
    return t.asnumpy().reshape(-1)[0] if hasattr(t, "asnumpy") else t
