"""torch_ops.int8_mm_dequant(..., dtype=): one rounding from the fp32 dequantization into `dtype` (issue 14: it
rounded to float16 first, so fp32/bf16 results rounded twice and overflowed to inf above 65504)."""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

from bitsandbytes_ms.torch_ops import bitsandbytes as ops  # noqa: E402


def _ref_f32(A, rs, cs):
    # float(A) * (row * col) * 6.200124e-05, each step rounded in fp32 (functional.int8_mm_dequant's formula)
    scale = (rs[:, None].astype(np.float32) * cs[None, :].astype(np.float32)).astype(np.float32)
    return ((A.astype(np.float32) * scale).astype(np.float32) * np.float32(6.200124e-05)).astype(np.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_mm_dequant_dtype_rounds_once_and_keeps_large_values(dtype):
    r = np.random.RandomState(0)
    A = r.randint(-2**20, 2**20, size=(8, 16)).astype(np.int32)
    rs = (r.rand(8) * 120 + 8).astype(np.float32)
    cs = (r.rand(16) * 120 + 8).astype(np.float32)
    ref = _ref_f32(A, rs, cs)
    assert np.abs(ref).max() > 65504 * 4  # values float16 cannot hold
    out = ops.int8_mm_dequant(torch.tensor(A), torch.tensor(rs), torch.tensor(cs), dtype=dtype)
    assert out.dtype == dtype and tuple(out.shape) == (8, 16)
    got = out.float().asnumpy()
    assert np.isfinite(got).all()
    if dtype == torch.float32:
        np.testing.assert_array_equal(got, ref)
    else:  # round to nearest even of the fp32 value, once
        import ml_dtypes

        np.testing.assert_array_equal(got, ref.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_int8_mm_dequant_default_is_float16():
    A = np.arange(-8, 8, dtype=np.int32).reshape(2, 8) * 1000
    rs, cs = np.full(2, 100, np.float32), np.full(8, 50, np.float32)
    out = ops.int8_mm_dequant(torch.tensor(A), torch.tensor(rs), torch.tensor(cs))
    assert out.dtype == torch.float16
    np.testing.assert_array_equal(out.asnumpy(), _ref_f32(A, rs, cs).astype(np.float16))
