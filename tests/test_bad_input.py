"""Bad input raises a clear Python exception naming the argument, before native code runs."""

import numpy as np
import pytest

import mindspore as ms

from bitsandbytes_ms import functional as F


def f32(*shape):
    return ms.Tensor(np.random.RandomState(0).randn(*shape).astype(np.float32))


@pytest.mark.parametrize("dtype", [ms.int8, ms.uint8, ms.int32, ms.float64])
def test_quantize_rejects_non_float(dtype):
    with pytest.raises(ValueError, match=r"quantize_blockwise: `A` must have dtype float32, float16, bfloat16"):
        F.quantize_blockwise(f32(4, 64).astype(dtype))


def test_quantize_rejects_non_tensor():
    with pytest.raises(TypeError, match="`A` must be a mindspore.Tensor"):
        F.quantize_blockwise(np.zeros((4, 64), np.float32))


@pytest.mark.parametrize("blocksize", [0, -64, 16, 100, 3000, 32768])
def test_quantize_rejects_blocksize(blocksize):
    with pytest.raises(ValueError, match="`blocksize` must be one of"):
        F.quantize_blockwise(f32(4, 64), blocksize=blocksize)
    with pytest.raises(ValueError, match="`blocksize` must be one of"):
        F.dequantize_blockwise(ms.Tensor(np.zeros(256, np.uint8)), absmax=f32(1), blocksize=blocksize)


def test_quantize_rejects_float_blocksize():
    with pytest.raises(TypeError, match="`blocksize` must be an int"):
        F.quantize_blockwise(f32(4, 64), blocksize=64.0)


def test_quantize_rejects_bad_out():
    A = f32(4, 64)
    with pytest.raises(ValueError, match="`out` must have shape"):
        F.quantize_blockwise(A, out=F.empty((4, 63), ms.uint8), blocksize=64)
    with pytest.raises(ValueError, match="`out` must have dtype uint8"):
        F.quantize_blockwise(A, out=F.empty((4, 64), ms.int8), blocksize=64)
    with pytest.raises(ValueError, match="`absmax` must have shape"):
        F.quantize_blockwise(A, absmax=F.empty((5,), ms.float32), blocksize=64)


@pytest.mark.parametrize("n", [16, 255, 257])
def test_quantize_rejects_code_of_wrong_length(n):
    with pytest.raises(ValueError, match="`code` must have 256 entries"):
        F.quantize_blockwise(f32(4, 64), code=f32(n), blocksize=64)


def test_quantize_rejects_code_of_wrong_dtype():
    with pytest.raises(ValueError, match="`code` must have dtype float32"):
        F.quantize_blockwise(f32(4, 64), code=f32(256).astype(ms.float16), blocksize=64)


def test_dequantize_rejects_non_uint8():
    with pytest.raises(ValueError, match="dequantize_blockwise: `A` must have dtype uint8"):
        F.dequantize_blockwise(f32(4, 64), absmax=f32(4), blocksize=64)


def test_dequantize_needs_state_or_absmax():
    with pytest.raises(ValueError, match="requires either `quant_state` or `absmax`"):
        F.dequantize_blockwise(ms.Tensor(np.zeros(64, np.uint8)))


def test_dequantize_rejects_absmax_of_wrong_length():
    with pytest.raises(ValueError, match=r"`absmax` must have ceil\(256/64\) = 4 entries; got 3"):
        F.dequantize_blockwise(ms.Tensor(np.zeros(256, np.uint8)), absmax=f32(3), blocksize=64)


def test_dequantize_rejects_bad_out():
    q, state = F.quantize_blockwise(f32(4, 64), blocksize=64)
    with pytest.raises(ValueError, match="`out` must have dtype float32"):
        F.dequantize_blockwise(q, state, out=F.empty((4, 64), ms.float16))
    with pytest.raises(ValueError, match="`out` must have shape"):
        F.dequantize_blockwise(q, state, out=F.empty((64, 4), ms.float32))


def test_native_layer_rejects_malformed_calls():
    """The entry points themselves check sizes and dtypes (defence in depth): a nonzero status
    makes MindSpore raise instead of reading out of bounds."""
    from bitsandbytes_ms.cextension import lib

    code = F.create_dynamic_map()
    with pytest.raises(RuntimeError):
        lib.cquantize_blockwise_fp32(code[:100], f32(64), 64)   # code too short
    with pytest.raises(RuntimeError):
        lib.cquantize_blockwise_fp32(code, f32(64).astype(ms.float16), 64)  # dtype does not match the name
    with pytest.raises(RuntimeError):
        lib.cdequantize_blockwise_fp32(code, ms.Tensor(np.zeros(256, np.uint8)), f32(2), 64)  # absmax too short
    with pytest.raises(RuntimeError):
        lib.cquantize_blockwise_fp32(code, f32(64), 0)  # blocksize 0
