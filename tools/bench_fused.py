"""Decode and prefill speed of the fused decode path vs the unfused quantized model, same run.

    .venv/bin/python tools/bench_fused.py [--model DIR] [--mode nf4|fp4|int8] [--threshold 6.0] [--no-dq]
                                          [--prompt 16] [--new 32] [--prefill 512] [--rounds 2]

Without --model: a random Llama of SmolLM2-135M's shape (hidden 576, 30 layers, 9/3 heads, intermediate 1536,
vocab 49152, tied embeddings). --mode int8: quant_8bit (Linear8bitLt, --threshold); nf4/fp4: quant_4bit
(compute fp32, double quant unless --no-dq). lm_head stays fp32 (LinearFP) in every mode.
Decode ms/token = (t(generate n2 tokens) - t(generate n1 tokens)) / (n2 - n1), greedy, EOS off, from a --prompt
token prompt; prefill tok/s = --prefill / t(generate 1 token from a --prefill token prompt) (time to first
token, as tools/bench_model.py). Fused and unfused alternate in each round; best of --rounds. MindSpore runs
with launch_blocking(). --profile-prefill splits a fused --prefill forward into the attention halves, the MLP
halves and lm_head; --profile-int8 times one int8 linear (cint8_linear_fp32's kernel; the int8 GEMM alone too)
per SmolLM2 shape at 1 and --prefill rows, against fp32 and 4-bit linears of the fused decoder (same process).
"""
import argparse
import os
import time

import numpy as np
import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()
import mindnlp  # noqa: E402,F401
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

from bitsandbytes_ms.integrations import fuse, quant_4bit, quant_8bit  # noqa: E402
from bitsandbytes_ms.integrations import fused as FU  # noqa: E402

transformers.logging.set_verbosity_error()


def smollm2_config(layers=30):
    return LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=layers,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                       rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1,
                       eos_token_id=2, pad_token_id=2)


def gen_time(model, ids, n):
    with torch.no_grad():
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        return time.perf_counter() - t, out.asnumpy()


def profile_int8(model, rows, reps=9):
    """Median ms of one linear per SmolLM2 projection shape: int8 (the fused decoder's int8 spec), fp32 and NF4
    (+DQ) weights of the same shape, through cdecoder_linear_fp32 at 1 and `rows` rows."""
    from bitsandbytes_ms import _hostcall as HC
    from bitsandbytes_ms import functional as F

    cfg = model.config
    H, I, KV = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    rng = np.random.RandomState(0)
    lin = HC.entry("cdecoder_linear_fp32")
    print(f"int8 path profile (median of {reps}, ms per call; GOP/s = 2*M*N*K / t)")
    print("| N x K | rows | int8 ms | int8 GOP/s | of it: int8 GEMM ms (GOP/s) | fp32 ms | fp32 GOP/s | nf4+DQ ms "
          "| int8 / fp32 time |")
    print("|---|---|---|---|---|---|---|---|---|")
    gemm = HC.entry("cigemmlt_32")

    def median_ms(b):
        b()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            b()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts)) * 1e3

    for N, K in ((H, H), (KV, H), (I, H), (H, I)):
        W = (rng.randn(N, K) * 0.05).astype(np.float32)
        CB, SCB, _ = F.int8_vectorwise_quant(ms.Tensor(W.astype(np.float16)))
        i8 = (CB.asnumpy(), SCB.asnumpy(), None, None, None, np.array(6.0, np.float32), None, 64, 256)
        f32 = (W, None, None, None, None, None, None, 64, 256)
        p, qs = F.quantize_4bit(ms.Tensor(W), quant_type="nf4", compress_statistics=True, blocksize=64)
        q4 = (p.asnumpy().reshape(-1), qs.absmax.asnumpy().reshape(-1), qs.code.asnumpy(), qs.state2.absmax.asnumpy(),
              qs.state2.code.asnumpy(), np.array(float(qs.offset), np.float32), None, 64, qs.state2.blocksize)
        for M in (1, rows):
            x = rng.randn(M, K).astype(np.float32)
            out = np.empty((M, N), np.float32)
            res = {name: median_ms(lin.bind(x, *spec, N, out)) for name, spec in (("int8", i8), ("fp32", f32), ("nf4", q4))}
            CA = rng.randint(-127, 128, (M, K)).astype(np.int8)
            res["gemm"] = median_ms(gemm.bind(CA, i8[0], np.empty((M, N), np.int32), np.zeros(1, np.int32)))
            g = lambda ms_: 2 * M * N * K / (ms_ * 1e-3) / 1e9  # noqa: E731
            print(f"| {N} x {K} | {M} | {res['int8']:.3f} | {g(res['int8']):.1f} | {res['gemm']:.3f} ({g(res['gemm']):.1f}) "
                  f"| {res['fp32']:.3f} | {g(res['fp32']):.1f} | {res['nf4']:.3f} | {res['int8'] / res['fp32']:.2f} |")


class _Timed:
    """A bound host call that adds its wall time to ``acc[key]`` (for --profile-prefill)."""

    def __init__(self, call, acc, key):
        self._call, self._acc, self._key = call, acc, key

    def __getattr__(self, name):
        return getattr(self._call, name)

    def __call__(self):
        t = time.perf_counter()
        self._call()
        self._acc[self._key] = self._acc.get(self._key, 0.0) + time.perf_counter() - t

    def run_as(self, entry):
        t = time.perf_counter()
        self._call.run_as(entry)
        self._acc[self._key] = self._acc.get(self._key, 0.0) + time.perf_counter() - t


def profile_prefill(model, ids, reps=3):
    """Where a fused prefill's time goes: the attention halves, the MLP halves, final norm + lm_head, the rest
    (Python, embedding), best of ``reps`` forwards over ``ids``."""
    plan = model.__dict__[FU._PLAN]
    best = None
    for _ in range(reps):
        acc = {}
        for L in plan.layers:
            L.attn, L.mlp = _Timed(L.attn, acc, "attention halves"), _Timed(L.mlp, acc, "MLP halves")
        plan.lm_call = _Timed(plan.lm_call, acc, "lm_head (last row)")
        try:
            t, _ = gen_time(model, ids, 1)
        finally:
            for L in plan.layers:
                L.attn, L.mlp = L.attn._call, L.mlp._call
            plan.lm_call = plan.lm_call._call
        acc["total (generate 1 token)"] = t
        if best is None or t < best["total (generate 1 token)"]:
            best = acc
    tot = best["total (generate 1 token)"]
    print(f"fused prefill profile ({ids.shape[1]} tokens, best of {reps}): " + ", ".join(
        f"{k} {v * 1e3:.0f} ms ({v / tot:.0%})" for k, v in best.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--mode", default="nf4", choices=["nf4", "fp4", "int8"])
    ap.add_argument("--threshold", type=float, default=6.0)
    ap.add_argument("--no-dq", action="store_true")
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--profile-int8", action="store_true")
    ap.add_argument("--profile-prefill", action="store_true")
    a = ap.parse_args()
    if a.model:
        model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
        name = a.model
    else:
        model = AutoModelForCausalLM.from_config(smollm2_config(a.layers))
        rng = np.random.RandomState(0)
        for _, p in model.named_parameters():
            p.data.copy_(torch.tensor((rng.randn(*p.shape) * 0.05).astype(np.float32)))
        name = f"random SmolLM2-135M-shaped Llama ({a.layers} layers)"
    model.eval()
    if a.mode == "int8":
        quant_8bit(model, threshold=a.threshold, progress=False)
        desc = f"int8 (Linear8bitLt, threshold {a.threshold})"
    else:
        quant_4bit(model, quant_type=a.mode, compute_dtype="fp32", compress_statistics=not a.no_dq, progress=False)
        desc = f"{a.mode}{'' if a.no_dq else '+DQ'} (compute fp32)"
    rs = np.random.RandomState(1)
    ids = torch.tensor(rs.randint(3, model.config.vocab_size, (1, a.prompt)).astype(np.int64))
    long_ids = torch.tensor(rs.randint(3, model.config.vocab_size, (1, a.prefill)).astype(np.int64))
    assert fuse(model)
    n1, n2 = 2, 2 + a.new
    res = {"fused": [], "unfused": []}
    pre = {"fused": [], "unfused": []}
    toks, ptoks = {}, {}
    for r in range(a.rounds):
        for mode in ("fused", "unfused"):
            FU.set_enabled(mode == "fused")
            gen_time(model, ids, 1)  # warm-up
            t1, _ = gen_time(model, ids, n1)
            t2, out = gen_time(model, ids, n2)
            t0, pout = gen_time(model, long_ids, 1)
            res[mode].append((t2 - t1) / (n2 - n1) * 1e3)
            pre[mode].append(a.prefill / t0)
            toks[mode], ptoks[mode] = out, pout
    FU.set_enabled(True)
    f, u = min(res["fused"]), min(res["unfused"])
    pf, pu = max(pre["fused"]), max(pre["unfused"])
    print(f"model      {name}, {desc}; lm_head fp32; threads {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}")
    print(f"decode     fused {f:.2f} ms/token ({1e3 / f:.2f} tok/s)   unfused {u:.2f} ms/token ({1e3 / u:.2f} tok/s)"
          f"   fused/unfused x{u / f:.2f}   (prompt {a.prompt}, {a.new} new tokens)")
    print(f"prefill    fused {pf:.1f} tok/s   unfused {pu:.1f} tok/s   fused/unfused x{pf / pu:.2f}   "
          f"(time to first token, {a.prefill}-token prompt)")
    print(f"rounds     decode ms/token fused {['%.2f' % x for x in res['fused']]}  unfused "
          f"{['%.2f' % x for x in res['unfused']]}; prefill tok/s fused {['%.1f' % x for x in pre['fused']]}  "
          f"unfused {['%.1f' % x for x in pre['unfused']]}")
    print(f"same greedy tokens: decode {bool((toks['fused'] == toks['unfused']).all())}, "
          f"prefill's first token {bool((ptoks['fused'] == ptoks['unfused']).all())}")
    if a.profile_prefill:
        profile_prefill(model, long_ids)
    if a.profile_int8:
        profile_int8(model, a.prefill)


if __name__ == "__main__":
    main()
