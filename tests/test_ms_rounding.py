"""The rounding rules of MindSpore 2.7's CPU kernels that the fused decoder reproduces (csrc/cpu/simd_math.h,
decoder.cpp; issue 31: a fused model's perplexity is the unfused one's). Each mindtorch op the unfused
transformers model calls is checked bit for bit against its numpy twin in ``_reference`` (which the kernels'
tests pin in turn): if a MindSpore upgrade changes a kernel, the rule it breaks is named here. Then the native
RMSNorm against its twin on values whose squares are near a rounding tie."""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

from bitsandbytes_ms import _hostcall as HC  # noqa: E402
from bitsandbytes_ms import _reference as R  # noqa: E402

RNG = np.random.default_rng(31)


def _bits_equal(a, b):
    np.testing.assert_array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32))


def test_exp_sigmoid_silu():
    x = (RNG.standard_normal(50000) * 20).astype(np.float32)
    # no subnormal results (exp of about -87.34 < x < -86.6, sigmoid of x < -87.3): MindSpore's result there
    # depends on the thread's flush-to-zero mode, which some of its kernels switch on and leave on
    # (integrations/mindtorch_patches.py); the clamps at both ends are checked with x = -1000, 1000
    x = x[(x > -86.6) | (x < -87.4)]
    x[:3] = [-1000.0, 1000.0, 0.0]
    t = torch.tensor(x)
    _bits_equal(torch.exp(t).numpy(), R.exp_ms(x))
    y = x[x > -87.0]
    sg = (np.float32(1) / (np.float32(1) + R.exp_ms(-y))).astype(np.float32)
    _bits_equal(torch.sigmoid(torch.tensor(y)).numpy(), sg)
    _bits_equal(torch.nn.functional.silu(torch.tensor(y)).numpy(), (y * sg).astype(np.float32))
    assert not np.array_equal(R.exp_ms(x[3:]), np.exp(x[3:]))  # not the correctly rounded exp (the rule matters)


@pytest.mark.parametrize("L", [1, 3, 4, 7, 8, 12, 13, 20, 64, 257])
def test_softmax(L):
    s = (RNG.standard_normal((2, 3, 5, L)) * 4).astype(np.float32)
    s[..., L // 2:] += np.float32(-3.4028235e38) if L > 4 else 0  # masked columns, as HF's causal mask adds
    e = R.exp_ms(s - s.max(-1, keepdims=True))
    _bits_equal(torch.softmax(torch.tensor(s), dim=-1).numpy(), e * (np.float32(1) / R.softmax_sum(e))[..., None])


def test_pow2_mean_rsqrt_of_rmsnorm():
    H = 576
    x = (RNG.standard_normal((2, 40, H)) * RNG.uniform(0.01, 60, (2, 40, 1))).astype(np.float32)
    t = torch.tensor(x)
    sq = t.pow(2)
    _bits_equal(sq.numpy(), R.square_powf(x))
    assert not np.array_equal(sq.numpy(), x * x)  # glibc's powf rounds some near-ties the other way
    ss = np.zeros(x.shape[:-1], np.float64)
    for i in range(H):
        ss = ss + sq.numpy()[..., i].astype(np.float64)
    var = sq.mean(-1, keepdim=True)
    _bits_equal(var.numpy()[..., 0], ss.astype(np.float32) / np.float32(H))
    v = var.numpy() + np.float32(1e-5)
    _bits_equal(torch.rsqrt(var + 1e-5).numpy(), np.float32(1) / np.sqrt(v))
    w = RNG.uniform(0.5, 2, H).astype(np.float32)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(H, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor(w))
    _bits_equal(norm(t).numpy(), R.rms_norm(x, w, 1e-5))


def test_cos_sin():
    f = RNG.uniform(-3000, 3000, 20000).astype(np.float32)
    _bits_equal(torch.tensor(f).cos().numpy(), np.cos(f.astype(np.float64)).astype(np.float32))
    _bits_equal(torch.tensor(f).sin().numpy(), np.sin(f.astype(np.float64)).astype(np.float32))


@pytest.mark.parametrize("K", [64, 300, 384, 385, 512, 800, 1300])
def test_batch_matmul_chunks(K):
    a = RNG.standard_normal((2, 3, K)).astype(np.float32)
    b = RNG.standard_normal((2, K, 5)).astype(np.float32)
    _bits_equal(torch.matmul(torch.tensor(a), torch.tensor(b)).numpy(), R._chain(a, b, K))


# ---- an fp16 model's ops (the fused decoder's *_r16 entries) ----
def test_fp16_sigmoid_silu_every_value():
    """fp16 Sigmoid / SiLU over every finite fp16 value: exp16 (expf rounded), 1 + that, its inverse, each rounded
    to fp16; SiLU = r16(x * sigmoid16(x))."""
    x = np.arange(0, 1 << 16, dtype=np.uint16).view(np.float16)
    x = x[np.isfinite(x)]
    sg = R.sigmoid16(x)
    np.testing.assert_array_equal(torch.sigmoid(torch.tensor(x)).numpy().view(np.uint16), sg.astype(np.float16).view(np.uint16))
    silu = R.r16(x.astype(np.float32) * sg)
    np.testing.assert_array_equal(torch.nn.functional.silu(torch.tensor(x)).numpy().view(np.uint16),
                                  silu.astype(np.float16).view(np.uint16))
    # the nnacl exp of fp32 Sigmoid gives other fp16 bits for some values (the rule matters)
    other = R.r16(np.float32(1) / R.r16(np.float32(1) + R.r16(R.exp_ms(-x.astype(np.float32)))))
    assert not np.array_equal(other, sg)


@pytest.mark.parametrize("L", [1, 5, 16, 57, 256, 700])
def test_fp16_softmax(L):
    """fp16 Softmax (as sdpa calls it on an fp16 model, with the causal mask's fp16 minimum added)."""
    s = (RNG.standard_normal((3, 7, L)) * 3).astype(np.float16)
    if L > 4:
        s[..., L // 2:] = (s[..., L // 2:].astype(np.float32) + np.float32(-65504.0)).astype(np.float16)
    p = torch.softmax(torch.tensor(s), dim=-1).numpy()
    np.testing.assert_array_equal(p.view(np.uint16), R.softmax16(s).astype(np.float16).view(np.uint16))
    fp32_rounded = R.r16(torch.softmax(torch.tensor(s.astype(np.float32)), dim=-1).numpy())
    assert L == 1 or not np.array_equal(fp32_rounded, R.softmax16(s))  # not the fp32 softmax rounded


@pytest.mark.parametrize("K", [64, 385, 800])
def test_fp16_mul_add_batch_matmul(K):
    """fp16 Mul / Add: the fp32 result rounded; fp16 BatchMatMul: the fp32 chunked chain (R._chain) rounded once."""
    a = (RNG.standard_normal((2, 3, K)) * 4).astype(np.float16)
    b = (RNG.standard_normal((2, K, 5)) * 4).astype(np.float16)
    f = np.float32
    mm = torch.matmul(torch.tensor(a), torch.tensor(b)).numpy()
    np.testing.assert_array_equal(mm.astype(f), R.r16(R._chain(a.astype(f), b.astype(f), K)))
    c = a[..., :5].copy()
    d = (RNG.standard_normal(c.shape) * 4).astype(np.float16)
    np.testing.assert_array_equal((torch.tensor(c) * torch.tensor(d)).numpy().astype(f), R.r16(c.astype(f) * d.astype(f)))
    np.testing.assert_array_equal((torch.tensor(c) + torch.tensor(d)).numpy().astype(f), R.r16(c.astype(f) + d.astype(f)))


def test_native_rms_norm_is_its_twin_near_ties():
    """crms_norm_fp32 (the decoder's RMSNorm) gives its twin's bits, with inputs whose squares are near a tie
    (glibc's powf decides those) and rows of very different scales."""
    H = 96
    x = (RNG.standard_normal((64, H)) * RNG.uniform(1e-3, 1e3, (64, 1))).astype(np.float32)
    near = np.array([0.062335305, 5.637482, -0.56694007, 1.2643317, 9.427734, -15.755259], np.float32)
    x[:, :6] = near  # powf(x, 2) != x * x for each of these
    w = RNG.uniform(0.5, 2, H).astype(np.float32)
    out = np.empty_like(x)
    HC.entry("crms_norm_fp32")(x, w, 1e-5, out)
    _bits_equal(out, R.rms_norm(x, w, 1e-5))
    assert not np.array_equal(R.square_powf(near), near * near)
