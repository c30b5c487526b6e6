"""The fused decoder's 4-bit prefill in bf16 (``cdecoder_*_fp32_bf16dot``; csrc/cpu/gemm_panel.h's bf16 variant):

* a 4-bit linear of K a multiple of 64 runs up to 16 rows through the one-row bf16 GEMV, each row the bytes of
  that kernel's numpy twin on the row alone (_reference.linear4_bf16_gemv_f32: what one decode row gives); more
  rows, or other K above 8 rows, give the bytes of the GEMM's twin (_reference.gemm_panel_bf16: x and the
  dequantized weight rounded to bf16, pairs accumulated as vdpbf16ps does), within the documented bound of the
  exact path; other K up to 8 rows, and every weight that is not 4-bit (fp32/fp16/bf16, int8), the exact entry's
  bytes;
* the same bytes at every SIMD level (vdpbf16ps and the portable kernel);
* the switch: ``set_bf16_dot`` / ``BNB_MS_4BIT_BF16_DOT`` -- ``auto`` computes the prefill in bf16 exactly where
  the CPU has AVX512-BF16 (as upstream's CPU 4-bit layers do there), ``exact`` never, ``on`` always;
* small random models of the four families: the fused model with bf16 prefill gives the unfused quantized
  model's greedy tokens, logits within BF16_PREFILL_LOGIT_BOUND x max|logit|.
"""

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

from bitsandbytes_ms import _hostcall as HC  # noqa: E402
from bitsandbytes_ms import _reference as R  # noqa: E402
from bitsandbytes_ms import cextension  # noqa: E402
from bitsandbytes_ms import functional as F  # noqa: E402
from bitsandbytes_ms.integrations import fuse, unfuse  # noqa: E402
from bitsandbytes_ms.integrations import fused as FU  # noqa: E402
from test_fused_decoder import IDS, MASK, _cfg, _check_close, _fused_outputs, _model, _outputs, _spec  # noqa: E402

#: fused with bf16 prefill vs the unfused quantized model (exact fp32 compute), max|dlogit| / max|logit| over the
#: prompt and every generated step; measured 1.6e-3 .. 2.3e-3 on these models (decode steps are exact: only the
#: 24-row prompt runs in bf16, and its KV cache carries the rounding into the later steps)
BF16_PREFILL_LOGIT_BOUND = 1e-2

EXACT, DOT = HC.entry("cdecoder_linear_fp32"), HC.entry("cdecoder_linear_fp32_bf16dot")


@pytest.fixture
def dot_mode():
    """Sets set_bf16_dot for one test; afterwards the environment's choice is read again."""
    yield F.set_bf16_dot
    F.set_bf16_dot(None)


def _bound(x, spec, N, K):
    """The documented bound (gemm_panel.h) per output: (2^-7 + 2^-16 + K 2^-23) * sum_k |x_k w_k|."""
    S = np.abs(x.astype(np.float64)) @ np.abs(R.linear_spec_weight(spec, N, K).astype(np.float64)).T
    return (2.0 ** -7 + 2.0 ** -16 + K * 2.0 ** -23) * S


def _dot_and_exact(mode, M, N, K):
    """A random 4-bit linear (bias) and x (M x K): x, its spec, the bf16dot entry's output and the exact entry's."""
    rng = np.random.RandomState(M * N + K)
    spec = _spec(rng, N, K, mode, bias=True)
    x = (rng.randn(M, K) * 2).astype(np.float32)
    got, exact = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
    DOT(x, *spec, N, got)
    EXACT(x, *spec, N, exact)
    return x, spec, got, exact


@pytest.mark.parametrize("mode", ["nf4", "fp4", "dq"])
@pytest.mark.parametrize("M, N, K", [(9, 40, 100), (13, 33, 77), (40, 100, 130), (17, 7, 31), (64, 49, 192),
                                     (17, 20, 128)])
def test_bf16_prefill_linear_is_its_twin(mode, M, N, K, monkeypatch):
    monkeypatch.setenv("BNB_MS_4BIT_AMX", "0")  # the vdpbf16ps kernel from 16 rows too (AMX: its own test below)
    x, spec, got, exact = _dot_and_exact(mode, M, N, K)
    np.testing.assert_array_equal(got, R.gemm_panel_bf16(x, R.linear_spec_weight(spec, N, K), spec[6]))
    assert not np.array_equal(got, exact)  # it really is another computation
    assert np.all(np.abs(got - exact) <= _bound(x, spec, N, K))


AMX_CASES = [("nf4", 16, 40, 64), ("dq", 40, 100, 130), ("fp4", 17, 7, 31), ("nf4", 64, 49, 192),
             ("dq", 100, 300, 1000)]


@pytest.mark.parametrize("mode, M, N, K", AMX_CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}x{c[3]}" for c in AMX_CASES])
def test_bf16_prefill_amx_within_bound(mode, M, N, K, monkeypatch):
    """From 16 rows, on a CPU with AMX-BF16, the prefill GEMM runs on the tile unit (gemm_panel_bf16_amx_bf16): the
    twin's bf16 inputs, summed in the unit's own order, so within the documented bound of the exact path and
    within K 2^-22 S of the twin (the same exact products, another fp32 order: a tile or k-step missed or
    misplaced is far outside); partial m-tiles and panels, K2 not a multiple of 16, odd K, bias."""
    if cextension.linear4_bf16_path(M) != "amx":
        pytest.skip(f"no AMX-BF16 here (path {cextension.linear4_bf16_path(M)})")
    rng = np.random.RandomState(M * N + K + 1)
    spec = _spec(rng, N, K, mode, bias=True)
    x = (rng.randn(M, K) * 2).astype(np.float32)
    got, exact = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
    DOT(x, *spec, N, got)
    EXACT(x, *spec, N, exact)
    twin = R.gemm_panel_bf16(x, R.linear_spec_weight(spec, N, K), spec[6])
    S = np.abs(x.astype(np.float64)) @ np.abs(R.linear_spec_weight(spec, N, K).astype(np.float64)).T
    assert np.all(np.abs(got - exact) <= _bound(x, spec, N, K))
    assert np.all(np.abs(got.astype(np.float64) - twin) <= K * 2.0 ** -22 * S + 1e-30)
    monkeypatch.setenv("BNB_MS_4BIT_AMX", "0")
    off = np.empty((M, N), np.float32)
    DOT(x, *spec, N, off)
    np.testing.assert_array_equal(off, twin)


@pytest.mark.parametrize("mode", ["nf4", "fp4", "dq"])
@pytest.mark.parametrize("N, K", [(40, 128), (33, 256), (7, 384), (24, 576), (9, 192), (5, 64)])
def test_bf16_decode_row_is_its_twin(mode, N, K):
    """One row of a 4-bit weight (K a multiple of 64, blocksize 64; an odd number of 64s ends in a half unit) runs the one-row bf16 GEMV: the bytes of its
    numpy twin (_reference.linear4_bf16_gemv_f32), within the exact path's documented bound, and not its bytes."""
    rng = np.random.RandomState(N + K)
    spec = _spec(rng, N, K, mode, bias=True)
    x = (rng.randn(1, K) * 2).astype(np.float32)
    got, exact = np.empty((1, N), np.float32), np.empty((1, N), np.float32)
    DOT(x, *spec, N, got)
    EXACT(x, *spec, N, exact)
    np.testing.assert_array_equal(got[0], R.linear4_bf16_gemv_f32(x[0], spec, N))
    assert not np.array_equal(got, exact)
    assert np.all(np.abs(got - exact) <= _bound(x, spec, N, K))


@pytest.mark.parametrize("mode", ["nf4", "fp4", "dq"])
@pytest.mark.parametrize("M, N, K", [(2, 40, 128), (3, 33, 576), (5, 7, 192), (8, 24, 256), (9, 9, 64), (15, 17, 384), (16, 11, 128)])
def test_bf16_few_rows_are_one_row_twins(mode, M, N, K):
    """2-16 rows of a 4-bit weight whose K the one-row kernel takes (a short prompt, batched decode steps) run that
    kernel, the weights read once for all rows (4 rows at a time: 3, 5, 9 and 15 rows end in partial groups): each
    row the bytes of the kernel's twin on that row alone, within the exact path's documented bound."""
    x, spec, got, exact = _dot_and_exact(mode, M, N, K)
    for m in range(M):
        np.testing.assert_array_equal(got[m], R.linear4_bf16_gemv_f32(x[m], spec, N), err_msg=f"row {m}")
    assert not np.array_equal(got, exact)
    assert np.all(np.abs(got - exact) <= _bound(x, spec, N, K))


@pytest.mark.parametrize("mode, M, K", [("nf4", 2, 96), ("dq", 8, 160), ("nf4", 1, 96), ("dq", 1, 160)])
def test_bf16_decode_other_rows_and_shapes_exact(mode, M, K):
    """1-8 rows of a K the one-row kernel does not take (not a multiple of 64) run the exact GEMV."""
    rng = np.random.RandomState(M + K)
    spec = _spec(rng, 24, K, mode, bias=True)
    x = rng.randn(M, K).astype(np.float32)
    got, exact = np.empty((M, 24), np.float32), np.empty((M, 24), np.float32)
    DOT(x, *spec, 24, got)
    EXACT(x, *spec, 24, exact)
    np.testing.assert_array_equal(got, exact)


@pytest.mark.parametrize("mode, M", [("nf4", 1), ("dq", 8), ("fp32", 13), ("fp16", 40), ("bf16", 13),
                                     ("int8", 13), ("int8-t6", 40)])
def test_bf16_prefill_leaves_decode_rows_and_other_weights_exact(mode, M):
    """Up to 8 rows a 4-bit linear of K not a multiple of 64 runs the GEMV kernel (the unfused layer's bits);
    fp32/fp16/bf16 and int8 weights run as in the exact entry at every row count."""
    rng = np.random.RandomState(5)
    N, K = 48, 96
    spec = _spec(rng, N, K, mode, bias=True)
    x = (rng.randn(M, K) * (8 if mode == "int8-t6" else 1)).astype(np.float32)
    got, exact = np.empty((M, N), np.float32), np.empty((M, N), np.float32)
    DOT(x, *spec, N, got)
    EXACT(x, *spec, N, exact)
    np.testing.assert_array_equal(got, exact)


def test_bf16_prefill_layer_halves_decode_exact_prefill_bounded():
    """The decoder halves through the bf16dot entries: a decode step of two sequences and a 13-token prompt stay
    within a bf16-sized distance of the exact entries (the down projection, K 96, runs the exact GEMV for the
    decode step's 2 rows; the other projections the one-row bf16 kernel)."""
    rng = np.random.RandomState(2)
    B, H, Hq, KVH, D, I, past, Smax = 2, 64, 4, 2, 16, 96, 3, 24
    q, k, v = (_spec(rng, n, H, "nf4", True) for n in (Hq * D, KVH * D, KVH * D))
    o = _spec(rng, H, Hq * D, "nf4")
    g, u, d = _spec(rng, I, H, "dq"), _spec(rng, I, H, "dq"), _spec(rng, H, I, "dq", True)
    nw = (1 + 0.1 * rng.randn(H)).astype(np.float32)
    invf = (1.0 / (10000 ** (np.arange(0, D, 2) / D))).astype(np.float32)
    for T in (1, 13):
        x = rng.randn(B, T, H).astype(np.float32)
        pos = (np.arange(T)[None] + past + np.array([[0], [-2]])).astype(np.int64)
        mask = np.ones((B, past + T), np.uint8)
        mask[1, :2] = 0
        kc = rng.randn(B, KVH, Smax, D).astype(np.float32)
        vc = rng.randn(B, KVH, Smax, D).astype(np.float32)
        res = {}
        for name in ("cdecoder_attention_fp32", "cdecoder_attention_fp32_bf16dot"):
            kk, vv, out = kc.copy(), vc.copy(), np.empty_like(x)
            HC.entry(name)(x, pos, mask, kk, vv, nw, invf, None, None, *q, *k, *v, *o, past, Hq, 1e-5, D ** -0.5,
                           1.0, 0, out)
            mo = np.empty_like(x)
            HC.entry(name.replace("attention", "mlp"))(out, nw, *g, *u, *d, I, 1e-5, mo)
            res[name] = (out, kk, vv, mo)
        ex, dot = res["cdecoder_attention_fp32"], res["cdecoder_attention_fp32_bf16dot"]
        for a, b in zip(ex, dot):
            assert np.abs(b - a).max() <= 2e-2 * np.abs(a).max()
        assert not np.array_equal(ex[3], dot[3])


def test_bf16_prefill_simd_levels_agree():
    """vdpbf16ps (AVX512-BF16 at the avx512 level) and the portable kernel (BNB_MS_SIMD=avx2 / scalar) give the
    same bytes: 4-bit linears of odd and even K, short row tails and column tails, the decoder halves."""
    from simd_levels import assert_levels_agree

    here = __import__("os").path.dirname(__file__)
    code = (
        f"import sys, os; sys.path.insert(0, {here!r}); import hashlib, numpy as np;"
        "os.environ['BNB_MS_4BIT_AMX'] = '0';"  # AMX-BF16 sums in its own order (test_bf16_prefill_amx_within_bound)
        "import test_fused_decoder as t; from bitsandbytes_ms import cextension as c, _hostcall as HC;"
        "h = hashlib.sha256(); rng = np.random.RandomState(4); lin = HC.entry('cdecoder_linear_fp32_bf16dot')"
        "\nfor mode, M, N, K in (('nf4', 9, 40, 64), ('fp4', 23, 57, 77), ('dq', 40, 100, 130), ('nf4', 17, 7, 31),"
        "\n                      ('nf4', 1, 40, 128), ('dq', 1, 33, 256)):"
        "\n  spec = t._spec(rng, N, K, mode, True); x = (rng.randn(M, K) * 3).astype(np.float32)"
        "\n  x[0, :3] = (1e-39, -1e-39, 3e38)  # an fp32 denormal (a flushed bf16 input) and a large value"
        "\n  out = np.empty((M, N), np.float32); lin(x, *spec, N, out); h.update(out.tobytes())"
        "\nB, T, H, Hq, KVH, D, I, past, Smax = 2, 13, 64, 4, 2, 16, 96, 3, 24"
        "\nq, k, v, o = (t._spec(rng, n, kk, 'nf4', True) for n, kk in ((Hq*D, H), (KVH*D, H), (KVH*D, H), (H, Hq*D)))"
        "\nx = rng.randn(B, T, H).astype(np.float32); pos = (np.arange(T)[None] + past + np.array([[0], [-2]])).astype(np.int64)"
        "\nmask = np.ones((B, past + T), np.uint8); mask[1, :2] = 0"
        "\nkc, vc = rng.randn(B, KVH, Smax, D).astype(np.float32), rng.randn(B, KVH, Smax, D).astype(np.float32)"
        "\nnw = (1 + 0.1 * rng.randn(H)).astype(np.float32); invf = (1.0 / (10000 ** (np.arange(0, D, 2) / D))).astype(np.float32)"
        "\nout = np.empty_like(x)"
        "\nHC.entry('cdecoder_attention_fp32_bf16dot')(x, pos, mask, kc, vc, nw, invf, None, None, *q, *k, *v, *o, past, Hq, 1e-5, D ** -0.5, 1.0, 0, out)"
        "\ng, u, d = t._spec(rng, I, H, 'dq'), t._spec(rng, I, H, 'dq'), t._spec(rng, H, I, 'dq', True)"
        "\nmo = np.empty_like(x); HC.entry('cdecoder_mlp_fp32_bf16dot')(out, nw, *g, *u, *d, I, 1e-5, mo)"
        "\nfor a in (out, kc, vc, mo): h.update(np.ascontiguousarray(a).tobytes())"
        "\nprint(c.simd_level(), h.hexdigest())"
    )
    assert_levels_agree(code)


def test_bf16_prefill_switch(dot_mode):
    """auto: bf16 prefill exactly where the CPU has AVX512-BF16; exact: never; on: always (any CPU: the portable
    kernel without the instruction). Read by the fused forward at every call."""
    m = _model(_cfg("llama"))
    assert fuse(m)
    try:
        def prompt_logits():
            with torch.no_grad():
                return m(torch.tensor(IDS), attention_mask=torch.tensor(MASK)).logits.asnumpy()

        dot_mode("exact")
        exact = prompt_logits()
        dot_mode("on")
        on = prompt_logits()
        dot_mode("auto")
        auto = prompt_logits()
        has_bf16 = "avx512_bf16" in cextension.cpu_features()
        decode_rule = [FU._dot(1), FU._dot(5)]  # the bf16dot entries (natively 2-32 rows: the one-row kernel)
        dot_mode("exact")
        decode_rule += [FU._dot(1), FU._dot(24)]
        dot_mode("on")
        decode_rule += [FU._dot(1)]
    finally:
        unfuse(m)
    assert decode_rule == [has_bf16, has_bf16, False, False, True]
    assert not np.array_equal(on, exact)
    np.testing.assert_array_equal(auto, on if has_bf16 else exact)


@pytest.mark.parametrize("family, hidden", [("llama", 64), ("qwen2", 64), ("mistral", 64), ("qwen3", 64),
                                            ("llama", 128), ("qwen2", 128)])
def test_fused_model_with_bf16_prefill_matches_unfused(family, hidden, dot_mode):
    """hidden 128 (intermediate 256): the decode steps' 4-bit layers run the one-row bf16 GEMV too."""
    m = _model(_cfg(family, hidden_size=hidden, intermediate_size=2 * hidden),
               quant_type="fp4" if family == "mistral" else "nf4")
    dot_mode("exact")
    ref = _outputs(m)  # the unfused model (its > 32-row prompt: dequantize + fp32 matmul)
    dot_mode("on")
    n0 = FU.stats["fused_forwards"]
    got = _fused_outputs(m)
    assert FU.stats["fused_forwards"] > n0
    err = _check_close(got, ref, BF16_PREFILL_LOGIT_BOUND, "fused (bf16 prefill) vs unfused")
    assert err > 0  # the prompt really ran in bf16
