"""bitsandbytes_ms.nn.parametrize (upstream bitsandbytes.nn.parametrize) on mindtorch modules: values
against the numpy reference, state dict round trip, PyTorch's attribute semantics where mindtorch
differs (plain tensor, cache, always-called forward hook), and the `mindtorch-proxy-module-setattr` patch.
Upstream's own tests are ported in compat_tests/test_parametrize.py."""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")

import mindnlp  # noqa: F401,E402  (torch -> mindtorch)
import mindtorch.nn.utils.parametrize as RP  # noqa: E402  (mindtorch's module, not the torch alias)
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms import _reference as R  # noqa: E402
from bitsandbytes_ms import functional as F  # noqa: E402
from bitsandbytes_ms.integrations import mindtorch_patches  # noqa: E402,F401  (registers the patches)
from bitsandbytes_ms.integrations.patches import registry  # noqa: E402
from bitsandbytes_ms.nn import parametrize as BP  # noqa: E402
from bitsandbytes_ms.nn.parametrize import (  # noqa: E402
    Bnb4bitParametrization,
    replace_parameter_4bit,
    replace_parameter_4bit_prequantized,
)

DTYPES = {"fp32": (torch.float32, "float32"), "fp16": (torch.float16, "float16"), "bf16": (torch.bfloat16, "bfloat16")}


def _t(a, dtype=torch.float32):
    return torch.tensor(np.asarray(a, np.float32)).to(dtype)


def _np(t):
    return t.float().numpy() if t.dtype != torch.float32 else t.numpy()


class Experts(nn.Module):
    def __init__(self, w, dtype=torch.float32):
        super().__init__()
        self.w = nn.Parameter(_t(w, dtype))
        self.bias = nn.Parameter(_t(np.zeros(w.shape[-1]), dtype))

    def forward(self, x, idx=0):
        return x @ self.w[idx] + self.bias


@pytest.fixture(autouse=True)
def _clean_cache():
    RP._cache_enabled = 0
    RP._cache = {}
    yield
    RP._cache_enabled = 0
    RP._cache = {}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("blocksize", [64, 256])
def test_values_match_numpy_reference(dtype, quant_type, blocksize):
    tdt, name = DTYPES[dtype]
    w = np.random.RandomState(1).randn(3, 40, 24).astype(np.float32)
    m = Experts(w, tdt)
    src = _np(m.w)  # the values after rounding to `dtype`
    replace_parameter_4bit(m, "w", quant_type=quant_type, blocksize=blocksize)
    got = m.w
    assert tuple(got.shape) == w.shape and got.dtype == tdt and got.device.type == "cpu"
    qs = m.parametrizations.w[0].quant_state
    packed, absmax = R.quantize_4bit(src, qs.code.numpy(), blocksize)
    np.testing.assert_array_equal(m.parametrizations.w.original.numpy().reshape(-1), packed.reshape(-1))
    np.testing.assert_array_equal(qs.absmax.numpy(), absmax)
    ref = R.dequantize_4bit(packed, absmax, qs.code.numpy(), blocksize, w.size, name, fp4=quant_type == "fp4")
    np.testing.assert_array_equal(_np(got).reshape(-1), np.asarray(ref, np.float32).reshape(-1))


def test_compressed_statistics_equal_functional_roundtrip():
    w = np.random.RandomState(2).randn(4, 64, 32).astype(np.float32)
    m = Experts(w)
    replace_parameter_4bit(m, "w", compress_statistics=True, quant_type="nf4", blocksize=128)
    qs = m.parametrizations.w[0].quant_state
    assert qs.nested and qs.blocksize == 128 and qs.quant_type == "nf4"
    q, qs2 = F.quantize_4bit(_t(w), blocksize=128, compress_statistics=True, quant_type="nf4")
    np.testing.assert_array_equal(m.w.numpy(), F.dequantize_4bit(q, qs2).numpy())


def test_attribute_is_plain_tensor_without_grad():
    """PyTorch gives the parametrization's output; mindtorch 0.5.1 wraps it in a new Parameter (requires_grad=True)."""
    m = Experts(np.random.RandomState(3).randn(2, 8, 8))
    m.w.requires_grad_(True)
    replace_parameter_4bit(m, "w")
    assert not isinstance(m.w, nn.Parameter) and not m.w.requires_grad
    # mindtorch's own property, kept for parametrizations registered directly (the difference handled here)

    class Double(nn.Module):
        def forward(self, x):
            return x * 2

    plain = Experts(np.ones((2, 8, 8)))
    torch.nn.utils.parametrize.register_parametrization(plain, "w", Double())
    assert isinstance(plain.w, nn.Parameter) and plain.w.requires_grad


def test_already_parametrized_is_rejected_and_bad_arguments_raise():
    m = Experts(np.random.RandomState(4).randn(2, 8, 8))
    replace_parameter_4bit(m, "w")
    with pytest.raises(TypeError, match="Parameter 'w' is not an instance of nn.Parameter"):
        replace_parameter_4bit(m, "w")
    with pytest.raises(ValueError, match="quant_type"):
        replace_parameter_4bit(m, "bias", quant_type="int4")
    with pytest.raises(ValueError, match="blocksize"):
        replace_parameter_4bit(m, "bias", blocksize=48)
    with pytest.raises(ValueError):
        replace_parameter_4bit_prequantized(m, "bias", {"absmax": m.bias}, device=torch.device("cpu"))
    assert isinstance(m.bias, nn.Parameter)  # untouched by the failed calls


@pytest.mark.parametrize("compress_statistics", [False, True])
def test_state_dict_round_trip_through_prequantized(compress_statistics):
    w = np.random.RandomState(5).randn(4, 32, 16).astype(np.float32)
    m = Experts(w, torch.float16)
    replace_parameter_4bit(m, "w", quant_type="fp4", compress_statistics=compress_statistics)
    sd = m.state_dict()
    expected = {"bias", "w", "w.absmax", "w.quant_map", "w.quant_state.bitsandbytes__fp4"}
    if compress_statistics:
        expected |= {"w.nested_absmax", "w.nested_quant_map"}
    assert set(sd) == expected
    np.testing.assert_array_equal(sd["w"].numpy(), m.parametrizations.w.original.numpy())

    fresh = Experts(np.zeros_like(w), torch.float16)
    fresh.w = nn.Parameter(sd["w"], requires_grad=False)
    qs_dict = {k[len("w."):]: v for k, v in sd.items() if k.startswith("w.")}
    replace_parameter_4bit_prequantized(fresh, "w", qs_dict, device=torch.device("cpu"))
    assert fresh.w.dtype == torch.float16 and tuple(fresh.w.shape) == w.shape
    np.testing.assert_array_equal(fresh.w.numpy(), m.w.numpy())
    assert set(fresh.state_dict()) == expected


def test_nested_module_state_dict_keys_have_prefix():
    outer = nn.Sequential(nn.Linear(4, 4), Experts(np.random.RandomState(6).randn(2, 8, 8)))
    replace_parameter_4bit(outer[1], "w")
    keys = set(outer.state_dict())
    assert {"1.w", "1.w.absmax", "1.w.quant_map", "1.w.quant_state.bitsandbytes__nf4"} <= keys
    assert not any("parametrizations" in k for k in keys)


def test_forward_dequantizes_once_and_clears_cache(monkeypatch):
    w = np.random.RandomState(7).randn(3, 16, 8).astype(np.float32)
    m = Experts(w)
    replace_parameter_4bit(m, "w")
    calls = []
    orig = Bnb4bitParametrization.forward
    monkeypatch.setattr(Bnb4bitParametrization, "forward", lambda self, q: calls.append(1) or orig(self, q))

    class TwoReads(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x, 0) + self.inner(x, 1)

    x = _t(np.random.RandomState(8).randn(2, 16))
    out = m(x, 2)
    assert len(calls) == 1 and RP._cache_enabled == 0 and RP._cache == {}
    deq = m.w.numpy()
    np.testing.assert_allclose(out.numpy(), x.numpy() @ deq[2], rtol=1e-5, atol=1e-5)
    calls.clear()
    _ = (m.w, m.w)  # outside a forward: every read dequantizes
    assert len(calls) == 2
    calls.clear()
    with RP.cached():  # mindtorch's context manager uses the same cache
        a, b = m.w, m.w
    assert a is b and len(calls) == 1
    calls.clear()
    TwoReads(m)(x)  # two forwards of m, each with its own cache
    assert len(calls) == 2 and RP._cache_enabled == 0 and RP._cache == {}
    calls.clear()
    with RP.cached():  # nested: the counter goes 1 -> 2 -> 1 -> 2 -> 1, so the cache outlives m's forwards
        TwoReads(m)(x)
        assert RP._cache_enabled == 1 and len(RP._cache) == 1
    assert len(calls) == 1 and RP._cache_enabled == 0 and RP._cache == {}


def test_forward_hook_runs_when_forward_raises():
    m = Experts(np.random.RandomState(9).randn(2, 8, 8))
    replace_parameter_4bit(m, "w")
    with pytest.raises(Exception):
        m(_t(np.ones((2, 5))))  # 5 != 8: matmul fails inside forward
    assert RP._cache_enabled == 0 and RP._cache == {}
    # the always-called entry goes away with the hook's handle
    handle = BP._register_forward_hook_always_called(m, BP._disable_parametrization_cache)
    assert m._forward_hooks_always_called.get(handle.id) is True
    handle.remove()
    assert handle.id not in m._forward_hooks_always_called and handle.id not in m._forward_hooks


def test_gradients_flow_to_input_and_other_parameters():
    w = np.random.RandomState(10).randn(2, 8, 4).astype(np.float32)
    m = Experts(w)
    replace_parameter_4bit(m, "w")
    deq = m.w.numpy()[1]
    x = _t(np.random.RandomState(11).randn(3, 8))

    def loss(x):
        return (m(x, 1) ** 2).sum()

    _, (gx, gb) = ms.value_and_grad(loss, 0, (m.bias,))(x)
    out = x.numpy() @ deq + m.bias.numpy()
    np.testing.assert_allclose(gx.asnumpy(), 2 * out @ deq.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gb[0].asnumpy(), 2 * out.sum(0), rtol=1e-4, atol=1e-4)
    assert [n for n, p in m.named_parameters() if p.requires_grad] == ["bias"]


def test_upstream_names_resolve_through_register():
    bnb.register()
    from bitsandbytes.nn import parametrize as upstream_name

    assert upstream_name is BP


def test_patch_proxy_module_setattr():
    name = "mindtorch-proxy-module-setattr"
    alias = torch.nn.utils.parametrize
    was_applied = registry.is_applied(name)
    registry.apply([name])
    try:
        alias._cache_enabled = 3
        assert RP._cache_enabled == 3 and alias._cache_enabled == 3
        alias._cache = {("k",): 1}
        BP._disable_parametrization_cache(None, (), None)  # 3 -> 2: cache kept
        assert alias._cache == {("k",): 1}
        alias._cache_enabled = 1
        BP._disable_parametrization_cache(None, (), None)
        assert RP._cache_enabled == 0 and alias._cache == {} and RP._cache == {}
        assert alias.register_parametrization is RP.register_parametrization
        registry.remove([name])
        alias._cache_enabled = 5  # the mindtorch behaviour the patch exists for: the alias keeps the value
        assert RP._cache_enabled == 0 and alias._cache_enabled == 5
    finally:
        alias.__dict__.pop("_cache_enabled", None)
        alias.__dict__.pop("_cache", None)
        (registry.apply if was_applied else registry.remove)([name])
