"""Small helpers shared across the package (bitsandbytes' ``utils``)."""

from __future__ import annotations

import json
from typing import Any, Dict

import numpy as np
import mindspore as ms
from mindspore import Tensor


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


DTYPE_NAMES = {ms.float32: "float32", ms.float16: "float16", ms.bfloat16: "bfloat16", ms.float64: "float64",
               ms.int8: "int8", ms.uint8: "uint8", ms.int32: "int32", ms.int64: "int64"}


def dtype_name(dtype) -> str:
    """``"float16"`` for ``mindspore.float16``: the name upstream writes into checkpoints."""
    if dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    return str(dtype).replace("torch.", "").lower()


def dtype_from_name(name: str):
    """``mindspore.float16`` for ``"float16"`` (or ``"torch.float16"``)."""
    name = name.replace("torch.", "")
    for dt, n in DTYPE_NAMES.items():
        if n == name:
            return dt
    raise ValueError(f"unknown dtype name {name!r}")
