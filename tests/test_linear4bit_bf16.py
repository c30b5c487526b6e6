"""The 4-bit bf16-compute kernel (functional.linear_4bit(..., bf16_dot=True) -> clinear_4bit_bf16dot_bf16): the
portable kernel (the one this machine runs without AVX512-BF16) is bit-exact with the numpy model of the
documented vdpbf16ps arithmetic (_reference.linear_4bit_bf16dot), through both transports; it stays within the
documented bound of the exact fp32-accumulation path; bf16 denormals are flushed as the instruction flushes them;
the default and the explicit switches pick the kernels documented in functional.py; the exact path's bytes do
not change; the result does not depend on BNB_MS_SIMD. (tools/cpu_isa_check.py --only bf16 compares the
vdpbf16ps kernel with the portable one on a CPU that has the instruction.)"""

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

import bitsandbytes_ms as bnb
import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _hostcall as H
from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import cextension


def _bf16(a):
    return Tensor(np.asarray(a, np.float32)).astype(ms.bfloat16)


def _f32(t):
    return t.astype(ms.float32).asnumpy()


def _state_arrays(qs):
    """(fp32 absmax the kernel decodes, code) of a QuantState."""
    code = qs.code.asnumpy()
    if qs.nested:
        s2 = qs.state2
        am = R.dequantize_blockwise(qs.absmax.asnumpy(), s2.absmax.asnumpy(), s2.code.asnumpy(), s2.blocksize)
        off = qs.offset.asnumpy() if isinstance(qs.offset, Tensor) else np.float32(qs.offset)
        am = (am.astype(np.float32) + np.float32(off)).astype(np.float32)
    else:
        am = qs.absmax.asnumpy()
    return am.reshape(-1), code


def _model(x, q, qs, bias):
    am, code = _state_arrays(qs)
    N = qs.shape[0]
    return R.linear_4bit_bf16dot(_f32(x), q.asnumpy().reshape(-1), am, code, qs.blocksize, N,
                                 bias=None if bias is None else _f32(bias))


@pytest.fixture(autouse=True)
def _default_mode():
    F.set_bf16_dot(None)
    yield
    F.set_bf16_dot(None)


SHAPES = [(1, 40, 192, 64), (3, 33, 100, 64), (8, 16, 512, 128), (2, 7, 77, 32), (17, 24, 256, 64),
          (32, 9, 320, 64), (4, 11, 31, 64),
          # K over the native kernel's 512-column slices (chains carried across slices), odd K: odd row starts
          (5, 19, 1111, 64), (16, 16, 1536, 256), (9, 8, 1024, 32),
          (6, 301, 2048, 64),  # over the threading threshold: row chunks split across the pool
          # one row, K a multiple of 64 and of the blocksize: the one-row kernel (threaded in the last)
          (1, 40, 256, 64), (1, 33, 512, 128), (1, 9, 1024, 256), (1, 301, 2048, 64),
          (1, 24, 576, 64), (1, 1024, 576, 64)]  # an odd number of 64s: the last unit is a half


@pytest.mark.parametrize("nested", [False, True], ids=["plain", "dq"])
@pytest.mark.parametrize("M,N,K,bs", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("qt", ["nf4", "fp4"])
def test_portable_kernel_bit_exact_with_numpy_model(nested, M, N, K, bs, with_bias, qt, monkeypatch):
    monkeypatch.setenv("BNB_MS_4BIT_AMX", "0")  # the vdpbf16ps kernel from 16 rows too (AMX: its own test below)
    rng = np.random.default_rng(N * K + M + nested)
    W = Tensor(rng.standard_normal((N, K)).astype(np.float32))
    q, qs = F.quantize_4bit(W, blocksize=bs, quant_type=qt, compress_statistics=nested)
    x = _bf16(rng.standard_normal((M, K)) * 2)
    bias = _bf16(rng.standard_normal(N)) if with_bias else None
    want = _model(x, q, qs, bias)
    host = _f32(F.linear_4bit(x, q, qs, bias, bf16_dot=True))
    old = H.set_enabled(False)
    try:
        custom = _f32(F.linear_4bit(x, q, qs, bias, bf16_dot=True))
    finally:
        H.set_enabled(old)
    assert np.array_equal(host, want)
    assert np.array_equal(custom, want)
    # the exact path differs from the dot product somewhere (or the dot kernel did not run) on the larger shapes
    if N * K >= 4096:
        assert not np.array_equal(_f32(F.linear_4bit(x, q, qs, bias, bf16_dot=False)), want)


def _bound(x32, W32, bias32):
    """The documented bound: 2^-6 (S + |bias|) + K 2^-22 S, S = sum_k |x_k w_k| (w the fp32 dequantized weight)."""
    K = W32.shape[1]
    S = np.abs(x32.astype(np.float64)) @ np.abs(W32.astype(np.float64)).T
    b = 0 if bias32 is None else np.abs(bias32.astype(np.float64))
    return 2.0 ** -6 * (S + b) + K * 2.0 ** -22 * S


@pytest.mark.parametrize("M,N,K,bs,nested", [(1, 256, 1024, 64, False), (16, 128, 2048, 64, True),
                                             (5, 100, 4096, 128, False), (32, 64, 333, 64, True)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_within_documented_bound_of_exact_path(M, N, K, bs, nested, with_bias):
    rng = np.random.default_rng(M * 7 + K)
    W = Tensor((rng.standard_normal((N, K)) * rng.uniform(0.1, 3, (N, 1))).astype(np.float32))
    q, qs = F.quantize_4bit(W, blocksize=bs, quant_type="nf4", compress_statistics=nested)
    x = _bf16(rng.standard_normal((M, K)))
    bias = _bf16(rng.standard_normal(N) * 4) if with_bias else None
    dot = _f32(F.linear_4bit(x, q, qs, bias, bf16_dot=True))
    exact = _f32(F.linear_4bit(x, q, qs, bias, bf16_dot=False))
    am, _ = _state_arrays(qs)
    W32 = F.dequantize_4bit(q, qs).astype(ms.float32).asnumpy().reshape(N, K)
    bound = _bound(_f32(x), W32, None if bias is None else _f32(bias))
    err = np.abs(dot.astype(np.float64) - exact)
    assert np.all(err <= bound), float(np.max(err / bound))
    assert np.max(err) > 0  # two different kernels


AMX_SHAPES = [(16, 64, 1024, 64, False), (17, 50, 1111, 64, True), (33, 40, 576, 64, False),
              (100, 300, 2048, 64, True), (48, 33, 96, 32, False)]


@pytest.mark.parametrize("M,N,K,bs,nested", AMX_SHAPES, ids=[f"{m}x{n}x{k}" for m, n, k, _, _ in AMX_SHAPES])
def test_amx_prefill_within_documented_bound(M, N, K, bs, nested, monkeypatch):
    """From 16 rows, on a CPU with AMX-BF16, the products run on the tile unit: the same bf16 inputs, summed in
    the unit's own order, so within the documented bound of the exact path (whole and partial m-tiles and
    32-row weight groups, K over the 512-column slices and not a multiple of 32, double quant, threaded rows);
    BNB_MS_4BIT_AMX=0 gives the vdpbf16ps kernel's bits (the numpy model's)."""
    if cextension.linear4_bf16_path(M) != "amx":
        pytest.skip(f"no AMX-BF16 here (path {cextension.linear4_bf16_path(M)})")
    rng = np.random.default_rng(M + N + K)
    W = Tensor((rng.standard_normal((N, K)) * rng.uniform(0.1, 3, (N, 1))).astype(np.float32))
    q, qs = F.quantize_4bit(W, blocksize=bs, quant_type="nf4", compress_statistics=nested)
    x = _bf16(rng.standard_normal((M, K)) * 2)
    bias = _bf16(rng.standard_normal(N) * 4)
    amx = _f32(F.linear_4bit(x, q, qs, bias, bf16_dot=True))
    exact = _f32(F.linear_4bit(x, q, qs, bias, bf16_dot=False))
    W32 = F.dequantize_4bit(q, qs).astype(ms.float32).asnumpy().reshape(N, K)
    err = np.abs(amx.astype(np.float64) - exact)
    bound = _bound(_f32(x), W32, _f32(bias))
    assert np.all(err <= bound), float(np.max(err / bound))
    # against the vdpbf16ps kernel's model: the same exact products, another fp32 order (K 2^-23 S apart at
    # most, S = sum |x w|), then the output's bf16 rounding and bias add (2^-8 of it each): a tile or k-step
    # missed or misplaced is far outside
    model = _model(x, q, qs, bias).astype(np.float64)
    S = np.abs(_f32(x)).astype(np.float64) @ np.abs(W32).T.astype(np.float64)
    tight = 2.0 ** -7 * (np.abs(model) + np.abs(_f32(bias))) + K * 2.0 ** -22 * S
    assert np.all(np.abs(amx - model) <= tight), float(np.max(np.abs(amx - model) / tight))
    assert np.mean(amx == model) > 0.9
    monkeypatch.setenv("BNB_MS_4BIT_AMX", "0")
    assert cextension.linear4_bf16_path(M) == "avx512bf16"
    assert np.array_equal(_f32(F.linear_4bit(x, q, qs, bias, bf16_dot=True)), _model(x, q, qs, bias))


def test_linear_4bit_compute_fp32_input():
    """fp32 input with compute_dtype bf16: A rounded to bf16, the dot kernel, the result widened back."""
    rng = np.random.default_rng(3)
    N, K = 48, 256
    q, qs = F.quantize_4bit(Tensor(rng.standard_normal((N, K)).astype(np.float32)), quant_type="nf4")
    A = Tensor(rng.standard_normal((4, K)).astype(np.float32))
    bias = Tensor(rng.standard_normal(N).astype(np.float32))
    got = F.linear_4bit_compute(A, q, qs, bias, ms.bfloat16, bf16_dot=True)
    assert got.dtype == ms.float32
    want = _model(A.astype(ms.bfloat16), q, qs, bias.astype(ms.bfloat16))
    assert np.array_equal(got.asnumpy(), want)
    exact = F.linear_4bit_compute(A, q, qs, bias, ms.bfloat16, bf16_dot=False).asnumpy()
    assert np.array_equal(exact, _f32(F.linear_4bit(A.astype(ms.bfloat16), q, qs, bias.astype(ms.bfloat16),
                                                    bf16_dot=False)))


def test_denormals_flushed_like_vdpbf16ps():
    rng = np.random.default_rng(11)
    N, K = 8, 128
    q, qs = F.quantize_4bit(Tensor(rng.standard_normal((N, K)).astype(np.float32)), quant_type="nf4")
    x = rng.standard_normal((2, K)).astype(np.float32)
    # bf16 denormal activations count as zero
    xd = x.copy()
    xd[:, ::3] = np.float32(2.0 ** -130) * np.sign(x[:, ::3])
    xz = x.copy()
    xz[:, ::3] = 0
    a = _f32(F.linear_4bit(_bf16(xd), q, qs, bf16_dot=True))
    assert np.array_equal(a, _f32(F.linear_4bit(_bf16(xz), q, qs, bf16_dot=True)))
    # ... also against large weights, where the exact path sees them
    qb, qsb = F.quantize_4bit(Tensor(np.full((N, K), 2.0 ** 60, np.float32)), quant_type="nf4")
    den = _bf16(np.full((1, K), 2.0 ** -130, np.float32))
    assert np.all(_f32(F.linear_4bit(den, qb, qsb, bf16_dot=True)) == 0)
    assert np.all(_f32(F.linear_4bit(den, qb, qsb, bf16_dot=False)) > 0)
    # the table kernel (9 rows here: more than the one-row kernel takes): products whose sums stay below FLT_MIN are
    # flushed (ftz on every accumulation step): the result is exactly 0 where the exact path keeps a (bf16 denormal)
    # value
    tiny = _bf16(np.full((9, K), 2.0 ** -70, np.float32))
    qt, qst = F.quantize_4bit(Tensor(np.full((N, K), 2.0 ** -60, np.float32)), quant_type="nf4")
    dot = _f32(F.linear_4bit(tiny, qt, qst, bf16_dot=True))
    exact = _f32(F.linear_4bit(tiny, qt, qst, bf16_dot=False))
    assert np.all(dot == 0)
    assert np.all(exact > 0)
    assert np.array_equal(dot, _model(tiny, qt, qst, None))
    # the one-row kernel (1-8 rows) sums x * bf16(code) and scales by absmax after: no flush there (2^-70
    # products), and the result is the exact path's within the bound
    for rows in (1, 2):
        one = _f32(F.linear_4bit(tiny[:rows], qt, qst, bf16_dot=True))
        assert np.all(one > 0)
        assert np.array_equal(one, _model(tiny[:rows], qt, qst, None))
        np.testing.assert_allclose(one, exact[:rows], rtol=2 ** -6)


def test_default_and_switches(monkeypatch):
    import mindnlp  # noqa: F401
    import torch

    rng = np.random.default_rng(5)
    N, K = 32, 256
    lin = bnb.nn.Linear4bit(K, N, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    lin.weight = bnb.nn.Params4bit(torch.tensor(rng.standard_normal((N, K)).astype(np.float32)), requires_grad=False,
                                   quant_type="nf4")
    lin = lin.to("cpu").eval()
    q, qs = lin.weight, lin.weight.quant_state
    x1, x4 = _bf16(rng.standard_normal((1, K))), _bf16(rng.standard_normal((4, K)))
    has = "avx512_bf16" in cextension.cpu_features()
    for x in (x1, x4):
        rows = x.shape[0]
        dot = _f32(F.linear_4bit(x, q, qs, bf16_dot=True))
        exact = _f32(F.linear_4bit(x, q, qs, bf16_dot=False))
        assert not np.array_equal(dot, exact)
        # auto: the dot kernels from 2 rows, and at one row where the one-row kernel applies (K = 256, bs 64)
        auto_dot = has and (rows >= F.BF16_DOT_AUTO_MIN_ROWS or F.bf16_gemv_applies(K, qs.blocksize))
        assert F.bf16_dot_enabled(rows, K, qs.blocksize) == auto_dot
        assert np.array_equal(_f32(F.linear_4bit(x, q, qs)), dot if auto_dot else exact)
        # Linear4bit (lean call included, second forward) follows the same default
        for _ in range(2):
            assert np.array_equal(_f32(lin(torch.tensor(x.astype(ms.float32).asnumpy()).to(torch.bfloat16))), dot if auto_dot else exact)
        F.set_bf16_dot("on")
        assert np.array_equal(_f32(F.linear_4bit(x, q, qs)), dot)
        assert np.array_equal(_f32(lin(torch.tensor(x.astype(ms.float32).asnumpy()).to(torch.bfloat16))), dot)
        F.set_bf16_dot("exact")
        assert np.array_equal(_f32(F.linear_4bit(x, q, qs)), exact)
        assert np.array_equal(_f32(lin(torch.tensor(x.astype(ms.float32).asnumpy()).to(torch.bfloat16))), exact)
        monkeypatch.setenv("BNB_MS_4BIT_BF16_DOT", "1")
        F.set_bf16_dot(None)
        assert np.array_equal(_f32(F.linear_4bit(x, q, qs)), dot)
        monkeypatch.setenv("BNB_MS_4BIT_BF16_DOT", "0")
        F.set_bf16_dot(None)
        assert np.array_equal(_f32(F.linear_4bit(x, q, qs)), exact)
        monkeypatch.delenv("BNB_MS_4BIT_BF16_DOT")
        F.set_bf16_dot(None)
    # fp32 / fp16 activations are never affected
    x32 = Tensor(rng.standard_normal((3, K)).astype(np.float32))
    F.set_bf16_dot("on")
    a = F.linear_4bit(x32, q, qs).asnumpy()
    F.set_bf16_dot("off")
    assert np.array_equal(a, F.linear_4bit(x32, q, qs).asnumpy())


def test_bad_switch_values(monkeypatch):
    q, qs = F.quantize_4bit(Tensor(np.ones((4, 64), np.float32)), quant_type="nf4")
    with pytest.raises(TypeError, match="bf16_dot"):
        F.linear_4bit(_bf16(np.ones((1, 64))), q, qs, bf16_dot="yes")
    with pytest.raises(ValueError, match="mode"):
        F.set_bf16_dot("maybe")
    monkeypatch.setenv("BNB_MS_4BIT_BF16_DOT", "fast")
    F.set_bf16_dot(None)
    with pytest.raises(ValueError, match="BNB_MS_4BIT_BF16_DOT"):
        F.linear_4bit(_bf16(np.ones((2, 64))), q, qs)


def test_simd_levels_agree():
    """The dot kernel's bits (forced on) and the default path's do not depend on BNB_MS_SIMD."""
    from simd_levels import assert_levels_agree

    code = (
        "import mindspore as ms, numpy as np, hashlib, sys; ms.set_device('CPU');"
        "import bitsandbytes_ms.functional as F, bitsandbytes_ms.cextension as c;"
        "h=hashlib.sha256(); r=np.random.RandomState(9)"
        "\nfor N,K,bs,dq in ((24,256,64,False),(9,100,64,True),(5,77,32,False)):"
        "\n  q,s=F.quantize_4bit(ms.Tensor(r.randn(N,K).astype(np.float32)), blocksize=bs, quant_type='nf4', compress_statistics=dq)"
        "\n  b=ms.Tensor(r.randn(N).astype(np.float32)).astype(ms.bfloat16)"
        "\n  for M in (1,3,9):"
        "\n    A=ms.Tensor(r.randn(M,K).astype(np.float32)).astype(ms.bfloat16)"
        "\n    for d in (True, None):"
        "\n      h.update(F.linear_4bit(A, q, s, b, bf16_dot=d).astype(ms.float32).asnumpy().tobytes())"
        "\nsys.stdout.write(c.simd_level()+' '+h.hexdigest())"
    )
    assert_levels_agree(code)
