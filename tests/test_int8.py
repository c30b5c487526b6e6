"""LLM.int8() functional ops: native kernels vs the numpy reference (_reference.py), vs upstream
bitsandbytes 0.50.2 fixtures (bit-exact), shapes (3-D/4-D), dtypes, K edge cases, outliers, bad input."""


import numpy as np
import pytest
from simd_levels import assert_levels_agree
from hypothesis import given, settings, strategies as st

import mindspore as ms

import bitsandbytes_ms.functional as F
from bitsandbytes_ms import _reference as R
from upstream_vectors import bits, load, to_ms

DTYPES = {"float32": ms.float32, "float16": ms.float16, "bfloat16": ms.bfloat16}
FIX = load("int8")


def _f32(t):
    return t.astype(ms.float32).asnumpy()


# ---------------------------------------------------------------------------------------------
# upstream fixtures
# ---------------------------------------------------------------------------------------------
VQ = [n for n, (c, _) in FIX.items() if c["kind"] == "int8_vectorwise_quant"]
MM = [n for n, (c, _) in FIX.items() if c["kind"] == "int8_linear_matmul"]
MMDQ = [n for n, (c, _) in FIX.items() if c["kind"] == "int8_mm_dequant"]


@pytest.mark.parametrize("name", VQ)
def test_vectorwise_quant_matches_upstream(name):
    case, arr = FIX[name]
    A = FIX[case["input"]][1]["A"]
    CA, stats, cols = F.int8_vectorwise_quant(to_ms(A), threshold=case["threshold"])
    np.testing.assert_array_equal(CA.asnumpy(), arr["CA"])
    np.testing.assert_array_equal(bits(stats.asnumpy()), bits(arr["row_stats"]))
    if case["outlier_cols_is_none"]:
        assert cols is None
    else:
        np.testing.assert_array_equal(cols.asnumpy(), arr["outlier_cols"])
        assert cols.dtype == ms.int64
    if "dequant" in arr:
        deq = F.int8_vectorwise_dequant(CA, stats)
        np.testing.assert_array_equal(bits(deq.asnumpy()), bits(arr["dequant"]))


@pytest.mark.parametrize("name", MM)
def test_linear_matmul_matches_upstream(name):
    case, arr = FIX[name]
    out = F.int8_linear_matmul(to_ms(arr["A"]), to_ms(arr["B"])).asnumpy()
    assert out.dtype == np.int32 and out.shape == arr["out"].shape
    expected = arr["out"] if case["upstream_equals_exact"] else arr["exact"].astype(np.int32)
    np.testing.assert_array_equal(out, expected)
    if not case["upstream_equals_exact"]:
        assert not np.array_equal(out, arr["out"])  # upstream's fp32 path is the inexact one


@pytest.mark.parametrize("name", MMDQ)
def test_mm_dequant_matches_upstream(name):
    case, arr = FIX[name]
    bias = to_ms(arr["bias"]) if case["bias"] else None
    out = F.int8_mm_dequant(to_ms(arr["A"]), to_ms(arr["row_stats"]), to_ms(arr["col_stats"]), bias=bias)
    assert out.dtype == ms.float16
    assert tuple(out.shape) == arr["out"].shape  # 3-D A -> 2-D result, as upstream
    np.testing.assert_array_equal(bits(out.asnumpy()), bits(arr["out"]))


def test_double_quant_is_refused_upstream_but_runs_here():
    case, _ = FIX["dq_f16_17x33_t6"]
    assert case["error"].startswith("NotImplementedError")
    A = FIX["in_f16_17x33"][1]["A"]
    CA, CAt, rs, cs, cols = F.int8_double_quant(to_ms(A), threshold=6.0)
    ref_CA, ref_rs, flags = R.int8_vector_quant(A.astype(np.float32), 6.0, "float16")
    np.testing.assert_array_equal(CA.asnumpy(), ref_CA)
    np.testing.assert_array_equal(rs.asnumpy(), ref_rs)
    a = A.astype(np.float32)
    a = np.where(np.abs(a) >= 6.0, 0, a)
    np.testing.assert_array_equal(cs.asnumpy(), np.abs(a).max(0))
    np.testing.assert_array_equal(CAt.asnumpy(), np.rint(a * 127 / np.abs(a).max(0)).astype(np.int8))
    np.testing.assert_array_equal(cols.asnumpy(), np.nonzero(flags)[0])
    with pytest.raises(ValueError, match="row_stats must be None"):
        F.int8_double_quant(to_ms(A), row_stats=ms.Tensor(np.zeros(17, np.float32)))


@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_double_quant_nan_column_gets_nan_col_stats(threshold):
    """upstream CUDA's col_stats is A.abs().amax(0): a NaN propagates into its column's scale (MindSpore's CPU
    max skipped it, leaving a finite scale for a column holding NaN)."""
    A = np.random.RandomState(5).randn(6, 9).astype(np.float32)
    A[2, 4] = np.nan
    A[0, 7] = 20.0  # an outlier column beside it
    CA, CAt, rs, cs, cols = F.int8_double_quant(to_ms(A), threshold=threshold)
    a = np.where(np.abs(A) >= threshold, 0, A) if threshold else A
    want = np.abs(a).max(0)
    assert np.isnan(want[4]) and np.isnan(cs.asnumpy()[4])
    np.testing.assert_array_equal(cs.asnumpy(), want)
    keep = [c for c in range(9) if c != 4]
    np.testing.assert_array_equal(CAt.asnumpy()[:, keep], np.rint(a[:, keep] * 127 / want[keep]).astype(np.int8))
    assert (CAt.asnumpy()[:, 4] == 0).all()
    assert np.isnan(rs.asnumpy()[2]) and np.isfinite(np.delete(rs.asnumpy(), 2)).all()


# ---------------------------------------------------------------------------------------------
# native vs reference
# ---------------------------------------------------------------------------------------------
def _planted(shape, dtype, cols=(), seed=0, scale=1.0):
    rng = np.random.RandomState(seed)
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    flat = x.reshape(-1, shape[-1])
    for c in cols:
        rows = rng.rand(flat.shape[0]) < 0.4
        rows[0] = True
        flat[rows, c] = np.sign(rng.standard_normal(rows.sum())) * rng.uniform(10, 20, rows.sum())
    t = ms.Tensor(x).astype(DTYPES[dtype])
    return t, _f32(t)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(1,), (5, 1), (4, 3), (2, 3, 10), (2, 2, 3, 33), (3, 4095)])
@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_vectorwise_quant_reference(dtype, shape, threshold):
    cols = (0, shape[-1] - 1) if shape[-1] > 2 else (0,)
    t, x = _planted(shape, dtype, cols)
    CA, rs, oc = F.int8_vectorwise_quant(t, threshold)
    rCA, rrs, flags = R.int8_vector_quant(x, threshold, dtype)
    assert CA.shape == t.shape and CA.dtype == ms.int8
    np.testing.assert_array_equal(CA.asnumpy(), rCA)
    np.testing.assert_array_equal(bits(rs.asnumpy()), bits(rrs))
    if threshold == 0:
        assert oc is None
    else:
        np.testing.assert_array_equal(oc.asnumpy(), sorted(cols))
        if int(np.prod(shape[:-1])) > 1:
            assert (CA.asnumpy().reshape(-1, shape[-1])[:, list(cols)] == 0).all()
    # dequant round trip: |x - deq| <= absmax/127/2 (+ rounding) on non-outlier entries
    deq = F.int8_vectorwise_dequant(CA, rs).asnumpy().reshape(-1, shape[-1])
    keep = np.abs(x.reshape(-1, shape[-1])) < (threshold if threshold else np.inf)
    if threshold and keep.shape[0] > 1:
        keep[:, flags.astype(bool)] = False  # whole outlier columns are zeroed
    err = np.abs(deq - x.reshape(-1, shape[-1]))[keep]
    bound = np.broadcast_to(rrs[:, None] / 127 * 0.5001 + 1e-6, keep.shape)[keep]
    assert (err <= bound).all()


def test_vectorwise_quant_zero_row_and_no_outliers():
    x = np.zeros((3, 8), np.float32)
    x[1] = np.arange(8) - 3.5
    CA, rs, oc = F.int8_vectorwise_quant(ms.Tensor(x), threshold=6.0)
    assert oc.shape == (0,) and oc.dtype == ms.int64  # threshold > 0 and none found: empty, not None
    np.testing.assert_array_equal(CA.asnumpy()[[0, 2]], 0)
    np.testing.assert_array_equal(rs.asnumpy(), [0, 3.5, 0])
    np.testing.assert_array_equal(CA.asnumpy()[1], np.rint((np.arange(8) - 3.5) * np.float32(127 / 3.5)))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("K", [1, 7, 40, 130])
@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_vectorwise_quant_nan_row(dtype, K, threshold):
    """A NaN in a row makes its absmax NaN (upstream's torch.max propagates it; NaN is never an outlier) and its
    codes 0, in the SIMD body and the scalar tail; the other rows are quantized as without the NaN."""
    t, x = _planted((5, K), dtype, cols=(K - 1,) if K > 1 else ())
    nan_rows = [1, 3] if K > 1 else [1]
    x_nan = x.copy()
    x_nan[1, K // 2] = np.nan
    if K > 1:
        x_nan[3, K - 1] = -np.nan  # the last column (a SIMD tail for K = 7, 130), a negative NaN
        x_nan[3, 0] = 30.0 if threshold else 0.5  # an outlier in the NaN row: still a NaN absmax
    tn = ms.Tensor(x_nan).astype(DTYPES[dtype])
    CA, rs, oc = F.int8_vectorwise_quant(tn, threshold)
    rCA, rrs, rflags = R.int8_vector_quant(_f32(tn), threshold, dtype)
    stats = rs.asnumpy()
    assert np.isnan(stats[nan_rows]).all() and not np.isnan(np.delete(stats, nan_rows)).any()
    assert (bits(stats[nan_rows]) == 0x7FC00000).all()  # one quiet NaN, whatever the input's NaN bits
    np.testing.assert_array_equal(bits(stats), bits(rrs))
    np.testing.assert_array_equal(CA.asnumpy(), rCA)
    assert (CA.asnumpy()[nan_rows] == 0).all()
    # the rows without NaN: the same codes and stats as the input without any NaN (outlier columns aside)
    CA0, rs0, oc0 = F.int8_vectorwise_quant(t, threshold)
    keep = [r for r in range(5) if r not in nan_rows]
    if threshold == 0 or np.array_equal(oc.asnumpy(), oc0.asnumpy()):
        np.testing.assert_array_equal(CA.asnumpy()[keep], CA0.asnumpy()[keep])
    np.testing.assert_array_equal(stats[keep], rs0.asnumpy()[keep])
    if threshold:
        np.testing.assert_array_equal(oc.asnumpy(), np.nonzero(rflags)[0])
    # dequantized: NaN exactly in the NaN rows
    deq = F.int8_vectorwise_dequant(CA, rs).asnumpy()
    assert np.isnan(deq[nan_rows]).all() and np.isfinite(deq[keep]).all()


@pytest.mark.parametrize("K", [1, 3, 10, 15, 16, 17, 33, 4095])
@pytest.mark.parametrize("a_shape", [(1,), (5,), (2, 3), (2, 1, 4)])
@pytest.mark.parametrize("N", [1, 2, 3, 7])
def test_linear_matmul_shapes(K, a_shape, N):
    rng = np.random.RandomState(K * 100 + N)
    A = rng.randint(-128, 128, a_shape + (K,)).astype(np.int8)
    B = rng.randint(-128, 128, (N, K)).astype(np.int8)
    out = F.int8_linear_matmul(ms.Tensor(A), ms.Tensor(B))
    assert tuple(out.shape) == a_shape + (N,) and out.dtype == ms.int32
    np.testing.assert_array_equal(out.asnumpy(), R.int8_gemm(A, B))


def test_linear_matmul_extremes_and_blocks():
    # K spans two K-blocks (2048) and N spans several L2 blocks (96) and a 3-tail; all -128 products
    K, M, N = 4100, 9, 200
    A = np.full((M, K), -128, np.int8)
    B = np.full((N, K), -128, np.int8)
    A[1] = 127
    B[5, ::2] = 127
    out = F.int8_linear_matmul(ms.Tensor(A), ms.Tensor(B)).asnumpy()
    np.testing.assert_array_equal(out, R.int8_gemm(A, B))
    assert out[0, 0] == 128 * 128 * K


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 40), n=st.integers(1, 40), k=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
def test_linear_matmul_hypothesis(m, n, k, seed):
    rng = np.random.RandomState(seed)
    A = rng.randint(-128, 128, (m, k)).astype(np.int8)
    B = rng.randint(-128, 128, (n, k)).astype(np.int8)
    np.testing.assert_array_equal(F.int8_linear_matmul(ms.Tensor(A), ms.Tensor(B)).asnumpy(), R.int8_gemm(A, B))


def test_linear_matmul_out_and_empty():
    A = ms.Tensor(np.ones((2, 4), np.int8))
    B = ms.Tensor(np.ones((3, 4), np.int8))
    out = ms.Tensor(np.zeros((2, 3), np.int32))
    res = F.int8_linear_matmul(A, B, out=out)
    assert res is out
    np.testing.assert_array_equal(out.asnumpy(), 4)
    e = F.int8_linear_matmul(ms.Tensor(np.ones((0, 4), np.int8)), B)
    assert tuple(e.shape) == (0, 3)


@pytest.mark.parametrize("out_dtype", list(DTYPES))
@pytest.mark.parametrize("bias_dtype", [None, "float32", "float16", "bfloat16"])
def test_scaled_mm_reference(out_dtype, bias_dtype):
    rng = np.random.RandomState(3)
    C = rng.randint(-2**20, 2**20, (2, 3, 11)).astype(np.int32)
    rs = rng.uniform(0.1, 10, 6).astype(np.float32)
    cs = rng.uniform(0.1, 10, 11).astype(np.float32)
    bias = None if bias_dtype is None else ms.Tensor(rng.standard_normal(11).astype(np.float32)).astype(DTYPES[bias_dtype])
    from bitsandbytes_ms.functional import _mm_dequant
    out = _mm_dequant(ms.Tensor(C), ms.Tensor(rs), ms.Tensor(cs), bias, DTYPES[out_dtype], "t")
    ref = R.int8_mm_dequant(C, rs, cs, None if bias is None else _f32(bias), out_dtype).reshape(6, 11)
    np.testing.assert_array_equal(bits(out.asnumpy()), bits(ref))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_mixed_scaled_mm_accuracy(dtype, threshold):
    """The LLM.int8() product against fp32 A @ W.T: with planted outlier columns and threshold 6 the
    outlier part is exact, so the error is the int8 error of the remaining columns."""
    t, x = _planted((8, 64), dtype, cols=(3, 40), seed=1)
    w = np.random.RandomState(2).standard_normal((16, 64)).astype(np.float32) * 0.1
    CB, SCB, _ = F.int8_vectorwise_quant(ms.Tensor(w))
    CA, SCA, cols = F.int8_vectorwise_quant(t, threshold)
    out, subA = F.int8_mixed_scaled_mm(t, CA, CB, SCA, SCB, cols, bias=None)
    assert out.dtype == t.dtype and tuple(out.shape) == (8, 16)
    ref = x @ (_f32(F.int8_vectorwise_dequant(CB, SCB))).T
    err = np.abs(_f32(out) - ref).mean() / np.abs(ref).mean()
    assert err < (0.02 if threshold else 0.05), err
    if threshold:
        assert tuple(subA.shape) == (8, 2)
        # the outlier columns are not quantized: swapping them changes the result exactly by their fp32 product
        np.testing.assert_array_equal(cols.asnumpy(), [3, 40])


def test_simd_levels_agree():
    code = (
        "import mindspore as ms, numpy as np; ms.set_device('CPU');"
        "import bitsandbytes_ms.functional as F, bitsandbytes_ms.cextension as c, hashlib, sys;"
        "r=np.random.RandomState(5); A=r.randint(-128,128,(37,2100)).astype(np.int8); B=r.randint(-128,128,(101,2100)).astype(np.int8);"
        "x=(r.randn(9,130)*4).astype(np.float32); x[3,5]=np.nan; x[7,129]=np.nan;"
        "o=[F.int8_linear_matmul(ms.Tensor(A),ms.Tensor(B)).asnumpy().tobytes()];"
        "[o.extend(a.asnumpy().tobytes() for a in F.int8_vectorwise_quant(ms.Tensor(x).astype(dt),6.0)) for dt in (ms.float32,ms.float16,ms.bfloat16)];"
        "sys.stdout.write(c.simd_level()+' '+hashlib.sha256(b''.join(o)).hexdigest())"
    )

    assert_levels_agree(code)


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------
def test_bad_inputs():
    i8 = ms.Tensor(np.ones((2, 4), np.int8))
    with pytest.raises(ValueError, match=r"int8_linear_matmul: `B` must have dtype int8; got float32"):
        F.int8_linear_matmul(i8, ms.Tensor(np.ones((3, 4), np.float32)))
    with pytest.raises(ValueError, match=r"int8_linear_matmul: `A` must have dtype int8; got float16"):
        F.int8_linear_matmul(ms.Tensor(np.ones((2, 4), np.float16)), i8)
    with pytest.raises(ValueError, match="inner dimensions do not match"):
        F.int8_linear_matmul(i8, ms.Tensor(np.ones((3, 5), np.int8)))
    with pytest.raises(ValueError, match="must be 2-D"):
        F.int8_linear_matmul(i8, ms.Tensor(np.ones((1, 3, 4), np.int8)))
    with pytest.raises(ValueError, match="`out` must have shape"):
        F.int8_linear_matmul(i8, i8, out=ms.Tensor(np.ones((2, 3), np.int32)))
    with pytest.raises(ValueError, match="`A` must have dtype float32, float16, bfloat16; got int8"):
        F.int8_vectorwise_quant(i8)
    with pytest.raises(ValueError, match="`threshold` must be >= 0"):
        F.int8_vectorwise_quant(ms.Tensor(np.ones((2, 4), np.float32)), -1.0)
    with pytest.raises(TypeError, match="must be a mindspore.Tensor"):
        F.int8_vectorwise_quant(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match="`row_stats` must have one value per row"):
        F.int8_mm_dequant(ms.Tensor(np.ones((2, 3), np.int32)), ms.Tensor(np.ones(3, np.float32)),
                          ms.Tensor(np.ones(3, np.float32)))
    with pytest.raises(ValueError, match="`A` must have dtype int32"):
        F.int8_mm_dequant(i8, ms.Tensor(np.ones(2, np.float32)), ms.Tensor(np.ones(4, np.float32)))
    with pytest.raises(ValueError, match="`stats` must have one value per row"):
        F.int8_vectorwise_dequant(i8, ms.Tensor(np.ones(3, np.float32)))


def test_non_contiguous_inputs():
    rng = np.random.RandomState(0)
    A = rng.randint(-128, 128, (6, 4)).astype(np.int8)
    B = rng.randint(-128, 128, (4, 5)).astype(np.int8)  # B.T is [5, 4], non-contiguous
    Bt = ms.Tensor(B).T
    assert not Bt.is_contiguous()
    np.testing.assert_array_equal(F.int8_linear_matmul(ms.Tensor(A), Bt).asnumpy(), R.int8_gemm(A, B.T))
    x = rng.standard_normal((5, 7)).astype(np.float32)
    CA, rs, _ = F.int8_vectorwise_quant(ms.Tensor(x).T)
    rCA, rrs, _ = R.int8_vector_quant(x.T)
    np.testing.assert_array_equal(CA.asnumpy(), rCA)
