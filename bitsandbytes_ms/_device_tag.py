"""mindtorch's device tag on op results (:func:`tag`), below every module that returns tensors.

It lives here, with no imports from this package, so that the op layer (:mod:`bitsandbytes_ms._ops`, which
re-exports it), the native bridge (:mod:`bitsandbytes_ms.cextension`) and the layers all take it from one place
without importing each other."""

from __future__ import annotations

import sys
from typing import Sequence

from mindspore import Tensor


def tag(res, like: Sequence = ()):
    """Gives the tensors of an op's result (a tensor, or a tuple/list of tensors and None) the ``_device`` attribute
    mindtorch keeps on every tensor (mindtorch's Tensor methods raise without it), taken from the first tensor of
    ``like`` that has one, else mindtorch's CPU device once mindtorch is imported. Plain MindSpore tensors are
    left alone when mindtorch is not in use. Returns ``res``."""
    if res is None:
        return res
    outs = res if isinstance(res, (tuple, list)) else (res,)
    device = None
    for t in outs:
        if isinstance(t, Tensor) and not hasattr(t, "_device"):
            if not hasattr(t, "asnumpy"):  # MindSpore's graph compiler is parsing the caller: nothing to tag
                return res
            if device is None:
                device = next((a._device for a in like if isinstance(a, Tensor) and hasattr(a, "_device")), None)
                if device is None:
                    mt = sys.modules.get("mindtorch")
                    if mt is None:
                        return res
                    device = mt.device("cpu")
            t._device = device
    return res
