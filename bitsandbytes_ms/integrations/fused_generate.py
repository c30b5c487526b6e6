"""generate's sampling loop for a fused model, in numpy (issue 32: "a decode step with fewer framework ops around the
model").

Why: after the fused forward, the rest of transformers' ``GenerationMixin._sample`` step is ~35 mindtorch ops (the
last position's logits copied out, the logits processors, argmax, the EOS arithmetic, the input_ids and attention
mask concatenations, the cache position, the stopping criteria, ``unfinished.max() == 0``), each a MindSpore
PyNative launch: 5-7 ms of a 21 ms SmolLM2 decode step on the 2-core Xeon measured, the same as the model's MLPs.
A fused model's logits are a host array already, so the same bookkeeping runs here in numpy.

What it keeps: the loop is transformers 4.57's ``_sample`` step for step (greedy and sampling, EOS with the pad
token filling finished rows, batches with left padding, streamers, ``return_dict_in_generate`` with scores and
logits). Logits processors and stopping criteria run as transformers' own objects on tensors, except the ones whose
numpy form here gives the same values by construction (the min-length processors set the EOS columns to -inf; the
max-length and EOS criteria compare integers); sampling draws from the same probabilities (:func:`draw`; mindtorch's
draws are not reproducible by ``torch.manual_seed`` in transformers' loop either, measured). Anything this loop does not take
(``fused.py`` decides: an unfused model, attention or hidden-state outputs, synced GPUs, prefill chunking,
``inputs_embeds``, extra model inputs) runs transformers' loop unchanged.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

from .. import _hostcall

#: model_kwargs the numpy loop understands; any other key runs transformers' loop
LOOP_KWARGS = frozenset({"attention_mask", "past_key_values", "use_cache", "cache_position", "logits_to_keep",
                         "output_attentions", "output_hidden_states", "return_dict"})


def positions(mask: np.ndarray, n: int) -> np.ndarray:
    """position_ids of the last ``n`` tokens as transformers makes them from a 2-D attention mask: cumsum - 1, and
    1 where the mask is 0 (left padding)."""
    pos = np.cumsum(mask.astype(np.int64), axis=-1) - 1
    pos[mask == 0] = 1
    return np.ascontiguousarray(pos[:, pos.shape[1] - n:])


def _host_ids(t) -> np.ndarray:
    return np.asarray(_hostcall.host(t)).astype(np.int64).reshape(-1)


class _Processors:
    """A LogitsProcessorList applied to [B, V] float32 scores: numpy for the min-length processors (EOS columns to
    -inf while too short: exactly what torch.where does), the processor itself on tensors for every other."""

    def __init__(self, procs):
        from transformers.generation import logits_process as lp

        self.steps = []
        for p in procs:
            kind = type(p)
            if kind is lp.MinNewTokensLengthLogitsProcessor:
                self.steps.append(("min", p.prompt_length_to_skip + p.min_new_tokens, _host_ids(p.eos_token_id)))
            elif kind is lp.MinLengthLogitsProcessor:
                self.steps.append(("min", p.min_length, _host_ids(p.eos_token_id)))
            else:
                self.steps.append(("torch", p, None))

    def __call__(self, ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for kind, a, eos in self.steps:
            if kind == "min":
                if ids.shape[-1] < a:
                    scores[:, eos[(eos >= 0) & (eos < scores.shape[-1])]] = -np.inf
            else:
                out = a(_hostcall.wrap(np.ascontiguousarray(ids)), _hostcall.wrap(scores))
                scores = np.array(_hostcall.host(out), np.float32)
        return scores


class _Stopping:
    """A StoppingCriteriaList: numpy for the max-length and EOS criteria, the criterion itself on tensors for every
    other (and for max length past the model's positions, where transformers warns)."""

    def __init__(self, crits):
        from transformers.generation import stopping_criteria as sc

        self.steps = []
        for c in crits:
            kind = type(c)
            if kind is sc.MaxLengthCriteria:
                self.steps.append(("max", c))
            elif kind is sc.EosTokenCriteria:
                self.steps.append(("eos", _host_ids(c.eos_token_id)))
            elif kind is sc.MaxTimeCriteria:
                self.steps.append(("time", c))
            else:
                self.steps.append(("torch", c))
        self.has_eos = any(hasattr(c, "eos_token_id") for c in crits)

    def __call__(self, ids: np.ndarray, scores) -> np.ndarray:
        done = np.zeros(ids.shape[0], bool)
        for kind, c in self.steps:
            if kind == "max" and (c.max_position_embeddings is None or ids.shape[1] <= c.max_position_embeddings
                                  or ids.shape[1] >= c.max_length):
                done |= ids.shape[1] >= c.max_length
            elif kind == "eos":
                done |= np.isin(ids[:, -1], c)
            elif kind == "time":
                done |= time.time() - c.initial_timestamp > c.max_time
            else:
                done |= np.asarray(_hostcall.host(c(_hostcall.wrap(np.ascontiguousarray(ids)), scores))).astype(bool)
        return done


def draw(scores: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One token per row from softmax(scores) by the inverse CDF at ``u`` (uniform [0, 1) per row, from torch's
    generator): the distribution of transformers' softmax + torch.multinomial, never a token of probability 0 (what
    top-k / top-p filtered), with one mindtorch op instead of two."""
    z = scores.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    cdf = np.cumsum(np.exp(z), axis=-1)
    total = cdf[:, -1]
    if not np.all(np.isfinite(total)) or np.any(total <= 0):
        raise RuntimeError("generate: probability tensor contains either `inf`, `nan` or element < 0")
    idx = [np.searchsorted(cdf[b], u[b] * total[b], side="right") for b in range(cdf.shape[0])]
    return np.minimum(np.array(idx, np.int64), scores.shape[-1] - 1)


def sample_loop(step: Callable[[dict], np.ndarray], input_ids, logits_processor, stopping_criteria, generation_config,
                streamer, model_kwargs: dict, past_key_values):
    """transformers' ``_sample`` for a decoder-only model whose forward is ``step(kw) -> logits`` ([B, T, V] host
    float32, the last position's row used); ``model_kwargs`` as ``_sample`` receives it (cache position set)."""
    import torch
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    gc = generation_config
    ids0 = np.asarray(_hostcall.host(input_ids)).astype(np.int64)
    B, L0 = ids0.shape
    buf = np.empty((B, max(gc.max_length or 0, L0) + 1), np.int64)  # max_length counts the prompt
    buf[:, :L0] = ids0
    am = model_kwargs.get("attention_mask")
    mbuf = None
    if am is not None:
        mbuf = np.ones((B, buf.shape[1]), np.int64)
        mbuf[:, :L0] = np.asarray(_hostcall.host(am)).astype(np.int64)
    cp = np.asarray(_hostcall.host(model_kwargs["cache_position"])).astype(np.int64).reshape(-1)
    keep = model_kwargs.get("logits_to_keep")
    procs, stop = _Processors(logits_processor), _Stopping(stopping_criteria)
    pad = gc._pad_token_tensor
    pad = int(_host_ids(pad)[0]) if pad is not None else None
    want_scores = gc.return_dict_in_generate and gc.output_scores
    want_logits = gc.return_dict_in_generate and gc.output_logits
    scores_out, logits_out = (), ()
    unfinished = np.ones(B, np.int64)
    L = L0
    while True:
        ids = buf[:, :L]
        n = cp.shape[0]
        tok = ids[:, L - n:] if cp[-1] >= L - 1 else ids[:, cp]
        kw = {"input_ids": np.ascontiguousarray(tok), "past_key_values": past_key_values, "cache_position": cp,
              "use_cache": True, "logits_to_keep": keep}
        if mbuf is not None:
            kw["attention_mask"] = mbuf[:, :L]
            kw["position_ids"] = positions(mbuf[:, :L], tok.shape[1])
        logits = np.array(step(kw)[:, -1, :], np.float32)  # a copy: the next step reuses the forward's buffer
        cp = cp[-1:] + 1
        scores = procs(ids, logits if not want_logits else logits.copy())
        if want_scores:
            scores_out += (_hostcall.wrap(scores.copy()),)
        if want_logits:
            logits_out += (_hostcall.wrap(logits),)
        if gc.do_sample:
            nxt = draw(scores, np.asarray(_hostcall.host(torch.rand(B)), np.float64).reshape(-1))
        else:
            nxt = np.argmax(scores, axis=-1).astype(np.int64)
        if stop.has_eos:
            nxt = nxt * unfinished + pad * (1 - unfinished)
        if L >= buf.shape[1]:  # max_length unset or a criterion that runs longer: grow
            buf = np.concatenate([buf, np.empty_like(buf)], axis=1)
            if mbuf is not None:
                mbuf = np.concatenate([mbuf, np.ones_like(mbuf)], axis=1)
        buf[:, L] = nxt
        L += 1
        if streamer is not None:
            streamer.put(_hostcall.wrap(nxt.copy()))
        unfinished &= ~stop(buf[:, :L], scores_out if want_scores else None)
        if unfinished.max() == 0:
            break
    if streamer is not None:
        streamer.end()
    seq = _hostcall.wrap(np.ascontiguousarray(buf[:, :L]))
    if gc.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(sequences=seq, scores=scores_out if want_scores else None,
                                         logits=logits_out if want_logits else None, attentions=None,
                                         hidden_states=None, past_key_values=past_key_values)
    return seq


def loop_reason(generation_config, synced_gpus, model_kwargs, is_encoder_decoder) -> Optional[str]:
    """Why the numpy loop cannot run this generation (transformers' loop does), or None."""
    gc = generation_config
    if is_encoder_decoder:
        return "encoder-decoder"
    if synced_gpus:
        return "synced_gpus"
    if gc.output_attentions or gc.output_hidden_states:
        return "attention / hidden-state outputs"
    if getattr(gc, "prefill_chunk_size", None) is not None:
        return "prefill chunking"
    if model_kwargs.get("use_cache") is False or model_kwargs.get("past_key_values") is None:
        return "no cache"
    extra = set(model_kwargs) - LOOP_KWARGS
    if extra:
        return f"model inputs {sorted(extra)}"
    am = model_kwargs.get("attention_mask")
    if am is not None and len(am.shape) != 2:
        return "a non-2-D attention mask"
    return None
