#!/usr/bin/env python3
"""Check and time cgemm_fp_{fp32,fp16,bf16} (the full-precision linear of csrc/cpu/gemm_fp.cpp and
csrc/cuda/gemm_fp.cu) outside MindSpore: numpy + ml_dtypes + ctypes (+ torch for device memory).

    python3 tools/gemm_fp_check.py --cpu-lib build/host/libbitsandbytes_ms_cpu.so [--cuda-lib build/host/libgemm_fp_cuda.so]

1. CPU library, every SIMD level the CPU has (BNB_MS_SIMD=scalar|avx2|avx512, one subprocess each): bit for bit
   against the numpy reference (bitsandbytes_ms/_reference.py, loaded by file path), odd K/N, 3-D A, every bias
   dtype; then the levels against each other.
2. CUDA library (if given and torch sees a GPU): the same cases on device memory, bit for bit against the CPU
   library; malformed calls return the CPU library's status.
3. Timings: lm_head 1 x 576 -> 49152 (and 64 / 512 rows) per SIMD level; the CUDA kernel next to torch's
   F.linear (cuBLAS) -- informative, the CUDA kernel is the simple correct one.

Building on a bare machine (see tools/cpu_isa_check.py for the CPU library):
    g++ -O3 -std=c++17 -fPIC -shared -fopenmp -fno-math-errno -ffp-contract=off -D_GLIBCXX_USE_CXX11_ABI=0 \\
        -Icsrc csrc/cpu/*.cpp -o build/host/libbitsandbytes_ms_cpu.so
    nvcc -O3 -std=c++17 -fmad=false -shared -Xcompiler -fPIC -D_GLIBCXX_USE_CXX11_ABI=0 -arch=sm_90 -Icsrc \\
        csrc/cuda/gemm_fp.cu -o build/host/libgemm_fp_cuda.so
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from aot_ctypes import Aot  # noqa: E402

NP = {"fp32": np.float32, "fp16": np.float16, "bf16": bfloat16}
NAME = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
SHAPES = [((1, 576), 37), ((1, 1), 5), ((1, 15), 1), ((1, 16), 8), ((1, 17), 9), ((2, 33), 11), ((3, 100), 13),
          ((4, 64), 6), ((5, 31), 7), ((7, 129), 10), ((12, 48), 25), ((2, 3, 40), 9), ((9, 300), 50),
          ((17, 70), 19), ((33, 1000), 21), ((1, 4099), 70)]


def load_reference():
    spec = importlib.util.spec_from_file_location("bnb_ms_reference", ROOT / "bitsandbytes_ms" / "_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint16)


def make_cases():
    rng = np.random.default_rng(11)
    cases = []
    for sfx in NP:
        for i, (a_shape, N) in enumerate(SHAPES):
            A = rng.standard_normal(a_shape).astype(np.float32).astype(NP[sfx])
            W = (rng.standard_normal((N, a_shape[-1])) * 0.1).astype(np.float32).astype(NP[sfx])
            bias = None
            if i % 3:
                bsfx = ("fp32", sfx, "bf16")[i % 3]
                bias = rng.standard_normal(N).astype(np.float32).astype(NP[bsfx])
            cases.append((f"{sfx}:{i}", sfx, A, W, bias))
    return cases


def run_level(lib_path, out_path):
    """Subprocess body: all cases at the environment's SIMD level -> npz."""
    lib = Aot(lib_path)
    res = {"_level": np.array(lib.simd_level())}
    for key, sfx, A, W, bias in make_cases():
        out = np.empty(A.shape[:-1] + (W.shape[0],), NP[sfx])
        rc = lib(f"cgemm_fp_{sfx}", [A, W, bias, out])
        assert rc == 0, (key, rc)
        res[key] = bits(out)
    np.savez(out_path, **res)


def check_cpu(lib_path, levels):
    ref = load_reference()
    cases = make_cases()
    want = {k: bits(ref.gemm_fp(A.astype(np.float32), W.astype(np.float32),
                                None if b is None else b.astype(np.float32), NAME[s])) for k, s, A, W, b in cases}
    runs, ok = {}, True
    with tempfile.TemporaryDirectory() as d:
        for lvl in levels:
            env = dict(os.environ, BNB_MS_SIMD=lvl)
            out = Path(d) / f"{lvl}.npz"
            subprocess.run([sys.executable, __file__, "--cpu-lib", lib_path, "--level-run", str(out)], env=env, check=True)
            runs[lvl] = dict(np.load(out))
    for lvl, got in runs.items():
        real = str(got["_level"])
        bad = [k for k in want if not np.array_equal(got[k], want[k])]
        status = "PASS" if not bad else "FAIL"
        ok &= not bad
        print(f"{status} cpu level {lvl} (library reports {real}): {len(want) - len(bad)}/{len(want)} cases bit-exact"
              f" vs _reference.gemm_fp" + (f"; first mismatches {bad[:4]}" if bad else ""))
    return ok, runs


def time_cpu(lib_path, levels):
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for lvl in levels:
            env = dict(os.environ, BNB_MS_SIMD=lvl)
            out = Path(d) / f"t_{lvl}.json"
            subprocess.run([sys.executable, __file__, "--cpu-lib", lib_path, "--time-run", str(out)], env=env, check=True)
            rows[lvl] = json.loads(out.read_text())
    for lvl, r in rows.items():
        for k, v in r.items():
            print(f"time cpu {lvl:<7} {k}: {v}")


def time_run(lib_path, out_path):
    lib = Aot(lib_path)
    rng = np.random.default_rng(0)
    K, N = 576, 49152
    res = {}
    for sfx in ("fp32", "bf16"):
        W = (rng.standard_normal((N, K)) * 0.05).astype(np.float32).astype(NP[sfx])
        for M in (1, 64, 512):
            A = rng.standard_normal((M, K)).astype(np.float32).astype(NP[sfx])
            out = np.empty((M, N), NP[sfx])
            call = lib.prepare(f"cgemm_fp_{sfx}", [A, W, None, out])
            call()
            ts = []
            for _ in range(max(3, 40 // M)):
                t = time.perf_counter()
                call()
                ts.append(time.perf_counter() - t)
            best = min(ts)
            res[f"{sfx} M={M:<3}"] = (f"{best * 1e3:8.3f} ms  ({W.nbytes / best / 1e9:6.1f} GB/s of W, "
                                      f"{2 * M * N * K / best / 1e9:7.1f} GFLOP/s; {os.cpu_count()} CPUs)")
    Path(out_path).write_text(json.dumps(res))


def check_cuda(cuda_path, cpu_runs):
    import torch

    if not torch.cuda.is_available():
        print("SKIP cuda: no GPU")
        return True
    lib = Aot(cuda_path)
    tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    cpu = next(iter(cpu_runs.values()))
    bad = []

    def dev(a):
        if a is None:
            return None
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16 if a.dtype != np.float32 else np.float32))
        if a.dtype == bfloat16:
            t = t.view(torch.bfloat16)
        elif a.dtype == np.float16:
            t = t.view(torch.float16)
        return t.cuda()

    for key, sfx, A, W, b in make_cases():
        out = torch.empty(A.shape[:-1] + (W.shape[0],), dtype=tdt[sfx], device="cuda")
        rc = lib(f"cgemm_fp_{sfx}", [dev(A), dev(W), dev(b), out])
        torch.cuda.synchronize()
        got = out.cpu()
        got = (got.view(torch.int16) if sfx != "fp32" else got.view(torch.int32)).numpy().view(
            np.uint16 if sfx != "fp32" else np.uint32)
        if rc != 0 or not np.array_equal(got, cpu[key]):
            bad.append(key)
    print(f"{'PASS' if not bad else 'FAIL'} cuda vs cpu library: {len(SHAPES) * 3 - len(bad)}/{len(SHAPES) * 3} cases "
          f"bit-exact" + (f"; mismatches {bad[:6]}" if bad else ""))
    # malformed calls: same statuses as the CPU library
    cpu_lib = Aot(str(Path(ARGS.cpu_lib)))
    A, W, o = np.ones((2, 6), np.float32), np.ones((4, 6), np.float32), np.empty((2, 4), np.float32)
    tA, tW, to = (torch.from_numpy(x).cuda() for x in (A, W, o))
    mal = [("dtype W", [A, W.astype(np.float16), None, o], [tA, tW.half(), None, to]),
           ("shape W", [A, W[:, :5].copy(), None, o], [tA, tW[:, :5].contiguous(), None, to]),
           ("bias n", [A, W, np.ones(3, np.float32), o], [tA, tW, torch.ones(3, device="cuda"), to]),
           ("out n", [A, W, None, o[:, :3].copy()], [tA, tW, None, to[:, :3].contiguous()]),
           ("nparam", [A, W, o], [tA, tW, to])]
    mal_bad = []
    for name, ca, ga in mal:
        rc_c, rc_g = cpu_lib("cgemm_fp_fp32", ca), lib("cgemm_fp_fp32", ga)
        if rc_c != rc_g or rc_c == 0:
            mal_bad.append((name, rc_c, rc_g))
    print(f"{'PASS' if not mal_bad else 'FAIL'} cuda malformed calls: same status as the CPU library "
          f"({len(mal) - len(mal_bad)}/{len(mal)})" + (f" {mal_bad}" if mal_bad else ""))
    # timing next to cuBLAS (informative)
    K, N = 576, 49152
    for sfx in ("fp32", "bf16"):
        W = torch.randn(N, K, device="cuda", dtype=tdt[sfx]) * 0.05
        for M in (1, 64):
            A = torch.randn(M, K, device="cuda", dtype=tdt[sfx])
            out = torch.empty(M, N, device="cuda", dtype=tdt[sfx])
            call = lib.prepare(f"cgemm_fp_{sfx}", [A, W, None, out])

            def ours():
                call()

            def theirs():
                torch.nn.functional.linear(A, W)

            for f in (ours, theirs):
                f()
            torch.cuda.synchronize()
            tm = {}
            for nm, f in (("ours", ours), ("torch F.linear", theirs)):
                t0 = time.perf_counter()
                for _ in range(50):
                    f()
                torch.cuda.synchronize()
                tm[nm] = (time.perf_counter() - t0) / 50 * 1e6
            print(f"time cuda {sfx} M={M}: ours {tm['ours']:.1f} us, torch F.linear {tm['torch F.linear']:.1f} us")
    return not bad and not mal_bad


ARGS = None


def main() -> int:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-lib", required=True)
    ap.add_argument("--cuda-lib")
    ap.add_argument("--level-run")
    ap.add_argument("--time-run")
    ap.add_argument("--no-time", action="store_true")
    ARGS = a = ap.parse_args()
    if a.level_run:
        run_level(a.cpu_lib, a.level_run)
        return 0
    if a.time_run:
        time_run(a.cpu_lib, a.time_run)
        return 0
    avail = Aot(a.cpu_lib).simd_level()
    levels = ["scalar", "avx2", "avx512"][: {"scalar": 1, "avx2": 2, "avx512": 3}[avail]]
    print(f"gemm_fp_check: CPU SIMD {avail}, {os.cpu_count()} CPUs; levels {levels}")
    ok, runs = check_cpu(a.cpu_lib, levels)
    flat = {k: v for k, v in runs[levels[0]].items() if k != "_level"}
    for lvl in levels[1:]:
        same = all(np.array_equal(runs[lvl][k], v) for k, v in flat.items())
        ok &= same
        print(f"{'PASS' if same else 'FAIL'} cpu level {lvl} == level {levels[0]} byte for byte")
    if a.cuda_lib:
        ok &= check_cuda(a.cuda_lib, runs)
    if not a.no_time:
        time_cpu(a.cpu_lib, levels)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
