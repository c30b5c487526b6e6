"""Perplexity of transformers' path, fused vs unfused, on the same model and held-out windows (issue 31's bar).

    .venv/bin/python tools/fused_ppl_check.py [--windows 8] [--dtype fp32|auto]

SmolLM2-135M (tools/bench_model.py's checkpoint), quantized by ``from_pretrained(quantization_config=...)``: the
tutorial's NF4 config (double quant, bf16 compute) and LLM.int8(); each model's perplexity on ``--windows``
256-token windows of the embedded held-out text, first fused (the default on the first forward), then after
``fuse(model, False)``. ``--dtype auto`` passes no dtype (transformers then loads the rest in fp16, as tutorials do).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_model as b  # noqa: E402

import mindspore as ms  # noqa: E402

ms.set_device("CPU")
ms.runtime.launch_blocking()
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

import bitsandbytes_ms as bnb  # noqa: E402

bnb.register()
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

from bitsandbytes_ms.integrations import fuse, is_fused  # noqa: E402
from bitsandbytes_ms.integrations.evaluate import run_windows  # noqa: E402


def perplexity(model, windows) -> float:
    return run_windows(model, [np.asarray(w) for w in windows], keep_logits=False).perplexity


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--dtype", choices=["fp32", "auto"], default="fp32")
    args = ap.parse_args()
    hf = b.smollm2_hf()
    windows = b.token_inputs(hf, 512, args.windows, 256)["ppl_windows"]
    kw = {"dtype": torch.float32} if args.dtype == "fp32" else {}
    configs = [("nf4 (double quant, bf16 compute)",
                BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16)),
               ("int8 (threshold 6)", BitsAndBytesConfig(load_in_8bit=True))]
    for name, cfg in configs:
        m = AutoModelForCausalLM.from_pretrained(str(hf), quantization_config=cfg, **kw).eval()
        fused = perplexity(m, windows)
        assert is_fused(m), "the model did not fuse"
        fuse(m, False)
        unfused = perplexity(m, windows)
        print(f"{name}: fused {fused:.4f}, unfused {unfused:.4f}, {100 * (fused / unfused - 1):+.3f}% "
              f"({args.windows} x 256 tokens, dtype {args.dtype})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
