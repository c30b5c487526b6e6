"""The fused decode path (csrc/cpu/decoder.cpp + bitsandbytes_ms/integrations/fused.py, issue 13).

* the native layer halves against their numpy twins (_reference.decoder_attention / decoder_mlp) for fp32,
  fp16, bf16, NF4, FP4, double-quant and int8 (threshold 0 and 6 with outlier columns) weights, with a padding
  mask, a sliding window and out == x;
* every Linear8bitLt call of an unfused generation (prefill: many rows; decode: 2 rows, and 1 row at batch 1),
  replayed through the fused path's linear: the same bytes; every decoder layer of an unfused int8 prefill
  replayed through the fused layer calls: the same bytes (the unfused model's rounding, issue 31);
* small random Llama / Qwen2 (q/k/v biases) / Mistral (sliding window) / Qwen3 (QK-norm) models, 4-bit or int8
  quantized (mixed with fp32 nn.Linear layers; fp16 and bf16 models with kept 16-bit layers): the fused model
  gives the unfused quantized model's greedy tokens (batch 2, left padding, EOS) and per-step logits within
  the bounds below, times max|logit|;
* unsupported configs keep the unfused path with one warning naming the reason.
"""

import warnings

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config  # noqa: E402

from bitsandbytes_ms import _hostcall as HC  # noqa: E402
from bitsandbytes_ms import _reference as R  # noqa: E402
from bitsandbytes_ms import functional as F  # noqa: E402
from bitsandbytes_ms.integrations import fuse, is_fused, quant_4bit, quant_8bit, unfuse  # noqa: E402
from bitsandbytes_ms.integrations import fused as FU  # noqa: E402
from bitsandbytes_ms.integrations.patches import registry  # noqa: E402

transformers.logging.set_verbosity_error()

#: fused vs unfused logits, max |diff| / max |logit| over every generated step and the prompt's non-pad
#: positions. The fused layers round as the unfused model does (csrc/cpu/simd_math.h), except the decode steps'
#: attention scores (four partial chains) and a 4-bit layer's many-row matmul (the unfused Linear4bit's dequantize +
#: matmul sums in another order). Measured 1.9e-7 .. 2.9e-7 on these 4-bit models.
LOGIT_BOUND = 1e-5
#: int8 models with threshold 6 and outliers in every int8 layer (norm weights boosted): a prefill gives the
#: unfused bytes layer by layer (test_fused_prefill_layers_are_the_unfused_bits), but int8 amplifies the decode
#: steps' rounding differences: a 1-ulp input difference can move one code (1/127 of a row's absmax), or move a
#: column across the outlier threshold for every row of the call. Measured 7.6e-7 (llama), 3.8e-5 (mistral),
#: 2.3e-3 (qwen2, qwen3); the same models' int8 quantization error (vs fp32) is 3.5e-2 .. 3.3e-1. At threshold
#: 0: identical logits on these models (LOGIT_BOUND holds).
INT8_LOGIT_BOUND = 1e-2
#: an fp16 model fused (the *_r16 entries: each op rounded to fp16 as the unfused model's) vs the same model
#: unfused: prefill layers give the same bits (test_fused_prefill_layers_are_the_unfused_bits); what differs is
#: the decode rows' score sums (4 chains), the lm_head's sum order and, for 4-bit layers, the GEMM's. Measured
#: 2.5e-5 .. 6.7e-4 (fp32 compute, before the *_r16 entries: 5e-4 .. 3.9e-3).
FP16_R16_BOUND = 2e-3


@pytest.fixture(autouse=True)
def _exact_prefill():
    """These tests check the exact path's claims: 4-bit prefill in fp32 (on an AVX512-BF16 CPU the default computes
    it in bf16; tests/test_fused_bf16_prefill.py checks that path against its own bound)."""
    F.set_bf16_dot("exact")
    yield
    F.set_bf16_dot(None)


# ---- native layer vs reference ----------------------------------------------------------------------
def _spec(rng, N, K, mode, bias=False):
    W = (rng.randn(N, K) * 0.05).astype(np.float32)
    b = (rng.randn(N) * 0.1).astype(np.float32) if bias else None
    if mode == "fp32":
        return (W, None, None, None, None, None, b, 64, 256)
    if mode in ("fp16", "bf16"):
        dt = HC.np_dtype(ms.float16 if mode == "fp16" else ms.bfloat16)
        return (W.astype(dt), None, None, None, None, None, None if b is None else b.astype(dt), 64, 256)
    if mode.startswith("int8"):  # Linear8bitLt's inference state: W quantized after the cast to fp16, as upstream
        CB, SCB, _ = R.int8_vector_quant(W.astype(np.float16).astype(np.float32), 0.0, "float16")
        thr = np.array(6.0 if mode == "int8-t6" else 0.0, np.float32)
        return (CB, SCB, None, None, None, thr, b, 64, 256)
    qt = "fp4" if mode == "fp4" else "nf4"
    p, qs = F.quantize_4bit(ms.Tensor(W), quant_type=qt, compress_statistics=(mode == "dq"), blocksize=64)
    P = p.asnumpy().reshape(-1)
    if qs.nested:
        off = qs.offset.asnumpy() if hasattr(qs.offset, "asnumpy") else qs.offset
        return (P, qs.absmax.asnumpy().reshape(-1), qs.code.asnumpy(), qs.state2.absmax.asnumpy(),
                qs.state2.code.asnumpy(), np.array(float(off), np.float32), b, 64, qs.state2.blocksize)
    return (P, qs.absmax.asnumpy(), qs.code.asnumpy(), None, None, None, b, 64, 256)


@pytest.mark.parametrize("mode, window, T", [  # T = 13: B*T > 8 rows, the prefill path (dequantize + GEMM)
    ("fp32", 0, 5), ("nf4", 0, 5), ("fp4", 3, 5), ("dq", 0, 5), ("nf4", 3, 13), ("dq", 0, 13), ("fp32", 3, 13),
    ("fp16", 0, 5), ("bf16", 3, 13), ("int8", 0, 5), ("int8", 3, 13), ("int8-t6", 0, 5), ("int8-t6", 3, 13)])
def test_native_layer_matches_reference(mode, window, T):
    rng = np.random.RandomState(0)
    B, T, H, Hq, KVH, D, I, past, Smax = 2, T, 64, 4, 2, 16, 96, 3, 24
    q, k, v = _spec(rng, Hq * D, H, mode, True), _spec(rng, KVH * D, H, mode, True), _spec(rng, KVH * D, H, mode, True)
    o = _spec(rng, H, Hq * D, mode)
    x = rng.randn(B, T, H).astype(np.float32)
    pos = (np.arange(T)[None] + past + np.array([[0], [-2]])).astype(np.int64)
    mask = np.ones((B, past + T), np.uint8)
    mask[1, :2] = 0
    kc, vc = rng.randn(B, KVH, Smax, D).astype(np.float32), rng.randn(B, KVH, Smax, D).astype(np.float32)
    kr, vr = kc.copy(), vc.copy()
    nw = (1 + 0.1 * rng.randn(H)).astype(np.float32)
    if mode == "int8-t6":  # a few channels far above the threshold: outlier columns in q/k/v and gate/up
        nw[[3, 17, 40]] = 12.0
    if mode == "bf16":  # 16-bit norm weights (a bf16 model's)
        nw = nw.astype(HC.np_dtype(ms.bfloat16))
    invf = (1.0 / (10000 ** (np.arange(0, D, 2) / D))).astype(np.float32)
    out = x.copy()  # out == x: in place
    qn = (1 + 0.1 * rng.randn(D)).astype(np.float32) if mode == "dq" else None  # QK-norm (Qwen3)
    kn = (1 + 0.1 * rng.randn(D)).astype(np.float32) if mode == "dq" else None
    ref = R.decoder_attention(x, pos, mask, kr, vr, nw, invf, q, k, v, o, past, Hq, 1e-5, D ** -0.5, 1.0, window,
                              qn, kn)
    HC.entry("cdecoder_attention_fp32")(out, pos, mask, kc, vc, nw, invf, qn, kn, *q, *k, *v, *o, past, Hq, 1e-5,
                                        D ** -0.5, 1.0, window, out)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    np.testing.assert_allclose(kc, kr, rtol=0, atol=1e-6)
    np.testing.assert_allclose(vc, vr, rtol=0, atol=1e-6)
    g, u, d = _spec(rng, I, H, mode), _spec(rng, I, H, mode), _spec(rng, H, I, mode, True)
    ref = R.decoder_mlp(x, nw, g, u, d, I, 1e-5)
    out = np.empty_like(x)
    HC.entry("cdecoder_mlp_fp32")(x, nw, *g, *u, *d, I, 1e-5, out)
    np.testing.assert_allclose(out, ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    if mode == "int8-t6":  # outliers really occurred (the inputs of q/k/v and gate/up: the RMSNorm of x)
        _, _, flags = R.int8_vector_quant(R.rms_norm(x, nw, 1e-5).reshape(-1, H).astype(np.float16), 6.0, "float16")
        assert 1 <= flags.sum() <= 3, flags.sum()
    if mode.startswith("int8"):  # one int8 linear: the bytes of its reference twin (cint8_linear_fp32's)
        lo = np.empty((B, T, I), np.float32)
        xs = x * np.where(np.arange(H) % 7 == 0, 8.0, 1.0).astype(np.float32)  # outlier columns at threshold 6
        HC.entry("cdecoder_linear_fp32")(xs, *g, I, lo)
        np.testing.assert_array_equal(lo, R.linear_spec(xs, g, I))
    lo = np.empty((B, T, I), np.float32)
    HC.entry("cdecoder_linear_fp32")(x, *g, I, lo)
    np.testing.assert_allclose(lo, R.linear_spec(x, g, I), rtol=0, atol=2e-6 * np.abs(lo).max())
    HC.entry("crms_norm_fp32")(x, nw, 1e-5, out)
    np.testing.assert_allclose(out, R.rms_norm(x, nw, 1e-5), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_dense_layer_is_the_full_precision_linear(mode, rows):
    """A full-precision layer inside the fused decoder (decode: up to 8 rows) runs gemm_fp.cpp's kernel: the bytes
    of _reference.gemm_fp on fp32 activations and the widened weight, i.e. LinearFP's (cgemm_fp_fp32) for fp32."""
    rng = np.random.RandomState(11)
    N, K = 40, 77
    spec = _spec(rng, N, K, mode, bias=True)
    x = rng.randn(rows, K).astype(np.float32)
    out = np.empty((rows, N), np.float32)
    HC.entry("cdecoder_linear_fp32")(x, *spec, N, out)
    W32, b32 = spec[0].astype(np.float32), spec[6].astype(np.float32)
    np.testing.assert_array_equal(out, R.gemm_fp(x, W32, b32))
    if mode == "fp32":
        ref = np.empty((rows, N), np.float32)
        HC.entry("cgemm_fp_fp32")(x, spec[0], spec[6], ref)
        np.testing.assert_array_equal(out, ref)


def test_native_layer_simd_levels_agree():
    """BNB_MS_SIMD=scalar and this CPU's SIMD level give the same bytes for the decoder halves: decode (T = 1: the
    GEMV kernels, per-head attention) and prefill (T = 13: the panel GEMM of gemm_panel.h with its 6-row tail,
    the blocked attention, the vectorised exp in softmax and SiLU), fp32 / NF4 / double-quant weights, fp16 / bf16
    weights at T = 13 (widened into the panels), int8 at both (int8.cpp's kernel, outlier columns at threshold 6)."""

    from simd_levels import assert_levels_agree

    here = __import__("os").path.dirname(__file__)
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import hashlib, numpy as np;"
        "import test_fused_decoder as t; from bitsandbytes_ms import cextension as c, _hostcall as HC;"
        "h = hashlib.sha256(); rng = np.random.RandomState(3)"
        "\nfor mode, T in (('fp32', 13), ('fp32', 1), ('bf16', 1), ('nf4', 13), ('dq', 1), ('nf4', 40), ('fp16', 13), ('bf16', 13), ('int8', 1),"
        " ('int8-t6', 1), ('int8-t6', 13)):"
        "\n  B, H, Hq, KVH, D, I, past, Smax = 2, 64, 4, 2, 16, 96, 3, 48"
        "\n  q, k, v, o = (t._spec(rng, n, kk, mode, True) for n, kk in ((Hq*D, H), (KVH*D, H), (KVH*D, H), (H, Hq*D)))"
        "\n  x = (rng.randn(B, T, H) * 4).astype(np.float32); pos = (np.arange(T)[None] + past + np.array([[0], [-2]])).astype(np.int64)"
        "\n  mask = np.ones((B, past + T), np.uint8); mask[1, :2] = 0"
        "\n  kc, vc = rng.randn(B, KVH, Smax, D).astype(np.float32), rng.randn(B, KVH, Smax, D).astype(np.float32)"
        "\n  nw = (1 + 0.1 * rng.randn(H)).astype(np.float32); invf = (1.0 / (10000 ** (np.arange(0, D, 2) / D))).astype(np.float32)"
        "\n  out = np.empty_like(x)"
        "\n  HC.entry('cdecoder_attention_fp32')(x, pos, mask, kc, vc, nw, invf, None, None, *q, *k, *v, *o, past, Hq, 1e-5, D ** -0.5, 1.0, 0, out)"
        "\n  g, u, d = t._spec(rng, I, H, mode), t._spec(rng, I, H, mode), t._spec(rng, H, I, mode, True)"
        "\n  mo = np.empty_like(x); HC.entry('cdecoder_mlp_fp32')(out, nw, *g, *u, *d, I, 1e-5, mo)"
        "\n  for a in (out, kc, vc, mo): h.update(np.ascontiguousarray(a).tobytes())"
        "\nprint(c.simd_level(), h.hexdigest())"
    )
    assert_levels_agree(code)


def test_native_layer_rejects_bad_calls():
    rng = np.random.RandomState(1)
    g = _spec(rng, 32, 16, "nf4")
    x = rng.randn(2, 16).astype(np.float32)
    lin = HC.entry("cdecoder_linear_fp32")
    with pytest.raises(RuntimeError, match="status"):
        lin(x, *g, 33, np.empty((2, 33), np.float32))  # N*K larger than the weight
    with pytest.raises(RuntimeError, match="status"):
        HC.entry("crms_norm_fp32")(x, np.ones(15, np.float32), 1e-5, np.empty_like(x))
    out = np.empty((2, 32), np.float32)
    i8 = list(_spec(rng, 32, 16, "int8-t6", bias=True))
    lin(x, *i8, 32, out)  # well formed
    bad = [(1, np.ones(31, np.float32)),                      # SCB of the wrong length
           (1, np.ones(32, np.float16)),                      # SCB not fp32
           (1, None),                                         # no SCB
           (5, np.array(-1.0, np.float32)),                   # negative threshold
           (5, np.array(np.nan, np.float32)),                 # NaN threshold
           (6, np.ones(32, np.int32)),                        # integer bias
           (6, np.ones(31, np.float32)),                      # bias of the wrong length
           (0, i8[0].reshape(16, 32))]                        # CB [K, N] instead of [N, K]
    for slot, v in bad:
        spec = list(i8)
        spec[slot] = v
        with pytest.raises(RuntimeError, match="status"):
            lin(x, *spec, 32, out)
    h = list(_spec(rng, 32, 16, "fp16"))
    lin(x, *h, 32, out)
    with pytest.raises(RuntimeError, match="status"):
        lin(x, h[0].reshape(16, 32), *h[1:], 32, out)  # fp16 W [K, N]
    with pytest.raises(RuntimeError, match="status"):
        lin(x.astype(np.float16), *h, 32, out)  # activations are fp32
    big = np.zeros((1, 131072), np.int8)  # K past the exact int32 range of the int8 GEMM
    with pytest.raises(RuntimeError, match="status"):
        lin(np.zeros((1, 131072), np.float32), big, np.ones(1, np.float32), None, None, None, None, None, 64, 256,
            1, np.empty((1, 1), np.float32))


# ---- models -------------------------------------------------------------------------------------------
def _cfg(family, **kw):
    base = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    base.update(kw)
    if family == "llama":
        return LlamaConfig(tie_word_embeddings=True, **base)
    if family == "qwen2":
        return Qwen2Config(tie_word_embeddings=False, **base)
    if family == "qwen3":
        return Qwen3Config(tie_word_embeddings=True, head_dim=16, **base)
    return MistralConfig(tie_word_embeddings=False, sliding_window=5, **base)


def _model(cfg, quant=True, **qkw):
    m = AutoModelForCausalLM.from_config(cfg)
    m.eval()
    rng = np.random.RandomState(0)
    for _, p in m.named_parameters():  # mindtorch's random init ignores seeds
        p.data.copy_(torch.tensor((rng.randn(*p.shape) * 0.1).astype(np.float32)))
    if quant:
        quant_4bit(m, quant_type=qkw.pop("quant_type", "nf4"), compute_dtype="fp32", progress=False, **qkw)
        unfuse(m)  # quant_4bit fuses on the first forward by itself: these tests compare against the unfused path
    return m


IDS = np.array([[5, 77, 301, 9, 12, 480, 33, 7, 250, 61, 99, 100],
                [0, 0, 0, 0, 0, 41, 8, 300, 17, 222, 3, 90]], np.int64)
MASK = (IDS != 0).astype(np.int64)


def _generate(m, n=8, **kw):
    with torch.no_grad():
        out = m.generate(torch.tensor(IDS), attention_mask=torch.tensor(MASK), max_new_tokens=n, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0, **kw)
    return out.sequences.asnumpy(), np.stack([s.asnumpy() for s in out.logits], 1)


def _outputs(m):
    """(prompt logits [B, T, V], greedy tokens, per-step logits) of one forward over the prompt and _generate."""
    with torch.no_grad():
        prompt = m(torch.tensor(IDS), attention_mask=torch.tensor(MASK)).logits.asnumpy().astype(np.float32)
    tok, logits = _generate(m)
    return prompt, tok, logits.astype(np.float32)


def _fused_outputs(m):
    assert fuse(m) and is_fused(m)
    n0 = FU.stats["fused_forwards"]
    try:
        out = _outputs(m)
        assert FU.stats["fused_forwards"] - n0 == 1 + 8  # the prompt check, then prefill + 7 decode steps
    finally:
        unfuse(m)
    return out


def _check_close(out, ref, bound, what="fused vs unfused"):
    """Same greedy tokens; max|dlogit| over the prompt's non-pad positions and every step <= bound * max|logit|."""
    ok = MASK.astype(bool)
    err = max(np.abs(out[0] - ref[0])[ok].max(), np.abs(out[2] - ref[2]).max()) / np.abs(ref[2]).max()
    np.testing.assert_array_equal(out[1], ref[1])
    print(f"{what}: max|dlogit| / max|logit| = {err:.2e}")
    assert err <= bound, err
    return err


def _compare(m, bound=LOGIT_BOUND):
    ref = _outputs(m)
    return _check_close(_fused_outputs(m), ref, bound)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "qwen3"])
def test_fused_model_matches_unfused(family):
    m = _model(_cfg(family))
    if family == "qwen2":
        assert m.model.layers[0].self_attn.q_proj.bias is not None
    _compare(m)


def test_fused_mixed_fp32_layers_fp4_no_double_quant():
    m = _model(_cfg("llama", attention_bias=True), quant_type="fp4", compress_statistics=False,
               modules_to_not_convert=["o_proj", "down_proj", "lm_head"])
    from bitsandbytes_ms.nn import LinearFP

    assert type(m.model.layers[0].self_attn.o_proj) is LinearFP  # a kept nn.Linear (quant_4bit's fast_fp_layers)
    _compare(m)


def test_fused_generate_eos_sampling_and_cache_length():
    m = _model(_cfg("llama"))
    ref_tok, _ = _generate(m)
    eos = int(ref_tok[0, IDS.shape[1] + 2])  # a token row 0 generates at step 3
    ref_eos, _ = _generate(m, eos_token_id=eos)
    fuse(m)
    tok, _ = _generate(m, eos_token_id=eos)
    np.testing.assert_array_equal(tok, ref_eos)
    with torch.no_grad():
        s = m.generate(torch.tensor(IDS), attention_mask=torch.tensor(MASK), max_new_tokens=5, do_sample=True,
                       top_k=20, pad_token_id=0)
        assert s.shape == (2, IDS.shape[1] + 5)
        from transformers.cache_utils import DynamicCache

        c = DynamicCache(config=m.config)
        m(torch.tensor(IDS), attention_mask=torch.tensor(MASK), past_key_values=c, use_cache=True)
        assert c.get_seq_length() == IDS.shape[1]
    FU.set_enabled(False)
    try:
        tok_off, _ = _generate(m)  # switched off: the unfused path
    finally:
        FU.set_enabled(True)
        unfuse(m)
    np.testing.assert_array_equal(tok_off, ref_tok)


# ---- int8 (LLM.int8()) and 16-bit models ---------------------------------------------------------------
def _boost_norms(m, value=40.0):
    """Three channels of every decoder RMSNorm weight set to ``value`` (the others are ~0.1): activations far
    above 6 in every layer, so with threshold 6 every int8 layer has outlier columns."""
    rng = np.random.RandomState(3)
    for layer in m.model.layers:
        for n in (layer.input_layernorm, layer.post_attention_layernorm):
            w = n.weight.asnumpy().copy()
            w[rng.choice(w.size, 3, replace=False)] = value
            n.weight.data.copy_(torch.tensor(w))


def _int8_model(family, threshold, dtype=None):
    m = _model(_cfg(family), quant=False)
    _boost_norms(m)
    if dtype is not None:
        m = m.to(dtype)
    quant_8bit(m, threshold=threshold, progress=False)
    unfuse(m)
    return m


@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "qwen3"])
def test_fused_int8_model_matches_unfused(family, threshold):
    from bitsandbytes_ms.nn import Linear8bitLt, LinearFP

    m = _int8_model(family, threshold)
    assert isinstance(m.model.layers[0].mlp.down_proj, Linear8bitLt) and type(m.lm_head) is LinearFP
    assert m.model.layers[1].self_attn.o_proj.state.threshold == threshold
    _compare(m, LOGIT_BOUND if threshold == 0 else INT8_LOGIT_BOUND)
    if threshold:  # the unfused runs met outlier columns in every int8 layer (state.idx: the last call's)
        idx = [x.state.idx for x in m.modules() if isinstance(x, Linear8bitLt)]
        assert len(idx) == 14 and all(i is not None and int(i.shape[0]) > 0 for i in idx)


@pytest.mark.parametrize("threshold", [0.0, 6.0])
def test_int8_layers_replay_the_unfused_bytes(threshold, monkeypatch):
    """Every Linear8bitLt call of unfused generations (batch 2: prefill 24 rows, decode 2 rows; batch 1: decode
    1 row) replayed through the fused path's linear (the spec fuse() builds, cdecoder_linear_fp32): the same
    bytes. With threshold 6 every layer meets outlier columns."""
    from bitsandbytes_ms.nn import Linear8bitLt

    m = _int8_model("qwen2", threshold)  # q/k/v with biases
    calls = []
    forward = Linear8bitLt.forward

    def capture(self, x):
        y = forward(self, x)
        calls.append((self, x.asnumpy().copy(), y.asnumpy().copy()))
        return y

    monkeypatch.setattr(Linear8bitLt, "forward", capture)
    _generate(m, n=3)
    with torch.no_grad():
        m.generate(torch.tensor(IDS[:1]), max_new_tokens=2, do_sample=False, pad_token_id=0)
    monkeypatch.undo()
    keep, rows, with_outliers = {}, set(), set()
    for mod, x, y in calls:
        N, K = (int(d) for d in mod.weight.shape)
        spec = FU._linear_spec(mod, "layer", N, K, keep)
        out = np.empty(x.shape[:-1] + (N,), np.float32)
        HC.entry("cdecoder_linear_fp32")(np.ascontiguousarray(x), *spec, N, out)
        np.testing.assert_array_equal(out.view(np.uint32), y.view(np.uint32))
        a = x.reshape(-1, K)
        rows.add(a.shape[0])
        if R.int8_vector_quant(a.astype(np.float16).astype(np.float32), 6.0, "float16")[2].any():
            with_outliers.add(id(mod))
    assert {1, 2, 24} <= rows, rows
    n_int8 = sum(isinstance(x, Linear8bitLt) for x in m.modules())
    assert n_int8 == 14 and len(with_outliers) == n_int8  # |a| >= 6 occurs at every layer (used at threshold 6)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("threshold", [0.0, 6.0])
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "qwen3"])
def test_fused_prefill_layers_are_the_unfused_bits(family, threshold, dtype):
    """Issue 31's perplexity bar: a fused prefill computes what the unfused model computes, bit for bit. Each
    decoder layer of an unfused int8 forward (hooks: its input, its attention and MLP outputs) is replayed
    through the fused layer's calls on the same input: the same bytes after the attention half and after the
    MLP half (RMSNorm, RoPE, softmax, P V and SiLU in MindSpore's rounding: simd_math.h; the int8 linears are
    the unfused layer's kernel); and the final norm. 16 rows without padding (the prefill attention path; a
    sliding window for Mistral, QK-norm for Qwen3), one prompt over 40 positions for a second case of the row
    sum's tail (softmax lanes). fp16: the model cast to fp16 (the tutorial's implicit dtype), whose unfused ops
    each round to fp16; the fused path (the *_r16 entries) rounds where they do and gives the same bits."""
    m = _int8_model(family, threshold, ms.float16 if dtype == "fp16" else None)
    assert m.__dict__.get(FU._PLAN) is None and (m.model.norm.weight.dtype == ms.float16) == (dtype == "fp16")
    caps = [dict() for _ in m.model.layers]
    hooks = []
    for c, layer in zip(caps, m.model.layers):
        hooks.append(layer.register_forward_pre_hook(
            lambda mod, a, kw, c=c: c.update(x=(a[0] if a else kw["hidden_states"]).asnumpy().copy()), with_kwargs=True))
        hooks.append(layer.self_attn.register_forward_hook(lambda mod, a, o, c=c: c.update(attn=o[0].asnumpy().copy())))
        hooks.append(layer.mlp.register_forward_hook(lambda mod, a, o, c=c: c.update(mlp=o.asnumpy().copy())))
    fin = {}
    hooks.append(m.model.norm.register_forward_hook(lambda mod, a, o: fin.update(x=a[0].asnumpy().copy(),
                                                                                 y=o.asnumpy().copy())))
    assert fuse(m)
    plan = m.__dict__[FU._PLAN]
    assert plan.r16 == (dtype == "fp16")
    f32 = np.float32
    for T in (16, 43):
        ids = np.random.RandomState(T).randint(3, 500, (1, T)).astype(np.int64)
        unfuse(m)
        with torch.no_grad():
            m(torch.tensor(ids))
        st = FU._KVState(plan, 1)
        st.ensure(T)
        x, pos = st.buffers(T)
        pos[...] = np.arange(T)
        plan.past[...] = 0
        for i, (layer, c) in enumerate(zip(plan.layers, caps)):
            a = layer.attn
            x[...] = c["x"].astype(f32)
            for slot, v in ((0, x), (1, pos), (2, None), (3, st.k[i]), (4, st.v[i]), (51, x)):
                a.set(slot, v)
            a()
            h = c["x"] + c["attn"]  # numpy adds fp16 arrays as MindSpore's fp16 Add (fp32 sum rounded)
            np.testing.assert_array_equal(x.view(np.uint32), h.astype(f32).view(np.uint32), err_msg=f"layer {i} attention")
            layer.mlp.set(0, x)
            layer.mlp.set(31, x)
            layer.mlp()
            np.testing.assert_array_equal(x, (h + c["mlp"]).astype(f32), err_msg=f"layer {i} MLP")
            layer.bound = None
        y = fin["x"].astype(f32)
        nc = plan.norm_call
        nc.set(0, y)
        nc.set(3, y)
        nc()
        np.testing.assert_array_equal(y, fin["y"].astype(f32))
    for h in hooks:
        h.remove()


def test_int8_plan_kept_across_unfused_runs_and_rebuilt_for_a_new_threshold():
    from bitsandbytes_ms.nn import Linear8bitLt

    m = _int8_model("llama", 6.0)
    assert fuse(m)
    plan = m.__dict__[FU._PLAN]
    FU.set_enabled(False)
    try:
        _generate(m, n=2)  # the unfused forward sets state.CB/SCB: not a change of the weights
    finally:
        FU.set_enabled(True)
    _generate(m, n=2)
    assert m.__dict__[FU._PLAN] is plan
    for x in m.modules():
        if isinstance(x, Linear8bitLt):
            x.state.threshold = 0.0
    fused = _outputs(m)  # a new generation: the plan is made again with the new threshold
    assert m.__dict__[FU._PLAN] is not plan
    unfuse(m)
    _check_close(fused, _outputs(m), LOGIT_BOUND)


KEEP_16 = ["o_proj", "down_proj", "lm_head"]


def _model_16(family, mode, dtype, values_of=None):
    """A small model cast to ``dtype`` and quantized (``mode`` int8 / nf4 / fp: left in full precision), o_proj,
    down_proj and lm_head kept in ``dtype``. ``values_of``: an fp32 model holding that 16-bit dtype's values."""
    m = _model(_cfg(family), quant=False)
    if values_of is not None:
        for p in m.parameters():
            p.data.copy_(torch.tensor(p.asnumpy().astype(HC.np_dtype(values_of)).astype(np.float32)))
    else:
        m = m.to(dtype)
    cd = {ms.float16: "fp16", ms.bfloat16: "bf16"}.get(dtype, "fp32")
    if mode == "int8":
        quant_8bit(m, threshold=6.0, progress=False, modules_to_not_convert=KEEP_16)
    elif mode == "nf4":
        quant_4bit(m, compute_dtype=cd, progress=False, modules_to_not_convert=KEEP_16)
    unfuse(m)
    return m


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("family, mode", [("llama", "int8"), ("qwen2", "nf4"), ("mistral", "fp"), ("qwen3", "int8")])
def test_fused_16bit_model(family, mode, dtype):
    """An fp16 model fuses in its own rounding (the *_r16 entries): the unfused fp16 model's greedy tokens, its
    logits within FP16_R16_BOUND. A bf16 model fuses with fp32 compute and fp32 hidden states: the fp32
    computation of its 16-bit weights (LOGIT_BOUND; an unfused bf16 model does not run on MindSpore's CPU: no
    bf16 gather)."""
    from bitsandbytes_ms.nn import LinearFP

    dt = ms.float16 if dtype == "fp16" else ms.bfloat16
    m = _model_16(family, mode, dt)
    o = m.model.layers[0].self_attn.o_proj
    assert type(o) is (torch.nn.Linear if mode == "fp" else LinearFP)  # fp: a plain 16-bit model, nothing kept
    assert o.weight.dtype == dt and m.model.norm.weight.dtype == dt and m.model.embed_tokens.weight.dtype == dt
    fused = _fused_outputs(m)
    if dt == ms.float16:  # the *_r16 entries: each op rounded to fp16 where the unfused fp16 model's op rounds
        _check_close(fused, _outputs(m), FP16_R16_BOUND, "fused vs unfused fp16")
        return
    truth = _outputs(_model_16(family, mode, ms.float32, values_of=dt))
    # int8: the per-layer bytes are cint8_linear_fp32's on the same inputs, but one flipped code moves the rest
    _check_close(fused, truth, INT8_LOGIT_BOUND if mode == "int8" else LOGIT_BOUND, "fused 16-bit vs fp32 compute")


@pytest.mark.parametrize("case, reason", [
    ("rope", "rope_scaling type 'linear'"),
    ("int8-training", "has_fp16_weights=True"),
    ("act", "hidden_act 'gelu'"),
])
def test_unsupported_keeps_unfused_path_with_one_warning(case, reason):
    if case == "rope":
        m = _model(_cfg("llama", rope_scaling={"rope_type": "linear", "factor": 2.0}))
    elif case == "act":
        m = _model(_cfg("llama", hidden_act="gelu"))
    else:  # an int8 layer in its training state (float weights, quantized again at every forward)
        from bitsandbytes_ms.nn import Linear8bitLt

        m = _model(_cfg("llama"), quant=False)
        old = m.model.layers[1].mlp.up_proj
        new = Linear8bitLt(old.in_features, old.out_features, bias=False, has_fp16_weights=True, threshold=6.0)
        new.weight.data.copy_(old.weight.data)
        m.model.layers[1].mlp.up_proj = new
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert not fuse(m)
        assert not fuse(m)  # the second call says nothing new
    msgs = [str(x.message) for x in w if "unfused path" in str(x.message)]
    assert len(msgs) == 1 and reason in msgs[0], msgs
    assert not is_fused(m)
    tok, _ = _generate(m, n=3)
    assert tok.shape == (2, IDS.shape[1] + 3)


def test_fused_patches_are_registered_with_reasons():
    names = {p.name: p for p in registry.patches()}
    for n in FU.FUSED_PATCHES:
        assert n in names and len(names[n].why) > 40


def test_weights_changed_after_fuse_are_read_again():
    """fuse() reads the weights' own memory; a weight updated in place after fuse() (its buffer moves) must be
    picked up by the next generation, never served stale."""
    m = _model(_cfg("llama"))
    ids = torch.tensor(IDS[:1])
    assert fuse(m)
    try:
        with torch.no_grad():
            before = m(ids).logits.asnumpy()
            emb = m.model.embed_tokens.weight
            emb.copy_(emb * 0.5)
            fused = m(ids).logits.asnumpy()
            unfuse(m)
            ref = m(ids).logits.asnumpy()
    finally:
        unfuse(m)
    assert not np.allclose(before, ref)
    np.testing.assert_allclose(fused, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("kw", [dict(num_beams=3), dict(prompt_lookup_num_tokens=2)], ids=["beam-search", "prompt-lookup"])
def test_fused_beam_search_and_assisted_decoding_match_unfused(kw):
    """Beam search reorders the cache (Cache.reorder_cache patch); prompt-lookup (assisted) decoding crops it after
    rejected candidates (Cache.crop patch): both give the unfused model's sequences."""
    m = _model(_cfg("llama"))
    ids = np.array([[5, 77, 301, 9, 12, 5, 77, 301, 9, 40, 5, 77]], np.int64)  # repeats, so prompt lookup proposes

    def gen():
        with torch.no_grad():
            return m.generate(torch.tensor(ids), attention_mask=torch.ones((1, ids.shape[1]), dtype=torch.int64),
                              max_new_tokens=10, do_sample=False, pad_token_id=0, **kw).asnumpy()

    ref = gen()
    assert fuse(m)
    n0, r0, c0 = FU.stats["fused_forwards"], FU.stats["cache_reorders"], FU.stats["cache_crops"]
    try:
        out = gen()
        assert FU.stats["fused_forwards"] > n0  # the fused path ran
        if "num_beams" in kw:
            assert FU.stats["cache_reorders"] > r0
        else:
            assert FU.stats["cache_crops"] > c0
    finally:
        unfuse(m)
    np.testing.assert_array_equal(out, ref)


def test_fused_prepare_inputs_gives_the_original_values():
    """The fused model's prepare_inputs_for_generation (patch fused-prepare-inputs) gives generate's values --
    input_ids sliced by cache_position, position_ids from the padding mask -- as the original computes them, for
    the prefill and a decode step with left padding; calls it does not cover go to the original."""
    from transformers.cache_utils import DynamicCache

    m = _model(_cfg("llama"))
    assert fuse(m)
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8]])
    am = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    cases = [(ids, am, torch.arange(0, 6)), (torch.cat([ids, torch.tensor([[9], [9]])], 1),
                                              torch.cat([am, torch.ones(2, 1, dtype=am.dtype)], 1), torch.tensor([6]))]
    for i, a, cp in cases:
        n0 = FU.stats["fast_prepares"]
        got = m.prepare_inputs_for_generation(i, past_key_values=DynamicCache(), attention_mask=a, cache_position=cp,
                                              use_cache=True)
        assert FU.stats["fast_prepares"] == n0 + 1
        unfuse(m)
        want = m.prepare_inputs_for_generation(i, past_key_values=DynamicCache(), attention_mask=a, cache_position=cp,
                                               use_cache=True)
        assert fuse(m)
        assert set(got) == set(want), (set(got), set(want))
        for k in ("input_ids", "position_ids"):
            np.testing.assert_array_equal(np.asarray(got[k]), want[k].asnumpy(), err_msg=k)
        assert got["attention_mask"] is a and got["cache_position"] is cp and got["use_cache"] is True
    n0 = FU.stats["fast_prepares"]
    m.prepare_inputs_for_generation(ids, past_key_values=DynamicCache(), attention_mask=am,
                                    cache_position=torch.arange(0, 6), position_ids=torch.arange(6)[None])
    assert FU.stats["fast_prepares"] == n0  # position_ids given: the original runs
    registry.remove(["fused-sample"])  # generate's own loop calls prepare_inputs (the numpy loop slices itself)
    try:
        out = m.generate(ids, attention_mask=am, max_new_tokens=3, do_sample=False, pad_token_id=0)
    finally:
        registry.apply(["fused-sample"])
    assert FU.stats["fast_prepares"] == n0 + 3 and out.shape == (2, 9)
