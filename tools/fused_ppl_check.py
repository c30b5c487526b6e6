"""Perplexity of transformers' path, fused vs unfused, on the same model and held-out windows (issue 31's bar).

    .venv/bin/python tools/fused_ppl_check.py [--windows 8] [--dtype fp32|auto] [--perturb 0] [--modes nf4,int8]

SmolLM2-135M (tools/bench_model.py's checkpoint), quantized by ``from_pretrained(quantization_config=...)``: the
tutorial's NF4 config (double quant, bf16 compute) and LLM.int8(); each model's perplexity on ``--windows``
256-token windows of the embedded held-out text, first fused (the default on the first forward), then after
``fuse(model, False)``. ``--dtype auto`` passes no dtype (transformers then loads the rest in fp16, as tutorials do).

``--perturb N`` also scores both paths on N copies of the model whose embedding table (tied to the lm_head), or
with ``--perturb-what norms`` every RMSNorm weight, is moved by +-1 ulp with random signs (seeds 1..N) and
reports the means. Why: an int8 model amplifies 1-ulp
differences between layers (an input moves an int8 code, or a column across the outlier threshold), so the fused
path, whose norms/attention round differently from mindtorch's ops, lands at a different point of the unfused
model's own spread; one pair of perplexities measures that spread as much as any bias. The mean over perturbations
of fused/unfused - 1 is the paired estimate of the bias, and the per-seed unfused values show the spread itself.

``--perturb-inputs N`` scores the unfused model N more times with the inputs of its o_proj and down_proj layers
moved by +-1 ulp (random signs, seeds 1..N; a forward pre-hook): rounding changes inside the network, like the
fused path's, which with threshold > 0 can move a column across the outlier threshold (an embedding perturbation
rarely does). It reports that spread and where the fused perplexity lies in it.
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


def pair(model, windows) -> tuple:
    """(fused, unfused) perplexity of the model's current weights; leaves it fused."""
    fuse(model, True)
    fused = perplexity(model, windows)
    assert is_fused(model), "the model did not fuse"
    fuse(model, False)
    unfused = perplexity(model, windows)
    fuse(model, True)
    return fused, unfused


def _targets(model, what: str) -> list:
    """The parameters a perturbation moves: the embedding table, or every RMSNorm weight."""
    if what == "embedding":
        return [model.get_input_embeddings().weight]
    return [p for n, p in model.named_parameters() if n.endswith("norm.weight")]


def perturb(model, params, bases, seed: int) -> None:
    """Set each of ``params`` to its base moved by one ulp per element, random signs (seed)."""
    rng = np.random.default_rng(seed)
    fuse(model, False)  # the fused plan holds copies of these tensors: rebuild it from the new ones
    for p, base in zip(params, bases):
        up = rng.integers(0, 2, base.shape).astype(bool)
        moved = np.where(up, np.nextafter(base, np.inf), np.nextafter(base, -np.inf)).astype(base.dtype)
        p.data.copy_(torch.tensor(moved))


def input_spread(model, windows, n: int) -> list:
    """Unfused perplexities with o_proj / down_proj inputs moved by +-1 ulp (seeds 1..n)."""
    fuse(model, False)
    out = []
    for seed in range(1, n + 1):
        rng = np.random.default_rng(seed)

        def nudge(mod, args):
            x = args[0].numpy()
            up = rng.integers(0, 2, x.shape).astype(bool)
            moved = np.where(up, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)).astype(x.dtype)
            return (torch.tensor(moved),) + tuple(args[1:])

        hooks = [m.register_forward_pre_hook(nudge) for name, m in model.named_modules()
                 if name.endswith(("o_proj", "down_proj"))]
        try:
            out.append(perplexity(model, windows))
        finally:
            for h in hooks:
                h.remove()
        print(f"  unfused, o_proj/down_proj inputs +-1 ulp, seed {seed}: {out[-1]:.4f}", flush=True)
    fuse(model, True)
    return out


def report(name: str, args, model, windows) -> None:
    fused, unfused = pair(model, windows)
    print(f"{name}: fused {fused:.4f}, unfused {unfused:.4f}, {100 * (fused / unfused - 1):+.3f}% "
          f"({args.windows} x 256 tokens, dtype {args.dtype})", flush=True)
    if args.perturb_inputs:
        u = np.array([unfused] + input_spread(model, windows, args.perturb_inputs))
        print(f"  unfused spread over {len(u)} runs: mean {u.mean():.4f}, sd {100 * u.std(ddof=1) / u.mean():.3f}%, "
              f"range {u.min():.4f} .. {u.max():.4f}; fused {fused:.4f} = mean {100 * (fused / u.mean() - 1):+.3f}% "
              f"({(fused - u.mean()) / u.std(ddof=1):+.2f} sd)", flush=True)
    if not args.perturb:
        return
    params = _targets(model, args.perturb_what)
    bases = [p.data.numpy().copy() for p in params]
    rel = [fused / unfused - 1]
    unf = [unfused]
    for seed in range(1, args.perturb + 1):
        perturb(model, params, bases, seed)
        f, u = pair(model, windows)
        rel.append(f / u - 1)
        unf.append(u)
        print(f"  {args.perturb_what} +-1 ulp, seed {seed}: fused {f:.4f}, unfused {u:.4f}, {100 * (f / u - 1):+.3f}%",
              flush=True)
    sd = 100 * np.std(unf, ddof=1) / np.mean(unf)
    print(f"  mean of fused/unfused - 1 over {len(rel)} models: {100 * np.mean(rel):+.3f}% "
          f"(sd of one pair {100 * np.std(rel, ddof=1):.3f}%, of the mean {100 * np.std(rel, ddof=1) / np.sqrt(len(rel)):.3f}%); "
          f"unfused perplexity's own spread: sd {sd:.3f}%, range {min(unf):.4f} .. {max(unf):.4f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--dtype", choices=["fp32", "auto"], default="fp32")
    ap.add_argument("--perturb", type=int, default=0, help="also score N +-1-ulp perturbations of the embedding")
    ap.add_argument("--perturb-what", choices=["embedding", "norms"], default="embedding",
                    help="what --perturb moves: the embedding table (tied to the lm_head) or every RMSNorm weight")
    ap.add_argument("--perturb-inputs", type=int, default=0,
                    help="also score the unfused model N times with o_proj/down_proj inputs moved by +-1 ulp")
    ap.add_argument("--modes", default="nf4,int8", help="comma-separated, from nf4, int8, int8-t0")
    args = ap.parse_args()
    hf = b.smollm2_hf()
    windows = b.token_inputs(hf, 512, args.windows, 256)["ppl_windows"]
    kw = {"dtype": torch.float32} if args.dtype == "fp32" else {}
    configs = {"nf4": ("nf4 (double quant, bf16 compute)",
                       BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                          bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)),
               "int8": ("int8 (threshold 6)", BitsAndBytesConfig(load_in_8bit=True)),
               "int8-t0": ("int8 (threshold 0)", BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=0.0))}
    for mode in args.modes.split(","):
        name, cfg = configs[mode]
        m = AutoModelForCausalLM.from_pretrained(str(hf), quantization_config=cfg, **kw).eval()
        report(name, args, m, windows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
