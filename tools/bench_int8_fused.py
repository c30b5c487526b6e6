#!/usr/bin/env python3
"""Linear8bitLt inference forward before/after the fused LLM.int8() forward, measured in one run.

    .venv/bin/python tools/bench_int8_fused.py --before /path/to/main/checkout [--rounds 3] [--repeat 15]

Each round runs one subprocess per tree (the ``--before`` checkout, then this one), alternating, so a noisy
neighbour during one phase does not favour either side; every figure is the median over all rounds' samples.
Both trees are imported by path (the editable install's finder is taken out of ``sys.meta_path``) with the
same venv; each tree must have its native library built next to its sources.

Per layer (576 -> 1536 and 4096 -> 11008, fp32 weights quantized by ``.to("cpu")``, eval mode, ``torch.no_grad()``),
threshold 0 and 6, and fp32 activations of batch 1 and 16 (column 7 set to 20, so threshold 6 has one outlier
column): the forward time, and the time of the native kernel alone (this tree's ``cint8_linear_fp32`` through
ctypes on the layer's host arrays, tools/aot_ctypes.py), called right after each forward in both trees so
that both see the same machine load. "forward - kernel" is the median of those per-call differences: what
a forward costs beyond the native arithmetic (for "before", its unfused native ops and MindSpore ops
against the same fused kernel).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ((576, 1536), (4096, 11008))
BATCHES = (1, 16)
THRESHOLDS = (0.0, 6.0)


def _worker(tree: str, repeat: int, kernel_lib: str) -> dict:
    sys.meta_path[:] = [f for f in sys.meta_path if "_editable" not in type(f).__module__]
    sys.path.insert(0, tree)
    import numpy as np
    import mindspore as ms

    ms.set_device("CPU")
    ms.runtime.launch_blocking()
    import bitsandbytes_ms as bnb

    assert Path(bnb.__file__).resolve().is_relative_to(Path(tree).resolve()), bnb.__file__
    bnb.register()
    import torch

    sys.path.insert(0, str(ROOT / "tools"))
    from aot_ctypes import Aot

    lib = Aot(kernel_lib)  # this tree's library: the fused kernel alone, on the layer's own arrays
    res = {}
    rng = np.random.RandomState(0)
    for K, N in LAYERS:
        W = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        b = (rng.standard_normal(N) * 0.1).astype(np.float32)
        for thr in THRESHOLDS:
            m = bnb.nn.Linear8bitLt(K, N, has_fp16_weights=False, threshold=thr)
            m.weight = bnb.nn.Int8Params(torch.tensor(W), requires_grad=False, has_fp16_weights=False)
            m.bias = torch.nn.Parameter(torch.tensor(b), requires_grad=False)
            m = m.to("cpu").eval()
            for M in BATCHES:
                x = rng.standard_normal((M, K)).astype(np.float32)
                x[:, 7] = 20.0
                xt = torch.tensor(x)
                with torch.no_grad():
                    ref = m(xt).numpy()
                st = m.state
                out, fl = np.empty((M, N), np.float32), np.empty(K, np.uint8)
                call = lib.prepare("cint8_linear_fp32", [x, st.CB.asnumpy(), st.SCB.asnumpy(), m.bias.asnumpy(),
                                                         np.array(thr, np.float32), out, fl])
                call()
                if thr == 0.0:  # (at threshold 6 "before" adds the outliers in another order)
                    assert np.array_equal(out, ref), "kernel != forward"
                n = repeat * (4 if K < 1000 else 1)
                fwd, ker = [], []
                with torch.no_grad():
                    for i in range(n + 3):  # forward and kernel interleaved: both see the same machine load
                        t0 = time.perf_counter()
                        m(xt)
                        t1 = time.perf_counter()
                        call()
                        t2 = time.perf_counter()
                        if i >= 3:
                            fwd.append(t1 - t0)
                            ker.append(t2 - t1)
                key = f"{K}x{N}/t{thr:g}/b{M}"
                res[f"fwd/{key}"] = fwd
                res[f"kernel/{key}"] = ker
                res[f"over/{key}"] = [f - k for f, k in zip(fwd, ker)]
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="checkout of the baseline (e.g. a worktree of main)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None,
                    help="BNB_MS_NUM_THREADS (the library's pool) for both sides; default: the process's CPUs")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        tree, repeat, kernel_lib = a.worker
        print("RESULT " + json.dumps(_worker(tree, int(repeat), kernel_lib)))
        return 0
    pooled = {"before": {}, "after": {}}
    trees = {"before": a.before, "after": str(ROOT)}
    kernel_lib = str(ROOT / "bitsandbytes_ms" / "libbitsandbytes_ms_cpu.so")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BNB_MS_")}
    if a.threads:
        env["BNB_MS_NUM_THREADS"] = str(a.threads)
    for r in range(a.rounds):
        for side in ("before", "after"):
            p = subprocess.run([sys.executable, __file__, "--before", a.before, "--worker", trees[side], str(a.repeat),
                                kernel_lib], capture_output=True, text=True, env=env)
            if p.returncode:
                print(p.stderr[-3000:], file=sys.stderr)
                return 1
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
            for k, v in json.loads(line[7:]).items():
                pooled[side].setdefault(k, []).extend(v)
            print(f"round {r + 1} {side} done", file=sys.stderr, flush=True)
    med = {s: {k: median(v) * 1e3 for k, v in d.items()} for s, d in pooled.items()}
    rows = ["| layer | threshold | batch | before ms | after ms | speedup | kernel ms | before - kernel ms | "
            "after - kernel ms |", "|---|---|---|---|---|---|---|---|---|"]
    for K, N in LAYERS:
        for thr in THRESHOLDS:
            for M in BATCHES:
                key = f"{K}x{N}/t{thr:g}/b{M}"
                b, f = med["before"][f"fwd/{key}"], med["after"][f"fwd/{key}"]
                k = median(pooled["before"][f"kernel/{key}"] + pooled["after"][f"kernel/{key}"]) * 1e3
                rows.append(f"| {K} -> {N} | {thr:g} | {M} | {b:.3f} | {f:.3f} | {b / f:.2f}x | {k:.3f} | "
                            f"{med['before'][f'over/{key}']:.3f} | {med['after'][f'over/{key}']:.3f} |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
