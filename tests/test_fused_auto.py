"""The fused decoder by default (issue 31 item 1): a model quantized by quant_4bit / quant_8bit or loaded through
transformers' ``from_pretrained(quantization_config=BitsAndBytesConfig(...))`` runs the fused decoder on its first
inference forward with no call by the user, for nf4/fp4 (double quant or not), int8 (threshold 0 and 6), compute
dtype fp32 / fp16 / bf16 and fp32 / fp16 / bf16 checkpoints; ``fuse(model, False)`` / ``unfuse`` /
``BNB_MS_FUSED=0`` keep it off; an unsupported config keeps the unfused path with one warning naming the reason;
training forwards stay unfused without a warning.

Bounds: the fused path computes in fp32 whatever the compute dtype (wider than fp16 / bf16) and, by default on an
AVX512-BF16 CPU, its prefill in bf16 (tests/test_fused_bf16_prefill.py), so it is compared with the unfused model
within AUTO_BOUND x max|logit| and the same greedy tokens (measured on these models: 1.6e-3 .. 4.1e-3 for every
compute dtype on fp32 and fp16 models; the exact-prefill fp32-compute case is test_fused_decoder.py's 1e-5).
"""

import warnings

import numpy as np
import pytest

import mindspore as ms

import test_fused_decoder as T  # noqa: E402  (its small models, prompts and comparisons)
import torch  # noqa: E402  (mindtorch: test_fused_decoder imported mindnlp first)
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402
from bitsandbytes_ms import functional as F  # noqa: E402
from bitsandbytes_ms.integrations import fuse, is_fused, quant_4bit, quant_8bit, unfuse  # noqa: E402
from bitsandbytes_ms.integrations import fused as FU  # noqa: E402

#: fused (fp32 compute, bf16 prefill where the CPU has AVX512-BF16) vs the unfused model in any compute dtype
AUTO_BOUND = 1e-2
_DT = {"fp32": ms.float32, "fp16": ms.float16, "bf16": ms.bfloat16}


@pytest.fixture(autouse=True)
def _default_prefill():
    F.set_bf16_dot(None)  # the default users get (test_fused_decoder's autouse fixture pins "exact")
    yield
    F.set_bf16_dot(None)


def _quantized(family, mode, cd="fp32", model_dtype="fp32", **kw):
    m = T._model(T._cfg(family), quant=False)
    if model_dtype != "fp32":
        m = m.to(_DT[model_dtype])
    if mode == "int8":
        quant_8bit(m, progress=False, **kw)
    else:
        quant_4bit(m, quant_type=mode, compute_dtype=cd, progress=False, **kw)
    return m


def _auto_vs_unfused(make):
    """(fused outputs, unfused outputs) of two models made alike: the first left alone, the second kept off."""
    ref_model = make()
    unfuse(ref_model)
    ref = T._outputs(ref_model)
    assert not is_fused(ref_model)
    m = make()
    assert not is_fused(m)  # nothing happens before the first forward
    n0 = FU.stats["fused_forwards"]
    out = T._outputs(m)
    assert is_fused(m)
    assert FU.stats["fused_forwards"] - n0 == 1 + 8  # the prompt forward, then prefill + 7 decode steps
    return out, ref


@pytest.mark.parametrize("family, mode, cd, model_dtype, kw", [
    ("llama", "nf4", "bf16", "fp32", dict(compress_statistics=True)),
    ("qwen2", "nf4", "bf16", "fp16", dict(compress_statistics=True)),  # transformers' default dtype for bnb
    ("mistral", "fp4", "fp16", "fp32", dict(compress_statistics=False)),
    ("qwen3", "nf4", "fp32", "fp16", dict(compress_statistics=False)),
    ("llama", "int8", None, "fp32", dict(threshold=0.0)),
    ("qwen2", "int8", None, "fp16", dict(threshold=6.0)),
])
def test_quantized_model_fuses_on_first_forward(family, mode, cd, model_dtype, kw):
    out, ref = _auto_vs_unfused(lambda: _quantized(family, mode, cd, model_dtype, **kw))
    if mode == "int8":
        _check_int8(out, ref)
    else:
        T._check_close(out, ref, AUTO_BOUND, "auto-fused vs unfused")


def _check_int8(out, ref):
    """Fused int8 need not give the unfused greedy tokens (one flipped code moves the rest; test_fused_decoder's
    INT8_LOGIT_BOUND): the logits are compared up to the first step whose token differs (same inputs so far)."""
    P = T.IDS.shape[1]
    diff = np.nonzero((out[1][:, P:] != ref[1][:, P:]).any(0))[0]
    k = int(diff[0]) + 1 if diff.size else out[2].shape[1]
    ok = T.MASK.astype(bool)
    err = max(np.abs(out[0] - ref[0])[ok].max(), np.abs(out[2][:, :k] - ref[2][:, :k]).max()) / np.abs(ref[2]).max()
    assert k >= 4 and err <= T.INT8_LOGIT_BOUND, (k, err)


def test_bf16_model_with_bf16_compute_fuses():
    """A bf16 checkpoint: the unfused model cannot run on MindSpore's CPU (no bf16 gather); fused, it gives the fp32
    computation of its bf16 values within AUTO_BOUND (bf16 compute dtype included)."""
    m = _quantized("llama", "nf4", "bf16", "bf16")
    fused = T._outputs(m)
    assert is_fused(m)
    truth = T._model(T._cfg("llama"), quant=False)
    for p in truth.parameters():  # the bf16 values in fp32
        p.data.copy_(torch.tensor(p.asnumpy().astype(T.HC.np_dtype(ms.bfloat16)).astype(np.float32)))
    quant_4bit(truth, compute_dtype="fp32", progress=False)
    unfuse(truth)
    T._check_close(fused, T._outputs(truth), AUTO_BOUND, "fused bf16 model vs fp32 compute of its values")


def test_switches_keep_the_unfused_path():
    m = _quantized("llama", "nf4")
    assert fuse(m, False) is False
    n0 = FU.stats["fused_forwards"]
    T._generate(m, n=2)
    assert not is_fused(m) and FU.stats["fused_forwards"] == n0
    assert fuse(m) and is_fused(m)  # fuse() again turns it back on
    unfuse(m)
    m2 = _quantized("llama", "int8")
    old = FU.set_enabled(False)  # BNB_MS_FUSED=0
    try:
        T._generate(m2, n=2)
        assert not is_fused(m2) and FU.stats["fused_forwards"] == n0
    finally:
        FU.set_enabled(old)


def test_unsupported_config_warns_once_and_stays_unfused():
    m = T._model(T._cfg("llama", rope_scaling={"rope_type": "linear", "factor": 2.0}), quant=False)
    quant_4bit(m, compute_dtype="bf16", progress=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        T._generate(m, n=3)
        T._generate(m, n=3)
    msgs = [str(x.message) for x in w if "unfused path" in str(x.message)]
    assert len(msgs) == 1 and "rope_scaling type 'linear'" in msgs[0], msgs
    assert not is_fused(m)


def test_training_forward_defers_quietly():
    """A forward in training mode (a QLoRA step) runs unfused without a warning; the next inference fuses."""
    m = _quantized("llama", "nf4", "bf16")
    m.train()
    ids = torch.tensor(T.IDS)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        m(ids, attention_mask=torch.tensor(T.MASK))
    assert not [x for x in w if "bitsandbytes_ms" in str(x.message)]
    assert not is_fused(m)
    m.eval()
    T._generate(m, n=2)
    assert is_fused(m)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_llama")
    T._model(T._cfg("llama"), quant=False).save_pretrained(str(d))
    return d


@pytest.mark.parametrize("cfg_kw, load_kw, dtype", [
    # the tutorials' config: no dtype (transformers then loads the rest in fp16), bf16 compute, double quant
    (dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
          bnb_4bit_compute_dtype="bf16"), {}, ms.float16),
    (dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype="fp32"),
     dict(torch_dtype="fp32"), ms.float32),
    (dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="bf16"), dict(dtype="bf16"),
     ms.bfloat16),
    (dict(load_in_8bit=True), {}, ms.float16),
    (dict(load_in_8bit=True, llm_int8_threshold=0.0), dict(dtype="fp32"), ms.float32),
])
def test_from_pretrained_fuses_by_itself(tiny_checkpoint, cfg_kw, load_kw, dtype):
    bnb.register()
    cfg_kw = {k: (_DT[v] if k.endswith("compute_dtype") else v) for k, v in cfg_kw.items()}
    load_kw = {k: _DT[v] for k, v in load_kw.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch_dtype's deprecation notice
        m = AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint), quantization_config=BitsAndBytesConfig(**cfg_kw),
                                                 **load_kw)
    m.eval()
    assert m.model.embed_tokens.weight.dtype == dtype
    assert isinstance(m.model.layers[0].mlp.down_proj, bnb.nn.Linear8bitLt if cfg_kw.get("load_in_8bit") else
                      bnb.nn.Linear4bit)
    n0 = FU.stats["fused_forwards"]
    tok, logits = T._generate(m, n=4)
    assert is_fused(m) and FU.stats["fused_forwards"] - n0 == 4
    assert np.isfinite(logits).all()
    if dtype != ms.bfloat16:  # the same model unfused (a bf16 one cannot run unfused on the CPU)
        unfuse(m)
        tok_u, logits_u = T._generate(m, n=4)
        P = T.IDS.shape[1]
        diff = np.nonzero((tok[:, P:] != tok_u[:, P:]).any(0))[0]
        k = int(diff[0]) + 1 if diff.size else 4  # int8 may part after a flipped code (compare up to there)
        assert cfg_kw.get("load_in_8bit") or k == 4
        bound = T.INT8_LOGIT_BOUND if cfg_kw.get("load_in_8bit") else AUTO_BOUND
        assert np.abs(logits[:, :k] - logits_u[:, :k]).max() <= bound * np.abs(logits_u).max()
