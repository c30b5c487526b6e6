"""The fused 4-bit inference forward (functional.linear_4bit -> clinear_4bit_*): one row bit-identical to the
unfused gemv_4bit + bias path, more rows bit-identical to a numpy model of the documented GEMM order, the
double-quant absmax decoded as the reference does, through both transports (host call and ops.Custom), for
every activation dtype, nested or not, odd shapes, every SIMD level; Linear4bit /
matmul_4bit use it in inference and keep their gradients under value_and_grad; bad input is named."""

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

import bitsandbytes_ms as bnb
import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _hostcall as H
from bitsandbytes_ms import _reference as R

DTYPES = [ms.float32, ms.float16, ms.bfloat16]


def _f32(t):
    return t.astype(ms.float32).asnumpy()


def _fma32(a, b, c):
    # a*b is exact in float64; the sum is rounded twice (f64, f32), which differs from one rounding only on an
    # exact f32 tie (not in these data)
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _model_gemm(w, x):
    """clinear_4bit's documented order for 2+ rows (fourbit.cpp, GEMM section): 16 fma lanes over the
    zero-padded row, then v = a[l] + a[l+8], u = v[l] + v[l+4], (u0 + u2) + (u1 + u3)."""
    N, K = w.shape
    K16 = -(-K // 16) * 16
    wp = np.zeros((N, K16), np.float32)
    wp[:, :K] = w
    xp = np.zeros((x.shape[0], K16), np.float32)
    xp[:, :K] = x
    a = np.zeros((x.shape[0], N, 16), np.float32)
    for j in range(0, K16, 16):
        a = _fma32(wp[None, :, j:j + 16], xp[:, None, j:j + 16], a)
    v = a[..., :8] + a[..., 8:]
    u = v[..., :4] + v[..., 4:]
    return (u[..., 0] + u[..., 2]) + (u[..., 1] + u[..., 3])


def _unfused(x, q, qs, bias, dt):
    """One row: gemv_4bit (+ bias), the unfused inference path. More rows: the documented GEMM order on the
    fp32 dequantized weight (code * absmax)."""
    if x.shape[0] == 1:
        y = F.gemv_4bit(x, q.t(), state=qs)
    else:
        W = F.dequantize_4bit(q, QuantStateF32(qs)).asnumpy()
        y = Tensor(_model_gemm(W, _f32(x))).astype(dt)
    if bias is not None:
        y = (y.astype(ms.float32) + bias.astype(ms.float32)).astype(dt)
    return _f32(y)


def QuantStateF32(qs):
    """The same state dequantizing to fp32 (the kernel multiplies with code * absmax unrounded)."""
    import copy

    s = copy.copy(qs)
    s.dtype = ms.float32
    return s


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: str(d))
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "dq"])
# (1, 301, 4096, 64), (4, 203, 2624, 64): over the threading threshold (row chunks start at blocks that are neither
# 64- nor blocksize2-aligned: the 64-block double-quant absmax decode of AVX-512 VBMI and its tails); (14, 21, 1100,
# 64): the AVX-512 GEMM's K slices (512; a short last one), A-row blocks (12) and a short weight-row panel (8)
@pytest.mark.parametrize("M,N,K,bs", [(1, 40, 192, 64), (3, 33, 100, 64), (8, 16, 512, 128), (2, 7, 77, 32),
                                      (1, 301, 4096, 64), (4, 203, 2624, 64), (14, 21, 1100, 64)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_fused_equals_unfused(dt, nested, M, N, K, bs, with_bias):
    rng = np.random.default_rng(N * K + M)
    W = Tensor(rng.standard_normal((N, K)).astype(np.float32)).astype(dt)
    q, qs = F.quantize_4bit(W, blocksize=bs, quant_type="nf4", compress_statistics=nested)
    x = Tensor(rng.standard_normal((M, K)).astype(np.float32)).astype(dt)
    bias = Tensor(rng.standard_normal(N).astype(np.float32)).astype(dt) if with_bias else None
    ref = _unfused(x, q, qs, bias, dt)
    # bf16_dot=False: the exact path (the default picks the bf16 dot kernel for 2+ bf16 rows where the CPU has
    # AVX512-BF16; tests/test_linear4bit_bf16.py checks that kernel against its bound)
    host = _f32(F.linear_4bit(x, q, qs, bias, bf16_dot=False))
    old = H.set_enabled(False)
    try:
        custom = _f32(F.linear_4bit(x, q, qs, bias, bf16_dot=False))
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


def test_simd_levels_agree():
    """BNB_MS_SIMD=scalar and every SIMD level this CPU has give the same bits for 1 row (gemv) and 2..9 rows
    (GEMM: the register blocks, the AVX-512 K slices and A-row blocks, and their tails), plain and double-quant, odd shapes."""
    from simd_levels import assert_levels_agree

    code = (
        "import mindspore as ms, numpy as np, hashlib, sys; ms.set_device('CPU');"
        "import bitsandbytes_ms.functional as F, bitsandbytes_ms.cextension as c;"
        "h=hashlib.sha256(); r=np.random.RandomState(5)"
        "\nfor N,K,bs,dq in ((24,256,64,False),(9,100,64,True),(5,77,32,False),(3,1000,256,True)):"
        "\n  q,s=F.quantize_4bit(ms.Tensor(r.randn(N,K).astype(np.float32)), blocksize=bs, quant_type='nf4', compress_statistics=dq)"
        "\n  b=ms.Tensor(r.randn(N).astype(np.float32))"
        "\n  for M in (1,2,3,4,5,8,9,14):"
        "\n    A=ms.Tensor(r.randn(M,K).astype(np.float32))"
        "\n    for dt in (ms.float32, ms.float16, ms.bfloat16):"
        "\n      h.update(F.linear_4bit(A.astype(dt), q, s, b).astype(ms.float32).asnumpy().tobytes())"
        "\nsys.stdout.write(c.simd_level()+' '+h.hexdigest())"
    )

    assert_levels_agree(code)


def test_concurrent_threads_get_their_own_results():
    """Host calls release the GIL: two threads running the same layer at once must not see each other's
    activations (one bound call per thread)."""
    import threading

    rng = np.random.default_rng(11)
    W = Tensor(rng.standard_normal((256, 512)).astype(np.float32))
    q, qs = F.quantize_4bit(W, quant_type="nf4")
    xs = [Tensor(rng.standard_normal((1, 512)).astype(np.float32)) for _ in range(4)]
    want = [F.linear_4bit(x, q, qs).asnumpy() for x in xs]
    errors = []

    def work(i):
        for _ in range(30):
            if not np.array_equal(F.linear_4bit(xs[i], q, qs).asnumpy(), want[i]):
                errors.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_in_place_update_is_never_served_stale():
    """An in-place update moves a MindSpore tensor's buffer: the next call must read the new values."""
    rng = np.random.default_rng(13)
    W = Tensor(rng.standard_normal((16, 64)).astype(np.float32))
    q, qs = F.quantize_4bit(W, quant_type="nf4", compress_statistics=False)
    x = Tensor(rng.standard_normal((1, 64)).astype(np.float32))
    y1 = F.linear_4bit(x, q, qs).asnumpy()
    qs.absmax.copy_(qs.absmax * 2)
    np.testing.assert_allclose(F.linear_4bit(x, q, qs).asnumpy(), 2 * y1, rtol=1e-6)
    q2, _ = F.quantize_4bit(-W, quant_type="nf4", compress_statistics=False)
    want = F.linear_4bit(x, q2, qs).asnumpy()
    assert not np.array_equal(want, 2 * y1)
    q.copy_(q2)
    assert np.array_equal(F.linear_4bit(x, q, qs).asnumpy(), want)
