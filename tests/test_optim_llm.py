"""A tiny mindnlp Llama causal LM trained with bnb AdamW (32-bit state) vs AdamW8bit (blockwise 8-bit
state) on the same fixed token data: both losses fall, the two loss curves agree, and the 8-bit
optimizer state is about a quarter of the 32-bit one (plus one float32 absmax per 256 values).

Gradients come from mindtorch's ``torch.autograd.value_and_grad`` (``loss.backward()`` is a no-op
there) with the ``mindtorch-same-device-move`` patch applied; without it gradients through the
model's subtractions come back as zeros.

The model is built once and its initial weights (fixed numpy values: mindtorch's CPU ``randn``
ignores seeds) are written back before each run, so both optimizers start from identical weights.

Tolerances were measured first (lr 2e-3, weight decay 0.01, 8 sequences of 32 tokens, hidden 64,
2 layers, vocab 256; ~0.5 s per step pair with launch_blocking on 2 shared cores):
  30 steps:  loss 5.553 -> 1.570 for both; max |loss32 - loss8| 1.6e-3, max relative 5.4e-4.
  60 steps:  loss 5.553 -> 0.129 / 0.127; max gap 3.2e-3, max relative 1.6e-2 (at the small losses).
  150 steps: loss 5.553 -> 0.017 for both; max |loss32 - loss8| 3.2e-3 (relative 1.6e-2 near the
  end, where the losses are tiny, so the long run checks absolute gaps).
The bounds below are those measurements with a 3-6x margin.
"""

import time

import numpy as np
import pytest

import mindnlp  # noqa: F401,E402  (requirements-lock.txt installs it: a missing one is a broken set-up, not a skip)
import torch  # noqa: E402  (mindtorch, after `import mindnlp`)
import mindspore  # noqa: E402

from bitsandbytes_ms.integrations import mindtorch_patches  # noqa: E402,F401  (registers the patches)
from bitsandbytes_ms.integrations.patches import registry  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402

VOCAB = 256


@pytest.fixture(scope="module")
def lm():
    registry.apply()
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=VOCAB, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).float()
    rng = np.random.RandomState(0)
    init = {}
    for name, p in model.named_parameters():
        init[name] = (np.ones(p.shape, np.float32) if "norm" in name
                      else rng.randn(*p.shape).astype(np.float32) * 0.02)
    # fixed token data: 8 sequences of 33 tokens from a few interleaved arithmetic patterns
    seq = np.stack([(np.arange(33) * (3 + 2 * r) + 5 * r) % 97 for r in range(8)]).astype(np.int64)
    ids, labels = torch.tensor(seq[:, :-1]), torch.tensor(seq[:, 1:])
    return model, init, ids, labels


def _train(lm, cls, steps, lr=2e-3):
    model, init, ids, labels = lm
    for name, p in model.named_parameters():
        p.assign_value(mindspore.Tensor(init[name].copy()))
        assert np.array_equal(p.asnumpy(), init[name])
    params = list(model.parameters())
    opt = cls(params, lr=lr, weight_decay=0.01)

    def loss_fn(ids, labels):
        logits = model(input_ids=ids).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))

    value_and_grad = torch.autograd.value_and_grad(loss_fn, params, attach_grads=False)
    losses = []
    for _ in range(steps):
        loss, grads = value_and_grad(ids, labels)
        opt.step(grads=list(grads))
        losses.append(float(loss.asnumpy()))
    return np.array(losses), opt


def _compare(lm, steps):
    t0 = time.time()
    l32, o32 = _train(lm, bnb.optim.AdamW, steps)
    l8, o8 = _train(lm, bnb.optim.AdamW8bit, steps)
    gap = np.abs(l32 - l8)
    print(f"\n{steps} steps in {time.time() - t0:.1f}s: loss32 {l32[0]:.4f}->{l32[-1]:.4f}, "
          f"loss8 {l8[0]:.4f}->{l8[-1]:.4f}, max gap {gap.max():.2e}, max rel gap {(gap / l32).max():.2e}")
    assert l32[0] == l8[0]  # same initial weights, same data
    assert abs(l32[0] - np.log(VOCAB)) < 0.1  # near-uniform prediction at init
    return l32, l8, o32, o8


def _state_bytes(opt):
    """(8-bit bytes, absmax bytes, 32-bit bytes) of the per-parameter states."""
    b8 = ba = b32 = 0
    for st in opt.state.values():
        for key, v in st.items():
            if not isinstance(v, mindspore.Tensor) or key.startswith("qmap"):
                continue
            n = int(np.prod(v.shape))
            if v.dtype == mindspore.uint8:
                b8 += n
            elif key.startswith("absmax"):
                ba += 4 * n
            else:
                b32 += 4 * n
    return b8, ba, b32


def test_llm_adamw_vs_adamw8bit(lm):
    l32, l8, o32, o8 = _compare(lm, 50)
    for losses in (l32, l8):
        assert losses[-1] < 0.5 * losses[0], losses  # substantial decrease
        assert np.all(np.isfinite(losses))
    gap = np.abs(l32 - l8)
    assert gap.max() < 1.5e-2, gap  # measured 3.2e-3 (60 steps)
    assert (gap / l32).max() < 5e-2, gap / l32  # measured 1.6e-2 (60 steps)
    assert (gap / l32)[:30].max() < 3e-3, gap / l32  # measured 5.4e-4 (first 30 steps)

    # optimizer state: the 32-bit run holds two float32 states per parameter
    n_total = sum(int(np.prod(p.shape)) for p in lm[0].parameters())
    n_big = sum(int(np.prod(p.shape)) for p in lm[0].parameters() if int(np.prod(p.shape)) >= 4096)
    s8, sabs, s32_small = _state_bytes(o8)
    _, _, s32 = _state_bytes(o32)
    assert s32 == 8 * n_total
    assert s8 == 2 * n_big  # one byte per value for both states of every tensor >= min_8bit_size
    assert sabs == 2 * 4 * sum(-(-int(np.prod(p.shape)) // 256) for p in lm[0].parameters()
                               if int(np.prod(p.shape)) >= 4096)
    assert s32_small == 8 * (n_total - n_big)  # small tensors (norms) keep 32-bit state
    ratio = (s8 + sabs) / (8 * n_big)
    assert 0.25 < ratio < 0.26, ratio  # 25% + absmax (4 bytes per 256 values per state)
    total_ratio = bnb.optim.optimizer_state_bytes(o8) / bnb.optim.optimizer_state_bytes(o32)
    assert total_ratio < 0.27, total_ratio


@pytest.mark.slow
def test_llm_adamw_vs_adamw8bit_long(lm):
    l32, l8, _, _ = _compare(lm, 200)
    for losses in (l32, l8):
        assert losses[-1] < 0.05 * losses[0], losses
    gap = np.abs(l32 - l8)
    assert gap.max() < 2e-2, gap  # measured 3.2e-3 (150 steps)
    # the curves stay together: mean gap over the last 50 steps well below the loss decrease
    assert gap[-50:].mean() < 0.01 * (l32[0] - l32[-1])
