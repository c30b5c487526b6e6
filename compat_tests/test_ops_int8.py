"""Port of the LLM.int8() class of upstream bitsandbytes tests/test_ops.py (TestLLMInt8Ops; MIT license,
bitsandbytes-foundation). Forced changes are marked `# PORT:`. `torch` is mindtorch.

PORT: `torch.ops.bitsandbytes.<op>` -> `bitsandbytes_ms.torch_ops.bitsandbytes.<op>` (MindSpore has no torch
op registry); every `opcheck(...)` call is dropped (torch.library's op checker does not exist here), only
the shape/dtype/device asserts are kept."""

import numpy as np  # PORT: seeded int8/int32 random tensors
import pytest
import torch

from bitsandbytes_ms.torch_ops import bitsandbytes as _ops  # PORT: was torch.ops.bitsandbytes
from helpers import TRUE_FALSE, get_available_devices, id_formatter  # PORT: was `from tests.helpers import`


def _randint(low, high, size, dtype):
    # PORT: torch.randint(low, high, size, dtype=int8/int32) -> seeded numpy (mindtorch's randint ignores
    # the seed and has no int8 CPU kernel)
    np_dtype = {torch.int8: np.int8, torch.int32: np.int32}[dtype]
    return torch.tensor(np.random.randint(low, high, size=size).astype(np_dtype))


class TestLLMInt8Ops:
    @pytest.mark.parametrize("device", get_available_devices())
    def test_int8_linear_matmul(self, device):
        A = _randint(-128, 127, (10, 20), dtype=torch.int8)
        B = _randint(-128, 127, (30, 20), dtype=torch.int8)
        out = _ops.int8_linear_matmul.default(A, B)

        assert out.shape == (10, 30)
        assert out.dtype == torch.int32
        assert out.device == A.device

    @pytest.mark.parametrize("device", get_available_devices())
    def test_int8_linear_matmul_out(self, device):
        A = _randint(-128, 127, (10, 20), dtype=torch.int8)
        B = _randint(-128, 127, (30, 20), dtype=torch.int8)

        out = torch.empty((10, 30), dtype=torch.int32, device=device)
        _ops.int8_linear_matmul.out(A, B, out)

        assert out.shape == (10, 30)
        assert out.dtype == torch.int32
        assert out.device == A.device
        # PORT: (opcheck dropped) the written values are checked instead
        np.testing.assert_array_equal(out.numpy(), A.numpy().astype(np.int64) @ B.numpy().astype(np.int64).T)

    @pytest.mark.parametrize("threshold", [0.0, 6.0])
    @pytest.mark.parametrize("device", get_available_devices())
    def test_int8_vectorwise_quant(self, threshold, device):
        A = torch.randn(10, 20, dtype=torch.float16, device=device)
        # PORT: `A[1][0] = 1000.0` through numpy (writes into indexed views are copies in mindtorch)
        a = A.float().numpy().copy()
        a[1][0] = 1000.0
        A = torch.tensor(a).half()

        out_row, row_stats, outlier_cols = _ops.int8_vectorwise_quant(A, threshold=threshold)

        assert out_row.shape == (10, 20)
        assert out_row.dtype == torch.int8
        assert out_row.device == A.device
        assert row_stats.shape == (10,)
        assert row_stats.dtype == torch.float32
        assert row_stats.device == A.device

        if threshold > 0.0:
            assert outlier_cols is not None
            assert outlier_cols.dim() == 1
            assert outlier_cols.shape[0] <= A.shape[1]
            assert outlier_cols.device == A.device
        else:
            assert outlier_cols is None

    @pytest.mark.parametrize("device", get_available_devices())
    def test_int8_mm_dequant(self, device):
        A = _randint(-128, 127, (256, 256), dtype=torch.int32)
        row_stats = torch.randn(256, dtype=torch.float32, device=device)
        col_stats = torch.randn(256, dtype=torch.float32, device=device)
        out = _ops.int8_mm_dequant(A, row_stats, col_stats)

        assert out.shape == A.shape
        assert out.dtype == torch.float16
        assert out.device == A.device

    @pytest.mark.parametrize("device", get_available_devices())
    @pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=id_formatter("dtype"))
    @pytest.mark.parametrize("has_bias", TRUE_FALSE)
    def test_int8_scaled_mm(self, device, dtype, has_bias):
        A = _randint(-128, 127, (10, 20), dtype=torch.int8)
        B = _randint(-128, 127, (30, 20), dtype=torch.int8)
        row_stats = torch.randn(10, dtype=torch.float32, device=device)
        col_stats = torch.randn(30, dtype=torch.float32, device=device)
        bias = torch.randn(30, dtype=dtype, device=device) if has_bias else None
        out = _ops.int8_scaled_mm(A, B, row_stats, col_stats, bias=bias, dtype=dtype)

        assert out.shape == (10, 30)
        assert out.dtype == dtype
        assert out.device == A.device
