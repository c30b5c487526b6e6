"""bfloat16 embedding tables (issue 15 item 9): MindSpore's CPU gather has no bf16 kernel, so Embedding /
StableEmbedding with a bf16 weight and Embedding4bit with an embedding size that is not a multiple of the
blocksize (the whole table dequantized in bf16) failed with `Select CPU operator[Gather] fail!`. They must
return the right rows in bf16."""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms import functional as F  # noqa: E402

IDX = np.array([[1, 3, 9], [0, 3, 7]], np.int64)


def _bf16_table(n=10, d=8, seed=0):
    return torch.tensor(np.random.RandomState(seed).randn(n, d).astype(np.float32)).to(torch.bfloat16)


def test_embedding_bf16_returns_the_rows():
    w = _bf16_table()
    e = bnb.nn.Embedding(10, 8, _weight=w)
    out = e(torch.tensor(IDX))
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 3, 8)
    np.testing.assert_array_equal(out.float().asnumpy(), w.float().asnumpy()[IDX])


def test_stable_embedding_bf16_layer_norm_in_fp32():
    e = bnb.nn.StableEmbedding(10, 8, dtype=torch.bfloat16)
    out = e(torch.tensor(IDX))
    assert out.dtype == torch.bfloat16
    rows = e.weight.float().asnumpy()[IDX].astype(np.float64)
    ln = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-5)
    ref = ln * e.norm.weight.asnumpy() + e.norm.bias.asnumpy()
    np.testing.assert_allclose(out.float().asnumpy(), ref, rtol=1e-2, atol=1e-2)  # bf16 output rounding


@pytest.mark.parametrize("cls", [bnb.nn.EmbeddingNF4, bnb.nn.EmbeddingFP4])
@pytest.mark.parametrize("dim", [96, 128])  # 96: whole-table dequantize path; 128: per-row path
def test_embedding_4bit_bf16_rows(cls, dim):
    e = cls(10, dim, dtype=torch.bfloat16)
    out = e(torch.tensor(IDX))
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (2, 3, dim)
    W = F.dequantize_4bit(e.weight.data, e.weight.quant_state).float().asnumpy()
    np.testing.assert_array_equal(out.float().asnumpy(), W[IDX])
