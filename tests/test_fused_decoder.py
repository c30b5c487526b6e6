"""The fused decode path (csrc/cpu/decoder.cpp + bitsandbytes_ms/integrations/fused.py, issue 13).

* the native layer halves against their numpy twins (_reference.decoder_attention / decoder_mlp) for fp32,
  NF4, FP4 and double-quant weights, with a padding mask, a sliding window and out == x;
* small random Llama / Qwen2 (q/k/v biases) / Mistral (sliding window) / Qwen3 (QK-norm) models, 4-bit quantized (one mixed with
  fp32 nn.Linear layers): the fused model gives the unfused quantized model's greedy tokens (batch 2, left
  padding, EOS) and per-step logits within LOGIT_BOUND * max|logit|;
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
#: positions (measured: 2e-7 .. 5e-7 on these models; the difference is rounding order in RMSNorm/RoPE/softmax,
#: and for prompts of > 8 rows the unfused Linear4bit's dequantize + matmul)
LOGIT_BOUND = 1e-5


# ---- native layer vs reference ----------------------------------------------------------------------
def _spec(rng, N, K, mode, bias=False):
    W = (rng.randn(N, K) * 0.05).astype(np.float32)
    b = (rng.randn(N) * 0.1).astype(np.float32) if bias else None
    if mode == "fp32":
        return (W, None, None, None, None, None, b, 64, 256)
    qt = "fp4" if mode == "fp4" else "nf4"
    p, qs = F.quantize_4bit(ms.Tensor(W), quant_type=qt, compress_statistics=(mode == "dq"), blocksize=64)
    P = p.asnumpy().reshape(-1)
    if qs.nested:
        off = qs.offset.asnumpy() if hasattr(qs.offset, "asnumpy") else qs.offset
        return (P, qs.absmax.asnumpy().reshape(-1), qs.code.asnumpy(), qs.state2.absmax.asnumpy(),
                qs.state2.code.asnumpy(), np.array(float(off), np.float32), b, 64, qs.state2.blocksize)
    return (P, qs.absmax.asnumpy(), qs.code.asnumpy(), None, None, None, b, 64, 256)


@pytest.mark.parametrize("mode, window, T", [  # T = 13: B*T > 8 rows, the prefill path (dequantize + GEMM)
    ("fp32", 0, 5), ("nf4", 0, 5), ("fp4", 3, 5), ("dq", 0, 5), ("nf4", 3, 13), ("dq", 0, 13), ("fp32", 3, 13)])
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
    lo = np.empty((B, T, I), np.float32)
    HC.entry("cdecoder_linear_fp32")(x, *g, I, lo)
    np.testing.assert_allclose(lo, R.linear_spec(x, g, I), rtol=0, atol=2e-6 * np.abs(lo).max())
    HC.entry("crms_norm_fp32")(x, nw, 1e-5, out)
    np.testing.assert_allclose(out, R.rms_norm(x, nw, 1e-5), rtol=1e-6, atol=1e-6)


def test_native_layer_simd_levels_agree():
    """BNB_MS_SIMD=scalar and this CPU's SIMD level give the same bytes for the decoder halves: decode (T = 1: the
    GEMV kernels, per-head attention) and prefill (T = 13: the panel GEMM of gemm_panel.h with its 6-row tail,
    the blocked attention, the vectorised exp in softmax and SiLU), fp32 / NF4 / double-quant weights."""

    from simd_levels import assert_levels_agree

    here = __import__("os").path.dirname(__file__)
    code = (
        f"import sys; sys.path.insert(0, {here!r}); import hashlib, numpy as np;"
        "import test_fused_decoder as t; from bitsandbytes_ms import cextension as c, _hostcall as HC;"
        "h = hashlib.sha256(); rng = np.random.RandomState(3)"
        "\nfor mode, T in (('fp32', 13), ('nf4', 13), ('dq', 1), ('nf4', 40)):"
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
    with pytest.raises(RuntimeError, match="status"):
        HC.entry("cdecoder_linear_fp32")(x, *g, 33, np.empty((2, 33), np.float32))  # N*K larger than the weight
    with pytest.raises(RuntimeError, match="status"):
        HC.entry("crms_norm_fp32")(x, np.ones(15, np.float32), 1e-5, np.empty_like(x))


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
    return m


IDS = np.array([[5, 77, 301, 9, 12, 480, 33, 7, 250, 61, 99, 100],
                [0, 0, 0, 0, 0, 41, 8, 300, 17, 222, 3, 90]], np.int64)
MASK = (IDS != 0).astype(np.int64)


def _generate(m, n=8, **kw):
    with torch.no_grad():
        out = m.generate(torch.tensor(IDS), attention_mask=torch.tensor(MASK), max_new_tokens=n, do_sample=False,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=0, **kw)
    return out.sequences.asnumpy(), np.stack([s.asnumpy() for s in out.logits], 1)


def _compare(m):
    with torch.no_grad():
        ref_prompt = m(torch.tensor(IDS), attention_mask=torch.tensor(MASK)).logits.asnumpy()
    ref_tok, ref_logits = _generate(m)
    assert fuse(m) and is_fused(m)
    n0 = FU.stats["fused_forwards"]
    try:
        with torch.no_grad():
            prompt = m(torch.tensor(IDS), attention_mask=torch.tensor(MASK)).logits.asnumpy()
        tok, logits = _generate(m)
        assert FU.stats["fused_forwards"] - n0 == 1 + 8  # the prompt check, then prefill + 7 decode steps
    finally:
        unfuse(m)
    scale = np.abs(ref_logits).max()
    ok = MASK.astype(bool)
    err = max(np.abs(prompt - ref_prompt)[ok].max(), np.abs(logits - ref_logits).max()) / scale
    np.testing.assert_array_equal(tok, ref_tok)
    print(f"fused vs unfused: max|dlogit| / max|logit| = {err:.2e}")
    assert err <= LOGIT_BOUND, err
    return err


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


@pytest.mark.parametrize("case, reason", [
    ("rope", "rope_scaling type 'linear'"),
    ("int8", "Linear8bitLt"),
    ("act", "hidden_act 'gelu'"),
])
def test_unsupported_keeps_unfused_path_with_one_warning(case, reason):
    if case == "rope":
        m = _model(_cfg("llama", rope_scaling={"rope_type": "linear", "factor": 2.0}))
    elif case == "act":
        m = _model(_cfg("llama", hidden_act="gelu"))
    else:
        m = _model(_cfg("llama"), quant=False)
        quant_8bit(m, progress=False)
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
