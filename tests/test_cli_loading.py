"""`bnb-ms quantize` quantizes while loading (issue 31 item 2): a sharded bf16 checkpoint is read shard by shard,
each linear weight quantized as it arrives, never a full-precision set of layers; the bytes equal
quant_4bit/quant_8bit's on the same weights; the fp32 reference runs only where it fits."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

LAYERS, HIDDEN, INTER, VOCAB = 2, 64, 160, 8192  # the embedded model's tokenizer: 8192 tokens
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj")


def write_sharded_bf16_llama(d: Path, seed: int = 0) -> None:
    """A random N(0, 0.02) Llama in bf16 safetensors, one shard per decoder layer plus one for the embeddings,
    with an index and the embedded model's tokenizer (written one tensor at a time, as a big checkpoint is)."""
    import ml_dtypes
    from safetensors.numpy import save_file

    import bitsandbytes_ms

    src = Path(bitsandbytes_ms.__file__).resolve().parent / "default_model"
    d.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / f, d / f)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS, num_attention_heads=4,
               num_key_value_heads=4, head_dim=16, vocab_size=VOCAB, dtype="bfloat16")
    (d / "config.json").write_text(json.dumps(cfg))
    rng = np.random.RandomState(seed)

    def rand(*shape):
        return (rng.randn(*shape) * 0.02).astype(ml_dtypes.bfloat16)

    shapes = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, HIDDEN),
              "self_attn.v_proj": (HIDDEN, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
              "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN), "mlp.down_proj": (HIDDEN, INTER)}
    shards = [{"model.embed_tokens.weight": rand(VOCAB, HIDDEN), "lm_head.weight": rand(VOCAB, HIDDEN),
               "model.norm.weight": np.ones(HIDDEN, ml_dtypes.bfloat16)}]
    for i in range(LAYERS):
        t = {f"model.layers.{i}.{n}.weight": rand(*s) for n, s in shapes.items()}
        t[f"model.layers.{i}.input_layernorm.weight"] = np.ones(HIDDEN, ml_dtypes.bfloat16)
        t[f"model.layers.{i}.post_attention_layernorm.weight"] = np.ones(HIDDEN, ml_dtypes.bfloat16)
        shards.append(t)
    weight_map = {}
    for k, tensors in enumerate(shards):
        name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(d / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in tensors})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("sharded") / "bf16"
    write_sharded_bf16_llama(d)
    return d


def _watch_the_loader(monkeypatch):
    """Instruments the load: the fp32 path (from_pretrained without a quantization config) fails, and each
    quantized weight's arrival records how many full-precision bytes of to-be-quantized layers the model then
    holds besides the arriving tensor (none, if each layer is quantized as it arrives)."""
    from transformers import AutoModelForCausalLM
    from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
    from transformers.quantizers.quantizer_bnb_8bit import Bnb8BitHfQuantizer

    from bitsandbytes_ms.nn import Linear4bit, Linear8bitLt

    real_fp = AutoModelForCausalLM.from_pretrained.__func__
    seen = {"arrivals": [], "held_fp_bytes": []}

    def from_pretrained(cls, *a, **kw):
        assert kw.get("quantization_config") is not None, "the full-precision model was loaded"
        return real_fp(cls, *a, **kw)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(from_pretrained))
    for quantizer in (Bnb4BitHfQuantizer, Bnb8BitHfQuantizer):
        real = quantizer.create_quantized_param

        def wrapped(self, model, param_value, param_name, *a, _real=real, **kw):
            held = sum(int(np.prod(p.shape)) * p.element_size() for m in model.modules()
                       if isinstance(m, (Linear4bit, Linear8bitLt)) for p in m.parameters(recurse=False)
                       if p.dtype.is_floating_point and p.device.type != "meta")
            seen["held_fp_bytes"].append(held)
            seen["arrivals"].append((param_name, str(param_value.dtype)))
            return _real(self, model, param_value, param_name, *a, **kw)

        monkeypatch.setattr(quantizer, "create_quantized_param", wrapped)
    return seen


def _reference_quantized(ckpt, mode):
    """Today's way on the same weights: the fp32 model, quantized in place."""
    import mindnlp  # noqa: F401
    from transformers import AutoModelForCausalLM

    from bitsandbytes_ms.integrations import quant_4bit, quant_8bit

    model = AutoModelForCausalLM.from_pretrained(str(ckpt))
    if mode == "int8":
        quant_8bit(model, threshold=6.0, progress=False)
    else:
        quant_4bit(model, quant_type=mode, compute_dtype="fp32", compress_statistics=False, progress=False)
    return {k: v for k, v in model.state_dict().items()}


@pytest.mark.parametrize("mode", ["nf4", "int8"])
def test_quantize_while_loading_never_holds_full_precision_layers(ckpt, mode, tmp_path, monkeypatch, capsys):
    from safetensors.numpy import load_file

    from bitsandbytes_ms import __main__ as cli
    from bitsandbytes_ms.integrations import loading

    seen = _watch_the_loader(monkeypatch)
    monkeypatch.setattr(loading, "available_memory", lambda: 10**6)  # the fp32 model "does not fit"
    rc = cli.main(["quantize", "--model", str(ckpt), "--mode", mode, "--max-new-tokens", "2", "--eval-windows", "1",
                   "--save", str(tmp_path / "q")])
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    # every linear layer arrived once, in the checkpoint's dtype, and none was held in full precision meanwhile
    assert sorted(n for n, _ in seen["arrivals"]) == sorted(f"model.layers.{i}.{n}.weight" for i in range(LAYERS)
                                                            for n in LINEARS)
    assert {dt for _, dt in seen["arrivals"]} == {"mindspore.bfloat16"}
    assert max(seen["held_fp_bytes"]) == 0, seen["held_fp_bytes"]
    fp32 = 4 * (2 * VOCAB * HIDDEN + HIDDEN + LAYERS * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN))
    need = int(1.2 * (fp32 + LAYERS * 4 * 8))  # + the rotary inv_freq buffers (head_dim / 2 fp32 per layer)
    assert f"reference         skipped: needs {need / 1e6:.1f} MB, 1.0 MB free (--reference always forces it)" in out
    assert "3 safetensors shards, bfloat16" in out
    assert "perplexity        - -> " in out and "top-1 agreement   - (no fp32 reference)" in out
    assert f"layers converted  {7 * LAYERS}" in out and "layers skipped    1: lm_head" in out

    saved = load_file(str(tmp_path / "q" / "model.safetensors"))
    capsys.readouterr()
    monkeypatch.undo()
    ref = _reference_quantized(ckpt, mode)
    qkeys = [k for k in ref if k.startswith("model.layers.")]
    assert len(qkeys) > 7 * LAYERS and set(qkeys) <= set(saved)
    for k in qkeys:
        a = ref[k].asnumpy()
        if k.endswith("quant_state.bitsandbytes__nf4"):  # packed JSON: only the original dtype differs
            ja, jb = json.loads(a.tobytes()), json.loads(saved[k].tobytes())
            assert ja.pop("dtype") == "float32" and jb.pop("dtype") == "bfloat16" and ja == jb, k
        elif k.endswith("layernorm.weight"):
            assert saved[k].dtype.name == "bfloat16" and np.array_equal(a, saved[k].astype(np.float32)), k
        else:
            assert a.dtype == saved[k].dtype and np.array_equal(a, saved[k]), k
    _loads_back_the_same(tmp_path / "q", saved)


def _loads_back_the_same(d, saved):
    """README's way back: from_pretrained on the saved directory gives a quantized model holding every saved
    tensor, and it generates."""
    import mindnlp  # noqa: F401
    import torch
    from transformers import AutoModelForCausalLM

    from bitsandbytes_ms.nn import Linear4bit, Linear8bitLt

    model = AutoModelForCausalLM.from_pretrained(str(d))
    assert isinstance(model.model.layers[LAYERS - 1].mlp.down_proj, (Linear4bit, Linear8bitLt))
    back = model.state_dict()
    assert set(back) == set(saved)
    for k, v in saved.items():
        b = back[k].asnumpy()
        if k.endswith("_proj.weight") or ".absmax" in k or k.endswith("SCB") or "quant_state" in k:
            assert b.dtype == v.dtype and np.array_equal(b, v), k  # the quantized bytes exactly
    out = model.generate(torch.tensor([[1, 5, 9]]), max_new_tokens=2, do_sample=False)
    assert tuple(out.shape) == (1, 5)


def test_reference_runs_where_it_fits_or_when_forced(ckpt, monkeypatch, capsys):
    from bitsandbytes_ms import __main__ as cli
    from bitsandbytes_ms.integrations import loading

    args = ["quantize", "--model", str(ckpt), "--mode", "nf4", "--max-new-tokens", "2", "--eval-windows", "1"]
    monkeypatch.setattr(loading, "available_memory", lambda: 10**6)
    assert cli.main(args + ["--reference", "always"]) == 0
    out = capsys.readouterr().out
    assert "reference         fp32 model evaluated (needs " in out and "1.0 MB free)" in out
    assert "top-1 agreement   " in out and "(no fp32 reference)" not in out
    monkeypatch.setattr(loading, "available_memory", lambda: 10**12)
    assert cli.main(args + ["--reference", "never"]) == 0
    assert "reference         skipped (--reference never)" in capsys.readouterr().out
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "reference         fp32 model evaluated" in out
    ppl = next(ln for ln in out.splitlines() if ln.startswith("perplexity"))
    assert "%) on 127 held-out tokens" in ppl, ppl


def test_checkpoint_dtype_and_reference_fits(ckpt, tmp_path):
    from bitsandbytes_ms.integrations import loading

    assert loading.checkpoint_dtype(ckpt) == "bfloat16"
    assert len(loading.safetensors_files(ckpt)) == LAYERS + 1
    (tmp_path / "config.json").write_text('{"dtype": "float16"}')
    assert loading.checkpoint_dtype(tmp_path, type("C", (), {"dtype": "float16"})()) == "float16"
    assert loading.reference_fits(1000, available=1200) == (True, 1200, 1200)
    assert loading.reference_fits(1000, available=1199) == (False, 1200, 1199)
    with pytest.raises(ValueError, match="mode"):
        loading.bnb_config("int4")


def test_save_quantized_streams_shards_with_an_index(ckpt, tmp_path):
    """save_quantized above its shard size: several shards and an index, the same tensors as one file."""
    import mindnlp  # noqa: F401
    from safetensors.numpy import load_file

    from bitsandbytes_ms.integrations import loading

    model, _ = loading.load_quantized(ckpt, loading.bnb_config("nf4", double_quant=True), "bfloat16")
    loading.save_quantized(model, tmp_path / "one")
    loading.save_quantized(model, tmp_path / "many", max_shard_bytes=600_000)
    one = load_file(str(tmp_path / "one" / "model.safetensors"))
    index = json.loads((tmp_path / "many" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) >= 3 and sorted(index["weight_map"]) == sorted(one)
    many = {}
    for f in files:
        shard = load_file(str(tmp_path / "many" / f))
        assert sum(v.nbytes for v in shard.values()) <= 600_000 or len(shard) == 1  # a bigger tensor: alone
        many.update(shard)
    assert all(many[k].dtype == v.dtype and np.array_equal(many[k], v) for k, v in one.items())
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in one.values())
    for name in ("one", "many"):
        _loads_back_the_same(tmp_path / name, one)
