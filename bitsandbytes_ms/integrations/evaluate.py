"""Measurements the ``bnb-ms quantize`` job reports: weight memory, held-out perplexity, agreement of
logits with the unquantized model, and generation speed. Works on any mindnlp causal LM."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

from ..utils import ITEMSIZES


def _nbytes(t) -> int:
    """Bytes of a tensor's elements (mindtorch's ``nbytes`` fails for int8)."""
    if t is None:
        return 0
    return int(np.prod(t.shape)) * ITEMSIZES[t.dtype]


def quant_state_bytes(qs) -> int:
    """Bytes held by a QuantState (absmax, code, nested state)."""
    if qs is None:
        return 0
    total = _nbytes(getattr(qs, "absmax", None)) + _nbytes(getattr(qs, "code", None))
    if getattr(qs, "state2", None) is not None:
        total += quant_state_bytes(qs.state2) + 4  # + the fp32 offset
    return total


def weight_memory(model) -> int:
    """Bytes of all parameters and buffers, counting quantized weights at their stored size plus their
    scales (``SCB`` of Int8Params, the QuantState of Params4bit); parameters shared between modules
    (tied weights) are counted once."""
    seen = set()
    total = 0
    for _, module in model.named_modules():
        for p in list(module._parameters.values()) + list(module._buffers.values()):
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            total += _nbytes(p)
            total += _nbytes(getattr(p, "SCB", None))
            total += quant_state_bytes(getattr(p, "quant_state", None))
    return total


def parameter_count(model) -> int:
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += int(np.prod(p.shape))
    return n


def eval_windows(tokenizer, text: str, window: int, max_windows: int) -> List[np.ndarray]:
    """Splits ``text`` into up to ``max_windows`` consecutive token windows of ``window`` tokens."""
    ids = tokenizer(text, return_tensors=None)["input_ids"]
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    n = min(max_windows, max(1, len(ids) // window))
    return [ids[i * window:(i + 1) * window] for i in range(n) if len(ids[i * window:(i + 1) * window]) > 1]


@dataclass
class LogitStats:
    nll_sum: float = 0.0
    n_tokens: int = 0
    logits: List[np.ndarray] = field(default_factory=list)
    #: seconds of each window's forward pass (the model call and the logits' copy to the host)
    forward_seconds: List[float] = field(default_factory=list)
    window_tokens: List[int] = field(default_factory=list)
    #: scored positions whose logits hold a NaN or an infinity (their NLL, and so the perplexity, is NaN)
    nonfinite_positions: int = 0

    @property
    def perplexity(self) -> float:
        """exp(mean NLL): NaN when a scored position's logits are not finite, inf when the exponent overflows."""
        try:
            return math.exp(self.nll_sum / max(self.n_tokens, 1))
        except OverflowError:
            return math.inf

    @property
    def prefill_tokens_per_second(self) -> Optional[float]:
        """Tokens per second of a forward pass over a whole window (a prefill): the median over the windows,
        leaving out the first when there are more (it also warms up kernels for that shape)."""
        pairs = list(zip(self.window_tokens, self.forward_seconds))
        if not pairs:
            return None
        pairs = pairs[1:] if len(pairs) > 1 else pairs
        return statistics.median(n / t for n, t in pairs if t > 0) if any(t > 0 for _, t in pairs) else None


def run_windows(model, windows: List[np.ndarray], keep_logits: bool = True, progress=None) -> LogitStats:
    """Forward each window; accumulate next-token NLL; optionally keep fp32 logits (numpy)."""
    import torch  # mindtorch (after import mindnlp)

    stats = LogitStats()
    it = windows if progress is None else progress(windows)
    with torch.no_grad():
        for w in it:
            ids = torch.tensor(w[None, :])
            t0 = time.perf_counter()
            logits = model(ids).logits
            lg = logits.float().asnumpy()[0] if hasattr(logits, "asnumpy") else np.asarray(logits)[0]
            stats.forward_seconds.append(time.perf_counter() - t0)
            stats.window_tokens.append(len(w))
            lg = lg.astype(np.float64)
            m = lg.max(axis=-1, keepdims=True)
            logp = lg - m - np.log(np.exp(lg - m).sum(axis=-1, keepdims=True))
            tgt = w[1:]
            stats.nll_sum += float(-logp[np.arange(len(tgt)), tgt].sum())
            stats.n_tokens += len(tgt)
            stats.nonfinite_positions += int((~np.isfinite(lg[:-1])).any(axis=-1).sum())
            if keep_logits:
                stats.logits.append(lg[:-1].astype(np.float32))
    return stats


def compare_logits(ref: LogitStats, new: LogitStats) -> dict:
    """Top-1 agreement and max/mean absolute logit error of ``new`` against ``ref``."""
    a = np.concatenate(ref.logits)
    b = np.concatenate(new.logits)
    err = np.abs(a - b)
    return {"top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()),
            "max_abs_logit_err": float(err.max()), "mean_abs_logit_err": float(err.mean())}


class _TokenTimes:
    """A transformers streamer that records when each token arrives (the first ``put`` is the prompt)."""

    def __init__(self):
        self.times: List[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


@dataclass
class Generation:
    text: str
    new_tokens: int
    seconds: float                    #: the whole ``generate`` call
    first_token_seconds: Optional[float] = None  #: from the call to the first new token (prefill of the prompt)
    decode_seconds: Optional[float] = None       #: from the first to the last new token

    @property
    def decode_tokens_per_second(self) -> Optional[float]:
        """New tokens after the first, per second of decoding (None with fewer than 2 new tokens)."""
        if self.new_tokens < 2 or not self.decode_seconds:
            return None
        return (self.new_tokens - 1) / self.decode_seconds


def generate_timed(model, tokenizer, prompt: str, max_new_tokens: int, min_new_tokens: Optional[int] = None
                   ) -> Generation:
    """Greedy continuation of ``prompt``, timed per token (time to first token, then decode speed)."""
    import torch

    enc = tokenizer(prompt, return_tensors="pt")
    ids = enc["input_ids"]
    st = _TokenTimes()
    kw = {} if min_new_tokens is None else {"min_new_tokens": min_new_tokens}
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=enc.get("attention_mask"), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                             streamer=st, **kw)
    dt = time.perf_counter() - t0
    out_ids = np.asarray(out.asnumpy() if hasattr(out, "asnumpy") else out)[0]
    new = out_ids[ids.shape[1]:]
    tok = st.times[1:]
    return Generation(tokenizer.decode(new, skip_special_tokens=True), len(new), dt,
                      first_token_seconds=(tok[0] - t0) if tok else None,
                      decode_seconds=(tok[-1] - tok[0]) if len(tok) > 1 else None)


def generate(model, tokenizer, prompt: str, max_new_tokens: int):
    """Greedy continuation; returns (text, new_tokens, seconds)."""
    g = generate_timed(model, tokenizer, prompt, max_new_tokens)
    return g.text, g.new_tokens, g.seconds
