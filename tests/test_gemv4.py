"""gemv_4bit's native kernel against a numpy model of its documented summation order (bit-exact), on
every code path of csrc/cpu/fourbit.cpp: whole blocks per row (the fast path, 1, 2 and 4 groups per
block), blocks crossing rows with 32-aligned groups, unaligned / padded groups (K not a multiple of 32),
odd K, several A rows, fp16/bf16 activations; and the SIMD levels against each other."""


import numpy as np
import pytest
from simd_levels import assert_levels_agree

import mindspore as ms

import bitsandbytes_ms.functional as F
from upstream_vectors import bits

# (N, K, blocksize): fast path with G = bs / 32 groups per block; K % bs != 0 with K % 32 == 0; K % 32 != 0;
# odd K (rows start mid-byte)
SHAPES = [(24, 256, 32), (24, 256, 64), (16, 512, 128), (9, 192, 64), (7, 96, 64), (11, 100, 64), (5, 77, 32),
          (3, 1000, 256)]


def _fma32(a, b, c):
    # a*b is exact in float64 (24 + 24 bits); the sum is rounded twice (f64, then f32), which differs from a
    # single rounding only when the f64 sum lands exactly on an f32 tie: not in these data
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


_SLOT_ELEM = np.array([2 * p if p < 16 else 2 * (p - 16) + 1 for p in range(32)])


def _model_gemv(code, nib, absmax, x, N, K, bs):
    """The kernel's documented order (fourbit.cpp, GEMV section), one row at a time."""
    code = code.astype(np.float32)
    out = np.empty(N, np.float32)
    for n in range(N):
        r0 = n * K
        acc = np.zeros(8, np.float32)
        s, blk = r0, r0 // bs
        while s < r0 + K:
            e = min((blk + 1) * bs, r0 + K)
            bacc = np.zeros(32, np.float32)
            for g in range(s, e, 32):
                idx = g + _SLOT_ELEM
                valid = idx < e
                w = code[np.where(valid, nib[np.minimum(idx, e - 1)], 0)]
                xv = np.where(valid, x[np.minimum(idx, e - 1) - r0], np.float32(0))
                bacc = _fma32(w, xv.astype(np.float32), bacc)
            z = bacc[:16] + bacc[16:]
            v = np.concatenate([z[0:4] + z[4:8], z[8:12] + z[12:16]])
            acc = _fma32(v, np.full(8, absmax[blk], np.float32), acc)
            s, blk = e, blk + 1
        u = acc[:4] + acc[4:]
        out[n] = (u[0] + u[2]) + (u[1] + u[3])
    return out


def _nibbles(packed, n):
    p = packed.reshape(-1)
    nib = np.empty(2 * p.size, np.uint8)
    nib[0::2], nib[1::2] = p >> 4, p & 15
    return nib[:n]


def _bf16_round(a):
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("N,K,bs", SHAPES)
@pytest.mark.parametrize("qt", ["nf4", "fp4"])
@pytest.mark.parametrize("M", [1, 3, 9])
def test_gemv_matches_documented_order_fp32(N, K, bs, qt, M):
    """Several A rows: on whole-block rows each weight row is decoded once for up to 4 (AVX2: 2) A rows at a
    time (9 rows: passes of 4, 4, 1 / 2, 2, 2, 2, 1), every (row, output) by the one-row order."""
    rng = np.random.RandomState(N * K + bs)
    W = rng.randn(N, K).astype(np.float32)
    q, st = F.quantize_4bit(ms.Tensor(W), blocksize=bs, quant_type=qt)
    A = rng.randn(M, K).astype(np.float32)
    out = F.gemv_4bit(ms.Tensor(A), q, state=st).asnumpy()
    nib, amax, code = _nibbles(q.asnumpy(), N * K), st.absmax.asnumpy(), st.code.asnumpy()
    for m in range(M):
        ref = _model_gemv(code, nib, amax, A[m], N, K, bs)
        np.testing.assert_array_equal(bits(out[m]), bits(ref), err_msg=f"row {m}")


@pytest.mark.parametrize("N,K,bs", [(6, 300, 100), (5, 192, 96), (3, 34, 2), (4, 64, 4096)])
def test_gemv_matches_documented_order_any_blocksize(N, K, bs):
    """Block sizes the Python API does not offer (not a power of two, tiny, larger than the matrix),
    through the op directly."""
    from bitsandbytes_ms.cextension import lib

    rng = np.random.RandomState(K + bs)
    code = F.get_4bit_type("nf4")
    q, amax = lib.cquantize_blockwise_fp32_nf4(code, ms.Tensor(rng.randn(N * K).astype(np.float32)), bs)
    A = rng.randn(1, K).astype(np.float32)
    out = lib.cgemm_4bit_inference_naive_fp32(ms.Tensor(A), ms.ops.reshape(q, (-1,)), amax, code, bs, N).asnumpy()[0]
    ref = _model_gemv(code.asnumpy(), _nibbles(q.asnumpy(), N * K), amax.asnumpy(), A[0], N, K, bs)
    np.testing.assert_array_equal(bits(out), bits(ref))


@pytest.mark.parametrize("dt", [ms.float16, ms.bfloat16])
def test_gemv_matches_documented_order_half(dt):
    N, K, bs = 12, 320, 64
    rng = np.random.RandomState(7)
    q, st = F.quantize_4bit(ms.Tensor(rng.randn(N, K).astype(np.float32)), blocksize=bs, quant_type="nf4",
                            compress_statistics=True)
    A = ms.Tensor(rng.randn(1, K).astype(np.float32)).astype(dt)
    out = F.gemv_4bit(A, q, state=st).astype(ms.float32).asnumpy()[0]
    x = A.astype(ms.float32).asnumpy()[0]
    ref = _model_gemv(st.code.asnumpy(), _nibbles(q.asnumpy(), N * K), F._absmax_4bit(st).asnumpy(), x, N, K, bs)
    ref = ref.astype(np.float16).astype(np.float32) if dt == ms.float16 else _bf16_round(ref)
    np.testing.assert_array_equal(bits(out), bits(ref))


def test_gemv_simd_levels_agree_every_path():
    """BNB_MS_SIMD=scalar (the reference kernel) and every SIMD level this CPU has give the same bits on
    every path (on an AVX-512 host this checks the AVX-512 kernel too)."""
    code = (
        "import mindspore as ms, numpy as np, hashlib, sys; ms.set_device('CPU');"
        "import bitsandbytes_ms.functional as F, bitsandbytes_ms.cextension as c;"
        f"shapes={SHAPES!r}; h=hashlib.sha256(); r=np.random.RandomState(5);"
        "\nfor N,K,bs in shapes:"
        "\n  q,s=F.quantize_4bit(ms.Tensor(r.randn(N,K).astype(np.float32)), blocksize=bs, quant_type='nf4')"
        "\n  A=ms.Tensor(r.randn(7,K).astype(np.float32))"
        "\n  for dt in (ms.float32, ms.float16, ms.bfloat16):"
        "\n    h.update(F.gemv_4bit(A.astype(dt), q, state=s).astype(ms.float32).asnumpy().tobytes())"
        "\ncode=F.get_4bit_type('nf4')"
        "\nfor N,K,bs in ((6,300,100),(3,34,2)):"
        "\n  q,am=c.lib.cquantize_blockwise_fp32_nf4(code, ms.Tensor(r.randn(N*K).astype(np.float32)), bs)"
        "\n  o=c.lib.cgemm_4bit_inference_naive_fp32(ms.Tensor(r.randn(1,K).astype(np.float32)), q.reshape(-1), am, code, bs, N)"
        "\n  h.update(o.asnumpy().tobytes())"
        "\nsys.stdout.write(c.simd_level()+' '+h.hexdigest())"
    )

    assert_levels_agree(code)
