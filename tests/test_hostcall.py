"""The host-call bridge (bitsandbytes_ms/_hostcall.py): the same entry point called through ctypes on host
memory gives the ops.Custom path's bytes; views give the contiguous copy's result; bad calls raise; it is
inactive while a gradient is recorded and when switched off."""

import gc

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _hostcall as H
from bitsandbytes_ms.cextension import lib


def _q(N=48, K=128, seed=0):
    rng = np.random.default_rng(seed)
    W = Tensor(rng.standard_normal((N, K)).astype(np.float32))
    q, qs = F.quantize_4bit(W, quant_type="nf4", compress_statistics=False)
    return q, qs


@pytest.mark.parametrize("M", [1, 3])
def test_same_bytes_as_ops_custom(M):
    q, qs = _q()
    x = Tensor(np.random.default_rng(1).standard_normal((M, 128)).astype(np.float32))
    ref = lib.cgemm_4bit_inference_naive_fp32(x, q, qs.absmax, qs.code, 64, 48).asnumpy()
    out = H.empty((M, 48), ms.float32)
    H.entry("cgemm_4bit_inference_naive_fp32")(H.host(x), H.host(q), H.host(qs.absmax), H.host(qs.code), 64, 48, out)
    assert np.array_equal(out, ref)
    t = H.wrap(out)
    assert isinstance(t, Tensor) and np.array_equal(t.asnumpy(), ref)


def test_bound_call_rebinds_and_keeps_memory():
    q, qs = _q()
    rng = np.random.default_rng(2)
    xs = [Tensor(rng.standard_normal((1, 128)).astype(np.float32)) for _ in range(3)]
    e = H.entry("cgemm_4bit_inference_naive_fp32")
    call = e.bind(H.host(xs[0]), H.host(q), H.host(qs.absmax), H.host(qs.code), 64, 48, H.empty((1, 48), ms.float32))
    gc.collect()  # the bound arrays (and the 0-d scalars made from Python ints) must survive
    for x in xs:
        out = H.empty((1, 48), ms.float32)
        call.set(0, H.host(x))
        call.set(6, out)
        call()
        assert np.array_equal(out, lib.cgemm_4bit_inference_naive_fp32(x, q, qs.absmax, qs.code, 64, 48).asnumpy())


def test_view_input_gives_contiguous_result():
    base = Tensor(np.random.default_rng(3).standard_normal((128, 2)).astype(np.float32))
    view = base.transpose(1, 0)  # [2, 128], not contiguous
    a = H.host(view)
    assert a.flags.c_contiguous and np.array_equal(a, base.asnumpy().T)


def test_bad_call_raises_status():
    q, qs = _q()
    x = H.host(Tensor(np.ones((1, 100), np.float32)))  # K = 100 does not match the 48 x 128 weight's bytes
    out = H.empty((1, 48), ms.float32)
    with pytest.raises(RuntimeError, match="cgemm_4bit_inference_naive_fp32 returned status"):
        H.entry("cgemm_4bit_inference_naive_fp32")(x, H.host(q)[:10], H.host(qs.absmax), H.host(qs.code), 64, 48, out)
    with pytest.raises(TypeError, match="takes 7 arguments"):
        H.entry("cgemm_4bit_inference_naive_fp32").bind(x)


def test_inactive_under_gradient_and_when_disabled():
    assert H.active()
    seen = []

    def f(a):
        seen.append(H.active())
        return (a * a).sum()

    ms.value_and_grad(f)(Tensor(np.ones(3, np.float32)))
    assert seen == [False]
    old = H.set_enabled(False)
    try:
        assert not H.active()
    finally:
        H.set_enabled(old)
    assert H.active()


@pytest.mark.parametrize("nested", [False, True])
def test_dequantize_host_call_same_bytes_and_under_gradient(nested):
    """dequantize_4bit / dequantize_blockwise run as host calls (backends/native: ~4x less than an ops.Custom
    launch), also while a gradient is recorded (a packed weight's codes ask for none): the ops.Custom path's bytes
    either way; an input that asks for a gradient keeps the ops.Custom call."""
    rng = np.random.default_rng(3)
    W = Tensor(rng.standard_normal((96, 128)).astype(np.float32))
    q, qs = F.quantize_4bit(W, quant_type="nf4", compress_statistics=nested)
    A8, s8 = F.quantize_blockwise(W)
    host4, host8 = F.dequantize_4bit(q, qs).asnumpy(), F.dequantize_blockwise(A8, s8).asnumpy()
    old = H.set_enabled(False)  # every op through ops.Custom
    try:
        assert not H.usable()
        ref4, ref8 = F.dequantize_4bit(q, qs).asnumpy(), F.dequantize_blockwise(A8, s8).asnumpy()
    finally:
        H.set_enabled(old)
    assert host4.view(np.uint32).tobytes() == ref4.view(np.uint32).tobytes()
    assert host8.view(np.uint32).tobytes() == ref8.view(np.uint32).tobytes()
    assert not np.array_equal(ref4, np.zeros_like(ref4))
    seen, grad_in = [], ms.Parameter(Tensor(np.ones(3, np.float32)), requires_grad=True)

    def f(a):
        seen.append((H.active(), H.usable(q, qs.absmax), H.usable(grad_in)))
        return (a * Tensor(F.dequantize_4bit(q, qs).asnumpy()[0, :3])).sum()

    _, g = ms.value_and_grad(f)(Tensor(np.ones(3, np.float32)))
    assert seen == [(False, True, False)]
    assert np.array_equal(g.asnumpy(), ref4[0, :3])


def test_matmul4bit_cell_forward_runs_the_host_call_under_gradient(monkeypatch):
    """MatMul4Bit is differentiated through its bprop, and MindSpore runs such a cell's forward without recording
    (requires_grad() is False there), so the forward takes the host call, not ops.Custom, while a gradient is
    recorded around it: the same bytes as the inference forward, the bprop's gradients, and host calls inactive
    again outside the cell (checked 2026-12-06 with MindSpore 2.7.0; a MindSpore that records inside would make
    the training forward launch ops.Custom, ~4x slower, and fail here)."""
    import bitsandbytes_ms as bnb
    from bitsandbytes_ms.formats import fourbit

    q, qs = _q()
    A = Tensor(np.random.default_rng(3).standard_normal((5, 128)).astype(np.float32))
    want = bnb.matmul_4bit(A, q.t(), qs).asnumpy()  # inference: the host call
    calls = []
    real = fourbit._custom_linear
    monkeypatch.setattr(fourbit, "_custom_linear", lambda *a: calls.append(1) or real(*a))
    seen = []

    def f(A):
        out = bnb.matmul_4bit(A, q.t(), qs)
        seen.append((out.asnumpy(), H.active()))
        return (out * out).sum()

    v, g = ms.value_and_grad(f)(A)
    assert not calls, "the recorded forward launched ops.Custom instead of the host call"
    np.testing.assert_array_equal(seen[0][0], want)
    assert seen[0][1] is False  # outside the cell, a recorded forward keeps its ops
    Wd = F.dequantize_4bit(q, qs).asnumpy()
    np.testing.assert_allclose(g.asnumpy(), 2 * want @ Wd, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(v), float((want.astype(np.float64) ** 2).sum()), rtol=1e-5)
    assert H.active()
