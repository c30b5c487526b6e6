"""How a fused fp16/bf16 model should carry its hidden states between layer halves (issue 13): measured, not
guessed. Written for, and run at, the commit that added it; the option it compares was then removed
(README "fused decoder": fp32 hidden states were kept; see the numbers there).

For small random Llama / Qwen2 / Mistral / Qwen3 models cast to fp16 or bf16 and quantized (int8 threshold 6,
NF4 compute fp16/bf16, or left in full precision; o_proj/down_proj/lm_head kept in the model's dtype), compares
max|dlogit| / max|logit| over the prompt's non-pad positions and 8 greedy steps (batch 2, left padding) of
  * unfused: the quantized 16-bit model's own forward (fp16 only: MindSpore's CPU gather has no bf16);
  * fused-T: the fused path with hidden states rounded to the model's dtype at every layer half's output;
  * fused-32: the fused path with fp32 hidden states (no rounding between layers);
  * truth: the same weights (16-bit values) run unfused in fp32.

    .venv/bin/python tools/fused_hidden_dtype.py [--families llama,qwen2,mistral,qwen3] [--dtypes fp16,bf16]
"""
import argparse
import os
import sys

import numpy as np
import mindspore as ms

ms.set_device("CPU")
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_fused_decoder as T  # noqa: E402  (its small configs, random weights and prompts)

from bitsandbytes_ms import _hostcall as HC  # noqa: E402
from bitsandbytes_ms.integrations import fuse, quant_4bit, quant_8bit, unfuse  # noqa: E402
from bitsandbytes_ms import _hostcall as HC  # noqa: E402
from bitsandbytes_ms.integrations import fused as FU  # noqa: E402

KEEP = ["o_proj", "down_proj", "lm_head"]


def run(m):
    with torch.no_grad():
        p = m(torch.tensor(T.IDS), attention_mask=torch.tensor(T.MASK)).logits.asnumpy().astype(np.float32)
    tok, lg = T._generate(m)
    return p, tok, lg.astype(np.float32)


def err(a, b):
    ok = T.MASK.astype(bool)
    return max(np.abs(a[0] - b[0])[ok].max(), np.abs(a[2] - b[2]).max()) / np.abs(b[2]).max()


def build(fam, mode, dt):
    m = T._model(T._cfg(fam), quant=False)
    if dt == torch.float32:  # the truth: the 16-bit weight values, computed in fp32
        for p in m.parameters():
            p.data.copy_(torch.tensor(p.asnumpy().astype(HC.np_dtype(build.src)).astype(np.float32)))
    else:
        m = m.to(dt)
    cd = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dt]
    if mode == "int8":
        quant_8bit(m, threshold=6.0, progress=False, modules_to_not_convert=KEEP)
    elif mode == "nf4":
        quant_4bit(m, compute_dtype=cd, progress=False, modules_to_not_convert=KEEP)
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="llama,qwen2,mistral,qwen3")
    ap.add_argument("--dtypes", default="fp16,bf16")
    a = ap.parse_args()
    print("| dtype | model | mode | unfused vs truth | fused-T vs truth | fused-32 vs truth | fused-T vs unfused "
          "| fused-32 vs unfused | same greedy tokens (unfused / T / 32 vs truth) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dts in a.dtypes.split(","):
        dt = torch.float16 if dts == "fp16" else torch.bfloat16
        build.src = ms.float16 if dts == "fp16" else ms.bfloat16
        for fam in a.families.split(","):
            for mode in ("int8", "nf4", "fp"):
                truth = run(build(fam, mode, torch.float32))
                m = build(fam, mode, dt)
                u = run(m) if dt == torch.float16 else None
                f = {}
                for key, hid in (("T", None), ("32", ms.float32)):
                    FU._hidden_override = hid
                    assert fuse(m)
                    f[key] = run(m)
                    unfuse(m)
                FU._hidden_override = None
                same = lambda r: "-" if r is None else ("yes" if (r[1] == truth[1]).all() else "no")  # noqa: E731
                cell = lambda r, ref: "-" if r is None or ref is None else f"{err(r, ref):.2e}"  # noqa: E731
                print(f"| {dts} | {fam} | {mode} | {cell(u, truth)} | {cell(f['T'], truth)} | {cell(f['32'], truth)} "
                      f"| {cell(f['T'], u)} | {cell(f['32'], u)} | {same(u)} / {same(f['T'])} / {same(f['32'])} |",
                      flush=True)


if __name__ == "__main__":
    main()
