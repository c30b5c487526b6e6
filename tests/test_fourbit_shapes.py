"""4-bit shape trust (issue 15 item 3): a packed weight and its QuantState must agree exactly with
``quant_state.shape`` and ``blocksize`` (dequantize_4bit, gemv_4bit, linear_4bit, matmul_4bit), tiny weights keep
their shape, bnb.matmul_4bit rejects shapes that match neither orientation, and Linear4bit refuses a state dict of
another shape (naming the key, the expected and the found shape) instead of computing through the deprecated
[K, N] branch."""

import copy
import warnings

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401  (before `import torch`: torch becomes mindtorch)

import bitsandbytes_ms as bnb
import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _hostcall as H
from bitsandbytes_ms import _reference as R

import torch  # noqa: E402  (mindtorch)


def _w(shape, seed=0):
    return ms.Tensor((np.random.RandomState(seed).randn(*shape) * 0.5).astype(np.float32))


def _ref_dequant(packed, qs):
    n = int(np.prod(qs.shape))
    absmax = F._absmax_4bit(qs).asnumpy()
    return R.dequantize_4bit(F._as_uint8(packed).asnumpy(), absmax, qs.code.asnumpy(), qs.blocksize, n,
                             fp4=qs.quant_type == "fp4").reshape(qs.shape)


# ---- tiny weights and transposed views ---------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (2, 2), (1,), (2,), (1, 1, 2)])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_tiny_weights_keep_their_shape(shape, quant_type):
    """A weight of 1 or 2 values packs to [1, 1]: that is the weight itself, not a transposed view (upstream
    transposes it, giving a [2, 1] result for a [1, 2] weight)."""
    W = _w(shape)
    packed, qs = F.quantize_4bit(W, quant_type=quant_type)
    out = F.dequantize_4bit(packed, qs)
    assert tuple(out.shape) == shape
    np.testing.assert_array_equal(out.asnumpy(), _ref_dequant(packed, qs))
    # within the 4-bit error of the weight itself (a transposed result would not even have its shape)
    assert np.abs(out.asnumpy() - W.asnumpy()).max() <= np.abs(W.asnumpy()).max() * 0.2


@pytest.mark.parametrize("shape", [(1, 4), (4, 1), (3, 5), (64, 32)])
def test_transposed_view_gives_the_transposed_weight(shape):
    W = _w(shape, seed=1)
    packed, qs = F.quantize_4bit(W, quant_type="nf4")
    assert packed.shape[0] > 1 and packed.shape[1] == 1
    ref = _ref_dequant(packed, qs)
    out_t = F.dequantize_4bit(packed.t(), qs)
    assert tuple(out_t.shape) == shape[::-1]
    np.testing.assert_array_equal(out_t.asnumpy(), ref.T)


# ---- exact sizes: another blocksize, shape or length decodes garbage ----------------------------------------------
def _state(nested=False, shape=(64, 32), blocksize=64, storage=ms.uint8):
    return F.quantize_4bit(_w(shape, seed=2), quant_type="nf4", blocksize=blocksize, compress_statistics=nested,
                           quant_storage=storage)


def _with(qs, **kw):
    q = copy.deepcopy(qs)
    for k, v in kw.items():
        setattr(q, k, v)
    return q


def _cat(t):
    return ms.Tensor(np.concatenate([t.asnumpy()] * 2))


@pytest.mark.parametrize("nested", [False, True])
def test_dequantize_4bit_rejects_another_blocksize_shape_or_length(nested):
    packed, qs = _state(nested)
    np.testing.assert_array_equal(F.dequantize_4bit(packed, qs).asnumpy(), _ref_dequant(packed, qs))
    for bs, need in ((128, 16), (32, 64)):  # the absmax entries say which blocksize the bytes were made with
        with pytest.raises(ValueError, match=rf"dequantize_4bit: quant_state.absmax has 32 entries; quant_state.shape "
                                             rf"\(64, 32\) at blocksize {bs} needs exactly ceil\(2048/{bs}\) = {need}"):
            F.dequantize_4bit(packed, _with(qs, blocksize=bs))
    with pytest.raises(ValueError, match=r"`A` holds 1024 bytes; quant_state.shape \(32, 32\) needs exactly 512"):
        F.dequantize_4bit(packed, _with(qs, shape=(32, 32)))
    with pytest.raises(ValueError, match=r"`A` holds 2048 bytes; quant_state.shape \(64, 32\) needs exactly 1024"):
        F.dequantize_4bit(_cat(packed), qs)  # longer is as wrong as shorter
    with pytest.raises(ValueError, match=r"`A` holds 1023 bytes"):
        F.dequantize_4bit(packed[:-1], qs)
    with pytest.raises(ValueError, match=r"quant_state.absmax has 64 entries; .* needs exactly ceil\(2048/64\) = 32"):
        F.dequantize_4bit(packed, _with(qs, absmax=_cat(qs.absmax)))
    if nested:
        s2 = _with(qs.state2, absmax=_cat(qs.state2.absmax))
        with pytest.raises(ValueError, match=r"quant_state.state2.absmax has 2 entries; 32 absmax codes at nested "
                                             r"blocksize 256 need exactly ceil\(32/256\) = 1"):
            F.dequantize_4bit(packed, _with(qs, state2=s2))


def test_dequantize_4bit_without_quant_state_checks_absmax_against_out():
    packed, qs = _state()
    out = ms.Tensor(np.zeros((64, 32), np.float32))
    res = F.dequantize_4bit(packed, absmax=qs.absmax, out=out, blocksize=64, quant_type="nf4")
    np.testing.assert_array_equal(res.asnumpy(), _ref_dequant(packed, qs))
    with pytest.raises(ValueError, match=r"quant_state.absmax has 32 entries; .* at blocksize 256 needs exactly"):
        F.dequantize_4bit(packed, absmax=qs.absmax, out=out, blocksize=256, quant_type="nf4")


def test_storage_dtypes_count_bytes():
    packed, qs = _state(storage=ms.float32)  # 1024 bytes as 256 float32 words
    assert tuple(packed.shape) == (256, 1)
    np.testing.assert_array_equal(F.dequantize_4bit(packed, qs).asnumpy(), _ref_dequant(packed, qs))
    with pytest.raises(ValueError, match=r"`A` holds 1020 bytes; quant_state.shape \(64, 32\) needs exactly 1024"):
        F.dequantize_4bit(packed[:-1], qs)


@pytest.mark.parametrize("host", [True, False], ids=["hostcall", "ops_custom"])
@pytest.mark.parametrize("nested", [False, True])
def test_gemv_4bit_rejects_another_blocksize_or_length(nested, host):
    packed, qs = _state(nested)
    x = _w((1, 32), seed=3)
    old = H.set_enabled(host)
    try:
        good = F.gemv_4bit(x, packed.t(), state=qs).asnumpy()
        ref = x.asnumpy() @ _ref_dequant(packed, qs).T
        np.testing.assert_allclose(good, ref, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match=r"gemv_4bit: state.absmax has 32 entries; state.shape \(64, 32\) at "
                                             r"blocksize 128 needs exactly ceil\(2048/128\) = 16"):
            F.gemv_4bit(x, packed.t(), state=_with(qs, blocksize=128))
        with pytest.raises(ValueError, match=r"gemv_4bit: `B` holds 2048 bytes; state.shape \(64, 32\) needs exactly "
                                             r"1024"):
            F.gemv_4bit(x, _cat(packed).t(), state=qs)
        with pytest.raises(ValueError, match=r"gemv_4bit: state.absmax has 64 entries"):
            F.gemv_4bit(x, packed.t(), state=_with(qs, absmax=_cat(qs.absmax)))
    finally:
        H.set_enabled(old)


def test_linear_4bit_rejects_longer_weight_and_absmax():
    packed, qs = _state()
    x = _w((3, 32), seed=4)
    with pytest.raises(ValueError, match=r"linear_4bit: `B` holds 2048 bytes; quant_state.shape \(64, 32\) needs "
                                         r"exactly 1024"):
        F.linear_4bit(x, _cat(packed), qs)
    with pytest.raises(ValueError, match=r"linear_4bit: quant_state.absmax has 64 entries"):
        F.linear_4bit(x, packed, _with(qs, absmax=_cat(qs.absmax)))


# ---- bnb.matmul_4bit ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rows", [3, 40])  # the fused call (<= 32 rows) and dequantize + matmul
def test_matmul_4bit_rejects_mismatched_shapes(rows):
    packed, qs = _state()
    x = _w((rows, 32), seed=5)
    ref = x.asnumpy() @ _ref_dequant(packed, qs).T
    np.testing.assert_allclose(bnb.matmul_4bit(x, packed.t(), qs).asnumpy(), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"matmul_4bit: `A` must have last dimension 32 \(quant_state.shape\[1\]\); "
                                         rf"got shape \({rows}, 48\)"):
        bnb.matmul_4bit(_w((rows, 48)), packed.t(), qs)
    with pytest.raises(ValueError, match=r"matmul_4bit: `B` holds 2048 bytes; quant_state.shape \(64, 32\) needs "
                                         r"exactly 1024"):
        bnb.matmul_4bit(x, _cat(packed).t(), qs)
    with pytest.raises(ValueError, match=r"matmul_4bit: quant_state.absmax has 32 entries; .* at blocksize 128"):
        bnb.matmul_4bit(x, packed.t(), _with(qs, blocksize=128))
    for b in (np.zeros(1, np.float32), np.zeros(5, np.float32)):  # a 1-element bias would broadcast silently
        with pytest.raises(ValueError, match=r"matmul_4bit: `bias` must have 64 elements \(the output features\)"):
            bnb.matmul_4bit(x, packed.t(), qs, bias=ms.Tensor(b))
    with pytest.raises(ValueError, match=rf"matmul_4bit: `out` must have shape \({rows}, 64\)"):
        bnb.matmul_4bit(x, packed.t(), qs, out=ms.Tensor(np.zeros((rows, 32), np.float32)))


def test_matmul_4bit_kn_orientation_still_runs_with_a_warning():
    """Upstream 0.50.2's deprecated [K, N] weight (A's last dimension equals quant_state.shape[0]): x @ W, with
    a DeprecationWarning; a square weight is always [N, K]."""
    packed, qs = _state(shape=(64, 32))
    x = _w((3, 64), seed=6)
    with pytest.warns(DeprecationWarning, match="This will be an error in a future version"):
        out = bnb.matmul_4bit(x, packed, qs)
    np.testing.assert_allclose(out.asnumpy(), x.asnumpy() @ _ref_dequant(packed, qs), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"`bias` must have 32 elements"):
        bnb.matmul_4bit(x, packed, qs, bias=ms.Tensor(np.zeros(64, np.float32)))


# ---- Linear4bit --------------------------------------------------------------------------------------------------
def _linear(i, o, bias, nested, quantize=True):
    torch.manual_seed(0)
    lin = bnb.nn.Linear4bit(i, o, bias=bias, quant_type="nf4", compress_statistics=nested)
    return lin.to("cpu") if quantize else lin


@pytest.mark.parametrize("quantized", [False, True], ids=["fresh", "quantized"])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_linear4bit_refuses_a_state_dict_of_another_shape(bias, nested, quantized):
    src = _linear(64, 32, bias, nested)
    dst = _linear(32, 64, bias, nested, quantize=quantized)
    before = {k: v.asnumpy().copy() for k, v in dst.state_dict().items() if hasattr(v, "asnumpy")}
    with pytest.raises(RuntimeError, match=r"size mismatch for weight: copying a 4-bit weight of shape \(32, 64\) "
                                           r"\(weight.quant_state.bitsandbytes__nf4\), the shape in current model is "
                                           r"\(64, 32\) \(out_features, in_features\)"):
        dst.load_state_dict(src.state_dict())
    # the layer is left as it was, and still computes its own [64, 32] weight
    after = {k: v.asnumpy() for k, v in dst.state_dict().items() if hasattr(v, "asnumpy")}
    assert sorted(after) == sorted(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert tuple(dst(torch.randn(5, 32)).shape) == (5, 64)


@pytest.mark.parametrize("nested", [False, True])
def test_linear4bit_refuses_truncated_or_longer_tensors(nested):
    sd = _linear(64, 32, True, nested).state_dict()
    cases = {"weight": (sd["weight"][:-1], r"size mismatch: weight holds 1023 bytes; the shape in "
                                           r"weight.quant_state.bitsandbytes__nf4 \(32, 64\) needs exactly 1024"),
             "weight.absmax": (_cat(sd["weight.absmax"]),
                               r"size mismatch: weight.absmax has 64 entries; the shape in "
                               r"weight.quant_state.bitsandbytes__nf4 \(32, 64\) at blocksize 64 needs exactly "
                               r"ceil\(2048/64\) = 32")}
    if nested:
        cases["weight.nested_absmax"] = (_cat(sd["weight.nested_absmax"]),
                                         r"size mismatch: weight.nested_absmax has 2 entries; 32 absmax codes at "
                                         r"nested blocksize 256 need exactly ceil\(32/256\) = 1")
    for key, (bad, msg) in cases.items():
        dst = _linear(64, 32, True, nested, quantize=False)
        with pytest.raises(RuntimeError, match=msg):
            dst.load_state_dict({**sd, key: bad})
        assert not dst.weight.bnb_quantized  # untouched: still the float weight it was made with
    dst = _linear(64, 32, True, nested, quantize=False)
    dst.load_state_dict(sd)
    x = torch.randn(4, 64)
    src = _linear(64, 32, True, nested)
    np.testing.assert_array_equal(dst(x).numpy(), src(x).numpy())


@pytest.mark.parametrize("key,bad,msg", [
    ("weight.quant_map", lambda t: t[:8], r"weight.quant_map: expected the 16-entry 4-bit code, float32 with 16 "
                                          r"elements; got float32 shape \(8,\)"),
    ("weight.quant_map", lambda t: t.half(), r"weight.quant_map: .*; got float16 shape \(16,\)"),
    ("weight.absmax", lambda t: t.float(), r"weight.absmax: expected 8-bit codes of the block absmax \(nested\), "
                                           r"uint8; got float32 shape \(32,\)"),
    ("weight.nested_absmax", lambda t: t.half(), r"weight.nested_absmax: expected the nested block absmax, float32; "
                                                 r"got float16 shape \(1,\)"),
    ("weight.nested_quant_map", lambda t: t[:8], r"weight.nested_quant_map: expected the 256-entry 8-bit code, "
                                                 r"float32 with 256 elements; got float32 shape \(8,\)"),
])
def test_linear4bit_refuses_codes_and_dtypes_at_load(key, bad, msg):
    """Tensors of the quant state that forward would refuse (or decode with) are refused by load_state_dict,
    naming the key (was: "All keys matched", then an error from linear_4bit naming quant_state fields)."""
    sd = _linear(64, 32, True, True).state_dict()
    dst = _linear(64, 32, True, True, quantize=False)
    with pytest.raises(RuntimeError, match=msg):
        dst.load_state_dict({**sd, key: bad(sd[key])})
    assert not dst.weight.bnb_quantized


@pytest.mark.parametrize("rows", [1, 4, 40])
def test_linear4bit_forward_rejects_the_other_orientation(rows):
    """x with out_features columns used to run matmul_4bit's [K, N] branch (40 rows) and return garbage."""
    lin = _linear(64, 32, True, False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuple(lin(torch.randn(rows, 64)).shape) == (rows, 32)
    with pytest.raises(ValueError, match=rf"Linear4bit: `x` must have last dimension 64 \(in_features\); got shape "
                                         rf"\({rows}, 32\)"):
        lin(torch.randn(rows, 32))
