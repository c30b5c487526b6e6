"""Native fused optimizer kernels vs the numpy reference (bit-exact) and vs upstream bitsandbytes
0.50.2 CPU outputs (compat_tests/fixtures/optim_8bit.npz)."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

import mindspore as ms

import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _reference as R
from tests.upstream_vectors import bits, load

OPTS = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix")
TWO = ("adam", "ademamix")
HP = {  # upstream's optimizer defaults (beta1, beta2, beta3, alpha, eps, lr)
    "adam": (0.9, 0.999, 0.0, 0.0, 1e-8, 1e-3), "momentum": (0.9, 0.0, 0.0, 0.0, 1e-8, 1e-2),
    "rmsprop": (0.99, 0.0, 0.0, 0.0, 1e-8, 1e-2), "lion": (0.9, 0.99, 0.0, 0.0, 1e-8, 1e-4),
    "adagrad": (0.0, 0.0, 0.0, 0.0, 1e-10, 1e-2), "ademamix": (0.9, 0.999, 0.9999, 5.0, 1e-8, 1e-3),
}
NPDT = {"float32": np.float32, "float16": np.float16, "bfloat16": bfloat16}
MSDT = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}


def _t(a, dtype="float32"):
    a = np.ascontiguousarray(a)
    if dtype == "bfloat16":
        return ms.Tensor(a.astype(np.float32)).astype(ms.bfloat16)
    return ms.Tensor(a.astype(NPDT[dtype]) if a.dtype.kind == "f" else a)


def _np(t):
    return t.astype(ms.float32).asnumpy() if t.dtype == ms.bfloat16 else t.asnumpy()


CODE1 = F.create_dynamic_map(True).asnumpy()
CODE2 = F.create_dynamic_map(False).asnumpy()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("opt", OPTS)
def test_32bit_native_equals_reference(opt, wd, dtype):
    rng = np.random.RandomState(hash((opt, wd, dtype)) % 2**31)
    n = 1300
    shape1 = (2, n) if opt == "ademamix" else (n,)
    p = rng.randn(n).astype(np.float32).astype(NPDT[dtype]).astype(np.float32)
    s1 = np.abs(rng.randn(*shape1).astype(np.float32)) * 0.01
    s2 = (rng.rand(n).astype(np.float32) * 1e-3) if opt in TWO else None
    P, S1 = _t(p, dtype), _t(s1)
    S2 = _t(s2) if s2 is not None else None
    b1, b2, b3, al, eps, lr = HP[opt]
    for step in (1, 2, 3):
        g = (rng.randn(n).astype(np.float32) * 0.1).astype(NPDT[dtype]).astype(np.float32)
        F.optimizer_update_32bit(opt, _t(g, dtype), P, S1, b1, eps, step, lr, state2=S2, beta2=b2, beta3=b3,
                                 alpha=al, weight_decay=wd)
        p, s1, s2, _ = R.optimizer_update_32bit(opt, g, p, s1, s2, b1, b2, b3, al, eps, wd, step, lr, p_dtype=dtype)
        p = p.astype(np.float32)
        np.testing.assert_array_equal(bits(_np(P).astype(np.float32)), bits(p))
        np.testing.assert_array_equal(bits(S1.asnumpy()), bits(s1))
        if s2 is not None:
            np.testing.assert_array_equal(bits(S2.asnumpy()), bits(s2))
    assert np.abs(p).max() < 10  # sane values, not all-NaN


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("wd", [0.0, 0.01])
@pytest.mark.parametrize("opt", OPTS)
def test_8bit_native_equals_reference(opt, wd, dtype):
    rng = np.random.RandomState(hash((opt, wd, dtype, 8)) % 2**31)
    n = 256 * 5 + 77
    nb = -(-n // 256)
    p = rng.randn(n).astype(np.float32).astype(NPDT[dtype]).astype(np.float32)
    mult = 2 if opt == "ademamix" else 1
    # start from a non-trivial quantized state
    s1f = rng.randn(mult, n).astype(np.float32) * 0.01
    if opt in ("rmsprop", "adagrad"):  # squared-gradient states are >= 0
        s1f = np.abs(s1f)
    q1, a1 = zip(*[R.quantize_blockwise(s1f[i], CODE1, 256) for i in range(mult)])
    q1, a1 = np.stack(q1).reshape((2, n) if mult == 2 else (n,)), np.stack(a1).reshape((2, nb) if mult == 2 else (nb,))
    q2 = a2 = None
    if opt in TWO:
        q2, a2 = R.quantize_blockwise(rng.rand(n).astype(np.float32) * 1e-3, CODE2, 256)
    P, S1, A1 = _t(p, dtype), _t(q1), _t(a1)
    S2, A2 = (_t(q2), _t(a2)) if q2 is not None else (None, None)
    b1, b2, b3, al, eps, lr = HP[opt]
    c1, c2 = ms.Tensor(CODE1), ms.Tensor(CODE2) if opt in TWO else None
    for step in (1, 2, 5):
        g = (rng.randn(n).astype(np.float32) * 0.1).astype(NPDT[dtype]).astype(np.float32)
        g[:20] = 0
        F.optimizer_update_8bit_blockwise(opt, _t(g, dtype), P, S1, S2, b1, b2, b3, al, eps, step, lr, c1, c2, A1, A2,
                                          weight_decay=wd)
        p, q1, q2, a1, a2 = R.optimizer_update_8bit_blockwise(opt, g, p, q1, q2, b1, b2, b3, al, eps, step, lr, CODE1,
                                                              CODE2 if opt in TWO else None, a1, a2, wd, p_dtype=dtype)
        p = p.astype(np.float32)
        np.testing.assert_array_equal(bits(_np(P).astype(np.float32)), bits(p))
        np.testing.assert_array_equal(S1.asnumpy(), q1)
        np.testing.assert_array_equal(bits(A1.asnumpy()), bits(a1))
        if q2 is not None:
            np.testing.assert_array_equal(S2.asnumpy(), q2)
            np.testing.assert_array_equal(bits(A2.asnumpy()), bits(a2))


@pytest.mark.parametrize("opt,rule", [("lamb", "adam"), ("lars", "momentum")])
def test_32bit_max_unorm_trust_ratio(opt, rule):
    rng = np.random.RandomState(3)
    n = 3000
    p = rng.randn(n).astype(np.float32)
    g = rng.randn(n).astype(np.float32)
    s1 = np.zeros(n, np.float32)
    s2 = np.zeros(n, np.float32) if rule == "adam" else None
    P, S1, S2 = _t(p), _t(s1), (_t(s2) if s2 is not None else None)
    un = _t(np.zeros(1, np.float32))
    F.optimizer_update_32bit(opt, _t(g), P, S1, 0.9, 1e-8, 1, 1.0, state2=S2, beta2=0.999, unorm_vec=un, max_unorm=0.01)
    rp, _, _, unorm = R.optimizer_update_32bit(rule, g, p, s1, s2, 0.9, 0.999, 0, 0, 1e-8, 0.0, 1, 1.0, max_unorm=0.01)
    np.testing.assert_allclose(un.asnumpy()[0], unorm, rtol=1e-6)
    np.testing.assert_allclose(P.asnumpy(), rp, rtol=1e-6, atol=1e-7)
    # the trust ratio limits the update: ||dp|| == step_size * 0.01 * ||p|| (adam: lr*sqrt(1-b2)/(1-b1))
    step_size = np.sqrt(1 - 0.999) / (1 - 0.9) if rule == "adam" else 1.0
    np.testing.assert_allclose(np.linalg.norm(P.asnumpy() - p), step_size * 0.01 * np.linalg.norm(p), rtol=1e-4)


_FIX = load("optim_8bit")
_INIT = _FIX["init"][1]
_CASES = [k for k, (c, _) in _FIX.items() if c["kind"] != "input"]


@pytest.mark.parametrize("case", _CASES)
def test_upstream_fixture(case):
    """Upstream 0.50.2 CPU outputs: 8-bit state bytes equal; absmax and p agree to float32 rounding
    (upstream's PyTorch kernels fuse some multiply-adds, so p differs by a few ulp; ours does not)."""
    c, a = _FIX[case]
    opt, n, steps = c["optimizer_name"], c["n"], c["steps"]
    nb = -(-n // 256)
    two = opt in TWO
    p = _t(_INIT["p0"])
    hp = dict(beta1=c["beta1"], beta2=c["beta2"], beta3=c["beta3"], alpha=c["alpha"], eps=c["eps"], lr=c["lr"])
    if case.startswith("o8"):
        shp, ashp = ((2, n), (2, nb)) if opt == "ademamix" else ((n,), (nb,))
        s1, a1 = _t(np.zeros(shp, np.uint8)), _t(np.zeros(ashp, np.float32))
        s2, a2 = (_t(np.zeros(n, np.uint8)), _t(np.zeros(nb, np.float32))) if two else (None, None)
        for s in range(1, steps + 1):
            F.optimizer_update_8bit_blockwise(opt, _t(_INIT[f"g{s}"]), p, s1, s2, hp["beta1"], hp["beta2"], hp["beta3"],
                                              hp["alpha"], hp["eps"], s, hp["lr"], ms.Tensor(CODE1),
                                              ms.Tensor(CODE2) if two else None, a1, a2,
                                              weight_decay=c["weight_decay"])
            np.testing.assert_array_equal(s1.asnumpy(), a[f"state1_s{s}"])
            np.testing.assert_allclose(a1.asnumpy(), a[f"absmax1_s{s}"], rtol=2e-6, atol=0)
            if two:
                np.testing.assert_array_equal(s2.asnumpy(), a[f"state2_s{s}"])
                np.testing.assert_allclose(a2.asnumpy(), a[f"absmax2_s{s}"], rtol=2e-6, atol=0)
            np.testing.assert_allclose(p.asnumpy(), a[f"p_s{s}"], rtol=0, atol=2.5e-7)
    else:
        s1 = _t(np.zeros((2, n) if opt == "ademamix" else (n,), np.float32))
        s2 = _t(np.zeros(n, np.float32)) if two else None
        for s in range(1, steps + 1):
            F.optimizer_update_32bit(opt, _t(_INIT[f"g{s}"]), p, s1, hp["beta1"], hp["eps"], s, hp["lr"], state2=s2,
                                     beta2=hp["beta2"], beta3=hp["beta3"], alpha=hp["alpha"],
                                     weight_decay=c["weight_decay"])
            np.testing.assert_allclose(p.asnumpy(), a[f"p_s{s}"], rtol=0, atol=2.5e-7)
        np.testing.assert_allclose(s1.asnumpy(), a[f"state1_s{steps}"], rtol=1e-5, atol=5e-8)
        if two:
            np.testing.assert_allclose(s2.asnumpy(), a[f"state2_s{steps}"], rtol=1e-5, atol=5e-8)


def test_simd_scalar_agrees(tmp_path):
    import os
    import subprocess
    import sys
    code = ("import numpy as np, mindspore as ms, bitsandbytes_ms.functional as F\n"
            "r=np.random.RandomState(0); n=5000\n"
            "p=ms.Tensor(r.randn(n).astype(np.float32)); s1=ms.Tensor(np.zeros(n,np.uint8)); s2=ms.Tensor(np.zeros(n,np.uint8))\n"
            "a1=ms.Tensor(np.zeros(20,np.float32)); a2=ms.Tensor(np.zeros(20,np.float32))\n"
            "q1=F.create_dynamic_map(True); q2=F.create_dynamic_map(False)\n"
            "for s in (1,2):\n"
            "  g=ms.Tensor(r.randn(n).astype(np.float32))\n"
            "  F.optimizer_update_8bit_blockwise('adam',g,p,s1,s2,0.9,0.999,0,0,1e-8,s,1e-3,q1,q2,a1,a2,0.01)\n"
            "np.save(sys.argv[1], np.concatenate([p.asnumpy().view(np.uint32).astype(np.int64), s1.asnumpy(), s2.asnumpy()]))\n")
    outs = []
    for lvl in ("", "scalar"):
        env = dict(os.environ, BNB_MS_SIMD=lvl) if lvl else dict(os.environ)
        f = tmp_path / f"o{lvl or 'auto'}.npy"
        subprocess.run([sys.executable, "-c", "import sys\n" + code, str(f)], check=True, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        outs.append(np.load(f))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_bad_arguments():
    p = ms.Tensor(np.zeros(10, np.float32))
    s = ms.Tensor(np.zeros(10, np.float32))
    with pytest.raises(ValueError, match="optimizer_name"):
        F.optimizer_update_32bit("nadam", p, p, s, 0.9, 1e-8, 1, 1e-3)
    with pytest.raises(ValueError, match="`g` must have dtype"):
        F.optimizer_update_32bit("momentum", p.astype(ms.float16), p, s, 0.9, 1e-8, 1, 1e-3)
    with pytest.raises(ValueError, match="`state2` is required"):
        F.optimizer_update_32bit("adam", p, p, s, 0.9, 1e-8, 1, 1e-3)
    with pytest.raises(ValueError, match="`state1` must have 10 elements"):
        F.optimizer_update_32bit("momentum", p, p, s[:5], 0.9, 1e-8, 1, 1e-3)
    with pytest.raises(ValueError, match="`state1` must have dtype uint8"):
        F.optimizer_update_8bit_blockwise("momentum", p, p, s, None, 0.9, 0, 0, 0, 1e-8, 1, 1e-3,
                                          F.create_dynamic_map(), None, ms.Tensor(np.zeros(1, np.float32)), None)
    with pytest.raises(ValueError, match="`step` must be >= 1"):
        F.optimizer_update_32bit("momentum", p, p, s, 0.9, 1e-8, 0, 1e-3)


@pytest.mark.parametrize("opt", ["momentum", "adam"])
def test_8bit_state_block_of_subnormals_keeps_its_zeros(opt):
    """Issue 15 item 6 for the optimizers' requantization (the same lookup as quantize_blockwise): a state block
    whose absmax is below 2^-128 (1/absmax overflows) used to map every 0 to code 0 (-absmax once dequantized)
    and every other value to +-absmax; now it maps as the same block at a normal magnitude, kernel == reference."""
    n = 512
    rng = np.random.RandomState(4)
    g = (rng.randn(n) * 1e-41).astype(np.float32)
    g[::3] = 0.0
    p = rng.randn(n).astype(np.float32)
    nb = n // 256
    S1, A1 = _t(np.zeros(n, np.uint8)), _t(np.zeros(nb, np.float32))
    S2, A2 = (_t(np.zeros(n, np.uint8)), _t(np.zeros(nb, np.float32))) if opt in TWO else (None, None)
    b1, b2, b3, al, eps, lr = HP[opt]
    F.optimizer_update_8bit_blockwise(opt, _t(g), _t(p), S1, S2, b1, b2, b3, al, eps, 1, lr, ms.Tensor(CODE1),
                                      ms.Tensor(CODE2) if opt in TWO else None, A1, A2)
    _, q1, _, a1, _ = R.optimizer_update_8bit_blockwise(opt, g, p, np.zeros(n, np.uint8), np.zeros(n, np.uint8)
                                                        if opt in TWO else None, b1, b2, b3, al, eps, 1, lr, CODE1,
                                                        CODE2 if opt in TWO else None, np.zeros(nb, np.float32),
                                                        np.zeros(nb, np.float32) if opt in TWO else None)
    np.testing.assert_array_equal(S1.asnumpy(), q1)
    np.testing.assert_array_equal(A1.asnumpy(), a1)
    assert 0 < a1.max() < 2.0**-128
    state = R.dequantize_blockwise(S1.asnumpy(), A1.asnumpy(), CODE1, 256)
    zeros = g == 0
    assert np.all(np.abs(state[zeros]) < 0.01 * np.repeat(a1, 256)[zeros])  # was -absmax


@pytest.mark.parametrize("code_kind", ["dynamic", "unsigned", "linear", "sparse", "nudged"])
def test_8bit_requantization_of_every_grid_bin(code_kind):
    """The optimizers' state requantization (on AVX-512 VBMI: the gather-free Grid256Vbmi of cpu/code256.h, whose
    bucket tables are built per code) at, just below and just above every grid bin's value, against the numpy
    reference: 8-bit Momentum's first step stores the gradient itself as its state (weight decay 0), in blocks of
    256 whose absmax is exactly 1.  The codes give different bucket layouts: the dynamic map (3 levels, 2 dense
    buckets), its unsigned form (6 and 2), the linear map (one change per bucket) and a code of few runs whose
    changes jump by many codes (dense-bucket tables only).  The dynamic and linear maps' tables are point-symmetric
    and are looked up folded onto the grid's upper half (the dynamic map with 116 exception bins at each end); the
    nudged dynamic map (one entry moved) is not symmetric and takes the unfolded tables."""
    from tests.test_blockwise import grid_probe_code, grid_probe_values

    kind = {"unsigned": "dynamic", "nudged": "dynamic"}.get(code_kind, code_kind)
    code = grid_probe_code(kind, code_kind != "unsigned").copy()
    if code_kind == "nudged":
        code[200] = np.float32((code[199] + code[201]) / 2 + 1e-3)
    vals = grid_probe_values()
    vals = np.concatenate([vals, np.zeros((-len(vals)) % 255, np.float32)]).reshape(-1, 255)
    g = np.concatenate([np.ones((len(vals), 1), np.float32), vals], axis=1).reshape(-1)
    g[-1] = np.nan  # a NaN gradient (in the padding): its state is reset to 0, the block's absmax stays 1
    n, nb = len(g), len(g) // 256
    p = np.random.RandomState(6).randn(n).astype(np.float32)
    S1, A1 = _t(np.zeros(n, np.uint8)), _t(np.zeros(nb, np.float32))
    F.optimizer_update_8bit_blockwise("momentum", _t(g), _t(p), S1, None, 0.9, 0.0, 0.0, 0.0, 1e-8, 1, 1e-2,
                                      ms.Tensor(code), None, A1, None)
    _, q1, _, a1, _ = R.optimizer_update_8bit_blockwise("momentum", g, p, np.zeros(n, np.uint8), None, 0.9, 0.0, 0.0,
                                                        0.0, 1e-8, 1, 1e-2, code, None, np.zeros(nb, np.float32), None)
    assert np.all(a1 == 1.0)
    np.testing.assert_array_equal(A1.asnumpy(), a1)
    np.testing.assert_array_equal(S1.asnumpy(), q1)
    assert len(np.unique(q1)) == len(np.unique(R.quant_lut(code)))  # every code the table can give was taken
