"""Model-level integration on the embedded model: post-training quantization (quant_8bit/quant_4bit),
memory and quality bounds, save -> load, transformers' from_pretrained(quantization_config=...) path
through register(), and the registered patches."""

import copy
import importlib.metadata
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms

import mindnlp  # noqa: F401  (torch -> mindtorch; must precede `import torch`)
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms.integrations import dequantize, evaluate as ev, quant_4bit, quant_8bit  # noqa: E402
from bitsandbytes_ms.integrations.patches import registry  # noqa: E402

transformers.logging.set_verbosity_error()
MODEL_DIR = Path(bnb.__file__).resolve().parent / "default_model"
N_LINEAR = 4 * 7  # 4 layers x (q, k, v, o, gate, up, down); lm_head stays in full precision


@pytest.fixture(scope="module")
def registered():
    bnb.register()
    yield
    # keep registered for the rest of the session (other modules may rely on it); patches are idempotent


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(MODEL_DIR))


@pytest.fixture(scope="module")
def fp32_model():
    m = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR))
    m.eval()
    return m


@pytest.fixture(scope="module")
def windows(tokenizer):
    return ev.eval_windows(tokenizer, (MODEL_DIR / "heldout.txt").read_text(), 128, 4)


@pytest.fixture(scope="module")
def reference(fp32_model, windows):
    return ev.run_windows(fp32_model, windows)


def _fresh():
    m = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR))
    m.eval()
    return m


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().asnumpy()


IDS = np.array([[1, 57, 300, 1200, 44, 9, 512, 77]], dtype=np.int64)

# Measured on the embedded model (1016 held-out tokens): perplexity change int8 +0.01%, nf4 -0.00%,
# fp4 +0.13%; top-1 agreement 99.9%, 97.8%, 97.2%. Bounds set with margin: (max |relative perplexity
# change|, min top-1 agreement).
QUALITY = {"int8": (0.005, 0.99), "nf4": (0.02, 0.95), "fp4": (0.03, 0.93)}


@pytest.mark.parametrize("mode", ["int8", "nf4", "fp4"])
def test_post_training_quantization_memory_and_quality(mode, windows, reference, tokenizer):
    model = _fresh()
    converted, skipped = [], []
    if mode == "int8":
        quant_8bit(model, threshold=6.0, converted=converted, skipped=skipped, progress=False)
    else:
        quant_4bit(model, quant_type=mode, compress_statistics=True, converted=converted, skipped=skipped, progress=False)
    assert len(converted) == N_LINEAR and skipped == ["lm_head"]
    kinds = {type(model.get_submodule(n)).__name__ for n in converted}
    assert kinds == {"Linear8bitLt" if mode == "int8" else "Linear4bit"}

    # weight memory of the converted layers against their fp16 size
    linear_params = sum(int(np.prod(model.get_submodule(n).weight.shape)) if mode == "int8" else
                        model.get_submodule(n).in_features * model.get_submodule(n).out_features for n in converted)
    q_bytes = sum(ev.weight_memory(model.get_submodule(n)) - (0 if model.get_submodule(n).bias is None else
                  model.get_submodule(n).bias.nbytes) for n in converted)
    ratio = q_bytes / (2 * linear_params)
    assert ratio <= (0.55 if mode == "int8" else 0.32), ratio

    new = ev.run_windows(model, windows)
    rel_ppl = new.perplexity / reference.perplexity - 1
    cmp = ev.compare_logits(reference, new)
    max_rel_ppl, min_top1 = QUALITY[mode]
    assert abs(rel_ppl) < max_rel_ppl, rel_ppl
    assert cmp["top1_agreement"] > min_top1, cmp
    text, n_new, _ = ev.generate(model, tokenizer, "The list type", 6)
    assert n_new == 6 and isinstance(text, str)


@pytest.mark.parametrize("mode", ["int8", "nf4"])
def test_save_pretrained_then_load_gives_identical_logits(mode, tmp_path, registered):
    model = _fresh()
    if mode == "int8":
        quant_8bit(model, progress=False)
        cfg = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0)
    else:
        quant_4bit(model, quant_type="nf4", compute_dtype="fp32", progress=False)
        cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.float32)
    model.config.quantization_config = cfg
    before = _logits(model, IDS)
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    from safetensors.numpy import load_file

    keys = set(load_file(str(tmp_path / "model.safetensors")))
    w = "model.layers.0.mlp.down_proj."
    if mode == "int8":
        assert {w + "weight", w + "SCB", w + "weight_format"} <= keys
    else:
        assert {w + "weight", w + "weight.absmax", w + "weight.quant_map", w + "weight.nested_absmax",
                w + "weight.nested_quant_map", w + "weight.quant_state.bitsandbytes__nf4"} <= keys
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
    loaded.eval()
    np.testing.assert_array_equal(_logits(loaded, IDS), before)


@pytest.mark.parametrize("mode", ["int8", "nf4"])
def test_from_pretrained_with_quantization_config(mode, registered):
    """transformers' own bitsandbytes quantizer code, unmodified, on top of bitsandbytes_ms; same
    result as quantizing the fp32 model ourselves."""
    if mode == "int8":
        cfg = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=6.0)
    else:
        cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(MODEL_DIR), quantization_config=cfg, dtype=torch.float32)
    model.eval()
    cls = bnb.nn.Linear8bitLt if mode == "int8" else bnb.nn.Linear4bit
    assert isinstance(model.model.layers[0].mlp.down_proj, cls)
    assert not isinstance(model.lm_head, cls)
    ours = _fresh()
    if mode == "int8":
        quant_8bit(ours, threshold=6.0, progress=False)
    else:
        quant_4bit(ours, quant_type="nf4", compute_dtype="fp32", progress=False)
    np.testing.assert_allclose(_logits(model, IDS), _logits(ours, IDS), rtol=1e-5, atol=1e-5)


def test_dequantize_restores_linear_layers(reference, windows):
    model = _fresh()
    quant_4bit(model, quant_type="nf4", progress=False)
    q = ev.run_windows(model, windows)
    dequantize(model, progress=False)
    assert type(model.model.layers[0].mlp.down_proj) is torch.nn.Linear
    d = ev.run_windows(model, windows)
    np.testing.assert_allclose(d.perplexity, q.perplexity, rtol=1e-4)


# ---- registration and patches --------------------------------------------------------------------
def test_register_aliases_bitsandbytes(registered):
    import bitsandbytes
    import bitsandbytes.functional

    assert bitsandbytes is bnb and bitsandbytes.functional is bnb.functional
    assert importlib.metadata.version("bitsandbytes") == bnb.__upstream_version__
    from transformers.utils import is_bitsandbytes_available
    from transformers.utils.import_utils import is_bitsandbytes_multi_backend_available

    assert is_bitsandbytes_available() and is_bitsandbytes_multi_backend_available()


def test_every_patch_is_documented_and_applied(registered):
    names = [p.name for p in registry.patches()]
    assert "mindtorch-same-device-move" in names and "transformers-bitsandbytes-available" in names
    for p in registry.patches():
        assert len(p.why) > 40
        assert registry.is_applied(p.name)


def test_patch_same_device_move_fixes_gradients_through_subtraction(registered):
    x = torch.tensor(np.random.RandomState(0).randn(5, 4).astype(np.float32))
    y = torch.tensor(np.random.RandomState(1).randn(5, 3).astype(np.float32))
    p = torch.nn.Parameter(torch.tensor(np.random.RandomState(2).randn(3, 4).astype(np.float32)))
    X, Y, P = x.asnumpy(), y.asnumpy(), p.asnumpy()
    expected = 2 * ((X @ P.T - Y).T @ X) / Y.size
    fn = lambda: ((x @ p.T - y) ** 2).mean()  # noqa: E731
    _, grads = ms.value_and_grad(fn, None, (p,))()
    np.testing.assert_allclose(grads[0].asnumpy(), expected, rtol=1e-5, atol=1e-6)
    registry.remove(["mindtorch-same-device-move"])
    try:
        _, grads = ms.value_and_grad(fn, None, (p,))()
        assert np.all(grads[0].asnumpy() == 0)  # the mindtorch bug the patch exists for
    finally:
        registry.apply(["mindtorch-same-device-move"])


def test_patch_element_size_of_8bit_tensors(registered):
    t = torch.tensor(np.arange(6, dtype=np.int8))
    assert t.element_size() == 1 and t.nbytes == 6
    assert torch.tensor(np.arange(6, dtype=np.uint8)).nbytes == 6
    assert torch.tensor(np.arange(6, dtype=np.float32)).nbytes == 24


def test_patch_transformers_availability_value(registered):
    import transformers.utils.import_utils as iu

    assert iu._bitsandbytes_available is True


def test_register_before_mindnlp_keeps_transformers_models_working():
    """`bnb.register()` called before `import mindnlp` (code ported from `import bitsandbytes` puts it first):
    the patches must not import transformers ahead of mindnlp, whose own patches of transformers (attention masks)
    would then be missing from the modeling modules: a Llama forward with an attention mask failed in MindSpore's
    jit with `No module named 'mindtorch._'`. Run in a fresh process, as a user's script; the logits must equal
    those of the usual order (mindnlp first)."""
    import subprocess

    code = (
        "import sys, numpy as np, mindspore as ms; ms.set_device('CPU')\n"
        "import bitsandbytes_ms as bnb\n"
        "if sys.argv[1] == 'register-first': bnb.register()\n"
        "import mindnlp, torch\n"
        "if sys.argv[1] != 'register-first': bnb.register()\n"
        "from transformers import AutoModelForCausalLM, LlamaConfig\n"
        "cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,"
        " num_attention_heads=2, num_key_value_heads=1)\n"
        "m = AutoModelForCausalLM.from_config(cfg); m.eval()\n"
        "rng = np.random.RandomState(0)\n"
        "for _, p in m.named_parameters(): p.data.copy_(torch.tensor((rng.randn(*p.shape) * 0.1).astype(np.float32)))\n"
        "with torch.no_grad():\n"
        "    out = m(torch.tensor([[1, 5, 7, 9]]), attention_mask=torch.tensor([[0, 1, 1, 1]])).logits.asnumpy()\n"
        "np.save(sys.argv[2], out)\n"
    )
    outs = {}
    for order in ("register-first", "mindnlp-first"):
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"bnb_ms_order_{os.getpid()}_{order}.npy"
        r = subprocess.run([sys.executable, "-c", code, order, str(path)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (order, r.stderr[-3000:])
        outs[order] = np.load(path)
        path.unlink()
    assert np.isfinite(outs["mindnlp-first"]).all()
    np.testing.assert_array_equal(outs["register-first"], outs["mindnlp-first"])
