"""Issue 15, optimizer part: in-place updates of views and strided tensors, non-finite gradients in
8-bit state and Lion, upstream 0.50.2's constructor behaviour, load_state_dict errors, duplicates."""

import numpy as np
import pytest

import mindnlp  # noqa: F401  (makes `import torch` mindtorch)
import torch
import mindspore as ms
from mindspore import Tensor

import bitsandbytes_ms as bnb
import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _reference as R

VIEWS = {
    "row": lambda b: b[1],
    "view": lambda b: b.view(-1),
    "leading_rows": lambda b: b[1:],
    "transposed": lambda b: b.t(),
    "columns": lambda b: b[:, 3:300],
    "flat_slice": lambda b: b.view(-1)[7:700],
}


def _base(seed, shape=(3, 512)):
    return torch.tensor(np.random.RandomState(seed).randn(*shape).astype(np.float32))


@pytest.mark.parametrize("kind", sorted(VIEWS))
@pytest.mark.parametrize("which", ["p", "state1"])
def test_update_32bit_lands_in_views(kind, which):
    make = VIEWS[kind]
    pb, sb = _base(0), _base(1) * 0.1
    p = make(pb) if which == "p" else _base(2, tuple(make(pb).shape)).clone()
    s1 = make(sb) if which == "state1" else torch.zeros(tuple(p.shape))
    g = torch.tensor(np.random.RandomState(3).randn(*p.shape).astype(np.float32))
    p0, s0 = p.asnumpy().copy(), s1.asnumpy().copy()
    want_p, want_s, _, _ = R.optimizer_update_32bit("momentum", g.asnumpy(), p0, s0, None, 0.9, 0.0, 0.0, 0.0, 1e-8,
                                                    0.0, 2, 0.1)
    F.optimizer_update_32bit("momentum", g, p, s1, 0.9, 1e-8, 2, 0.1)
    np.testing.assert_array_equal(p.asnumpy(), want_p)
    np.testing.assert_array_equal(s1.asnumpy(), want_s)
    base, view = (pb, p) if which == "p" else (sb, s1)
    np.testing.assert_array_equal(make(base).asnumpy(), view.asnumpy())  # the base tensor holds the update too


@pytest.mark.parametrize("kind", ["row", "view", "transposed", "columns"])
def test_update_8bit_lands_in_views(kind):
    make = VIEWS[kind]
    pb = _base(0, (4, 512))
    p = make(pb)
    n = int(np.prod(p.shape))
    nb = -(-n // 256)
    g = torch.tensor(np.random.RandomState(3).randn(*p.shape).astype(np.float32) * 0.1)
    s1, s2 = torch.zeros(tuple(p.shape), dtype=torch.uint8), torch.zeros(tuple(p.shape), dtype=torch.uint8)
    a_store = torch.zeros((2, nb))  # absmax as rows of a bigger tensor
    a1, a2 = a_store[0], a_store[1]
    q1, q2 = F.create_dynamic_map(True), F.create_dynamic_map(False)
    p0 = p.asnumpy().copy()
    want = R.optimizer_update_8bit_blockwise("adam", g.asnumpy(), p0, np.zeros(p.shape, np.uint8),
                                             np.zeros(p.shape, np.uint8), 0.9, 0.999, 0.0, 0.0, 1e-8, 1, 1e-3,
                                             q1.asnumpy(), q2.asnumpy(), np.zeros(nb, np.float32),
                                             np.zeros(nb, np.float32), 0.01)
    F.optimizer_update_8bit_blockwise("adam", g, p, s1, s2, 0.9, 0.999, 0.0, 0.0, 1e-8, 1, 1e-3, q1, q2, a1, a2, 0.01)
    np.testing.assert_array_equal(p.asnumpy(), want[0])
    np.testing.assert_array_equal(make(pb).asnumpy(), want[0])
    np.testing.assert_array_equal(s1.asnumpy(), want[1])
    np.testing.assert_array_equal(a_store.asnumpy()[0], want[3])
    np.testing.assert_array_equal(a_store.asnumpy()[1], want[4])


def test_optimizer_steps_a_transposed_parameter():
    base = torch.nn.Parameter(_base(0, (64, 80)))
    p = base.t()
    opt = bnb.optim.SGD([p], lr=0.1, momentum=0.9)
    g = np.random.RandomState(1).randn(80, 64).astype(np.float32)
    before = p.asnumpy().copy()
    opt.step(grads=[Tensor(g)])
    assert opt.state[p]["step"] == 1
    want, _, _, _ = R.optimizer_update_32bit("momentum", g, before, np.zeros_like(before), None, 0.9, 0.0, 0.0, 0.0,
                                             0.0, 0.0, 1, 0.1)
    np.testing.assert_array_equal(p.asnumpy(), want)


# ---- non-finite gradients ------------------------------------------------------------------------
@pytest.mark.parametrize("cls,kw", [
    (bnb.optim.AdamW8bit, dict(lr=1e-3)),
    (bnb.optim.SGD8bit, dict(lr=1e-2, momentum=0.9)),
    (bnb.optim.AdEMAMix8bit, dict(lr=1e-3)),
    (bnb.optim.Lion8bit, dict(lr=1e-3)),
])
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_8bit_nonfinite_gradient_stays_in_its_element(cls, kw, bad):
    rng = np.random.RandomState(0)
    p = torch.nn.Parameter(torch.tensor(rng.randn(8, 64).astype(np.float32)))  # 2 blocks of 256
    opt = cls([p], min_8bit_size=0, **kw)
    gs = [rng.randn(8, 64).astype(np.float32) * 0.1 for _ in range(3)]
    gs[0][1, 5] = bad  # element 69, block 0
    before = p.asnumpy().copy()
    for i, g in enumerate(gs):
        opt.step(grads=[Tensor(g)])
        if i == 0 and np.isnan(bad):
            assert np.isnan(p.asnumpy()[1, 5])  # a NaN gradient is never turned into a finite update (issue 34)
    out = p.asnumpy()
    assert np.isfinite(np.delete(out.reshape(-1), 69)).all()  # the other elements of its block stay finite
    st = opt.state[p]
    assert np.isfinite(st["absmax1"].asnumpy()).all()
    # the kernel agrees with the numpy reference step by step (same bytes)
    name = opt.optimizer_name
    b = opt.param_groups[0]["betas"]
    rp = before.reshape(-1)
    two = "state2" in st
    s1 = np.zeros((2, 512) if name == "ademamix" else 512, np.uint8)
    s2 = np.zeros(512, np.uint8) if two else None
    a1 = np.zeros((2, 2) if name == "ademamix" else 2, np.float32)
    a2 = np.zeros(2, np.float32) if two else None
    q1, q2 = st["qmap1"].asnumpy(), st["qmap2"].asnumpy() if two else None
    for step, g in enumerate(gs, 1):
        with np.errstate(invalid="ignore"):
            rp, s1, s2, a1, a2 = R.optimizer_update_8bit_blockwise(
                name, g.reshape(-1), rp, s1, s2, b[0], b[1], b[2] if len(b) > 2 else 0.0,
                opt.param_groups[0].get("alpha", 0.0), opt.param_groups[0]["eps"], step, opt.param_groups[0]["lr"],
                q1, q2, a1, a2, opt.param_groups[0]["weight_decay"])
    np.testing.assert_array_equal(out.reshape(-1), rp)
    np.testing.assert_array_equal(st["absmax1"].asnumpy().reshape(-1), np.asarray(a1).reshape(-1))


def test_lion32bit_nan_gradient_reaches_its_parameter():
    # torch.sign(NaN) / np.sign(NaN) is NaN: as upstream's (torch) Lion, the NaN shows in that parameter
    rng = np.random.RandomState(0)
    p0 = rng.randn(300).astype(np.float32)
    g = rng.randn(300).astype(np.float32)
    g[7] = np.nan
    p, s1 = torch.tensor(p0.copy()), torch.tensor(rng.randn(300).astype(np.float32) * 0.1)
    s0 = s1.asnumpy().copy()
    with np.errstate(invalid="ignore"):
        want, _, _, _ = R.optimizer_update_32bit("lion", g, p0, s0, None, 0.9, 0.99, 0.0, 0.0, 0.0, 0.0, 1, 1e-3)
    F.optimizer_update_32bit("lion", torch.tensor(g), p, s1, 0.9, 0.0, 1, 1e-3, beta2=0.99)
    out = p.asnumpy()
    assert np.isnan(out[7]) and np.isnan(want[7])
    np.testing.assert_array_equal(np.delete(out, 7), np.delete(want, 7))


# ---- upstream 0.50.2 constructor behaviour -------------------------------------------------------
def _ps(shape=(64, 80)):
    return [torch.nn.Parameter(_base(0, shape))]


def test_positional_arguments_land_where_upstream_puts_them():
    opt = bnb.optim.Adam(_ps(), 1e-2, (0.8, 0.99), 1e-6, 0.1, False, 8, None, 100, True)
    assert opt.is_paged and opt.args.optim_bits == 8 and opt.args.min_8bit_size == 100
    opt = bnb.optim.Lion8bit(_ps(), 1e-3, (0.9, 0.99), 0.0, None, 123)
    assert opt.args.min_8bit_size == 123 and opt.args.optim_bits == 8
    opt = bnb.optim.SGD8bit(_ps(), 0.1, 0.9, 0, 0, False, None, 77)
    assert opt.args.min_8bit_size == 77


def test_adam8bit_optim_bits_and_amsgrad_as_upstream():
    opt = bnb.optim.AdamW8bit(_ps(), min_8bit_size=0)
    opt.step(grads=[Tensor(np.ones((64, 80), np.float32))])
    assert opt.state[opt.param_groups[0]["params"][0]]["state1"].dtype == ms.uint8  # always 8-bit
    for cls in (bnb.optim.Adam8bit, bnb.optim.AdamW8bit, bnb.optim.PagedAdamW8bit):
        with pytest.raises(ValueError, match="optim_bits"):
            cls(_ps(), optim_bits=8)
        with pytest.raises(ValueError, match="amsgrad"):
            cls(_ps(), amsgrad=True)
    bnb.optim.AdamW(_ps(), amsgrad=True)  # ignored, as upstream


@pytest.mark.parametrize("betas", [(0.9,), 0.9, ("a", "b"), "ab", "(0.9, x)"])
def test_bad_betas_name_betas(betas):
    with pytest.raises(ValueError, match="betas"):
        bnb.optim.Adam(_ps(), betas=betas)
    with pytest.raises(ValueError, match="betas"):
        bnb.optim.Lion(_ps(), betas=betas)


def test_betas_string_in_upstreams_format():
    opt = bnb.optim.Adam(_ps(), betas="(0.8, 0.95)")
    assert tuple(opt.param_groups[0]["betas"]) == (0.8, 0.95)
    with pytest.raises(ValueError, match=r"Invalid beta parameter at index 1: 1.5"):
        bnb.optim.Adam(_ps(), betas="(0.8, 1.5)")


def test_ademamix_needs_three_betas():
    with pytest.raises(ValueError, match="betas"):
        bnb.optim.AdEMAMix(_ps(), betas=(0.9, 0.999))


def test_duplicate_parameter_in_a_group_raises():
    p = _ps()[0]
    with pytest.raises(ValueError, match="twice"):
        bnb.optim.Adam([p, p])


def test_paging_helpers_exist():
    p = _ps()[0]
    opt = bnb.optim.PagedAdam([p])
    buf = opt.get_state_buffer(p, dtype=ms.uint8)
    assert tuple(buf.shape) == tuple(p.shape) and buf.dtype == ms.uint8 and not buf.asnumpy().any()
    assert opt.to_gpu() is None and opt.prefetch_state(p) is None


def test_pytorch_lars_matches_numpy():
    p = _ps((40, 30))[0]
    p0 = p.asnumpy().copy()
    opt = bnb.optim.PytorchLARS([p], lr=0.1, momentum=0.9, max_unorm=0.02)
    rng = np.random.RandomState(5)
    buf, ref = None, p0.astype(np.float32)
    for _ in range(3):
        g = rng.randn(40, 30).astype(np.float32)
        opt.step(grads=[Tensor(g)])
        buf = g.copy() if buf is None else buf * np.float32(0.9) + g
        pn, un = np.sqrt((ref.astype(np.float64) ** 2).sum()), np.sqrt((buf.astype(np.float64) ** 2).sum())
        sc = 0.02 * pn / un if un > 0.02 * pn else 1.0
        ref = (ref + buf * np.float32(-0.1 * sc)).astype(np.float32)
    np.testing.assert_allclose(p.asnumpy(), ref, rtol=1e-6, atol=1e-7)


# ---- load_state_dict ---------------------------------------------------------------------------
def _stepped(cls, **kw):
    ps = _ps()
    opt = cls(ps, **kw)
    opt.step(grads=[Tensor(np.full((64, 80), 0.1, np.float32))])
    return ps, opt


def test_load_state_dict_move_to_device_and_round_trip():
    ps, opt = _stepped(bnb.optim.AdamW8bit, min_8bit_size=0)
    sd = opt.state_dict()
    opt2 = bnb.optim.AdamW8bit(ps, min_8bit_size=0)
    opt2.load_state_dict(sd, move_to_device=False)
    np.testing.assert_array_equal(opt2.state[ps[0]]["state1"].asnumpy(), opt.state[ps[0]]["state1"].asnumpy())


def test_load_state_dict_missing_keys_are_named():
    ps, opt = _stepped(bnb.optim.Adam)
    with pytest.raises(ValueError, match="'param_groups'"):
        opt.load_state_dict({"state": {}})
    sd = opt.state_dict()
    del sd["param_groups"][0]["betas"]
    with pytest.raises(ValueError, match="'betas'"):
        opt.load_state_dict(sd)
    sd = opt.state_dict()
    del sd["state"][0]["state2"]
    with pytest.raises(ValueError, match="'state2'"):
        opt.load_state_dict(sd)


def test_load_state_dict_of_another_optimizer_is_named():
    ps, lion = _stepped(bnb.optim.Lion)
    adam = bnb.optim.Adam(ps)
    with pytest.raises(ValueError, match="lacks 'alpha'.*another optimizer"):
        adam.load_state_dict(lion.state_dict())
    sd = lion.state_dict()
    sd["param_groups"][0].update(alpha=0.0, t_alpha=None, t_beta3=None)
    with pytest.raises(ValueError, match="no 'state2' key.*another optimizer"):
        adam.load_state_dict(sd)
    ps, ademamix = _stepped(bnb.optim.AdEMAMix)
    with pytest.raises(ValueError, match="state1"):
        bnb.optim.Adam(ps).load_state_dict(ademamix.state_dict())
    ps, sgd8 = _stepped(bnb.optim.SGD8bit, lr=0.1, momentum=0.9, min_8bit_size=0)
    sd = sgd8.state_dict()
    del sd["state"][0]["absmax1"]
    with pytest.raises(ValueError, match="'absmax1'"):
        bnb.optim.SGD8bit(ps, lr=0.1, momentum=0.9, min_8bit_size=0).load_state_dict(sd)
