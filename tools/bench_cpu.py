"""CPU benchmarks for bitsandbytes_ms: ratios against a baseline measured in the same run.

Usage: PYTHONPATH=. python tools/bench_cpu.py [--section int8] [--repeats 3] [--big]
Writes/updates the section in benchmarks/cpu.md. Keep runs short (shared 2-core machine).
"""

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()


def bench(fn, repeats=3, warmup=1):
    """Median wall time (s) of fn() over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def write_section(name, lines):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu.md"
    text = path.read_text() if path.exists() else "# CPU benchmarks\n"
    head = f"## {name}\n"
    body = head + "\n".join(lines) + "\n"
    if head in text:
        pre, rest = text.split(head, 1)
        nxt = rest.find("\n## ")
        text = pre + body + (rest[nxt + 1:] if nxt >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    path.write_text(text)


# ---- int8 ----
def section_int8(repeats, big):
    import bitsandbytes_ms.functional as F
    from bitsandbytes_ms import cextension

    rng = np.random.RandomState(0)
    lines = [f"simd_level={cextension.simd_level()}, features={','.join(cextension.cpu_features())}, "
             f"median of {repeats} after 1 warm-up; GOP/s = 2*M*N*K / t. Upstream bitsandbytes timings not measured.",
             "", "| case | int8 GEMM ms | GOP/s | fp32 matmul ms | GOP/s | int8 / fp32 speed |", "|---|---|---|---|---|---|"]
    shapes = [(1024, 4096, 4096)] + ([(4096, 4096, 4096)] if big else []) + [(b, 4096, 11008) for b in (1, 4, 16)]
    for M, K, N in shapes:
        A = ms.Tensor(rng.randint(-127, 128, (M, K)).astype(np.int8))
        B = ms.Tensor(rng.randint(-127, 128, (N, K)).astype(np.int8))
        Af = ms.Tensor(rng.standard_normal((M, K)).astype(np.float32))
        Bf = ms.Tensor(rng.standard_normal((K, N)).astype(np.float32))
        ti = bench(lambda: F.int8_linear_matmul(A, B).asnumpy(), repeats)
        tf = bench(lambda: ms.ops.matmul(Af, Bf).asnumpy(), repeats)
        op = 2.0 * M * N * K
        lines.append(f"| {M}x{K}x{N} | {ti*1e3:.1f} | {op/ti/1e9:.1f} | {tf*1e3:.1f} | {op/tf/1e9:.1f} | {tf/ti:.2f}x |")
        print(lines[-1], flush=True)

    import mindnlp  # noqa: F401
    import torch
    import bitsandbytes_ms as bnb

    lines += ["", "| Linear 4096->11008, batch | Linear8bitLt (eval, threshold 0) ms | threshold 6 ms | fp32 nn.Linear ms | int8(t=0) / fp32 speed |",
              "|---|---|---|---|---|"]
    fp = torch.nn.Linear(4096, 11008)
    q0 = bnb.nn.Linear8bitLt(4096, 11008, has_fp16_weights=False)
    q6 = bnb.nn.Linear8bitLt(4096, 11008, has_fp16_weights=False, threshold=6.0)
    for q in (q0, q6):
        q.weight.data.copy_(fp.weight.data)
        q.bias = fp.bias
        q.quantize()
        q.eval()
    for b in (1, 16):
        x = torch.tensor(rng.standard_normal((b, 4096)).astype(np.float32))
        x[:, 7] = 20.0
        t0 = bench(lambda: q0(x).numpy(), repeats)
        t6 = bench(lambda: q6(x).numpy(), repeats)
        tf = bench(lambda: fp(x).numpy(), repeats)
        lines.append(f"| {b} | {t0*1e3:.1f} | {t6*1e3:.1f} | {tf*1e3:.1f} | {tf/t0:.2f}x |")
        print(lines[-1], flush=True)
    write_section("int8", lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--section", default="int8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="also 4096^3")
    args = ap.parse_args()
    if args.section == "int8":
        section_int8(args.repeats, args.big)
