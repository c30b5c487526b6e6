"""The fused 4-bit inference forward (functional.linear_4bit -> clinear_4bit_*): bit-identical to the unfused
gemv_4bit + bias path and to the numpy reference's decode of the double-quant absmax, through both transports
(host call and ops.Custom), for every activation dtype, nested or not, 1..8 rows, odd shapes; Linear4bit /
matmul_4bit use it in inference and keep their gradients under value_and_grad; bad input is named."""

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

import bitsandbytes_ms as bnb
import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _hostcall as H
from bitsandbytes_ms import _reference as R
from bitsandbytes_ms.cextension import lib

DTYPES = [ms.float32, ms.float16, ms.bfloat16]


def _f32(t):
    return t.astype(ms.float32).asnumpy()


def _unfused(x, q, qs, bias, dt):
    y = F.gemv_4bit(x, q.t(), state=qs) if x.shape[0] == 1 else Tensor(np.concatenate(
        [_f32(F.gemv_4bit(x[i:i + 1], q.t(), state=qs)) for i in range(x.shape[0])])).astype(dt)
    if bias is not None:
        y = (y.astype(ms.float32) + bias.astype(ms.float32)).astype(dt)
    return _f32(y)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: str(d))
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "dq"])
@pytest.mark.parametrize("M,N,K,bs", [(1, 40, 192, 64), (3, 33, 100, 64), (8, 16, 512, 128), (2, 7, 77, 32)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_fused_equals_unfused(dt, nested, M, N, K, bs, with_bias):
    rng = np.random.default_rng(N * K + M)
    W = Tensor(rng.standard_normal((N, K)).astype(np.float32)).astype(dt)
    q, qs = F.quantize_4bit(W, blocksize=bs, quant_type="nf4", compress_statistics=nested)
    x = Tensor(rng.standard_normal((M, K)).astype(np.float32)).astype(dt)
    bias = Tensor(rng.standard_normal(N).astype(np.float32)).astype(dt) if with_bias else None
    ref = _unfused(x, q, qs, bias, dt)
    host = _f32(F.linear_4bit(x, q, qs, bias))
    old = H.set_enabled(False)
    try:
        custom = _f32(F.linear_4bit(x, q, qs, bias))
    finally:
        H.set_enabled(old)
    assert np.array_equal(host, ref)
    assert np.array_equal(custom, ref)


def test_nested_decode_matches_numpy_reference():
    rng = np.random.default_rng(7)
    N, K = 24, 256
    W = Tensor(rng.standard_normal((N, K)).astype(np.float32) * 3)
    q, qs = F.quantize_4bit(W, quant_type="fp4", compress_statistics=True)
    x = Tensor(rng.standard_normal((2, K)).astype(np.float32))
    b = rng.standard_normal(N).astype(np.float32)
    s2 = qs.state2
    ref = R.linear_4bit(x.asnumpy(), q.asnumpy().reshape(-1), qs.absmax.asnumpy(), qs.code.asnumpy(), 64, N,
                        absmax2=s2.absmax.asnumpy(), code2=s2.code.asnumpy(), offset=float(qs.offset.asnumpy()),
                        bias=b, blocksize2=s2.blocksize)
    got = F.linear_4bit(x, q, qs, Tensor(b)).asnumpy()
    # the reference sums in float64: the kernel's fixed fp32 order differs by rounding only
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # the decoded absmax is the unfused dequantize_blockwise + offset, bit for bit
    amax = F.dequantize_blockwise(qs.absmax, qs.state2) + qs.offset
    dec = s2.code.asnumpy()[qs.absmax.asnumpy()] * np.repeat(s2.absmax.asnumpy(), s2.blocksize)[:qs.absmax.shape[0]]
    assert np.array_equal((dec + qs.offset.asnumpy()).astype(np.float32), amax.asnumpy())


def test_3d_input_and_storage_dtype():
    rng = np.random.default_rng(3)
    W = Tensor(rng.standard_normal((16, 64)).astype(np.float32))
    q, qs = F.quantize_4bit(W, quant_type="nf4", quant_storage=ms.bfloat16)
    x = Tensor(rng.standard_normal((2, 3, 64)).astype(np.float32))
    y = F.linear_4bit(x, q, qs)
    assert tuple(y.shape) == (2, 3, 16)
    q8, qs8 = F.quantize_4bit(W, quant_type="nf4")
    assert np.array_equal(y.asnumpy().reshape(6, 16), F.linear_4bit(x.reshape(6, 64), q8, qs8).asnumpy())


def test_bad_input_is_named():
    W = Tensor(np.ones((16, 64), np.float32))
    q, qs = F.quantize_4bit(W, quant_type="nf4")
    with pytest.raises(ValueError, match="last dimension 64"):
        F.linear_4bit(Tensor(np.ones((1, 63), np.float32)), q, qs)
    with pytest.raises(ValueError, match="`A` must have dtype"):
        F.linear_4bit(Tensor(np.ones((1, 64), np.int32)), q, qs)
    with pytest.raises(ValueError, match="`bias` must have 16 elements"):
        F.linear_4bit(Tensor(np.ones((1, 64), np.float32)), q, qs, Tensor(np.ones(15, np.float32)))
    with pytest.raises(ValueError, match="`B` holds"):
        F.linear_4bit(Tensor(np.ones((1, 64), np.float32)), q[:10], qs)
    with pytest.raises(ValueError, match="quant_state"):
        F.linear_4bit(Tensor(np.ones((1, 64), np.float32)), q, None)


def test_plan_follows_replaced_tensors():
    rng = np.random.default_rng(5)
    W1 = Tensor(rng.standard_normal((16, 64)).astype(np.float32))
    q, qs = F.quantize_4bit(W1, quant_type="nf4", compress_statistics=False)
    x = Tensor(rng.standard_normal((1, 64)).astype(np.float32))
    y1 = F.linear_4bit(x, q, qs).asnumpy()
    qs.absmax = qs.absmax * 2  # a new tensor: the cached arrays must not be reused
    y2 = F.linear_4bit(x, q, qs).asnumpy()
    np.testing.assert_allclose(y2, 2 * y1, rtol=1e-6)
    q2, _ = F.quantize_4bit(-W1, quant_type="nf4", compress_statistics=False)  # another weight, same state
    assert not np.array_equal(F.linear_4bit(x, q2, qs).asnumpy(), y2)


def test_linear4bit_layer_uses_it_and_keeps_gradients():
    import mindnlp  # noqa: F401
    import torch

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    l4 = bnb.nn.Linear4bit(64, 32, quant_type="nf4", compute_dtype=torch.float32)
    l4.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, quant_type="nf4", module=l4)
    l4.bias = lin.bias
    l4.eval()
    x = torch.randn(1, 64)
    y_fast = l4(x).asnumpy()
    w, qs = l4.weight, l4.weight.quant_state
    ref = _unfused(x, w, qs, lin.bias, ms.float32)
    assert np.array_equal(y_fast, ref)
    old = H.set_enabled(False)
    try:
        assert np.array_equal(l4(x).asnumpy(), ref)
    finally:
        H.set_enabled(old)

    def loss(a):
        return l4(a).sum()

    _, g = ms.value_and_grad(loss)(x)
    Wd = F.dequantize_4bit(w, qs).asnumpy()
    np.testing.assert_allclose(g.asnumpy(), np.ones((1, 32), np.float32) @ Wd, rtol=1e-5, atol=1e-5)
    # matmul_4bit in inference: the same bits
    assert np.array_equal(bnb.matmul_4bit(x, w.t(), qs, bias=lin.bias).asnumpy(), ref)
