"""Bad input raises a clear Python exception naming the argument, before native code runs."""

import numpy as np
import pytest

import mindspore as ms

from bitsandbytes_ms import functional as F
from bitsandbytes_ms.utils import pack_dict_to_tensor, unpack_tensor_to_dict


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


# ---- issue 15: unclear errors that reached native code or KeyError ----
def _quant_state_4bit():
    return F.quantize_4bit(f32(32, 64), quant_type="nf4", compress_statistics=True)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("key", ["absmax", "blocksize", "shape", "nested_offset", "quant_map"])
def test_quant_state_from_dict_names_missing_keys(packed, key):
    _, qs = _quant_state_4bit()
    d = qs.as_dict(packed=packed)
    if packed and key not in d:  # non-tensor items live in the packed JSON entry
        inner = unpack_tensor_to_dict(d["quant_state.bitsandbytes__nf4"])
        inner.pop(key)
        d["quant_state.bitsandbytes__nf4"] = pack_dict_to_tensor(inner)
    else:
        d.pop(key)
    with pytest.raises(ValueError, match=rf"QuantState.from_dict: missing keys \['{key}'\]; a quant state needs"):
        F.QuantState.from_dict(d)


def test_quant_state_from_dict_bad_values():
    _, qs = _quant_state_4bit()
    d = qs.as_dict()
    with pytest.raises(ValueError, match=r"`dtype` must name a dtype \(e.g. 'float32'\); got 'float31'"):
        F.QuantState.from_dict({**d, "dtype": "float31"})
    with pytest.raises(ValueError, match="`blocksize` must be an int; got '64'"):
        F.QuantState.from_dict({**d, "blocksize": "64"})
    with pytest.raises(TypeError, match="`qs_dict` must be a dict, got list"):
        F.QuantState.from_dict([1, 2])
    packed = qs.as_dict(packed=True)
    packed["quant_state.bitsandbytes__nf4"] = ms.Tensor(np.frombuffer(b"{nope", np.uint8).copy())
    with pytest.raises(ValueError, match="`quant_state.bitsandbytes__nf4` must hold the JSON-packed dict"):
        F.QuantState.from_dict(packed)
    assert F.QuantState.from_dict(qs.as_dict(packed=True)) == qs


def test_int8_linear_matmul_long_k_as_upstream():
    """K >= 131072 (upstream accepts any K) came back as a raw native status 3: now slices of the kernel's exact
    int32 range, summed with int32 wrap-around (torch._int_mm's int32 accumulation)."""
    rng = np.random.default_rng(0)
    K = 131072 + 1000
    A = rng.integers(-128, 128, (3, K), dtype=np.int8)
    B = rng.integers(-128, 128, (2, K), dtype=np.int8)
    A[0] = -128
    B[0] = -128  # row 0 x col 0: K * 2^14 > 2^31, wraps
    got = F.int8_linear_matmul(ms.Tensor(A), ms.Tensor(B)).asnumpy()
    exact = A.astype(np.int64) @ B.astype(np.int64).T
    np.testing.assert_array_equal(got.astype(np.int64), ((exact + 2**31) % 2**32) - 2**31)
    assert got.dtype == np.int32 and got[0, 0] != exact[0, 0] and np.array_equal(got[1:], exact[1:])


def test_gemv_4bit_rejects_a_256_entry_code_and_fp16_absmax():
    q, qs = F.quantize_4bit(f32(32, 64), quant_type="nf4")
    x = f32(1, 64)
    bad_code = F.QuantState(absmax=qs.absmax, shape=qs.shape, code=F.create_dynamic_map(), blocksize=qs.blocksize,
                            quant_type="nf4", dtype=ms.float32)
    with pytest.raises(ValueError, match=r"gemv_4bit: `state.code` must have 16 entries \(a 4-bit code\); got 256"):
        F.gemv_4bit(x, q.t(), state=bad_code)
    half = F.QuantState(absmax=qs.absmax.astype(ms.float16), shape=qs.shape, code=qs.code, blocksize=qs.blocksize,
                        quant_type="nf4", dtype=ms.float32)
    with pytest.raises(ValueError, match="gemv_4bit: `state.absmax` must have dtype float32; got float16"):
        F.gemv_4bit(x, q.t(), state=half)


@pytest.mark.parametrize("n", [0, 2])
def test_optimizer_update_32bit_unorm_vec_must_hold_one_value(n):
    g, p, s1 = f32(16), f32(16), ms.Tensor(np.zeros(16, np.float32))
    with pytest.raises(ValueError, match=rf"optimizer_update_32bit: `unorm_vec` must have 1 elements; got shape \({n},\)"):
        F.optimizer_update_32bit("momentum", g, p, s1, 0.9, 1e-8, 1, 0.1,
                                 unorm_vec=ms.Tensor(np.zeros(n, np.float32)), max_unorm=1.0)
