"""The patches transformers' bitsandbytes path and training need on mindtorch (MindSpore NLP 0.5.1's
torch API). Each is registered with :data:`bitsandbytes_ms.integrations.patches.registry`, applied by
:func:`bitsandbytes_ms.register`, and has a test in tests/test_integration_patches.py."""

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


# ---- int8 (LLM.int8()) ----
def _with_int8_storage():
    import numpy as np
    import mindspore as ms
    import mindtorch.serialization as ser

    save_map = dict(ser.storage_map)
    save_map.setdefault(ms.int8, "CharStorage")  # PyTorch's name for int8 storage
    load_map = dict(ser.dtype_map)
    load_map.setdefault("CharStorage", np.int8)
    return save_map, load_map


try:
    _SAVE_MAP, _LOAD_MAP = _with_int8_storage()
except Exception:  # pragma: no cover - mindtorch layout changed; the patch is then not registered
    _SAVE_MAP = _LOAD_MAP = None

if _SAVE_MAP is not None:
    _WHY_INT8_SAVE = (
        "mindtorch's torch.save/torch.load have no storage type for int8 tensors (KeyError: mindspore.int8 in "
        "serialization.storage_map / dtype_map), so a Linear8bitLt (int8 weight) or its state_dict cannot be "
        "saved with torch.save. Adds PyTorch's 'CharStorage' name for int8 to both tables.")
    registry.register_value("mindtorch-save-int8", "mindtorch.serialization", "storage_map", _SAVE_MAP,
                            why=_WHY_INT8_SAVE, only_if_imported=False)
    registry.register_value("mindtorch-load-int8", "mindtorch.serialization", "dtype_map", _LOAD_MAP,
                            why=_WHY_INT8_SAVE, only_if_imported=False)
