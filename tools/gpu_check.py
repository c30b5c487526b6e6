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
Exit status 1 when any comparison or status check fails.
"""
from __future__ import annotations

import argparse
import ctypes as ct
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


# ---- the AOT calling convention -------------------------------------------------------------------
class Aot:
    """One native library; ``prepare(name, args, stream)`` binds the AOT arrays once and returns a
    zero-argument callable returning the status. ``args``: tensors (host or device), ``None`` (null,
    dtype "none") or ``(ptr, shape, dtype_str)`` tuples for hand-made malformed calls."""

    ARGTYPES = [ct.c_int, ct.POINTER(ct.c_void_p), ct.POINTER(ct.c_int), ct.POINTER(ct.POINTER(ct.c_int64)),
                ct.POINTER(ct.c_char_p), ct.c_void_p, ct.c_void_p]

    def __init__(self, path: str):
        self.path = path
        self.dll = ct.CDLL(path)

    def has(self, name: str) -> bool:
        return hasattr(self.dll, name)

    def prepare(self, name: str, args, stream: int | None = None):
        fn = getattr(self.dll, name)
        fn.restype, fn.argtypes = ct.c_int, self.ARGTYPES
        items = []
        for a in args:
            if a is None:
                items.append((None, (), "none"))
            elif isinstance(a, tuple):
                items.append(a)
            else:
                items.append((a.data_ptr(), tuple(a.shape), SDT[a.dtype]))
        n = len(items)
        params = (ct.c_void_p * n)(*[p for p, _, _ in items])
        ndims = (ct.c_int * n)(*[len(s) for _, s, _ in items])
        keep = [(ct.c_int64 * max(1, len(s)))(*s) for _, s, _ in items]
        shapes = (ct.POINTER(ct.c_int64) * n)(*[ct.cast(k, ct.POINTER(ct.c_int64)) for k in keep])
        dtypes = (ct.c_char_p * n)(*[d.encode() for _, _, d in items])
        st = ct.c_void_p(stream)
        ref = (args, keep, params, ndims, shapes, dtypes)  # keep everything alive

        def call() -> int:
            _ = ref
            return fn(n, params, ndims, shapes, dtypes, st, None)

        return call

    def __call__(self, name, args, stream=None) -> int:
        return self.prepare(name, args, stream)()


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


def fmt_table(rows) -> str:
    head = "| op | dtype | blocksize | ours (us) | upstream (us) | speed-up | ours GB/s | % of copy BW | note |\n|---|---|---|---|---|---|---|---|---|\n"
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
    ap.add_argument("--cpu-ref-only", action="store_true", help="only the CPU-vs-reference check (for BNB_MS_SIMD runs)")
    a = ap.parse_args()
    if a.cpu_ref_only:
        print(cpu_vs_reference(a.cpu_lib), flush=True)
        return 1 if FAILURES else 0

    cuda, cpu = Aot(a.cuda_lib), Aot(a.cpu_lib)
    props = torch.cuda.get_device_properties(0)
    card = f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}, torch {torch.__version__}"
    print("card:", card, flush=True)
    results = []
    results += check_blockwise(cuda, cpu, a.quick)
    results += check_bad_calls(cuda, cpu)
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
          f"+ written (input, codes, absmax); copy = torch copy_ of the input, same run\n\n"
          f"## Checks\n\n" + "".join(f"- {r}\n" for r in results) +
          (f"- FAILURES: {len(FAILURES)}\n" + "".join(f"  - {f}\n" for f in FAILURES[:20]) if FAILURES else "- all checks passed\n") +
          f"\n## Timings\n\n{table}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(md)
    print(f"wrote {a.out}; failures: {len(FAILURES)}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
