"""`quant_8bit`/`quant_4bit` and the CLI on the other model families the issue names: GPT-2 (whose
projections are transformers' Conv1D, weights stored [in, out]) and Qwen2, built small from config
with the embedded tokenizer (no download)."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mindnlp  # noqa: F401
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, GPT2Config, Qwen2Config  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms.integrations import find_linear_layers, quant_4bit, quant_8bit  # noqa: E402

transformers.logging.set_verbosity_error()
EMBEDDED = Path(bnb.__file__).resolve().parent / "default_model"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
IDS = np.array([[1, 57, 300, 1200, 44, 9, 512, 77]], dtype=np.int64)

CONFIGS = {
    "gpt2": lambda: GPT2Config(vocab_size=8192, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                               bos_token_id=1, eos_token_id=2),
    "qwen2": lambda: Qwen2Config(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
}
EXPECTED_LINEAR = {"gpt2": 2 * 4, "qwen2": 2 * 7}  # c_attn, c_proj (attn), c_fc, c_proj (mlp) / q,k,v,o,gate,up,down


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def checkpoint(request, tmp_path_factory):
    family = request.param
    d = tmp_path_factory.mktemp(family)
    model = AutoModelForCausalLM.from_config(CONFIGS[family]())
    # small, fixed weights (mindtorch's random init ignores seeds)
    rng = np.random.RandomState(0)
    for _, p in model.named_parameters():
        p.data.copy_(torch.tensor((rng.randn(*p.shape) * 0.05).astype(np.float32)))
    model.save_pretrained(str(d), safe_serialization=True)
    for f in TOKENIZER_FILES:
        shutil.copy(EMBEDDED / f, d / f)
    return family, d


def _load(d):
    m = AutoModelForCausalLM.from_pretrained(str(d))
    m.eval()
    return m


def _logits(m):
    with torch.no_grad():
        return m(torch.tensor(IDS)).logits.float().asnumpy()


@pytest.mark.parametrize("mode", ["int8", "nf4"])
def test_quantize_family(checkpoint, mode):
    family, d = checkpoint
    model = _load(d)
    ref = _logits(model)
    names, keep = find_linear_layers(model)
    assert len(names) == EXPECTED_LINEAR[family]
    if family == "gpt2":
        conv = model.get_submodule(names[0])
        in_f, out_f = conv.weight.shape  # Conv1D stores [in, out]
    converted = []
    if mode == "int8":
        quant_8bit(model, converted=converted, progress=False)
    else:
        quant_4bit(model, quant_type="nf4", compute_dtype="fp32", converted=converted, progress=False)
    assert converted == names
    if family == "gpt2":
        layer = model.get_submodule(names[0])
        assert (layer.in_features, layer.out_features) == (in_f, out_f)
    got = _logits(model)
    # random small weights: quantization error stays a small fraction of the logit scale
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < (0.05 if mode == "int8" else 0.15), err


def test_cli_on_family_checkpoint(checkpoint):
    family, d = checkpoint
    r = subprocess.run([sys.executable, "-m", "bitsandbytes_ms", "quantize", "--model", str(d), "--mode", "nf4",
                        "--max-new-tokens", "3", "--eval-windows", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"layers converted  {EXPECTED_LINEAR[family]}" in r.stdout
