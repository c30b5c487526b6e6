"""4-bit quant_storage=bfloat16 keeps the packed bytes exactly (packed codes reinterpreted as bf16 include NaN bit
patterns, which a float32 round trip would change), and Params4bit pickles with its attributes."""

import pickle

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")

import mindnlp  # noqa: F401,E402
import torch  # noqa: E402

import bitsandbytes_ms.functional as F  # noqa: E402
from bitsandbytes_ms.nn import Linear4bit, Params4bit  # noqa: E402


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_bf16_storage_keeps_bytes(quant_type):
    rng = np.random.RandomState(0)
    A = ms.Tensor(rng.standard_normal((256, 128)).astype(np.float32))
    q8, s8 = F.quantize_4bit(A, quant_type=quant_type)
    qb, sb = F.quantize_4bit(A, quant_type=quant_type, quant_storage=ms.bfloat16)
    assert qb.dtype == ms.bfloat16
    raw8, rawb = q8.asnumpy().reshape(-1), qb.asnumpy().view(np.uint8).reshape(-1)
    np.testing.assert_array_equal(rawb, raw8)
    pairs = raw8.view(np.uint16)
    assert np.any((pairs & 0x7F80) == 0x7F80)  # the data does contain bf16 NaN/inf bit patterns
    np.testing.assert_array_equal(F.dequantize_4bit(qb, sb).asnumpy(), F.dequantize_4bit(q8, s8).asnumpy())
    x = ms.Tensor(rng.standard_normal((1, 128)).astype(np.float32))
    np.testing.assert_array_equal(F.gemv_4bit(x, qb.t(), state=sb).asnumpy(), F.gemv_4bit(x, q8.t(), state=s8).asnumpy())


@pytest.mark.parametrize("compress_statistics", [True, False])
def test_params4bit_pickle_keeps_attributes(compress_statistics):
    w = torch.tensor(np.random.RandomState(1).standard_normal((64, 32)).astype(np.float32))
    p = Params4bit(w, quant_type="nf4", blocksize=32, compress_statistics=compress_statistics).to("cpu")
    q = pickle.loads(pickle.dumps(p))
    assert isinstance(q, Params4bit) and q.bnb_quantized and q.quant_type == "nf4" and q.blocksize == 32
    assert q.quant_state == p.quant_state and set(q.__dict__) == set(p.__dict__)
    np.testing.assert_array_equal(q.numpy(), p.numpy())
    assert (q.nested_blocksize == 256) if compress_statistics else not hasattr(q, "nested_absmax")
    np.testing.assert_array_equal(q.absmax.asnumpy(), p.quant_state.absmax.asnumpy())


def test_linear4bit_pickle_round_trip_same_output():
    layer = Linear4bit(64, 48, quant_type="fp4").to("cpu")
    layer2 = pickle.loads(pickle.dumps(layer))
    assert layer2.weight.module is layer2
    x = torch.tensor(np.random.RandomState(2).standard_normal((5, 64)).astype(np.float32))
    np.testing.assert_array_equal(layer2(x).numpy(), layer(x).numpy())
