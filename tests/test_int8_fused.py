"""The fused LLM.int8() linear forward (``cint8_linear_<dtype>``, functional.int8_linear) and the native
outlier columns (``cint8_mixed_mm_dequant_<dtype>``, functional.int8_mixed_scaled_mm).

* Every CPU kernel path: a subprocess per int8 GEMM path (``BNB_MS_INT8_GEMM``) and SIMD level
  (``BNB_MS_SIMD``) runs, through ctypes (tools/aot_ctypes.py), the fused entry point and the unfused
  composition the Python path makes of the native ops (the fp16 cast of fp32 activations, cint8_vector_quant,
  cigemmlt_32, cdequant_mm_int32_* / cint8_mixed_mm_dequant_*), on fp32/fp16/bf16 activations, threshold 0
  and 6 with real outliers (whole columns, a single element, exactly 6.0, fp16 overflow of fp32 values),
  1/3/16 rows and 3-D input, K not a multiple of 16/32/64, bias none / same dtype / another dtype. Fused ==
  unfused bit for bit in each run, every run gives the same bytes, and they equal the numpy reference
  (bitsandbytes_ms/_reference.py). A path this CPU lacks is skipped with "CPU lacks <isa>".
* In process, through MindSpore: ``bnb.matmul`` / ``Linear8bitLt`` with the fused forward on and off give the
  same bytes and the same ``state.idx``; at inference a forward is one host call (no ops.Custom op); under
  ``mindspore.value_and_grad`` the custom-bprop path runs and its gradients are unchanged; training mode
  stays on MatMul8bitFp.
* Bad arguments raise ValueError/TypeError naming the argument before native code runs; malformed native
  calls return the library's status codes.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms

import bitsandbytes_ms as bnb

bnb.register()  # mindtorch patch registry (as tests/test_int8_nn.py)

import torch  # noqa: E402  (mindtorch)

import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _hostcall as H
from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import cextension
from bitsandbytes_ms.autograd import _functions as AF

ROOT = Path(__file__).resolve().parent.parent
TOOLS = str(ROOT / "tools")
sys.path.insert(0, TOOLS)
import int8_fused_check as FC  # noqa: E402  (numpy + ctypes; the CPU-path harness, also run on GPU hosts)

LIB = str(cextension.LIBRARY_PATH)
MS = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}
_bits = FC.bits


def _values(a):
    return np.asarray(a).astype(np.float32)


@pytest.fixture(scope="module")
def path_runs(tmp_path_factory):
    cases = FC.make_cases(R)
    return cases, FC.run_cpu_paths(LIB, cases, tmp_path_factory.mktemp("fused"))


@pytest.mark.parametrize("gemm,simd", FC.RUNS, ids=[f"{g or 'auto'}-{s or 'default'}" for g, s in FC.RUNS])
def test_fused_equals_unfused_and_reference_on_every_path(path_runs, gemm, simd):
    cases, runs = path_runs
    info, got = runs[(gemm, simd)]
    why = FC.skip_reason(info, gemm, simd)
    if why:
        pytest.skip(why)
    if gemm is not None:
        assert info["path_m1"] == gemm  # a forced path is used for every M
    assert info["cases"] == len(cases) == 216
    assert info["nfail"] == 0, info["fails"]
    for key, c in cases.items():
        ref, flags = FC.reference(c, R)
        np.testing.assert_array_equal(got[key + "/out"], ref, err_msg=f"{key} vs reference ({c['dtype']}, thr={c['thr']})")
        np.testing.assert_array_equal(got[key + "/flags"], flags, err_msg=key)


def test_cases_have_real_outliers(path_runs):
    """threshold 6 cases flag the planted columns (so the mixed path runs), threshold 0 flags nothing."""
    cases, runs = path_runs
    _, got = runs[(None, None)]
    n_mixed = 0
    for key, c in cases.items():
        fl = got[key + "/flags"]
        if float(c["thr"]) == 0.0:
            assert not fl.any(), key
        elif c["A"].shape[-1] > 8:
            assert fl[7] and fl[c["A"].shape[-1] // 2], key
            n_mixed += 1
    assert n_mixed >= 90


# ---------------------------------------------------------------------------------------------
# through MindSpore: bnb.matmul / Linear8bitLt, fused on and off
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fused_switch(monkeypatch):
    def set_fused(flag):
        monkeypatch.setattr(AF, "FUSED_INFERENCE", flag)
    return set_fused


def _state(CB, SCB, threshold):
    st = AF.MatmulLtState()
    st.CB, st.SCB, st.is_training, st.has_fp16_weights, st.threshold = CB, SCB, False, False, threshold
    return st


def _ms_case(lead, K, N, dtype, threshold, seed):
    rng = np.random.RandomState(seed)
    CB, SCB = FC.weight(N, K, rng, R)
    A = FC.activations(lead, K, dtype, rng, plant=True)
    return (torch.tensor(_values(A)).to(MS[dtype]), torch.tensor(CB), torch.tensor(SCB),
            torch.tensor((rng.standard_normal(N) * 0.5).astype(np.float32)).to(MS[dtype]))


SHAPES = [((1,), 100, 37), ((3,), 100, 37), ((16,), 100, 37), ((2, 3), 129, 50), ((16,), 576, 96)]


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("dtype", list(MS))
@pytest.mark.parametrize("lead,K,N", SHAPES, ids=[f"{'x'.join(map(str, s[0]))}-{s[1]}-{s[2]}" for s in SHAPES])
def test_matmul_fused_equals_unfused(fused_switch, lead, K, N, dtype, threshold, with_bias):
    A, CB, SCB, bias = _ms_case(lead, K, N, dtype, threshold, seed=K + N)
    bias = bias if with_bias else None
    st_f, st_u = _state(CB, SCB, threshold), _state(CB, SCB, threshold)
    fused_switch(True)
    assert AF._use_fused()
    of = bnb.matmul(A, CB, state=st_f, bias=bias)
    fused_switch(False)
    ou = bnb.matmul(A, CB, state=st_u, bias=bias)
    assert of.dtype == ou.dtype == MS[dtype] and tuple(of.shape) == tuple(ou.shape) == lead + (N,)
    np.testing.assert_array_equal(_bits(of.float().numpy()), _bits(ou.float().numpy()))
    assert (st_f.idx is None) == (st_u.idx is None) == (threshold == 0.0)
    if threshold:
        assert st_f.idx.dtype == st_u.idx.dtype == ms.int64
        np.testing.assert_array_equal(st_f.idx.numpy(), st_u.idx.numpy())
        assert 7 in st_f.idx.numpy().tolist()
    # and the public functional entry point gives the same result
    res, cols = F.int8_linear(A, CB, SCB, bias, threshold)
    np.testing.assert_array_equal(_bits(res.float().numpy()), _bits(of.float().numpy()))
    assert (cols is None) == (threshold == 0.0)
    if threshold:
        np.testing.assert_array_equal(cols.numpy(), st_u.idx.numpy())


def test_matmul_fused_out_argument_and_empty(fused_switch):
    A, CB, SCB, bias = _ms_case((3,), 100, 37, "float16", 6.0, seed=1)
    fused_switch(True)
    out = torch.zeros(3, 37, dtype=torch.float16)
    r = bnb.matmul(A, CB, out=out, state=_state(CB, SCB, 6.0), bias=bias)
    assert r is out
    fused_switch(False)
    ref = bnb.matmul(A, CB, state=_state(CB, SCB, 6.0), bias=bias)
    np.testing.assert_array_equal(_bits(out.float().numpy()), _bits(ref.float().numpy()))
    fused_switch(True)
    e = bnb.matmul(torch.zeros(0, 100, dtype=torch.float16), CB, state=_state(CB, SCB, 6.0), bias=bias)
    assert tuple(e.shape) == (0, 37) and e.dtype == torch.float16
    e2, cols = F.int8_linear(torch.zeros(2, 0, 100), CB, SCB, None, 6.0)
    assert tuple(e2.shape) == (2, 0, 37) and cols.numel() == 0


@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_linear8bitlt_eval_forward_is_one_native_call(fused_switch, monkeypatch, dtype, threshold):
    """Linear8bitLt in eval mode (quantized weight, no gradient recorded): one host call per forward, no
    ops.Custom op, the unfused path's bytes and state.idx."""
    rng = np.random.RandomState(7)
    W = (rng.standard_normal((96, 160)) * 0.05).astype(np.float32)
    b = rng.standard_normal(96).astype(np.float32)
    x = FC.activations((2, 5), 160, "float32", rng, plant=True)

    def layer():
        m = bnb.nn.Linear8bitLt(160, 96, has_fp16_weights=False, threshold=threshold)
        m.weight = bnb.nn.Int8Params(torch.tensor(W), requires_grad=False, has_fp16_weights=False)
        m.bias = torch.nn.Parameter(torch.tensor(b), requires_grad=False)
        return m.to("cpu").eval()

    xt = torch.tensor(x).to(MS[dtype])
    fused_switch(False)
    mu = layer()
    ref = mu(xt)
    fused_switch(True)
    mf = layer()
    mf(xt)  # first call: casts the bias to x's dtype (as upstream)
    counts = {"host": 0, "custom": 0}
    real_host, real_custom = H.Bound.__call__, cextension.NativeFunction.__call__
    real_rows = H.Bound.run_rows

    def host_call(self):
        counts["host"] += 1
        return real_host(self)

    def host_rows(self, *a, **k):  # the lean call (the plan's fast path)
        counts["host"] += 1
        return real_rows(self, *a, **k)

    def custom_call(self, *a, **k):
        counts["custom"] += 1
        return real_custom(self, *a, **k)

    monkeypatch.setattr(H.Bound, "__call__", host_call)
    monkeypatch.setattr(H.Bound, "run_rows", host_rows)
    monkeypatch.setattr(cextension.NativeFunction, "__call__", custom_call)
    with torch.no_grad():
        got = mf(xt)
    assert counts == {"host": 1, "custom": 0}
    got2 = mf(xt)  # without no_grad: nothing is being recorded either
    assert counts == {"host": 2, "custom": 0}
    monkeypatch.setattr(H.Bound, "__call__", real_host)
    monkeypatch.setattr(H.Bound, "run_rows", real_rows)
    monkeypatch.setattr(cextension.NativeFunction, "__call__", real_custom)
    for g in (got, got2):
        assert g.dtype == MS[dtype] and tuple(g.shape) == (2, 5, 96)
        np.testing.assert_array_equal(_bits(g.float().numpy()), _bits(ref.float().numpy()))
    if threshold:
        np.testing.assert_array_equal(mf.state.idx.numpy(), mu.state.idx.numpy())


def test_ops_custom_fused_when_host_calls_are_off(fused_switch):
    """With host calls switched off the fused forward runs as one ops.Custom op, same bytes."""
    A, CB, SCB, bias = _ms_case((3,), 100, 37, "bfloat16", 6.0, seed=3)
    fused_switch(True)
    a = bnb.matmul(A, CB, state=_state(CB, SCB, 6.0), bias=bias)
    old = H.set_enabled(False)
    try:
        st = _state(CB, SCB, 6.0)
        b = bnb.matmul(A, CB, state=st, bias=bias)
        idx = st.idx.numpy()
    finally:
        H.set_enabled(old)
    np.testing.assert_array_equal(_bits(a.float().numpy()), _bits(b.float().numpy()))
    assert 7 in idx.tolist()


@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_gradient_path_is_unchanged(fused_switch, threshold):
    """Under mindspore.value_and_grad the MatMul8bitLt cell (custom bprop) runs, fused switch or not, and gives
    the same value and gradients."""
    A, CB, SCB, bias = _ms_case((4,), 100, 37, "float32", threshold, seed=9)
    seen = []
    real = AF._int8_forward_fused

    def spy(*a, **k):
        seen.append(1)
        return real(*a, **k)

    res = {}
    for flag in (True, False):
        fused_switch(flag)
        AF._int8_forward_fused = spy
        try:
            def loss(x):
                return bnb.matmul(x, CB, state=_state(CB, SCB, threshold), bias=bias).sum()

            v, g = ms.value_and_grad(loss)(A)
        finally:
            AF._int8_forward_fused = real
        res[flag] = (v.asnumpy(), g.asnumpy())
    assert not seen
    np.testing.assert_array_equal(res[True][0], res[False][0])
    np.testing.assert_array_equal(res[True][1], res[False][1])


def test_training_mode_stays_on_matmul8bitfp(fused_switch, monkeypatch):
    A, CB, SCB, bias = _ms_case((2,), 64, 16, "float32", 0.0, seed=4)
    called = []
    monkeypatch.setattr(AF, "_int8_forward_fused", lambda *a, **k: called.append(1))
    fused_switch(True)
    st = _state(CB, SCB, 0.0)
    st.is_training = True
    bnb.matmul(A, CB, state=st, bias=bias)
    assert not called


def test_mixed_scaled_mm_uses_the_native_outlier_columns():
    """int8_mixed_scaled_mm == the numpy reference's fixed fp32 order (and equals the fused forward's bytes);
    outlier_cols is a set (order and duplicates do not matter)."""
    A, CB, SCB, bias = _ms_case((5,), 129, 50, "float16", 6.0, seed=11)
    CA, SCA, cols = F.int8_vectorwise_quant(A, 6.0)
    out, subA = F.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, cols, bias)
    C = R.int8_gemm(CA.numpy(), CB.numpy())
    flags = np.zeros(129, np.uint8)
    flags[cols.numpy()] = 1
    ref = R.int8_mixed_mm_dequant(C, SCA.numpy(), SCB.numpy(), _values(bias.float().numpy()), A.float().numpy(),
                                  CB.numpy(), flags, "float16")
    np.testing.assert_array_equal(_bits(out.numpy()), _bits(ref))
    assert tuple(subA.shape) == (5, cols.numel())
    np.testing.assert_array_equal(subA.float().numpy(), A.float().numpy()[:, cols.numpy()])
    shuffled = torch.tensor(np.concatenate([cols.numpy()[::-1], cols.numpy()[:1]]))
    out2, _ = F.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, shuffled, bias)
    np.testing.assert_array_equal(_bits(out2.numpy()), _bits(ref))
    fused, _ = F.int8_linear(A, CB, SCB, bias, 6.0)
    np.testing.assert_array_equal(_bits(fused.numpy()), _bits(ref))


TILE_CASES = [(1, 70, 1), (5, 700, 250), (11, 130, 600), (4, 64, 40), (9, 1000, 193), (3, 700, 250),
              (2, 130, 600)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rows,N,n_out", TILE_CASES, ids=[f"{m}x{n}-{j}cols" for m, n, j in TILE_CASES])
def test_mixed_outlier_tiles_equal_the_reference(rows, N, n_out, dtype):
    """The outlier sums run in tiles of 4 rows x 4 vectors over chunks of columns (prefill with many outlier
    columns; up to 4 rows, decode: chunk by chunk of weight rows right after their GEMM); every output is still the
    reference's chain: whole and partial row groups, chunks and their last columns, one block, two blocks of a
    split (193..383 columns) and blocks of 192, a NaN and an inf among the outlier activations (the block
    recomputed with the per-step NaN rule), bias or none, every output dtype."""
    K = 640
    rng = np.random.RandomState(rows * 1000 + N + n_out)
    CB = rng.randint(-127, 128, (N, K)).astype(np.int8)
    SCB = rng.uniform(0.01, 2.0, N).astype(np.float32)
    a = rng.standard_normal((rows, K)).astype(np.float32)
    cols = rng.choice(K, n_out, replace=False)
    a[rng.randint(0, rows, n_out), cols] = rng.choice([-1, 1], n_out) * rng.uniform(7, 40, n_out)
    nan_row = 4 if rows > 4 else 1 if rows > 1 else None
    if nan_row is not None:
        a[0, cols[0]] = 9.0  # the column stays an outlier column (NaN never is one)
        a[nan_row, cols[0]] = np.nan
        a[rows - 1, cols[-1]] = np.inf
    A = torch.tensor(_values(a.astype(np.float32))).to(MS[dtype])
    bias = torch.tensor(rng.standard_normal(N).astype(np.float32)).to(MS[dtype])
    for b in (bias, None):
        out, flags = F.int8_linear(A, torch.tensor(CB), torch.tensor(SCB), b, 6.0)
        want, want_flags = R.int8_linear(A.float().numpy(), CB, SCB, None if b is None else b.float().numpy(), 6.0,
                                         dtype)
        assert int(np.asarray(want_flags).sum()) == n_out
        np.testing.assert_array_equal(np.sort(np.asarray(flags.numpy())), np.nonzero(want_flags)[0])
        np.testing.assert_array_equal(_bits(out.float().numpy()), _bits(np.asarray(want, np.float32)))
        if nan_row is not None:
            assert np.isnan(out.float().numpy()[nan_row]).all()


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def _good():
    rng = np.random.RandomState(0)
    return (torch.tensor(rng.standard_normal((3, 64)).astype(np.float32)),
            torch.tensor(rng.randint(-127, 128, (16, 64)).astype(np.int8)),
            torch.tensor(rng.uniform(0.1, 1, 16).astype(np.float32)),
            torch.tensor(rng.standard_normal(16).astype(np.float32)))


@pytest.mark.parametrize("what,arg,exc,match", [
    ("A int8", "A", ValueError, "`A` must have dtype"),
    ("A not a tensor", "A", TypeError, "`A` must be a mindspore.Tensor"),
    ("A 0-d", "A", ValueError, "`A` must have at least 1 dimension"),
    ("K mismatch", "A", ValueError, "inner dimensions do not match"),
    ("CB float", "CB", ValueError, "`CB` must have dtype int8"),
    ("CB 3-D", "CB", ValueError, "`CB` must be 2-D"),
    ("SCB fp16", "SCB", ValueError, "`SCB` must have dtype float32"),
    ("SCB size", "SCB", ValueError, "`SCB` must have CB.shape\\[0\\] = 16 values"),
    ("bias int", "bias", ValueError, "`bias` must have dtype"),
    ("bias size", "bias", ValueError, "`bias` must have CB.shape\\[0\\] = 16 values"),
    ("threshold negative", "threshold", ValueError, "`threshold` must be >= 0"),
    ("threshold str", "threshold", TypeError, "`threshold` must be a float"),
    ("K too large", "A", ValueError, "`CB` must have at most 131071 columns"),
])
def test_int8_linear_bad_input_raises_before_native_code(monkeypatch, what, arg, exc, match):
    A, CB, SCB, bias = _good()
    kw = dict(A=A, CB=CB, SCB=SCB, bias=bias, threshold=6.0)
    bad = {
        "A int8": lambda: A.to(torch.int8), "A not a tensor": lambda: A.numpy(), "A 0-d": lambda: torch.tensor(1.0),
        "K mismatch": lambda: A[:, :60].contiguous(), "CB float": lambda: CB.float(), "CB 3-D": lambda: CB.reshape(2, 8, 64),
        "SCB fp16": lambda: SCB.half(), "SCB size": lambda: SCB[:15], "bias int": lambda: bias.to(torch.int32),
        "bias size": lambda: bias[:3], "threshold negative": lambda: -1.0, "threshold str": lambda: "6",
        "K too large": lambda: torch.zeros(1, 131072),
    }[what]()
    kw[arg] = bad
    if what == "K too large":
        kw["CB"] = torch.zeros(16, 131072, dtype=torch.int8)
    native = []
    monkeypatch.setattr(F.Int8LinearPlan, "__call__", lambda *a, **k: native.append(1))
    with pytest.raises(exc, match=f"int8_linear: .*{match}|int8_linear: {match}"):
        F.int8_linear(**kw)
    assert not native


def test_int8_mixed_scaled_mm_bad_outlier_cols():
    A, CB, SCB, bias = _good()
    CA, SCA, _ = F.int8_vectorwise_quant(A)
    with pytest.raises(ValueError, match="`outlier_cols` must hold column indices in \\[0, 64\\)"):
        F.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, torch.tensor(np.array([3, 64], np.int64)), bias)
    with pytest.raises(ValueError, match="`outlier_cols` must have dtype"):
        F.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, torch.tensor(np.array([3.0], np.float32)), bias)
    with pytest.raises(ValueError, match="int8_mixed_scaled_mm: `A` must be \\[3, 64\\]"):
        F.int8_mixed_scaled_mm(A[:, :32].contiguous(), CA, CB, SCA, SCB, torch.tensor(np.array([3], np.int64)), bias)


def test_malformed_native_calls_return_status():
    """The entry points' own checks (csrc/checks/int8.h, shared with the CUDA library)."""
    sys.path.insert(0, TOOLS)
    from aot_ctypes import Aot

    lib = Aot(LIB)
    rng = np.random.RandomState(0)
    A = rng.standard_normal((3, 64)).astype(np.float32)
    CB = rng.randint(-127, 128, (16, 64)).astype(np.int8)
    SCB = np.ones(16, np.float32)
    out, fl = np.empty((3, 16), np.float32), np.empty(64, np.uint8)
    thr = np.array(6.0, np.float32)
    good = [A, CB, SCB, None, thr, out, fl]
    assert lib("cint8_linear_fp32", good) == 0
    bad = {
        1: good[:6],                                                                  # E_NPARAM
        2: [A.astype(np.float16), CB, SCB, None, thr, out, fl],                       # A dtype != suffix
        3: [A, CB[:, :63].copy(), SCB, None, thr, out, fl],                           # K mismatch
        4: [A, CB, SCB, None, np.array(-1.0, np.float32), out, fl],                   # negative threshold
    }
    for status, args in bad.items():
        assert lib("cint8_linear_fp32", args) == status, status
    assert lib("cint8_linear_fp32", [A, CB, SCB, np.ones(15, np.float32), thr, out, fl]) == 3  # bias size
    assert lib("cint8_linear_fp32", [A, CB, SCB, None, thr, out, np.empty(63, np.uint8)]) == 3  # flags size
    C = np.zeros((3, 16), np.int32)
    rs = np.ones(3, np.float32)
    mgood = [C, rs, SCB, None, A, CB, fl, out]
    assert lib("cint8_mixed_mm_dequant_fp32", mgood) == 0
    assert lib("cint8_mixed_mm_dequant_fp32", mgood[:7]) == 1
    assert lib("cint8_mixed_mm_dequant_fp32", [C, rs, SCB, None, A.astype(np.float16), CB, fl, out]) == 2
    assert lib("cint8_mixed_mm_dequant_fp32", [C, rs, SCB, None, A[:2].copy(), CB, fl, out]) == 3
    assert lib("cint8_mixed_mm_dequant_fp32", [C, rs, SCB, None, A, CB, fl, np.empty((3, 15), np.float32)]) == 3
    # empty calls are well-formed: flags zeroed; K == 0 writes zeros
    fl2 = np.full(64, 5, np.uint8)
    assert lib("cint8_linear_fp32", [np.zeros((0, 64), np.float32), CB, SCB, None, thr, np.empty((0, 16), np.float32), fl2]) == 0
    assert not fl2.any()
    o0 = np.full((3, 16), 5.0, np.float32)
    assert lib("cint8_linear_fp32", [np.zeros((3, 0), np.float32), np.zeros((16, 0), np.int8), SCB, None, thr, o0,
                                     np.empty(0, np.uint8)]) == 0
    assert not o0.any()


def test_plan_follows_replaced_and_rewritten_weights(fused_switch):
    """The plan cached on the state is rebuilt when CB/SCB are replaced; after an in-place write into the same
    tensors (mindtorch's copy_ gives them new storage) the next call reads the new bytes by itself."""
    fused_switch(True)
    A, CB, SCB, bias = _ms_case((3,), 100, 37, "float16", 6.0, seed=21)
    _, CB2, SCB2, _ = _ms_case((3,), 100, 37, "float16", 6.0, seed=22)
    st = _state(CB, SCB, 6.0)

    def ref(cb, scb):
        fused_switch(False)
        try:
            return bnb.matmul(A, cb, state=_state(cb, scb, 6.0), bias=bias).numpy()
        finally:
            fused_switch(True)

    np.testing.assert_array_equal(bnb.matmul(A, CB, state=st, bias=bias).numpy(), ref(CB, SCB))
    plan = st.__dict__["_int8_linear_plan"]
    st.CB, st.SCB = CB2, SCB2  # replaced: a new plan
    np.testing.assert_array_equal(bnb.matmul(A, CB2, state=st, bias=bias).numpy(), ref(CB2, SCB2))
    assert st.__dict__["_int8_linear_plan"] is not plan
    plan = st.__dict__["_int8_linear_plan"]
    CB2.copy_(CB)  # rewritten in place: same plan, the new bytes
    SCB2.copy_(SCB)
    np.testing.assert_array_equal(bnb.matmul(A, CB2, state=st, bias=bias).numpy(), ref(CB, SCB))
    assert st.__dict__["_int8_linear_plan"] is plan


def test_linear8bitlt_load_state_dict_after_fused_forward(fused_switch):
    """A layer that ran fused forwards and then loads another quantized checkpoint gives that checkpoint's
    result (the one a fresh layer loading it gives)."""
    fused_switch(True)
    rng = np.random.RandomState(8)
    x = torch.tensor(rng.standard_normal((2, 64)).astype(np.float32)).half()

    def layer(seed):
        r = np.random.RandomState(seed)
        m = bnb.nn.Linear8bitLt(64, 24, has_fp16_weights=False, threshold=6.0)
        m.weight = bnb.nn.Int8Params(torch.tensor((r.standard_normal((24, 64)) * 0.1).astype(np.float32)),
                                     requires_grad=False, has_fp16_weights=False)
        m.bias = torch.nn.Parameter(torch.tensor(r.standard_normal(24).astype(np.float32)), requires_grad=False)
        return m.to("cpu").eval()

    a, b = layer(1), layer(2)
    a(x)
    a.load_state_dict(b.state_dict())
    fresh = layer(3)
    fresh.load_state_dict(b.state_dict())
    np.testing.assert_array_equal(a(x).numpy(), fresh(x).numpy())
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())


@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_same_bytes_for_any_thread_count(threshold):
    """The fused forward (vector quant, GEMM, mixed dequant on the library's pool) gives the same bytes with
    1, 2, 3 and 5 threads."""
    rng = np.random.RandomState(5)
    CB, SCB = FC.weight(1024, 4096, rng, R)
    x = rng.standard_normal((16, 4096)).astype(np.float32)
    x[:, [5, 700, 4000]] *= 40.0
    A, CBt, SCBt = torch.tensor(x), torch.tensor(CB), torch.tensor(SCB)
    bias = torch.tensor(rng.standard_normal(1024).astype(np.float32))
    outs = {}
    try:
        for n in (1, 2, 3, 5):
            assert cextension.set_num_threads(n) == n
            for rows in (1, 16):
                out, _ = F.int8_linear(A[:rows], CBt, SCBt, bias, threshold)
                outs[(n, rows)] = out.numpy().tobytes()
    finally:
        cextension.set_num_threads(0)
    for (n, rows), v in outs.items():
        assert v == outs[(1, rows)], (n, rows)


@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("dtype", list(MS))
def test_nan_row_gives_nan_outputs_on_every_path(fused_switch, dtype, threshold):
    """A NaN in an input row (issue 15 item 2): that row's outputs are NaN and the other rows are what they are
    without it, on every forward (fused host call, fused ops.Custom, unfused, value_and_grad's MatMul8bitLt
    cell, training mode's MatMul8bitFp), as upstream (torch.max propagates NaN into the row absmax)."""
    A, CB, SCB, bias = _ms_case((5,), 100, 37, dtype, threshold, seed=11)
    x = A.float().numpy()
    x[1, 40] = np.nan
    An = torch.tensor(x).to(MS[dtype])
    nan_rows, keep = [1, 3], [0, 2, 4]  # FC.activations puts a NaN in row 3

    def run(flag, training=False, grad=False, host=True):
        fused_switch(flag)
        old = H.set_enabled(host)
        try:
            st = _state(CB, SCB, threshold)
            st.is_training = training
            if grad:
                out = {}

                def loss(a):
                    out["y"] = bnb.matmul(a, CB, state=st, bias=bias)
                    return out["y"].astype(ms.float32).sum()

                ms.value_and_grad(loss)(An)
                y = out["y"]
            else:
                y = bnb.matmul(An, CB, state=st, bias=bias)
        finally:
            H.set_enabled(old)
        return y.float().numpy()

    ref = run(True)
    assert np.isnan(ref[nan_rows]).all() and np.isfinite(ref[keep]).all()
    # the rows without NaN: those of the same input with the NaN of row 1 replaced by a finite value (row 3's
    # absmax is NaN either way; threshold 6: column 40 is not an outlier column there either)
    x0 = x.copy()
    x0[1, 40] = 0.25
    clean = bnb.matmul(torch.tensor(x0).to(MS[dtype]), CB, state=_state(CB, SCB, threshold), bias=bias).float().numpy()
    np.testing.assert_array_equal(_bits(ref[keep]), _bits(clean[keep]))
    for kw in (dict(flag=True, host=False), dict(flag=False), dict(flag=False, grad=True)):
        np.testing.assert_array_equal(_bits(run(**kw)), _bits(ref), err_msg=str(kw))
    fp = run(False, training=True)  # MatMul8bitFp: dequantized weight, float matmul
    assert np.isnan(fp[nan_rows]).all() and np.isfinite(fp[keep]).all()
