"""The fused decode path: a quantized Llama / Qwen2 / Mistral / Qwen3 causal LM's forward as a few native calls per
layer instead of thousands of mindtorch ops (issue 13).

``fuse(model)`` checks the model once (architecture, config, every decoder layer's linear layers) and
attaches a plan: the host arrays of every weight, and one bound host call (:mod:`bitsandbytes_ms._hostcall`)
per layer half (``cdecoder_attention_fp32``: RMSNorm + Q/K/V (+bias) + RoPE + KV-cache append + causal GQA
attention with the padding mask + O + residual; ``cdecoder_mlp_fp32``: RMSNorm + gate/up + SiLU*up + down +
residual; see csrc/cpu/decoder.cpp). While a model carries a plan, its ``*ForCausalLM.forward`` (a registered
patch, :mod:`.patches`) runs: embedding lookup (numpy), 2 native calls per layer, the final norm and the
lm_head (``cdecoder_linear_fp32``; only the ``logits_to_keep`` positions), and returns the usual
``CausalLMOutputWithPast``, so ``model.generate()`` (greedy, sampling, ``attention_mask`` with left padding,
batch >= 1, ``max_new_tokens``, EOS) works unchanged.

The KV cache is ours: fp32 arrays [B, KVH, capacity, D] per layer, preallocated and grown by doubling,
attached to the transformers ``DynamicCache`` object generate passes in (``cache._bnb_fused_kv``). Patches on
``Cache.get_seq_length`` / ``reorder_cache`` / ``crop`` make that object answer for it (its own layers stay empty).

Weights: each linear is, in any mix, our ``Linear4bit`` (NF4/FP4, with or without double quant; compute dtype
fp32 or the model's), our ``Linear8bitLt`` in its inference state (``has_fp16_weights=False``: int8 ``CB`` with
fp32 row scales ``SCB``, any threshold: 0, or > 0 with outlier columns), or a plain fp32/fp16/bf16 ``nn.Linear``
(or ``LinearFP``, what quant_8bit/quant_4bit make of the layers they keep); biases fp32/fp16/bf16. Anything else
keeps the unfused path, with one warning naming the reason: an architecture other than these (Qwen3 too: its
QK-norm is fused), a rope_scaling type other than default, an activation other than SiLU, ``pretraining_tp > 1``,
other layer types, a ``Linear8bitLt`` with ``has_fp16_weights=True`` (the training state: its float weights are
quantized again at every forward) or not yet quantized, a Linear4bit computing in another dtype. Per call, the
unfused path also runs when gradients are being recorded, in graph mode, in training mode, when
``output_attentions``/``output_hidden_states`` are asked for, for a 4-D attention mask, or for a cache that the
unfused path has already filled (one warning per reason).

Numerics: the fused layers compute transformers' fp32 forward in the unfused model's own rounding on MindSpore
2.7's CPU kernels (csrc/cpu/simd_math.h gives the measured rules: RMSNorm's mean as a double sum over glibc powf
squares, RoPE's cos/sin the double functions rounded, MindSpore's exp in softmax and SiLU, Softmax's 8-lane sum,
P V in BatchMatMul's chunks of keys; tests/test_ms_rounding.py pins each rule against mindtorch's op). So a prefill
(6 or more query rows) of an fp32 model gives the unfused model's bytes layer by layer wherever the linears do:
always for ``Linear8bitLt`` (an int8 layer runs the unfused layer's own fused kernel, ``cint8_linear_fp32``'s,
at every row count; tests/test_fused_decoder.py replays every layer of an unfused int8 prefill through the fused
calls), and a fused int8 model's perplexity is the unfused one's (benchmarks/user_path_cpu.md). Decode steps
(fewer than 6 query rows) sum each attention score in four partial chains instead of one (faster), within
rounding; an int8 model can amplify that difference (a 1-ulp input change can move one int8 code, or with
threshold > 0 move a column across the outlier threshold), so its generated logits may part from the unfused
ones by more than a 4-bit model's (tests/test_fused_decoder.py: INT8_LOGIT_BOUND). With the exact kernels
(``BNB_MS_4BIT_BF16_DOT=0``, or a CPU without AVX512-BF16) decode (one token) runs the same 4-bit kernel as the
unfused fp32 layers (bit-identical projections); a 4-bit prefill (more than 8 rows) multiplies the dequantized
weight in the packed-panel GEMM in exact fp32 (the unfused layer's matmul sums in another order). By default on
a CPU with AVX512-BF16 -- as upstream's CPU 4-bit layers compute there, and as the unfused Linear4bit's bf16
one-row kernel does; ``functional.set_bf16_dot`` / ``BNB_MS_4BIT_BF16_DOT`` decide, read at every forward -- the
4-bit layers compute in bf16 through the ``cdecoder_*_fp32_bf16dot`` entries: up to 16 rows (decode steps, a
batch's decode rows, short prompts) each row in fourbit.cpp's one-row bf16 kernel (x and bf16(code) multiplied in
pairs, scaled by absmax per 128 elements; bound there; the weights read once for all rows), which reads the
weights ~1.4x faster than the exact GEMV (benchmarks/user_path_cpu.md); longer prompts in gemm_panel.h's bf16
GEMM (x and the weight rounded to bf16, pairs accumulated in fp32; gemm_panel.h documents the order and the
bound). tests/test_fused_bf16_prefill.py: same greedy tokens as the unfused model, logits
within 1e-2 x max|logit|.

fp16 / bf16 models (their embedding, norms and kept layers in that dtype; quantized layers computing in it):
the fused path widens those weights exactly and keeps fp32 hidden-state buffers. An fp16 model (what
transformers' bitsandbytes quantizer loads when no dtype is given: the tutorial's path) runs the ``*_r16``
entries, which round each op's result to fp16 where the unfused fp16 model's op rounds it (MindSpore's fp16
kernels compute in fp32 and round; its fp16 Softmax and Sigmoid round the exp: csrc/cpu/simd_math.h), so a
prefill gives the unfused fp16 model's bits layer by layer (tests/test_fused_decoder.py; the lm_head's sum order
and the decode rows' score sums still differ) and its int8 perplexity (benchmarks/user_path_cpu.md). Computing
an fp16 model in fp32 instead (before the ``*_r16`` entries) put an int8 SmolLM2 +0.22% off the unfused model's
perplexity. A bf16 model computes in fp32 (fp32 logits): the fp32 computation of its bf16 weights (an unfused
bf16 model does not run on MindSpore's CPU at all: its gather has no bf16 kernel).

Switches: ``unfuse(model)``; ``set_enabled(False)`` (or ``BNB_MS_FUSED=0``) for every model.
"""

from __future__ import annotations

import os
import warnings
from typing import Dict, List, Optional

import mindspore as ms
import numpy as np

from .. import _hostcall
from . import fused_generate as _gen
from . import mindtorch_patches as _mindtorch_patches  # noqa: F401  (registers mindtorch-isin)
from .. import functional as F
from ..backends.native import decoder_entry as _decoder
from .patches import registry

__all__ = ["fuse", "unfuse", "is_fused", "auto_fuse", "set_enabled", "unsupported_reason", "FUSED_PATCHES"]

_enabled = os.environ.get("BNB_MS_FUSED", "1") != "0"
_PLAN = "_bnb_fused_plan"
_AUTO = "_bnb_fused_auto"  # None (not looked at) | "pending" | "tried" | "no" (no quantized layer) | "off" (fuse(m, False))
_KV = "_bnb_fused_kv"
_SPEC_NONE = (None, None, None, None, None, None, None, 64, 256)
_FLOAT = (ms.float32, ms.float16, ms.bfloat16)
_warned: set = set()
#: how many forwards took the fused path (tests and benchmarks read it)
stats = {"fused_forwards": 0, "cache_reorders": 0, "cache_crops": 0, "fast_prepares": 0, "numpy_loops": 0}

#: architectures (config.model_type) -> the modeling module whose ``*ForCausalLM.forward`` is patched
FAMILIES = {
    "llama": ("transformers.models.llama.modeling_llama", "LlamaForCausalLM"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2ForCausalLM"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "MistralForCausalLM"),
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3ForCausalLM"),
}
FUSED_PATCHES = [f"fused-{k}-causal-lm-forward" for k in FAMILIES] + [
    "fused-cache-get-seq-length", "fused-cache-reorder", "fused-cache-crop", "fused-prepare-inputs", "fused-sample",
    "mindtorch-isin"]  # (generate's EOS check at every step: integrations/mindtorch_patches.py)


def set_enabled(flag: bool) -> bool:
    """Switches the fused path on or off for every fused model (off: the unfused forward). Returns the old value."""
    global _enabled
    old, _enabled = _enabled, bool(flag)
    return old


def _warn_once(key, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, stacklevel=3)


class _Unsupported(Exception):
    pass


# ---- the plan: host arrays and bound host calls --------------------------------------------------------
def _host_param(p, keep: Dict[int, np.ndarray]) -> np.ndarray:
    """The parameter's own memory as a host array (no copy; a copy only where it cannot be viewed)."""
    a = keep.get(id(p))
    if a is None:
        a = keep[id(p)] = _hostcall.host_view(_hostcall.DeviceView(), p)
    return a


def _signature(model) -> list:
    """The identity and current buffer address of every tensor a plan reads: parameters, 4-bit quant
    states (their blocksizes, shape and type too), int8 row scales (SCB) and thresholds. A plan made from other tensors or buffers (a weight replaced,
    loaded or updated in place, which moves its buffer) is rebuilt before the next generation starts."""
    sig = []

    def add(t):
        if t is not None and hasattr(t, "_data_ptr"):
            sig.append((id(t), t._data_ptr(), t.dtype, tuple(t.shape)))  # a cast in place may keep the address

    for p in model.parameters():
        add(p)
    for m in model.modules():
        qs = getattr(getattr(m, "weight", None), "quant_state", None)
        if qs is not None:
            s2 = qs.state2
            for t in (qs.absmax, qs.code, qs.offset, getattr(s2, "absmax", None), getattr(s2, "code", None)):
                add(t)
            # the plain values a spec is made of (a blocksize or shape edited in place moves no buffer)
            sig.append((id(qs), qs.blocksize, tuple(qs.shape), qs.quant_type, getattr(s2, "blocksize", None)))
        st = getattr(m, "state", None)
        if st is not None and hasattr(st, "SCB"):  # Linear8bitLt: the row scales its spec reads (as _linear_spec)
            scb = getattr(m.weight, "SCB", None)
            add(scb if scb is not None else st.SCB)
            sig.append((id(m), "threshold", float(st.threshold)))
    return sig


def _linear_spec(mod, name: str, N: int, K: int, keep: Dict[int, np.ndarray], dtype=None) -> tuple:
    """The 9-entry linear spec (csrc/cpu/decoder.cpp's header) of one linear module; ``dtype``: the model's
    hidden-state dtype (a Linear4bit may compute in it; the fused path computes in fp32)."""
    import mindspore as ms
    import torch

    from ..nn.modules import Int8Params, Linear4bit, Linear8bitLt, Params4bit

    bias = None
    if getattr(mod, "bias", None) is not None:
        if mod.bias.dtype not in _FLOAT:
            raise _Unsupported(f"{name}.bias is {mod.bias.dtype} (fused: float32, float16 or bfloat16)")
        if _numel(mod.bias) != N:
            raise _Unsupported(f"{name}.bias has {_numel(mod.bias)} values, expected {N}")
        bias = _host_param(mod.bias, keep)
    if isinstance(mod, Linear4bit):
        w = mod.weight
        qs = getattr(w, "quant_state", None)
        if not isinstance(w, Params4bit) or qs is None:
            raise _Unsupported(f"{name} is a Linear4bit whose weight is not quantized")
        # any float compute dtype: the fused path computes in float32 (wider than fp16 / bf16; module docstring)
        if mod.compute_dtype is not None and mod.compute_dtype not in _FLOAT:
            raise _Unsupported(f"{name} computes in {mod.compute_dtype} (fused: float32, float16 or bfloat16)")
        if tuple(qs.shape) != (N, K):
            raise _Unsupported(f"{name} has shape {tuple(qs.shape)}, expected {(N, K)}")
        plan = F._plan_4bit(qs, "fuse")
        plan.check_weight(w, "fuse")
        packed, absmax, code, absmax2, code2, offset = plan.host_args(w, qs, None)[:6]
        for a in (packed, absmax, code, absmax2, code2, offset):
            if a is not None:
                keep[id(a)] = a
        return (packed, absmax, code, absmax2, code2, offset, bias, plan.bs, plan.bs2)
    if isinstance(mod, Linear8bitLt):
        w, st = mod.weight, mod.state
        if st.has_fp16_weights:
            raise _Unsupported(f"{name} is a Linear8bitLt with has_fp16_weights=True (training state; fused: "
                               f"int8 inference weights, has_fp16_weights=False)")
        if not isinstance(w, Int8Params) or w.dtype != ms.int8:
            raise _Unsupported(f"{name} is a Linear8bitLt whose weight is not quantized to int8 yet")
        scb = getattr(w, "SCB", None)
        scb = scb if scb is not None else st.SCB
        if scb is None or scb.dtype != ms.float32 or _numel(scb) != N:
            raise _Unsupported(f"{name} is a Linear8bitLt without float32 row scales SCB [{N}]")
        if tuple(w.shape) != (N, K):
            raise _Unsupported(f"{name} has shape {tuple(w.shape)}, expected {(N, K)}")
        if K > F.checks_int8_max_K:
            raise _Unsupported(f"{name} has {K} input features (int8 GEMM: at most {F.checks_int8_max_K})")
        thr = float(st.threshold)
        # the unfused forward's branch: outlier columns only for threshold > 0 (0, negative or NaN: none)
        thr_a = np.array(thr if thr > 0.0 else 0.0, np.float32)
        keep[id(thr_a)] = thr_a
        return (_host_param(w, keep), _host_param(scb, keep).reshape(N), None, None, None, thr_a, bias, 64, 256)
    from ..nn.linear_fp import LinearFP

    if type(mod) is torch.nn.Linear or type(mod) is LinearFP:  # LinearFP: a kept nn.Linear (quant_8bit/quant_4bit)
        if mod.weight.dtype not in _FLOAT:
            raise _Unsupported(f"{name} is an nn.Linear in {mod.weight.dtype} (fused: float32, float16, bfloat16)")
        if tuple(mod.weight.shape) != (N, K):
            raise _Unsupported(f"{name} has shape {tuple(mod.weight.shape)}, expected {(N, K)}")
        return (_host_param(mod.weight, keep), None, None, None, None, None, bias, 64, 256)
    # the qualified name: a wrapper such as peft's LoRA layer shares the class name of the layer it wraps
    hint = ("; a PEFT adapter layer: the model runs correctly, unfused (slower); `model.merge_and_unload()` gives "
            "fusable layers" if type(mod).__module__.startswith("peft.") else "")
    raise _Unsupported(f"{name} is a {type(mod).__module__}.{type(mod).__qualname__} (fused: Linear4bit, Linear8bitLt or a float32/float16/"
                       f"bfloat16 nn.Linear){hint}")


def _numel(t) -> int:
    n = 1
    for d in t.shape:
        n *= int(d)
    return n


class _Layer:
    __slots__ = ("attn", "mlp", "window", "bound")


class _Plan:
    """Everything a fused forward needs, checked once."""

    def __init__(self, model):
        cfg = model.config
        self.family = cfg.model_type
        inner = model.model
        self.keep: Dict[int, np.ndarray] = {}
        H, Hq, KVH = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
        D = getattr(cfg, "head_dim", None) or H // Hq
        I = cfg.intermediate_size
        self.H, self.Hq, self.KVH, self.D, self.I = H, Hq, KVH, D, I
        emb = inner.embed_tokens.weight
        if emb.dtype not in _FLOAT:
            raise _Unsupported(f"the embedding is {emb.dtype} (fused: float32, float16 or bfloat16)")
        self.embed = _host_param(emb, self.keep)
        rot = inner.rotary_emb
        self.inv_freq = np.ascontiguousarray(_hostcall.host(rot.inv_freq).astype(np.float32))
        if self.inv_freq.size != D // 2:
            raise _Unsupported(f"rotary embedding covers {2 * self.inv_freq.size} of head_dim {D} (partial RoPE)")
        self.rope_scale = float(getattr(rot, "attention_scaling", 1.0))
        self.norm_w = _host_param(inner.norm.weight, self.keep)
        self.norm_eps = float(inner.norm.variance_epsilon)
        self.layers: List[_Layer] = []
        past = np.zeros((), np.int64)
        dummy_x = np.zeros((1, 1, H), np.float32)
        # an fp16 model: the entries in its rounding (every op's result rounded to fp16, as the unfused model's)
        self.r16 = r16 = emb.dtype == ms.float16
        attn_e, mlp_e = _decoder("attention", r16=r16), _decoder("mlp", r16=r16)
        # the same calls with a 4-bit weight's prefill in bf16 (functional.set_bf16_dot's switch; run_as)
        self.attn_dot, self.mlp_dot = _decoder("attention", True, r16), _decoder("mlp", True, r16)
        self.lm_dot = _decoder("linear", True, r16)
        for i, layer in enumerate(inner.layers[: cfg.num_hidden_layers]):
            a, m, pfx = layer.self_attn, layer.mlp, f"model.layers.{i}"
            qk = []
            for nm in ("q_norm", "k_norm"):
                n = getattr(a, nm, None)
                if n is not None:
                    if self.family != "qwen3":
                        raise _Unsupported(f"{pfx}.self_attn has {nm} (QK-norm outside Qwen3)")
                    if n.weight.dtype not in _FLOAT or float(n.variance_epsilon) != float(
                            layer.input_layernorm.variance_epsilon):
                        raise _Unsupported(f"{pfx}.self_attn.{nm}: a float weight and the layer norms' eps needed")
                    qk.append(_host_param(n.weight, self.keep))
                else:
                    qk.append(None)
            if getattr(a, "head_dim", D) != D:
                raise _Unsupported(f"{pfx}.self_attn.head_dim differs from the config's")
            dt, kp = emb.dtype, self.keep
            specs = [_linear_spec(a.q_proj, f"{pfx}.self_attn.q_proj", Hq * D, H, kp, dt),
                     _linear_spec(a.k_proj, f"{pfx}.self_attn.k_proj", KVH * D, H, kp, dt),
                     _linear_spec(a.v_proj, f"{pfx}.self_attn.v_proj", KVH * D, H, kp, dt),
                     _linear_spec(a.o_proj, f"{pfx}.self_attn.o_proj", H, Hq * D, kp, dt)]
            mspecs = [_linear_spec(m.gate_proj, f"{pfx}.mlp.gate_proj", I, H, kp, dt),
                      _linear_spec(m.up_proj, f"{pfx}.mlp.up_proj", I, H, kp, dt),
                      _linear_spec(m.down_proj, f"{pfx}.mlp.down_proj", H, I, kp, dt)]
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            for nm, n in (("input_layernorm", n1), ("post_attention_layernorm", n2)):
                if n.weight.dtype not in _FLOAT:
                    raise _Unsupported(f"{pfx}.{nm} is {n.weight.dtype} (fused: float32, float16 or bfloat16)")
            window = 0
            sw = getattr(a, "sliding_window", None) if self.family in ("qwen2", "qwen3") else getattr(cfg, "sliding_window", None)
            if self.family != "llama" and sw:
                window = int(sw)
            L = _Layer()
            L.window = window
            L.bound = None  # ids of the per-call arrays the calls are bound to (re-pointed only when they change)
            kv = np.zeros((1, KVH, 1, D), np.float32)
            L.attn = attn_e.bind(dummy_x, np.zeros((1, 1), np.int64), None, kv, kv,
                                 _host_param(n1.weight, self.keep), self.inv_freq, *qk,
                                 *[x for s in specs for x in s], past, Hq, float(n1.variance_epsilon),
                                 float(a.scaling), self.rope_scale, window, dummy_x)
            L.mlp = mlp_e.bind(dummy_x, _host_param(n2.weight, self.keep), *[x for s in mspecs for x in s], I,
                               float(n2.variance_epsilon), dummy_x)
            self.layers.append(L)
        self.past = past  # the 0-d int64 every attention call reads (updated in place)
        head = model.lm_head
        try:
            self.lm_spec = _linear_spec(head, "lm_head", cfg.vocab_size, H, self.keep, emb.dtype)
            self.lm_call = _decoder("linear", r16=r16).bind(
                dummy_x, *self.lm_spec, cfg.vocab_size, np.zeros((1, 1, cfg.vocab_size), np.float32))
        except _Unsupported:
            self.lm_spec = self.lm_call = None  # the lm_head module runs (e.g. an int8 lm_head)
        self.norm_call = _decoder("rms_norm", r16=r16).bind(dummy_x, self.norm_w, self.norm_eps, dummy_x)
        self.vocab = cfg.vocab_size
        self.sig = _signature(model)  # after the views above (they give unallocated tensors a buffer)
        self.auto = False  # made by auto_fuse on a first forward, not by the user's fuse()


def unsupported_reason(model) -> Optional[str]:
    """Why ``model`` cannot take the fused path (None when it can)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in FAMILIES:
        return f"architecture {getattr(cfg, 'model_type', type(model).__name__)!r} (fused: {', '.join(FAMILIES)})"
    if type(model).__name__ != FAMILIES[cfg.model_type][1]:
        return f"{type(model).__name__} (fused: {FAMILIES[cfg.model_type][1]})"
    rs = getattr(cfg, "rope_scaling", None)
    if rs:
        t = rs.get("rope_type", rs.get("type", "default"))
        if t != "default":
            return f"rope_scaling type {t!r} (fused: default RoPE)"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} (fused: silu)"
    if getattr(cfg, "pretraining_tp", 1) > 1:
        return "pretraining_tp > 1"
    if cfg.model_type == "qwen2" and getattr(cfg, "use_sliding_window", False):
        # windows per layer are supported; only say nothing here
        pass
    return None


def _build(model):
    reason = unsupported_reason(model)
    if reason is None:
        try:
            return _Plan(model), None
        except _Unsupported as e:
            reason = str(e)
    return None, reason


def fuse(model, enable: bool = True) -> bool:
    """Installs the fused forward on ``model`` (a quantized Llama/Qwen2/Mistral causal LM). Returns True when
    fused; otherwise warns once with the reason and leaves the model on its unfused path.

    A model holding quantized layers is fused by itself on its first inference forward (see :func:`auto_fuse`);
    ``fuse(model, False)`` removes the fused forward and keeps the model off it for good (``fuse(model)`` again
    turns it back on)."""
    if not enable:
        unfuse(model)
        return False
    model.__dict__.pop(_AUTO, None)
    if not _hostcall.active() and not _hostcall._enabled:
        _warn_once(("fuse", id(model), "hostcall"), "bitsandbytes_ms.fuse: host calls are off "
                   "(BNB_MS_HOSTCALL=0 or not the CPU library); the model keeps the unfused path")
        return False
    plan, reason = _build(model)
    if plan is None:
        _warn_once(("fuse", id(model), reason),
                   f"bitsandbytes_ms.fuse: {type(model).__name__} keeps the unfused path: {reason}")
        return False
    registry.apply(FUSED_PATCHES)
    object.__setattr__(model, _PLAN, plan)
    return True


def unfuse(model) -> None:
    """Removes the fused forward from ``model`` and keeps it off (no automatic fusing either) until ``fuse(model)``;
    the patches stay installed and do nothing for it."""
    model.__dict__.pop(_PLAN, None)
    object.__setattr__(model, _AUTO, "off")


def auto_fuse(model) -> None:
    """Marks ``model`` (just quantized by quant_4bit / quant_8bit, or loaded through transformers'
    ``from_pretrained(quantization_config=...)``) to be fused on its first inference forward, and installs the
    forward patches that do it. A model the user took off the fused path (``fuse(model, False)``) stays off."""
    if model.__dict__.get(_AUTO) != "off":
        object.__setattr__(model, _AUTO, "pending")
    registry.apply(FUSED_PATCHES)


def _has_quantized_layers(model) -> bool:
    from ..nn.modules import Linear4bit, Linear8bitLt

    return any(isinstance(m, (Linear4bit, Linear8bitLt)) for m in model.modules())


def _auto_plan(model, kw):
    """The plan of a model fused by itself on this forward, or None (the unfused path runs). Decided once per
    model: a model whose first fused attempt fails keeps the unfused path (with fuse's one warning naming the
    reason). Forwards that cannot be fused anyway (training, gradients, graph mode, ...) defer the attempt
    without a warning: a QLoRA loop on a quantized model is not a fused-path user."""
    mark = model.__dict__.get(_AUTO)
    if mark is None:  # a model quantized by hand (replace_with_bnb_linear, our layers): fused like the others
        mark = "pending" if _has_quantized_layers(model) else "no"
        object.__setattr__(model, _AUTO, mark)
    if mark != "pending" or _runtime_reason(model, kw) is not None:
        return None
    object.__setattr__(model, _AUTO, "tried")
    if not fuse(model):
        return None
    plan = model.__dict__[_PLAN]
    plan.auto = True
    return plan


def is_fused(model) -> bool:
    return model.__dict__.get(_PLAN) is not None


# ---- our KV cache ------------------------------------------------------------------------------------
class _KVState:
    """Per-layer fp32 K/V arrays [B, KVH, capacity, D]; ``length`` tokens are valid."""

    def __init__(self, plan: _Plan, B: int):
        self.plan, self.B, self.length, self.cap = plan, B, 0, 0
        self.k: List[np.ndarray] = []
        self.v: List[np.ndarray] = []
        self.mask = np.ones((B, 0), np.uint8)  # [B, cap]: the padding mask, columns >= length unused
        self.x: Dict[int, np.ndarray] = {}  # T -> [B, T, H] activation buffer (reused every decode step)
        self.pos: Dict[int, np.ndarray] = {}  # T -> [B, T] positions buffer

    def ensure(self, L: int) -> None:
        if L <= self.cap:
            return
        cap = max(L, 2 * self.cap, 64)
        cap = -(-cap // 64) * 64
        p = self.plan
        shape = (self.B, p.KVH, cap, p.D)
        nk, nv = [], []
        for i in range(len(p.layers)):
            k, v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
            if self.length:
                k[:, :, : self.length] = self.k[i][:, :, : self.length]
                v[:, :, : self.length] = self.v[i][:, :, : self.length]
            nk.append(k)
            nv.append(v)
        mask = np.ones((self.B, cap), np.uint8)
        mask[:, : self.mask.shape[1]] = self.mask
        self.k, self.v, self.cap, self.mask = nk, nv, cap, mask

    def buffers(self, T: int):
        x = self.x.get(T)
        if x is None:
            if len(self.x) > 4:
                self.x.clear()
                self.pos.clear()
            x = self.x[T] = np.empty((self.B, T, self.plan.H), np.float32)
            self.pos[T] = np.empty((self.B, T), np.int64)
        return x, self.pos[T]

    def reorder(self, idx: np.ndarray) -> None:
        self.k = [np.ascontiguousarray(k[idx]) for k in self.k]
        self.v = [np.ascontiguousarray(v[idx]) for v in self.v]
        self.mask = np.ascontiguousarray(self.mask[idx])
        self.B = len(idx)
        self.x.clear()
        self.pos.clear()


# ---- the fused forward -------------------------------------------------------------------------------
_FWD_ARGS = ("input_ids", "attention_mask", "position_ids", "past_key_values", "inputs_embeds", "labels",
             "use_cache", "cache_position", "logits_to_keep")


_NO_HOSTCALL, _TRAINING = "gradients are being recorded, graph mode, or host calls are off", "training mode"
#: reasons an automatically fused model runs unfused without a warning (training a quantized model, e.g. QLoRA)
_QUIET_REASONS = (_NO_HOSTCALL, _TRAINING)


def _runtime_reason(model, kw) -> Optional[str]:
    if not _hostcall.active():
        return _NO_HOSTCALL
    if model.training:
        return _TRAINING
    for k in ("output_attentions", "output_hidden_states"):
        if kw.get(k):
            return f"{k}=True"
    am = kw.get("attention_mask")
    if am is not None and am.ndim != 2:
        return f"a {am.ndim}-D attention_mask (fused: 2-D padding mask)"
    pkv = kw.get("past_key_values")
    if pkv is not None:
        from transformers.cache_utils import DynamicCache

        if pkv.__dict__.get(_KV) is None:
            if type(pkv) is not DynamicCache:
                return f"a {type(pkv).__name__} (fused: DynamicCache)"
            if pkv.get_seq_length() > 0:
                return "a DynamicCache already filled by the unfused path"
    return None


def _host_int(t) -> np.ndarray:
    return _hostcall.host(t) if not isinstance(t, np.ndarray) else t


def _dot(rows: int) -> bool:
    """Whether this call's 4-bit layers compute in bf16 (functional.set_bf16_dot's switch): up to 16 rows the one-row
    bf16 GEMV for each row where the weight's shape takes it (else up to 8 rows the exact GEMV), more a prefill's
    GEMM (csrc/cpu/decoder.cpp, linear_spec)."""
    return F.bf16_dot_one_row() if rows == 1 else F.bf16_dot_enabled(rows)


def _fused_forward(model, plan: _Plan, kw):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    logits, pkv, use_cache = _fused_logits(model, plan, kw)
    logits_t = _hostcall.wrap(logits) if isinstance(logits, np.ndarray) else logits
    loss = None
    if kw.get("labels") is not None:
        loss = model.loss_function(logits=logits_t, labels=kw["labels"], vocab_size=model.config.vocab_size)
    out = CausalLMOutputWithPast(loss=loss, logits=logits_t, past_key_values=pkv if use_cache else None)
    rd = kw.get("return_dict")
    if rd is None:
        rd = getattr(model.config, "use_return_dict", True)
    return out if rd else out.to_tuple()


def _fused_logits(model, plan: _Plan, kw):
    """The fused forward's logits (a host float32 array; a tensor where the lm_head is not fused), its cache and
    whether the cache is kept."""
    from transformers.cache_utils import DynamicCache

    stats["fused_forwards"] += 1
    ids, emb = kw.get("input_ids"), kw.get("inputs_embeds")
    if emb is not None:
        src = _hostcall.host(emb).astype(np.float32, copy=False)
    else:
        src = _host_int(ids).astype(np.int64, copy=False)
    B, T = (src.shape[0], src.shape[1]) if src.ndim >= 2 else (1, src.shape[0])
    pkv = kw.get("past_key_values")
    use_cache = kw.get("use_cache")
    if use_cache is None:
        use_cache = getattr(model.config, "use_cache", True)
    if pkv is None and use_cache:
        pkv = DynamicCache(config=model.config)
    state = pkv.__dict__.get(_KV) if pkv is not None else None
    if state is None or state.plan is not plan:
        state = _KVState(plan, B)
        if pkv is not None:
            pkv.__dict__[_KV] = state
    if state.B != B:
        raise ValueError(f"fused forward: batch {B} does not match the cache's batch {state.B}")
    past = state.length
    cp = kw.get("cache_position")
    if cp is not None:
        c0 = int(_host_int(cp).reshape(-1)[0])
        if c0 > past:
            raise ValueError(f"fused forward: cache_position starts at {c0} but the cache holds {past} tokens")
        past = c0
    L = past + T
    state.ensure(L)
    x, pos = state.buffers(T)
    if emb is not None:
        x[...] = src.reshape(B, T, -1)
    elif plan.embed.dtype == x.dtype:
        np.take(plan.embed, src.reshape(B, T), axis=0, out=x)
    else:  # an fp16 / bf16 embedding: the rows widened
        x[...] = plan.embed[src.reshape(B, T)].astype(np.float32)
    p = kw.get("position_ids")
    if p is None:
        pos[...] = np.arange(past, L, dtype=np.int64)
    else:
        pos[...] = _host_int(p).reshape(-1, T)
    am = kw.get("attention_mask")
    mask = None
    if am is not None:
        m = _host_int(am)
        if m.shape[1] < L:
            raise ValueError(f"fused forward: attention_mask covers {m.shape[1]} of {L} positions")
        m = m[:, :L]
        if not m.all():
            mask = state.mask
            mask[:, :L] = m != 0
    plan.past[...] = past
    key = (id(x), id(pos), id(mask), id(state))
    dot = _dot(B * T)
    for i, layer in enumerate(plan.layers):
        a = layer.attn
        if layer.bound != key or state.k[i] is not a._keep[3]:
            a.set(0, x)
            a.set(1, pos)
            a.set(2, mask)
            a.set(3, state.k[i])
            a.set(4, state.v[i])
            a.set(51, x)
            layer.mlp.set(0, x)
            layer.mlp.set(31, x)
            layer.bound = key
        if dot:
            a.run_as(plan.attn_dot)
            layer.mlp.run_as(plan.mlp_dot)
        else:
            a()
            layer.mlp()
    state.length = L
    keep = kw.get("logits_to_keep") or 0
    hs = x[:, -keep:] if isinstance(keep, int) and keep > 0 else (x if isinstance(keep, int) else x[:, _host_int(keep)])
    hs = np.ascontiguousarray(hs)
    nc = plan.norm_call
    nc.set(0, hs)
    nc.set(3, hs)
    nc()
    if plan.lm_call is not None:
        logits = np.empty(hs.shape[:-1] + (plan.vocab,), np.float32)
        lc = plan.lm_call
        lc.set(0, hs)
        lc.set(11, logits)
        if _dot(int(np.prod(hs.shape[:-1]))):
            lc.run_as(plan.lm_dot)
        else:
            lc()
        return logits, pkv, use_cache
    return model.lm_head(_hostcall.wrap(hs)), pkv, use_cache


def _unfused_for_good(instance) -> bool:
    """The usual unfused model: no plan, and none will be made (tried, no quantized layer, or switched off)."""
    return instance.__dict__.get(_PLAN) is None and instance.__dict__.get(_AUTO) in ("tried", "no", "off")


def _plan_for(instance, kw) -> Optional[_Plan]:
    """The plan a forward with arguments ``kw`` runs fused with (made or rebuilt here when due), or None: the unfused
    path runs (warned once where the user should know why)."""
    if _unfused_for_good(instance):
        return None
    plan = instance.__dict__.get(_PLAN)
    if plan is None:
        plan = _auto_plan(instance, kw)
        if plan is None:
            return None
    reason = _runtime_reason(instance, kw)
    if reason is not None:
        pkv = kw.get("past_key_values")
        if pkv is not None and pkv.__dict__.get(_KV) is not None:
            raise RuntimeError(f"bitsandbytes_ms fused forward: this cache was filled by the fused path, which "
                               f"cannot continue here: {reason}")
        if not (plan.auto and reason in _QUIET_REASONS):
            _warn_once(("run", reason), f"bitsandbytes_ms fused forward: the unfused path runs: {reason}")
        return None
    if _state_of(kw.get("past_key_values")) is None and _signature(instance) != plan.sig:
        # a new generation on weights that changed since the plan was made: read them again
        auto = plan.auto
        plan, reason = _build(instance)
        if plan is None:
            unfuse(instance)
            _warn_once(("rebuild", reason), f"bitsandbytes_ms fused forward: the unfused path runs: {reason}")
            return None
        plan.auto = auto
        object.__setattr__(instance, _PLAN, plan)
    return plan


def _causal_lm_forward(wrapped, instance, args, kwargs):
    if instance is None or not _enabled:
        return wrapped(*args, **kwargs)
    if _unfused_for_good(instance):
        return wrapped(*args, **kwargs)  # at no cost
    kw = dict(zip(_FWD_ARGS, args))
    kw.update(kwargs)
    plan = _plan_for(instance, kw)
    if plan is None:
        return wrapped(*_tensors(args), **_tensors(kwargs))
    unknown = set(kw) - set(_FWD_ARGS) - {"return_dict", "output_attentions", "output_hidden_states"}
    if unknown:
        _warn_once(("kw", tuple(sorted(unknown))), f"bitsandbytes_ms fused forward ignores {sorted(unknown)}")
    return _fused_forward(instance, plan, kw)


for _fam, (_mod, _cls) in FAMILIES.items():
    registry.register(
        f"fused-{_fam}-causal-lm-forward", _mod, f"{_cls}.forward",
        f"{_cls}.forward dispatches ~80 mindtorch ops per layer and token (~40-70 us each); a fused model "
        f"(bitsandbytes_ms.integrations.fuse) runs 2 native calls per layer instead")(_causal_lm_forward)


def _state_of(cache):
    return cache.__dict__.get(_KV) if cache is not None else None


def _tensors(args):
    """``args`` (a tuple or a dict) with the numpy arrays of :func:`_prepare_inputs` as tensors again, for the
    unfused path."""
    if isinstance(args, dict):
        return {k: _hostcall.wrap(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    return tuple(_hostcall.wrap(v) if isinstance(v, np.ndarray) else v for v in args)


_PREP_ARGS = ("input_ids", "past_key_values", "attention_mask", "inputs_embeds", "cache_position")


@registry.register("fused-prepare-inputs", "transformers.generation.utils", "GenerationMixin.prepare_inputs_for_generation",
                   "before every forward generate slices input_ids by cache_position and makes position_ids from "
                   "the attention mask with ~10 mindtorch ops (measured: about a quarter of a fused decode step); "
                   "for a fused model the same values are computed in numpy, which its forward reads anyway")
def _prepare_inputs(wrapped, instance, args, kwargs):
    """GenerationMixin.prepare_inputs_for_generation's values for a fused model's usual step (decoder-only, token
    ids, a DynamicCache, cache_position given, position_ids made from the 2-D attention mask): input_ids sliced to
    the tokens not in the cache, position_ids = cumsum(mask) - 1 (1 where the mask is 0) for those tokens, both
    as int64 numpy arrays; everything else as the original passes it. Any other call runs the original."""
    plan = instance.__dict__.get(_PLAN) if instance is not None else None
    if plan is None or not _enabled or len(args) > len(_PREP_ARGS):
        return wrapped(*args, **kwargs)
    kw = dict(zip(_PREP_ARGS, args))
    if set(kw) & set(kwargs):
        return wrapped(*args, **kwargs)
    kw.update(kwargs)
    from transformers.cache_utils import DynamicCache

    ids, pkv, am, cp = kw.pop("input_ids"), kw.pop("past_key_values", None), kw.pop("attention_mask", None), \
        kw.pop("cache_position", None)
    if (kw.pop("inputs_embeds", None) is not None or cp is None or type(pkv) is not DynamicCache or ids is None
            or (am is not None and am.ndim != 2) or kw.get("position_ids") is not None
            or any(k in kw for k in ("token_type_ids", "decoder_position_ids", "decoder_attention_mask"))
            or instance.config.is_encoder_decoder):
        return wrapped(*args, **kwargs)
    stats["fast_prepares"] += 1
    tok = _host_int(ids).astype(np.int64, copy=False)
    pos_c = _host_int(cp).astype(np.int64, copy=False).reshape(-1)
    S, n = tok.shape[1], pos_c.shape[0]
    if n == 0:
        return wrapped(*args, **kwargs)
    if pos_c[-1] >= S:
        tok = tok[:, max(S - n, 0):]
    elif S != n:
        tok = tok[:, pos_c]
    out = {"cache_position": cp, "past_key_values": pkv, "input_ids": np.ascontiguousarray(tok), "inputs_embeds": None}
    if am is not None:
        out["position_ids"] = _gen.positions(_host_int(am), tok.shape[1])
        out["attention_mask"] = am
    for k, v in kw.items():
        out.setdefault(k, v)
    out.pop("labels", None)
    return out


@registry.register("fused-cache-get-seq-length", "transformers.cache_utils", "Cache.get_seq_length",
                   "a fused model keeps its KV cache in its own arrays behind the Cache object generate passes "
                   "in; the object must report their length")
def _get_seq_length(wrapped, instance, args, kwargs):
    st = _state_of(instance)
    return st.length if st is not None else wrapped(*args, **kwargs)


@registry.register("fused-cache-reorder", "transformers.cache_utils", "Cache.reorder_cache",
                   "beam search reorders the cache's batch; a fused model's arrays must follow")
def _reorder_cache(wrapped, instance, args, kwargs):
    st = _state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    beam_idx = args[0] if args else kwargs["beam_idx"]
    stats["cache_reorders"] += 1
    st.reorder(_host_int(beam_idx).astype(np.int64).reshape(-1))
    return None


@registry.register("fused-cache-crop", "transformers.cache_utils", "Cache.crop",
                   "assisted decoding crops the cache; a fused model's length must follow")
def _crop(wrapped, instance, args, kwargs):
    st = _state_of(instance)
    if st is None:
        return wrapped(*args, **kwargs)
    n = args[0] if args else next(iter(kwargs.values()))
    n = int(n)
    stats["cache_crops"] += 1
    st.length = max(0, st.length + n) if n < 0 else min(st.length, n)
    return None


_SAMPLE_ARGS = ("input_ids", "logits_processor", "stopping_criteria", "generation_config", "synced_gpus", "streamer")


@registry.register("fused-sample", "transformers.generation.utils", "GenerationMixin._sample",
                   "around a fused forward generate's sampling loop runs ~35 mindtorch ops a token (logits copy, "
                   "processors, argmax, EOS arithmetic, concatenations, stopping criteria): 5-7 ms of a 21 ms "
                   "SmolLM2 step measured; for a fused model the same loop runs in numpy (fused_generate.py)")
def _sample(wrapped, instance, args, kwargs):
    if instance is None or not _enabled or len(args) > len(_SAMPLE_ARGS):
        return wrapped(*args, **kwargs)
    if _unfused_for_good(instance):
        return wrapped(*args, **kwargs)
    kw = dict(zip(_SAMPLE_ARGS, args))
    if set(kw) & set(kwargs):
        return wrapped(*args, **kwargs)
    kw.update(kwargs)
    head = {k: kw.pop(k, None) for k in _SAMPLE_ARGS}
    ids = head["input_ids"]
    if head["generation_config"] is None or ids is None:
        return wrapped(*args, **kwargs)
    kw = instance._get_initial_cache_position(ids.shape[1], ids.device, kw)
    if _gen.loop_reason(head["generation_config"], head["synced_gpus"], kw, instance.config.is_encoder_decoder):
        return wrapped(*args, **kwargs)
    first = {"input_ids": ids, "attention_mask": kw.get("attention_mask"), "past_key_values": kw["past_key_values"],
             "cache_position": kw["cache_position"], "use_cache": True}
    plan = _plan_for(instance, first)
    if plan is None:
        return wrapped(*args, **kwargs)

    stats["numpy_loops"] += 1

    def step(fkw):
        logits = _fused_logits(instance, plan, fkw)[0]
        return logits if isinstance(logits, np.ndarray) else _hostcall.host(logits)

    return _gen.sample_loop(step, ids, head["logits_processor"], head["stopping_criteria"], head["generation_config"],
                            head["streamer"], kw, kw["past_key_values"])
