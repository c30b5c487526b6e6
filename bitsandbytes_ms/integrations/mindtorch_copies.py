"""Copies that own their memory: ``t.copy_(src)`` and ``copy.deepcopy`` of mindtorch tensors and parameters.

mindtorch's CPU ``copy_`` points the destination at the source's buffer (``assign_value``) and its
``Tensor.__deepcopy__`` / ``Parameter.__deepcopy__`` wrap the same buffer in a new tensor. mindtorch never writes a
buffer in place (its in-place ops compute a new buffer and re-point the tensor), so the sharing is invisible there;
this library's kernels do write in place (an optimizer step updates each parameter in its own memory, as upstream's
CUDA and CPU kernels do), and then every "copy" changed with the parameter: ``copy.deepcopy(model)`` (an EMA or
reference model, a best-checkpoint snapshot), ``buf.copy_(p)`` and ``model2.load_state_dict(model1.state_dict())``
(which copies with ``copy_``) trained in lockstep with the original. With these patches the copy gets its own
buffer, as in PyTorch; ``Parameter.__deepcopy__`` also keeps ``requires_grad`` (mindtorch's made a frozen parameter
trainable). Applied where this library's in-place writers can be reached: when ``bitsandbytes_ms.nn`` or
``bitsandbytes_ms.optim`` is imported (:func:`ensure`), and by :func:`bitsandbytes_ms.register`."""

import mindspore as ms

from .patches import registry

NAMES = ("mindtorch-copy-owns-memory", "mindtorch-tensor-deepcopy-owns-memory", "mindtorch-parameter-deepcopy-owns-memory")
_WHY = __doc__.split("\n\n")[1].replace("\n", " ")


def _fresh(t):
    """``t``'s values in a buffer of their own (``t``'s dtype and device tag): ``clone()``, or for bfloat16, which
    mindtorch's CPU clone refuses (its kernel has no bfloat16), a host copy."""
    if t.dtype != ms.bfloat16:
        return t.clone()
    c = ms.Tensor(t.asnumpy().copy())
    device = getattr(t, "_device", None)
    if device is not None:
        c._device = device
    return c


@registry.register(NAMES[0], "mindtorch._tensor", "Tensor.copy_", why=_WHY, on_import=True)
def _copy_owns_memory(wrapped, instance, args, kwargs):
    # a source of another dtype is converted first (a new buffer already); the same dtype is copied here
    if args and isinstance(args[0], ms.Tensor) and args[0] is not instance and args[0].dtype == instance.dtype:
        args = (_fresh(args[0]),) + tuple(args[1:])
    return wrapped(*args, **kwargs)


def _own_buffer(new, original):
    """``new`` (mindtorch's deepcopy of ``original``, sharing its buffer) re-pointed at a copy of the data."""
    if isinstance(new, ms.Tensor) and new is not original:
        device = getattr(new, "_device", None)
        new.assign_value(_fresh(original))
        if device is not None:
            new._device = device
    return new


@registry.register(NAMES[1], "mindtorch._tensor", "Tensor.__deepcopy__", why=_WHY, on_import=True)
def _tensor_deepcopy(wrapped, instance, args, kwargs):
    return _own_buffer(wrapped(*args, **kwargs), instance)


@registry.register(NAMES[2], "mindtorch.nn.parameter", "Parameter.__deepcopy__", why=_WHY, on_import=True)
def _parameter_deepcopy(wrapped, instance, args, kwargs):
    new = _own_buffer(wrapped(*args, **kwargs), instance)
    new.requires_grad = instance.requires_grad
    return new


def ensure() -> None:
    """Applies the patches now (idempotent)."""
    registry.apply(list(NAMES))
