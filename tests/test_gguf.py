"""GGUF -> Hugging Face conversion (bitsandbytes_ms.integrations.gguf) on a tiny Llama GGUF written here with
gguf's GGUFWriter (f32, f16, Q8_0 and Q4_1 tensors), and ``bnb-ms quantize --model FILE.gguf``."""

import json

import mindnlp  # noqa: F401  (before transformers: torch -> mindtorch)
import numpy as np
import pytest

import gguf  # noqa: E402  (requirements-lock.txt installs it: a missing one is a broken set-up, not a skip)
from gguf import quants  # noqa: E402

from bitsandbytes_ms.integrations import gguf as conv  # noqa: E402

T = gguf.GGMLQuantizationType
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, CTX = 64, 128, 2, 4, 2, 256
# tensor -> GGUF type: every kind of encoding the converter must undo
TYPES = {"attn_q": T.Q8_0, "attn_k": T.Q4_1, "attn_v": T.F16, "attn_output": T.Q4_1, "ffn_gate": T.Q8_0,
         "ffn_up": T.Q4_1, "ffn_down": T.F32}


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def _permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# numpy references for the block formats (ggml's layout), independent of gguf.quants.dequantize
def _ref_q8_0(raw, shape):
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(shape)


def _ref_q4_1(raw, shape):
    blocks = raw.reshape(-1, 20)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # low nibbles: values 0..15, high: 16..31
    return (d * q + m).reshape(shape)


def _tokens():
    b2u = _bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    tokens += [m.replace(" ", "") for m in merges]
    tokens += ["<|endoftext|>"]
    types = [1] * (len(tokens) - 1) + [3]
    return tokens, types, merges


def write_tiny_gguf(path, seed=0):
    """A 2-layer Llama GGUF; returns {hf_name: (original fp32 array, gguf type, stored raw array)}."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = _tokens()
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama-test")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab - 1)
    w.add_eos_token_id(vocab - 1)
    hd = HIDDEN // HEADS
    shapes = {"attn_q": (HEADS * hd, HIDDEN), "attn_k": (KV_HEADS * hd, HIDDEN), "attn_v": (KV_HEADS * hd, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (INTER, HIDDEN), "ffn_up": (INTER, HIDDEN),
              "ffn_down": (HIDDEN, INTER)}
    ref = {}

    def add(gname, hname, a, qtype, n_head=None):
        stored = _permute(a, n_head) if n_head else a
        if qtype == T.F32:
            raw = stored.astype(np.float32)
            w.add_tensor(gname, raw)
        elif qtype == T.F16:
            raw = stored.astype(np.float16)
            w.add_tensor(gname, raw)
        else:
            raw = quants.quantize(stored, qtype)
            w.add_tensor(gname, raw, raw_dtype=qtype)
        ref[hname] = (a, qtype, raw, n_head)

    add("token_embd.weight", "model.embed_tokens.weight", rng.standard_normal((vocab, HIDDEN)).astype(np.float32) * 0.1, T.F32)
    add("output_norm.weight", "model.norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), T.F32)
    add("output.weight", "lm_head.weight", rng.standard_normal((vocab, HIDDEN)).astype(np.float32) * 0.1, T.Q8_0)
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", f"model.layers.{i}.input_layernorm.weight",
            1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), T.F32)
        add(f"blk.{i}.ffn_norm.weight", f"model.layers.{i}.post_attention_layernorm.weight",
            1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32), T.F32)
        for g, h in names.items():
            a = (rng.standard_normal(shapes[g]) * 0.05).astype(np.float32)
            n_head = HEADS if g == "attn_q" else KV_HEADS if g == "attn_k" else None
            add(f"blk.{i}.{g}.weight", f"model.layers.{i}.{h}.weight", a, TYPES[g], n_head)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ref


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    path = d / "tiny-llama.gguf"
    ref = write_tiny_gguf(path)
    out = conv.gguf_to_hf(path, d / "hf")
    return path, ref, out


def test_config_from_metadata(tiny):
    _, _, out = tiny
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (HIDDEN, INTER, LAYERS)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["max_position_embeddings"]) == (HEADS, KV_HEADS, CTX)
    assert cfg["vocab_size"] == len(_tokens()[0]) and cfg["tie_word_embeddings"] is False
    assert cfg["rope_theta"] == 10000.0 and abs(cfg["rms_norm_eps"] - 1e-5) < 1e-9


def test_weights_dequantized_like_numpy(tiny):
    """Every tensor: the block formats decoded by an independent numpy reference, q/k rows un-permuted, all
    bit-exact; and close to the fp32 weights the file was written from."""
    from safetensors.numpy import load_file

    _, ref, out = tiny
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(ref)
    seen = set()
    for name, (orig, qtype, raw, n_head) in ref.items():
        shape = orig.shape
        if qtype == T.Q8_0:
            expect = _ref_q8_0(raw, shape)
        elif qtype == T.Q4_1:
            expect = _ref_q4_1(raw, shape)
        else:
            expect = raw.astype(np.float32).reshape(shape)
        if n_head:
            expect = conv.reverse_permute(expect, n_head)
            assert np.array_equal(_permute(conv.reverse_permute(orig, n_head), n_head), orig)
        assert got[name].dtype == np.float32 and got[name].shape == shape, name
        np.testing.assert_array_equal(got[name], expect, err_msg=name)
        # the quantization error is bounded by the format's step
        tol = {T.F32: 0, T.F16: 1e-3, T.Q8_0: np.abs(orig).max() / 127 * 0.51 + 1e-6,
               T.Q4_1: (orig.max() - orig.min()) / 15 * 0.51 + 1e-3}[qtype]
        assert np.abs(got[name] - orig).max() <= tol, (name, qtype.name)
        seen.add(qtype)
    assert seen == {T.F32, T.F16, T.Q8_0, T.Q4_1}
    # gguf's own dequantizer agrees with the numpy reference
    _, _, raw, _ = ref["model.layers.0.mlp.up_proj.weight"]
    np.testing.assert_array_equal(quants.dequantize(raw, T.Q4_1), _ref_q4_1(raw, (INTER, HIDDEN)))


def test_tokenizer_round_trip(tiny):
    from transformers import AutoTokenizer

    _, _, out = tiny
    tok = AutoTokenizer.from_pretrained(str(out))
    text = "the cat in the hat, a test"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    vocab = tok.get_vocab()
    assert vocab["Ġthe"] in ids and vocab["in"] in ids  # merges applied
    assert tok.eos_token == "<|endoftext|>"


def test_cache_reuses_the_conversion(tiny, tmp_path):
    path, _, _ = tiny
    d1, new1 = conv.cached_hf_checkpoint(path, tmp_path)
    d2, new2 = conv.cached_hf_checkpoint(path, tmp_path)
    assert (new1, new2) == (True, False) and d1 == d2 and (d1 / "model.safetensors").exists()
    assert d1.parent == tmp_path / "gguf"


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(conv.GGUFConversionError, match="architecture 'gpt2' is not supported"):
        conv.gguf_to_hf(path, tmp_path / "out")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(conv.GGUFConversionError, match="not a readable GGUF file"):
        conv.gguf_to_hf(tmp_path / "junk.gguf", tmp_path / "out2")


def test_cli_quantizes_a_gguf_file(tiny, tmp_path, monkeypatch, capsys):
    """`bnb-ms quantize --model FILE.gguf` (in this process, to skip a second interpreter start): converted
    once into the cache, then quantized and measured; the report has the prefill and decode lines."""
    from bitsandbytes_ms.__main__ import main

    path, _, _ = tiny
    monkeypatch.setenv("BNB_MS_CACHE_DIR", str(tmp_path / "cache"))
    args = ["quantize", "--model", str(path), "--mode", "nf4", "--max-new-tokens", "3", "--eval-windows", "3",
            "--eval-window", "32"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "converted from tiny-llama.gguf in" in out
    assert "layers converted  14" in out and "layers skipped    1: lm_head" in out
    for line in ("prefill tok/s", "decode tok/s", "tokens/s", "perplexity"):
        assert line in out, (line, out)
    assert len(list((tmp_path / "cache" / "gguf").iterdir())) == 1
    # a missing .gguf file: one line, exit code 2
    assert main(["quantize", "--model", str(tmp_path / "missing.gguf")]) == 2
    assert "missing.gguf: no such file" in capsys.readouterr().err
