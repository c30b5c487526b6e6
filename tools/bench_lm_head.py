"""Benchmark of the full-precision layer a quantized model keeps (lm_head): bitsandbytes_ms.nn.LinearFP (native
cgemm_fp_* through the host-call bridge) against mindtorch's nn.Linear (MindSpore's `dense`) and MindSpore's
MatMul(transpose_b=True), on SmolLM2-135M's lm_head shape (576 -> 49152), in one process with the variants
measured in alternating rounds (the machine is shared: medians and minima of the rounds are reported).

    .venv/bin/python tools/bench_lm_head.py                      # lm_head 1 x 576 -> 49152, fp32/bf16/fp16
    .venv/bin/python tools/bench_lm_head.py --sweep              # + rows of A: native kernel vs MatMul (crossover)
    .venv/bin/python tools/bench_lm_head.py --decode             # + one decode step of a random SmolLM2-135M-shaped
                                                                 #   model, quantized (nf4), lm_head nn.Linear vs LinearFP
                                                                 #   (--decode-model embedded: the embedded model)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
import mindspore as ms  # noqa: E402

ms.set_device("CPU")
ms.runtime.launch_blocking()
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402

from bitsandbytes_ms import _ops, functional as F  # noqa: E402,F401
from bitsandbytes_ms.cextension import lib  # noqa: E402
from bitsandbytes_ms.nn import LinearFP  # noqa: E402

K, N = 576, 49152


def rounds(variants, n_rounds, inner=1):
    """variants: name -> zero-argument callable returning something to force. Returns name -> list of ms."""
    res = {k: [] for k in variants}
    for f in variants.values():  # warm-up (first calls build caches / kernels)
        _force(f())
    for _ in range(n_rounds):
        for k, f in variants.items():
            t = time.perf_counter()
            for _ in range(inner):
                r = f()
            _force(r)
            res[k].append((time.perf_counter() - t) / inner * 1e3)
    return res


def _force(r):
    if isinstance(r, (tuple, list)):
        r = r[0]
    if hasattr(r, "asnumpy"):
        r.asnumpy()
    elif hasattr(r, "logits"):
        r.logits.asnumpy()


def show(title, res):
    print(f"\n{title}")
    for k, v in res.items():
        if not v:
            print(f"  {k:<44} n/a")
            continue
        print(f"  {k:<44} median {statistics.median(v):9.2f} ms   min {min(v):9.2f} ms   ({len(v)} rounds)")


def lm_head(n_rounds):
    rng = np.random.default_rng(0)
    w32 = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    mm = ms.ops.MatMul(transpose_b=True)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        dense = torch.nn.Linear(K, N, bias=False)
        dense.weight.data.copy_(torch.tensor(w32))
        dense = dense.to(dt)
        fast = torch.nn.Linear(K, N, bias=False).to(dt)
        fast.weight = dense.weight  # the same parameter (as a tied / kept lm_head)
        LinearFP.from_linear(fast)
        x = torch.tensor(rng.standard_normal((1, 1, K)).astype(np.float32)).to(dt)
        x2 = x.reshape(1, K)
        variants = {"LinearFP (native, host call)": lambda: fast(x)}
        variants["cgemm_fp via ops.Custom"] = lambda: _ops.gemm_fp.kernel("cpu")(x2, dense.weight, None)
        try:
            _force(dense(x))
            variants["mindtorch nn.Linear (dense)"] = lambda: dense(x)
        except Exception as e:  # noqa: BLE001
            print(f"[{dt}] mindtorch nn.Linear: fails ({str(e).splitlines()[0][:90]})")
        try:
            _force(mm(x2, dense.weight))
            variants["MatMul(transpose_b)"] = lambda: mm(x2, dense.weight)
        except Exception as e:  # noqa: BLE001
            print(f"[{dt}] MatMul(transpose_b): fails ({str(e).splitlines()[0][:90]})")
            variants["MatMul(transpose_b) on fp32 casts"] = lambda: mm(x2.float(), dense.weight.float())
        res = rounds(variants, n_rounds)
        show(f"lm_head 1 x {K} -> {N}, {dt} ({N * K * dense.weight.element_size() / 2**20:.0f} MiB weight)", res)


def sweep(n_rounds, rows):
    rng = np.random.default_rng(1)
    mm = ms.ops.MatMul(transpose_b=True)
    W = torch.tensor((rng.standard_normal((N, K)) * 0.05).astype(np.float32))
    Wb = W.to(torch.bfloat16)
    for M in rows:
        x = torch.tensor(rng.standard_normal((M, K)).astype(np.float32))
        xb = x.to(torch.bfloat16)
        variants = {
            "fp32 native (ops.Custom)": lambda: lib.cgemm_fp_fp32(x, W, None),
            "fp32 MatMul(transpose_b)": lambda: mm(x, W),
            "bf16 native (ops.Custom)": lambda: lib.cgemm_fp_bf16(xb, Wb, None),
            "bf16 cast to fp32 + MatMul": lambda: mm(xb.float(), Wb.float()),
        }
        show(f"rows M = {M} ({M} x {K} -> {N})", rounds(variants, max(3, n_rounds // max(1, M // 16))))


def decode(n_rounds, mode, which):
    import transformers
    from transformers import AutoModelForCausalLM, LlamaConfig

    from bitsandbytes_ms.integrations import quant_4bit, quant_8bit

    transformers.logging.set_verbosity_error()
    t = time.perf_counter()
    if which == "embedded":
        from pathlib import Path

        import bitsandbytes_ms

        model = AutoModelForCausalLM.from_pretrained(str(Path(bitsandbytes_ms.__file__).parent / "default_model"))
        title = "the embedded model"
    else:
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5,
                          rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
        model = AutoModelForCausalLM.from_config(cfg)
        title = "random SmolLM2-135M-shaped model"
    model.eval()
    if mode == "int8":
        quant_8bit(model, progress=False)
    else:
        quant_4bit(model, quant_type=mode, compute_dtype="fp32", progress=False)
    c = model.config
    print(f"\n{title} ({c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}), {mode}, "
          f"loaded and quantized in {time.perf_counter() - t:.0f} s; lm_head: {type(model.lm_head).__name__}")
    ids = torch.tensor(np.array([[1, 504, 3575, 282, 4649, 314, 260, 1345]], dtype=np.int64))
    with torch.no_grad():
        out = model(ids, use_cache=True)
    past = out.past_key_values
    nxt = torch.tensor(np.array([[42]], dtype=np.int64))
    pos = ids.shape[1]

    def step():
        # the same cache length every time: crop the cache back after the step
        with torch.no_grad():
            r = model(nxt, past_key_values=past, use_cache=True,
                      cache_position=torch.tensor(np.array([pos], dtype=np.int64)))
        past.crop(pos)
        return r

    def with_dense():
        model.lm_head.__class__ = torch.nn.Linear
        try:
            return step()
        finally:
            model.lm_head.__class__ = LinearFP

    res = rounds({"decode step, lm_head LinearFP": step, "decode step, lm_head nn.Linear (dense)": with_dense},
                 n_rounds)
    show(f"one decode step (1 token, cache of {pos}), {mode} layers", res)
    a, b = step().logits.asnumpy(), with_dense().logits.asnumpy()
    print(f"  logits LinearFP vs dense: max abs diff {np.abs(a - b).max():.2e} (max |logit| {np.abs(b).max():.2f})")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--rows", default="1,2,4,8,16,24,32,64,128,512")
    ap.add_argument("--decode", action="store_true")
    ap.add_argument("--decode-mode", default="nf4", choices=("nf4", "fp4", "int8"))
    ap.add_argument("--decode-model", default="smollm2", choices=("smollm2", "embedded"))
    ap.add_argument("--no-lm-head", action="store_true")
    a = ap.parse_args(argv)
    print(f"bench_lm_head: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
          f"SIMD {__import__('bitsandbytes_ms.cextension', fromlist=['x']).simd_level()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    if not a.no_lm_head:
        lm_head(a.rounds)
    if a.sweep:
        sweep(a.rounds, [int(r) for r in a.rows.split(",")])
    if a.decode:
        decode(a.rounds, a.decode_mode, a.decode_model)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
