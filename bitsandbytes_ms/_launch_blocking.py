"""MindSpore's asynchronous CPU mode, turned off once when our layers first run on the CPU.

By default MindSpore 2.7 launches PyNative CPU ops asynchronously (a dispatch queue ahead of the kernels). With
our layers in a mindtorch model that is the slow mode: every native call (a quantized layer's forward, the fused
decoder) reads its inputs on the host, so each one waits for the queue to drain, and the queue's threads compete
for the cores. Measured (issue 31, 2-core EPYC): a quantized SmolLM2 generation took 84 s asynchronous against
13 s with ``mindspore.runtime.launch_blocking()``. Results are the same either way (measured: the same greedy
tokens from a quantized model before and after switching it on mid-run).

:func:`ensure` (called by the first forward of ``Linear4bit`` / ``Linear8bitLt`` / ``LinearFP`` and by the first
native host call) turns ``launch_blocking`` on where the device target is CPU and it is off, and says so in one
warning. ``BNB_MS_LAUNCH_BLOCKING=0`` leaves MindSpore's setting alone.
"""

from __future__ import annotations

import os
import sys
import warnings

_state = {"done": False}

# The packages a layer call passes through on its way here: the warning points at the first frame outside them
# (the user's own line), not at mindtorch's module call.
_LIBS = ("bitsandbytes_ms", "mindtorch", "mindnlp", "transformers", "peft", "accelerate", "mindspore", "torch")


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel of the first caller outside _LIBS (seen from ensure's caller's frame)."""
    f, level = sys._getframe(2), 2
    while f is not None:
        parts = os.path.normpath(f.f_code.co_filename).split(os.sep)
        if not any(p in _LIBS for p in parts) and not f.f_code.co_filename.startswith("<frozen"):
            return level
        f, level = f.f_back, level + 1
    return 2


def is_on() -> bool | None:
    """Whether MindSpore's ``launch_blocking`` is on (None where this MindSpore cannot say)."""
    try:
        from mindspore._c_expression import RuntimeConf

        return bool(RuntimeConf.get_instance().is_launch_blocking())
    except (ImportError, AttributeError):
        return None


def ensure() -> bool:
    """Turns ``mindspore.runtime.launch_blocking()`` on (once per process) when the device target is CPU and it is
    off; returns True when this call turned it on. Cheap after the first call."""
    if _state["done"]:
        return False
    _state["done"] = True
    if os.environ.get("BNB_MS_LAUNCH_BLOCKING", "1").strip() == "0":
        return False
    import mindspore as ms

    if ms.get_context("device_target") != "CPU" or is_on() is not False:
        return False
    ms.runtime.launch_blocking()
    warnings.warn("bitsandbytes_ms: turned on mindspore.runtime.launch_blocking(): in MindSpore's asynchronous CPU "
                  "mode every quantized layer call waits for the op queue (a quantized model's generation measured "
                  "~6x slower); set BNB_MS_LAUNCH_BLOCKING=0 to keep it off",
                  RuntimeWarning, stacklevel=_user_stacklevel())
    return True
