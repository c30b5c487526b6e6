"""The patches transformers' bitsandbytes path and training need on mindtorch (MindSpore NLP 0.5.1's
torch API). Each is registered with :data:`bitsandbytes_ms.integrations.patches.registry`, applied by
:func:`bitsandbytes_ms.register`, and has a test in tests/test_integration_patches.py."""

import ctypes
import ctypes.util
import functools

from . import distributed as _distributed  # noqa: F401  (registers the torch.distributed patches)
from . import backward as _backward  # noqa: F401  (registers loss.backward(): mindtorch-tensor-backward)
from . import mindtorch_device as _mindtorch_device  # noqa: F401  (registers mindtorch-tensor-device-message)
from . import mindtorch_copies as _mindtorch_copies  # noqa: F401  (registers the copy_ / deepcopy patches)
from .patches import registry


@registry.register(
    "mindtorch-same-device-move", "mindtorch._tensor", "Tensor._move_to",
    why="mindtorch's Tensor._move_to('cpu') copies through numpy even when the tensor is already on the "
        "CPU; binary ops such as `a - b` call it on both operands, so every subtraction copies its inputs and "
        "cuts them out of MindSpore's autograd (gradients through `x - y` come back as zeros). A move to the "
        "device the tensor is already on returns the tensor itself, as in PyTorch.")
def _same_device_move(wrapped, instance, args, kwargs):
    device = args[0] if args else kwargs.get("device")
    current = instance.__dict__.get("_device") if hasattr(instance, "__dict__") else None
    if current is None:
        current = getattr(instance, "_device", None)
    if current is not None and getattr(device, "type", None) == getattr(current, "type", None) == "cpu":
        return instance
    return wrapped(*args, **kwargs)


from ..torch_ops import bitsandbytes as _torch_ops_namespace  # noqa: E402

registry.register_value(
    "mindtorch-torch-ops-bitsandbytes", "mindtorch.ops", "bitsandbytes", _torch_ops_namespace, only_if_imported=False,
    why="upstream registers its ops with torch.library, so `torch.ops.bitsandbytes.<op>` exists once bitsandbytes is "
        "imported; mindtorch's torch.library registers nothing (custom_op returns None, no define/impl), so the "
        "namespace of bitsandbytes_ms.torch_ops (the ops of bitsandbytes_ms._ops under upstream's schemas) is "
        "installed as torch.ops.bitsandbytes.")

registry.register_value(
    "transformers-bitsandbytes-available", "transformers.utils.import_utils", "_bitsandbytes_available", True,
    why="transformers decides once, when it is imported, whether a `bitsandbytes` package exists; mindnlp imports "
        "transformers before the user can call register(), so the alias arrives too late for that check. Only "
        "applied when transformers is already imported (otherwise the alias alone makes the check pass).")




@registry.register(
    "mindtorch-element-size-8bit", "mindtorch._tensor", "Tensor.element_size",
    why="mindtorch's Tensor.element_size() (and so nbytes, and save_pretrained, which sizes every tensor's "
        "storage) raises KeyError for int8 and uint8 tensors: its size table lacks them. Quantized checkpoints "
        "are made of exactly those (int8 weights, uint8 4-bit codes and packed quant_state), so saving failed.")
def _element_size_8bit(wrapped, instance, args, kwargs):
    import mindspore as ms

    if instance.dtype in (ms.int8, ms.uint8):
        return 1
    return wrapped(*args, **kwargs)


# ---- torch.save / torch.load of quantized layers (applied when bitsandbytes_ms.nn is imported) ----
# Every dtype a quantized layer's state holds: int8 (Linear8bitLt weights), uint8 (4-bit codes), and each
# Params4bit quant_storage (uint8, int8, int16, int32, float16, bfloat16, float32); PyTorch's storage names.
_STORAGE_NAMES = (("int8", "CharStorage"), ("int16", "ShortStorage"), ("int32", "IntStorage"))


def _with_int_storages():
    import numpy as np
    import mindspore as ms
    import mindtorch.serialization as ser

    save_map = dict(ser.storage_map)
    load_map = dict(ser.dtype_map)
    for dt, name in _STORAGE_NAMES:
        save_map.setdefault(getattr(ms, dt), name)
        load_map.setdefault(name, getattr(np, dt))
    return save_map, load_map


try:
    _SAVE_MAP, _LOAD_MAP = _with_int_storages()
except Exception:  # pragma: no cover - mindtorch layout changed; the patches are then not registered
    _SAVE_MAP = _LOAD_MAP = None

if _SAVE_MAP is not None:
    _WHY_INT_SAVE = (
        "mindtorch's torch.save/torch.load have no storage type for int8 and int16 tensors (KeyError: "
        "mindspore.int8 in serialization.storage_map) and torch.load none for int32 ones (KeyError: 'IntStorage' "
        "in dtype_map), so a Linear8bitLt (int8 weight), a Params4bit stored as int8/int16/int32, or their "
        "state_dicts could not be saved and loaded with torch.save. Adds PyTorch's CharStorage/ShortStorage/"
        "IntStorage names to both tables.")
    registry.register_value("mindtorch-save-int8", "mindtorch.serialization", "storage_map", _SAVE_MAP,
                            why=_WHY_INT_SAVE, only_if_imported=False, on_import=True)
    registry.register_value("mindtorch-load-int8", "mindtorch.serialization", "dtype_map", _LOAD_MAP,
                            why=_WHY_INT_SAVE, only_if_imported=False, on_import=True)

registry.register_value(
    "mindtorch-load-bf16", "mindtorch._utils", "SUPPORT_BF16", True, only_if_imported=False, on_import=True,
    why="torch.load turns every bfloat16 tensor into float16 (mindtorch._utils._rebuild_tensor_v2 converts the "
        "array unless the device is an Ascend with bf16, its SUPPORT_BF16 flag), which rounds bf16 weights and "
        "rewrites the packed bytes of a 4-bit weight stored as bfloat16 (quant_storage=bfloat16: 1012 of 1024 bytes "
        "changed, and the reloaded layer computed garbage). MindSpore's CPU tensors hold bfloat16, so the flag "
        "(read only by that rebuild) is set and the array keeps its dtype and bits.")

# ---- fourbit3: CPU kernels and tensor methods upstream's 4-bit tests use ----
# Each of these is a gap or bug in mindtorch 0.5.1 on the CPU target; tests in tests/test_mindtorch_patches.py
# (each checks the fixed behaviour and, after removing the patch, the mindtorch behaviour it exists for).
def _legacy():
    from mindtorch._op_prim.cpu import legacy

    return legacy


def _bf16_to_f32(x):
    import mindspore as ms

    if isinstance(x, ms.Tensor) and x.dtype == ms.bfloat16:
        return _legacy().cast(x, ms.float32)  # exact: every bf16 value is a float32 value
    return x


def _isfinite_cpu(input):
    """mindtorch CPU kernel for ``torch.isfinite`` (bf16 read as float32, which is exact)."""
    return _legacy().is_finite(_bf16_to_f32(input))


registry.register_value(
    "mindtorch-cpu-isfinite", "mindtorch._apis.cpu", "isfinite", _isfinite_cpu, only_if_imported=False,
    why="mindtorch's CPU backend has no `isfinite` (torch.isfinite raises 'No implementation for function: "
        "isfinite on cpu'); MindSpore's IsFinite CPU kernel exists for every dtype but bfloat16, so the patch "
        "adds the kernel, reading bfloat16 as float32 (exact).")


@registry.register(
    "mindtorch-isin", "mindtorch", "isin",
    why="mindtorch's torch.isin compares, casts the bool matrix to float32, sums and casts back: ~1.1 ms even "
        "for one element against one (measured), and generate() calls it at every step (the EOS check of its "
        "stopping criteria; over the whole vocabulary when min_new_tokens is set): ~1-3 ms of a ~15 ms fused "
        "decode step. The patch compares directly (one equal for a single test element, else equal + any), "
        "~15x less for the EOS check; same values and shape (bool, the elements' shape; invert= honoured).")
def _isin(wrapped, instance, args, kwargs):
    import mindtorch

    names = ("elements", "test_elements", "assume_unique", "invert")
    kw = dict(zip(names, args), **kwargs)
    elements, test = kw.get("elements"), kw.get("test_elements")
    if set(kw) - set(names) or not isinstance(elements, mindtorch.Tensor):
        return wrapped(*args, **kwargs)
    t = (test if isinstance(test, mindtorch.Tensor) else mindtorch.tensor(test)).reshape(-1)
    if t.numel() == 0:
        res = mindtorch.zeros(elements.shape, dtype=mindtorch.bool)
    elif t.numel() == 1:
        res = (elements == t).reshape(elements.shape)
    else:
        res = (elements.unsqueeze(-1) == t).any(-1).reshape(elements.shape)
    return mindtorch.logical_not(res) if kw.get("invert", False) else res


@registry.register(
    "mindtorch-cpu-equal-bf16", "mindtorch._apis.cpu", "equal",
    why="torch.equal on bfloat16 tensors fails on the CPU (MindSpore's Equal CPU kernel has no bfloat16 "
        "variant); comparing them as float32 is exact, since every bfloat16 value is a float32 value.")
def _equal_bf16(wrapped, instance, args, kwargs):
    return wrapped(*(_bf16_to_f32(a) for a in args), **kwargs)


@registry.register(
    "mindtorch-cpu-isclose-bf16", "mindtorch._apis.cpu", "isclose",
    why="torch.isclose (and so torch.testing.assert_close / torch.allclose) on bfloat16 tensors fails on the "
        "CPU (MindSpore's IsClose CPU kernel has no bfloat16 variant); the values are compared as float32 "
        "(exact conversion; the tolerance test |a-b| <= atol + rtol*|b| is then evaluated in float32).")
def _isclose_bf16(wrapped, instance, args, kwargs):
    return wrapped(*(_bf16_to_f32(a) for a in args), **kwargs)


@registry.register(
    "mindtorch-cpu-randint-dtype", "mindtorch._apis.cpu", "randint",
    why="mindtorch's CPU randint ignores `dtype=` and always returns int32 (MindSpore's UniformInt), so "
        "torch.randint(0, 255, shape, dtype=torch.uint8) is an int32 tensor; the patch casts the result to "
        "the requested dtype, as torch returns it.")
def _randint_dtype(wrapped, instance, args, kwargs):
    res = wrapped(*args, **kwargs)
    dtype = args[4] if len(args) > 4 else kwargs.get("dtype")
    if dtype is not None and res.dtype != dtype:
        res = _legacy().cast(res, dtype)
    return res


def _np_dtype(dtype):
    import mindspore as ms

    from ..utils import NP_DTYPES

    if dtype == ms.bfloat16:
        from .._reference import np_bfloat16

        return np_bfloat16  # ml_dtypes' (what mindtorch's numpy views use)
    return NP_DTYPES[dtype]


@registry.register(
    "mindtorch-view-dtype", "mindtorch._tensor", "Tensor.view",
    why="mindtorch's Tensor.view only knows the shape overload: t.view(torch.bfloat16) treats the dtype as a "
        "size and fails ('...typing.UInt object has no attribute item'). torch's view(dtype) reinterprets the "
        "bytes (last dimension scaled by the itemsize ratio); the patch does that through numpy. The result "
        "is a copy, not an alias (mindtorch's views of CPU tensors are copies in other places too).")
def _view_dtype(wrapped, instance, args, kwargs):
    from mindspore._c_expression.typing import Type

    dtype = args[0] if len(args) == 1 and not kwargs else kwargs.get("dtype") if not args else None
    if not isinstance(dtype, Type):
        return wrapped(*args, **kwargs)
    import mindspore as ms
    import numpy as np

    if instance.dtype == dtype:
        return instance
    arr = np.ascontiguousarray(instance.asnumpy())
    if arr.ndim == 0 and arr.dtype.itemsize != np.dtype(_np_dtype(dtype)).itemsize:
        raise RuntimeError("self.dim() cannot be 0 to view a tensor as a dtype with a different element size")
    res = ms.Tensor(arr.view(_np_dtype(dtype)).copy())
    res._device = instance.device
    return res


@registry.register(
    "mindtorch-isreal-device", "mindtorch._tensor", "Tensor.isreal",
    why="mindtorch has no Tensor.isreal of its own, so MindSpore's runs and returns a tensor without mindtorch's "
        "device tag; any mindtorch op on it (e.g. `.all()`) then raises 'Tensor must have device'. The patch "
        "gives the result the input's device.")
def _isreal_device(wrapped, instance, args, kwargs):
    res = wrapped(*args, **kwargs)
    if getattr(res, "_device", None) is None and getattr(instance, "_device", None) is not None:
        res._device = instance._device
    return res


def _dispatch_torch_function(wrapped, instance, args, kwargs):
    t = args[0] if args else kwargs.get("input", kwargs.get("tensor"))
    tf = getattr(type(t), "__torch_function__", None)
    owner = getattr(getattr(tf, "__func__", tf), "__module__", "") or ""
    if tf is None or owner.startswith("mindtorch"):
        return wrapped(*args, **kwargs)
    return tf(wrapped, (type(t),), tuple(args), dict(kwargs))


registry.register(
    "mindtorch-torch-function-chunk", "mindtorch", "chunk",
    why="mindtorch does not implement the __torch_function__ protocol, so a tensor subclass cannot keep its "
        "type through torch.chunk (bitsandbytes' Params4bit relies on it for FSDP-style sharding). The patch "
        "calls the first argument's class-level __torch_function__ (with the original torch.chunk as `func`) "
        "when a class outside mindtorch defines one.")(_dispatch_torch_function)
registry.register(
    "mindtorch-torch-function-split", "mindtorch", "split",
    why="as mindtorch-torch-function-chunk, for torch.split: mindtorch ignores __torch_function__, so tensor "
        "subclasses such as Params4bit lose their type (and quant_state) when split; the patch dispatches to "
        "the subclass's __torch_function__.")(_dispatch_torch_function)


# ---- ports: torch.nn.utils.parametrize (bitsandbytes_ms.nn.parametrize) ----
# Test: tests/test_nn_parametrize.py::test_patch_proxy_module_setattr (fixed behaviour, and the mindtorch
# behaviour with the patch removed).
def _proxy_module_setattr(self, name, value):
    """``torch.<sub>.name = value`` on one of mindtorch's ``torch`` alias modules: set it on the mindtorch
    module the alias reads from (and drop any copy the alias kept), as if it were that module."""
    import importlib

    if name.startswith("__") and name.endswith("__"):  # the alias' own module metadata
        return object.__setattr__(self, name, value)
    target = importlib.import_module(self.__loader__.target_name)
    setattr(target, name, value)
    self.__dict__.pop(name, None)


registry.register_value(
    "mindtorch-proxy-module-setattr", "torch.nn.utils.parametrize", "__class__.__setattr__", _proxy_module_setattr,
    only_if_imported=False,
    why="after `import mindnlp`, `torch.nn.utils.parametrize` is an alias module (mindtorch.torch_proxy) that reads "
        "through to mindtorch.nn.utils.parametrize but keeps assignments to itself: `P._cache_enabled += 1` (how "
        "bitsandbytes' parametrize hooks and their users switch on the parametrization cache) never reaches the "
        "counter mindtorch's parametrized attributes consult, and later reads through the alias see the stale copy. "
        "The patch makes assignments through this alias land on the mindtorch module, as with PyTorch's module.")


# ---- transformers' bitsandbytes quantizers: the layers they keep in full precision run the native forward ----
# Test: tests/test_linear_fp.py::test_patch_from_pretrained_kept_layers_are_linear_fp (LinearFP with the patch,
# plain nn.Linear with it removed).
def _kept_layers_fast(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    model = args[0] if args else kwargs.get("model")
    if model is not None:
        from ..nn.linear_fp import use_fast_fp_layers

        use_fast_fp_layers(model)  # every plain nn.Linear left after the quantizer is a kept layer
    return result


_WHY_KEPT = ("from_pretrained(quantization_config=BitsAndBytesConfig(...)) keeps lm_head (llm_int8_skip_modules) as "
             "mindtorch's nn.Linear, which runs MindSpore's CPU `dense`: ~200 ms for SmolLM2's 1 x 576 -> 49152 "
             "lm_head (the slowest layer of a quantized decode step) and no bfloat16 at all. After the quantizer's "
             "own post-load step the kept plain nn.Linear layers become bitsandbytes_ms.nn.LinearFP in place (same "
             "module object and parameters, ties kept; native GEMV at inference), as quant_8bit/quant_4bit do.")
registry.register("transformers-bnb4bit-kept-layers-native", "transformers.quantizers.quantizer_bnb_4bit",
                  "Bnb4BitHfQuantizer._process_model_after_weight_loading", why=_WHY_KEPT)(_kept_layers_fast)
registry.register("transformers-bnb8bit-kept-layers-native", "transformers.quantizers.quantizer_bnb_8bit",
                  "Bnb8BitHfQuantizer._process_model_after_weight_loading", why=_WHY_KEPT)(_kept_layers_fast)


@functools.lru_cache(maxsize=None)
def _libm():
    """glibc's libm (fegetenv / fesetenv), or None where it cannot be loaded."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    except OSError:
        return None


def _keeping_fp_env(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with the calling thread's floating-point environment (MXCSR: FTZ/DAZ, rounding)
    restored afterwards. MindSpore's CPU LpNorm kernel switches flush-to-zero / denormals-are-zero on in the
    thread that runs it and leaves them on (measured: after one norm, numpy's 1e-41 * 2 gave 0), which would change
    every later subnormal result of numpy and of this library's kernels (they run with the caller's MXCSR)."""
    lib = _libm()
    if lib is None:
        return fn(*args, **kwargs)
    env = ctypes.create_string_buffer(64)  # fenv_t is 32 bytes on x86-64 glibc
    saved = lib.fegetenv(env) == 0
    try:
        return fn(*args, **kwargs)
    finally:
        if saved:
            lib.fesetenv(env)


def _flat_norm(wrapped, input, p, dim, keepdim, dtype):
    """``wrapped`` over all of ``input`` when ``dim`` is None: the tensor flattened, reduced over its one axis, the
    result given ``input``'s rank of ones when ``keepdim``; the caller's floating-point environment kept."""
    if dim is not None or not hasattr(input, "reshape"):
        return _keeping_fp_env(wrapped, input, p, dim, keepdim, dtype=dtype)
    flat = input.reshape(-1)
    r = _keeping_fp_env(wrapped, flat, p, 0, False, dtype=dtype)
    return r.reshape((1,) * input.ndim) if keepdim else r


def _norm_args(args, kwargs, p_name):
    names = ("input", p_name, "dim", "keepdim")
    vals = dict(zip(names, args))
    vals.update({k: v for k, v in kwargs.items() if k in names})
    return vals["input"], vals.get(p_name, 2), vals.get("dim"), vals.get("keepdim", False), kwargs.get("dtype")


_NORM_WHY = ("mindtorch's vector norm hands dim=None on to MindSpore's LpNorm, which takes only an int or tuple axis "
             "on the CPU (`TypeError: For 'LpNorm', the type of 'axis' should be one of ...`), so "
             "torch.nn.utils.clip_grad_norm_ -- and with it HF Trainer's default max_grad_norm=1.0 -- fails. dim=None "
             "means the norm of all elements, as in PyTorch: the tensor is flattened and reduced over its one axis. "
             "The kernel also leaves flush-to-zero on in the calling thread: the floating-point environment is "
             "restored after it.")


@registry.register("mindtorch-vector-norm-dim-none", "mindtorch.ops.reduction", "vector_norm", why=_NORM_WHY)
def _vector_norm_dim_none(wrapped, instance, args, kwargs):
    inp, p, dim, keepdim, dtype = _norm_args(args, kwargs, "p")
    return _flat_norm(wrapped, inp, p, dim, keepdim, dtype)


@registry.register("mindtorch-linalg-vector-norm-dim-none", "mindtorch.linalg", "vector_norm", why=_NORM_WHY)
def _linalg_vector_norm_dim_none(wrapped, instance, args, kwargs):
    inp, p, dim, keepdim, dtype = _norm_args(args, kwargs, "ord")
    return _flat_norm(wrapped, inp, p, dim, keepdim, dtype)


# ---- meta tensors: shapes without data ----
def _index_host(i):
    """An index as numpy sees it: tensors (small index tensors) as arrays, tuples element by element."""
    if isinstance(i, tuple):
        return tuple(_index_host(j) for j in i)
    return i.asnumpy() if hasattr(i, "asnumpy") else i


def _meta_like(wrapped, shape, dtype):
    import mindtorch

    meta = wrapped.__globals__
    return mindtorch.Tensor(meta["Tensor_"](shape=tuple(shape), dtype=dtype))


_META_WHY = ("mindtorch's meta-device getitem and index_select compute their result's shape by calling asnumpy() on "
             "the meta tensor, which allocates the whole tensor's data and keeps it on that tensor: transformers "
             "builds models on the meta device, and nn.Embedding(padding_idx=...) zeroes its padding row there "
             "(weight[padding_idx]), so loading any model with a pad token held a full-precision copy of its "
             "embedding until the load ended (SmolLM2-135M: +108 MiB of peak RSS; a 4096 x 49152 embedding: "
             "+768 MiB). The shape is taken from a zero-stride view of the meta tensor's shape instead.")


@registry.register("mindtorch-meta-getitem-no-data", "mindtorch._apis.meta", "getitem", why=_META_WHY)
def _meta_getitem(wrapped, instance, args, kwargs):
    import numpy as np

    inp, index = args[0], args[1] if len(args) > 1 else kwargs["slice"]
    probe = np.broadcast_to(np.zeros((), np.uint8), tuple(inp.shape))  # no memory: every stride 0
    return _meta_like(wrapped, probe[_index_host(index)].shape, inp.dtype)


@registry.register("mindtorch-meta-index-select-no-data", "mindtorch._apis.meta", "index_select", why=_META_WHY)
def _meta_index_select(wrapped, instance, args, kwargs):
    import numpy as np

    names = ("input", "dim", "index")
    vals = dict(zip(names, args), **kwargs)
    inp, dim, index = vals["input"], vals["dim"], vals["index"]
    probe = np.broadcast_to(np.zeros((), np.uint8), tuple(inp.shape))
    return _meta_like(wrapped, np.take(probe, _index_host(index), int(dim)).shape, inp.dtype)
