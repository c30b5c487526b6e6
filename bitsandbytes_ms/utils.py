"""Small helpers shared across the package (bitsandbytes' ``utils``)."""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

logger = logging.getLogger(__name__)


def pack_dict_to_tensor(source_dict: Dict[str, Any]) -> Tensor:
    """Packs a JSON-serialisable dict into a uint8 tensor of its UTF-8 JSON bytes (upstream's
    format for ``quant_state.bitsandbytes__*`` checkpoint entries)."""
    data = json.dumps(source_dict).encode("utf-8")
    return Tensor(np.frombuffer(data, dtype=np.uint8).copy())


def unpack_tensor_to_dict(tensor_data) -> Dict[str, Any]:
    """Inverse of :func:`pack_dict_to_tensor`; accepts a MindSpore tensor or a numpy array."""
    arr = tensor_data.asnumpy() if isinstance(tensor_data, Tensor) else np.asarray(tensor_data)
    return json.loads(bytes(arr.astype(np.uint8).reshape(-1)).decode("utf-8"))


def to_numpy(t) -> np.ndarray:
    """A numpy array of a MindSpore tensor; bfloat16 comes back as ml_dtypes' bfloat16."""
    return t.asnumpy() if isinstance(t, Tensor) else np.asarray(t)


try:  # numpy has no bfloat16: the type MindSpore's own asnumpy() returns (registered by MindSpore, ml_dtypes')
    from mindspore.common.np_dtype import bfloat16 as _np_bfloat16
except ImportError:  # pragma: no cover - other MindSpore versions
    from ml_dtypes import bfloat16 as _np_bfloat16


class DtypeInfo(NamedTuple):
    """One row of :data:`DTYPES`."""

    name: str  # upstream's name, as written into checkpoints ("float16")
    np: Any  # the numpy dtype of the tensor's elements (bfloat16: MindSpore's / ml_dtypes')
    itemsize: int  # bytes per element
    suffix: Optional[str]  # bitsandbytes' suffix in C entry-point names ("fp16"); None if no entry point takes it


#: The package's one dtype map: MindSpore dtype -> :class:`DtypeInfo`. Everything else that maps dtypes
#: (names, numpy dtypes, sizes, C-name suffixes) is a view of it, made here.
DTYPES = {
    ms.float32: DtypeInfo("float32", np.float32, 4, "fp32"),
    ms.float16: DtypeInfo("float16", np.float16, 2, "fp16"),
    ms.bfloat16: DtypeInfo("bfloat16", _np_bfloat16, 2, "bf16"),
    ms.float64: DtypeInfo("float64", np.float64, 8, None),
    ms.int8: DtypeInfo("int8", np.int8, 1, None),
    ms.uint8: DtypeInfo("uint8", np.uint8, 1, None),
    ms.int16: DtypeInfo("int16", np.int16, 2, None),
    ms.uint16: DtypeInfo("uint16", np.uint16, 2, None),
    ms.int32: DtypeInfo("int32", np.int32, 4, None),
    ms.uint32: DtypeInfo("uint32", np.uint32, 4, None),
    ms.int64: DtypeInfo("int64", np.int64, 8, None),
    ms.uint64: DtypeInfo("uint64", np.uint64, 8, None),
    ms.bool_: DtypeInfo("bool", np.bool_, 1, None),
}
# views of DTYPES, for one dict lookup on hot paths (comparing MindSpore dtypes one by one costs ~1 us each)
DTYPE_NAMES = {dt: info.name for dt, info in DTYPES.items()}
NP_DTYPES = {dt: info.np for dt, info in DTYPES.items()}
ITEMSIZES = {dt: info.itemsize for dt, info in DTYPES.items()}
SUFFIX_OF_DTYPE = {dt: info.suffix for dt, info in DTYPES.items() if info.suffix}  # ms.float32 -> "fp32"
DTYPE_OF_SUFFIX = {sfx: dt for dt, sfx in SUFFIX_OF_DTYPE.items()}  # "fp32" -> ms.float32
#: the float dtypes by upstream's name or C suffix ("float16" or "fp16"), for string options
FLOAT_DTYPE_OF_NAME = {key: dt for dt, sfx in SUFFIX_OF_DTYPE.items() for key in (sfx, DTYPES[dt].name)}


def dtype_name(dtype) -> str:
    """``"float16"`` for ``mindspore.float16``: the name upstream writes into checkpoints."""
    if dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    return str(dtype).replace("torch.", "").replace("mindspore.", "").lower()  # (mindtorch renames MindSpore's)


def dtype_from_name(name: str):
    """``mindspore.float16`` for ``"float16"`` (or ``"torch.float16"``)."""
    name = name.replace("torch.", "")
    for dt, n in DTYPE_NAMES.items():
        if n == name:
            return dt
    raise ValueError(f"unknown dtype name {name!r}")


class Singleton:
    """Upstream's singleton pattern (GlobalOptimManager, GlobalPageManager, CUBLAS_Context, GlobalOutlierPooler,
    OutlierTracer): ``cls()`` raises, ``cls.get_instance()`` makes the one instance (per class) and, unless the
    class sets ``_initialize_on_create = False``, calls its ``initialize()``."""

    _instance = None
    _initialize_on_create = True

    def __init__(self):
        raise RuntimeError("Call get_instance() instead")

    @classmethod
    def get_instance(cls):
        if cls.__dict__.get("_instance") is None:
            cls._instance = cls.__new__(cls)
            if cls._initialize_on_create:
                cls._instance.initialize()
        return cls._instance


# ---- the rest of upstream's ``bitsandbytes.utils`` ------------------------------------------------------------
#: int8 weight layouts by name (checkpoints store the number; only "row" exists on CPU and in this package)
LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING = {"row": 0, "col32": 1, "col_turing": 2, "col_ampere": 3}
INVERSE_LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING = {v: k for k, v in LINEAR_8BIT_WEIGHTS_FORMAT_MAPPING.items()}


def _torch():
    import mindnlp  # noqa: F401  (torch -> mindtorch)
    import torch

    return torch


def find_outlier_dims(weight, reduction_dim: int = 0, zscore: float = 4.0, topk: Optional[int] = None,
                      rdm: bool = False) -> Tensor:
    """Indices (int64) of the hidden dimensions whose standard deviation along ``reduction_dim`` is an outlier:
    z-score of the per-dimension std above ``zscore``, or the ``topk`` largest stds; ``rdm``: ``topk`` random
    indices below ``weight.shape[1]``. Standard deviations are unbiased (torch's default)."""
    if rdm:
        if topk is None:
            raise ValueError("find_outlier_dims: rdm=True needs topk (the number of random indices)")
        return Tensor(np.random.randint(0, weight.shape[1], size=(int(topk),)).astype(np.int64))
    w = to_numpy(weight).astype(np.float64)
    std = w.std(axis=reduction_dim, ddof=1)
    if topk is not None:
        idx = np.argsort(-np.abs(std), kind="stable")[: int(topk)]
    else:
        z = (std - std.mean()) / std.std(ddof=1)
        idx = np.nonzero(z > zscore)[0]
    return Tensor(idx.astype(np.int64))


class OutlierTracer(Singleton):
    """Records, for every ``nn.Linear`` of a model, the hidden dimensions that carry outliers (upstream's
    singleton: ``OutlierTracer.get_instance().initialize(model)``, run the model once, then ``get_outliers(w)``).
    The first layer's outliers come from its input (std z-score > 3 or |x| > 6), every later layer's from the
    previous layer's weight."""

    _initialize_on_create = False  # initialize(model) needs the model

    def initialize(self, model) -> None:
        self.last_w = None
        self.current_outlier_dims = None
        self.hvalues, self.outliers, self.hvalue2outlier_idx, self.hooks = [], [], {}, []
        self.initialized = True
        linear = _torch().nn.Linear
        for _, m in model.named_modules():
            if isinstance(m, linear):
                self.hooks.append(m.register_forward_pre_hook(outlier_hook))

    def is_initialized(self) -> bool:
        return getattr(self, "initialized", False)

    def get_hvalue(self, weight) -> int:
        # one key per weight (tied weights are one Parameter object in mindtorch models); upstream keys by
        # storage().data_ptr(), but a MindSpore parameter may have no device buffer yet
        return id(weight)

    def get_outliers(self, weight):
        if not self.is_initialized():
            logger.warning("Outlier tracer is not initialized...")
            return None
        return self.hvalue2outlier_idx.get(self.get_hvalue(weight))



def outlier_hook(module, input) -> None:
    """The forward pre-hook :class:`OutlierTracer` installs on every ``nn.Linear``."""
    if not isinstance(module, _torch().nn.Linear):
        raise TypeError(f"outlier_hook: expected an nn.Linear, got {type(module).__name__}")
    tracer = OutlierTracer.get_instance()
    key = tracer.get_hvalue(module.weight)
    if key in tracer.hvalue2outlier_idx:
        for hook in tracer.hooks:
            hook.remove()
        return
    tracer.outliers.append(find_outlier_dims(module.weight))
    tracer.hvalues.append(key)
    if len(tracer.outliers) > 1:  # a later layer: the outlier dims found in the previous layer's weight
        prev = to_numpy(tracer.outliers[-1])
        if prev.size and prev.max() >= module.weight.shape[1]:
            raise ValueError(f"outlier_hook: outlier index {int(prev.max())} is out of range for a layer with "
                             f"{module.weight.shape[1]} input features")
        tracer.hvalue2outlier_idx[key] = tracer.outliers[-1]
    else:  # the first layer: from its input (std z-score test, and magnitude > 6)
        x = to_numpy(input[0]).astype(np.float64)
        flat = x.reshape(-1, x.shape[-1])
        by_std = to_numpy(find_outlier_dims(flat, reduction_dim=1, zscore=3))
        by_mag = np.nonzero((np.abs(x) > 6).reshape(-1, x.shape[-1]).sum(0) > 0)[0]
        tracer.hvalue2outlier_idx[key] = Tensor(np.unique(np.concatenate([by_std, by_mag])).astype(np.int64))


def execute_and_return(command_string: str) -> Tuple[str, str]:
    """Runs a command (split like a shell would, no shell) and returns its (stdout, stderr), decoded and stripped."""
    out, err = subprocess.Popen(shlex.split(command_string), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE).communicate()
    return out.decode("UTF-8").strip(), err.decode("UTF-8").strip()


def replace_linear(model, linear_replacement, skip_modules=("lm_head",), copy_weights: bool = False,
                   post_processing_function: Optional[str] = None):
    """Replaces every ``nn.Linear`` child (recursively) whose name is not in ``skip_modules`` by
    ``linear_replacement(in_features, out_features, has_bias)``; ``copy_weights`` moves the old weight and bias
    over; ``post_processing_function`` names a method called on the replaced module, as upstream does."""
    linear = _torch().nn.Linear
    for name, module in model.named_children():
        if len(list(module.children())) > 0:
            replace_linear(module, linear_replacement, skip_modules, copy_weights, post_processing_function)
        if isinstance(module, linear) and name not in skip_modules:
            old = model._modules[name]
            model._modules[name] = linear_replacement(module.in_features, module.out_features, module.bias is not None)
            if copy_weights:
                model._modules[name].weight = old.weight
                model._modules[name].bias = old.bias
            if post_processing_function is not None:
                fn = getattr(module, post_processing_function, None)
                if fn is not None:
                    fn(module)
    return model


def sync_gpu(t=None) -> None:
    """Waits for the device's pending work (upstream: CUDA/XPU synchronize; here MindSpore's runtime)."""
    ms.runtime.synchronize()
