"""Issue 34, cache audit: the per-weight plans cached on a quant_state (functional._Linear4bitPlan) and on a
MatmulLtState (functional.Int8LinearPlan) must follow what their key leaves out. Each case runs the layer
once (the plan is made), then changes the weight or its state without replacing the tensors the plan is keyed
on, and checks the next call does what a freshly built layer does: refuses a weight that does not fit its state
with a clear error before native code runs, or computes with the new weight."""

import numpy as np
import pytest

import mindspore as ms

import mindnlp  # noqa: F401  (before torch: torch is mindtorch)
import torch

import bitsandbytes_ms as bnb
from bitsandbytes_ms import functional as F

K, N = 64, 24


def _x(rows=1, k=K, seed=5):
    return ms.Tensor(np.random.default_rng(seed).standard_normal((rows, k)).astype(np.float32))


def _w(seed=1):
    return (np.random.default_rng(seed).standard_normal((N, K)) * 0.1).astype(np.float32)


def _linear4bit():
    m = bnb.nn.Linear4bit(K, N, bias=False, quant_type="nf4", compress_statistics=False)
    m.weight = bnb.nn.Params4bit(torch.tensor(_w()), requires_grad=False, quant_type="nf4", blocksize=64,
                                 compress_statistics=False)
    return m.to("cpu").eval()


def _linear8bit():
    m = bnb.nn.Linear8bitLt(K, N, bias=False, has_fp16_weights=False, threshold=0.0)
    m.weight = bnb.nn.Int8Params(torch.tensor(_w()), requires_grad=False, has_fp16_weights=False)
    return m.to("cpu").eval()


@pytest.mark.parametrize("functional", [False, True])
def test_4bit_weight_data_with_fewer_bytes_is_refused_before_native_code(functional):
    """check_weight cached the byte count by the weight object's identity: `.data =` of a shorter buffer on the
    same Params4bit reached the kernel (native status 3) instead of the size check."""
    m = _linear4bit()
    w, qs = m.weight, m.weight.quant_state
    call = (lambda: F.linear_4bit(_x(), w, qs)) if functional else (lambda: m(_x()))
    call()
    w.data = w.data.reshape(-1)[: (N * K) // 4].clone().reshape(-1, 1)
    with pytest.raises(ValueError, match=r"`B` holds 384 bytes; quant_state.shape \(24, 64\) needs exactly 768"):
        call()


@pytest.mark.parametrize("attr,value,msg", [
    ("blocksize", 128, r"quant_state.absmax has 24 entries; quant_state.shape \(24, 64\) at blocksize 128 needs "
                       r"exactly ceil\(1536/128\) = 12"),
    ("shape", (12, 128), r"`x` must have last dimension 128 \(in_features\); got shape \(1, 64\)")])
def test_4bit_plan_follows_quant_state_blocksize_and_shape(attr, value, msg):
    """The plan kept the blocksize and shape it was made with: a quant_state whose blocksize or shape was
    changed in place was still computed with the old ones; a fresh layer refuses it."""
    m = _linear4bit()
    m(_x())
    setattr(m.weight.quant_state, attr, value)
    with pytest.raises(ValueError, match=msg):
        m(_x())


def test_int8_weight_data_with_fewer_rows_is_refused_before_native_code():
    """Int8LinearPlan matched by the identity of CB alone: `.data =` of a weight with fewer rows kept the
    plan's N and reached the kernel (native status 3)."""
    m = _linear8bit()
    m(_x())
    m.weight.data = m.weight.data[:12].clone()
    with pytest.raises(ValueError, match=r"`SCB` must have CB.shape\[0\] = 12 values; got 24"):
        m(_x())


def test_int8_weight_data_of_another_width_computes_with_it():
    """`.data =` of a weight with other columns (and as many rows as SCB): the next call uses it, as a freshly
    built layer would (the plan answered with the old width: 'inner dimensions do not match ... (24, 64)')."""
    m = _linear8bit()
    m(_x())
    half = m.weight.data[:, :32].clone()
    m.weight.data = half
    x = _x(3, 32)
    got = m(x).asnumpy().astype(np.float64)
    W = half.asnumpy().astype(np.float64) * m.state.SCB.asnumpy().astype(np.float64)[:, None] / 127.0
    xv = x.asnumpy().astype(np.float64)
    ref = xv @ W.T
    step = np.abs(xv).max(axis=1, keepdims=True) / 127.0  # int8 activations: half a step of each row's absmax
    tol = 0.51 * step * np.abs(W).sum(axis=1) + 1e-3 * (np.abs(xv) @ np.abs(W).T)
    assert got.shape == (3, N) and (np.abs(got - ref) <= tol).all()


# ---- integrations/fused.py ------------------------------------------------------------------------------------
def _fused_llama():
    import test_fused_decoder as T  # (its small models)
    from bitsandbytes_ms.integrations import fuse, is_fused

    m = T._model(T._cfg("llama"))  # nf4 layers, unfused
    assert fuse(m)
    ids = torch.tensor(T.IDS[:1, :4])
    with torch.no_grad():
        m(ids)  # the fused plan is made here
    assert is_fused(m)
    return m, ids


def test_unfused_model_refuses_quant_state_blocksize_changed_in_place():
    """The unfused forward (Linear4bit) follows the quant_state's blocksize (see the plan test above)."""
    from bitsandbytes_ms.integrations import unfuse

    m, ids = _fused_llama()
    unfuse(m)
    qs = m.model.layers[0].self_attn.q_proj.weight.quant_state
    qs.blocksize = qs.blocksize * 2
    with pytest.raises(ValueError, match=r"at blocksize 128 needs exactly"):
        with torch.no_grad():
            m(ids)


def test_fused_model_refuses_quant_state_blocksize_changed_in_place():
    """The fused plan's signature holds each quant_state's blocksizes: the next forward rebuilds and refuses."""
    m, ids = _fused_llama()
    qs = m.model.layers[0].self_attn.q_proj.weight.quant_state
    qs.blocksize = qs.blocksize * 2
    with pytest.raises(ValueError, match=r"at blocksize 128 needs exactly"):
        with torch.no_grad():
            m(ids)
