"""Where one decode step of a quantized model goes, to the microsecond: every native call (by entry point) and
every Python / framework function between them, per generated token (issue 32 item 1).

    .venv/bin/python tools/profile_decode.py --model DIR [--mode nf4|int8|fp4] [--tokens 32] [--path cli|hf]

``--path cli``: quantized while loading, as ``bnb-ms quantize`` loads (``integrations.loading``; fp32 compute, no
double quant); ``--path hf``: transformers'
``from_pretrained(quantization_config=BitsAndBytesConfig(...))`` with the tutorials' config (bf16 compute, double
quant, no dtype). Both fuse by themselves on the first forward. After a warm-up generation, the decode step time and
the native calls per step are those of a greedy ``--tokens``-token generation minus a 1-token one (the prompt's
prefill not spread over the steps); then the whole generation runs under cProfile (the breakdown; cProfile's own
overhead inflates the Python rows, so the table also gives each row's share of the profiled total). Native calls
are timed by wrapping ``_hostcall.Bound.__call__`` / ``run_as`` (per entry).
Prints a Markdown table (rows above 0.5% of the step).
"""

from __future__ import annotations

import argparse
import cProfile
import collections
import os
import pstats
import sys
import time


def _load(args):
    import mindspore as ms

    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    import mindnlp  # noqa: F401
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    import bitsandbytes_ms as bnb

    transformers.logging.set_verbosity_error()
    if args.path == "hf":
        bnb.register()
        if args.mode == "int8":
            cfg = BitsAndBytesConfig(load_in_8bit=True)
        else:
            cfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=args.mode, bnb_4bit_use_double_quant=True,
                                     bnb_4bit_compute_dtype=torch.bfloat16)
        m = AutoModelForCausalLM.from_pretrained(args.model, quantization_config=cfg)
    else:  # as `bnb-ms quantize` loads: quantized while loading, the rest in the checkpoint's dtype (a 7B fits)
        from bitsandbytes_ms.integrations import loading

        cfg = loading.bnb_config(args.mode, threshold=6.0, compute_dtype="fp32")
        m, _ = loading.load_quantized(args.model, cfg, loading.checkpoint_dtype(args.model))
    return m.eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--mode", default="nf4", choices=["nf4", "fp4", "int8"])
    ap.add_argument("--path", default="cli", choices=["cli", "hf"])
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args(argv)
    if args.tokens < 2:
        ap.error(f"--tokens must be at least 2 (decode steps are an N-token generation minus a 1-token one), got "
                 f"{args.tokens}")
    m = _load(args)
    import torch

    from bitsandbytes_ms import _hostcall
    from bitsandbytes_ms.integrations import is_fused

    ids = torch.tensor([[1, 504, 3458, 282, 4649, 314]], dtype=torch.int64)
    kw = dict(max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids))
    one = {**kw, "max_new_tokens": 1, "min_new_tokens": 1}  # the prompt's prefill and the first token alone

    def gen_time(**g) -> float:
        t = time.perf_counter()
        m.generate(ids, **g)
        return time.perf_counter() - t

    with torch.no_grad():
        m.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
        # decode steps only: an N-token generation minus a 1-token one (the prompt's prefill, which the exact
        # 2-8-row path makes slow on a big model, would otherwise be spread over the steps)
        plain = (gen_time(**kw) - gen_time(**one)) / (args.tokens - 1)
        native = collections.defaultdict(lambda: [0, 0.0])
        call, run_as = _hostcall.Bound.__call__, _hostcall.Bound.run_as

        def timed_call(self, *a, **k):
            t0 = time.perf_counter()
            try:
                return call(self, *a, **k)
            finally:
                e = native[self._name]
                e[0] += 1
                e[1] += time.perf_counter() - t0

        def timed_run_as(self, other, *a, **k):
            t0 = time.perf_counter()
            try:
                return run_as(self, other, *a, **k)
            finally:
                e = native[getattr(other, "name", None) or getattr(other, "_name", "?") + "*"]
                e[0] += 1
                e[1] += time.perf_counter() - t0

        _hostcall.Bound.__call__, _hostcall.Bound.run_as = timed_call, timed_run_as
        try:
            t1 = gen_time(**one)
            first = {k: list(v) for k, v in native.items()}
            tn = gen_time(**kw)
            for k, v in first.items():  # the N-token run's calls minus the 1-token run's (counted twice above)
                native[k][0] -= 2 * v[0]
                native[k][1] -= 2 * v[1]
            timed = (tn - t1) / (args.tokens - 1)
        finally:
            _hostcall.Bound.__call__, _hostcall.Bound.run_as = call, run_as
        prof = cProfile.Profile()
        prof.enable()
        t = time.perf_counter()
        m.generate(ids, **kw)
        profiled = (time.perf_counter() - t) / args.tokens
        prof.disable()
    n = args.tokens - 1  # decode steps in the native table (the cProfile table: per token of the whole generation)
    print(f"# decode step profile: {args.model} ({args.mode}, {args.path} path, fused {is_fused(m)}), "
          f"{args.tokens} tokens, {os.cpu_count()} cores\n")
    print(f"decode step time (an {args.tokens}-token generation minus a 1-token one, per step): {plain * 1e3:.3f} ms "
          f"plain ({1 / plain:.1f} tok/s), {timed * 1e3:.3f} ms with native calls timed; whole generation under "
          f"cProfile {profiled * 1e3:.3f} ms per token (prompt included)\n")
    print("## native calls (per token)\n\n| entry | calls | us | share of the plain step |\n|---|---|---|---|")
    tot_native = 0.0
    for name, (c, s) in sorted(native.items(), key=lambda kv: -kv[1][1]):
        tot_native += s
        print(f"| {name} | {c / n:.1f} | {s / n * 1e6:.1f} | {s / n / plain:.1%} |")
    print(f"| **all native calls** | | {tot_native / n * 1e6:.1f} | {tot_native / n / plain:.1%} |")
    print(f"| **everything else** (Python, mindtorch ops, generate) | | {(plain - tot_native / n) * 1e6:.1f} | "
          f"{1 - tot_native / n / plain:.1%} |\n")
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())  # tottime of every function
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])
    print("## everything, by function, under cProfile (own time per token; share of the profiled step)\n")
    print("| function | calls/token | own us/token | share |\n|---|---|---|---|")
    for (fn, line, name), (cc, nc, tt, ct, _) in rows:
        if tt / total < 0.005:
            break
        where = f"{os.path.basename(fn)}:{line}" if fn != "~" else "builtin"
        print(f"| {name} ({where}) | {nc / args.tokens:.1f} | {tt / args.tokens * 1e6:.1f} | {tt / total:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
