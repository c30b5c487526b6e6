#!/usr/bin/env python3
"""Check and time the CUDA library on a CUDA machine (no MindSpore needed: torch + ctypes).

    python3 tools/gpu_check.py --cuda-lib build/libbitsandbytes_ms_cuda.so \\
        --cpu-lib build/libbitsandbytes_ms_cpu.so [--out benchmarks/gpu.md] [--quick]

What it does:
  1. calls every CUDA entry point it knows through ctypes with MindSpore's AOT convention
     (params/ndims/shapes/dtypes arrays, device pointers, the torch current stream; the blocksize
     scalar as a 0-d *device* tensor, as MindSpore's GPU runtime passes it, and once from host memory)
     and compares with the CPU library on the same inputs: bit-exact for blockwise 8-bit;
  2. checks that malformed calls return the CPU library's nonzero status and leave no CUDA error;
  3. checks the CPU library (whatever SIMD level this CPU gets, AVX-512 on most servers) against the
     numpy reference bitsandbytes_ms/_reference.py (loaded by path; no MindSpore import);
  4. times each kernel with CUDA events (median; the queue is kept busy so launch gaps don't count)
     against upstream bitsandbytes' CUDA kernels (if `import bitsandbytes` works) and a device copy of
     the same bytes (bandwidth %); prints one table and writes it with the card and date to --out.
  5. int8 section (LLM.int8(): vector quant, cuBLASLt/SIMT int8 GEMM, mm dequant): CUDA vs CPU library
     bit-exact, malformed calls, timings vs upstream's int8_linear_matmul / int8_vectorwise_quant /
     int8_mm_dequant (TOP/s for the GEMM); `--int8-only` re-runs just that section and keeps the rest
     of --out.
  6. weight-only int8/int4 section (quantize/dequantize bit-exact, GEMM bit-identical or within
     2K*2^-24*sum|a q s| + 1 ulp, malformed calls, timings vs a copy of W and torch's fp16 matmul on the
     dequantized weight) plus the op-table completeness check (every row of _ops.py exported by the CUDA
     library; `--op-names FILE` where MindSpore is not installed); `--weightonly-only` re-runs just that.
Exit status 1 when any comparison or status check fails.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
TDT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
SDT = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.uint8: "uint8",
       torch.int64: "int64", torch.int32: "int32", torch.int8: "int8"}
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.uint8: torch.uint8}

FAILURES: list[str] = []


def fail(msg: str) -> None:
    FAILURES.append(msg)
    print("FAIL:", msg, flush=True)


# ---- the AOT calling convention: tools/aot_ctypes.py (torch-free, shared with tools/cpu_isa_check.py) ----
sys.path.insert(0, str(Path(__file__).resolve().parent))
from aot_ctypes import Aot  # noqa: E402  (accepts torch tensors, host or device, duck-typed)


def stream_ptr() -> int:
    return torch.cuda.current_stream().cuda_stream


def dscalar(v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64, device="cuda")


def hscalar(v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype]))


def mismatch(a: torch.Tensor, b: torch.Tensor) -> str:
    a, b = a.cpu().reshape(-1), b.cpu().reshape(-1)
    ab, bb = a.view(BITS[a.dtype]), b.view(BITS[b.dtype])
    idx = (ab != bb).nonzero().reshape(-1)
    i = int(idx[0]) if idx.numel() else -1
    return f"{idx.numel()} of {a.numel()} differ; first at {i}: {a[i].item() if i >= 0 else ''} vs {b[i].item() if i >= 0 else ''}"


# ---- codes ----------------------------------------------------------------------------------------
def dynamic_code() -> torch.Tensor:
    try:
        import bitsandbytes.functional as F  # upstream's own map, if the wheel is importable
        return F.create_dynamic_map(signed=True).float().cpu()
    except Exception:
        ref = load_reference()
        if ref is not None and hasattr(ref, "create_dynamic_map"):
            return torch.from_numpy(np.asarray(ref.create_dynamic_map(True), dtype=np.float32))
        return torch.linspace(-1, 1, 256)


def test_codes() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    unsorted = torch.rand(256, generator=g) * 2 - 1
    dup = torch.linspace(-1, 1, 256)
    dup[100:110] = dup[100]
    return {"dynamic": dynamic_code(), "linear": torch.linspace(-1, 1, 256), "unsorted": unsorted, "dup": dup}


def make_input(n: int, dt: torch.dtype, bs: int, seed: int, special: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(1, generator=g) * 2)
    if n > 4 * bs:  # an all-zero block, a -0.0 block and an outlier
        x[bs:2 * bs] = 0.0
        x[2 * bs:3 * bs] = -0.0
        x[3 * bs + 1] = 1e4
    if n > 6 * bs and dt == torch.float32:  # a block of subnormals and zeros (absmax < 2^-128: the scaled lookup)
        x[5 * bs:6 * bs] = torch.randn(bs, generator=g) * 1e-39
        x[5 * bs + 2] = 0.0
    if dt == torch.float32 and n > 10:
        x[5:9] = torch.tensor([1e-40, -3e-39, 1e-45, 0.0])  # subnormals
    if special and n > 40:
        x[17] = float("nan")
        x[23] = float("inf")
        x[min(n - 1, bs + 3)] = float("-inf")
    return x.to(dt)


# ---- 1. CUDA vs CPU -------------------------------------------------------------------------------
def run_quant(lib: Aot, A: torch.Tensor, code: torch.Tensor, bs: int, scalar, stream=None):
    n = A.numel()
    out = torch.empty(A.shape, dtype=torch.uint8, device=A.device)
    absmax = torch.full((-(-n // bs),), -7.0, dtype=torch.float32, device=A.device)
    sfx = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[A.dtype]
    rc = lib(f"cquantize_blockwise_{sfx}", [code, A, scalar, out, absmax], stream)
    return rc, out, absmax


def run_dequant(lib: Aot, q, absmax, code, bs, dt, scalar, stream=None):
    out = torch.empty(q.shape, dtype=dt, device=q.device)
    sfx = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dt]
    rc = lib(f"cdequantize_blockwise_{sfx}", [code, q, absmax, scalar, out], stream)
    return rc, out


def check_blockwise(cuda: Aot, cpu: Aot, quick: bool) -> list[str]:
    rows = []
    codes = test_codes()
    sizes = [1, 31, 4097, 65536 + 7, 1_000_003] if quick else [1, 31, 4097, 65536 + 7, 1_000_003, 1 << 22]
    bss = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 3, 100, 4000]
    st = stream_ptr()
    for sfx, dt in TDT.items():
        ok = total = 0
        for bs in bss:
            for i, n in enumerate(sizes):
                name = ["dynamic", "linear", "unsorted", "dup"][(bs + i) % 4] if n > 1000 else "dynamic"
                code = codes[name]
                A = make_input(n, dt, bs, seed=bs * 31 + n)
                total += 1
                rc1, q1, a1 = run_quant(cuda, A.cuda(), code.cuda(), bs, dscalar(bs), st)
                rc2, q2, a2 = run_quant(cpu, A, code, bs, hscalar(bs))
                torch.cuda.synchronize()
                if rc1 or rc2:
                    fail(f"quantize {sfx} bs={bs} n={n}: status cuda={rc1} cpu={rc2}")
                    continue
                if not same_bits(a1, a2):
                    fail(f"quantize {sfx} bs={bs} n={n} code={name}: absmax {mismatch(a1, a2)}")
                    continue
                if not same_bits(q1, q2):
                    fail(f"quantize {sfx} bs={bs} n={n} code={name}: codes {mismatch(q1, q2)}")
                    continue
                rc1, d1 = run_dequant(cuda, q1, a1, code.cuda(), bs, dt, dscalar(bs), st)
                rc2, d2 = run_dequant(cpu, q2, a2, code, bs, dt, hscalar(bs))
                torch.cuda.synchronize()
                if rc1 or rc2 or not same_bits(d1, d2):
                    fail(f"dequantize {sfx} bs={bs} n={n}: status {rc1}/{rc2}; {mismatch(d1, d2) if not (rc1 or rc2) else ''}")
                    continue
                ok += 1
        rows.append(f"blockwise {sfx}: {ok}/{total} (blocksize x size) cases bit-exact vs CPU library (quantize + dequantize)")
    # misaligned views (scalar path), host-resident scalar, 2-D shapes, special values
    for sfx, dt in TDT.items():
        code = codes["dynamic"]
        base = make_input(100_001, dt, 256, seed=5)
        A = base[1:]  # 2- or 4-byte offset: not 16-byte aligned
        rc1, q1, a1 = run_quant(cuda, base.cuda()[1:], code.cuda(), 256, hscalar(256), st)
        rc2, q2, a2 = run_quant(cpu, A.contiguous(), code, 256, hscalar(256))
        torch.cuda.synchronize()
        good = rc1 == rc2 == 0 and same_bits(q1, q2) and same_bits(a1, a2)
        if not good:
            fail(f"misaligned/host-scalar quantize {sfx}: rc {rc1}/{rc2}")
        A2 = make_input(64 * 1000, dt, 64, seed=6).reshape(64, 1000)
        rc1, q1, a1 = run_quant(cuda, A2.cuda(), code.cuda(), 64, dscalar(64), st)
        rc2, q2, a2 = run_quant(cpu, A2, code, 64, hscalar(64))
        torch.cuda.synchronize()
        good2 = rc1 == rc2 == 0 and same_bits(q1, q2) and same_bits(a1, a2)
        if not good2:
            fail(f"2-D quantize {sfx}")
        rows.append(f"blockwise {sfx}: misaligned pointer + host scalar {'ok' if good else 'FAIL'}; 2-D input {'ok' if good2 else 'FAIL'}")
        A3 = make_input(1 << 16, dt, 256, seed=8, special=True)
        rc1, q1, a1 = run_quant(cuda, A3.cuda(), code.cuda(), 256, dscalar(256), st)
        rc2, q2, a2 = run_quant(cpu, A3, code, 256, hscalar(256))
        torch.cuda.synchronize()
        same = same_bits(q1, q2) and same_bits(a1, a2)
        rows.append(f"blockwise {sfx}: NaN/inf inputs, CUDA vs CPU library at its SIMD level: "
                    f"{'identical' if same else 'DIFFER (' + mismatch(q1, q2) + '; absmax ' + mismatch(a1, a2) + ')'}"
                    " [informational: CUDA follows the CPU portable path]")
    return rows


# ---- 2. malformed calls ---------------------------------------------------------------------------
def check_bad_calls(cuda: Aot, cpu: Aot) -> list[str]:
    st = stream_ptr()
    rows = []
    n_ok = n_total = 0
    for sfx, dt in TDT.items():
        for dev, lib in (("cuda", cuda), ("cpu", cpu)):
            d = "cuda" if dev == "cuda" else "cpu"
            sc = dscalar if dev == "cuda" else hscalar
            code = torch.linspace(-1, 1, 256, device=d)
            A = torch.randn(1000, device=d).to(dt)
            out = torch.empty(1000, dtype=torch.uint8, device=d)
            am = torch.empty(16, dtype=torch.float32, device=d)  # bs=64 -> 16 blocks
            q = f"cquantize_blockwise_{sfx}"
            cases = {
                "nparam": (q, [code, A, sc(64), out]),
                "A dtype": (q, [code, A.to(torch.int32), sc(64), out, am]),
                "out dtype": (q, [code, A, sc(64), out.to(torch.int8), am]),
                "absmax size": (q, [code, A, sc(64), out, am[:15]]),
                "blocksize 0": (q, [code, A, sc(0), out, am]),
                "blocksize -64": (q, [code, A, sc(-64), out, am]),
                "blocksize float": (q, [code, A, torch.tensor(64.5, device=d), out, am]),
                "blocksize none": (q, [code, A, None, out, am]),
                "code size": (q, [code[:255], A, sc(64), out, am]),
                "null A": (q, [code, (None, (1000,), SDT[dt]), sc(64), out, am]),
            }
            dq = f"cdequantize_blockwise_{sfx}"
            o2 = torch.empty(1000, dtype=dt, device=d)
            cases.update({
                "dq nparam": (dq, [code, out, am, sc(64)]),
                "dq out dtype": (dq, [code, out, am, sc(64), o2.to(torch.int32)]),
                "dq absmax short": (dq, [code, out, am[:15], sc(64), o2]),
                "dq blocksize 0": (dq, [code, out, am, sc(0), o2]),
                "dq out size": (dq, [code, out, am, sc(64), o2[:999]]),
            })
            for k, (name, args) in cases.items():
                rc = lib(name, args, st if dev == "cuda" else None)
                cases[k] = rc
            if dev == "cuda":
                torch.cuda.synchronize()
                cuda_rcs = cases
            else:
                for k, rc in cases.items():
                    n_total += 1
                    if cuda_rcs[k] != rc or rc == 0:
                        fail(f"malformed {sfx} {k}: cuda={cuda_rcs[k]} cpu={rc}")
                    else:
                        n_ok += 1
    torch.cuda.synchronize()
    rows.append(f"malformed calls: {n_ok}/{n_total} return the CPU library's nonzero status; no CUDA error after")
    return rows


# ---- 3. CPU library vs numpy reference --------------------------------------------------------------
def load_reference():
    p = ROOT / "bitsandbytes_ms" / "_reference.py"
    if not p.exists():
        return None
    spec = importlib.util.spec_from_file_location("bnb_ms_reference", p)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # e.g. ml_dtypes missing
        print("reference not loadable:", e)
        return None
    return mod


def cpu_vs_reference(cpu_lib: str) -> str:
    ref = load_reference()
    if ref is None:
        return "CPU vs numpy reference: _reference.py not available"
    cpu = Aot(cpu_lib)
    level = {0: "scalar", 1: "avx2", 2: "avx512"}.get(cpu.dll.bnb_ms_simd_level(), "?") if cpu.has("bnb_ms_simd_level") else "?"
    ok = total = 0
    code = dynamic_code()
    for sfx, dt in TDT.items():
        for bs in (32, 64, 256, 4096, 100):
            for n in (33, 4097, 300_001):
                A = make_input(n, dt, bs, seed=n + bs)
                total += 1
                rc, q, am = run_quant(cpu, A, code, bs, hscalar(bs))
                rq, ram = ref.quantize_blockwise(A.float().numpy(), code.numpy(), bs)
                good = rc == 0 and np.array_equal(q.numpy(), rq) and np.array_equal(am.numpy().view(np.int32), ram.view(np.int32))
                if good:
                    rc, d = run_dequant(cpu, q, am, code, bs, dt, hscalar(bs))
                    rd = torch.from_numpy(np.asarray(ref.dequantize_blockwise(rq, ram, code.numpy(), bs, "float32"), dtype=np.float32)).to(dt).view(BITS[dt]).numpy()
                    dn = d.view(BITS[dt]).numpy()
                    good = rc == 0 and np.array_equal(dn, rd)
                if good:
                    ok += 1
                else:
                    fail(f"CPU[{level}] vs reference {sfx} bs={bs} n={n}")
    return f"CPU library [{level}] vs numpy reference: {ok}/{total} cases bit-exact (quantize + dequantize)"


# ---- 4. timing ------------------------------------------------------------------------------------
def time_gpu(fn, reps: int = 25) -> float:
    """Median milliseconds of fn() on the current stream; a sleep kernel keeps the queue busy so the
    host's launch time is not counted."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda._sleep(200_000)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def bench(cuda: Aot, quick: bool):
    try:
        import bitsandbytes  # noqa: F401
        up = torch.ops.bitsandbytes
        up_name = f"bitsandbytes {bitsandbytes.__version__}"
    except Exception as e:
        up, up_name = None, f"upstream unavailable ({type(e).__name__}: {e})"
    print(up_name)
    rows = []
    st = stream_ptr()
    M = 8192
    n = M * M
    code = dynamic_code().cuda()
    for sfx in ("fp16", "fp32"):
        dt = TDT[sfx]
        A = torch.randn(M, M, device="cuda").to(dt)
        esz = A.element_size()
        dst = torch.empty_like(A)
        t_copy = time_gpu(lambda: dst.copy_(A))
        copy_bw = 2 * n * esz / t_copy / 1e6  # GB/s
        for bs in (64, 256, 4096):
            nb = -(-n // bs)
            out = torch.empty(M, M, dtype=torch.uint8, device="cuda")
            am = torch.empty(nb, dtype=torch.float32, device="cuda")
            qcall = cuda.prepare(f"cquantize_blockwise_{sfx}", [code, A, hscalar(bs), out, am], st)
            t_q = time_gpu(lambda: qcall())
            dout = torch.empty_like(A)
            dcall = cuda.prepare(f"cdequantize_blockwise_{sfx}", [code, out, am, hscalar(bs), dout], st)
            t_d = time_gpu(lambda: dcall())
            t_uq = t_ud = float("nan")
            exact = ""
            if up is not None:
                try:
                    t_uq = time_gpu(lambda: up.quantize_blockwise(A, code, bs))
                    uq, uam = up.quantize_blockwise(A, code, bs)
                    uout = torch.empty_like(A)
                    t_ud = time_gpu(lambda: up.dequantize_blockwise.out(out, am, code, bs, dt, out=uout))
                    up.dequantize_blockwise.out(out, am, code, bs, dt, out=uout)
                    torch.cuda.synchronize()
                    exact = f"{(uq == out).float().mean().item() * 100:.2f}% codes equal to upstream CUDA"
                except Exception as e:
                    exact = f"upstream failed: {type(e).__name__}"
            traffic_q = n * esz + n + 4 * nb
            for op, t, tu in (("quantize", t_q, t_uq), ("dequantize", t_d, t_ud)):
                bw = traffic_q / t / 1e6
                rows.append(dict(op=op, dtype=sfx, bs=bs, ours_us=t * 1e3, up_us=tu * 1e3,
                                 speedup=(tu / t) if tu == tu else float("nan"), gbs=bw, pct=100 * bw / copy_bw,
                                 copy_gbs=copy_bw, note=exact if op == "quantize" else ""))
        # a call with the blocksize as a device scalar (MindSpore GPU): one D2H copy + sync per call
        out = torch.empty(M, M, dtype=torch.uint8, device="cuda")
        am = torch.empty(n // 256, dtype=torch.float32, device="cuda")
        qdev = cuda.prepare(f"cquantize_blockwise_{sfx}", [code, A, dscalar(256), out, am], st)
        import time as _t
        qdev(); torch.cuda.synchronize()
        t0 = _t.perf_counter()
        for _ in range(20):
            qdev()
        torch.cuda.synchronize()
        rows.append(dict(op="quantize (device scalar, wall)", dtype=sfx, bs=256, ours_us=(_t.perf_counter() - t0) / 20 * 1e6,
                         up_us=float("nan"), speedup=float("nan"), gbs=float("nan"), pct=float("nan"), copy_gbs=copy_bw, note="host wall time per call incl. scalar sync"))
        del A, dst
    return rows, up_name


# ==== 4-bit (NF4/FP4) and optimizers (second CUDA wave) ===========================================
SDT.update({torch.float64: "float64", torch.bool: "bool"})
NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
FP4 = [0.0, 0.0052083333, 0.6666667, 1.0, 0.3333333, 0.5, 0.1666667, 0.25,
       0.0, -0.0052083333, -0.6666667, -1.0, -0.3333333, -0.5, -0.1666667, -0.25]


def code4(qt: str) -> torch.Tensor:
    try:
        import bitsandbytes.functional as F
        return F.get_4bit_type(qt, device="cpu").float().contiguous()
    except Exception:
        return torch.tensor(NF4 if qt == "nf4" else FP4, dtype=torch.float32)


def unsigned_dynamic_code() -> torch.Tensor:
    try:
        import bitsandbytes.functional as F
        return F.create_dynamic_map(signed=False).float().cpu()
    except Exception:
        return torch.linspace(0, 1, 256)


def run_q4(lib, A, code, bs, scalar, qt, stream=None):
    n = A.numel()
    out = torch.full(((n + 1) // 2, 1), 0xAB, dtype=torch.uint8, device=A.device)
    absmax = torch.full((-(-n // bs),), -7.0, dtype=torch.float32, device=A.device)
    sfx = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[A.dtype]
    rc = lib(f"cquantize_blockwise_{sfx}_{qt}", [code, A, scalar, out, absmax], stream)
    return rc, out, absmax


def run_dq4(lib, q, absmax, code, bs, n, dt, qt, mk, stream=None):
    out = torch.empty(n, dtype=dt, device=q.device)
    sfx = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[dt]
    rc = lib(f"cdequantize_blockwise_{sfx}_{qt}", [code, q, absmax, mk(bs), mk(n), out], stream)
    return rc, out


def check_fourbit(cuda: Aot, cpu: Aot, quick: bool) -> list[str]:
    rows = []
    st = stream_ptr()
    sizes = [1, 2, 31, 4097, 65536 + 7, 1_000_003] + ([] if quick else [1 << 22])
    bss = [32, 64, 128, 256, 512, 1024, 2048, 4096, 6, 100, 2]
    for qt in ("nf4", "fp4"):
        code = code4(qt)
        for sfx, dt in TDT.items():
            ok = total = 0
            for bs in bss:
                for n in sizes:
                    total += 1
                    A = make_input(n, dt, bs, seed=bs * 17 + n, special=(n == 4097))
                    rc1, q1, a1 = run_q4(cuda, A.cuda(), code.cuda(), bs, dscalar(bs), qt, st)
                    rc2, q2, a2 = run_q4(cpu, A, code, bs, hscalar(bs), qt)
                    torch.cuda.synchronize()
                    if rc1 or rc2:
                        fail(f"quantize_4bit {qt} {sfx} bs={bs} n={n}: status cuda={rc1} cpu={rc2}")
                        continue
                    if not same_bits(a1, a2):
                        fail(f"quantize_4bit {qt} {sfx} bs={bs} n={n}: absmax {mismatch(a1, a2)}")
                        continue
                    if not same_bits(q1, q2):
                        fail(f"quantize_4bit {qt} {sfx} bs={bs} n={n}: packed {mismatch(q1, q2)}")
                        continue
                    rc1, d1 = run_dq4(cuda, q1, a1, code.cuda(), bs, n, dt, qt, dscalar, st)
                    rc2, d2 = run_dq4(cpu, q2, a2, code, bs, n, dt, qt, hscalar)
                    torch.cuda.synchronize()
                    if rc1 or rc2 or not same_bits(d1, d2):
                        fail(f"dequantize_4bit {qt} {sfx} bs={bs} n={n}: status {rc1}/{rc2} "
                             f"{mismatch(d1, d2) if not (rc1 or rc2) else ''}")
                        continue
                    ok += 1
            rows.append(f"4-bit {qt} {sfx}: {ok}/{total} (blocksize x size, incl. NaN/inf/-0/subnormal/partial blocks) "
                        "bit-exact vs CPU library (quantize packed bytes + absmax, dequantize)")
    # misaligned dequantize output / odd offsets -> generic paths
    code = code4("nf4")
    A = make_input(100_001, torch.float16, 64, seed=3)
    rc1, q1, a1 = run_q4(cuda, A.cuda(), code.cuda(), 64, hscalar(64), "nf4", st)
    base = torch.empty(100_002, dtype=torch.float16, device="cuda")
    o = base[1:]
    rc = cuda("cdequantize_blockwise_fp16_nf4", [code.cuda(), q1, a1, hscalar(64), hscalar(100_001), o], st)
    rc2, q2, a2 = run_q4(cpu, A, code, 64, hscalar(64), "nf4")
    _, d2 = run_dq4(cpu, q2, a2, code, 64, 100_001, torch.float16, "nf4", hscalar)
    torch.cuda.synchronize()
    good = rc == rc1 == 0 and same_bits(o, d2)
    if not good:
        fail("4-bit dequantize into misaligned output")
    rows.append(f"4-bit: misaligned output + host scalars {'ok' if good else 'FAIL'}")
    return rows


def run_gemv(lib, A, B, absmax, code, bs, N, stream=None, mk=hscalar):
    sfx = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[A.dtype]
    out = torch.full(tuple(A.shape[:-1]) + (N,), float("nan"), dtype=A.dtype, device=A.device)
    rc = lib(f"cgemm_4bit_inference_naive_{sfx}", [A, B, absmax, code, mk(bs), mk(N), out], stream)
    return rc, out


def check_gemv(cuda: Aot, cpu: Aot, quick: bool) -> list[str]:
    rows = []
    st = stream_ptr()
    shapes = [(1, 11008, 4096, 64), (1, 4096, 11008, 64), (1, 333, 4096, 128), (1, 64, 100, 64), (1, 50, 96, 32),
              (3, 128, 256, 64), (1, 129, 512, 100), (2, 17, 34, 2), (1, 256, 1024, 4096)]
    for qt in ("nf4", "fp4"):
        code = code4(qt)
        for sfx, dt in TDT.items():
            ok = total = 0
            worst = 0.0
            for (M, N, K, bs) in shapes:
                total += 1
                g = torch.Generator().manual_seed(N * 7 + K)
                W = torch.randn(N * K, generator=g).to(dt)
                A = torch.randn(M, K, generator=g).to(dt)
                rcq, q, am = run_q4(cpu, W, code, bs, hscalar(bs), qt)
                rc2, o2 = run_gemv(cpu, A, q, am, code, bs, N)
                rc1, o1 = run_gemv(cuda, A.cuda(), q.cuda(), am.cuda(), code.cuda(), bs, N, st, dscalar)
                torch.cuda.synchronize()
                if rcq or rc1 or rc2:
                    fail(f"gemv {qt} {sfx} {M}x{N}x{K} bs={bs}: status cuda={rc1} cpu={rc2}")
                    continue
                # error relative to sum_k |w_k x_k| (the scale of fp32 accumulation error)
                _, Wd = run_dq4(cpu, q, am, code, bs, N * K, torch.float32, qt, hscalar)
                S = (A.float().abs() @ Wd.reshape(N, K).abs().t()) if K else torch.zeros(M, N)
                d = (o1.cpu().float() - o2.float()).abs()
                if dt == torch.float32:
                    tol = 1e-5 * S + 1e-30
                else:  # one rounding of the output each: 1 ulp of the larger + fp32 accumulation
                    ulp = 2.0 ** -10 if dt == torch.float16 else 2.0 ** -7
                    tol = ulp * torch.maximum(o1.cpu().float().abs(), o2.float().abs()) + 1e-5 * S + 1e-30
                r = float((d / tol).max()) if d.numel() else 0.0
                worst = max(worst, r)
                if not (d <= tol).all() or o1.isnan().any():
                    fail(f"gemv {qt} {sfx} {M}x{N}x{K} bs={bs}: max err/tol {r:.3g}")
                    continue
                ok += 1
            rows.append(f"gemv_4bit {qt} {sfx}: {ok}/{total} shapes within tolerance of the CPU library "
                        f"(fp32: 1e-5 x sum|w x|; fp16/bf16: + 1 output ulp); worst err/tol {worst:.3f}")
    return rows


OPT32 = {"adam": ("cadam32bit_grad_fp32", "cadam32bit_grad_fp16", "cadam32bit_grad_bf16"),
         "ademamix": ("cademamix32bit_grad_fp32", "cademamix32bit_grad_fp16", "cademamix32bit_grad_bf16"),
         "lion": ("clion32bit_grad_fp32", "clion32bit_grad_fp16", "clion32bit_grad_bf16"),
         "momentum": ("cmomentum32bit_grad_32", "cmomentum32bit_grad_16", "cmomentum32bit_grad_bf16"),
         "rmsprop": ("crmsprop32bit_grad_32", "crmsprop32bit_grad_16", "crmsprop32bit_grad_bf16"),
         "adagrad": ("cadagrad32bit_grad_32", "cadagrad32bit_grad_16", "cadagrad32bit_grad_bf16")}
OPT8 = {o: tuple(f"c{o}_8bit_blockwise_grad_{s}" for s in ("fp32", "fp16", "bf16"))
        for o in ("adam", "ademamix", "momentum", "rmsprop", "lion", "adagrad")}
TWO = ("adam", "ademamix")


def fsc(v, dev):
    return torch.tensor(float(v), dtype=torch.float64, device=dev)


def isc(v, dev):
    return torch.tensor(int(v), dtype=torch.int64, device=dev)


def opt32_args(t, hp, step, dev, max_unorm=0.0):
    g, p, s1, s2, un = t
    return [g, p, s1, s2, un, fsc(max_unorm, dev), fsc(0.0, dev), fsc(hp["b1"], dev), fsc(hp["b2"], dev),
            fsc(hp["b3"], dev), fsc(hp["alpha"], dev), fsc(hp["eps"], dev), fsc(hp["wd"], dev), isc(step, dev),
            fsc(hp["lr"], dev), fsc(hp["gnorm"], dev), torch.tensor(False, device=dev)]


def opt8_args(t, hp, step, dev):
    g, p, s1, s2, q1, q2, a1, a2 = t
    return [g, p, s1, s2, q1, q2, a1, a2, fsc(hp["b1"], dev), fsc(hp["b2"], dev), fsc(hp["b3"], dev),
            fsc(hp["alpha"], dev), fsc(hp["eps"], dev), isc(step, dev), fsc(hp["lr"], dev), fsc(hp["wd"], dev),
            fsc(hp["gnorm"], dev), torch.tensor(False, device=dev)]


HP = [dict(b1=0.9, b2=0.999, b3=0.9999, alpha=5.0, eps=1e-8, wd=0.0, lr=1e-3, gnorm=1.0),
      dict(b1=0.8, b2=0.99, b3=0.999, alpha=2.0, eps=1e-6, wd=1e-2, lr=3e-3, gnorm=0.5)]


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    a, b = a.cpu().reshape(-1), b.cpu().reshape(-1)
    if a.dtype == torch.float32:
        ia, ib = a.view(torch.int32).long(), b.view(torch.int32).long()
    else:
        ia, ib = a.view(torch.int16).long(), b.view(torch.int16).long()
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF if a.dtype == torch.float32 else ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF if b.dtype == torch.float32 else ib & 0x7FFF), ib)
    return int((ia - ib).abs().max()) if ia.numel() else 0


def check_optim(cuda: Aot, cpu: Aot, quick: bool) -> list[str]:
    rows = []
    st = stream_ptr()
    n_list = [1, 255, 4096, 100_003]
    # 32-bit
    for opt, names in OPT32.items():
        exact = total = 0
        maxu = 0
        for sfx, name in zip(TDT, names):
            dt = TDT[sfx]
            for n in n_list:
                for hi, hp in enumerate(HP):
                    g0 = torch.Generator().manual_seed(n + hi)
                    p = torch.randn(n, generator=g0).to(dt)
                    s1 = torch.randn(n * (2 if opt == "ademamix" else 1), generator=g0)
                    if opt in ("rmsprop", "adagrad"):
                        s1 = s1.abs()
                    s2 = torch.rand(n, generator=g0) if opt in TWO else None
                    cpu_t = [None, p.clone(), s1.clone(), None if s2 is None else s2.clone(), None]
                    cu_t = [None, p.cuda(), s1.cuda(), None if s2 is None else s2.cuda(), None]
                    good = True
                    for step in (1, 2, 3):
                        gr = torch.randn(n, generator=g0).to(dt)
                        cpu_t[0], cu_t[0] = gr, gr.cuda()
                        s_c = torch.full((1,), 9, dtype=torch.int32)
                        s_g = torch.full((1,), 9, dtype=torch.int32, device="cuda")
                        rc2 = cpu(name, opt32_args(cpu_t, hp, step, "cpu") + [s_c])
                        rc1 = cuda(name, opt32_args(cu_t, hp, step, "cuda") + [s_g], st)
                        torch.cuda.synchronize()
                        if rc1 or rc2 or int(s_g.item()) != 0 or int(s_c.item()) != 0:
                            fail(f"{name} n={n}: status {rc1}/{rc2}, status output {int(s_g.item())}")
                            good = False
                            break
                        same = same_bits(cu_t[1], cpu_t[1]) and same_bits(cu_t[2], cpu_t[2]) and (
                            s2 is None or same_bits(cu_t[3], cpu_t[3]))
                        if not same:
                            u = max(ulps(cu_t[1], cpu_t[1]), ulps(cu_t[2], cpu_t[2]))
                            maxu = max(maxu, u)
                            if u > 4:
                                fail(f"{name} n={n} hp={hi} step={step}: p/state differ by {u} ulps")
                            good = False
                            break
                    total += 1
                    exact += good
        rows.append(f"optim 32-bit {opt} (fp32/fp16/bf16, n in {n_list}, 2 hyper-parameter sets, 3 steps, "
                    f"device scalars): {exact}/{total} bit-exact (p, state1, state2) vs CPU library; max ulps {maxu}")
    # LAMB/LARS path (max_unorm > 0)
    okc = totc = 0
    worst = 0
    for opt in ("adam", "momentum", "rmsprop"):
        for sfx, name in zip(TDT, OPT32[opt]):
            dt = TDT[sfx]
            n = 100_003
            g0 = torch.Generator().manual_seed(11)
            p = torch.randn(n, generator=g0).to(dt)
            s1 = torch.rand(n, generator=g0)
            s2 = torch.rand(n, generator=g0) if opt == "adam" else None
            gr = torch.randn(n, generator=g0).to(dt)
            un_c, un_g = torch.zeros(1), torch.zeros(1, device="cuda")
            ct = [gr, p.clone(), s1.clone(), None if s2 is None else s2.clone(), un_c]
            gt = [gr.cuda(), p.cuda(), s1.cuda(), None if s2 is None else s2.cuda(), un_g]
            hp = HP[1]
            rc2 = cpu(name, opt32_args(ct, hp, 2, "cpu", max_unorm=0.02) + [torch.zeros(1, dtype=torch.int32)])
            rc1 = cuda(name, opt32_args(gt, hp, 2, "cuda", max_unorm=0.02) + [torch.zeros(1, dtype=torch.int32, device="cuda")], st)
            torch.cuda.synchronize()
            totc += 1
            u = max(ulps(gt[1], ct[1]), ulps(gt[2], ct[2]))
            worst = max(worst, u)
            urel = abs(float(un_g.item()) - float(un_c.item())) / max(1e-30, abs(float(un_c.item())))
            if rc1 or rc2 or u > 2 or urel > 1e-6:
                fail(f"{name} max_unorm path: rc {rc1}/{rc2}, {u} ulps, unorm rel diff {urel:.2e}")
            else:
                okc += 1
    rows.append(f"optim 32-bit max_unorm (LAMB/LARS) path: {okc}/{totc} within 2 ulps (p, state) and unorm rel 1e-6; "
                f"max ulps {worst}")
    # 8-bit blockwise
    qs, qu = dynamic_code(), unsigned_dynamic_code()
    for opt, names in OPT8.items():
        exact = total = 0
        maxu = 0
        for sfx, name in zip(TDT, names):
            dt = TDT[sfx]
            for n in n_list:
                for hi, hp in enumerate(HP):
                    g0 = torch.Generator().manual_seed(n * 3 + hi)
                    mult = 2 if opt == "ademamix" else 1
                    nb = -(-n // 256)
                    p = torch.randn(n, generator=g0).to(dt)
                    s1 = torch.randint(0, 256, (mult * n,), generator=g0, dtype=torch.uint8)
                    a1 = torch.rand(mult * nb, generator=g0) * 0.1
                    q1 = qu if opt in ("rmsprop", "adagrad") else qs
                    if opt in TWO:
                        s2 = torch.randint(0, 256, (n,), generator=g0, dtype=torch.uint8)
                        a2 = torch.rand(nb, generator=g0) * 0.01
                        q2 = qu
                    else:
                        s2 = a2 = q2 = None
                    cl = lambda x: None if x is None else x.clone()  # noqa: E731
                    cu = lambda x: None if x is None else x.cuda()  # noqa: E731
                    ct = [None, cl(p), cl(s1), cl(s2), q1, q2, cl(a1), cl(a2)]
                    gt = [None, cu(p), cu(s1), cu(s2), cu(q1), cu(q2), cu(a1), cu(a2)]
                    good = True
                    for step in (1, 2, 3):
                        gr = torch.randn(n, generator=g0).to(dt)
                        ct[0], gt[0] = gr, gr.cuda()
                        s_g = torch.full((1,), 9, dtype=torch.int32, device="cuda")
                        rc2 = cpu(name, opt8_args(ct, hp, step, "cpu") + [torch.zeros(1, dtype=torch.int32)])
                        rc1 = cuda(name, opt8_args(gt, hp, step, "cuda") + [s_g], st)
                        torch.cuda.synchronize()
                        if rc1 or rc2 or int(s_g.item()) != 0:
                            fail(f"{name} n={n}: status {rc1}/{rc2}")
                            good = False
                            break
                        states_same = same_bits(gt[2], ct[2]) and same_bits(gt[6], ct[6]) and (
                            s2 is None or (same_bits(gt[3], ct[3]) and same_bits(gt[7], ct[7])))
                        p_same = same_bits(gt[1], ct[1])
                        if not (states_same and p_same):
                            u = ulps(gt[1], ct[1])
                            maxu = max(maxu, u)
                            fail(f"{name} n={n} hp={hi} step={step}: state bytes {'equal' if states_same else 'DIFFER'}, "
                                 f"p {u} ulps")
                            good = False
                            break
                    total += 1
                    exact += good
        rows.append(f"optim 8-bit blockwise {opt} (fp32/fp16/bf16, n in {n_list}, 2 hyper-parameter sets, 3 steps): "
                    f"{exact}/{total} bit-exact (p, state bytes, absmax) vs CPU library")
    return rows


def check_bad_calls2(cuda: Aot, cpu: Aot) -> list[str]:
    st = stream_ptr()
    n_ok = n_total = 0
    results = {}
    for dev, lib in (("cuda", cuda), ("cpu", cpu)):
        d = dev
        sc = dscalar if dev == "cuda" else hscalar
        code = torch.linspace(-1, 1, 16, device=d)
        A = torch.randn(1000, device=d).half()
        out = torch.empty(500, 1, dtype=torch.uint8, device=d)
        am = torch.empty(16, dtype=torch.float32, device=d)
        dq_out = torch.empty(1000, dtype=torch.float16, device=d)
        q, dq, gv = "cquantize_blockwise_fp16_nf4", "cdequantize_blockwise_fp16_fp4", "cgemm_4bit_inference_naive_fp16"
        x = torch.randn(1, 64, device=d).half()
        B = torch.empty(32 * 64 // 2, 1, dtype=torch.uint8, device=d)
        bam = torch.empty(32, dtype=torch.float32, device=d)
        go = torch.empty(1, 32, dtype=torch.float16, device=d)
        cases = {
            "q4 nparam": (q, [code, A, sc(64), out]),
            "q4 A dtype": (q, [code, A.float(), sc(64), out, am]),
            "q4 blocksize odd": (q, [code, A, sc(63), out, am]),
            "q4 blocksize 0": (q, [code, A, sc(0), out, am]),
            "q4 out size": (q, [code, A, sc(64), out[:499], am]),
            "q4 absmax size": (q, [code, A, sc(64), out, am[:15]]),
            "q4 code size": (q, [torch.linspace(-1, 1, 256, device=d), A, sc(64), out, am]),
            "q4 null A": (q, [code, (None, (1000,), "float16"), sc(64), out, am]),
            "dq4 nparam": (dq, [code, out, am, sc(64), dq_out]),
            "dq4 n negative": (dq, [code, out, am, sc(64), sc(-1), dq_out]),
            "dq4 n mismatch": (dq, [code, out, am, sc(64), sc(999), dq_out]),
            "dq4 absmax short": (dq, [code, out, am[:15], sc(64), sc(1000), dq_out]),
            "dq4 out dtype": (dq, [code, out, am, sc(64), sc(1000), dq_out.float()]),
            "gemv nparam": (gv, [x, B, bam, code, sc(64), go]),
            "gemv B dtype": (gv, [x, B.to(torch.int8), bam, code, sc(64), sc(32), go]),
            "gemv bs odd": (gv, [x, B, bam, code, sc(3), sc(32), go]),
            "gemv absmax short": (gv, [x, B, bam[:31], code, sc(64), sc(32), go]),
            "gemv B short": (gv, [x, B[:1000], bam, code, sc(64), sc(32), go]),
            "gemv out shape": (gv, [x, B, bam, code, sc(64), sc(31), go]),
            "gemv A dtype": (gv, [x.float(), B, bam, code, sc(64), sc(32), go]),
        }
        f = lambda v: torch.tensor(float(v), dtype=torch.float64, device=d)  # noqa: E731
        i = lambda v: torch.tensor(int(v), dtype=torch.int64, device=d)  # noqa: E731
        g = torch.randn(300, device=d)
        p = torch.randn(300, device=d)
        s1 = torch.zeros(300, device=d)
        s2 = torch.zeros(300, device=d)
        stt = torch.zeros(1, dtype=torch.int32, device=d)
        hp = [f(0.9), f(0.999), f(0.0), f(0.0), f(1e-8), f(0.0), i(1), f(1e-3), f(1.0), torch.tensor(False, device=d)]
        a32 = "cadam32bit_grad_fp32"
        base32 = [g, p, s1, s2, None, f(0.0), f(0.0)] + hp
        cases.update({
            "adam32 nparam": (a32, base32),
            "adam32 state2 none": (a32, [g, p, s1, None, None, f(0.0), f(0.0)] + hp + [stt]),
            "adam32 p dtype": (a32, [g, p.half(), s1, s2, None, f(0.0), f(0.0)] + hp + [stt]),
            "adam32 state1 size": (a32, [g, p, s1[:299], s2, None, f(0.0), f(0.0)] + hp + [stt]),
            "adam32 step 0": (a32, [g, p, s1, s2, None, f(0.0), f(0.0)] + hp[:6] + [i(0)] + hp[7:] + [stt]),
            "adam32 status dtype": (a32, base32 + [stt.float()]),
        })
        q8 = torch.zeros(300, dtype=torch.uint8, device=d)
        qm = torch.linspace(-1, 1, 256, device=d)
        a1 = torch.ones(2, device=d)
        hp8 = [f(0.9), f(0.999), f(0.0), f(0.0), f(1e-8), i(1), f(1e-3), f(0.0), f(1.0), torch.tensor(False, device=d)]
        a8 = "cadam_8bit_blockwise_grad_fp32"
        cases.update({
            "adam8 nparam": (a8, [g, p, q8, q8.clone(), qm, qm, a1, a1.clone()] + hp8),
            "adam8 state dtype": (a8, [g, p, s1, q8.clone(), qm, qm, a1, a1.clone()] + hp8 + [stt]),
            "adam8 absmax size": (a8, [g, p, q8, q8.clone(), qm, qm, a1[:1], a1.clone()] + hp8 + [stt]),
            "adam8 qmap2 none": (a8, [g, p, q8, q8.clone(), qm, None, a1, a1.clone()] + hp8 + [stt]),
            "adam8 step 0": (a8, [g, p, q8, q8.clone(), qm, qm, a1, a1.clone()] + hp8[:5] + [i(0)] + hp8[6:] + [stt]),
        })
        results[dev] = {k: lib(nm, args, st if dev == "cuda" else None) for k, (nm, args) in cases.items()}
        if dev == "cuda":
            torch.cuda.synchronize()
    for k, rc in results["cpu"].items():
        n_total += 1
        if results["cuda"][k] != rc or rc == 0:
            fail(f"malformed (4-bit/optim) {k}: cuda={results['cuda'][k]} cpu={rc}")
        else:
            n_ok += 1
    err = torch.cuda.synchronize() or "none"
    return [f"malformed calls (4-bit, gemv, optimizers): {n_ok}/{n_total} return the CPU library's nonzero status; "
            f"CUDA error after: {err}"]


def time_rot(fns, reps: int = 25) -> float:
    """Median ms per call cycling through fns (different buffers, so the data are not L2-resident)."""
    k = [0]

    def one():
        fns[k[0] % len(fns)]()
        k[0] += 1
    return time_gpu(one, reps)


def bench2(cuda: Aot, quick: bool):
    try:
        import bitsandbytes  # noqa: F401
        up = torch.ops.bitsandbytes
        import bitsandbytes.functional as UF
    except Exception:
        up = UF = None
    rows = []
    st = stream_ptr()
    big = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
    dst = torch.empty_like(big)
    t = time_gpu(lambda: dst.copy_(big), 10)
    copy_bw = 2 * big.numel() * 4 / t / 1e6
    del big, dst
    print(f"copy bandwidth (1 GiB copy_): {copy_bw:.0f} GB/s", flush=True)
    nan = float("nan")

    def row(op, dtype, shape, t, tu, traffic, note=""):
        bw = traffic / t / 1e6
        rows.append(dict(op=op, dtype=dtype, bs=shape, ours_us=t * 1e3, up_us=tu * 1e3,
                         speedup=(tu / t) if tu == tu else nan, gbs=bw, pct=100 * bw / copy_bw, copy_gbs=copy_bw,
                         note=note))

    # 4-bit quantize / dequantize, 8192x8192 (x4 buffers, > L2)
    M = 8192
    n = M * M
    for sfx in ("fp16", "bf16", "fp32"):
        dt = TDT[sfx]
        for qt in ("nf4",) if sfx != "fp16" else ("nf4", "fp4"):
            code = code4(qt).cuda()
            bs = 64
            R = 2
            As = [torch.randn(M, M, device="cuda").to(dt) for _ in range(R)]
            outs = [torch.empty(n // 2, 1, dtype=torch.uint8, device="cuda") for _ in range(R)]
            ams = [torch.empty(n // bs, device="cuda") for _ in range(R)]
            qf = [cuda.prepare(f"cquantize_blockwise_{sfx}_{qt}", [code, As[r], hscalar(bs), outs[r], ams[r]], st)
                  for r in range(R)]
            tq = time_rot(qf)
            dos = [torch.empty(n, dtype=dt, device="cuda") for _ in range(R)]
            df = [cuda.prepare(f"cdequantize_blockwise_{sfx}_{qt}", [code, outs[r], ams[r], hscalar(bs), hscalar(n), dos[r]], st)
                  for r in range(R)]
            td = time_rot(df)
            tuq = tud = nan
            note = ""
            if up is not None:
                try:
                    tuq = time_rot([lambda r=r: up.quantize_4bit(As[r], bs, qt, torch.uint8) for r in range(R)])
                    uq, uam = up.quantize_4bit(As[0], bs, qt, torch.uint8)
                    qf[0]()
                    torch.cuda.synchronize()
                    note = f"{(uq.reshape(-1) == outs[0].reshape(-1)).float().mean().item() * 100:.2f}% packed bytes equal to upstream CUDA"
                    tud = time_rot([lambda r=r: up.dequantize_4bit.out(outs[r], ams[r], bs, qt, [M, M], dt,
                                                                       out=dos[r].view(M, M)) for r in range(R)])
                except Exception as e:
                    note = f"upstream failed: {type(e).__name__}: {e}"[:120]
            traffic = n * As[0].element_size() + n // 2 + 4 * (n // bs)
            row(f"quantize_4bit {qt}", sfx, f"8192x8192 bs{bs}", tq, tuq, traffic, note)
            row(f"dequantize_4bit {qt}", sfx, f"8192x8192 bs{bs}", td, tud, traffic)
            del As, outs, ams, dos
    # gemv
    for (N, K) in ((11008, 4096), (4096, 11008), (8192, 8192)):
        for sfx in ("fp16", "bf16", "fp32"):
            dt = TDT[sfx]
            bs = 64
            code = code4("nf4").cuda()
            W = torch.randn(N * K, device="cuda").to(dt)
            q0 = torch.empty((N * K) // 2, 1, dtype=torch.uint8, device="cuda")
            a0 = torch.empty(N * K // bs, device="cuda")
            cuda("cquantize_blockwise_%s_nf4" % sfx, [code, W, hscalar(bs), q0, a0], st)
            del W
            wbytes = N * K // 2 + 4 * N * K // bs
            R = max(2, int(6 * 2**30 // 10 // wbytes))  # ~600 MB of weights in rotation
            R = min(R, 16)
            qs = [q0.clone() for _ in range(R)]
            ams = [a0.clone() for _ in range(R)]
            A = torch.randn(1, K, device="cuda").to(dt)
            outs = [torch.empty(1, N, dtype=dt, device="cuda") for _ in range(R)]
            fns = [cuda.prepare(f"cgemm_4bit_inference_naive_{sfx}", [A, qs[r], ams[r], code, hscalar(bs), hscalar(N), outs[r]], st)
                   for r in range(R)]
            t = time_rot(fns, 50)
            tu = nan
            note = f"{R} weight copies rotated (not L2-resident)"
            if up is not None:
                try:
                    uo = [torch.empty(1, N, dtype=dt, device="cuda") for _ in range(R)]
                    tu = time_rot([lambda r=r: up.gemv_4bit.out(A, qs[r], [N, K], ams[r], code, bs, out=uo[r])
                                   for r in range(R)], 50)
                    fns[0]()
                    up.gemv_4bit.out(A, qs[0], [N, K], ams[0], code, bs, out=uo[0])
                    torch.cuda.synchronize()
                    rel = ((uo[0].float() - outs[0].float()).abs().max() / outs[0].float().abs().max()).item()
                    note += f"; max |ours-upstream| / max|out| = {rel:.1e}"
                except Exception as e:
                    note += f"; upstream failed: {type(e).__name__}: {e}"[:120]
            traffic = wbytes + K * A.element_size() + N * A.element_size()
            row("gemv_4bit nf4 (batch 1)", sfx, f"N={N} K={K} bs{bs}", t, tu, traffic, note)
            del qs, ams, outs
    # optimizers: n = 64M parameters, fp32 and bf16 params
    n = 1 << 26
    for sfx in ("fp32", "bf16"):
        dt = TDT[sfx]
        g = torch.randn(n, device="cuda").to(dt)
        p = torch.randn(n, device="cuda").to(dt)
        s1 = torch.zeros(n, device="cuda")
        s2 = torch.zeros(n, device="cuda")
        hp = HP[1]
        esz = p.element_size()
        name = OPT32["adam"][list(TDT).index(sfx)]
        args = [g, p, s1, s2, None, fsc(0, "cpu"), fsc(0, "cpu"), fsc(hp["b1"], "cpu"), fsc(hp["b2"], "cpu"),
                fsc(0, "cpu"), fsc(0, "cpu"), fsc(hp["eps"], "cpu"), fsc(hp["wd"], "cpu"), isc(5, "cpu"),
                fsc(hp["lr"], "cpu"), fsc(1.0, "cpu"), torch.tensor(False), torch.zeros(1, dtype=torch.int32, device="cuda")]
        f32 = cuda.prepare(name, args, st)
        t = time_gpu(f32)
        tu = nan
        if up is not None:
            try:
                tu = time_gpu(lambda: up.optimizer_update_32bit("adam", g, p, s1, s2, None, 0.0, 0.0, hp["b1"], hp["b2"],
                                                                 0.0, 0.0, hp["eps"], hp["wd"], 5, hp["lr"], 1.0, False))
            except Exception as e:
                print("upstream adam32 failed:", e)
        row("adam 32-bit state", sfx, f"n=2^26", t, tu, n * (3 * esz + 16), "reads g,p,m,v; writes p,m,v")
        s1q = torch.zeros(n, dtype=torch.uint8, device="cuda")
        s2q = torch.zeros(n, dtype=torch.uint8, device="cuda")
        qsg, qun = dynamic_code().cuda(), unsigned_dynamic_code().cuda()
        a1 = torch.zeros(n // 256, device="cuda")
        a2 = torch.zeros(n // 256, device="cuda")
        name8 = OPT8["adam"][list(TDT).index(sfx)]
        args8 = [g, p, s1q, s2q, qsg, qun, a1, a2, fsc(hp["b1"], "cpu"), fsc(hp["b2"], "cpu"), fsc(0, "cpu"),
                 fsc(0, "cpu"), fsc(hp["eps"], "cpu"), isc(5, "cpu"), fsc(hp["lr"], "cpu"), fsc(hp["wd"], "cpu"),
                 fsc(1.0, "cpu"), torch.tensor(False), torch.zeros(1, dtype=torch.int32, device="cuda")]
        f8 = cuda.prepare(name8, args8, st)
        t8 = time_gpu(f8)
        tu8 = nan
        if up is not None:
            try:
                tu8 = time_gpu(lambda: up.optimizer_update_8bit_blockwise("adam", g, p, s1q, s2q, hp["b1"], hp["b2"], 0.0,
                                                                          0.0, hp["eps"], 5, hp["lr"], qsg, qun, a1, a2,
                                                                          hp["wd"], 1.0, False))
            except Exception as e:
                print("upstream adam8 failed:", e)
        row("adam 8-bit blockwise state", sfx, f"n=2^26", t8, tu8, n * (3 * esz + 4) + 16 * (n // 256),
            "upstream CUDA uses its own (GPU) update rule")
        del g, p, s1, s2, s1q, s2q
    return rows


# ---- int8 (LLM.int8()): vector quant, int8 GEMM (cuBLASLt + SIMT fallback), mm dequant ----------
BITS.update({torch.int8: torch.int8, torch.int32: torch.int32})
I8_DEQ = {"fp16": "cdequant_mm_int32_fp16", "fp32": "cdequant_mm_int32_fp32", "bf16": "cdequant_mm_int32_bf16"}


def f32sc(v, dev):
    return torch.tensor(float(v), dtype=torch.float32, device=dev)


def run_vq(lib: Aot, A: torch.Tensor, thr: float, dev_scalar: bool = False, stream=None):
    cols = A.shape[-1]
    rows = A.numel() // cols if cols else 0
    d = A.device
    out = torch.full(A.shape, 99, dtype=torch.int8, device=d)
    rs = torch.full((rows,), -7.0, dtype=torch.float32, device=d)
    fl = torch.full((cols,), 7, dtype=torch.uint8, device=d)
    sc = f32sc(thr, "cuda" if dev_scalar else "cpu")
    rc = lib("cint8_vector_quant", [A, sc, out, rs, fl], stream)
    return rc, out, rs, fl


def int8_input(shape, dt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 2
    cols = shape[-1]
    x2 = x.view(-1, cols)
    rows = x2.shape[0]
    if rows >= 6 and cols >= 8:
        x2[0].zero_()                                    # absmax 0
        x2[1, cols // 3] = float("nan")                  # NaN: not an outlier, not in absmax
        x2[2, 1] = float("inf")                          # inf: an outlier with a threshold, absmax inf without
        x2[3] = torch.randn(cols, generator=g).sign() * 1e-38   # 1/absmax*127 overflows: products -> 0
        x2[4] = torch.round(torch.randn(cols, generator=g).clamp(-3.9, 3.9) * 32) / 32  # ties (absmax 4)
        x2[4, 0] = 4.0
        x2[5, 2] = -0.0
    if rows >= 2 and cols >= 4:                          # outlier columns
        x2[rows // 2, cols // 2] = 10.0
        x2[rows - 1, cols // 5] = -12.5
        x2[0 if rows < 6 else 7 % rows, cols - 1] = 6.0  # exactly the threshold
    return x.to(dt)


def check_int8(cuda: Aot, cpu: Aot, quick: bool) -> list[str]:
    rows_out = []
    st = stream_ptr()
    # -- vector quant
    shapes = [(1, 1), (1, 4096), (3, 7), (16, 4096), (33, 1000), (2, 3, 130), (257, 4099), (8, 11008), (1024, 4096)]
    thrs = [0.0, 6.0, 3.3, 1e5]
    for sfx, dt in TDT.items():
        ok = total = 0
        for si, shp in enumerate(shapes):
            for ti, thr in enumerate(thrs):
                A = int8_input(shp, dt, seed=100 * si + ti)
                total += 1
                rc2, o2, r2, f2 = run_vq(cpu, A, thr)
                Ag = A.cuda()
                rc1, o1, r1, f1 = run_vq(cuda, Ag, thr, dev_scalar=(ti % 2 == 1), stream=st)
                torch.cuda.synchronize()
                if rc1 or rc2:
                    fail(f"vector_quant {sfx} {shp} thr={thr}: status cuda={rc1} cpu={rc2}")
                    continue
                bad = [(nm, a, b) for nm, a, b in (("out", o1, o2), ("row_stats", r1, r2), ("col_flags", f1, f2))
                       if not same_bits(a, b)]
                if bad:
                    nm, a, b = bad[0]
                    fail(f"vector_quant {sfx} {shp} thr={thr}: {nm} {mismatch(a, b)}")
                    continue
                ok += 1
        # misaligned input/output (scalar path)
        A = int8_input((9, 64), dt, seed=5)
        buf = torch.zeros(9 * 64 + 1, dtype=dt)
        buf[1:] = A.reshape(-1)
        Am = buf[1:].view(9, 64)
        rc2, o2, r2, f2 = run_vq(cpu, Am, 6.0)
        bufg = buf.cuda()
        Amg = bufg[1:].view(9, 64)
        ob = torch.full((9 * 64 + 1,), 99, dtype=torch.int8, device="cuda")
        om = ob[1:].view(9, 64)
        rs = torch.empty(9, device="cuda")
        fl = torch.empty(64, dtype=torch.uint8, device="cuda")
        rc1 = cuda("cint8_vector_quant", [Amg, f32sc(6.0, "cpu"), om, rs, fl], st)
        torch.cuda.synchronize()
        total += 1
        if rc1 or rc2 or not (same_bits(om, o2) and same_bits(rs, r2) and same_bits(fl, f2)):
            fail(f"vector_quant {sfx} misaligned: status {rc1}/{rc2} {mismatch(om, o2)}")
        else:
            ok += 1
        rows_out.append(f"int8 vector quant {sfx}: {ok}/{total} (shape x threshold {thrs}, incl. NaN/inf/-0/zero rows, "
                        f"absmax < 4e-37, ties, outliers at the threshold, 3-D, misaligned, device/host scalar) "
                        f"bit-exact vs CPU library (out, row_stats, col_flags)")
    # -- GEMM
    g = torch.Generator().manual_seed(3)
    cases = [(1, 1, 1), (3, 5, 7), (1, 11008, 4096), (16, 4096, 4096), (128, 256, 4100), (127, 129, 4096),
             (256, 512, 1000), (33, 100, 64), (5, 12, 33), (2, 4, 131071), (3, 8, 131068),
             (300, 1000, 4096)]
    ok = total = 0
    lt_ok, lt_no = [], []
    for (M, N, K) in cases:
        A = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        B = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
        if K >= 131068:
            A.fill_(-128)
            B.fill_(-128)
        if M == 300:  # 3-D activations
            A = A.view(3, 100, K)
        C2 = torch.full((*A.shape[:-1], N), 7, dtype=torch.int32)
        rc2 = cpu("cigemmlt_32", [A, B, C2])
        Ag, Bg = A.cuda(), B.cuda()
        res = {}
        for mode in ("", "simt", "lt"):
            os.environ["BNB_MS_IGEMM"] = mode
            C1 = torch.full((*A.shape[:-1], N), 7, dtype=torch.int32, device="cuda")
            rc1 = cuda("cigemmlt_32", [Ag, Bg, C1], st)
            torch.cuda.synchronize()
            res[mode] = (rc1, C1)
        os.environ.pop("BNB_MS_IGEMM", None)
        if K >= 131068 and not torch.all(C2 == K * 16384):
            fail(f"igemm CPU {M}x{N}x{K} extreme: not K*2^14")
        (lt_ok if res["lt"][0] == 0 else lt_no).append(f"{M}x{N}x{K}")
        for mode, (rc1, C1) in res.items():
            if mode == "lt" and rc1 == 6:
                continue
            total += 1
            if rc1 or rc2:
                fail(f"igemm {M}x{N}x{K} mode={mode or 'default'}: status cuda={rc1} cpu={rc2}")
            elif not same_bits(C1, C2):
                fail(f"igemm {M}x{N}x{K} mode={mode or 'default'}: {mismatch(C1, C2)}")
            else:
                ok += 1
    # misaligned operands -> SIMT
    A = torch.randint(-128, 128, (40, 257), generator=g, dtype=torch.int8)
    B = torch.randint(-128, 128, (72, 256), generator=g, dtype=torch.int8)
    C2 = torch.empty(40, 72, dtype=torch.int32)
    Ak = A[:, 1:].contiguous()
    rc2 = cpu("cigemmlt_32", [Ak, B, C2])
    bufA = torch.zeros(40 * 256 + 1, dtype=torch.int8, device="cuda")
    bufA[1:] = Ak.reshape(-1).cuda()
    C1 = torch.empty(40, 72, dtype=torch.int32, device="cuda")
    rc1 = cuda("cigemmlt_32", [bufA[1:].view(40, 256), B.cuda(), C1], st)
    torch.cuda.synchronize()
    total += 1
    if rc1 or rc2 or not same_bits(C1, C2):
        fail(f"igemm misaligned A: status {rc1}/{rc2}")
    else:
        ok += 1
    rows_out.append(f"int8 GEMM (cigemmlt_32): {ok}/{total} (shape x path) exact vs CPU library; paths: default, "
                    f"BNB_MS_IGEMM=simt, BNB_MS_IGEMM=lt; incl. K=131071 with all -128 (sum 2^31-2^14), 3-D A, "
                    f"misaligned A")
    rows_out.append(f"int8 GEMM: cuBLASLt took {', '.join(lt_ok)}; SIMT fallback for {', '.join(lt_no)}")
    # -- mm dequant
    shapes = [(1, 1), (3, 7), (16, 4096), (2, 3, 130), (1000, 11008), (5, 4099)]
    for osfx, odt in TDT.items():
        ok = total = 0
        for si, shp in enumerate(shapes):
            for bdt in (None, torch.float32, torch.float16, torch.bfloat16):
                g = torch.Generator().manual_seed(si * 7 + (0 if bdt is None else bdt.itemsize))
                cols = shp[-1]
                rows = 1
                for s_ in shp[:-1]:
                    rows *= s_
                A = torch.randint(-(1 << 22), 1 << 22, shp, generator=g, dtype=torch.int32)
                if A.numel() >= 2:
                    A.view(-1)[0], A.view(-1)[1] = 2**31 - 1, -2**31
                rs = torch.rand(rows, generator=g) * 10
                cs = torch.rand(cols, generator=g) * 10
                rs[0] = 0.0
                if cols > 3:
                    cs[3] = float("nan")
                    cs[1] = 1e30
                bias = None if bdt is None else (torch.randn(cols, generator=g) * 3).to(bdt)
                o2 = torch.empty(shp, dtype=odt)
                rc2 = cpu(I8_DEQ[osfx], [A, rs, cs, bias, o2])
                o1 = torch.empty(shp, dtype=odt, device="cuda")
                rc1 = cuda(I8_DEQ[osfx], [A.cuda(), rs.cuda(), cs.cuda(), None if bias is None else bias.cuda(), o1], st)
                torch.cuda.synchronize()
                total += 1
                if rc1 or rc2:
                    fail(f"mm_dequant {osfx} {shp} bias={bdt}: status cuda={rc1} cpu={rc2}")
                elif not same_bits(o1, o2):
                    fail(f"mm_dequant {osfx} {shp} bias={bdt}: {mismatch(o1, o2)}")
                else:
                    ok += 1
        rows_out.append(f"int8 mm_dequant -> {osfx}: {ok}/{total} (shape x bias none/fp32/fp16/bf16, incl. INT32_MIN/MAX, "
                        f"zero row stat, NaN/1e30 col stats, 3-D, odd widths) bit-exact vs CPU library")
    return rows_out


def check_bad_calls_int8(cuda: Aot, cpu: Aot) -> list[str]:
    st = stream_ptr()
    results = {}
    for dev, lib in (("cuda", cuda), ("cpu", cpu)):
        d = dev
        A = torch.randn(4, 64, device=d).half()
        o = torch.empty(4, 64, dtype=torch.int8, device=d)
        rs = torch.empty(4, device=d)
        fl = torch.empty(64, dtype=torch.uint8, device=d)
        a8 = torch.zeros(4, 64, dtype=torch.int8, device=d)
        b8 = torch.zeros(8, 64, dtype=torch.int8, device=d)
        c32 = torch.empty(4, 8, dtype=torch.int32, device=d)
        cs = torch.empty(8, device=d)
        dq = torch.empty(4, 8, dtype=torch.float16, device=d)
        vq, mm, dqn = "cint8_vector_quant", "cigemmlt_32", "cdequant_mm_int32_fp16"
        T = lambda v: f32sc(v, d)
        cases = {
            "vq nparam": (vq, [A, T(0), o, rs]),
            "vq A dtype": (vq, [A.to(torch.int32), T(0), o, rs, fl]),
            "vq out dtype": (vq, [A, T(0), o.to(torch.uint8), rs, fl]),
            "vq flags dtype": (vq, [A, T(0), o, rs, fl.to(torch.int8)]),
            "vq threshold <0": (vq, [A, T(-1), o, rs, fl]),
            "vq threshold nan": (vq, [A, T(float("nan")), o, rs, fl]),
            "vq threshold not 0-d": (vq, [A, torch.zeros(1, device=d), o, rs, fl]),
            "vq row_stats size": (vq, [A, T(0), o, rs[:3], fl]),
            "vq flags size": (vq, [A, T(0), o, rs, fl[:63]]),
            "vq 0-d A": (vq, [A[0, 0], T(0), o, rs, fl]),
            "vq null A": (vq, [(None, (4, 64), "float16"), T(0), o, rs, fl]),
            "mm nparam": (mm, [a8, b8]),
            "mm A dtype": (mm, [a8.to(torch.uint8), b8, c32]),
            "mm out dtype": (mm, [a8, b8, c32.float()]),
            "mm B rank": (mm, [a8, b8.view(8, 64, 1), c32]),
            "mm K mismatch": (mm, [a8, b8[:, :32].contiguous(), c32]),
            "mm out shape": (mm, [a8, b8, c32.view(8, 4)]),
            "mm K too big": (mm, [(a8.data_ptr(), (1, 131072), "int8"), (b8.data_ptr(), (1, 131072), "int8"), c32[:1, :1]]),
            "mm null A": (mm, [(None, (4, 64), "int8"), b8, c32]),
            "mm K=0 (rows unknown)": (mm, [a8[:, :0], b8[:, :0], c32]),
            "dq nparam": (dqn, [c32, rs, cs, None]),
            "dq A dtype": (dqn, [c32.float(), rs, cs, None, dq]),
            "dq out dtype": (dqn, [c32, rs, cs, None, dq.float()]),
            "dq bias dtype": (dqn, [c32, rs, cs, torch.zeros(8, dtype=torch.int32, device=d), dq]),
            "dq bias size": (dqn, [c32, rs, cs, torch.zeros(7, device=d), dq]),
            "dq row_stats size": (dqn, [c32, rs[:3], cs, None, dq]),
            "dq col_stats size": (dqn, [c32, rs, cs[:7], None, dq]),
            "dq null out": (dqn, [c32, rs, cs, None, (None, (4, 8), "float16")]),
        }
        for k, (nm, args) in cases.items():
            results.setdefault(k, {})[dev] = lib(nm, args, st if dev == "cuda" else None)
    torch.cuda.synchronize()  # raises if a call left the device in an error state
    err = "none"
    n_ok = 0
    for k, r in results.items():
        if r["cuda"] != 0 and r["cuda"] == r["cpu"]:
            n_ok += 1
        else:
            fail(f"int8 malformed call '{k}': cuda={r['cuda']} cpu={r['cpu']}")
    return [f"int8 malformed calls: {n_ok}/{len(results)} return the CPU library's nonzero status; CUDA error after: {err}"]


def bench_int8(cuda: Aot, quick: bool):
    try:
        import bitsandbytes  # noqa: F401
        up = torch.ops.bitsandbytes
    except Exception:
        up = None
    rows = []
    st = stream_ptr()
    nan = float("nan")
    big = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(big)
    copy_bw = 2 * big.numel() * 4 / time_gpu(lambda: dst.copy_(big), 10) / 1e6
    del big, dst

    def row(op, dtype, shape, t, tu, traffic=None, flops=None, note=""):
        r = dict(op=op, dtype=dtype, bs=shape, ours_us=t * 1e3, up_us=tu * 1e3,
                 speedup=(tu / t) if tu == tu else nan, note=note)
        r["gbs"] = traffic / t / 1e6 if traffic else nan
        r["pct"] = 100 * r["gbs"] / copy_bw if traffic else nan
        r["tops"] = flops / t / 1e9 if flops else nan
        r["up_tops"] = flops / tu / 1e9 if flops and tu == tu else nan
        rows.append(r)

    def up_time(fn, R=1):
        if up is None:
            return nan, "upstream unavailable"
        try:
            return (time_rot(fn) if isinstance(fn, list) else time_gpu(fn)), ""
        except Exception as e:
            return nan, f"upstream failed: {type(e).__name__}: {e}"[:120]

    # GEMM: 4096^3 and batch 1..16 x K=4096 x N=11008 (4 weight copies rotated: 180 MB > L2)
    for (M, N, K) in [(4096, 4096, 4096)] + [(b, 11008, 4096) for b in (1, 2, 4, 8, 16)]:
        R = 1 if M >= 4096 else 4
        A = torch.randint(-128, 128, (M, K), dtype=torch.int8, device="cuda")
        Bs = [torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda") for _ in range(R)]
        Cs = [torch.empty(M, N, dtype=torch.int32, device="cuda") for _ in range(R)]
        fns = [cuda.prepare("cigemmlt_32", [A, Bs[r], Cs[r]], st) for r in range(R)]
        t = time_rot(fns)
        os.environ["BNB_MS_IGEMM"] = "simt"
        ts = time_rot(fns, 5 if M >= 4096 else 25)
        os.environ.pop("BNB_MS_IGEMM", None)
        tu, note = up_time([lambda r=r: up.int8_linear_matmul(A, Bs[r]) for r in range(R)])
        if up is not None and not note:
            fns[0]()
            same = torch.equal(up.int8_linear_matmul(A, Bs[0]), Cs[0])
            note = f"{'identical to' if same else 'DIFFERS from'} upstream"
            if not same:
                fail(f"int8 GEMM {M}x{N}x{K}: differs from upstream int8_linear_matmul")
        note += f"; SIMT fallback {ts * 1e3:.1f} us ({2 * M * N * K / ts / 1e9:.1f} TOP/s)"
        if R > 1:
            note += f"; {R} weight copies rotated"
        row("int8 GEMM (cigemmlt_32)", "int8->int32", f"M={M} N={N} K={K}", t, tu,
            traffic=M * K + N * K + 4 * M * N, flops=2 * M * N * K, note=note)
        del A, Bs, Cs
    # vector quant
    for (M, K, thr) in [(4096, 4096, 0.0), (4096, 4096, 6.0)] + [(b, 4096, 0.0) for b in (1, 16)]:
        A = torch.randn(M, K, device="cuda").half()
        if thr:
            A[:, ::97] *= 8  # ~1% outlier columns
        o = torch.empty(M, K, dtype=torch.int8, device="cuda")
        rs = torch.empty(M, device="cuda")
        fl = torch.empty(K, dtype=torch.uint8, device="cuda")
        f = cuda.prepare("cint8_vector_quant", [A, f32sc(thr, "cpu"), o, rs, fl], st)
        t = time_gpu(f)
        tu, note = up_time(lambda: up.int8_vectorwise_quant(A, thr))
        if up is not None and not note:
            f()
            uo, urs, _ = up.int8_vectorwise_quant(A, thr)
            torch.cuda.synchronize()
            note = (f"{(uo == o).float().mean().item() * 100:.3f}% codes, "
                    f"{(urs == rs).float().mean().item() * 100:.1f}% row_stats equal to upstream CUDA")
        row(f"int8 vector quant thr={thr:g}", "fp16", f"{M}x{K}", t, tu, traffic=M * K * 3 + 4 * M + K, note=note)
        del A, o
    # mm dequant (fp16 out, fp16 bias)
    for (M, N) in [(4096, 4096), (16, 11008), (1, 11008)]:
        A = torch.randint(-(1 << 20), 1 << 20, (M, N), dtype=torch.int32, device="cuda")
        rs = torch.rand(M, device="cuda") * 5
        cs = torch.rand(N, device="cuda") * 5
        bias = torch.randn(N, device="cuda").half()
        o = torch.empty(M, N, dtype=torch.float16, device="cuda")
        f = cuda.prepare("cdequant_mm_int32_fp16", [A, rs, cs, bias, o], st)
        t = time_gpu(f)
        tu, note = up_time(lambda: up.int8_mm_dequant(A, rs, cs, torch.float16, bias))
        if up is not None and not note:
            f()
            uo = up.int8_mm_dequant(A, rs, cs, torch.float16, bias)
            torch.cuda.synchronize()
            rel = ((uo.float() - o.float()).abs().max() / o.float().abs().max()).item()
            note = (f"max |ours-upstream| / max|out| = {rel:.1e} (upstream CUDA scales by 6.200012e-05, "
                    f"CPU/ours 6.200124e-05)")
        row("int8 mm_dequant (+bias)", "fp16", f"{M}x{N}", t, tu, traffic=M * N * 6 + 4 * (M + N) + 2 * N, note=note)
        del A, o
    return rows, copy_bw


def fmt_table_int8(rows) -> str:
    head = ("| op | dtype | shape | ours (us) | upstream (us) | speed-up | ours TOP/s | upstream TOP/s | ours GB/s "
            "| % of copy BW | note |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    f = lambda v, p=1: "n/a" if v != v else f"{v:.{p}f}"
    body = ""
    for r in rows:
        body += (f"| {r['op']} | {r['dtype']} | {r['bs']} | {f(r['ours_us'])} | {f(r['up_us'])} | {f(r['speedup'], 2)}x | "
                 f"{f(r['tops'])} | {f(r['up_tops'])} | {f(r['gbs'], 0)} | {f(r['pct'])}% | {r['note']} |\n")
    return head + body


def int8_section(cuda: Aot, cpu: Aot, quick: bool, card: str) -> str:
    """Runs the int8 checks and timings; returns the markdown section (starts with '## int8')."""
    n_fail0 = len(FAILURES)
    results = []
    for sec in (check_int8, check_bad_calls_int8):
        try:
            results += sec(cuda, cpu, quick) if sec is check_int8 else sec(cuda, cpu)
        except Exception as e:
            import traceback; traceback.print_exc()
            fail(f"{sec.__name__} raised {type(e).__name__}: {e}")
    for r in results:
        print(r, flush=True)
    try:
        rows, copy_bw = bench_int8(cuda, quick)
    except Exception as e:
        import traceback; traceback.print_exc()
        fail(f"bench_int8 raised {type(e).__name__}: {e}")
        rows, copy_bw = [], float("nan")
    table = fmt_table_int8(rows)
    print(table, flush=True)
    fails = FAILURES[n_fail0:]
    return (f"## int8 (LLM.int8())\n\n"
            f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; card: {card}\n"
            f"- baseline: upstream bitsandbytes 0.50.2 CUDA ops `int8_linear_matmul`, `int8_vectorwise_quant`, "
            f"`int8_mm_dequant` (torch.ops.bitsandbytes); copy bandwidth (1 GiB copy_) {copy_bw:.0f} GB/s\n"
            f"- times: CUDA-event medians of 25 calls with a busy queue; TOP/s = 2*M*N*K / time; GB/s counts bytes "
            f"read + written\n\n### Checks\n\n" + "".join(f"- {r}\n" for r in results) +
            (f"- FAILURES: {len(fails)}\n" + "".join(f"  - {x}\n" for x in fails[:20]) if fails else "- all int8 checks passed\n") +
            f"\n### Timings\n\n{table}")


# ---- weight-only int8/int4 (W8A16/W4A16, csrc/cuda/weightonly.cu) ---------------------------------
WO_SFX = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def wo_rb(bits: int, K: int) -> int:
    return K if bits == 8 else (K + 1) // 2


def wo_weight(N: int, K: int, dt, seed: int, special: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(N, K, generator=g) * torch.exp(torch.randn(N, 1, generator=g))
    if special and N >= 6 and K >= 4:
        W[0] = 0.0                      # zero row -> scale 0, q 0
        W[1] = -0.0
        W[2, 1] = float("nan")          # NaN ignored by the max, coded -qmax
        W[3, 0] = float("inf")          # scale inf: finite -> 0, inf -> NaN -> -qmax
        W[4, :] = 1e-40 if dt == torch.float32 else 1e-6   # subnormal / tiny row
        W[5, :] = torch.arange(K, dtype=torch.float32) - K / 2  # ties after division
    return W.to(dt)


def wo_quant(lib: Aot, W, bits, stream=None, offset: int = 0):
    N, K = W.shape
    rb = wo_rb(bits, K)
    qdt = torch.int8 if bits == 8 else torch.uint8
    buf = torch.full((N * rb + offset,), 0x5A, dtype=torch.uint8, device=W.device)
    q = buf[offset:].view(qdt).view(N, rb)
    sc = torch.full((N,), -7.0, device=W.device)
    rc = lib(f"cquantize_weight_only_int{bits}_{WO_SFX[W.dtype]}", [W, q, sc], stream)
    return rc, q, sc


def wo_dequant(lib: Aot, q, sc, K, bits, dt, scalar, stream=None, offset: int = 0):
    N = sc.numel()
    buf = torch.full((N * K + offset,), 3, dtype=dt, device=q.device)
    o = buf[offset:].view(N, K)
    rc = lib(f"cdequantize_weight_only_int{bits}_{WO_SFX[dt]}", [q, sc, scalar, o], stream)
    return rc, o


def wo_gemm(lib: Aot, A, q, sc, bits, stream=None):
    o = torch.full(tuple(A.shape[:-1]) + (sc.numel(),), 7, dtype=A.dtype, device=A.device)
    rc = lib(f"cgemm_weight_only_int{bits}_{WO_SFX[A.dtype]}", [A, q, sc, o], stream)
    return rc, o


def wo_unpack(q: torch.Tensor, bits: int, K: int) -> torch.Tensor:
    if bits == 8:
        return q.to(torch.int8)
    b = q.to(torch.int16)
    hi = torch.where(b >= 128, b - 256, b) >> 4
    lo = ((b & 0xF) ^ 8) - 8
    return torch.stack([hi, lo], -1).reshape(q.shape[0], -1)[:, :K].to(torch.int8)


def misaligned(t: torch.Tensor, elems: int = 1) -> torch.Tensor:
    """Same values at an address `elems` elements past a fresh allocation (breaks 4/16-byte alignment)."""
    buf = torch.empty(t.numel() + elems, dtype=t.dtype, device=t.device)
    v = buf[elems:].view(t.shape)
    v.copy_(t)
    return v


def check_weightonly(cuda: Aot, cpu: Aot, quick: bool) -> list[str]:
    st = stream_ptr()
    res = []
    # quantize + dequantize: bit-exact (q bytes, scale, dequantized values), device and host K scalar
    shapes = [(1, 1), (3, 7), (6, 33), (7, 16), (64, 4096), (17, 4099), (300, 130), (1000, 1000)]
    if not quick:
        shapes.append((11008, 4096))
    okq = okd = tq = td = 0
    for dt, sfx in WO_SFX.items():
        for bits in (8, 4):
            for i, (N, K) in enumerate(shapes):
                W = wo_weight(N, K, dt, seed=N * 7 + K + bits, special=True)
                for off in ((0, 1) if N * K < 10 ** 6 else (0,)):
                    tq += 1
                    rc1, q1, s1 = wo_quant(cuda, W.cuda(), bits, st, offset=off)
                    rc2, q2, s2 = wo_quant(cpu, W, bits)
                    torch.cuda.synchronize()
                    if rc1 or rc2:
                        fail(f"wo quantize int{bits} {sfx} {N}x{K}: status cuda={rc1} cpu={rc2}"); continue
                    if not same_bits(s1, s2):
                        fail(f"wo quantize int{bits} {sfx} {N}x{K} off={off}: scale {mismatch(s1, s2)}"); continue
                    if not torch.equal(q1.cpu().view(torch.uint8), q2.view(torch.uint8)):
                        fail(f"wo quantize int{bits} {sfx} {N}x{K} off={off}: q differs "
                             f"({int((q1.cpu().view(torch.uint8) != q2.view(torch.uint8)).sum())} bytes)"); continue
                    okq += 1
                    # dequantize the CPU's q (and, once, q with random bytes and odd scales)
                    qs = [(q2, s2)]
                    if off == 0 and i % 2 == 0:
                        g = torch.Generator().manual_seed(N + K)
                        qr = torch.randint(0, 256, q2.shape, generator=g, dtype=torch.uint8).view(q2.dtype)
                        sr = torch.randn(N, generator=g) * 1e3
                        sr[:: max(1, N // 3)] = torch.tensor([0.0, float("inf"), float("nan"), -0.0, 1e-40])[: len(sr[:: max(1, N // 3)])]
                        qs.append((qr, sr))
                    for (qq, ss) in qs:
                        for mk in ((dscalar, hscalar) if N * K < 10 ** 6 else (dscalar,)):
                            td += 1
                            qd = qq.cuda() if off == 0 else misaligned(qq.cuda().view(-1), 1).view(qq.shape)
                            rc1, o1 = wo_dequant(cuda, qd, ss.cuda(), K, bits, dt, mk(K), st, offset=off)
                            rc2, o2 = wo_dequant(cpu, qq, ss, K, bits, dt, hscalar(K))
                            torch.cuda.synchronize()
                            if rc1 or rc2:
                                fail(f"wo dequantize int{bits} {sfx} {N}x{K}: status cuda={rc1} cpu={rc2}")
                            elif not same_bits(o1, o2):
                                a1, a2 = o1.cpu().reshape(-1), o2.reshape(-1)
                                diff = a1.view(BITS[a1.dtype]) != a2.view(BITS[a2.dtype])
                                nan_only = bool((a1[diff].isnan() & a2[diff].isnan()).all())
                                fail(f"wo dequantize int{bits} {sfx} {N}x{K} off={off}: {mismatch(o1, o2)}"
                                     + (" (NaN bits only)" if nan_only else ""))
                            else:
                                okd += 1
    res.append(f"weight-only quantize (int8/int4 x fp32/fp16/bf16, {len(shapes)} shapes incl. zero/-0/NaN/inf/"
               f"subnormal rows, odd K, misaligned q): {okq}/{tq} bit-exact with the CPU library (q bytes, scale)")
    res.append(f"weight-only dequantize (CPU's q and random bytes with 0/inf/NaN/-0/subnormal scales, device and "
               f"host K scalar, misaligned q/out): {okd}/{td} bit-exact")
    # GEMM: tolerance = 2*K*2^-24 * sum_k |a_k q_k| |s| + 1 ulp of the output type (fp32 accumulation of K
    # terms in another order, then one rounding to T); we also count how many are bit-identical (the
    # kernel reproduces the CPU's 16-lane fma order, so all should be).
    gshapes = [(1, 64, 4096), (2, 64, 4096), (3, 37, 100), (4, 300, 4099), (5, 128, 512), (8, 96, 1024),
               (9, 33, 48), (16, 200, 4096), (17, 50, 256), (33, 20, 64), (1, 11008, 4096), (16, 4096, 11008),
               (2, 7, 15), (1, 5, 0)]
    ulp = {torch.float32: 2.0 ** -23, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
    okg = exact = tg = 0
    worst = 0.0
    for dt, sfx in WO_SFX.items():
        for bits in (8, 4):
            for j, (M, N, K) in enumerate(gshapes):
                W = wo_weight(N, max(K, 1), torch.float32, seed=M + N + K)[:, :K].contiguous()
                _, q, s = wo_quant(cpu, W.to(dt), bits)
                g = torch.Generator().manual_seed(j + bits)
                A = (torch.randn(M, K, generator=g) * 3).to(dt)
                variants = [("2d", A, q)]
                if j % 3 == 0:
                    variants.append(("3d", A.view(1, M, K), q))
                if j % 4 == 1 and K:
                    variants.append(("misaligned", A, q))
                for tag, AA, qq in variants:
                    tg += 1
                    Ad, qd = AA.cuda(), qq.cuda()
                    if tag == "misaligned":
                        Ad = misaligned(Ad, 1)
                        qd = misaligned(qd.view(-1), 1).view(qq.shape)
                    if K == 0:  # empty A: give both libraries the same non-null pointer situation
                        dummy_d, dummy_h = torch.zeros(8, dtype=dt, device="cuda"), torch.zeros(8, dtype=dt)
                        Ad = (dummy_d.data_ptr(), tuple(AA.shape), SDT[dt])
                        Ah = (dummy_h.data_ptr(), tuple(AA.shape), SDT[dt])
                        o1 = torch.full(tuple(AA.shape[:-1]) + (N,), 7, dtype=dt, device="cuda")
                        o2 = torch.full(tuple(AA.shape[:-1]) + (N,), 7, dtype=dt)
                        rc1 = cuda(f"cgemm_weight_only_int{bits}_{sfx}", [Ad, qd, s.cuda(), o1], st)
                        rc2 = cpu(f"cgemm_weight_only_int{bits}_{sfx}", [Ah, qq, s, o2])
                    else:
                        rc1, o1 = wo_gemm(cuda, Ad, qd, s.cuda(), bits, st)
                        rc2, o2 = wo_gemm(cpu, AA, qq, s, bits)
                    torch.cuda.synchronize()
                    if rc1 or rc2:
                        if rc1 != rc2:
                            fail(f"wo gemm int{bits} {sfx} M={M} N={N} K={K} {tag}: status cuda={rc1} cpu={rc2}")
                        else:
                            okg += 1; exact += 1
                        continue
                    o1c = o1.cpu()
                    if same_bits(o1c, o2):
                        okg += 1; exact += 1
                        continue
                    qi = wo_unpack(qq.cpu(), bits, K).double()
                    S = (AA.reshape(-1, K).double().abs() @ qi.abs().T) * s.double().abs()
                    tol = 2 * K * 2.0 ** -24 * S + ulp[dt] * o2.reshape(S.shape).double().abs() + 1e-30
                    err = (o1c.reshape(S.shape).double() - o2.reshape(S.shape).double()).abs()
                    worst = max(worst, float((err / tol).max()))
                    if bool((err <= tol).all()):
                        okg += 1
                    else:
                        fail(f"wo gemm int{bits} {sfx} M={M} N={N} K={K} {tag}: beyond tolerance; {mismatch(o1c, o2)}")
    res.append(f"weight-only GEMM ({len(gshapes)} shapes, M 1..33, K incl. 0/15/4099/11008, 3-D A, misaligned A/q "
               f"-> generic kernel): {okg}/{tg} within tolerance (2K*2^-24*sum|a q s| + 1 output ulp), "
               f"{exact}/{tg} bit-identical to the CPU library" + (f"; worst err/tol {worst:.2f}" if worst else ""))
    return res


def check_bad_calls_wo(cuda: Aot, cpu: Aot) -> list[str]:
    st = stream_ptr()
    results = {}
    for d, lib in (("cuda", cuda), ("cpu", cpu)):
        W = torch.randn(8, 64, device=d).half()
        q8 = torch.zeros(8, 64, dtype=torch.int8, device=d)
        q4 = torch.zeros(8, 32, dtype=torch.uint8, device=d)
        sc = torch.ones(8, device=d)
        o = torch.empty(8, 64, dtype=torch.float16, device=d)
        A = torch.randn(2, 64, device=d).half()
        go = torch.empty(2, 8, dtype=torch.float16, device=d)
        K = dscalar(64) if d == "cuda" else hscalar(64)
        Kneg = dscalar(-1) if d == "cuda" else hscalar(-1)
        Kf = torch.tensor(64.5, device=d)
        qn, dqn, gm = "cquantize_weight_only_int8_fp16", "cdequantize_weight_only_int8_fp16", "cgemm_weight_only_int8_fp16"
        q4n, dq4n, gm4 = "cquantize_weight_only_int4_fp16", "cdequantize_weight_only_int4_fp16", "cgemm_weight_only_int4_fp16"
        cases = {
            "q nparam": (qn, [W, q8]),
            "q W dtype": (qn, [W.float(), q8, sc]),
            "q q dtype (uint8 for int8)": (qn, [W, q8.view(torch.uint8), sc]),
            "q4 q dtype (int8 for int4)": (q4n, [W, q4.view(torch.int8), sc]),
            "q scale dtype": (qn, [W, q8, sc.half()]),
            "q W rank 3": (qn, [W.view(2, 4, 64), q8, sc]),
            "q q size": (qn, [W, q8[:7], sc]),
            "q4 q size": (q4n, [W, q8.view(torch.uint8), sc]),
            "q scale size": (qn, [W, q8, sc[:7]]),
            "q null W": (qn, [(None, (8, 64), "float16"), q8, sc]),
            "dq nparam": (dqn, [q8, sc, K]),
            "dq out dtype": (dqn, [q8, sc, K, o.float()]),
            "dq K negative": (dqn, [q8, sc, Kneg, o]),
            "dq K not integral": (dqn, [q8, sc, Kf, o]),
            "dq K not 0-d": (dqn, [q8, sc, torch.tensor([64], device=d), o]),
            "dq q size": (dqn, [q8[:7], sc, K, o]),
            "dq4 q size": (dq4n, [q8.view(torch.uint8), sc, K, o]),
            "dq out size": (dqn, [q8, sc, K, o[:7]]),
            "dq null out": (dqn, [q8, sc, K, (None, (8, 64), "float16")]),
            "gemm nparam": (gm, [A, q8, sc]),
            "gemm A dtype": (gm, [A.float(), q8, sc, go]),
            "gemm out dtype": (gm, [A, q8, sc, go.float()]),
            "gemm 0-d A": (gm, [A[0, 0], q8, sc, go]),
            "gemm K mismatch": (gm, [A[:, :32].contiguous(), q8, sc, go]),
            "gemm4 q size": (gm4, [A, q8.view(torch.uint8), sc, go]),
            "gemm out size": (gm, [A, q8, sc, go[:1]]),
            "gemm null A": (gm, [(None, (2, 64), "float16"), q8, sc, go]),
            "gemm null q": (gm, [A, (None, (8, 64), "int8"), sc, go]),
        }
        for k, (nm, args) in cases.items():
            results.setdefault(k, {})[d] = lib(nm, args, st if d == "cuda" else None)
    torch.cuda.synchronize()
    n_ok = 0
    for k, r in results.items():
        if r["cuda"] != 0 and r["cuda"] == r["cpu"]:
            n_ok += 1
        else:
            fail(f"weight-only malformed call '{k}': cuda={r['cuda']} cpu={r['cpu']}")
    return [f"weight-only malformed calls: {n_ok}/{len(results)} return the CPU library's nonzero status; "
            f"no CUDA error after"]


def bench_weightonly(cuda: Aot, quick: bool):
    st = stream_ptr()
    nan = float("nan")
    rows = []
    big = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(big)
    copy_bw = 2 * big.numel() * 4 / time_gpu(lambda: dst.copy_(big), 10) / 1e6
    del big, dst

    def row(op, dtype, shape, t, traffic, base=nan, base_name="", note=""):
        rows.append(dict(op=op, dtype=dtype, shape=shape, us=t * 1e3, gbs=traffic / t / 1e6,
                         pct=100 * traffic / t / 1e6 / copy_bw, base_us=base * 1e3 if base == base else nan,
                         base_name=base_name, note=note))

    def copy_time(nbytes):
        a = torch.empty(nbytes // 4 + 1, dtype=torch.float32, device="cuda")
        b = torch.empty_like(a)
        t = time_gpu(lambda: b.copy_(a))
        return t

    # quantize / dequantize (fp16 weights; 11008x4096 and 32768x8192 = 268M params)
    for (N, K) in [(11008, 4096), (32768, 8192)]:
        for bits in (8, 4):
            rb = wo_rb(bits, K)
            W = torch.randn(N, K, device="cuda").half()
            q = torch.empty(N, rb, dtype=torch.int8 if bits == 8 else torch.uint8, device="cuda")
            sc = torch.empty(N, device="cuda")
            o = torch.empty(N, K, dtype=torch.float16, device="cuda")
            fq = cuda.prepare(f"cquantize_weight_only_int{bits}_fp16", [W, q, sc], st)
            fd = cuda.prepare(f"cdequantize_weight_only_int{bits}_fp16", [q, sc, hscalar(K), o], st)
            tq, td = time_gpu(fq), time_gpu(fd)
            traffic = N * K * 2 + N * rb + 4 * N
            tc = copy_time(N * K * 2)
            row(f"quantize int{bits}", "fp16", f"{N}x{K}", tq, traffic, tc, "copy of W",
                note="reads W twice (absmax, then codes); the 2nd read mostly from L2")
            row(f"dequantize int{bits}", "fp16", f"{N}x{K}", td, traffic, tc, "copy of W")
            del W, q, o
    # GEMM: batch 1..16 against fp16 weights [N, K]; weight copies rotated (> L2)
    for (N, K) in [(11008, 4096), (4096, 11008)]:
        for bits in (8, 4):
            rb = wo_rb(bits, K)
            R = 8
            qs = [torch.randint(-128, 128, (N, rb), dtype=torch.int8, device="cuda") for _ in range(R)]
            if bits == 4:
                qs = [x.view(torch.uint8) for x in qs]
            sc = torch.rand(N, device="cuda") * 0.01
            for M in (1, 2, 4, 8, 16):
                for dt in ((torch.float16, torch.bfloat16, torch.float32) if M == 1 else (torch.float16,)):
                    A = torch.randn(M, K, device="cuda").to(dt)
                    o = torch.empty(M, N, dtype=dt, device="cuda")
                    fns = [cuda.prepare(f"cgemm_weight_only_int{bits}_{WO_SFX[dt]}", [A, qs[r], sc, o], st)
                           for r in range(R)]
                    t = time_rot(fns)
                    traffic = N * rb + 4 * N + M * K * A.element_size() + M * N * A.element_size()
                    base, bname, note = nan, "", ""
                    if dt == torch.float16:
                        # torch fp16 matmul on the dequantized weight (what the int weight replaces): 4 copies
                        Wd = [(wo_unpack(qs[r][:, :], bits, K).half() * sc[:, None].half()) for r in range(4)]
                        base = time_rot([lambda r=r: torch.matmul(A, Wd[r].T) for r in range(4)])
                        bname = "torch fp16 A @ W.T"
                        ref = A.float() @ (wo_unpack(qs[0], bits, K).float() * sc[:, None]).T
                        fns[0]()
                        torch.cuda.synchronize()
                        rel = float((o.float() - ref).abs().max() / ref.abs().max())
                        note = f"max|ours - fp32 ref|/max|ref| = {rel:.1e}"
                        del Wd
                    row(f"gemm int{bits} M={M}", WO_SFX[dt], f"N={N} K={K}", t, traffic, base, bname, note)
            del qs
    return rows, copy_bw


def fmt_table_wo(rows) -> str:
    f = lambda v, p=1: "n/a" if v != v else f"{v:.{p}f}"
    head = ("| op | dtype | shape | ours (us) | ours GB/s | % of copy BW | baseline | baseline (us) | speed-up | note |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    body = ""
    for r in rows:
        sp = r["base_us"] / r["us"] if r["base_us"] == r["base_us"] else float("nan")
        body += (f"| {r['op']} | {r['dtype']} | {r['shape']} | {f(r['us'])} | {f(r['gbs'], 0)} | {f(r['pct'])}% | "
                 f"{r['base_name'] or 'n/a'} | {f(r['base_us'])} | {f(sp, 2)}x | {r['note']} |\n")
    return head + body


def op_names(path: str | None) -> list[str]:
    """Names of every row of bitsandbytes_ms/_native_table.py: the table module loaded standalone (needs MindSpore),
    else a names file (one a line) generated where MindSpore is installed."""
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from status_diff import op_table  # the one standalone loader of _native_table.py (and the utils.py it imports)

        return [n for n, op in op_table().OPS.items() if not getattr(op, "cpu_only", False)]
    except Exception as e:
        if not path:
            raise RuntimeError(f"_native_table.py not loadable ({type(e).__name__}: {e}) and no --op-names file") from e
        return [l.strip() for l in Path(path).read_text().splitlines() if l.strip()]


def check_completeness(cuda: Aot, names_file: str | None) -> str:
    names = op_names(names_file)
    missing = [n for n in names if not cuda.has(n)]
    for n in missing:
        print("MISSING from the CUDA library:", n, flush=True)
    if not names:
        fail("op table completeness: no op names")
    if missing:
        fail(f"op table completeness: {len(missing)} of {len(names)} rows not exported: {', '.join(missing)}")
    return (f"op table completeness: {len(names) - len(missing)}/{len(names)} rows of bitsandbytes_ms/_native_table.py are "
            f"exported by {Path(cuda.path).name} (dlsym)" + (f"; MISSING: {', '.join(missing)}" if missing else ""))


def weightonly_section(cuda: Aot, cpu: Aot, quick: bool, card: str, names_file: str | None) -> str:
    """Weight-only checks + timings + the op-table completeness check; markdown starting '## weight-only'."""
    n_fail0 = len(FAILURES)
    results = []
    try:
        results.append(check_completeness(cuda, names_file))
    except Exception as e:
        fail(f"check_completeness raised {type(e).__name__}: {e}")
    for sec in (check_weightonly, check_bad_calls_wo):
        try:
            results += sec(cuda, cpu, quick) if sec is check_weightonly else sec(cuda, cpu)
        except Exception as e:
            import traceback; traceback.print_exc()
            fail(f"{sec.__name__} raised {type(e).__name__}: {e}")
    for r in results:
        print(r, flush=True)
    try:
        rows, copy_bw = bench_weightonly(cuda, quick)
    except Exception as e:
        import traceback; traceback.print_exc()
        fail(f"bench_weightonly raised {type(e).__name__}: {e}")
        rows, copy_bw = [], float("nan")
    table = fmt_table_wo(rows)
    print(table, flush=True)
    fails = FAILURES[n_fail0:]
    return (f"## weight-only int8/int4 (W8A16/W4A16) and op-table completeness\n\n"
            f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; card: {card}\n"
            f"- no upstream baseline (bitsandbytes has no weight-only int8/int4 op); baselines: a device copy of W "
            f"(quantize/dequantize) and torch's fp16 matmul on the dequantized fp16 weight (GEMM); copy bandwidth "
            f"(1 GiB copy_) {copy_bw:.0f} GB/s\n"
            f"- times: CUDA-event medians of 25 calls with a busy queue; GEMM rows rotate 8 weight copies (4 for torch's "
            f"fp16 weights) so nothing is L2-resident; GB/s counts bytes read + written (weight, scales, A, out)\n\n"
            f"### Checks\n\n" + "".join(f"- {r}\n" for r in results) +
            (f"- FAILURES: {len(fails)}\n" + "".join(f"  - {x}\n" for x in fails[:20]) if fails else
             "- all weight-only and completeness checks passed\n") +
            f"\n### Timings\n\n{table}")


def replace_section(old: str, header: str, sec: str) -> str:
    """old markdown with the section starting at `header` (up to the next '\n## ') replaced by sec (or appended)."""
    i = old.find("\n" + header)
    if i < 0:
        return old.rstrip("\n") + "\n\n" + sec
    j = old.find("\n## ", i + 1)
    tail = old[j:] if j >= 0 else ""
    return old[:i].rstrip("\n") + "\n\n" + sec.rstrip("\n") + "\n" + tail


def fmt_table(rows) -> str:
    head = "| op | dtype | blocksize / shape | ours (us) | upstream (us) | speed-up | ours GB/s | % of copy BW | note |\n|---|---|---|---|---|---|---|---|---|\n"
    body = ""
    for r in rows:
        f = lambda v, p=1: "n/a" if v != v else f"{v:.{p}f}"
        body += (f"| {r['op']} | {r['dtype']} | {r['bs']} | {f(r['ours_us'])} | {f(r['up_us'])} | {f(r['speedup'], 2)}x | "
                 f"{f(r['gbs'], 0)} | {f(r['pct'])}% | {r['note']} |\n")
    return head + body


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda-lib", default=str(ROOT / "bitsandbytes_ms" / "libbitsandbytes_ms_cuda.so"))
    ap.add_argument("--cpu-lib", default=str(ROOT / "bitsandbytes_ms" / "libbitsandbytes_ms_cpu.so"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "gpu.md"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-new", action="store_true", help="only the blockwise 8-bit sections")
    ap.add_argument("--cpu-ref-only", action="store_true", help="only the CPU-vs-reference check (for BNB_MS_SIMD runs)")
    ap.add_argument("--int8-only", action="store_true",
                    help="only the int8 section; the other sections of --out are kept as they are")
    ap.add_argument("--weightonly-only", action="store_true",
                    help="only the weight-only + op-table completeness section; the rest of --out is kept")
    ap.add_argument("--op-names", default=None,
                    help="file with the op table's names, one a line (used when _native_table.py cannot be imported)")
    a = ap.parse_args()
    if a.cpu_ref_only:
        print(cpu_vs_reference(a.cpu_lib), flush=True)
        return 1 if FAILURES else 0

    cuda, cpu = Aot(a.cuda_lib), Aot(a.cpu_lib)
    props = torch.cuda.get_device_properties(0)
    card = f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}, torch {torch.__version__}"
    print("card:", card, flush=True)
    if a.weightonly_only:
        sec = weightonly_section(cuda, cpu, a.quick, card, a.op_names)
        old = Path(a.out).read_text() if Path(a.out).exists() else "# CUDA library: checks and timings\n"
        note = ("(The other sections are from the earlier runs dated in them; this run (`--weightonly-only`) "
                "re-ran only this section.)\n\n")
        hdr = "## weight-only"
        Path(a.out).write_text(replace_section(old, hdr, sec.replace("\n\n", "\n\n" + note, 1)))
        print(f"wrote {a.out}; failures: {len(FAILURES)}")
        return 1 if FAILURES else 0
    if a.int8_only:
        sec = int8_section(cuda, cpu, a.quick, card)
        old = Path(a.out).read_text() if Path(a.out).exists() else "# CUDA library: checks and timings\n"
        wo_keep = ""
        if "\n## weight-only" in old:
            wo_keep = "\n" + old[old.index("\n## weight-only"):].lstrip("\n")
        old = old.split("\n## int8", 1)[0].rstrip("\n")
        note = ("\n\n(The sections above are from the earlier run dated at the top; this run (`--int8-only`) "
                "re-ran only the int8 section below.)\n\n")
        Path(a.out).write_text(old + note + sec.rstrip("\n") + "\n" + wo_keep)
        print(f"wrote {a.out}; failures: {len(FAILURES)}")
        return 1 if FAILURES else 0
    results = []
    results += check_blockwise(cuda, cpu, a.quick)
    results += check_bad_calls(cuda, cpu)
    for sec in (check_fourbit, check_gemv, check_optim):
        if not a.skip_new:
            try:
                results += sec(cuda, cpu, a.quick)
            except Exception as e:  # report, don't lose the rest of the run
                import traceback; traceback.print_exc()
                fail(f"{sec.__name__} raised {type(e).__name__}: {e}")
    if not a.skip_new:
        results += check_bad_calls2(cuda, cpu)
    results.append(cpu_vs_reference(a.cpu_lib))
    for lvl in ("avx2", "scalar"):
        env = dict(os.environ, BNB_MS_SIMD=lvl)
        r = subprocess.run([sys.executable, __file__, "--cpu-lib", a.cpu_lib, "--cpu-ref-only"], env=env,
                           capture_output=True, text=True)
        line = (r.stdout.strip().splitlines() or ["(no output) " + r.stderr[-300:]])[-1]
        results.append(f"BNB_MS_SIMD={lvl}: {line}")
        if r.returncode:
            fail(f"CPU reference check at BNB_MS_SIMD={lvl}")
    for r in results:
        print(r, flush=True)
    rows, up_name = bench(cuda, a.quick)
    if not a.skip_new:
        try:
            rows += bench2(cuda, a.quick)
        except Exception as e:
            import traceback; traceback.print_exc()
            fail(f"bench2 raised {type(e).__name__}: {e}")
    table = fmt_table(rows)
    print(table, flush=True)
    cpuinfo = platform.processor() or ""
    try:
        cpuinfo = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except Exception:
        pass
    md = (f"# CUDA library: checks and timings\n\n"
          f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}\n"
          f"- card: {card}\n- host CPU: {cpuinfo}\n- baseline: {up_name} (torch.ops.bitsandbytes, its CUDA kernels)\n"
          f"- sizes: 8192x8192; times are CUDA-event medians of 25 calls with a busy queue; GB/s counts bytes read "
          f"+ written (input, codes, absmax); copy = torch copy_ of the input, same run (blockwise 8-bit rows) or of "
          f"a 1 GiB buffer (4-bit, gemv, optimizer rows; gemv rotates up to 16 weight copies so they are not L2-resident)\n\n"
          f"## Checks\n\n" + "".join(f"- {r}\n" for r in results) +
          (f"- FAILURES: {len(FAILURES)}\n" + "".join(f"  - {f}\n" for f in FAILURES[:20]) if FAILURES else "- all checks passed\n") +
          f"\n## Timings\n\n{table}")
    if not a.skip_new:
        md += "\n" + int8_section(cuda, cpu, a.quick, card)
        md += "\n" + weightonly_section(cuda, cpu, a.quick, card, a.op_names)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(md)
    print(f"wrote {a.out}; failures: {len(FAILURES)}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
