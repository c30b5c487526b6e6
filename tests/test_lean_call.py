"""The lean host call of Linear4bit / Linear8bitLt at inference (the plan's ``fast``: only the activation and
the output re-pointed once a full call has run with the same weight and bias objects): it is taken, it gives
the full call's bytes, and it never serves a weight, quant-state tensor or bias that was rewritten in place
or replaced after the first call."""

import numpy as np
import pytest

import mindnlp  # noqa: F401
import torch

import bitsandbytes_ms as bnb
from bitsandbytes_ms import _hostcall as H


@pytest.fixture
def lean_count(monkeypatch):
    counts = {"lean": 0}
    real = H.Bound.run_rows

    def counted(self, *a, **k):
        counts["lean"] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(H.Bound, "run_rows", counted)
    return counts


def _layer4(W, b, cd=torch.float32):
    m = bnb.nn.Linear4bit(W.shape[1], W.shape[0], compute_dtype=cd, quant_type="nf4")
    m.weight = bnb.nn.Params4bit(torch.tensor(W), requires_grad=False, quant_type="nf4")
    m.bias = torch.nn.Parameter(torch.tensor(b), requires_grad=False)
    return m.to("cpu").eval()


def _layer8(W, b, threshold):
    m = bnb.nn.Linear8bitLt(W.shape[1], W.shape[0], has_fp16_weights=False, threshold=threshold)
    m.weight = bnb.nn.Int8Params(torch.tensor(W), requires_grad=False, has_fp16_weights=False)
    m.bias = torch.nn.Parameter(torch.tensor(b), requires_grad=False)
    return m.to("cpu").eval()


def _fresh4(m, x):
    """The full path's result for the layer's current tensors (lean call state dropped first)."""
    m.weight.quant_state.__dict__.pop("_linear_plan", None)
    return m(x).numpy().copy()


@pytest.mark.parametrize("rows", [1, 3])
def test_linear4bit_lean_call_is_taken_and_never_stale(lean_count, rows):
    rng = np.random.default_rng(3)
    W = (rng.standard_normal((48, 128)) * 0.05).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    m = _layer4(W, b)
    x = torch.tensor(rng.standard_normal((rows, 128)).astype(np.float32))
    first = m(x).numpy().copy()
    assert lean_count["lean"] == 0
    second = m(x).numpy().copy()
    assert lean_count["lean"] == 1
    np.testing.assert_array_equal(first, second)
    qs = m.weight.quant_state
    assert qs.nested  # double quant: absmax codes, state2.absmax, offset all read in place
    # rewrite each tensor the call reads in place, then compare the lean/full layer with a fresh full call
    for rewrite in (lambda: qs.state2.absmax.copy_(qs.state2.absmax * 2),
                    lambda: m.bias.data.copy_(m.bias.data + 1),
                    lambda: qs.absmax.copy_(torch.tensor(np.roll(qs.absmax.numpy(), 1))),
                    lambda: m.weight.data.copy_(torch.tensor(np.roll(m.weight.data.numpy(), 1)))):
        before = m(x).numpy().copy()
        rewrite()
        got = m(x).numpy().copy()
        assert not np.array_equal(got, before)
        np.testing.assert_array_equal(got, _fresh4(m, x))
    # a replaced bias object: the lean call does not apply
    m.bias = torch.nn.Parameter(torch.tensor(b * 0), requires_grad=False)
    got = m(x).numpy().copy()
    np.testing.assert_array_equal(got, _fresh4(m, x))


def test_linear4bit_lean_call_view_input():
    rng = np.random.default_rng(4)
    W = (rng.standard_normal((32, 64)) * 0.05).astype(np.float32)
    m = _layer4(W, np.zeros(32, np.float32))
    xb = torch.tensor(rng.standard_normal((4, 64)).astype(np.float32))
    m(xb[0:1])
    for i in range(4):  # views at an offset / non-contiguous: copied, never read from the wrong address
        np.testing.assert_array_equal(m(xb[i:i + 1]).numpy(), m(torch.tensor(xb.numpy()[i:i + 1])).numpy())
    xt = torch.tensor(rng.standard_normal((64, 2)).astype(np.float32)).t()
    np.testing.assert_array_equal(m(xt).numpy(), m(torch.tensor(np.ascontiguousarray(xt.numpy()))).numpy())


@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_linear8bitlt_lean_call_is_taken_and_never_stale(lean_count, threshold):
    rng = np.random.default_rng(5)
    W = (rng.standard_normal((40, 96)) * 0.05).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    m = _layer8(W, b, threshold)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    x[:, 5] = 9.0
    x = torch.tensor(x)
    ref = _layer8(W, b, threshold)
    first = m(x).numpy().copy()
    second = m(x).numpy().copy()
    assert lean_count["lean"] >= 1
    np.testing.assert_array_equal(first, second)
    np.testing.assert_array_equal(second, ref(x).numpy())
    if threshold:
        np.testing.assert_array_equal(m.state.idx.numpy(), [5])
    for rewrite in (lambda t: t.bias.data.copy_(t.bias.data * 3),
                    lambda t: t.state.SCB.copy_(t.state.SCB * 0.5),
                    lambda t: t.weight.data.copy_(torch.tensor(-t.weight.data.numpy()))):
        before = m(x).numpy().copy()
        rewrite(m)
        rewrite(ref)
        ref.state.__dict__.pop("_int8_linear_plan", None)
        got = m(x).numpy().copy()
        assert not np.array_equal(got, before)
        np.testing.assert_array_equal(got, ref(x).numpy())


@pytest.mark.parametrize("cd", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows", [1, 4])
def test_linear4bit_fp32_input_16bit_compute_is_the_unfused_layer(cd, rows):
    """fp32 activations with compute_dtype bf16/fp16: one host call, the unfused layer's bytes
    (x cast to the compute dtype, the 16-bit layer, the result cast back)."""
    rng = np.random.default_rng(6)
    W = (rng.standard_normal((40, 192)) * 0.05).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    m = _layer4(W, b, getattr(torch, cd))
    x = torch.tensor(rng.standard_normal((rows, 192)).astype(np.float32))
    got = m(x)
    assert got.dtype == torch.float32
    old = H.set_enabled(False)
    try:
        ref = m(x)
    finally:
        H.set_enabled(old)
    np.testing.assert_array_equal(got.numpy().view(np.uint32), ref.numpy().view(np.uint32))


@pytest.mark.parametrize("cd", ["bfloat16", "float16"])
def test_linear4bit_16bit_compute_lean_call_is_taken_and_never_stale(lean_count, cd):
    """fp32 activations with a 16-bit compute dtype: the second call is the lean one, with the same bytes; a bias
    rewritten in place, a replaced bias and a weight rewritten in place are all seen (each against the unfused
    layer's result)."""
    rng = np.random.default_rng(8)
    W = (rng.standard_normal((40, 192)) * 0.05).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    m = _layer4(W, b, getattr(torch, cd))
    x = torch.tensor(rng.standard_normal((1, 192)).astype(np.float32)) * 1.0

    def unfused():
        old = H.set_enabled(False)
        try:
            return m(x).numpy().copy()
        finally:
            H.set_enabled(old)

    first = m(x).numpy().copy()
    assert lean_count["lean"] == 0
    np.testing.assert_array_equal(m(x).numpy(), first)
    assert lean_count["lean"] == 1
    with torch.no_grad():
        m.bias.add_(1.0)  # in place (MindSpore may give it a new buffer: then the full call runs once)
    ref = unfused()
    np.testing.assert_array_equal(m(x).numpy(), ref)
    n = lean_count["lean"]
    np.testing.assert_array_equal(m(x).numpy(), ref)  # lean again, reading the updated bias
    assert lean_count["lean"] == n + 1
    m.bias = torch.nn.Parameter(torch.tensor(b * 3), requires_grad=False)  # replaced: the full call again
    np.testing.assert_array_equal(m(x).numpy(), unfused())
    assert lean_count["lean"] == n + 1
    qs = m.weight.quant_state
    with torch.no_grad():
        qs.code.mul_(0.5)  # a quant-state tensor rewritten in place: read in place, so seen
    np.testing.assert_array_equal(m(x).numpy(), unfused())


# ---- the activation read in place (act_ptr) ---------------------------------------------------------
def _kinds_of_input(rng, K):
    """Inputs of every kind a layer meets: an op's result (in MindSpore's CPU device memory), a tensor made
    from numpy (host memory, no device address), an op result rewritten in place just before the call (queued
    asynchronously), a row view with an offset and a transposed (non-contiguous) view."""
    a = rng.standard_normal((4, K)).astype(np.float32)
    host = torch.tensor(a[:2].copy())
    dev = torch.tensor(a[:2].copy()) * 1.0
    upd = torch.tensor(a[:2].copy()) * 1.0
    upd.add_(0.5)
    base = torch.tensor(a) * 1.0
    t = torch.tensor(a[:2].T.copy()) * 1.0
    return {"op result": (dev, a[:2]), "from numpy": (host, a[:2]), "updated in place": (upd, a[:2] + 0.5),
            "row view with offset": (base[2:], a[2:]), "transposed view": (t.t(), a[:2])}


@pytest.mark.parametrize("kind", ["4bit", "int8"])
def test_lean_call_reads_each_kind_of_activation_right(kind, capfd):
    """Every kind of input gives the full path's result on its contiguous numpy copy; an op result is read in
    place (no host copy), and asking MindSpore whether a tensor has device memory prints nothing."""
    rng = np.random.default_rng(5)
    W = (rng.standard_normal((24, 64)) * 0.05).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    m = _layer4(W, b) if kind == "4bit" else _layer8(W, b, 0.0)
    with torch.no_grad():
        m(torch.tensor(rng.standard_normal((2, 64)).astype(np.float32)))  # the full call: the lean one next
        for name, (x, ref_in) in _kinds_of_input(rng, 64).items():
            got = m(x).numpy().copy()
            want = m(torch.tensor(np.ascontiguousarray(ref_in))).numpy()
            np.testing.assert_array_equal(got, want, err_msg=name)
    assert "device address is null" not in capfd.readouterr().err


def test_act_ptr_reads_op_results_in_place_and_copies_the_rest():
    dev = torch.ones(3, 8) * 2.0
    keep, ptr = H.act_ptr(dev)
    assert keep is dev and ptr == dev._data_ptr()
    host = torch.tensor(np.ones((3, 8), np.float32))
    keep, ptr = H.act_ptr(host)
    assert isinstance(keep, np.ndarray) and ptr == keep.ctypes.data
    view = (torch.ones(4, 8) * 2.0)[1:]
    keep, ptr = H.act_ptr(view)
    assert isinstance(keep, np.ndarray) and keep.shape == (3, 8)


def test_act_ptr_without_the_log_symbol_takes_the_copy(monkeypatch):
    from bitsandbytes_ms import _ms_threads
    monkeypatch.setattr(_ms_threads, "_ANALYZER_LEVEL", None)
    dev = torch.ones(3, 8) * 2.0
    keep, ptr = H.act_ptr(dev)
    assert isinstance(keep, np.ndarray) and ptr == keep.ctypes.data and (keep == 2.0).all()


@pytest.mark.parametrize("cd", [torch.bfloat16, torch.float16])
def test_fp32_input_16bit_compute_reads_each_kind_of_activation_right(cd, capfd):
    rng = np.random.default_rng(6)
    W = (rng.standard_normal((24, 64)) * 0.05).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    m = _layer4(W, b, cd)
    with torch.no_grad():
        for name, (x, ref_in) in _kinds_of_input(rng, 64).items():
            got = m(x).numpy().copy()
            want = m(torch.tensor(np.ascontiguousarray(ref_in))).numpy()
            np.testing.assert_array_equal(got, want, err_msg=name)
    assert "device address is null" not in capfd.readouterr().err


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gemv_4bit_one_row_is_one_host_call_with_the_custom_ops_bytes(lean_count, nested, dtype):
    """functional.gemv_4bit on one row runs one host call (with or without double quant; it used to take
    ops.Custom without it, ~1 ms more per 4096 x 4096 call) and gives ops.Custom's bytes, `out=` included."""
    import mindspore as ms

    from bitsandbytes_ms import functional as F

    rng = np.random.RandomState(5)
    mdt = getattr(ms, dtype)
    W = ms.Tensor((rng.randn(96, 320) * 0.05).astype(np.float32)).astype(mdt)
    q, st = F.quantize_4bit(W, blocksize=64, quant_type="fp4", compress_statistics=nested)
    A = ms.Tensor(rng.randn(1, 320).astype(np.float32)).astype(mdt)
    old = H.set_enabled(False)
    try:
        ref = F.gemv_4bit(A, q, state=st).astype(ms.float32).asnumpy()
    finally:
        H.set_enabled(old)
    first = F.gemv_4bit(A, q, state=st)  # the full host call; the next ones re-point A and out only
    n0 = lean_count["lean"]
    got = F.gemv_4bit(A, q, state=st)
    assert lean_count["lean"] == n0 + 1
    np.testing.assert_array_equal(first.astype(ms.float32).asnumpy(), ref)
    assert got.dtype == mdt and tuple(got.shape) == (1, 96)
    np.testing.assert_array_equal(got.astype(ms.float32).asnumpy(), ref)
    out = ms.Tensor(np.zeros((1, 96), np.float32)).astype(mdt)
    r = F.gemv_4bit(A, q, state=st, out=out)
    np.testing.assert_array_equal(out.astype(ms.float32).asnumpy(), ref)
    np.testing.assert_array_equal(r.astype(ms.float32).asnumpy(), ref)


def test_matmul_4bit_with_a_fresh_transposed_weight_each_call_is_lean_and_never_stale(lean_count):
    """``bnb.matmul_4bit(x, w.t(), quant_state=...)`` as upstream's Linear4bit forward writes it: every call
    makes a new [1, n] view of the packed [n, 1] weight (the same bytes at the same address). The lean call
    takes it (it used to run the full call each time: 3.1 vs 1.9 ms for 4096 x 4096 on one thread) and reads the
    weight where it is, so a rewrite in place is never served stale."""
    rng = np.random.default_rng(6)
    W = (rng.standard_normal((48, 128)) * 0.05).astype(np.float32)
    m = _layer4(W, np.zeros(48, np.float32))
    w, qs = m.weight, m.weight.quant_state
    x = torch.tensor(rng.standard_normal((1, 128)).astype(np.float32))
    with torch.no_grad():
        first = bnb.matmul_4bit(x, w.t(), quant_state=qs).numpy().copy()
        n0 = lean_count["lean"]
        second = bnb.matmul_4bit(x, w.t(), quant_state=qs).numpy().copy()
        assert lean_count["lean"] == n0 + 1
        np.testing.assert_array_equal(first, second)
        np.testing.assert_array_equal(first, _fresh4(m, x) - 0.0)  # the layer's bytes (zero bias)
        w.data.copy_(torch.tensor(np.roll(w.data.numpy(), 1)))
        got = bnb.matmul_4bit(x, w.t(), quant_state=qs).numpy().copy()
        assert not np.array_equal(got, first)
        np.testing.assert_array_equal(got, _fresh4(m, x))


@pytest.mark.parametrize("dst", ["bf16", "fp16"])
def test_native_convert_matches_numpy_rounding(dst):
    """_hostcall.convert (the lean compute-dtype path's casts) rounds as numpy does: to nearest even, with ties,
    denormals, overflow to inf and NaN; widening back is exact."""
    import mindspore as ms

    from bitsandbytes_ms import _hostcall as HC

    npdt = HC.np_dtype(ms.bfloat16 if dst == "bf16" else ms.float16)
    rng = np.random.default_rng(5)
    bits = rng.integers(0, 2**32, size=20011, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 65504.0, 65520.0, 1e-45, 3e-39, -1e-8,
                        np.inf, -np.inf, 3.4e38], np.float32)
    x = np.concatenate([bits.view(np.float32), special, np.float32(rng.standard_normal(4099))])
    assert x.size >= HC._CONVERT_MIN  # the native cast runs (numpy's below that size)
    got = HC.convert(x, npdt)
    want = x.astype(npdt)
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(x)
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
    back = HC.convert(got, np.float32)
    assert np.array_equal(back[~nan], got[~nan].astype(np.float32))
    # a strided view converts as its contiguous copy
    assert np.array_equal(HC.convert(x[::3], npdt)[~nan[::3]].view(np.uint16), want[::3][~nan[::3]].view(np.uint16))
