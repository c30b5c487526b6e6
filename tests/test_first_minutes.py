"""The first five minutes of a bitsandbytes user here (issue 31, item 4): import order, the hint where
transformers asks for bitsandbytes before ``register()``, MindSpore's async CPU mode turned off once,
``.cuda()`` / ``.to("cuda")`` without a GPU, and GGUF-converted tokenizers that ``generate`` accepts.

Import order, registration and the MindSpore runtime setting are per process: those cases run in a fresh
interpreter (``_run``)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mindnlp  # noqa: F401  (before torch: torch -> mindtorch)
import mindspore as ms
import numpy as np
import pytest
import torch

import bitsandbytes_ms as bnb
from bitsandbytes_ms import functional as F
from bitsandbytes_ms.nn import Int8Params, Linear4bit, Linear8bitLt, LinearFP, Params4bit

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / "bitsandbytes_ms" / "default_model"


def _run(code: str, tmp_path, env_extra=None, timeout=240) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("BNB_MS_LAUNCH_BLOCKING", None)
    env.update(PYTHONPATH=str(ROOT), **(env_extra or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=timeout)


def _last_line(res) -> str:
    return [ln for ln in res.stderr.splitlines() if ln.strip()][-1]


# ---- 1. import order ----

def test_bitsandbytes_ms_first_then_torch(tmp_path):
    """`import bitsandbytes_ms` works before mindnlp. `import torch` right after it either is mindtorch (where
    bitsandbytes_ms imported mindtorch, whose redirect makes `torch`) or fails with one line naming `import mindnlp`,
    never Python's bare "No module named 'torch'"; after `import mindnlp` torch is mindtorch and the layers work."""
    res = _run("""
        import sys
        import bitsandbytes_ms as bnb
        print("MINDTORCH:" + str("mindtorch" in sys.modules))
        try:
            import torch
            print("FIRST:" + torch.__spec__.name)
        except ModuleNotFoundError as e:
            assert e.name == "torch", e.name
            print("ERR:" + str(e))
        import mindnlp, torch
        print("TORCH:" + torch.__spec__.name + ":" + torch.nn.Module.__module__.split(".")[0])
        print("LAYER:" + type(bnb.nn.Linear4bit(8, 4)).__name__)
    """, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = dict(ln.split(":", 1) for ln in res.stdout.splitlines()
                 if ln.split(":", 1)[0] in ("MINDTORCH", "FIRST", "ERR", "TORCH", "LAYER"))
    if lines["MINDTORCH"] == "True":
        assert lines["FIRST"] == "torch" and "ERR" not in lines
    else:
        assert lines["ERR"] == ("No module named 'torch': with bitsandbytes_ms, torch is MindSpore NLP's mindtorch: "
                                "`import mindnlp` before `import torch`")
    assert lines["TORCH"] == "torch:mindtorch" and lines["LAYER"] == "Linear4bit"


def test_torch_hint_alone(tmp_path):
    """The hint finder itself, in a process where nothing made `torch` (the _hints module loaded from its file, without
    the package): the import statement fails with the one line, importlib.util.find_spec answers None."""
    res = _run(f"""
        import importlib.util, sys
        spec = importlib.util.spec_from_file_location("bnb_hints", {str(ROOT / "bitsandbytes_ms" / "_hints.py")!r})
        hints = importlib.util.module_from_spec(spec); sys.modules["bnb_hints"] = hints; spec.loader.exec_module(hints)
        sys.meta_path.append(hints.TorchHint())
        assert importlib.util.find_spec("torch") is None
        try:
            import torch
        except ModuleNotFoundError as e:
            print("ERR:" + e.name + ":" + str(e))
    """, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == ("ERR:torch:No module named 'torch': with bitsandbytes_ms, torch is MindSpore NLP's "
                                  "mindtorch: `import mindnlp` before `import torch`")


def test_mindnlp_first_then_bitsandbytes_ms(tmp_path):
    res = _run("""
        import mindnlp, torch
        import bitsandbytes_ms as bnb
        from bitsandbytes_ms.nn import Linear8bitLt
        print("OK:" + type(Linear8bitLt(8, 4)).__name__ + ":" + torch.nn.Module.__module__.split(".")[0])
    """, tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "OK:Linear8bitLt:mindtorch" in res.stdout


# ---- 2. transformers' bitsandbytes path before register() ----

def test_transformers_path_without_register_names_register(tmp_path):
    """4-bit: BitsAndBytesConfig asks importlib.metadata for bitsandbytes; 8-bit: the quantizer's
    validate_environment. Both errors name bitsandbytes_ms.register() in their one line; after register() both load."""
    res = _run(f"""
        import mindspore as ms
        ms.set_device("CPU"); ms.runtime.launch_blocking()
        import mindnlp, torch
        import bitsandbytes_ms as bnb
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig
        d = {str(DEFAULT_MODEL)!r}
        try:
            BitsAndBytesConfig(load_in_4bit=True)
        except Exception as e:
            print("E4|" + type(e).__name__ + "|" + str(e).replace(chr(10), "<NL>"))
        try:
            AutoModelForCausalLM.from_pretrained(d, quantization_config=BitsAndBytesConfig(load_in_8bit=True))
        except Exception as e:
            print("E8|" + type(e).__name__ + "|" + str(e).replace(chr(10), "<NL>"))
        bnb.register()
        for kw in (dict(load_in_4bit=True), dict(load_in_8bit=True)):
            m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, quantization_config=BitsAndBytesConfig(**kw))
            print("OK|" + type(m.model.layers[0].self_attn.q_proj).__name__)
    """, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = [ln.split("|") for ln in res.stdout.splitlines() if ln[:3] in ("E4|", "E8|", "OK|")]
    errs = {r[0]: r[1:] for r in out if r[0] != "OK"}
    assert errs["E4"][0] == "PackageNotFoundError" and errs["E8"][0] == "ImportError", errs
    for kind, msg in errs.values():
        assert "call bitsandbytes_ms.register() before BitsAndBytesConfig / from_pretrained" in msg, msg
        assert "<NL>" not in msg
    assert [r[1] for r in out if r[0] == "OK"] == ["Linear4bit", "Linear8bitLt"]


# ---- 3. MindSpore's async CPU mode ----

_LB_SCRIPT = """
    import warnings
    import mindspore as ms
    ms.set_device("CPU")
    import mindnlp, torch
    import numpy as np
    from bitsandbytes_ms import _launch_blocking
    from bitsandbytes_ms import functional as F
    from bitsandbytes_ms.nn import Linear4bit, Linear8bitLt, LinearFP
    print("BEFORE", _launch_blocking.is_on())
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 32)).astype(np.float32)
    x = rng.standard_normal((3, 32)).astype(np.float32)
    layer = {{"Linear4bit": lambda: Linear4bit(32, 16, bias=False, quant_type="nf4"),
              "Linear8bitLt": lambda: Linear8bitLt(32, 16, bias=False, has_fp16_weights=False),
              "LinearFP": lambda: LinearFP(32, 16, bias=False)}}["{layer}"]()
    layer.weight.data = torch.tensor(w)
    layer = layer.cpu()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        y1 = layer(torch.tensor(x)).numpy()
        y2 = layer(torch.tensor(x)).numpy()
    print("AFTER", _launch_blocking.is_on())
    print("WARNINGS", sum("launch_blocking" in str(r.message) for r in rec))
    print("WHERE", *[__import__("os").path.basename(r.filename) for r in rec if "launch_blocking" in str(r.message)])
    if "{layer}" == "Linear4bit":
        ref = x @ F.dequantize_4bit(layer.weight.data, layer.weight.quant_state).numpy().T
    elif "{layer}" == "Linear8bitLt":
        ref = x @ (layer.weight.data.numpy().astype(np.float32) * layer.weight.SCB.numpy()[:, None] / 127).T
    else:
        ref = x @ w.T
    print("ERR", float(np.abs(y1 - ref).max() / np.abs(ref).max()), float(np.abs(y1 - y2).max()))
"""


def _lb_result(res):
    assert res.returncode == 0, res.stderr[-3000:]
    return {ln.split()[0]: ln.split()[1:] for ln in res.stdout.splitlines()
            if ln.split() and ln.split()[0] in ("BEFORE", "AFTER", "WARNINGS", "WHERE", "ERR")}


@pytest.mark.parametrize("layer", ["Linear4bit", "Linear8bitLt", "LinearFP"])
def test_first_forward_turns_launch_blocking_on_once(layer, tmp_path):
    """Without mindspore.runtime.launch_blocking(), the first forward of each layer type turns it on with exactly
    one warning, which points at the user's line (not at mindtorch's module call); results are the layer's
    (against a numpy reference of its weight) and the same twice."""
    out = _lb_result(_run(_LB_SCRIPT.format(layer=layer), tmp_path))
    assert out["BEFORE"] == ["False"] and out["AFTER"] == ["True"] and out["WARNINGS"] == ["1"], out
    assert out["WHERE"] == ["<string>"], out  # python -c: the user's code
    rel, again = map(float, out["ERR"])
    # int8: the activation is quantized per row (<= 1/127 of its absmax per element); nf4/fp: exact up to rounding
    assert rel < (0.03 if layer == "Linear8bitLt" else 1e-5) and again == 0.0, out


def test_launch_blocking_left_alone_when_asked(tmp_path):
    out = _lb_result(_run(_LB_SCRIPT.format(layer="Linear4bit"), tmp_path, {"BNB_MS_LAUNCH_BLOCKING": "0"}))
    assert out["BEFORE"] == ["False"] and out["AFTER"] == ["False"] and out["WARNINGS"] == ["0"], out


# ---- 4. .cuda() / .to("cuda") without a GPU ----

def _layers():
    return {
        "Linear4bit(bias)": lambda: Linear4bit(64, 32, bias=True, quant_type="nf4"),
        "Linear4bit(no bias)": lambda: Linear4bit(64, 32, bias=False, quant_type="nf4"),
        "Linear8bitLt(bias)": lambda: Linear8bitLt(64, 32, bias=True, has_fp16_weights=False),
        "Linear8bitLt(no bias)": lambda: Linear8bitLt(64, 32, bias=False, has_fp16_weights=False),
        "LinearFP": lambda: LinearFP(64, 32),
        "Params4bit": lambda: Params4bit(torch.randn(32, 64), quant_type="nf4"),
        "Int8Params": lambda: Int8Params(torch.randn(32, 64), has_fp16_weights=False, requires_grad=False),
        # these five accepted the call or failed with MindSpore's C++ stack (found by a fresh-user trial, 2026-12-06)
        "Embedding": lambda: bnb.nn.Embedding(10, 8),
        "StableEmbedding": lambda: bnb.nn.StableEmbedding(10, 8),
        "Embedding8bit": lambda: bnb.nn.Embedding8bit(10, 8),
        "LinearWeightOnly": lambda: bnb.nn.LinearWeightOnly(64, 32),
        "OutlierAwareLinear": lambda: bnb.nn.OutlierAwareLinear(64, 32),
    }


_CUDA_CALLS = {
    ".cuda()": lambda m: m.cuda(),
    ".cuda(0)": lambda m: m.cuda(0),
    '.to("cuda")': lambda m: m.to("cuda"),
    '.to("cuda:0")': lambda m: m.to("cuda:0"),
    '.to(device="cuda")': lambda m: m.to(device="cuda"),
    '.to(torch.device("cuda"))': lambda m: m.to(torch.device("cuda")),
}


def _weight_dtype(obj):
    return (obj.weight if hasattr(obj, "weight") else obj).dtype


@pytest.mark.parametrize("call", list(_CUDA_CALLS))
@pytest.mark.parametrize("name", list(_layers()))
def test_cuda_without_gpu_is_one_clear_error(name, call):
    assert not torch.cuda.is_available() and ms.get_context("device_target") == "CPU"
    obj = _layers()[name]()
    before = _weight_dtype(obj)
    with pytest.raises(RuntimeError) as ei:
        _CUDA_CALLS[call](obj)
    msg = str(ei.value)
    cls = name.split("(")[0]
    assert msg.startswith(f"{cls}.") and "no CUDA device is available" in msg and "device target is CPU" in msg, msg
    assert "\n" not in msg and ".cpu()" in msg
    assert _weight_dtype(obj) == before  # refused before anything was quantized or moved


@pytest.mark.parametrize("name", list(_layers()))
def test_cpu_still_quantizes(name):
    """The CPU form of the same call keeps working: .cpu() quantizes the weight (as .cuda() does upstream)."""
    obj = _layers()[name]().cpu()
    expect = {"Linear4bit": ms.uint8, "Params4bit": ms.uint8, "Linear8bitLt": ms.int8, "Int8Params": ms.int8,
              "LinearFP": ms.float32, "Embedding": ms.float32, "StableEmbedding": ms.float32, "Embedding8bit": ms.int8,
              "LinearWeightOnly": ms.int8, "OutlierAwareLinear": ms.float32}[name.split("(")[0]]
    assert _weight_dtype(obj) == expect


def test_embedding8bit_quantizes_on_its_first_forward():
    """Embedding8bit's first forward quantizes its weight, as Linear4bit's and Linear8bitLt's do (it raised "call
    .cuda() or .to(device) first", and .cuda() has no CPU meaning); the rows equal those after .cpu()."""
    w = np.random.RandomState(0).randn(10, 8).astype(np.float32)
    a, b = bnb.nn.Embedding8bit(10, 8), bnb.nn.Embedding8bit(10, 8)
    a.weight.data = torch.tensor(w)
    b.weight.data = torch.tensor(w)
    idx = torch.tensor([[1, 2], [9, 0]])
    got = a(idx)
    assert a.weight.dtype == ms.int8
    want = b.cpu()(idx).asnumpy()
    np.testing.assert_array_equal(got.asnumpy(), want)
    scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
    np.testing.assert_allclose(want, w[[[1, 2], [9, 0]]], atol=float(scale.max()) * 0.51)


def test_int_device_is_accepted_like_mindtorch():
    """An int device (torch: a CUDA index) is accepted as mindtorch's own nn.Linear accepts it, by every layer."""
    plain = torch.nn.Linear(8, 4).to(0)
    assert isinstance(plain, torch.nn.Linear)
    for name, make in _layers().items():
        obj = make().to(0)
        assert obj is not None, name


# ---- 5. GGUF-converted tokenizers ----

import gguf  # noqa: E402  (requirements-lock.txt installs it: a missing one is a broken set-up, not a skip)
HIDDEN, INTER, HEADS = 32, 64, 2


from test_gguf import _bytes_to_unicode  # noqa: E402  (GPT-2's byte table, written once)


def _write_gguf(path, extra_tokens=(), pad=None, unk=None):
    """A 1-layer fp32 Llama GGUF with a byte-level BPE vocabulary: 256 bytes, two merges, ``<|endoftext|>`` (bos and
    eos, as llama.cpp writes SmolLM), then ``extra_tokens`` ((text, gguf token type) pairs). ``pad`` / ``unk``:
    token ids written as padding / unknown token."""
    b2u = _bytes_to_unicode()
    merges = ["Ġ t", "h e"]
    tokens = [b2u[b] for b in range(256)] + ["Ġt", "he", "<|endoftext|>"] + [t for t, _ in extra_tokens]
    types = [1] * 258 + [3] + [ty for _, ty in extra_tokens]
    eos = 258
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    for fn, v in (("add_block_count", 1), ("add_context_length", 64), ("add_embedding_length", HIDDEN),
                  ("add_feed_forward_length", INTER), ("add_head_count", HEADS), ("add_head_count_kv", HEADS),
                  ("add_rope_freq_base", 10000.0), ("add_layer_norm_rms_eps", 1e-5),
                  ("add_rope_dimension_count", HIDDEN // HEADS), ("add_tokenizer_model", "gpt2"),
                  ("add_token_list", tokens), ("add_token_types", types), ("add_token_merges", merges),
                  ("add_bos_token_id", eos), ("add_eos_token_id", eos)):
        getattr(w, fn)(v)
    if pad is not None:
        w.add_pad_token_id(pad)
    if unk is not None:
        w.add_unk_token_id(unk)

    def t(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    w.add_tensor("token_embd.weight", t(len(tokens), HIDDEN))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("output.weight", t(len(tokens), HIDDEN))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(HIDDEN, np.float32))
    for name, shape in (("attn_q", (HIDDEN, HIDDEN)), ("attn_k", (HIDDEN, HIDDEN)), ("attn_v", (HIDDEN, HIDDEN)),
                        ("attn_output", (HIDDEN, HIDDEN)), ("ffn_gate", (INTER, HIDDEN)), ("ffn_up", (INTER, HIDDEN)),
                        ("ffn_down", (HIDDEN, INTER))):
        w.add_tensor(f"blk.0.{name}.weight", t(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tokens, eos


@pytest.fixture(scope="module")
def padded_gguf(tmp_path_factory):
    """llama.cpp's usual SmolLM-style file: padding_token_id == eos, and a ``<pad>`` control token in the vocabulary."""
    from bitsandbytes_ms.integrations.gguf import gguf_to_hf

    d = tmp_path_factory.mktemp("gguf_pad")
    tokens, eos = _write_gguf(d / "m.gguf", extra_tokens=[("<pad>", 3)], pad=258)
    return gguf_to_hf(d / "m.gguf", d / "hf"), tokens, eos


def test_gguf_tokenizer_inputs_and_generate(padded_gguf):
    """tok(text, return_tensors="pt") gives exactly input_ids and attention_mask, and model.generate(**inputs) runs:
    its greedy tokens are the argmax of the model's own forward, step by step."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, tokens, eos = padded_gguf
    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    inputs = tok("the heat", return_tensors="pt")
    assert sorted(inputs.keys()) == ["attention_mask", "input_ids"]
    gen = model.generate(**inputs, max_new_tokens=4, do_sample=False, eos_token_id=None)
    ids = inputs["input_ids"].numpy().tolist()[0]
    n0 = len(ids)
    for _ in range(4):
        logits = model(torch.tensor([ids])).logits.numpy()[0, -1]
        ids.append(int(np.argmax(logits)))
    assert gen.numpy().tolist()[0] == ids and len(ids) == n0 + 4


def test_gguf_pad_is_not_eos_when_the_vocabulary_has_one(padded_gguf):
    out, tokens, eos = padded_gguf
    from transformers import AutoTokenizer

    pad_id = tokens.index("<pad>")
    cfg = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert (cfg["pad_token_id"], gen["pad_token_id"], cfg["eos_token_id"]) == (pad_id, pad_id, eos)
    assert tok_cfg["pad_token"] == "<pad>" and tok_cfg["model_input_names"] == ["input_ids", "attention_mask"]
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.pad_token_id == pad_id != tok.eos_token_id == eos
    batch = tok(["the", "the heat"], padding=True, return_tensors="pt")
    assert batch["input_ids"].numpy()[0].tolist().count(pad_id) >= 1 and batch["attention_mask"].numpy()[0, -1] == 0


@pytest.mark.parametrize("case", ["unk", "none"])
def test_gguf_pad_fallbacks(case, tmp_path):
    """No pad-like token: the unknown token when the file names one (as Llama-2's <unk>), else no pad token at
    all (tokenizer and config), generation_config's pad_token_id being eos (what generate picks, without its warning)."""
    from bitsandbytes_ms.integrations.gguf import gguf_to_hf

    extra = [("<unk>", 2)] if case == "unk" else []
    tokens, eos = _write_gguf(tmp_path / "m.gguf", extra_tokens=extra, pad=258,
                              unk=259 if case == "unk" else None)
    out = gguf_to_hf(tmp_path / "m.gguf", tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    gen = json.loads((out / "generation_config.json").read_text())
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    if case == "unk":
        assert tokens[259] == "<unk>" and cfg["pad_token_id"] == gen["pad_token_id"] == 259
        assert tok_cfg["pad_token"] == "<unk>"
    else:
        assert "pad_token_id" not in cfg and "pad_token" not in tok_cfg and gen["pad_token_id"] == eos
    assert tok_cfg["model_input_names"] == ["input_ids", "attention_mask"]


# ---- 6. kernel-path switches with a value the library does not know ----

def test_unknown_switch_values_are_named():
    from bitsandbytes_ms import cextension as C

    assert C.check_env_switches({"BNB_MS_SIMD": "avx2", "BNB_MS_INT8_GEMM": "amx", "BNB_MS_4BIT_AMX": "0"}) == []
    bad = C.check_env_switches({"BNB_MS_SIMD": "AVX2", "BNB_MS_INT8_GEMM": "bogus", "BNB_MS_4BIT_AMX": "off",
                                "BNB_MS_OTHER": "x"})
    assert len(bad) == 3 and "BNB_MS_SIMD='AVX2' is not one of scalar|avx2|avx512|avx512-novbmi" in bad[0]
    assert "BNB_MS_INT8_GEMM='bogus'" in bad[1] and "BNB_MS_4BIT_AMX='off' is not one of 0|1" in bad[2]


def test_unknown_switch_value_warns_once_at_import(tmp_path):
    res = _run("import warnings\nwarnings.simplefilter('always')\nimport bitsandbytes_ms\n", tmp_path,
               {"BNB_MS_INT8_GEMM": "fastest"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.count("BNB_MS_INT8_GEMM='fastest' is not one of") == 1, res.stderr[-2000:]
