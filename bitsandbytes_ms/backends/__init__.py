"""Kernels of the ops declared in :mod:`bitsandbytes_ms._ops`, one module per backend (upstream's
``bitsandbytes/backends/<name>/ops.py``): :mod:`.native` (the CPU and the CUDA library) and :mod:`.reference`
(numpy). Byte-level helpers both use live here.

Kernels use MindSpore's own ops (``mindspore.ops``) on intermediate tensors, never Tensor methods: those are
mindtorch's once mindtorch is imported and need its device tag, which results get only when the op returns
(:func:`bitsandbytes_ms._ops.tag`)."""

from __future__ import annotations

import numpy as np
import mindspore as ms
from mindspore import Tensor

from ..utils import NP_DTYPES as _NP_DTYPE


def code_4bit(quant_type: str) -> Tensor:
    """The 16-entry float32 code of ``quant_type`` ("nf4" | "fp4"), as functional caches it."""
    from ..functional import _code4  # at call time: functional imports the op layer

    return _code4(quant_type)


def storage_view(packed_u8: Tensor, quant_storage) -> Tensor:
    """Reinterprets packed uint8 bytes [(n+1)//2, 1] as ``quant_storage`` ([bytes/itemsize, 1])."""
    if quant_storage == ms.uint8:
        return packed_u8
    arr = packed_u8.asnumpy().reshape(-1)
    if quant_storage == ms.bfloat16:
        from .._reference import np_bfloat16
        # straight from the bytes: a round trip through float32 would canonicalise NaN bit patterns
        t = Tensor(arr.view(np.uint16).view(np_bfloat16).copy())
    else:
        t = Tensor(arr.view(_NP_DTYPE[quant_storage]).copy())
    return ms.ops.reshape(t, (-1, 1))


def as_uint8(A: Tensor) -> Tensor:
    """The raw bytes of a packed 4-bit tensor stored in any ``quant_storage`` dtype, as flat uint8."""
    if A.dtype == ms.uint8:
        return ms.ops.reshape(A, (-1,))
    raw = A.asnumpy().view(np.uint8)  # bf16 bits as stored (not via float32: NaN patterns would change)
    return Tensor(np.ascontiguousarray(raw).reshape(-1))
