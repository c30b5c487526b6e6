"""CPU benchmarks: median of repeats after a warm-up, ratios against a baseline measured in the
same run. Usage: PYTHONPATH=. python tools/bench_cpu.py [--section 4bit] [--repeats N]."""

import argparse
import statistics
import time

import numpy as np
import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()


def bench(fn, repeats=7, warmup=2):
    """Median wall time of fn() in seconds (results forced to host with asnumpy where returned)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


# ---- 4-bit ----
def section_4bit(repeats):
    import bitsandbytes_ms.functional as F
    from mindspore import ops

    rows = []
    for N, K in ((4096, 4096), (11008, 4096)):
        W = ms.Tensor(np.random.RandomState(0).randn(N, K).astype(np.float32))
        q, st = F.quantize_4bit(W, blocksize=64, quant_type="nf4")
        Wd = F.dequantize_4bit(q, st)
        A = ms.Tensor(np.random.RandomState(1).randn(1, K).astype(np.float32))
        t_gemv = bench(lambda: F.gemv_4bit(A, q, state=st).asnumpy(), repeats)
        t_mm = bench(lambda: ops.matmul(A, Wd.T).asnumpy(), repeats)
        src = np.random.RandomState(2).randint(0, 255, q.shape[0], dtype=np.uint8)
        dst = np.empty_like(src)
        t_cpy = bench(lambda: np.copyto(dst, src), repeats)
        gbs = q.shape[0] / t_gemv / 1e9
        rows.append(f"| gemv_4bit nf4 fp32 1x{K} @ [{N},{K}]^T | {t_gemv*1e3:.2f} ms | fp32 matmul on dequantized W: "
                    f"{t_mm*1e3:.2f} ms | {t_mm/t_gemv:.2f}x | packed read {gbs:.2f} GB/s vs memcpy {q.shape[0]/t_cpy/1e9:.2f} GB/s |")
        t_q = bench(lambda: F.quantize_4bit(W, blocksize=64, quant_type="nf4")[0].asnumpy(), max(3, repeats // 2))
        t_dq = bench(lambda: F.dequantize_4bit(q, st).asnumpy(), max(3, repeats // 2))
        n = N * K
        rows.append(f"| quantize_4bit / dequantize_4bit fp32 [{N},{K}] | {n/t_q/1e6:.0f} / {n/t_dq/1e6:.0f} Melem/s | | | |")
    print("| op | time | baseline | ratio | bandwidth |\n|---|---|---|---|---|")
    print("\n".join(rows))


SECTIONS = {"4bit": section_4bit}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--section", default=None)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    for name, fn in SECTIONS.items():
        if args.section in (None, name):
            print(f"## {name}")
            fn(args.repeats)
