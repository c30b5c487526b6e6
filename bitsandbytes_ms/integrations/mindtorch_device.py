"""A clear error where mindtorch's operators meet a MindSpore tensor it never placed.

Importing mindtorch (``bitsandbytes_ms.optim``'s classes are mindtorch ``torch.optim.Optimizer`` subclasses,
``bitsandbytes_ms.nn``'s layers mindtorch modules) turns ``mindspore.Tensor`` into mindtorch's ``torch.Tensor``: its
operators (``**``, ``*``, ``-``, ``abs``, ``.mean()`` ...) then dispatch on ``tensor.device``, which raises for every
tensor a MindSpore op or a ``mindspore.nn.Cell`` made (mindtorch sets ``_device`` only on the tensors it creates), with
the bare text "Tensor must have device". A plain MindSpore training loop met it as soon as it made a bitsandbytes
optimizer (a new-user trial, 2026-12-06: ``((net(x) - y) ** 2).mean()`` raised). Giving such tensors a default device
instead was tried and is wrong: the operators then run as mindtorch ops, which ``mindspore.value_and_grad`` does not
differentiate (every gradient came back 0, silently). So the property still raises the same ValueError, now saying
what happened and what to write instead (``mindspore.ops`` functions, which are unaffected)."""

from .patches import registry

NAME = "mindtorch-tensor-device-message"

_MESSAGE = ("Tensor must have device: this mindspore.Tensor was made by MindSpore (an op or a mindspore.nn.Cell), "
            "not by mindtorch, and importing mindtorch (bitsandbytes_ms.optim / bitsandbytes_ms.nn do: MindSpore NLP's "
            "torch) replaced mindspore.Tensor's operators (**, *, -, abs, .mean(), ...) with mindtorch's, which need "
            "a mindtorch device. In a plain MindSpore program write the loss with mindspore.ops functions "
            "(ops.mean(ops.square(ops.sub(out, y))), ops.abs, ...), which mindspore.value_and_grad differentiates; "
            "or build the model with mindnlp/torch (docs/training.md).")


def _device(self):
    try:
        return self._device
    except AttributeError:
        raise ValueError(_MESSAGE) from None


def _patched_property():
    from mindtorch._tensor import Tensor

    original = Tensor.__dict__.get("device")
    return property(_device, getattr(original, "fset", None), getattr(original, "fdel", None),
                    getattr(original, "__doc__", None))


# (this module is imported only where mindtorch is: bitsandbytes_ms.optim, and through mindtorch_patches)
registry.register_value(NAME, "mindtorch._tensor", "Tensor.device", _patched_property(), only_if_imported=False,
                        on_import=True, why=__doc__.split("\n\n")[1].replace("\n", " "))


def ensure() -> None:
    """Applies the patch now (idempotent): called where bitsandbytes_ms itself imports mindtorch."""
    registry.apply([NAME])
