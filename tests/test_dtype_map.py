"""The package's one dtype map (utils.DTYPES, issue 14 item 3): its views agree with numpy, MindSpore and the
op table's C names, and no other module keeps a dtype map of its own."""

import ast
import pathlib

import numpy as np
import pytest

import mindspore as ms

from bitsandbytes_ms import _native_table, utils

PKG = pathlib.Path(utils.__file__).parent


@pytest.mark.parametrize("dt", list(utils.DTYPES), ids=lambda d: utils.DTYPES[d].name)
def test_row_matches_mindspore_and_numpy(dt):
    info = utils.DTYPES[dt]
    assert np.dtype(info.np).itemsize == info.itemsize
    assert utils.dtype_name(dt) == info.name and utils.dtype_from_name(info.name) == dt
    assert utils.ITEMSIZES[dt] == info.itemsize and utils.NP_DTYPES[dt] is info.np
    if dt == ms.bfloat16:  # numpy's view of a MindSpore bf16 tensor is the map's type
        assert Tensor_bf16_np_dtype() == np.dtype(info.np)
    else:  # a numpy array of the map's type becomes a tensor of this dtype
        assert ms.Tensor(np.zeros(3, info.np)).dtype == dt


def Tensor_bf16_np_dtype():
    return ms.Tensor(np.zeros(2, np.float32)).astype(ms.bfloat16).asnumpy().dtype


def test_suffixes_are_the_op_tables():
    assert utils.SUFFIX_OF_DTYPE == {ms.float32: "fp32", ms.float16: "fp16", ms.bfloat16: "bf16"}
    assert _native_table.SUFFIX_OF_DTYPE is utils.SUFFIX_OF_DTYPE and _native_table.DTYPE_OF_SUFFIX is utils.DTYPE_OF_SUFFIX
    # every dtype-suffixed C entry point names one of the map's suffixes
    sfx = {n.rsplit("_", 1)[1] for n in _native_table.OPS if n.rsplit("_", 1)[1] in ("fp32", "fp16", "bf16", "fp64")}
    assert sfx == set(utils.DTYPE_OF_SUFFIX)
    assert utils.FLOAT_DTYPE_OF_NAME == {"fp32": ms.float32, "float32": ms.float32, "fp16": ms.float16,
                                         "float16": ms.float16, "bf16": ms.bfloat16, "bfloat16": ms.bfloat16}


#: per-dtype tuning tables (not descriptions of dtypes)
TUNING_TABLES = {"GEMM_FP_NATIVE_MAX_ROWS"}


def _is_dtype(node):
    names = {info.name for info in utils.DTYPES.values()} | {"bool_"}
    return (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
            and node.value.id in ("ms", "mindspore", "_ms", "torch"))


def _dtype_dicts(tree):
    """Lines of dict literals keyed by (or mapping to) 3+ `ms.<dtype>` attributes, outside TUNING_TABLES."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in TUNING_TABLES
                                                for t in node.targets):
            skip.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and id(node) not in skip:
            if sum(map(_is_dtype, node.keys)) >= 3 or sum(map(_is_dtype, node.values)) >= 3:
                yield node.lineno


def test_no_other_dtype_map_in_the_package():
    # _hostcall.py keeps its numpy dtypes (another engineer's file, issue 14 item 2 scope); utils.py is the map
    allowed = {"utils.py", "_hostcall.py"}
    found = {}
    for path in PKG.rglob("*.py"):
        if path.name in allowed:
            continue
        lines = list(_dtype_dicts(ast.parse(path.read_text())))
        if lines:
            found[str(path.relative_to(PKG))] = lines
    assert found == {}
