"""Loader for upstream bitsandbytes 0.50.2 vectors in compat_tests/fixtures (schema in its README)."""

import json
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16

import mindspore as ms

FIXTURES = Path(__file__).resolve().parents[1] / "compat_tests" / "fixtures"
MS_DTYPE = {"f32": ms.float32, "f16": ms.float16, "bf16": ms.bfloat16,
            "float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


def load(name):
    """Returns {case_name: (case_dict, {field: np.ndarray})}; bfloat16 fields come back as ml_dtypes
    bfloat16 arrays."""
    data = np.load(FIXTURES / f"{name}.npz", allow_pickle=False)
    out = {}
    for raw in data["__cases__"]:
        case = json.loads(str(raw))
        arrays = {}
        for field, spec in case.get("fields", {}).items():
            arr = data[f"{case['name']}__{field}"]
            if spec["dtype"] == "bfloat16":
                arr = arr.view(bfloat16)
            arrays[field] = arr
        out[case["name"]] = (case, arrays)
    return out


def to_ms(arr):
    """numpy (incl. bfloat16) -> mindspore.Tensor of the same dtype."""
    if arr.dtype == bfloat16:
        return ms.Tensor(arr.astype(np.float32)).astype(ms.bfloat16)
    return ms.Tensor(np.ascontiguousarray(arr))


def bits(arr):
    """Raw bit patterns, to compare floats (including -0.0 and NaN) exactly."""
    arr = np.asarray(arr)
    return arr.view({2: np.uint16, 4: np.uint32, 1: np.uint8, 8: np.uint64}[arr.dtype.itemsize])
