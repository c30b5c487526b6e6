"""Loads without scales and tied weights (issue 15 items 4 and 5): an int8/int4 checkpoint weight without its
scales (SCB, weight_scale) is refused instead of running on stale scales or as raw codes, a full-precision
checkpoint into a quantized layer is quantized again, and a Linear8bitLt whose weight is tied to a plain float
tensor (an embedding) computes from its current values, never from a stale int8 copy."""

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401  (before `import torch`: torch becomes mindtorch)

from bitsandbytes_ms.nn import Int8Params, Linear8bitLt, LinearWeightOnly

import torch  # noqa: E402  (mindtorch)


def _w(n_out, n_in, seed):
    return (np.random.RandomState(seed).uniform(-1, 1, (n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)


def _int8_layer(W, quantize=True, bias=None):
    n_out, n_in = W.shape
    m = Linear8bitLt(n_in, n_out, bias=bias is not None, has_fp16_weights=False).eval()
    m.weight = Int8Params(torch.tensor(W), requires_grad=False, has_fp16_weights=False)
    if bias is not None:
        m.bias = torch.nn.Parameter(torch.tensor(bias))
    return m.to("cpu") if quantize else m


def _x(n_in, rows=3, seed=9):
    return torch.tensor(np.random.RandomState(seed).randn(rows, n_in).astype(np.float32))


# ---- Linear8bitLt without SCB ----------------------------------------------------------------------------------
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("state", ["fresh", "quantized", "after_forward"])
def test_int8_weight_without_scb_is_refused(state, strict):
    """Upstream 0.50.2 loads it and keeps the layer's own (stale) SCB; here it is an error naming both keys, and
    the layer is left as it was."""
    src = _int8_layer(_w(12, 16, seed=1))
    sd = {k: v for k, v in src.state_dict().items() if k != "SCB"}
    dst = _int8_layer(_w(12, 16, seed=2) * 3, quantize=state != "fresh")
    x = _x(16)
    if state == "after_forward":
        dst(x)  # SCB moved into its state
    before = dst(x).numpy()
    with pytest.raises(RuntimeError, match=r"weight: an int8 \(quantized\) weight needs its row scales SCB, which "
                                           r"the state dict lacks"):
        dst.load_state_dict(sd, strict=strict)
    np.testing.assert_array_equal(dst(x).numpy(), before)


@pytest.mark.parametrize("state", ["quantized", "after_forward"])
def test_float_checkpoint_into_a_quantized_layer_is_quantized_again(state):
    """A full-precision weight (an nn.Linear state dict) into a quantized Linear8bitLt: quantized from it, as a
    fresh layer holding it would be (upstream truncates the floats into the int8 codes: all zeros here, and keeps
    the old SCB)."""
    W2, b2 = _w(12, 16, seed=4), np.linspace(-1, 1, 12).astype(np.float32)
    dst = _int8_layer(_w(12, 16, seed=3), bias=np.zeros(12, np.float32))
    x = _x(16)
    if state == "after_forward":
        dst(x)
    plain = torch.nn.Linear(16, 12)
    plain.load_state_dict({"weight": torch.tensor(W2), "bias": torch.tensor(b2)})
    dst.load_state_dict(plain.state_dict(), strict=True)
    ref = _int8_layer(W2, bias=b2)
    np.testing.assert_array_equal(dst(x).numpy(), ref(x).numpy())
    sd = dst.state_dict()
    assert sd["weight"].dtype == torch.int8
    np.testing.assert_array_equal(sd["weight"].numpy(), ref.state_dict()["weight"].numpy())
    np.testing.assert_array_equal(sd["SCB"].numpy(), ref.state_dict()["SCB"].numpy())
    exact = x.numpy() @ W2.T + b2
    assert np.abs(dst(x).numpy() - exact).max() < 0.05 * np.abs(exact).max()
    with pytest.raises(RuntimeError, match=r"size mismatch for weight: copying a param with shape \(12, 8\), the "
                                           r"shape in current model is \(12, 16\)"):
        dst.load_state_dict({"weight": torch.tensor(_w(12, 8, seed=5)), "bias": torch.tensor(b2)})


def test_checkpoint_with_scb_still_loads_bit_exact():
    src = _int8_layer(_w(12, 16, seed=6))
    x = _x(16)
    for state in ("fresh", "quantized"):
        dst = _int8_layer(_w(12, 16, seed=7), quantize=state == "quantized")
        dst.load_state_dict(src.state_dict())
        np.testing.assert_array_equal(dst(x).numpy(), src(x).numpy())


@pytest.mark.parametrize("bad", ["short", "long", "int32"])
def test_scb_of_another_length_or_dtype_is_refused_at_load(bad):
    """An SCB that does not give one float scale per row of the int8 weight is refused by load_state_dict, naming
    the key, the expected and the found (was: "All keys matched", then a MindSpore broadcast error in forward)."""
    src = _int8_layer(_w(12, 16, seed=6))
    sd = src.state_dict()
    scb = {"short": sd["SCB"][:11], "long": torch.cat([sd["SCB"], sd["SCB"][:1]]),
           "int32": sd["SCB"].to(torch.int32)}[bad]
    dst = _int8_layer(_w(12, 16, seed=7))
    x = _x(16)
    before = dst(x).numpy()
    found = "int32 shape (12,)" if bad == "int32" else f"float32 shape ({11 if bad == 'short' else 13},)"
    with pytest.raises(RuntimeError, match=r"SCB: expected one row scale per row of weight, float32 or float16 or "
                                           r"bfloat16 with 12 elements; got " + found.replace("(", r"\(").replace(")", r"\)")):
        dst.load_state_dict({**sd, "SCB": scb})
    np.testing.assert_array_equal(dst(x).numpy(), before)  # left as it was
    dst.load_state_dict({**sd, "SCB": sd["SCB"].to(torch.float16)})  # a half-precision SCB is widened
    want = (torch.tensor(sd["SCB"].numpy().astype(np.float16).astype(np.float32)))
    np.testing.assert_array_equal(dst.state_dict()["SCB"].numpy(), want.numpy())


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("bad", ["scale_short", "weight_rows", "weight_cols", "weight_float"])
def test_weight_only_tensors_of_another_shape_or_dtype_are_refused_at_load(bits, bad):
    src = LinearWeightOnly(16, 12, bits=bits).quantize()
    sd = src.state_dict()
    w, sc = sd["weight"], sd["weight_scale"]
    width = 16 if bits == 8 else 8
    code = "int8" if bits == 8 else "uint8"
    change, msg = {
        "scale_short": ({"weight_scale": sc[:11]}, r"weight_scale: expected one scale per output row, float32 or "
                                                   r"float16 or bfloat16 with 12 elements; got float32 shape \(11,\)"),
        "weight_rows": ({"weight": w[:11]}, rf"weight: expected the int{bits} codes of a \[12, 16\] weight, {code} "
                                            rf"with shape \(12, {width}\); got {code} shape \(11, {width}\)"),
        "weight_cols": ({"weight": w[:, :4]}, rf"weight: expected .* with shape \(12, {width}\); got {code} "
                                              r"shape \(12, 4\)"),
        "weight_float": ({"weight": w.float()}, rf"weight: expected .*; got float32 shape \(12, {width}\)"),
    }[bad]
    dst = LinearWeightOnly(16, 12, bits=bits).quantize()
    x = _x(16)
    before = dst(x).numpy()
    with pytest.raises(RuntimeError, match=msg):
        dst.load_state_dict({**sd, **change})
    np.testing.assert_array_equal(dst(x).numpy(), before)


# ---- LinearWeightOnly without weight_scale ---------------------------------------------------------------------
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("quantized", [False, True])
def test_weight_only_codes_without_scales_are_refused(bits, quantized):
    src = LinearWeightOnly(16, 12, bits=bits).quantize()
    sd = {k: v for k, v in src.state_dict().items() if k != "weight_scale"}
    dst = LinearWeightOnly(16, 12, bits=bits)
    if quantized:
        dst.quantize()
    x = _x(16)
    before = dst(x).numpy()
    with pytest.raises(RuntimeError, match=rf"weight: an int{bits} \(quantized\) weight needs its scales "
                                           r"weight_scale, which the state dict lacks"):
        dst.load_state_dict(sd)
    np.testing.assert_array_equal(dst(x).numpy(), before)
    dst.load_state_dict(src.state_dict())  # with its scales: exactly the source layer
    np.testing.assert_array_equal(dst(x).numpy(), src(x).numpy())


# ---- tied weights (upstream #1634) -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_linear8bitlt_tied_to_an_embedding_follows_its_changes(dtype):
    """A Linear8bitLt whose weight is an embedding's (a plain Parameter, tied after quantization as transformers
    ties lm_head): full precision from the current values, as upstream's fix of #1634 (0.50.2 raises
    AttributeError); it used to quantize the first values once and serve them after the embedding changed."""
    emb = torch.nn.Embedding(16, 8)
    emb.weight.data = torch.tensor(_w(16, 8, seed=8))
    lin = Linear8bitLt(8, 16, bias=True, has_fp16_weights=False).eval().to("cpu")
    lin.weight = emb.weight
    x = _x(8, rows=4).to(dtype)

    def expected():
        w = emb.weight.float().numpy()
        b = lin.bias.float().numpy()
        return (x.float().numpy() @ w.T + b).astype(np.float32)

    tol = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}[dtype]
    y1 = lin(x)
    assert y1.dtype == dtype
    np.testing.assert_allclose(y1.float().numpy(), expected(), rtol=tol, atol=tol)
    emb.weight.data = emb.weight.data * 3  # a new tensor
    np.testing.assert_allclose(lin(x).float().numpy(), expected(), rtol=tol, atol=tol * 3)
    with torch.no_grad():
        emb.weight.mul_(-0.5)  # in place
    np.testing.assert_allclose(lin(x).float().numpy(), expected(), rtol=tol, atol=tol * 3)
    assert lin.state.CB is None  # no int8 copy kept
    assert "SCB" not in lin.state_dict()


def test_tied_linear8bitlt_is_differentiable():
    """The full-precision path keeps gradients: d(sum(lin(x)))/dx = the column sums of the embedding's table."""
    emb = torch.nn.Embedding(6, 4)
    emb.weight.data = torch.tensor(_w(6, 4, seed=10))
    lin = Linear8bitLt(4, 6, bias=False, has_fp16_weights=False).to("cpu")
    lin.weight = emb.weight
    x = _x(4, rows=2)
    _, g = ms.value_and_grad(lambda a: lin(a).sum())(x)
    np.testing.assert_allclose(g.asnumpy(), np.tile(emb.weight.numpy().sum(0), (2, 1)), rtol=1e-5, atol=1e-6)
