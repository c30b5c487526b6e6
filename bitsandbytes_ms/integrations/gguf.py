"""GGUF files (llama.cpp's format) as Hugging Face checkpoints: ``bnb-ms quantize --model FILE.gguf``.

:func:`gguf_to_hf` reads a GGUF file with the ``gguf`` package (numpy only), dequantizes every tensor to
float32 (F32/F16/BF16 and the block formats ``gguf.quants`` knows: Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, ...),
undoes llama.cpp's rotary permutation of the Llama q/k projections, and writes ``config.json``,
``generation_config.json``, a fast tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) and
``model.safetensors``. :func:`cached_hf_checkpoint` does that once per file into a cache directory
(``$BNB_MS_CACHE_DIR`` or ``~/.cache/bitsandbytes_ms/models``), keyed by the file's SHA-256, and reuses the
result afterwards.

Supported architectures: ``llama`` (also Mistral-style and SmolLM GGUFs, which llama.cpp writes as
``llama``) and ``qwen2``; tokenizers of type ``gpt2`` (byte-level BPE) and ``llama`` (SentencePiece BPE).
Anything else raises :class:`GGUFConversionError` with one line saying what is missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional

import numpy as np

#: bumped when the conversion's output changes, so cached conversions are redone
CONVERTER_VERSION = 3  # 3: no token_type_ids, a pad token other than eos

_ARCHES = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2")}

# GGUF tensor name (per block: blk.{i}.<name>) -> HF name
_BLOCK_MAP = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_MAP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class GGUFConversionError(ValueError):
    """The GGUF file cannot be turned into a Hugging Face checkpoint (said in one line)."""


def default_cache_dir() -> Path:
    env = os.environ.get("BNB_MS_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bitsandbytes_ms" / "models"


def _gguf():
    try:
        import gguf
    except ImportError as e:  # pragma: no cover  (gguf is in requirements-lock.txt)
        raise GGUFConversionError("reading .gguf files needs the `gguf` package (pip install gguf)") from e
    return gguf


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def hf_name(gguf_name: str) -> Optional[str]:
    """The Hugging Face parameter name of a GGUF tensor name (None for tensors without one)."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if base.startswith("blk."):
        _, idx, part = base.split(".", 2)
        if part not in _BLOCK_MAP:
            return None
        return f"model.layers.{int(idx)}.{_BLOCK_MAP[part]}.{suffix}"
    if base in _TOP_MAP:
        return f"{_TOP_MAP[base]}.{suffix}"
    return None


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` of q/k projection rows (interleaved -> half-split rotary layout)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def dequantize_tensor(tensor) -> np.ndarray:
    """A GGUF reader tensor as a float32 array in PyTorch's shape order (ggml's ``ne`` reversed)."""
    gguf = _gguf()
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    qtype = tensor.tensor_type
    T = gguf.GGMLQuantizationType
    if qtype == T.F32:
        out = np.asarray(tensor.data, dtype=np.float32)
    elif qtype == T.F16:
        out = np.asarray(tensor.data).view(np.float16).astype(np.float32)
    elif qtype == T.BF16:
        out = (np.asarray(tensor.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        try:
            out = gguf.quants.dequantize(np.asarray(tensor.data), qtype).astype(np.float32, copy=False)
        except NotImplementedError as e:
            raise GGUFConversionError(f"tensor {tensor.name}: GGUF type {qtype.name} cannot be dequantized by the "
                                      f"gguf package") from e
    return np.ascontiguousarray(out.reshape(shape))


def read_config(reader) -> dict:
    """A transformers ``config.json`` dict from the GGUF metadata (llama / qwen2)."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHES:
        raise GGUFConversionError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(_ARCHES)})")
    cls, model_type = _ARCHES[arch]

    def need(key):
        v = _field(reader, f"{arch}.{key}")
        if v is None:
            raise GGUFConversionError(f"GGUF metadata key {arch}.{key} is missing")
        return v

    names = {t.name for t in reader.tensors}
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight") if "token_embd.weight" in names else None
    if embd is None:
        raise GGUFConversionError("GGUF file has no token_embd.weight tensor")
    hidden = int(need("embedding_length"))
    n_head = int(need("attention.head_count"))
    n_kv = int(_field(reader, f"{arch}.attention.head_count_kv", n_head))
    vocab = int(embd.shape.tolist()[1])
    head_dim = int(_field(reader, f"{arch}.rope.dimension_count", hidden // n_head))
    cfg = {
        "architectures": [cls],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 2048)),
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    }
    if model_type == "llama":
        cfg["head_dim"] = head_dim
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
        cfg["mlp_bias"] = False
    for key, name in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id")):
        v = _field(reader, name)
        if v is not None:
            cfg[key] = int(v)
    pad = pad_token_id(reader)
    if pad is not None:
        cfg["pad_token_id"] = pad
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in names:
        raise GGUFConversionError(f"GGUF rope scaling ({scaling or 'rope_freqs'}) is not supported")
    return cfg


def read_weights(reader, config: dict) -> Dict[str, np.ndarray]:
    """All tensors as float32 arrays under their Hugging Face names."""
    out = {}
    n_head, n_kv = config["num_attention_heads"], config["num_key_value_heads"]
    permute = config["model_type"] == "llama"
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            raise GGUFConversionError(f"GGUF tensor {t.name!r} has no Hugging Face counterpart")
        w = dequantize_tensor(t)
        if permute and ".self_attn.q_proj." in name:
            w = reverse_permute(w, n_head)
        elif permute and ".self_attn.k_proj." in name:
            w = reverse_permute(w, n_kv)
        out[name] = w
    return out


#: vocabulary entries taken as the padding token (when special) where the file's own is missing or is eos
PAD_NAMES = ("<|pad|>", "<pad>", "[PAD]", "<|padding|>", "<|finetune_right_pad_id|>", "<|endoftext|>")
_SPECIAL_TYPES = (2, 3, 4)  # gguf TokenType UNKNOWN, CONTROL, USER_DEFINED


def pad_token_id(reader) -> Optional[int]:
    """The padding token of the converted checkpoint, never the eos or bos token: the file's
    ``tokenizer.ggml.padding_token_id`` when it is neither (llama.cpp conversions often set it to eos, which
    makes pad == eos), else the first special token named in :data:`PAD_NAMES`, else the unknown token, else None:
    the tokenizer then has no pad token (as Llama's own) and ``generation_config.json`` sets ``pad_token_id`` to
    eos, what ``generate`` would pick anyway, so that it does not warn on every call."""
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if tokens is None:
        return None
    tokens = list(tokens)
    types = _field(reader, "tokenizer.ggml.token_type")
    avoid = {int(v) for v in (_field(reader, "tokenizer.ggml.eos_token_id"), _field(reader, "tokenizer.ggml.bos_token_id"))
             if v is not None}

    def usable(i):
        return i is not None and 0 <= int(i) < len(tokens) and int(i) not in avoid

    own = _field(reader, "tokenizer.ggml.padding_token_id")
    if usable(own):
        return int(own)
    index = {t: i for i, t in enumerate(tokens)}
    for name in PAD_NAMES:
        i = index.get(name)
        if usable(i) and (types is None or int(types[i]) in _SPECIAL_TYPES):
            return i
    unk = _field(reader, "tokenizer.ggml.unknown_token_id")
    return int(unk) if usable(unk) else None


def _import_transformers_safely():
    """transformers decides at its first import whether torch exists: under mindnlp it must come after
    ``import mindnlp``, or mindnlp's later import fails. Import mindnlp first when it is installed."""
    import sys

    if "transformers" not in sys.modules:
        try:
            import mindnlp  # noqa: F401
        except ImportError:  # pragma: no cover
            pass


def build_tokenizer(reader):
    """``(tokenizers.Tokenizer, tokenizer_config dict)`` from the GGUF tokenizer metadata (``gpt2``: byte-level
    BPE, built with the ``tokenizers`` package alone; ``llama``: SentencePiece BPE through transformers'
    GGUF converter)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = _field(reader, "tokenizer.ggml.model")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise GGUFConversionError("GGUF file has no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens)")
    tokens = list(tokens)
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = _field(reader, "tokenizer.ggml.merges")

    def tok_id(key):
        v = _field(reader, f"tokenizer.ggml.{key}")
        return tokens[int(v)] if v is not None and int(v) < len(tokens) else None

    if kind == "gpt2":
        if merges is None:
            raise GGUFConversionError("GGUF gpt2 tokenizer without tokenizer.ggml.merges")
        vocab = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges], fuse_unk=False)
        tk = Tokenizer(bpe)
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
        tk.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=True)
        special = [tokens[i] for i, ty in enumerate(types or []) if int(ty) in (3, 4)]  # control / user-defined
        if special:
            tk.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in special])
    elif kind == "llama":
        _import_transformers_safely()
        from transformers.integrations.ggml import GGUFLlamaConverter

        d = {"tokenizer_type": kind, "tokens": tokens}
        for key, name in (("scores", "scores"), ("token_type", "token_type"), ("merges", "merges"),
                          ("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                          ("unk_token_id", "unknown_token_id"), ("add_prefix_space", "add_space_prefix")):
            v = _field(reader, f"tokenizer.ggml.{name}")
            if v is not None:
                d[key] = list(v) if isinstance(v, (list, tuple, np.ndarray)) else v
        tk = GGUFLlamaConverter(d).converted()
    else:
        raise GGUFConversionError(f"GGUF tokenizer type {kind!r} is not supported (supported: gpt2, llama)")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
              "model_max_length": int(_field(reader, f"{_field(reader, 'general.architecture')}.context_length", 2048))}
    for k, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id")):
        if tok_id(key) is not None:
            config[k] = tok_id(key)
    pad = pad_token_id(reader)
    if pad is not None:
        config["pad_token"] = tokens[pad]
    # a causal LM takes no token_type_ids (PreTrainedTokenizerFast returns them by default, and generate() rejects them)
    config["model_input_names"] = ["input_ids", "attention_mask"]
    template = _field(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return tk, config


def gguf_to_hf(gguf_path, out_dir) -> Path:
    """Convert ``gguf_path`` into a Hugging Face checkpoint directory ``out_dir`` (created; float32 weights).

    Raises: GGUFConversionError (unsupported architecture/tokenizer/tensor type, missing metadata),
    FileNotFoundError.
    """
    gguf = _gguf()
    from safetensors.numpy import save_file

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(str(gguf_path))
    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except Exception as e:  # noqa: BLE001  (a truncated or foreign file)
        raise GGUFConversionError(f"not a readable GGUF file ({str(e).strip().splitlines()[0][:120] if str(e) else type(e).__name__})") from e
    config = read_config(reader)
    tokenizer = build_tokenizer(reader)  # before the weights: a bad tokenizer fails fast
    weights = read_weights(reader, config)
    if "lm_head.weight" not in weights and not config["tie_word_embeddings"]:  # pragma: no cover
        raise GGUFConversionError("GGUF file has no output.weight and the embeddings are not tied")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    if "pad_token_id" not in gen and "eos_token_id" in gen:  # what generate() would pick, without its per-call warning
        gen["pad_token_id"] = gen["eos_token_id"]
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    tk, tok_config = tokenizer
    tk.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {k: v for k, v in tok_config.items() if k.endswith("_token")}, indent=2) + "\n")
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt", "source": gguf_path.name})
    (out_dir / "gguf_source.json").write_text(json.dumps(
        {"source": str(gguf_path.resolve()), "converter_version": CONVERTER_VERSION,
         "tensor_types": sorted({t.tensor_type.name for t in reader.tensors})}, indent=2) + "\n")
    return out_dir


def file_sha256(path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def cached_hf_checkpoint(gguf_path, cache_dir=None) -> tuple:
    """``(directory, converted_now)``: the Hugging Face checkpoint converted from ``gguf_path``, made once
    under ``cache_dir`` (default :func:`default_cache_dir`) and reused while the file's content is the same."""
    gguf_path = Path(gguf_path)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = f"{gguf_path.stem}-{file_sha256(gguf_path)[:16]}-v{CONVERTER_VERSION}"
    target = cache / "gguf" / key
    if (target / "model.safetensors").exists() and (target / "config.json").exists():
        return target, False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=key + ".", dir=str(target.parent)))
    try:
        gguf_to_hf(gguf_path, tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target, True
