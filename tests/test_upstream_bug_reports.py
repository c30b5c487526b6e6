"""Reproductions of public bitsandbytes bug reports (github.com/bitsandbytes-foundation/bitsandbytes, formerly
TimDettmers/bitsandbytes, and the downstream reports they fixed) whose behaviour applies to a CPU library with
upstream's API. Each test names its report and asserts values: round trips bit-identical, results against a
numpy computation written here (upstream's NF4 constants, nearest-code rounding, blockwise absmax), or the
behaviour upstream documents / fixed. Small tensors only: the file runs in seconds."""

import copy
import pickle

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401  (`torch` is mindtorch from here on)
import torch

import bitsandbytes_ms as bnb
from bitsandbytes_ms import functional as F

# upstream's NF4 table (bitsandbytes/functional.py get_4bit_type("nf4"), also backends/utils.py _NF4_QUANT_TABLE)
NF4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                0.7229568362236023, 1.0], dtype=np.float32)


# ---- numpy references ------------------------------------------------------------------------------
def _np(t):
    return t.astype(ms.float32).asnumpy() if t.dtype == ms.bfloat16 else t.asnumpy()


def _blocks_absmax(x: np.ndarray, blocksize: int) -> np.ndarray:
    flat = np.asarray(x, np.float32).reshape(-1)
    nb = -(-flat.size // blocksize)
    pad = np.zeros(nb * blocksize, np.float32)
    pad[:flat.size] = np.abs(flat)
    return pad.reshape(nb, blocksize).max(axis=1)


def _unpack(packed: np.ndarray, n: int) -> np.ndarray:
    p = packed.reshape(-1).view(np.uint8)
    q = np.empty(p.size * 2, np.uint8)
    q[0::2], q[1::2] = p >> 4, p & 15  # upstream packs the first element in the high nibble
    return q[:n]


def _check_nearest(idx: np.ndarray, scaled: np.ndarray, code: np.ndarray, tol: float = 1e-6):
    """idx must pick a nearest entry of ``code`` for every scaled value, to ``tol`` (ties may go either way)."""
    got = np.abs(code[idx].astype(np.float64) - scaled)
    best = np.min(np.abs(code[None, :].astype(np.float64) - scaled[:, None]), axis=1)
    assert np.all(got <= best + tol), f"{int(np.sum(got > best + tol))} values not rounded to the nearest code"


def _check_4bit(x: np.ndarray, packed, qs, blocksize: int, code=NF4):
    """packed/qs from quantize_4bit(x): absmax is the block absmax, every nibble a nearest code of x/absmax;
    returns the numpy dequantization code[q] * absmax (fp32), flat."""
    flat = np.asarray(x, np.float32).reshape(-1)
    n = flat.size
    absmax = _blocks_absmax(flat, blocksize)
    np.testing.assert_array_equal(_np(qs.absmax), absmax)
    q = _unpack(_np(packed), n)
    scale = np.repeat(absmax, blocksize)[:n].astype(np.float64)
    _check_nearest(q, np.where(scale > 0, flat / np.where(scale > 0, scale, 1), 0.0), code)
    return (code[q] * np.repeat(absmax, blocksize)[:n]).astype(np.float32)


def _check_blockwise(x: np.ndarray, q, qs, blocksize: int):
    flat = np.asarray(x, np.float32).reshape(-1)
    absmax = _blocks_absmax(flat, blocksize)
    np.testing.assert_array_equal(_np(qs.absmax), absmax)
    code = _np(qs.code)
    idx = _np(q).reshape(-1)
    scale = np.repeat(absmax, blocksize)[:flat.size].astype(np.float64)
    # upstream's CPU kernel looks the nearest code up on a 65536-step grid over [-1, 1]: nearest to one step
    _check_nearest(idx, np.where(scale > 0, flat / np.where(scale > 0, scale, 1), 0.0), code, tol=2.0 / 65535)
    return (code[idx] * np.repeat(absmax, blocksize)[:flat.size]).astype(np.float32)


def _t(a, dtype=ms.float32):
    return torch.tensor(np.asarray(a, np.float32)).to(dtype)


def _raw(t) -> bytes:
    return t.asnumpy().tobytes() if t.dtype != ms.bfloat16 else t.view(ms.int16).asnumpy().tobytes()


def _nf4_linear(rng, K, N, bias=True, compress=True, compute_dtype=None):
    m = bnb.nn.Linear4bit(K, N, bias=bias, quant_type="nf4", compress_statistics=compress,
                          compute_dtype=compute_dtype)
    m.weight = bnb.nn.Params4bit(_t(rng.randn(N, K) * 0.1), requires_grad=False, quant_type="nf4",
                                 compress_statistics=compress)
    if bias:
        m.bias = torch.nn.Parameter(_t(rng.randn(N)), requires_grad=False)
    return m.to("cpu").eval()


def _int8_linear(rng, K, N, bias=True, threshold=0.0):
    m = bnb.nn.Linear8bitLt(K, N, bias=bias, has_fp16_weights=False, threshold=threshold)
    m.weight = bnb.nn.Int8Params(_t(rng.randn(N, K) * 0.1), requires_grad=False, has_fp16_weights=False)
    if bias:
        m.bias = torch.nn.Parameter(_t(rng.randn(N)), requires_grad=False)
    return m.to("cpu").eval()


def _w4(m):
    """The layer's weight dequantized by numpy from its packed bytes and (nested) absmax, [N, K] float64."""
    W = F.dequantize_4bit(m.weight, m.weight.quant_state)
    return _np(W).astype(np.float64)


# ---- 4-bit / blockwise functional ------------------------------------------------------------------
def test_1342_1690_quantize_4bit_non_contiguous_input():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1342 (x[:, ::2, :] gave half the values
    # wrong) and /issues/1690 (quantize_4bit of x[:, :, a:b, :] differed from the same slice made contiguous)
    rng = np.random.RandomState(0)
    full = _t(rng.randn(4, 3, 38, 256))
    part = full[:, :, 10:15, :]
    assert not part.is_contiguous()
    q_nc, s_nc = F.quantize_4bit(part, blocksize=256, quant_type="nf4")
    q_c, s_c = F.quantize_4bit(part.contiguous(), blocksize=256, quant_type="nf4")
    assert _raw(q_nc) == _raw(q_c) and _raw(s_nc.absmax) == _raw(s_c.absmax)
    ref = _check_4bit(_np(part), q_nc, s_nc, 256)
    # the absmax of the slice is the slice of the full tensor's absmax (the layout #1690 expected)
    _, s_full = F.quantize_4bit(full, blocksize=256, quant_type="nf4")
    np.testing.assert_array_equal(_np(s_full.absmax).reshape(4, 3, 38)[:, :, 10:15], _np(s_nc.absmax).reshape(4, 3, 5))
    np.testing.assert_array_equal(_np(F.dequantize_4bit(q_nc, s_nc)).reshape(-1), ref)
    # the #1342 reproduction: x[:, ::2, :] of a (3, 4, 6) tensor, default blocksize 64
    x = _t(rng.randn(3, 4, 6))[:, ::2, :]
    a, sa = F.quantize_4bit(x)
    b, sb = F.quantize_4bit(x.contiguous())
    assert np.array_equal(_np(F.dequantize_4bit(a, sa)), _np(F.dequantize_4bit(b, sb)))


def test_1995_blockwise_non_contiguous_cpu():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1995: the CPU quantize_blockwise /
    # dequantize_blockwise read non-contiguous inputs in memory order (fixed by PR #1996)
    rng = np.random.RandomState(1)
    for dtype in (ms.float32, ms.float16, ms.bfloat16):
        A_full = _t(rng.randn(64, 128), dtype)
        A_nc = A_full[::2, :]
        assert not A_nc.is_contiguous()
        qn, sn = F.quantize_blockwise(A_nc, blocksize=64)
        qc, sc = F.quantize_blockwise(A_nc.contiguous(), blocksize=64)
        assert _raw(qn) == _raw(qc) and _raw(sn.absmax) == _raw(sc.absmax)
        ref = _check_blockwise(_np(A_nc), qn, sn, 64)
        # dequantize from a non-contiguous view of the same codes
        wide = torch.zeros((32, 256), dtype=torch.uint8)
        wide[:, :128] = qc
        q_view = wide[:, :128]
        assert not q_view.is_contiguous()
        out = F.dequantize_blockwise(q_view, sc)
        assert out.dtype == dtype
        np.testing.assert_array_equal(_np(out), _np(F.dequantize_blockwise(qc, sc)))
        np.testing.assert_array_equal(_np(out.astype(ms.float32)).reshape(-1),
                                      _np(_t(ref.reshape(32, 128), dtype)).reshape(-1))


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16])
def test_1540_blockwise_half_inputs_on_cpu(dtype):
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1540: quantize_blockwise of a float16
    # ones(5, 10) on CPU dequantized to all zeros (then a segfault); 0.47+ supports fp16/bf16 on CPU
    x = torch.ones((5, 10), dtype=dtype)
    q, qs = F.quantize_blockwise(x)
    np.testing.assert_array_equal(_np(qs.absmax), [1.0])
    for out in (F.dequantize_blockwise(q, absmax=qs.absmax, code=qs.code).astype(dtype),
                F.dequantize_blockwise(q, quant_state=qs)):
        np.testing.assert_array_equal(_np(out), np.ones((5, 10), np.float32))
    assert F.dequantize_blockwise(q, quant_state=qs).dtype == dtype
    # random values: against numpy
    rng = np.random.RandomState(2)
    xr = _t(rng.randn(7, 33), dtype)
    q, qs = F.quantize_blockwise(xr, blocksize=64)
    ref = _check_blockwise(_np(xr), q, qs, 64)
    np.testing.assert_array_equal(_np(F.dequantize_blockwise(q, qs)).reshape(-1), _np(_t(ref, dtype)))


@pytest.mark.parametrize("blocksize", [32, 64, 1024, 2048, 4096])
@pytest.mark.parametrize("dtype", [ms.float32, ms.float16, ms.bfloat16])
def test_1157_565_986_4bit_blocksizes(blocksize, dtype):
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1157 (quantize_nf4 with blocksize 4096
    # used the FP4 kernel, PR #1160; 16 values with blocksize 1024 crashed), /issues/565 (blocksize >= 1024
    # gave ~7x the error of a correct quantizer) and /issues/986 + /issues/1329 (blocksize 32, added by PR #1854)
    rng = np.random.RandomState(blocksize)
    for shape in ((2, 4096), (16,)):
        x = _t(rng.randn(*shape), dtype)
        q, qs = F.quantize_nf4(x, blocksize=blocksize)
        assert qs.blocksize == blocksize and qs.quant_type == "nf4"
        np.testing.assert_array_equal(_np(qs.code), NF4)
        ref = _check_4bit(_np(x), q, qs, blocksize)
        out = F.dequantize_nf4(q, qs)
        assert out.dtype == dtype and tuple(out.shape) == shape
        np.testing.assert_array_equal(_np(out).reshape(-1), _np(_t(ref, dtype)).reshape(-1))


def test_1884_4bit_numel_not_multiple_of_blocksize():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1884 (4-bit quantization of weights whose
    # numel is not a multiple of the blocksize read garbage into the last block's absmax: NaN/Inf); also the
    # CPU path of PR #1628 (google/siglip hidden sizes not divisible by the blocksize)
    rng = np.random.RandomState(3)
    for shape, bs in (((3, 100), 64), ((1, 1), 64), ((5, 7), 32), ((2, 1153), 4096), ((13,), 256)):
        x = _t(rng.randn(*shape) * 3)
        q, qs = F.quantize_4bit(x, blocksize=bs, quant_type="nf4")
        n = int(np.prod(shape))
        assert tuple(q.shape) == ((n + 1) // 2, 1) and qs.absmax.shape[0] == -(-n // bs)
        ref = _check_4bit(_np(x), q, qs, bs)
        out = _np(F.dequantize_4bit(q, qs))
        assert out.shape == shape and np.all(np.isfinite(out))
        np.testing.assert_array_equal(out.reshape(-1), ref)


def test_1071_blockwise_bad_blocksize_and_tiny_tensors():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1071: quantize_blockwise(ones(1, 1, 1),
    # blocksize=2**64) killed the process with SIGFPE in the CPU library; it must be a Python error
    for bad in (2 ** 64, 0):
        with pytest.raises(ValueError, match="blocksize"):
            F.quantize_blockwise(torch.ones((1, 1, 1)), blocksize=bad)
    # a 1-element tensor: absmax |v|, value absmax * the code's entry nearest +-1 (the signed dynamic map ends at
    # +1.0 and -0.99296875; NF4 at +-1)
    for v in (1.0, -2.5):
        q, qs = F.quantize_blockwise(_t([[[v]]]), blocksize=256)
        np.testing.assert_array_equal(_np(qs.absmax), [abs(v)])
        edge = _np(qs.code).max() if v > 0 else _np(qs.code).min()
        np.testing.assert_array_equal(_np(F.dequantize_blockwise(q, qs)), [[[np.float32(edge) * np.float32(abs(v))]]])
        q4, qs4 = F.quantize_4bit(_t([[v]]), blocksize=64, quant_type="nf4")
        np.testing.assert_array_equal(_np(F.dequantize_4bit(q4, qs4)), [[v]])
    # an empty tensor gives empty results of the right shapes (torch's convention for empty inputs)
    q, qs = F.quantize_blockwise(torch.zeros((0, 8)), blocksize=64)
    assert tuple(q.shape) == (0, 8) and qs.absmax.shape[0] == 0
    assert tuple(F.dequantize_blockwise(q, qs).shape) == (0, 8)


def test_1587_quantize_blockwise_absmax_buffer():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1587: the `absmax` argument of
    # quantize_blockwise is an output buffer ("A tensor to use to store the absmax values"): it receives the
    # block absmax (the report: it was overwritten, which is its documented role), the result is the same as
    # without it
    rng = np.random.RandomState(4)
    a = _t(rng.randn(10) / 10)
    ref_q, ref_s = F.quantize_blockwise(a, blocksize=64)
    buf = torch.zeros(1)
    q, s = F.quantize_blockwise(a, absmax=buf, blocksize=64)
    assert _raw(q) == _raw(ref_q)
    np.testing.assert_array_equal(_np(buf), _blocks_absmax(_np(a), 64))
    np.testing.assert_array_equal(_np(s.absmax), _np(ref_s.absmax))


def test_dequantize_out_buffers():
    # dequantize_4bit / dequantize_blockwise write into `out` and return it (the same contract whose breakage
    # in matmul_4bit is https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1235)
    rng = np.random.RandomState(5)
    x = _t(rng.randn(6, 64))
    q4, s4 = F.quantize_4bit(x, blocksize=64, quant_type="nf4")
    out = torch.full((6, 64), 7.0)
    r = F.dequantize_4bit(q4, s4, out=out)
    ref = _check_4bit(_np(x), q4, s4, 64).reshape(6, 64)
    np.testing.assert_array_equal(_np(out), ref)
    np.testing.assert_array_equal(_np(r), ref)
    q8, s8 = F.quantize_blockwise(x, blocksize=128)
    out8 = torch.full((6, 64), 7.0)
    F.dequantize_blockwise(q8, s8, out=out8)
    np.testing.assert_array_equal(_np(out8).reshape(-1), _check_blockwise(_np(x), q8, s8, 128))


def test_1729_quant_state_as_dict_from_dict():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1729: QuantState.as_dict() followed by
    # QuantState.from_dict() raised "There should be exactly one `quant_state` item"; the packed form
    # (what Linear4bit saves) must round-trip too
    rng = np.random.RandomState(6)
    a = _t(rng.rand(2, 3))
    for nested in (False, True):
        q, qs = F.quantize_4bit(a, quant_type="nf4", compress_statistics=nested)
        ref = _np(F.dequantize_4bit(q, qs))
        for packed in (False, True):
            qs2 = F.QuantState.from_dict(qs.as_dict(packed=packed), device="cpu")
            assert qs2.quant_type == "nf4" and qs2.blocksize == qs.blocksize and tuple(qs2.shape) == (2, 3)
            assert qs2.nested == nested
            np.testing.assert_array_equal(_np(F.dequantize_4bit(q, qs2)), ref)


@pytest.mark.parametrize("dtype", [ms.float16, ms.bfloat16, ms.float32])
def test_1311_dequantize_double_quant_on_cpu(dtype):
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1311: model.dequantize() of a 4-bit model
    # with bnb_4bit_use_double_quant=True and float16 weights failed on CPU. Against numpy: the nested absmax is
    # code2[qabsmax] * absmax2[block of 256] + offset, the weight NF4[nibble] * that absmax, in fp32, then rounded
    rng = np.random.RandomState(22)
    W = _t(rng.randn(24, 96) * 0.05, dtype)  # 2304 values: 36 blocks of 64, the nested absmax in 1 block of 256
    p = bnb.nn.Params4bit(W, requires_grad=False, quant_type="nf4", compress_statistics=True).to("cpu")
    qs = p.quant_state
    assert qs.nested and qs.state2.blocksize == 256 and qs.absmax.dtype == ms.uint8 and qs.dtype == dtype
    amax = (_np(qs.state2.code)[_np(qs.absmax)] * np.repeat(_np(qs.state2.absmax), 256)[:qs.absmax.shape[0]]
            + np.float32(_np(qs.offset))).astype(np.float32)
    # offset is the mean of the fp32 block absmax; the nested code is the signed dynamic map
    np.testing.assert_allclose(_np(qs.offset), _blocks_absmax(_np(W), 64).mean(), rtol=1e-6)
    np.testing.assert_allclose(amax, _blocks_absmax(_np(W), 64), rtol=0, atol=0.01 * _blocks_absmax(_np(W), 64).max())
    q = _unpack(_np(p), 24 * 96)
    ref = (NF4[q] * np.repeat(amax, 64)).astype(np.float32)
    out = F.dequantize_4bit(p, qs)
    assert out.dtype == dtype and tuple(out.shape) == (24, 96)
    np.testing.assert_array_equal(_np(out).reshape(-1), _np(_t(ref, dtype)).reshape(-1))


# ---- Params4bit / Int8Params ---------------------------------------------------------------------------
def test_1060_params4bit_deepcopy_and_copy():
    # https://github.com/huggingface/accelerate/issues/2248, fixed by
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1060 (deepcopy/copy of Params4bit)
    param = bnb.nn.Params4bit(_t([1.0, 2.0, 3.0, 4.0]), requires_grad=False, quant_type="nf4",
                              compress_statistics=False).to("cpu")
    assert param.bnb_quantized
    deep = copy.deepcopy(param)
    assert type(deep) is bnb.nn.Params4bit and deep.bnb_quantized
    assert deep.quant_state is not param.quant_state
    assert deep.quant_state.absmax is not param.quant_state.absmax
    assert _raw(deep) == _raw(param)
    np.testing.assert_array_equal(_np(F.dequantize_4bit(deep, deep.quant_state)),
                                  _np(F.dequantize_4bit(param, param.quant_state)))
    shallow = copy.copy(param)
    assert shallow.quant_state is param.quant_state and _raw(shallow) == _raw(param)
    # values: [1, 2, 3, 4] in one block, absmax 4: 1/4, 2/4, 3/4 round to nearest NF4 entries
    ref = _check_4bit(np.array([1, 2, 3, 4], np.float32), deep, deep.quant_state, 64)
    np.testing.assert_array_equal(_np(F.dequantize_4bit(deep, deep.quant_state)).reshape(-1), ref)


def test_1527_1664_params4bit_to_keeps_state():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1527 (Params4bit.to did not move
    # quant_state.code) and /issues/1664 (Params4bit.to returned a parameter with bnb_quantized=False, so a
    # second .to() re-quantized the packed uint8 data: "Blockwise quantization only supports 16/32-bit floats")
    rng = np.random.RandomState(7)
    w = _t(rng.randn(8, 64) * 0.1)
    p = bnb.nn.Params4bit(w, requires_grad=False, quant_type="nf4")
    p = p.to("cpu")
    packed, absmax = _raw(p), _raw(p.quant_state.absmax)
    for call in (lambda t: t.to("cpu"), lambda t: t.to(device="cpu"), lambda t: t.cpu(),
                 lambda t: t.to(device="cpu")):
        p = call(p)
        assert type(p) is bnb.nn.Params4bit and p.bnb_quantized and p.dtype == ms.uint8
        assert _raw(p) == packed and _raw(p.quant_state.absmax) == absmax
        np.testing.assert_array_equal(_np(p.quant_state.code), NF4)
    ref = _check_4bit(_np(w), p, p.quant_state, 64) if not p.quant_state.nested else None
    out = _np(F.dequantize_4bit(p, p.quant_state))
    if ref is not None:
        np.testing.assert_array_equal(out.reshape(-1), ref)
    else:  # nested absmax (compress_statistics default True): within the 8-bit absmax error of the weights
        assert np.max(np.abs(out - _np(w))) < 0.5 * np.max(np.abs(_np(w)))


def test_1231_int8params_deepcopy():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1231 (Int8Params not deepcopy-able; PEFT
    # deep-copies 8-bit models): the copy keeps CB/SCB and gives the same output
    rng = np.random.RandomState(8)
    m = _int8_linear(rng, 64, 16)
    x = _t(rng.randn(3, 64))
    y = _np(m(x))
    m2 = copy.deepcopy(m)
    assert m2.weight.SCB is not None and m2.weight.SCB is not m.weight.SCB
    assert _raw(m2.weight.SCB) == _raw(m.weight.SCB) and _raw(m2.weight) == _raw(m.weight)
    np.testing.assert_array_equal(_np(m2(x)), y)
    # .to() on the quantized layer neither re-quantizes the int8 data nor drops SCB
    m3 = m2.to("cpu").to(device="cpu")
    assert m3.weight.dtype == ms.int8 and _raw(m3.weight) == _raw(m.weight) and _raw(m3.weight.SCB) == _raw(m.weight.SCB)
    np.testing.assert_array_equal(_np(m3(x)), y)
    # numpy: row-wise int8 weights, x quantized per row, int32 GEMM, rescaled by SCB_x*SCB_w/127^2 (+ bias)
    W = _np(m.weight).astype(np.float64) * _np(m.weight.SCB)[:, None] / 127.0
    ref = _np(x) @ W.T + _np(m.bias)
    np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())


# ---- module state dicts, pickling ------------------------------------------------------------------------
def test_1946_linear4bit_state_dict_keys_and_reload():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1946 (Linear4bit saves QuantState keys
    # but load_state_dict(strict=True) raised "Unexpected key(s)"), /issues/438 (quant_state not in the state
    # dict) and PR #753 (upstream's key format)
    rng = np.random.RandomState(9)
    for nested in (True, False):
        m = _nf4_linear(rng, 64, 24, compress=nested)
        sd = m.state_dict()
        keys = {"weight", "bias", "weight.absmax", "weight.quant_map", "weight.quant_state.bitsandbytes__nf4"}
        if nested:
            keys |= {"weight.nested_absmax", "weight.nested_quant_map"}
        assert set(sd) == keys
        np.testing.assert_array_equal(_np(sd["weight.quant_map"]), NF4)
        import json
        meta = json.loads(bytes(_np(sd["weight.quant_state.bitsandbytes__nf4"]).astype(np.uint8)).decode())
        assert meta["quant_type"] == "nf4" and meta["blocksize"] == 64 and meta["shape"] == [24, 64]
        assert meta["dtype"] == "float32"
        fresh = bnb.nn.Linear4bit(64, 24, bias=True, quant_type="nf4", compress_statistics=nested)
        res = fresh.load_state_dict(sd, strict=True)
        assert not res.missing_keys and not res.unexpected_keys
        fresh = fresh.eval()
        x = _t(rng.randn(5, 64))
        y = _np(m(x))
        np.testing.assert_array_equal(_np(fresh(x)), y)
        assert _raw(fresh.weight) == _raw(m.weight)
        ref = _np(x).astype(np.float64) @ _w4(m).T + _np(m.bias)
        np.testing.assert_allclose(y, ref, rtol=0, atol=1e-4 * np.abs(ref).max())


def test_159_535_linear8bitlt_state_dict_reload():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/159 / issues/535 (SCB saved with the int8
    # weight so that a pre-quantized 8-bit checkpoint reloads) and upstream's weight_format entry (0 = "row")
    rng = np.random.RandomState(10)
    m = _int8_linear(rng, 64, 16)
    sd = m.state_dict()
    assert set(sd) == {"weight", "bias", "SCB", "weight_format"}
    assert sd["weight"].dtype == ms.int8 and sd["SCB"].dtype == ms.float32
    assert sd["weight_format"].dtype == ms.uint8 and int(_np(sd["weight_format"])) == 0
    fresh = bnb.nn.Linear8bitLt(64, 16, has_fp16_weights=False)
    fresh.load_state_dict(sd)
    fresh = fresh.to("cpu").eval()
    assert _raw(fresh.weight) == _raw(m.weight) and _raw(fresh.weight.SCB) == _raw(m.weight.SCB)
    x = _t(rng.randn(4, 64))
    np.testing.assert_array_equal(_np(fresh(x)), _np(m(x)))
    # SCB is the row absmax of the fp weights and weight = round(W * 127 / SCB)
    # (the checkpoint's meaning, upstream's int8_vectorwise_quant)
    W = _np(m.weight).astype(np.float64) * _np(m.weight.SCB)[:, None] / 127
    assert np.all(np.abs(_np(m.weight)) <= 127) and np.all(np.max(np.abs(_np(m.weight)), axis=1) == 127)
    assert np.all(np.isfinite(W))


def test_960_linear8bitlt_state_dict_after_forward():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/960: after a forward pass (training with
    # LoRA), init_8bit_state set weight.SCB to None and model.load_state_dict(model.state_dict()) failed
    rng = np.random.RandomState(11)
    m = _int8_linear(rng, 32, 8, threshold=6.0)
    x = _t(rng.randn(2, 32))
    x[:, 3] = 9.0  # an outlier column: the mixed path
    y0 = _np(m(x))
    scb = _raw(m.weight.SCB)
    m.train()
    y_train = _np(m(x))  # a training-mode forward (the report's LoRA step)
    sd = m.state_dict()
    assert "SCB" in sd and _raw(sd["SCB"]) == scb
    m.load_state_dict(sd)
    assert _raw(m.weight.SCB) == scb
    np.testing.assert_array_equal(_np(m(x)), y_train)
    m.eval()
    np.testing.assert_array_equal(_np(m(x)), y0)
    fresh = bnb.nn.Linear8bitLt(32, 8, has_fp16_weights=False, threshold=6.0)
    fresh.load_state_dict(sd)
    np.testing.assert_array_equal(_np(fresh.to("cpu").eval()(x)), y0)


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_1099_whole_module_pickle(kind):
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1099: torch.save/torch.load (pickling) of a
    # whole Linear8bitLt after its first forward lost CB/SCB ("missing field CB"); Linear4bit must keep its
    # quant_state
    rng = np.random.RandomState(12)
    m = _int8_linear(rng, 64, 16) if kind == "int8" else _nf4_linear(rng, 64, 16)
    x = _t(rng.randn(3, 64))
    y = _np(m(x))
    m2 = pickle.loads(pickle.dumps(m))
    np.testing.assert_array_equal(_np(m2(x)), y)
    if kind == "int8":
        assert _raw(m2.weight.SCB) == _raw(m.weight.SCB)
    else:
        assert m2.weight.bnb_quantized and _raw(m2.weight.quant_state.absmax) == _raw(m.weight.quant_state.absmax)


# ---- 4-bit matmul ---------------------------------------------------------------------------------------
def test_980_658_matmul_4bit_3d_4d_input_with_bias():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/980 ("breaks for 4 dimensions") and
    # /issues/658 (bnb.matmul with a 4-D input from LayoutLMv3): batched inputs with a bias, against numpy
    rng = np.random.RandomState(13)
    m = _nf4_linear(rng, 64, 40)
    W = _w4(m)
    for shape in ((2, 3, 64), (2, 2, 3, 64)):
        x = _t(rng.randn(*shape))
        y = m(x)
        assert tuple(y.shape) == shape[:-1] + (40,)
        ref = _np(x).astype(np.float64) @ W.T + _np(m.bias)
        np.testing.assert_allclose(_np(y), ref, rtol=0, atol=1e-4 * np.abs(ref).max())
        y2 = bnb.matmul_4bit(x, m.weight.t(), m.weight.quant_state, bias=m.bias)
        np.testing.assert_allclose(_np(y2), ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    # LLM.int8() with a 4-D input (the #658 case)
    m8 = _int8_linear(rng, 64, 24)
    x = _t(rng.randn(2, 2, 3, 64))
    y = _np(m8(x))
    assert y.shape == (2, 2, 3, 24)
    np.testing.assert_array_equal(y.reshape(-1, 24), _np(m8(x.reshape(-1, 64))))
    W8 = _np(m8.weight).astype(np.float64) * _np(m8.weight.SCB)[:, None] / 127
    ref = _np(x).astype(np.float64) @ W8.T + _np(m8.bias)
    np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())


def test_1235_matmul_4bit_out_argument():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1235: matmul_4bit(a, b, out=output) left
    # `output` unchanged (fixed in 0.50: MatMul4Bit copies into out and returns it), rows 1 (gemv) and several
    rng = np.random.RandomState(14)
    m = _nf4_linear(rng, 64, 32)
    W = _w4(m)
    for rows in (1, 4):
        a = _t(rng.randn(rows, 64))
        out = torch.full((rows, 32), 5.0)
        r = bnb.matmul_4bit(a, m.weight.t(), m.weight.quant_state, out=out, bias=m.bias)
        ref = _np(a).astype(np.float64) @ W.T + _np(m.bias)
        np.testing.assert_allclose(_np(out), ref, rtol=0, atol=1e-4 * np.abs(ref).max())
        np.testing.assert_array_equal(_np(r), _np(out))


def test_1862_gemv_4bit_batch_one():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1862: the gemv_4bit path (one input row,
    # the decode step) with the nn.Linear (out_features, in_features) layout, against numpy
    rng = np.random.RandomState(15)
    for nested in (False, True):
        W = _t(rng.randn(48, 128) * 0.05)
        q, qs = F.quantize_4bit(W, blocksize=64, quant_type="nf4", compress_statistics=nested)
        Wd = _np(F.dequantize_4bit(q, qs)).astype(np.float64)
        if not nested:
            np.testing.assert_array_equal(Wd.reshape(-1).astype(np.float32), _check_4bit(_np(W), q, qs, 64))
        for shape in ((1, 128), (1, 1, 128)):
            A = _t(rng.randn(*shape))
            y = F.gemv_4bit(A, q.t(), state=qs)
            assert tuple(y.shape) == shape[:-1] + (48,)
            ref = _np(A).astype(np.float64) @ Wd.T
            np.testing.assert_allclose(_np(y), ref, rtol=0, atol=1e-5 * np.abs(ref).max())
            y2 = bnb.matmul_4bit(A, q.t(), qs)
            np.testing.assert_allclose(_np(y2), ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_1623_linear4bit_compute_dtype_kept():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1623: Linear4bit(compute_dtype=bfloat16)
    # fed float32 inputs overwrote compute_dtype with float32 (compute_type_is_set was False); the matmul
    # runs in bfloat16 and the output comes back in the input's dtype
    rng = np.random.RandomState(16)
    m = _nf4_linear(rng, 64, 16, compute_dtype=ms.bfloat16)
    x = _t(rng.randn(3, 64))
    y = m(x)
    assert m.compute_dtype == ms.bfloat16
    assert y.dtype == ms.float32
    ref = _np(x).astype(np.float64) @ _w4(m).T + _np(m.bias)
    err = np.abs(_np(y) - ref).max() / np.abs(ref).max()
    assert 0 < err < 3e-2  # bf16 arithmetic: not the float32 result, within bf16 rounding


# ---- embeddings --------------------------------------------------------------------------------------------
def test_1292_embedding8bit_embedding4bit():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1292 (Embedding4bit / Embedding8bit: load
    # an fp weight through load_state_dict, quantize, look rows up) and /issues/1082 (the feature request)
    rng = np.random.RandomState(17)
    V, D = 20, 64
    W = rng.randn(V, D).astype(np.float32)
    idx = torch.tensor(np.array([[0, 5, 19], [3, 3, 7]], np.int64))
    e8 = bnb.nn.Embedding8bit(V, D)
    e8.load_state_dict({"weight": _t(W)})
    e8 = e8.to("cpu")
    y8 = _np(e8(idx))
    scb = np.abs(W).max(axis=1)
    CB = np.round(W * 127 / scb[:, None])
    ref8 = (CB * scb[:, None] / 127)[_np(idx)]
    np.testing.assert_allclose(y8, ref8, rtol=0, atol=1e-6)
    e4 = bnb.nn.Embedding4bit(V, D, quant_type="nf4")
    e4.load_state_dict({"weight": _t(W)})
    e4 = e4.to("cpu")
    y4 = _np(e4(idx))
    ref4 = _check_4bit(W, e4.weight, e4.weight.quant_state, e4.weight.quant_state.blocksize)
    np.testing.assert_array_equal(y4, ref4.reshape(V, D)[_np(idx)])


# ---- NaN / Inf -------------------------------------------------------------------------------------------
def test_1884_zero_blocks_no_nan():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1884 ("produces no NaN or Inf values") and
    # /issues/1071: an all-zero block has absmax 0 and must dequantize to exact zeros, not 0/0 = NaN
    x = np.zeros((4, 64), np.float32)
    x[1] = np.linspace(-1, 1, 64)
    q4, s4 = F.quantize_4bit(_t(x), blocksize=64, quant_type="nf4")
    out4 = _np(F.dequantize_4bit(q4, s4))
    assert np.all(np.isfinite(out4)) and np.all(out4[[0, 2, 3]] == 0)
    np.testing.assert_array_equal(out4.reshape(-1), _check_4bit(x, q4, s4, 64))
    q8, s8 = F.quantize_blockwise(_t(x), blocksize=64)
    out8 = _np(F.dequantize_blockwise(q8, s8))
    assert np.all(np.isfinite(out8)) and np.all(out8[[0, 2, 3]] == 0)
    # LLM.int8(): an all-zero input row and an all-zero weight row give zeros, not NaN (SCB 0)
    rng = np.random.RandomState(18)
    m = bnb.nn.Linear8bitLt(64, 8, bias=False, has_fp16_weights=False)
    Wn = rng.randn(8, 64).astype(np.float32)
    Wn[2] = 0
    m.weight = bnb.nn.Int8Params(_t(Wn), requires_grad=False, has_fp16_weights=False)
    m = m.to("cpu").eval()
    xi = rng.randn(3, 64).astype(np.float32)
    xi[1] = 0
    y = _np(m(_t(xi)))
    assert np.all(np.isfinite(y)) and np.all(y[1] == 0) and np.all(y[:, 2] == 0)


# ---- 8-bit optimizers --------------------------------------------------------------------------------------
def _adam_np(p, g, m, v, step, lr, b1, b2, eps, wd):
    """torch.optim.AdamW in float64 (decoupled weight decay)."""
    p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mh, vh = m / (1 - b1 ** step), v / (1 - b2 ** step)
    return p - lr * mh / (np.sqrt(vh) + eps), m, v


def _params(rng, shapes):
    return [torch.nn.Parameter(_t(rng.randn(*s) * 0.1)) for s in shapes]


def test_1261_min_8bit_size_and_param_groups():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1261 (what min_8bit_size does in the 8-bit
    # optimizers): tensors with fewer than min_8bit_size (4096) elements keep 32-bit state, the others 8-bit;
    # several param groups keep their own hyper-parameters. Small tensors against numpy AdamW.
    rng = np.random.RandomState(19)
    small_a, small_b, big = _params(rng, [(8, 16), (100,), (64, 64)])
    opt = bnb.optim.AdamW8bit([{"params": [small_a, big], "lr": 1e-2},
                               {"params": [small_b], "lr": 3e-3, "weight_decay": 0.1}],
                              betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    ref = {id(p): [_np(p).astype(np.float64), 0.0, 0.0] for p in (small_a, small_b)}
    hyper = {id(small_a): (1e-2, 0.0), id(small_b): (3e-3, 0.1)}
    for step in (1, 2, 3):
        grads = [rng.randn(*p.shape).astype(np.float32) for p in (small_a, big, small_b)]
        opt.step(grads=[_t(g) for g in grads])
        for p, g in ((small_a, grads[0]), (small_b, grads[2])):
            r = ref[id(p)]
            lr, wd = hyper[id(p)]
            r[0], r[1], r[2] = _adam_np(r[0], g.astype(np.float64), r[1], r[2], step, lr, 0.9, 0.99, 1e-8, wd)
            np.testing.assert_allclose(_np(p), r[0], rtol=0, atol=1e-6)
    assert opt.state[small_a]["state1"].dtype == ms.float32 and opt.state[small_b]["state2"].dtype == ms.float32
    assert opt.state[big]["state1"].dtype == ms.uint8 and opt.state[big]["state2"].dtype == ms.uint8
    assert opt.state[big]["absmax1"].shape[0] == 4096 // 256  # upstream's 8-bit optimizer blocksize 256


def test_1269_override_config_after_register():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/1269 (fixed by PR #1869):
    # GlobalOptimManager.override_config called after register_parameters (the documented order) was ignored
    rng = np.random.RandomState(20)
    emb, lin = _params(rng, [(64, 80), (64, 80)])
    mng = bnb.optim.GlobalOptimManager.get_instance()
    mng.register_parameters([emb, lin])
    try:
        mng.override_config(emb, "optim_bits", 32)
        opt = bnb.optim.Adam8bit([emb, lin], lr=1e-3)
        opt.step(grads=[_t(rng.randn(64, 80)), _t(rng.randn(64, 80))])
        assert opt.state[emb]["state1"].dtype == ms.float32
        assert opt.state[lin]["state1"].dtype == ms.uint8
    finally:
        mng.initialize()


def _adamw8(params):
    return bnb.optim.AdamW8bit([{"params": params[:1], "lr": 2e-3}, {"params": params[1:], "lr": 1e-3}],
                               weight_decay=0.01)


def _grads(seed, params):
    rng = np.random.RandomState(seed)
    return [_t(rng.randn(*p.shape)) for p in params]


def _train_pair(shapes):
    """An AdamW8bit run of 2 steps and a fresh optimizer over copies of the parameters."""
    rng = np.random.RandomState(21)
    params = _params(rng, shapes)
    opt = _adamw8(params)
    for s in (1, 2):
        opt.step(grads=_grads(s, params))
    params2 = [torch.nn.Parameter(_t(_np(p))) for p in params]
    return params, opt, params2, _adamw8(params2)


SHAPES = [(64, 80), (10, 10), (4096,)]


def test_782_optimizer_state_dict_round_trip():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/issues/782 ("Trouble resuming from checkpoint"):
    # an 8-bit optimizer's state_dict reloaded into a fresh optimizer continues bit-identically
    params, opt, params2, opt2 = _train_pair(SHAPES)
    sd = opt.state_dict()
    opt2.load_state_dict(sd)
    assert [g["lr"] for g in opt2.param_groups] == [2e-3, 1e-3]
    for s in (3, 4):
        opt.step(grads=_grads(s, params))
        opt2.step(grads=_grads(s, params2))
    for p, p2 in zip(params, params2):
        assert _raw(p) == _raw(p2)
    for p, p2 in zip(params, params2):
        for k, v in opt.state[p].items():
            if isinstance(v, ms.Tensor):
                assert _raw(v) == _raw(opt2.state[p2][k]), k


def test_1840_load_upstream_wrapped_optimizer_state_dict():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1840 (for /issues/89): upstream 0.50's
    # Optimizer8bit.state_dict() nests the quantization tensors (state1, state2, qmap1, absmax1, ...) of each
    # parameter under "__bnb_optimizer_quant_state__" and load_state_dict unwraps them; a state dict saved by
    # upstream must load here and continue bit-identically
    params, opt, params2, opt2 = _train_pair(SHAPES)
    wrapped_keys = {"qmap1", "qmap2", "max1", "max2", "new_max1", "new_max2", "state1", "state2", "gnorm_vec",
                    "absmax1", "absmax2", "unorm_vec"}  # upstream's non_castable_tensor_keys
    sd = opt.state_dict()
    for st in sd["state"].values():
        inner = {k: st.pop(k) for k in list(st) if k in wrapped_keys}
        st["__bnb_optimizer_quant_state__"] = inner
    opt2.load_state_dict(sd)
    for s in (3, 4):
        opt.step(grads=_grads(s, params))
        opt2.step(grads=_grads(s, params2))
    for p, p2 in zip(params, params2):
        assert _raw(p) == _raw(p2)


def test_1647_load_pre_044_optimizer_state_dict():
    # https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1647 (unslothai/unsloth#1080): a state dict
    # saved by bitsandbytes < 0.44 has param groups without the AdEMAMix keys alpha / t_alpha / t_beta3 added
    # in 0.44; resuming from it must work (upstream defaults them to 0) and continue bit-identically
    params, opt, params2, opt2 = _train_pair(SHAPES)
    sd = opt.state_dict()
    for g in sd["param_groups"]:
        for k in ("alpha", "t_alpha", "t_beta3"):
            g.pop(k, None)
    opt2.load_state_dict(sd)
    for s in (3, 4):
        opt.step(grads=_grads(s, params))
        opt2.step(grads=_grads(s, params2))
    for p, p2 in zip(params, params2):
        assert _raw(p) == _raw(p2)
