"""nn layers on bad input (issue 15 item 7 and its unclear errors): the errors torch raises, before any kernel.

torch.nn.functional.embedding raises IndexError for an index outside [0, num_embeddings) (-1 included) and
RuntimeError for an index tensor that is not int32/int64; torch's linear raises RuntimeError for an integer or
a 0-d input. The layers here did not: every embedding returned the last row for -1, the 8-/4-bit ones truncated
float indices, out-of-range indices and an empty StableEmbedding batch reached MindSpore's C++ errors,
Linear4bit returned truncated int64 for int64 input, and LinearWeightOnly(64, 32, bits=4) took 63 features.
"""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402

EMBEDDINGS = ["Embedding", "StableEmbedding", "Embedding8bit", "EmbeddingNF4", "EmbeddingFP4"]


def _embedding(name, num=10, dim=64):
    torch.manual_seed(0)
    np.random.seed(0)
    e = getattr(bnb.nn, name)(num, dim)
    return e if name == "Embedding" else e.to("cpu")


def _table(e):
    """The rows the layer stands for, in float32 (looked up one by one through the layer itself)."""
    return np.stack([e(torch.tensor([i])).to(torch.float32).asnumpy()[0] for i in range(e.num_embeddings)])


@pytest.mark.parametrize("name", EMBEDDINGS)
@pytest.mark.parametrize("index", [-1, -10, 10, 1000])
def test_embedding_index_out_of_range_is_index_error(name, index):
    e = _embedding(name)
    with pytest.raises(IndexError, match=rf"{name}: index out of range in self: `input` holds index {index}; "
                                         r"expected indices in \[0, 10\)"):
        e(torch.tensor([[1, index], [2, 3]]))


@pytest.mark.parametrize("name", EMBEDDINGS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8", "bool", "int16"])
def test_embedding_non_integer_indices_are_rejected_as_torch(name, dtype):
    e = _embedding(name)
    idx = torch.tensor([1, 0]).to(getattr(torch, dtype))
    with pytest.raises(RuntimeError, match=rf"{name}: expected tensor for argument #1 'indices' \(`input`\) to have "
                                           r"one of the following scalar types: Long, Int"):
        e(idx)


@pytest.mark.parametrize("name", EMBEDDINGS)
def test_embedding_valid_indices_and_empty_batches(name):
    e = _embedding(name)
    table = _table(e)
    idx = np.array([[0, 9, 3], [3, 3, 1]])
    for dt in (torch.int64, torch.int32):
        out = e(torch.tensor(idx).to(dt)).to(torch.float32).asnumpy()
        np.testing.assert_array_equal(out, table[idx])
    out0 = e(torch.tensor(4)).to(torch.float32).asnumpy()  # 0-d index: one row, as torch
    np.testing.assert_array_equal(out0, table[4])
    for shape in [(0,), (2, 0), (0, 3)]:
        empty = e(torch.zeros(shape, dtype=torch.int64))
        assert tuple(empty.shape) == shape + (64,) and empty.dtype == ms.float32


@pytest.fixture(scope="module")
def linears():
    torch.manual_seed(0)
    return {
        "Linear4bit": bnb.nn.Linear4bit(64, 32, quant_type="nf4").to("cpu"),
        "LinearWeightOnly": bnb.nn.LinearWeightOnly(64, 32, bits=4).to("cpu"),
    }


@pytest.mark.parametrize("name", ["Linear4bit", "LinearWeightOnly"])
@pytest.mark.parametrize("dtype", ["int64", "int32", "int8", "bool"])
def test_linear_integer_input_is_rejected(linears, name, dtype):
    with pytest.raises(RuntimeError, match=rf"{name}: `x` must have dtype float32, float16 or bfloat16 .*got"):
        linears[name](torch.ones(2, 64).to(getattr(torch, dtype)))


@pytest.mark.parametrize("name", ["Linear4bit", "LinearWeightOnly"])
def test_linear_0d_input_is_rejected(linears, name):
    with pytest.raises(RuntimeError, match=rf"{name}: `x` must have at least 1 dimension, \[\.\.\., 64\]; got a 0-d"):
        linears[name](torch.tensor(1.0))


@pytest.mark.parametrize("features", [63, 65, 62])
def test_linear_weight_only_int4_checks_in_features(linears, features):
    """int4 packs K = 63 and 64 into the same 32 bytes a row: the layer's in_features decides."""
    lw = linears["LinearWeightOnly"]
    with pytest.raises(ValueError, match=r"`A` must have last dimension in_features = 64|`q` must have shape"):
        lw(torch.ones(2, features))
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    from bitsandbytes_ms import functional as F

    W = F.dequantize_weight_only(lw.weight.data, lw.weight_scale, 64, 4).asnumpy()
    ref = x @ W.T + lw.bias.asnumpy()
    np.testing.assert_allclose(lw(torch.tensor(x)).asnumpy(), ref, rtol=1e-5, atol=1e-5)


def test_linear_fp_dtype_mismatch_is_named():
    from bitsandbytes_ms.nn import LinearFP

    lin = LinearFP.from_linear(torch.nn.Linear(8, 4))
    with pytest.raises(RuntimeError, match="LinearFP: `input` must have the weight's dtype float32; got float16"):
        lin(torch.ones(2, 8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="LinearFP: `input` must have the weight's dtype float32; got int64"):
        lin(torch.ones(2, 8, dtype=torch.int64))
