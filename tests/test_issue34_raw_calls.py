"""Issue 34 class g: bad raw native calls (lib.<cname>) fail with one line naming the argument, before native code
runs; results of raw calls carry mindtorch's device tag (their Tensor methods work)."""

import ctypes as ct

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401  (before `import torch`: torch becomes mindtorch)
import torch

from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import functional as F
from bitsandbytes_ms.cextension import get_ptr, lib

N = 256


def _f32(n=N, seed=0):
    return ms.Tensor(np.random.RandomState(seed).randn(n).astype(np.float32))


def _bnb_quantize_args(A, absmax, out):
    code = F.create_dynamic_map()
    return (get_ptr(code), A, absmax, out, ct.c_int32(64), ct.c_int(N))


@pytest.mark.parametrize("pos,name", [(0, "code"), (1, "A")])
@pytest.mark.parametrize("bad", [lambda: np.zeros(N, np.float32), lambda: [0.5] * N])
def test_array_input_of_mindspore_style_call_names_the_input(pos, name, bad):
    args = [F.create_dynamic_map(), _f32(), 64]
    args[pos] = bad()
    with pytest.raises(TypeError, match=rf"lib\.cquantize_blockwise_fp32: input `{name}` must be a Tensor"):
        lib.cquantize_blockwise_fp32(*args)


def test_numpy_inputs_of_int8_gemm_name_the_input():
    """Was IndexError: tuple index out of range (the table's shape rule read a numpy array's missing shape)."""
    with pytest.raises(TypeError, match="input `A` must be a Tensor"):
        lib.cigemmlt_32(np.zeros((4, 64), np.int8), np.zeros((8, 64), np.int8))
    out = F.empty((4, 8), ms.int32)
    with pytest.raises(TypeError, match="argument `B` must be get_ptr"):
        lib.cigemmlt_32(None, ct.c_int32(4), ct.c_int32(8), ct.c_int32(64), np.zeros((8, 64), np.int8),
                        get_ptr(ms.Tensor(np.zeros((4, 64), np.int8))), get_ptr(out), None,
                        ct.c_int32(64), ct.c_int32(64), ct.c_int32(8), None)


def test_numpy_input_of_bitsandbytes_style_call_names_the_argument():
    absmax, out = F.empty((4,), ms.float32), F.empty((N,), ms.uint8)
    with pytest.raises(TypeError, match="argument `A` must be get_ptr"):
        lib.cquantize_blockwise_fp32(*_bnb_quantize_args(np.zeros(N, np.float32), get_ptr(absmax), get_ptr(out)))


@pytest.mark.parametrize("bad", [lambda: np.zeros(4, np.float32), lambda: F.empty((4,), ms.float32)])
def test_output_that_is_not_a_get_ptr_handle_is_refused(bad):
    """Was: returned 0 and left the buffer unwritten (a silent wrong result)."""
    out = F.empty((N,), ms.uint8)
    with pytest.raises(TypeError, match="output `absmax` must be get_ptr"):
        lib.cquantize_blockwise_fp32(*_bnb_quantize_args(get_ptr(_f32()), bad(), get_ptr(out)))


def test_unknown_keyword_names_it_and_the_row():
    """Was KeyError: 'blocksize'."""
    with pytest.raises(TypeError, match=r"unknown keyword argument `blcksize`.*'code', 'A', 'blocksize'"):
        lib.cquantize_blockwise_fp32(F.create_dynamic_map(), _f32(), blcksize=64)
    with pytest.raises(TypeError, match="unknown keyword argument `size`"):
        lib.cdequantize_blockwise_fp32(F.create_dynamic_map(), ms.Tensor(np.zeros(N, np.uint8)), _f32(4), size=64)


def test_missing_and_repeated_arguments_are_named():
    code = F.create_dynamic_map()
    with pytest.raises(TypeError, match="missing argument `blocksize`"):
        lib.cquantize_blockwise_fp32(code, _f32())
    with pytest.raises(TypeError, match="argument `A` given both by position and by keyword"):
        lib.cquantize_blockwise_fp32(code, _f32(), 64, A=_f32())
    absmax, out = F.empty((4,), ms.float32), F.empty((N,), ms.uint8)
    with pytest.raises(TypeError, match="unknown keyword argument `count`"):
        lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(_f32()), get_ptr(absmax), get_ptr(out),
                                     ct.c_int32(64), count=ct.c_int(N))


def test_bitsandbytes_style_keywords_by_upstream_names():
    x = np.random.RandomState(1).randn(N).astype(np.float32)
    code = F.create_dynamic_map()
    absmax, out = F.empty((4,), ms.float32), F.empty((N,), ms.uint8)
    rc = lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(ms.Tensor(x)), absmax=get_ptr(absmax),
                                      out=get_ptr(out), blocksize=ct.c_int32(64), n=ct.c_int(N))
    assert rc == 0
    q_ref, a_ref = R.quantize_blockwise(x, code.asnumpy(), 64)
    np.testing.assert_array_equal(out.asnumpy(), q_ref)
    np.testing.assert_array_equal(absmax.asnumpy(), a_ref)


@pytest.mark.parametrize("name,shape,dtype,msg", [
    ("absmax", (2,), ms.float32, "must have 4 elements"),
    ("out", (100,), ms.uint8, "must have 256 elements"),
    ("out", (N,), ms.int8, "must have dtype"),
])
def test_bad_output_buffer_is_refused_before_native_code_runs(name, shape, dtype, msg):
    code = F.create_dynamic_map()
    bufs = {"absmax": F.empty((4,), ms.float32), "out": F.empty((N,), ms.uint8)}
    bufs[name] = F.empty(shape, dtype)
    good = "absmax" if name == "out" else "out"
    before = bufs[good].asnumpy().copy()
    with pytest.raises((TypeError, ValueError), match=rf"output `{name}` {msg}"):
        lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(_f32()), get_ptr(bufs["absmax"]), get_ptr(bufs["out"]),
                                     ct.c_int32(64), ct.c_int(N))
    np.testing.assert_array_equal(bufs[good].asnumpy(), before)  # nothing written


def test_short_4bit_gemv_output_names_out():
    W = ms.Tensor(np.zeros((8 * 64 // 2, 1), np.uint8))
    A = _f32(64).reshape(1, 64).astype(ms.bfloat16)
    with pytest.raises(ValueError, match="output `out` must have 8 elements"):
        lib.cgemm_4bit_inference_naive_bf16(ct.c_int32(1), ct.c_int32(8), ct.c_int32(64), get_ptr(A), get_ptr(W),
                                            get_ptr(ms.Tensor(np.ones(8, np.float32))), get_ptr(_f32(16)),
                                            get_ptr(F.empty((1, 4), ms.bfloat16)), ct.c_int32(64), ct.c_int32(64),
                                            ct.c_int32(8), ct.c_int32(64))


def test_bf16_raw_call_results_work_with_mindtorch_methods():
    """`Tensor must have device` came from the results of raw calls lacking mindtorch's device tag (for every
    dtype; bf16 results are the ones read through .float()), not from bf16 inputs."""
    x = np.random.RandomState(2).randn(N).astype(np.float32)
    code = F.create_dynamic_map()
    q, absmax = lib.cquantize_blockwise_bf16(code, ms.Tensor(x).astype(ms.bfloat16), 64)
    back = lib.cdequantize_blockwise_bf16(code, q, absmax, 64)
    got = back.float().asnumpy()  # raised ValueError: Tensor must have device
    assert back.to(torch.float32).dtype == ms.float32
    xb = ms.Tensor(x).astype(ms.bfloat16).astype(ms.float32).asnumpy()
    q_ref, a_ref = R.quantize_blockwise(xb, code.asnumpy(), 64)
    ref = R.dequantize_blockwise(q_ref, a_ref, code.asnumpy(), 64)
    np.testing.assert_allclose(got, ref, rtol=2 ** -8, atol=0)
