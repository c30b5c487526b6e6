"""Blockwise 8-bit quantization: native kernels against the numpy reference, on random shapes."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import mindspore as ms

from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import functional as F

NP_OF = {ms.float32: np.float32, ms.float16: np.float16}


def make(shape, dtype, seed=0, scale=1.0):
    x = (np.random.RandomState(seed).randn(*shape) * scale).astype(np.float32)
    t = ms.Tensor(x).astype(dtype)
    return t, t.astype(ms.float32).asnumpy()


def out_dtype_name(dtype):
    return {ms.float32: "float32", ms.float16: "float16", ms.bfloat16: "bfloat16"}[dtype]


@pytest.mark.parametrize("dtype", [ms.float32, ms.float16, ms.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("blocksize", F.BLOCKWISE_BLOCKSIZES)
def test_quantize_matches_reference(dtype, blocksize):
    A, a32 = make((5, 1000 + blocksize // 3), dtype, seed=blocksize)
    code = F.create_dynamic_map().asnumpy()
    q, state = F.quantize_blockwise(A, blocksize=blocksize)
    q_ref, absmax_ref = R.quantize_blockwise(a32, code, blocksize)
    np.testing.assert_array_equal(q.asnumpy(), q_ref)
    np.testing.assert_array_equal(state.absmax.asnumpy(), absmax_ref)
    out = F.dequantize_blockwise(q, state)
    assert out.dtype == dtype and out.shape == A.shape
    ref = R.dequantize_blockwise(q_ref, absmax_ref, code, blocksize, out_dtype_name(dtype))
    np.testing.assert_array_equal(out.asnumpy().view(np.uint16 if dtype != ms.float32 else np.uint32),
                                  ref.view(np.uint16 if dtype != ms.float32 else np.uint32))


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
       blocksize=st.sampled_from([32, 64, 256, 4096]),
       scale=st.sampled_from([1e-3, 1.0, 300.0]),
       seed=st.integers(0, 2**16))
def test_random_shapes_roundtrip(shape, blocksize, scale, seed):
    A, a32 = make(shape, ms.float32, seed=seed, scale=scale)
    code = F.create_dynamic_map().asnumpy()
    q, state = F.quantize_blockwise(A, blocksize=blocksize)
    q_ref, absmax_ref = R.quantize_blockwise(a32, code, blocksize)
    np.testing.assert_array_equal(q.asnumpy(), q_ref)
    np.testing.assert_array_equal(state.absmax.asnumpy(), absmax_ref)
    back = F.dequantize_blockwise(q, state).asnumpy()
    # every value is within half a code step of the largest gap (~0.0155 of absmax)
    blocks = np.repeat(absmax_ref, blocksize)[: a32.size].reshape(a32.shape)
    assert np.all(np.abs(back - a32) <= 0.02 * blocks + 1e-30)


def test_zero_blocks_and_outliers():
    x = np.random.RandomState(1).randn(4 * 64).astype(np.float32)
    x[64:128] = 0.0          # an all-zero block
    x[130] = 1e4             # an outlier
    A = ms.Tensor(x)
    q, state = F.quantize_blockwise(A, blocksize=64)
    absmax = state.absmax.asnumpy()
    assert absmax[1] == 0.0 and absmax[2] == np.float32(1e4)
    assert np.all(q.asnumpy()[64:128] == 0)
    back = F.dequantize_blockwise(q, state).asnumpy()
    assert np.all(back[64:128] == 0.0)
    assert back[130] == np.float32(1e4)


def test_non_contiguous_equals_contiguous():
    base, _ = make((64, 300), ms.float32, seed=3)
    for view in (base.T, base[:, 10:200], base[::2]):
        q1, s1 = F.quantize_blockwise(view, blocksize=128)
        q2, s2 = F.quantize_blockwise(view.contiguous(), blocksize=128)
        np.testing.assert_array_equal(q1.asnumpy(), q2.asnumpy())
        np.testing.assert_array_equal(s1.absmax.asnumpy(), s2.absmax.asnumpy())


def test_out_and_absmax_are_honoured():
    A, _ = make((3, 500), ms.float32, seed=4)
    out = F.empty((3, 500), ms.uint8)
    absmax = F.empty((12,), ms.float32)
    q, state = F.quantize_blockwise(A, out=out, absmax=absmax, blocksize=128)
    assert q is out and state.absmax is absmax
    q2, s2 = F.quantize_blockwise(A, blocksize=128)
    np.testing.assert_array_equal(out.asnumpy(), q2.asnumpy())
    np.testing.assert_array_equal(absmax.asnumpy(), s2.absmax.asnumpy())
    deq_out = F.empty((3, 500), ms.float32)
    res = F.dequantize_blockwise(q, state, out=deq_out)
    assert res is deq_out
    np.testing.assert_array_equal(deq_out.asnumpy(), F.dequantize_blockwise(q2, s2).asnumpy())


def test_nested_quantizes_absmax_again():
    A, a32 = make((256, 256), ms.float32, seed=5)
    q, state = F.quantize_blockwise(A, blocksize=64, nested=True)
    assert state.nested and state.absmax.dtype == ms.uint8
    plain_q, plain = F.quantize_blockwise(A, blocksize=64)
    amax = plain.absmax.asnumpy()
    offset = amax.mean()
    np.testing.assert_allclose(float(state.offset.asnumpy()), offset, rtol=1e-6)
    qa_ref, aa_ref = R.quantize_blockwise(amax - state.offset.asnumpy(), F.create_dynamic_map().asnumpy(), 64)
    np.testing.assert_array_equal(state.absmax.asnumpy(), qa_ref)
    back = F.dequantize_blockwise(q, state).asnumpy()
    assert np.abs(back - a32).mean() < 0.011


def test_explicit_absmax_and_code_without_state():
    A, a32 = make((1000,), ms.float32, seed=6)
    code = F.create_dynamic_map(signed=True)
    q, state = F.quantize_blockwise(A, code=code, blocksize=256)
    back = F.dequantize_blockwise(q, absmax=state.absmax, code=code, blocksize=256)
    np.testing.assert_array_equal(back.asnumpy(), F.dequantize_blockwise(q, state).asnumpy())


def test_zero_size_gives_empty_results():
    A = ms.Tensor(np.zeros((0, 7), np.float32))
    q, state = F.quantize_blockwise(A, blocksize=64)
    assert q.shape == (0, 7) and q.dtype == ms.uint8 and state.absmax.shape == (0,)
    back = F.dequantize_blockwise(q, state)
    assert back.shape == (0, 7) and back.dtype == ms.float32


@pytest.mark.parametrize("level", ["scalar", "avx2", "best"])
def test_nan_and_inf_inputs_never_crash_and_agree_across_simd_levels(level):
    """NaN/inf in a block must not reach the 65536-bin table as an out-of-range index (a crash in
    the AVX2 path once). Run in a subprocess so a crash fails the test instead of the run; every SIMD
    level must give the portable path's bytes, and finite blocks are unaffected."""
    import hashlib
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, mindspore as ms; ms.set_device('CPU');"
        "import bitsandbytes_ms.functional as F;"
        "x = np.random.RandomState(3).randn(4, 256).astype(np.float32);"
        "x[0, 5] = np.nan; x[1, :] = np.nan; x[2, 7] = np.inf; x[2, 9] = -np.inf;"
        "out = [];"
        "[out.append(b''.join(a.asnumpy().tobytes() for a in (lambda r: (r[0], r[1].absmax))("
        "F.quantize_blockwise(ms.Tensor(x).astype(dt), blocksize=64)))) for dt in (ms.float32, ms.float16, ms.bfloat16)];"
        "import hashlib, sys; sys.stdout.write(hashlib.sha256(b''.join(out)).hexdigest())"
    )

    def run(lvl):
        env = dict(os.environ)
        env.pop("BNB_MS_SIMD", None)
        if lvl != "best":
            env["BNB_MS_SIMD"] = lvl
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert r.returncode == 0, (lvl, r.returncode, r.stderr[-1000:])
        return r.stdout.strip()

    assert run(level) == run("scalar")
    # finite rows: the same bytes as without the non-finite rows
    x = np.random.RandomState(3).randn(4, 256).astype(np.float32)
    ref, _ = F.quantize_blockwise(ms.Tensor(x[3:]), blocksize=64)
    x[0, 5] = np.nan
    got, _ = F.quantize_blockwise(ms.Tensor(x), blocksize=64)
    np.testing.assert_array_equal(got.asnumpy()[3], ref.asnumpy()[0])


@pytest.mark.parametrize("level", ["scalar", "best"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_tiny_absmax_blocks_quantize_as_at_normal_magnitude(level, dtype):
    """A block whose 1/absmax overflows (absmax < 2^-128, subnormals; issue 15 item 6): upstream multiplies
    by inf, so 0.0 became NaN -> code 0 (-absmax once dequantized) and every other value +-absmax. Here such a
    block gives the codes of the same block scaled by 2^64 (its values times 2^64 are exact), and the numpy
    reference agrees (it raised IndexError on the NaN). Checked at each SIMD level in a child process."""
    import os
    import subprocess
    import sys

    code = (
        "import numpy as np, mindspore as ms, sys; ms.set_device('CPU')\n"
        "import bitsandbytes_ms.functional as F\n"
        f"dt = ms.{dtype}\n"
        "r = np.random.default_rng(5)\n"
        "for scale in (1e-45, 1e-42, 1e-40, 2.5e-39):\n"
        "    x = (r.standard_normal(512) * scale * 3).astype(np.float32); x[::5] = 0.0\n"
        "    t = ms.Tensor(x).astype(dt)\n"
        "    q, s = F.quantize_blockwise(t, blocksize=64)\n"
        "    sys.stdout.write(q.asnumpy().tobytes().hex() + ' ' + s.absmax.asnumpy().tobytes().hex() + '\\n')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "BNB_MS_SIMD"}
    if level != "best":
        env["BNB_MS_SIMD"] = level
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    dyn = F.create_dynamic_map().asnumpy()
    r = np.random.default_rng(5)
    for line, scale in zip(out.split("\n"), (1e-45, 1e-42, 1e-40, 2.5e-39)):
        x = (r.standard_normal(512) * scale * 3).astype(np.float32)
        x[::5] = 0.0
        x = ms.Tensor(x).astype(getattr(ms, dtype)).astype(ms.float32).asnumpy()
        qhex, ahex = line.split()
        q = np.frombuffer(bytes.fromhex(qhex), np.uint8)
        absmax = np.frombuffer(bytes.fromhex(ahex), np.float32)
        rq, ra = R.quantize_blockwise(x, dyn, 64)
        np.testing.assert_array_equal(q, rq)
        np.testing.assert_array_equal(absmax, ra)
        # the same codes as the block at a normal magnitude (x * 2^64, exact), absmax scaled back
        big_q, big_a = R.quantize_blockwise(x * np.float32(2.0**64), dyn, 64)
        # except that an exact 0 of a subnormal block takes the zero code (issue 34: it dequantizes to 0)
        tiny = np.repeat((absmax > 0) & (absmax < np.finfo(np.float32).tiny), 64)[: x.size]  # (all-zero: codes 0)
        np.testing.assert_array_equal(q[~tiny | (x != 0)], big_q[~tiny | (x != 0)])
        assert (q[(x == 0) & tiny] == np.argmin(np.abs(dyn))).all() and dyn[np.argmin(np.abs(dyn))] == 0
        np.testing.assert_array_equal(absmax * np.float32(2.0**64), big_a)
        # dequantized: within half a code gap of the input, 0.0 stays within it (not -absmax)
        back = R.dequantize_blockwise(q, absmax, dyn, 64)
        amax = np.repeat(absmax, 64)
        assert np.all(np.abs(back - x) <= 0.5 * np.max(np.diff(dyn)) * amax + 1.5e-45)
        assert np.all(np.abs(back[x == 0]) < 0.01 * amax[x == 0] + 1.5e-45)


def test_nan_takes_code_zero_in_kernel_and_reference():
    """NaN clamps to -1 (code 0) in every path, and the reference's absmax ignores NaN as the kernels do."""
    x = np.random.default_rng(2).standard_normal(256).astype(np.float32)
    x[[3, 70, 200]] = np.nan
    x[64:128] = np.nan  # an all-NaN block: absmax 0, codes 0
    q, s = F.quantize_blockwise(ms.Tensor(x), blocksize=64)
    rq, ra = R.quantize_blockwise(x, F.create_dynamic_map().asnumpy(), 64)
    np.testing.assert_array_equal(q.asnumpy(), rq)
    np.testing.assert_array_equal(s.absmax.asnumpy(), ra)
    assert rq[3] == 0 and rq[200] == 0 and ra[1] == 0 and np.all(rq[64:128] == 0)


def grid_probe_code(code_kind: str, signed: bool) -> np.ndarray:
    """The codes of the grid-bin tests (here and the optimizers' in test_optim_functional.py): the dynamic or linear
    map, or 256 entries of which most are one value (a table of few runs, repeated run codes skipped)."""
    if code_kind == "dynamic":
        return F.create_dynamic_map(signed).asnumpy()
    if code_kind == "linear":
        return F.create_linear_map(signed).asnumpy()
    base = np.sort(np.random.RandomState(5).uniform(-1 if signed else 0, 1, 9)).astype(np.float32)
    code = np.sort(np.concatenate([base, np.full(247, base[3], np.float32)])).astype(np.float32)
    code[-1] = 1.0
    return code


def grid_probe_values() -> np.ndarray:
    """Every value of the 65536-bin grid on [-1, 1], and the floats just below and just above each."""
    bins = (-1.0 + 2.0 * np.arange(65536, dtype=np.float32) / np.float32(65535)).astype(np.float32)
    vals = np.concatenate([bins, np.nextafter(bins, np.float32(-2)), np.nextafter(bins, np.float32(2))])
    return np.clip(vals, -1, 1).astype(np.float32)


@pytest.mark.parametrize("signed", [True, False], ids=["signed", "unsigned"])
@pytest.mark.parametrize("code_kind", ["dynamic", "linear", "sparse"])
def test_every_grid_bin_takes_the_reference_code(signed, code_kind):
    """Values at, just below and just above every grid bin's value (every boundary between two codes of the
    65536-entry table) under three codes, one of them with long runs (many codes never chosen), against the
    numpy reference."""
    code, vals = grid_probe_code(code_kind, signed), grid_probe_values()
    # blocks of 4096 whose absmax is exactly 1 (x * (1 / 1) is x), so every value lands on its own bin
    vals = np.concatenate([vals, np.zeros((-len(vals)) % 4095, np.float32)]).reshape(-1, 4095)
    A = np.concatenate([np.ones((len(vals), 1), np.float32), vals], axis=1).reshape(-1)
    q, state = F.quantize_blockwise(ms.Tensor(A), code=ms.Tensor(code), blocksize=4096)
    q_ref, absmax_ref = R.quantize_blockwise(A, code, 4096)
    np.testing.assert_array_equal(state.absmax.asnumpy(), absmax_ref)
    np.testing.assert_array_equal(q.asnumpy(), q_ref)
