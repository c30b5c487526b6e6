"""Weight-only int8/int4 linear (W8A16/W4A16): native kernels vs the numpy reference, SIMD agreement, nn layer."""

import os
import subprocess
import sys

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import functional as F

NP = {ms.float32: np.float32, ms.float16: np.float16}


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("K", [1, 37, 64, 129])
@pytest.mark.parametrize("dt", [ms.float32, ms.float16, ms.bfloat16])
def test_quantize_matches_reference(bits, K, dt):
    W = np.random.default_rng(K).standard_normal((19, K)).astype(np.float32)
    W[3] = 0.0  # all-zero row -> scale 0, q 0
    Wt = Tensor(W).astype(dt)
    q, s = F.quantize_weight_only(Wt, bits)
    rq, rs = R.quantize_weight_only(Wt.astype(ms.float32).asnumpy(), bits)
    np.testing.assert_array_equal(q.asnumpy(), rq)
    np.testing.assert_array_equal(s.asnumpy(), rs)
    d = F.dequantize_weight_only(q, s, K, bits, dtype=ms.float32).asnumpy()
    np.testing.assert_array_equal(d, R.dequantize_weight_only(rq, rs, K, bits))
    qmax = 127 if bits == 8 else 7
    assert np.all(np.abs(d - W) <= rs[:, None] / 2 + 1e-2 * (dt != ms.float32) * np.abs(W) + 1e-7)
    assert s.asnumpy()[3] == 0 and np.all(d[3] == 0) and qmax


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("rows", [1, 3, 40])
@pytest.mark.parametrize("K", [16, 37, 256])
@pytest.mark.parametrize("dt", [ms.float32, ms.float16])
def test_gemm_matches_reference(bits, rows, K, dt):
    rng = np.random.default_rng(rows * 1000 + K)
    W = rng.standard_normal((33, K)).astype(np.float32)
    A = rng.standard_normal((rows, K)).astype(NP[dt])
    bias = rng.standard_normal(33).astype(np.float32)
    q, s = F.quantize_weight_only(Tensor(W), bits)
    out = F.gemm_weight_only(Tensor(A), q, s, bits, bias=Tensor(bias)).asnumpy().astype(np.float32)
    ref = R.gemm_weight_only(A.astype(np.float32), q.asnumpy(), s.asnumpy(), bits).astype(np.float32) + bias
    tol = 1e-4 if dt == ms.float32 else 2e-2
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * np.abs(ref).max())
    assert out.shape == (rows, 33)


def test_3d_input_and_out():
    W = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    q, s = F.quantize_weight_only(Tensor(W), 4)
    A = Tensor(np.random.default_rng(2).standard_normal((2, 3, 32)).astype(np.float32))
    out = F.empty((2, 3, 8))
    r = F.gemm_weight_only(A, q, s, 4, out=out)
    assert r.shape == (2, 3, 8)
    np.testing.assert_allclose(out.asnumpy(), R.gemm_weight_only(A.asnumpy(), q.asnumpy(), s.asnumpy(), 4), rtol=1e-5,
                               atol=1e-5)


def test_bad_inputs():
    W = Tensor(np.ones((4, 6), np.float32))
    with pytest.raises(ValueError, match="bits"):
        F.quantize_weight_only(W, 3)
    with pytest.raises(ValueError, match="`W` must have dtype"):
        F.quantize_weight_only(Tensor(np.ones((4, 6), np.int32)), 8)
    q, s = F.quantize_weight_only(W, 8)
    with pytest.raises(ValueError, match="`q` must have shape"):
        F.gemm_weight_only(Tensor(np.ones((1, 5), np.float32)), q, s, 8)
    with pytest.raises(ValueError, match="`q` must have dtype"):
        F.gemm_weight_only(Tensor(np.ones((1, 6), np.float32)), q, s, 4)


def test_simd_levels_agree():
    code = (
        "import numpy as np; from mindspore import Tensor; from bitsandbytes_ms import functional as F\n"
        "r=np.random.default_rng(0); W=r.standard_normal((70,131)).astype(np.float32); A=r.standard_normal((2,131)).astype(np.float32)\n"
        "for b in (8,4):\n q,s=F.quantize_weight_only(Tensor(W),b); print(F.gemm_weight_only(Tensor(A),q,s,b).asnumpy().tobytes().hex())\n"
    )
    outs = []
    for lvl in ("scalar", ""):
        env = dict(os.environ, BNB_MS_SIMD=lvl) if lvl else {k: v for k, v in os.environ.items() if k != "BNB_MS_SIMD"}
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    assert outs[0] == outs[1] and outs[0]


def test_linear_weight_only_layer_roundtrip():
    import mindnlp  # noqa: F401
    import torch
    import bitsandbytes_ms.nn as bnn

    for bits in (8, 4):
        lin = torch.nn.Linear(24, 10)
        layer = bnn.LinearWeightOnly(24, 10, bits=bits)
        layer.load_state_dict(lin.state_dict())
        layer = layer.to("cpu")
        x = torch.tensor(np.random.default_rng(3).standard_normal((5, 24)).astype(np.float32))
        y = layer(x)
        ref = lin(x)
        assert np.abs(y.asnumpy() - ref.asnumpy()).max() < (0.05 if bits == 8 else 0.5)
        sd = layer.state_dict()
        assert set(sd) == {"weight", "bias", "weight_scale"}
        layer2 = bnn.LinearWeightOnly(24, 10, bits=bits)
        layer2.load_state_dict(sd, strict=True)
        np.testing.assert_array_equal(layer2(x).asnumpy(), y.asnumpy())


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dt", [ms.float32, ms.float16, ms.bfloat16])
def test_non_finite_rows_propagate_nan_as_torch(bits, dt):
    """Issue 15 item 6: NaN and +inf were coded as -qmax (NaN left out of the row's max). As torch computes
    the scheme (``w.abs().max(-1) / qmax``, ``round(w / scale).to(int8)``): a NaN row gets scale NaN and codes
    0, an inf row scale inf and codes 0, so each dequantizes to NaN and only its own GEMM outputs are NaN;
    kernel == reference, other rows untouched."""
    W = np.random.default_rng(1).standard_normal((5, 37)).astype(np.float32)
    W[1, 4] = np.nan
    W[2, 0] = np.inf
    W[3, 9] = -np.inf
    Wt = Tensor(W).astype(dt)
    q, s = F.quantize_weight_only(Wt, bits)
    rq, rs = R.quantize_weight_only(Wt.astype(ms.float32).asnumpy(), bits)
    np.testing.assert_array_equal(q.asnumpy(), rq)
    np.testing.assert_array_equal(s.asnumpy().view(np.uint32), rs.view(np.uint32))
    assert s.asnumpy().view(np.uint32)[1] == 0x7FC00000 and np.isposinf(s.asnumpy()[2:4]).all()
    codes = R.unpack_weight_only_int4(rq, 37) if bits == 4 else rq
    assert np.all(codes[1:4] == 0)
    clean, _ = F.quantize_weight_only(Tensor(W[[0, 4]]).astype(dt), bits)
    np.testing.assert_array_equal(q.asnumpy()[[0, 4]], clean.asnumpy())
    d = F.dequantize_weight_only(q, s, 37, bits, dtype=ms.float32).asnumpy()
    assert np.isnan(d[1:4]).all() and np.isfinite(d[[0, 4]]).all()
    out = F.gemm_weight_only(Tensor(np.ones((2, 37), np.float32)).astype(dt), q, s, bits).astype(ms.float32).asnumpy()
    assert np.isnan(out[:, 1:4]).all() and np.isfinite(out[:, [0, 4]]).all()
