"""Upstream 0.50.2 API items of issue 15: Linear4bit casts its bias parameter to the compute dtype in place,
Params4bit.from_prequantized defaults to device="cuda", the MatMul8bitLt / MatMul8bitFp / MatMul4Bit classes have
upstream's forward(ctx, ...) / backward(ctx, grad_output) static methods, and Params4bit.xpu() /
Int8Params.xpu() exist and raise a clear error here."""

import inspect
from types import SimpleNamespace

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401  (before `import torch`: torch becomes mindtorch)

import bitsandbytes_ms as bnb
import bitsandbytes_ms.functional as F
from bitsandbytes_ms.autograd._functions import MatMul4Bit, MatMul8bitFp, MatMul8bitLt, MatmulLtState
from bitsandbytes_ms.nn import Int8Params, Linear4bit, Params4bit

import torch  # noqa: E402  (mindtorch)


def _arr(shape, seed, scale=1.0):
    return (np.random.RandomState(seed).randn(*shape) * scale).astype(np.float32)


# ---- Linear4bit: the bias parameter is cast in place ------------------------------------------------------------
@pytest.mark.parametrize("in_dtype, compute_dtype, bias_after", [
    (ms.float16, None, ms.float16),       # upstream's test_linear_kbit_fp32_bias (NF4)
    (ms.bfloat16, None, ms.bfloat16),
    (ms.float32, None, ms.float32),
    (ms.float32, ms.bfloat16, ms.bfloat16),  # fp32 input, bf16 compute: the bias goes to the compute dtype
    (ms.float16, ms.float32, ms.float32),
], ids=["fp16", "bf16", "fp32", "fp32-compute-bf16", "fp16-compute-fp32"])
@pytest.mark.parametrize("rows", [2, 40])  # the fused call and dequantize + matmul
def test_linear4bit_casts_its_bias_in_place(in_dtype, compute_dtype, bias_after, rows):
    lin = Linear4bit(32, 16, quant_type="nf4", compute_dtype=compute_dtype).to("cpu")
    b32 = _arr((16,), 1)
    lin.bias.data = torch.tensor(b32)
    bias_param = lin.bias
    x = torch.tensor(_arr((rows, 32), 2)).to(in_dtype)
    y = lin(x)
    assert lin.bias is bias_param and lin.bias.dtype == bias_after  # the same Parameter, its data cast
    np.testing.assert_array_equal(lin.bias.float().numpy(),
                                  torch.tensor(b32).to(bias_after).float().numpy())
    # the output: the 4-bit matmul in the compute dtype plus that rounded bias, back in the input's dtype
    cdt = compute_dtype or in_dtype
    W = F.dequantize_4bit(lin.weight, lin.weight.quant_state).asnumpy()
    ref = x.to(cdt).float().numpy() @ W.T + lin.bias.float().numpy()
    tol = {ms.float32: 1e-5, ms.float16: 2e-2, ms.bfloat16: 0.1}
    np.testing.assert_allclose(y.float().numpy(), ref, rtol=tol[cdt] + tol[in_dtype], atol=tol[cdt] + tol[in_dtype])
    assert y.dtype == in_dtype
    lin(x)  # a second call: nothing more to cast
    assert lin.bias.dtype == bias_after


# ---- Params4bit.from_prequantized -------------------------------------------------------------------------------
def test_from_prequantized_defaults_to_cuda_as_upstream_and_runs_here():
    assert inspect.signature(Params4bit.from_prequantized).parameters["device"].default == "cuda"
    src = Linear4bit(32, 16, quant_type="nf4").to("cpu")
    stats = {k[len("weight."):]: v for k, v in src.state_dict().items() if k.startswith("weight.")}
    p = Params4bit.from_prequantized(src.weight.data, stats)  # device="cuda": accepted, MindSpore keeps it here
    assert p.bnb_quantized and p.quant_state.shape == (16, 32)
    np.testing.assert_array_equal(F.dequantize_4bit(p, p.quant_state).asnumpy(),
                                  F.dequantize_4bit(src.weight, src.weight.quant_state).asnumpy())


# ---- MatMul* forward/backward static methods --------------------------------------------------------------------
@pytest.mark.parametrize("cls", [MatMul8bitLt, MatMul8bitFp, MatMul4Bit])
def test_matmul_classes_have_static_forward_and_backward(cls):
    for name in ("forward", "backward"):
        assert isinstance(inspect.getattr_static(cls, name), staticmethod), name
    params = list(inspect.signature(cls.forward).parameters)
    assert params == ["ctx", "A", "B", "out", "bias", "quant_state" if cls is MatMul4Bit else "state"]
    assert list(inspect.signature(cls.backward).parameters) == ["ctx", "grad_output"]


def _int8_case(threshold):
    A = ms.Tensor(_arr((5, 24), 3))
    W = ms.Tensor(_arr((12, 24), 4, 0.2))
    bias = ms.Tensor(_arr((12,), 5))
    st = MatmulLtState()
    st.threshold, st.has_fp16_weights, st.is_training = threshold, True, False
    return A, W, bias, st


@pytest.mark.parametrize("cls", [MatMul8bitLt, MatMul8bitFp])
@pytest.mark.parametrize("threshold", [0.0, 1.5])
def test_int8_forward_backward_by_hand_match_autograd(cls, threshold):
    A, W, bias, st = _int8_case(threshold)
    ctx = SimpleNamespace()
    y = cls.forward(ctx, A, W, None, bias, st)
    g = ms.Tensor(_arr((5, 12), 6))
    gA, gB, gout, gbias, gstate = cls.backward(ctx, g)
    assert gout is None and gstate is None
    # the same as MindSpore's autograd through apply() (the custom bprop)
    st2 = _int8_case(threshold)[3]

    def loss(a, w, b):
        return (cls.apply(a, w, None, b, st2) * g).sum()

    y2 = cls.apply(A, W, None, bias, _int8_case(threshold)[3])
    np.testing.assert_array_equal(y.asnumpy(), y2.asnumpy())
    _, (rA, rB, rbias) = ms.value_and_grad(loss, grad_position=(0, 1, 2))(A, W, bias)
    np.testing.assert_array_equal(gA.asnumpy(), rA.asnumpy())
    np.testing.assert_array_equal(gB.asnumpy(), rB.asnumpy())
    np.testing.assert_array_equal(gbias.asnumpy(), rbias.asnumpy())
    np.testing.assert_allclose(gbias.asnumpy(), g.asnumpy().sum(0), rtol=1e-6)
    # torch's ctx.needs_input_grad: no gradient computed where none is asked for
    ctx.needs_input_grad = (True, False, False, False, False)
    gA2, gB2, _, gbias2, _ = cls.backward(ctx, g)
    assert gB2 is None and gbias2 is None
    np.testing.assert_array_equal(gA2.asnumpy(), gA.asnumpy())


@pytest.mark.parametrize("rows", [3, 40])
def test_4bit_forward_backward_by_hand_match_autograd(rows):
    Wf = ms.Tensor(_arr((16, 32), 7, 0.3))
    packed, qs = F.quantize_4bit(Wf, quant_type="nf4")
    A = ms.Tensor(_arr((rows, 32), 8))
    bias = ms.Tensor(_arr((16,), 9))
    ctx = SimpleNamespace()
    y = MatMul4Bit.forward(ctx, A, packed.t(), None, bias, qs)
    np.testing.assert_array_equal(y.asnumpy(), bnb.matmul_4bit(A, packed.t(), qs, bias=bias).asnumpy())
    g = ms.Tensor(_arr((rows, 16), 10))
    gA, gB, gout, gbias, gstate = MatMul4Bit.backward(ctx, g)
    assert gB is None and gout is None and gstate is None

    def loss(a, b):
        return (MatMul4Bit.apply(a, packed.t(), None, b, qs) * g).sum()

    _, (rA, rbias) = ms.value_and_grad(loss, grad_position=(0, 1))(A, bias)
    np.testing.assert_array_equal(gA.asnumpy(), rA.asnumpy())
    np.testing.assert_array_equal(gbias.asnumpy(), rbias.asnumpy())
    W = F.dequantize_4bit(packed, qs).asnumpy()
    np.testing.assert_allclose(gA.asnumpy(), g.asnumpy() @ W, rtol=1e-5, atol=1e-5)
    ctx.needs_input_grad = (False, False, False, True, False)
    r = MatMul4Bit.backward(ctx, g)
    assert r[0] is None and r[3] is not None


# ---- .xpu() -----------------------------------------------------------------------------------------------------
def test_xpu_exists_and_raises_a_clear_error():
    p = Params4bit(torch.tensor(_arr((8, 16), 11)), quant_type="nf4")
    with pytest.raises(RuntimeError, match=r"Params4bit.xpu\(\): bitsandbytes_ms has no Intel XPU backend"):
        p.xpu()
    assert not p.bnb_quantized  # nothing was quantized on the way
    q = Int8Params(torch.tensor(_arr((8, 16), 12)), has_fp16_weights=False)
    with pytest.raises(RuntimeError, match=r"Int8Params.xpu\(\): bitsandbytes_ms has no Intel XPU backend"):
        q.xpu("xpu:0")
    assert q.dtype == ms.float32
    assert q.xpu("cpu").dtype == ms.int8  # an explicit other device is an ordinary .to(device): quantized
    e = bnb.nn.Embedding8bit(10, 8)  # its weight (upstream: an Int8Params) has the same three device methods
    with pytest.raises(RuntimeError, match=r"\.xpu\(\): bitsandbytes_ms has no Intel XPU backend"):
        e.weight.xpu()
    assert e.weight.dtype == ms.float32
    assert e.weight.cpu().dtype == ms.int8


# ---- MatmulLtState: upstream's dataclass fields in upstream's order ----------------------------------------------
def test_matmul_lt_state_fields_and_deprecated_attributes_as_upstream():
    import dataclasses
    import warnings

    from bitsandbytes_ms.autograd._functions import GlobalOutlierPooler

    # upstream 0.50.2's fields (the annotated class attributes), in order
    assert [f.name for f in dataclasses.fields(MatmulLtState)] == [
        "force_no_igemmlt", "CB", "SB", "SCB", "SBt", "CBt", "subB", "outlier_pool", "idx"]
    cb, scb = ms.Tensor(np.ones((2, 3), np.int8)), ms.Tensor(np.ones(2, np.float32))
    st = MatmulLtState(False, cb, None, scb)  # positional, as upstream: CB second, SCB fourth
    assert st.CB is cb and st.SCB is scb and st.SB is None and st.force_no_igemmlt is False
    pool = GlobalOutlierPooler.get_instance()
    assert MatmulLtState(outlier_pool=pool).outlier_pool is pool
    assert (st.threshold, st.is_training, st.has_fp16_weights, st.use_pool, st.has_accumulated_gradients) == (
        0.0, True, True, False, False)
    for name in ("CxB", "CxBt", "formatB", "_tile_indices"):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert getattr(st, name) is None
        assert any(issubclass(x.category, FutureWarning) and name in str(x.message) for x in w), name
    with pytest.raises(AttributeError, match="'MatmulLtState' object has no attribute 'nope'"):
        st.nope
    st.reset_grads()
    assert st.CB is None and st.SCB is None
