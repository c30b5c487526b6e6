"""Kernels of the ops declared in :mod:`bitsandbytes_ms._ops`, one module per backend (upstream's
``bitsandbytes/backends/<name>/ops.py``): :mod:`.native` (the CPU and the CUDA library) and :mod:`.reference`
(numpy). Importing this package registers both (the op layer imports no backend: no import circle). The
byte-level helpers both use live in :mod:`bitsandbytes_ms._formats_common` (re-exported here).

Kernels use MindSpore's own ops (``mindspore.ops``) on intermediate tensors, never Tensor methods: those are
mindtorch's once mindtorch is imported and need its device tag, which results get only when the op returns
(:func:`bitsandbytes_ms._ops.tag`)."""

from __future__ import annotations

from .._formats_common import as_uint8, code_4bit, storage_view  # noqa: F401

from . import native, reference  # noqa: E402,F401  (each registers its kernels with bitsandbytes_ms._ops)
