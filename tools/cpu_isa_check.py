#!/usr/bin/env python3
"""Check and time every CPU kernel path of the CPU library on this machine: numpy + ctypes only
(no MindSpore, no torch; Python >= 3.9).

    python3 tools/cpu_isa_check.py --cpu-lib build/host/libbitsandbytes_ms_cpu.so [--quick]

What it does (each check prints one PASS/FAIL/SKIP line; the exit status is 1 on any FAIL):
  1. int8 GEMM (``cigemmlt_32``): for each path (scalar, avx2, avx512, avxvnni, avx512vnni, amx) it
     re-runs itself in a subprocess with ``BNB_MS_INT8_GEMM=<path>``; the subprocess reports the path
     the library really used (``bnb_ms_int8_gemm_path``; a path the CPU lacks is reported as SKIP, never
     tested as another path) and compares with numpy's int64 product exactly: K in 1..4095 around every
     vector/tile step, M and N around the register tiles and the 16-row AMX tiles, -128/127 everywhere
     up to K = 131071 (the VNNI paths' u8 offset wraps int32 there), 3-D/4-D A. Then it times the path
     at 1x4096x11008, 16x4096x11008 and 1024x4096x4096 (GOP/s = 2*M*N*K / time; rows of the result
     spot-checked). The automatic choice (no variable) is timed as "auto".
  2. every other CPU op at each SIMD level the CPU has (``BNB_MS_SIMD=scalar|avx2|avx512``, again one
     subprocess per level) against the numpy reference bitsandbytes_ms/_reference.py (loaded by file
     path): int8 vector quant (fp32/fp16/bf16, threshold 0 and 6 with planted outliers) and mm dequant
     (fp32/fp16/bf16 out, every bias dtype) bit-exact; blockwise 8-bit quantize/dequantize bit-exact;
     4-bit NF4/FP4 quantize/dequantize bit-exact; gemv_4bit within the tests' tolerance; the 32-bit and
     8-bit blockwise optimizer updates (adam, momentum, rmsprop, lion, adagrad, ademamix; fp32/fp16/bf16;
     weight decay 0/0.01; 3 steps) bit-exact, LAMB's max_unorm path within rtol 1e-6; weight-only
     int8/int4 quantize/dequantize bit-exact and GEMM within the tests' tolerance. Then the outputs of
     the deterministic ops are compared byte for byte across the levels.

  3. ``bf16`` (the 4-bit bf16-compute kernel, ``clinear_4bit_bf16dot_bf16``): one subprocess with the
     library's own choice (``vdpbf16ps`` where the CPU has AVX512-BF16) and one at ``BNB_MS_SIMD=avx2``
     (the portable kernel); each checks its outputs bit for bit against the numpy model
     ``_reference.linear_4bit_bf16dot`` (small shapes: odd K, partial blocks, double quant, bias, planted
     tiny values that exercise the denormal flushing) and runs 4096x11008 at batch 1 and 16; the parent
     compares the two kernels' bytes and prints the timings of the bf16 kernel vs the exact fp32-accumulation
     path (``clinear_4bit_bf16``) on the same bf16 input. ``--only bf16`` runs just this part.

--quick keeps it to about a minute (fewer shapes, shorter timings). bfloat16 is handled without
ml_dtypes (bit patterns, round to nearest even), so only numpy is needed.

Building the CPU library on a bare machine (g++ >= 11 for the AVX-VNNI/AMX target attributes; no
Python packages, no MindSpore or pybind11 headers are needed):

    python3 -m pip install cmake ninja      # only if cmake (>= 3.18) is missing
    cmake -S . -B build/host -DCMAKE_BUILD_TYPE=Release && cmake --build build/host -j
    # (a plain CMake build also copies the .so into bitsandbytes_ms/; harmless)

or without CMake:

    mkdir -p build/host && g++ -O3 -std=c++17 -fPIC -shared -pthread -fno-math-errno -ffp-contract=off \\
        -D_GLIBCXX_USE_CXX11_ABI=0 -Icsrc csrc/cpu/*.cpp -o build/host/libbitsandbytes_ms_cpu.so

then ``python3 tools/cpu_isa_check.py --cpu-lib build/host/libbitsandbytes_ms_cpu.so``.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from aot_ctypes import Aot, Typed  # noqa: E402

GEMM_PATHS = ("scalar", "avx2", "avx512", "avxvnni", "avx512vnni", "amx")
ISA = {"scalar": "nothing", "avx2": "AVX2+FMA+F16C", "avx512": "AVX-512 F/BW/VL/DQ", "avxvnni": "AVX-VNNI",
       "avx512vnni": "AVX-512 VNNI", "amx": "AMX-INT8 (or the OS did not grant the tile state)"}
LEVELS = ("scalar", "avx2", "avx512")
TIMING_SHAPES = ((1, 4096, 11008), (16, 4096, 11008), (1024, 4096, 4096))  # M, K, N
DTYPES = ("float32", "float16", "bfloat16")
SFX = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}

FAILURES: list[str] = []


def report(ok: bool, msg: str) -> bool:
    print(("PASS " if ok else "FAIL ") + msg, flush=True)
    if not ok:
        FAILURES.append(msg)
    return ok


def load_reference():
    spec = importlib.util.spec_from_file_location("bnb_ms_reference", ROOT / "bitsandbytes_ms" / "_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- float16 / bfloat16 without ml_dtypes ------------------------------------------------------------
def bf16_bits(x) -> np.ndarray:
    """float32 -> bfloat16 bits, round to nearest even; NaN -> (bits >> 16) | 0x40 (as the kernels)."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    return np.where(nan, (b >> 16) | 0x40, r).astype(np.uint16)


def bf16_vals(bits) -> np.ndarray:
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_dtype(x, dt):
    """float32 values -> (argument for the kernel, the float32 values it holds)."""
    x = np.array(x, np.float32)  # a copy: kernels update some arguments in place
    if dt == "float32":
        return x, x.copy()
    if dt == "float16":
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    b = bf16_bits(x)
    return Typed(b, "bfloat16"), bf16_vals(b)


def out_array(shape, dt):
    """(argument, array holding the raw result)."""
    if dt == "float32":
        a = np.full(shape, np.nan, np.float32)
        return a, a
    if dt == "float16":
        a = np.full(shape, np.nan, np.float16)
        return a, a
    a = np.full(shape, 0x7FC0, np.uint16)
    return Typed(a, "bfloat16"), a


def bits_of(raw) -> np.ndarray:
    return raw.view(np.uint32) if raw.dtype == np.float32 else raw.view(np.uint16)


def vals_of(raw, dt) -> np.ndarray:
    return bf16_vals(raw) if dt == "bfloat16" else raw.astype(np.float32)


def ref_bits(x32, dt) -> np.ndarray:
    """Reference float32 values rounded to dt (nearest even), as bits."""
    x32 = np.asarray(x32, np.float32)
    if dt == "float32":
        return x32.view(np.uint32)
    if dt == "float16":
        with np.errstate(over="ignore"):
            return x32.astype(np.float16).view(np.uint16)
    return bf16_bits(x32)


def round_to(x32, dt) -> np.ndarray:
    x32 = np.asarray(x32, np.float32)
    if dt == "float32":
        return x32
    if dt == "float16":
        with np.errstate(over="ignore"):
            return x32.astype(np.float16).astype(np.float32)
    return bf16_vals(bf16_bits(x32))


def f64(v) -> np.ndarray:
    return np.array(float(v), np.float64)


def i64(v) -> np.ndarray:
    return np.array(int(v), np.int64)


def dynamic_map(ref, signed=True) -> np.ndarray:
    """create_dynamic_map(signed) (bitsandbytes_ms.functional, same values as upstream)."""
    data = []
    max_exp, total = 7, 8
    non_sign = total - 1
    extra = 2 ** (non_sign - max_exp) - 1
    for i in range(max_exp):
        items = int(2 ** (i + non_sign - max_exp) + 1 if signed else 2 ** (i + non_sign - max_exp + 1) + 1)
        b = ref.torch_linspace_f32(0.1, 1, items)
        means = ((b[:-1] + b[1:]) / np.float32(2.0)).astype(np.float32)
        scale = np.float32(10 ** (-(max_exp - 1) + i))
        data += (scale * means).astype(np.float32).tolist()
        if signed:
            data += (-scale * means).astype(np.float32).tolist()
    if extra > 0:
        b = ref.torch_linspace_f32(0.1, 1, extra + 1)
        means = ((b[:-1] + b[1:]) / np.float32(2.0)).astype(np.float32)
        scale = np.float32(10 ** (-(max_exp - 1) + max_exp - 1))
        data += (scale * means).astype(np.float32).tolist()
        if signed:
            data += (-scale * means).astype(np.float32).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return np.array(sorted(data), dtype=np.float32)


NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]
FP4 = [v / 12.0 for v in (0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0)]


def code4(qt):
    return np.array(NF4 if qt == "nf4" else FP4, np.float32)


# =====================================================================================================
# child: int8 GEMM on the path picked by BNB_MS_INT8_GEMM
# =====================================================================================================
def child_gemm(lib: Aot, want: str, quick: bool, timing: bool) -> dict:
    used = lib.int8_gemm_path()
    res = {"path": used, "path_m1": lib.int8_gemm_path(1), "path_m16": lib.int8_gemm_path(16), "simd": lib.simd_level()}
    if want != "auto" and used != want:
        return res
    rng = np.random.RandomState(0)
    fails, n = [], 0

    def check(A, B, what):
        nonlocal n
        n += 1
        out = np.full(A.shape[:-1] + (B.shape[0],), 0x5A5A5A5A, np.int32)
        rc = lib("cigemmlt_32", [A, B, out])
        ref = (A.reshape(-1, A.shape[-1]).astype(np.int64) @ B.T.astype(np.int64)).reshape(out.shape)
        if rc != 0 or not np.array_equal(out.astype(np.int64), ref):
            fails.append(f"{what} A{A.shape} B{B.shape}: rc={rc}, {int((out != ref).sum())} wrong")

    def rnd(*shape):
        return rng.randint(-128, 128, shape).astype(np.int8)

    if want != "auto":
        Ks = (1, 3, 10, 63, 64, 65, 127, 128, 129, 4095)
        Ms = (1, 2, 3, 4, 5, 15, 16, 17, 33) if not quick else (1, 3, 5, 16, 17, 33)
        Ns = (1, 2, 3, 15, 16, 17, 50) if not quick else (1, 3, 16, 17, 50)
        for K in Ks:
            for M in Ms:
                for N in Ns:
                    check(rnd(M, K), rnd(N, K), "random")
        big = [(32, 64, 128), (64, 96, 256), (48, 48, 192), (272, 40, 4095), (20, 300, 4500), (3, 1000, 2100),
               (100, 333, 1000)]
        if not quick:
            big += [(513, 130, 777), (64, 1000, 9000), (1, 11008, 4096), (16, 4096, 4096)]
        for M, N, K in big:
            check(rnd(M, K), rnd(N, K), "blocks")
        for K in (1, 63, 64, 65, 4095, 131071):
            for a, b in ((-128, -128), (127, -128), (-128, 127), (127, 127)):
                for M, N in (((1, 1), (17, 3), (2, 17), (33, 50)) if K < 5000 else ((2, 3), (17, 2))):
                    check(np.full((M, K), a, np.int8), np.full((N, K), b, np.int8), f"const({a},{b})")
        A = rnd(37, 2100)
        A[:, ::2] = -128
        A[1] = 127
        B = rnd(101, 2100)
        B[:, 1::3] = -128
        check(A, B, "mixed extremes")
        check(rnd(2, 3, 129), rnd(17, 129), "3-D")
        check(rnd(2, 2, 5, 65), rnd(33, 65), "4-D")
    res.update(cases=n, nfail=len(fails), fails=fails[:10])
    if timing:
        res["timing"] = {}
        budget = 0.4 if quick else 2.0
        for M, K, N in TIMING_SHAPES:
            if quick and used == "scalar" and M * N * K > 1e9:
                continue
            A, B = rnd(M, K), rnd(N, K)
            out = np.empty((M, N), np.int32)
            call = lib.prepare("cigemmlt_32", [A, B, out])
            t0 = time.perf_counter()
            rc = call()
            first = time.perf_counter() - t0
            rows = sorted({0, M // 2, M - 1})
            ok = rc == 0 and np.array_equal(out[rows].astype(np.int64), A[rows].astype(np.int64) @ B.T.astype(np.int64))
            if not ok:
                fails.append(f"timing shape {M}x{K}x{N}: spot-checked rows differ (rc={rc})")
                res["nfail"] += 1
            times = []
            reps = max(2, min(20, int(budget / max(first, 1e-6))))
            for _ in range(reps):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            t = float(np.median(times))
            res["timing"][f"{M}x{K}x{N}"] = {"ms": t * 1e3, "gops": 2 * M * N * K / t / 1e9, "path": lib.int8_gemm_path(M)}
        res["fails"] = fails[:10]
    return res


# =====================================================================================================
# child: every op at the SIMD level picked by BNB_MS_SIMD
# =====================================================================================================
class OpsChild:
    def __init__(self, lib: Aot, quick: bool, save: str | None):
        self.lib, self.quick = lib, quick
        self.ref = load_reference()
        self.level = lib.simd_level()
        self.saved: dict[str, np.ndarray] = {}
        self.save = save
        self.lines: list[tuple[bool, str]] = []

    def line(self, ok, msg):
        self.lines.append((bool(ok), f"[{self.level}] {msg}"))

    def keep(self, key, arr):
        self.saved[key] = np.ascontiguousarray(arr).copy()

    # ---- int8 vector quant / mm dequant ----
    def vq(self):
        ref, rng = self.ref, np.random.RandomState(11)
        shapes = [(1, 1), (1, 7), (3, 8), (2, 9), (5, 15), (4, 16), (3, 17), (2, 33), (7, 100), (33, 130), (1, 4096)]
        if not self.quick:
            shapes += [(64, 4095), (300, 1000)]
        ok = total = 0
        bad = []
        for si, (rows, cols) in enumerate(shapes):
            x = (rng.randn(rows, cols) * rng.choice([0.01, 1.0, 3.0])).astype(np.float32)
            if cols > 4:
                x[0, cols // 2] = 6.0
                x[-1, 1] = -11.5
                x[0, 0] = -0.0
            if rows > 2:
                x[1] = 0.0
                x[2, :] = 1e-39
            if rows > 3 and cols > 10:
                x[3, 4] = np.inf
            for dt in DTYPES:
                arg, vals = to_dtype(np.where(np.isfinite(x), np.clip(x, -6e4, 6e4), x) if dt == "float16" else x, dt)
                for thr in (0.0, 6.0):
                    out = np.full((rows, cols), 99, np.int8)
                    stats = np.full(rows, -1.0, np.float32)
                    flags = np.full(cols, 7, np.uint8)
                    rc = self.lib("cint8_vector_quant", [arg, np.array(thr, np.float32), out, stats, flags])
                    thr_r = float(round_to(np.array([thr], np.float32), dt)[0])
                    with np.errstate(all="ignore"):
                        q, st, fl = ref.int8_vector_quant(vals, thr_r, "float32")
                    total += 1
                    good = rc == 0 and np.array_equal(out, q) and np.array_equal(stats.view(np.uint32), st.view(np.uint32)) \
                        and np.array_equal(flags, fl)
                    ok += good
                    if not good:
                        bad.append(f"{rows}x{cols} {dt} thr={thr} rc={rc}")
                    key = f"vq/{si}/{dt}/{thr}"
                    self.keep(key + "/CA", out)
                    self.keep(key + "/stats", stats.view(np.uint32))
                    self.keep(key + "/flags", flags)
        self.line(ok == total, f"int8 vector quant: {ok}/{total} cases bit-exact vs reference (codes, row stats, "
                               f"outlier columns){'; ' + ', '.join(bad[:4]) if bad else ''}")

    def mmdq(self):
        ref, rng = self.ref, np.random.RandomState(12)
        shapes = [(1, 1), (2, 7), (3, 8), (1, 9), (4, 15), (2, 16), (3, 17), (2, 33), (5, 100), (17, 70)]
        if not self.quick:
            shapes += [(64, 4096), (3, 11008)]
        ok = total = 0
        bad = []
        for si, (rows, cols) in enumerate(shapes):
            A = rng.randint(-2**24, 2**24, (rows, cols)).astype(np.int32)
            A.flat[0] = 2**31 - 1
            A.flat[-1] = -2**31
            rs = (rng.rand(rows) * 10).astype(np.float32)
            cs = (rng.rand(cols) * 10).astype(np.float32)
            if cols > 5:
                cs[3], cs[4] = 1e5, 1e-9
            for odt in DTYPES:
                for bdt in ("none",) + DTYPES:
                    bias_arg, bvals = (None, None) if bdt == "none" else to_dtype((rng.randn(cols) * 3).astype(np.float32), bdt)
                    oarg, raw = out_array((rows, cols), odt)
                    rc = self.lib(f"cdequant_mm_int32_{SFX[odt]}", [A, rs, cs, bias_arg, oarg])
                    with np.errstate(all="ignore"):
                        r32 = ref.int8_mm_dequant(A, rs, cs, bvals, "float32")
                    total += 1
                    good = rc == 0 and np.array_equal(bits_of(raw), ref_bits(r32, odt))
                    ok += good
                    if not good:
                        bad.append(f"{rows}x{cols} out={odt} bias={bdt} rc={rc}")
                    self.keep(f"mmdq/{si}/{odt}/{bdt}", bits_of(raw))
        self.line(ok == total, f"int8 mm dequant: {ok}/{total} cases bit-exact vs reference "
                               f"(fp32/fp16/bf16 out, no/fp32/fp16/bf16 bias){'; ' + ', '.join(bad[:4]) if bad else ''}")

    # ---- blockwise 8-bit ----
    def blockwise(self):
        ref, rng = self.ref, np.random.RandomState(13)
        code = dynamic_map(ref)
        sizes = (1, 33, 4097, 100_003) if self.quick else (1, 33, 4097, 100_003, 1 << 21)
        ok = total = 0
        bad = []
        for dt in DTYPES:
            for bs in (64, 256, 4096, 100):
                for n in sizes:
                    x = (rng.randn(n) * np.exp(rng.randn() * 2)).astype(np.float32)
                    if n > 4 * bs:
                        x[bs:2 * bs] = 0.0
                        x[3 * bs + 1] = 1e4
                    arg, vals = to_dtype(x, dt)
                    nb = -(-n // bs)
                    q = np.full(n, 0xAB, np.uint8)
                    am = np.full(nb, -7.0, np.float32)
                    rc = self.lib(f"cquantize_blockwise_{SFX[dt]}", [code, arg, i64(bs), q, am])
                    rq, ram = ref.quantize_blockwise(vals, code, bs)
                    good = rc == 0 and np.array_equal(q, rq) and np.array_equal(am.view(np.uint32), ram.view(np.uint32))
                    oarg, raw = out_array(n, dt)
                    rc2 = self.lib(f"cdequantize_blockwise_{SFX[dt]}", [code, rq, ram, i64(bs), oarg])
                    rd = ref.dequantize_blockwise(rq, ram, code, bs, "float32")
                    good = good and rc2 == 0 and np.array_equal(bits_of(raw), ref_bits(rd, dt))
                    total += 1
                    ok += good
                    if not good:
                        bad.append(f"{dt} bs={bs} n={n}")
                    self.keep(f"bw/{dt}/{bs}/{n}/q", q)
                    self.keep(f"bw/{dt}/{bs}/{n}/d", bits_of(raw))
        self.line(ok == total, f"blockwise 8-bit quantize+dequantize: {ok}/{total} cases bit-exact vs reference"
                               f"{'; ' + ', '.join(bad[:4]) if bad else ''}")

    # ---- 4-bit ----
    def fourbit(self):
        ref, rng = self.ref, np.random.RandomState(14)
        sizes = (1, 2, 33, 4097, 65543) if self.quick else (1, 2, 33, 4097, 65543, 1 << 20)
        ok = total = 0
        bad = []
        for qt in ("nf4", "fp4"):
            code = code4(qt)
            for dt in DTYPES:
                for bs in (64, 128, 4096, 100):
                    for n in sizes:
                        x = (rng.randn(n) * np.exp(rng.randn())).astype(np.float32)
                        if n > 4 * bs:
                            x[bs:2 * bs] = 0.0
                            x[2 * bs:3 * bs] = -0.0
                        arg, vals = to_dtype(x, dt)
                        nb = -(-n // bs)
                        q = np.full(((n + 1) // 2, 1), 0xAB, np.uint8)
                        am = np.full(nb, -7.0, np.float32)
                        rc = self.lib(f"cquantize_blockwise_{SFX[dt]}_{qt}", [code, arg, i64(bs), q, am])
                        with np.errstate(all="ignore"):
                            rq, ram = ref.quantize_4bit(vals, code, bs)
                        good = rc == 0 and np.array_equal(q, rq) and np.array_equal(am.view(np.uint32), ram.view(np.uint32))
                        oarg, raw = out_array(n, dt)
                        rc2 = self.lib(f"cdequantize_blockwise_{SFX[dt]}_{qt}", [code, rq, ram, i64(bs), i64(n), oarg])
                        rd = ref.dequantize_4bit(rq, ram, code, bs, n, "float32", fp4=qt == "fp4")
                        good = good and rc2 == 0 and np.array_equal(bits_of(raw), ref_bits(rd, dt))
                        total += 1
                        ok += good
                        if not good:
                            bad.append(f"{qt} {dt} bs={bs} n={n}")
                        self.keep(f"4b/{qt}/{dt}/{bs}/{n}/q", q)
                        self.keep(f"4b/{qt}/{dt}/{bs}/{n}/d", bits_of(raw))
        self.line(ok == total, f"4-bit NF4/FP4 quantize+dequantize: {ok}/{total} cases bit-exact vs reference"
                               f"{'; ' + ', '.join(bad[:4]) if bad else ''}")

    def gemv(self):
        ref, rng = self.ref, np.random.RandomState(15)
        shapes = [(1, 333, 4096, 128), (1, 64, 100, 64), (1, 50, 96, 32), (3, 128, 256, 64), (1, 129, 512, 100),
                  (2, 17, 34, 2), (1, 77, 518, 64)]
        if not self.quick:
            shapes += [(1, 11008, 4096, 64), (1, 4096, 11008, 64), (4, 256, 1024, 4096)]
        tol = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
        ok = total = 0
        worst = 0.0
        bad = []
        for qt in ("nf4", "fp4"):
            code = code4(qt)
            for dt in DTYPES:
                for (M, N, K, bs) in shapes:
                    W = rng.randn(N * K).astype(np.float32)
                    warg, wv = to_dtype(W, dt)
                    q = np.empty(((N * K + 1) // 2, 1), np.uint8)
                    am = np.empty(-(-N * K // bs), np.float32)
                    rc0 = self.lib(f"cquantize_blockwise_{SFX[dt]}_{qt}", [code, warg, i64(bs), q, am])
                    aarg, av = to_dtype(rng.randn(M, K).astype(np.float32), dt)
                    oarg, raw = out_array((M, N), dt)
                    rc = self.lib(f"cgemm_4bit_inference_naive_{SFX[dt]}", [aarg, q, am, code, i64(bs), i64(N), oarg])
                    r = ref.gemv_4bit(av, q, am, code, bs, N)
                    o = vals_of(raw, dt)
                    t = tol[dt]
                    err = np.abs(o - r)
                    lim = t * (np.abs(r).max() + 1) + t * np.abs(r)
                    worst = max(worst, float((err / lim).max()))
                    good = rc0 == 0 and rc == 0 and bool(np.all(err <= lim))
                    total += 1
                    ok += good
                    if not good:
                        bad.append(f"{qt} {dt} {M}x{N}x{K} bs={bs}")
        self.line(ok == total, f"gemv_4bit: {ok}/{total} shapes within the tests' tolerance of the reference "
                               f"(atol tol*(max|ref|+1), rtol tol; tol 1e-5/1e-3/8e-3); worst err/tol {worst:.3f}"
                               f"{'; ' + ', '.join(bad[:4]) if bad else ''}")

    def linear4(self):
        """clinear_4bit (the fused 4-bit linear forward): gemv for one row, the dequantize-GEMM for more, with
        double-quant absmax and bias; within the gemv tolerance of the reference, bytes kept for the
        cross-level comparison (the kernel's order is the same at every level)."""
        ref, rng = self.ref, np.random.RandomState(16)
        shapes = [(1, 64, 256, 64), (2, 40, 192, 64), (3, 33, 100, 64), (5, 17, 77, 32), (8, 64, 512, 128),
                  (9, 24, 1000, 256), (17, 50, 96, 64)]
        if not self.quick:
            shapes += [(4, 1536, 576, 64), (16, 576, 1536, 64), (32, 256, 4096, 64)]
        tol = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
        code2 = dynamic_map(ref)
        ok = total = 0
        bad = []
        for dt in DTYPES:
            for (M, N, K, bs) in shapes:
                for nested in (False, True):
                    code = code4("nf4")
                    warg, _ = to_dtype(rng.randn(N * K).astype(np.float32), dt)
                    q = np.empty(((N * K + 1) // 2, 1), np.uint8)
                    nb = -(-N * K // bs)
                    am = np.empty(nb, np.float32)
                    rc0 = self.lib(f"cquantize_blockwise_{SFX[dt]}_nf4", [code, warg, i64(bs), q, am])
                    if nested:
                        off = np.float32(am.mean())
                        aq = np.empty(nb, np.uint8)
                        am2 = np.empty(-(-nb // 256), np.float32)
                        rc0 |= self.lib("cquantize_blockwise_fp32", [code2, (am - off).astype(np.float32), i64(256), aq, am2])
                        amx, extra = aq, [am2, code2, np.array(off, np.float32)]
                        am_used = (code2[aq] * np.repeat(am2, 256)[:nb] + off).astype(np.float32)
                    else:
                        amx, extra, am_used = am, [None, None, None], am
                    aarg, av = to_dtype(rng.randn(M, K).astype(np.float32), dt)
                    barg, bv = to_dtype(rng.randn(N).astype(np.float32), dt)
                    oarg, raw = out_array((M, N), dt)
                    rc = self.lib(f"clinear_4bit_{SFX[dt]}", [aarg, q, amx, code] + extra +
                                  [barg, i64(bs), i64(256), i64(N), oarg])
                    r = ref.gemv_4bit(av, q, am_used, code, bs, N).astype(np.float32) + bv
                    o = vals_of(raw, dt)
                    t = tol[dt]
                    good = rc0 == 0 and rc == 0 and bool(np.all(np.abs(o - r) <= t * (np.abs(r).max() + 1) + t * np.abs(r)))
                    total += 1
                    ok += good
                    if not good:
                        bad.append(f"{dt} {M}x{N}x{K} bs={bs} nested={nested} rc={rc0},{rc}")
                    self.keep(f"lin4/{dt}/{M}/{N}/{K}/{bs}/{nested}", bits_of(raw))
        self.line(ok == total, f"clinear_4bit (fused 4-bit linear, gemv + dequantize-GEMM): {ok}/{total} within the "
                               f"gemv tolerance of the reference{'; ' + ', '.join(bad[:4]) if bad else ''}")

    # ---- optimizers ----
    HP = {"adam": (0.9, 0.999, 0.0, 0.0, 1e-8, 1e-3), "momentum": (0.9, 0.0, 0.0, 0.0, 1e-8, 1e-2),
          "rmsprop": (0.99, 0.0, 0.0, 0.0, 1e-8, 1e-2), "lion": (0.9, 0.99, 0.0, 0.0, 1e-8, 1e-4),
          "adagrad": (0.0, 0.0, 0.0, 0.0, 1e-10, 1e-2), "ademamix": (0.9, 0.999, 0.9999, 5.0, 1e-8, 1e-3)}
    OPT32 = {"adam": ("cadam32bit_grad_fp32", "cadam32bit_grad_fp16", "cadam32bit_grad_bf16"),
             "ademamix": ("cademamix32bit_grad_fp32", "cademamix32bit_grad_fp16", "cademamix32bit_grad_bf16"),
             "lion": ("clion32bit_grad_fp32", "clion32bit_grad_fp16", "clion32bit_grad_bf16"),
             "momentum": ("cmomentum32bit_grad_32", "cmomentum32bit_grad_16", "cmomentum32bit_grad_bf16"),
             "rmsprop": ("crmsprop32bit_grad_32", "crmsprop32bit_grad_16", "crmsprop32bit_grad_bf16"),
             "adagrad": ("cadagrad32bit_grad_32", "cadagrad32bit_grad_16", "cadagrad32bit_grad_bf16")}

    def optim32(self):
        ref = self.ref
        n = 1300 if self.quick else 100_003
        for opt, names in self.OPT32.items():
            ok = total = 0
            bad = []
            for dt, name in zip(DTYPES, names):
                for wd in (0.0, 0.01):
                    rng = np.random.RandomState(len(opt) * 7 + int(wd * 100) + DTYPES.index(dt))
                    b1, b2, b3, al, eps, lr = self.HP[opt]
                    _, p = to_dtype(rng.randn(n).astype(np.float32), dt)
                    s1 = np.abs(rng.randn(*((2, n) if opt == "ademamix" else (n,)))).astype(np.float32) * 0.01
                    s2 = (rng.rand(n).astype(np.float32) * 1e-3) if opt in ("adam", "ademamix") else None
                    parg, _ = to_dtype(p, dt)
                    S1, S2 = s1.copy(), None if s2 is None else s2.copy()
                    good = True
                    for step in (1, 2, 3):
                        garg, g = to_dtype((rng.randn(n) * 0.1).astype(np.float32), dt)
                        status = np.full(1, 9, np.int32)
                        rc = self.lib(name, [garg, parg, S1, S2, None, f64(0), f64(0), f64(b1), f64(b2), f64(b3), f64(al),
                                             f64(eps), f64(wd), f64(step), f64(lr), f64(1.0), np.array(False), status])
                        rp, s1, s2, _ = ref.optimizer_update_32bit(opt, g, p, s1, s2, b1, b2, b3, al, eps, wd, step, lr,
                                                                   p_dtype="float32")
                        p = round_to(rp, dt)
                        pbits = bits_of(parg.array if isinstance(parg, Typed) else parg)
                        good = good and rc == 0 and status[0] == 0 and np.array_equal(pbits, ref_bits(p, dt)) \
                            and np.array_equal(S1.view(np.uint32), s1.view(np.uint32)) \
                            and (s2 is None or np.array_equal(S2.view(np.uint32), s2.view(np.uint32)))
                    total += 1
                    ok += good
                    if not good:
                        bad.append(f"{dt} wd={wd}")
            self.line(ok == total, f"optimizer 32-bit {opt}: {ok}/{total} (fp32/fp16/bf16 x wd 0/0.01, n={n}, 3 steps) "
                                   f"bit-exact vs reference (p, state1, state2){'; ' + ', '.join(bad) if bad else ''}")
        # LAMB: adam rule + trust ratio (max_unorm)
        rng = np.random.RandomState(3)
        n2 = 3000
        p0, g = rng.randn(n2).astype(np.float32), rng.randn(n2).astype(np.float32)
        P, S1, S2, un = p0.copy(), np.zeros(n2, np.float32), np.zeros(n2, np.float32), np.zeros(1, np.float32)
        status = np.full(1, 9, np.int32)
        rc = self.lib("cadam32bit_grad_fp32", [g, P, S1, S2, un, f64(0.01), f64(0),
                                               f64(0.9), f64(0.999), f64(0), f64(0), f64(1e-8), f64(0), f64(1), f64(1.0),
                                               f64(1.0), np.array(False), status])
        rp, _, _, unorm = ref.optimizer_update_32bit("adam", g, p0, np.zeros(n2, np.float32), np.zeros(n2, np.float32),
                                                     0.9, 0.999, 0, 0, 1e-8, 0.0, 1, 1.0, max_unorm=0.01)
        good = rc == 0 and np.allclose(un[0], unorm, rtol=1e-6) and np.allclose(P, rp, rtol=1e-6, atol=1e-7)
        self.line(good, f"optimizer 32-bit LAMB (adam + max_unorm): unorm and p within rtol 1e-6 of the reference (rc={rc})")

    def optim8(self):
        ref = self.ref
        q_signed, q_unsigned = dynamic_map(ref, True), dynamic_map(ref, False)
        n = 256 * 5 + 77 if self.quick else 256 * 400 + 77
        nb = -(-n // 256)
        for opt in self.HP:
            names = tuple(f"c{opt}_8bit_blockwise_grad_{s}" for s in ("fp32", "fp16", "bf16"))
            ok = total = 0
            bad = []
            for dt, name in zip(DTYPES, names):
                for wd in (0.0, 0.01):
                    rng = np.random.RandomState(len(opt) * 11 + int(wd * 100) + DTYPES.index(dt))
                    b1, b2, b3, al, eps, lr = self.HP[opt]
                    mult = 2 if opt == "ademamix" else 1
                    two = opt in ("adam", "ademamix")
                    _, p = to_dtype(rng.randn(n).astype(np.float32), dt)
                    parg, _ = to_dtype(p, dt)
                    s1f = rng.randn(mult, n).astype(np.float32) * 0.01
                    if opt in ("rmsprop", "adagrad"):
                        s1f = np.abs(s1f)
                    qs = [ref.quantize_blockwise(s1f[i], q_signed, 256) for i in range(mult)]
                    q1 = np.stack([q for q, _ in qs]).reshape((2, n) if mult == 2 else (n,))
                    a1 = np.stack([a for _, a in qs]).reshape((2, nb) if mult == 2 else (nb,))
                    q2 = a2 = None
                    if two:
                        q2, a2 = ref.quantize_blockwise(np.abs(rng.randn(n).astype(np.float32)) * 1e-4, q_unsigned, 256)
                    Q1, A1 = q1.copy(), a1.copy()
                    Q2, A2 = (q2.copy(), a2.copy()) if two else (None, None)
                    good = True
                    for step in (1, 2, 3):
                        garg, g = to_dtype((rng.randn(n) * 0.1).astype(np.float32), dt)
                        if step == 2:
                            g[256:512] = 0.0
                            garg, g = to_dtype(g, dt)
                        status = np.full(1, 9, np.int32)
                        rc = self.lib(name, [garg, parg, Q1, Q2, q_signed, q_unsigned if two else None, A1, A2,
                                             f64(b1), f64(b2), f64(b3), f64(al), f64(eps), f64(step), f64(lr), f64(wd),
                                             f64(1.0), np.array(False), status])
                        rp, q1, q2, a1, a2 = ref.optimizer_update_8bit_blockwise(
                            opt, g, p, q1, q2, b1, b2, b3, al, eps, step, lr, q_signed, q_unsigned if two else None,
                            a1, a2, weight_decay=wd, p_dtype="float32")
                        p = round_to(rp, dt)
                        pbits = bits_of(parg.array if isinstance(parg, Typed) else parg)
                        good = good and rc == 0 and status[0] == 0 and np.array_equal(pbits, ref_bits(p, dt)) \
                            and np.array_equal(Q1, q1) and np.array_equal(A1.view(np.uint32), np.asarray(a1, np.float32).view(np.uint32)) \
                            and (not two or (np.array_equal(Q2, q2) and np.array_equal(A2.view(np.uint32), a2.view(np.uint32))))
                    total += 1
                    ok += good
                    if not good:
                        bad.append(f"{dt} wd={wd}")
                    self.keep(f"opt8/{opt}/{dt}/{wd}", np.concatenate([Q1.reshape(-1), A1.view(np.uint8).reshape(-1)]))
            self.line(ok == total, f"optimizer 8-bit blockwise {opt}: {ok}/{total} (fp32/fp16/bf16 x wd 0/0.01, n={n}, "
                                   f"3 steps, a zero block) bit-exact vs reference (p, state bytes, absmax)"
                                   f"{'; ' + ', '.join(bad) if bad else ''}")

    # ---- weight-only int8/int4 ----
    def weightonly(self):
        ref, rng = self.ref, np.random.default_rng(16)
        okq = totq = okg = totg = 0
        bad = []
        for bits in (8, 4):
            for dt in DTYPES:
                for K in (1, 37, 64, 129, 4096):
                    N = 19
                    W = rng.standard_normal((N, K)).astype(np.float32)
                    W[3] = 0.0
                    warg, wv = to_dtype(W, dt)
                    rb = K if bits == 8 else (K + 1) // 2
                    q = np.empty((N, rb), np.int8 if bits == 8 else np.uint8)
                    sc = np.empty(N, np.float32)
                    rc = self.lib(f"cquantize_weight_only_int{bits}_{SFX[dt]}", [warg, q, sc])
                    rq, rs = ref.quantize_weight_only(wv, bits)
                    good = rc == 0 and np.array_equal(q, rq) and np.array_equal(sc.view(np.uint32), rs.view(np.uint32))
                    oarg, raw = out_array((N, K), dt)
                    rc = self.lib(f"cdequantize_weight_only_int{bits}_{SFX[dt]}", [rq, rs, i64(K), oarg])
                    rd = ref.dequantize_weight_only(rq, rs, K, bits, "float32")
                    good = good and rc == 0 and np.array_equal(bits_of(raw), ref_bits(rd, dt))
                    totq += 1
                    okq += good
                    if not good:
                        bad.append(f"quant int{bits} {dt} K={K}")
                    self.keep(f"wo/{bits}/{dt}/{K}", q.view(np.uint8))
                    if dt == "bfloat16":
                        continue
                    for rows in (1, 3, 40):
                        aarg, av = to_dtype(rng.standard_normal((rows, K)).astype(np.float32), dt)
                        oarg, raw = out_array((rows, N), dt)
                        rc = self.lib(f"cgemm_weight_only_int{bits}_{SFX[dt]}", [aarg, rq, rs, oarg])
                        r = ref.gemm_weight_only(av, rq, rs, bits).astype(np.float32)
                        tol = 1e-4 if dt == "float32" else 2e-2
                        good = rc == 0 and np.allclose(vals_of(raw, dt), r, rtol=tol, atol=tol * max(np.abs(r).max(), 1e-30))
                        totg += 1
                        okg += good
                        if not good:
                            bad.append(f"gemm int{bits} {dt} {rows}x{N}x{K}")
        self.line(okq == totq, f"weight-only int8/int4 quantize+dequantize: {okq}/{totq} cases bit-exact vs reference")
        self.line(okg == totg, f"weight-only int8/int4 GEMM (fp32/fp16): {okg}/{totg} within the tests' tolerance"
                               f"{'; ' + ', '.join(bad[:4]) if bad else ''}")

    def run(self):
        for f in (self.vq, self.mmdq, self.blockwise, self.fourbit, self.gemv, self.linear4, self.optim32, self.optim8,
                  self.weightonly):
            t0 = time.perf_counter()
            try:
                f()
            except Exception as e:  # a crash in one check is a failure, the others still run
                self.line(False, f"{f.__name__}: {type(e).__name__}: {e}")
            self.lines[-1] = (self.lines[-1][0], self.lines[-1][1] + f"  ({time.perf_counter() - t0:.1f} s)")
        if self.save:
            np.savez(self.save, **self.saved)
        return {"level": self.level, "lines": self.lines}


# =====================================================================================================
# child: the 4-bit bf16-compute kernel (clinear_4bit_bf16dot_bf16)
# =====================================================================================================
def bf16dot_path(lib: Aot) -> str:
    if not lib.has("bnb_ms_linear4_bf16dot_path"):
        return "?"
    import ctypes as ct
    f = lib.dll.bnb_ms_linear4_bf16dot_path
    f.restype = ct.c_char_p
    return f().decode()


def _nf4_weight(lib: Aot, rng, N, K, bs, nested, tiny=False):
    """(packed, absmax argument, extra args [absmax2, code2, offset], fp32 absmax the kernel decodes)."""
    code = code4("nf4")
    w = rng.randn(N * K).astype(np.float32)
    if tiny:  # some blocks scaled so that code * absmax is a bf16 denormal or its products underflow
        w[: N * K // 3] *= np.float32(2.0 ** -126)
    q = np.empty(((N * K + 1) // 2, 1), np.uint8)
    nb = -(-N * K // bs)
    am = np.empty(nb, np.float32)
    rc = lib("cquantize_blockwise_fp32_nf4", [code, w, i64(bs), q, am])
    if nested:
        ref = load_reference()
        code2 = dynamic_map(ref)
        off = np.float32(am.mean())
        aq = np.empty(nb, np.uint8)
        am2 = np.empty(-(-nb // 256), np.float32)
        rc |= lib("cquantize_blockwise_fp32", [code2, (am - off).astype(np.float32), i64(256), aq, am2])
        return rc, code, q, aq, [am2, code2, np.array(off, np.float32)]
    return rc, code, q, am, [None, None, None]


BF16_SHAPES = [(1, 64, 256, 64), (2, 40, 192, 64), (3, 33, 100, 64), (5, 17, 77, 32), (8, 64, 512, 128),
               (1, 24, 1000, 256), (16, 50, 96, 64), (32, 20, 130, 64), (4, 7, 31, 64)]


def child_bf16(lib: Aot, quick: bool, timing: bool, save: str | None) -> dict:
    ref = load_reference()
    rng = np.random.RandomState(23)
    res = {"path": bf16dot_path(lib), "level": lib.simd_level(), "cases": 0, "nfail": 0, "fails": [], "timing": {}}
    saved = {}
    for (M, N, K, bs) in BF16_SHAPES:
        for nested in (False, True):
            for with_bias in (False, True):
                tiny = (M * N + K) % 3 == 0
                rc0, code, q, amx, extra = _nf4_weight(lib, rng, N, K, bs, nested, tiny)
                x = rng.randn(M, K).astype(np.float32)
                if tiny:
                    x[:, ::5] *= np.float32(2.0 ** -40)  # some products below FLT_MIN; some x bf16 denormals
                    x[:, 1::7] = np.float32(2.0 ** -130)
                aarg, av = to_dtype(x, "bfloat16")
                barg, bv = to_dtype(rng.randn(N).astype(np.float32), "bfloat16") if with_bias else (None, None)
                oarg, raw = out_array((M, N), "bfloat16")
                rc = lib("clinear_4bit_bf16dot_bf16", [aarg, q, amx, code] + extra + [barg, i64(bs), i64(256), i64(N), oarg])
                am_used = amx if not nested else (extra[1][amx] * np.repeat(extra[0], 256)[:amx.size]
                                                  + extra[2]).astype(np.float32)
                want = ref.bf16_round_bits(ref.linear_4bit_bf16dot(av, q, am_used, code, bs, N, bias=bv))
                res["cases"] += 1
                if rc0 or rc or not np.array_equal(raw, want):
                    res["nfail"] += 1
                    res["fails"].append(f"{M}x{N}x{K} bs={bs} nested={nested} bias={with_bias} rc={rc0},{rc} "
                                        f"({int(np.sum(raw != want))} outputs differ)")
                saved[f"{M}/{N}/{K}/{bs}/{nested}/{with_bias}"] = raw.copy()
    N, K, bs = 11008, 4096, 64
    rc0, code, q, amx, extra = _nf4_weight(lib, rng, N, K, bs, False)
    for M in (1, 16):
        aarg, _ = to_dtype(rng.randn(M, K).astype(np.float32), "bfloat16")
        row = {}
        for name in ("clinear_4bit_bf16dot_bf16", "clinear_4bit_bf16"):
            oarg, raw = out_array((M, N), "bfloat16")
            call = lib.prepare(name, [aarg, q, amx, code] + extra + [None, i64(bs), i64(256), i64(N), oarg])
            t0 = time.perf_counter()
            rc = call()
            first = time.perf_counter() - t0
            if rc0 or rc:
                res["nfail"] += 1
                res["fails"].append(f"{name} {M}x{K}x{N}: rc={rc0},{rc}")
            if name == "clinear_4bit_bf16dot_bf16":
                saved[f"big/{M}"] = raw.copy()
            else:
                exact = bf16_vals(raw)
            if timing:
                times = []
                for _ in range(max(3, min(50, int((0.3 if quick else 1.5) / max(first, 1e-6))))):
                    t0 = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - t0)
                row[name] = float(np.median(times)) * 1e3
        dot = bf16_vals(saved[f"big/{M}"])
        row["max_abs_diff_vs_exact"] = float(np.max(np.abs(dot - exact)))
        row["max_abs_exact"] = float(np.max(np.abs(exact)))
        res["timing"][str(M)] = row
    res["fails"] = res["fails"][:6]
    if save:
        np.savez(save, **saved)
    return res


# =====================================================================================================
# parent
# =====================================================================================================
def run_child(args, env_updates, extra):
    env = dict(os.environ)
    for k in ("BNB_MS_SIMD", "BNB_MS_INT8_GEMM"):
        env.pop(k, None)
    env.update(env_updates)
    cmd = [sys.executable, __file__, "--cpu-lib", args.cpu_lib] + (["--quick"] if args.quick else []) + extra
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr or r.stdout)[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def check_bf16(args, feats: int) -> None:
    has_bf16 = bool(feats & (1 << 9))
    runs = {}
    with tempfile.TemporaryDirectory() as d:
        # BNB_MS_4BIT_AMX=0: the vdpbf16ps kernel from 16 rows too (the AMX-BF16 one sums in the tile unit's order,
        # within the documented bound: tests/test_linear4bit_bf16.py)
        for label, env in (("native", {"BNB_MS_4BIT_AMX": "0"}), ("portable", {"BNB_MS_SIMD": "avx2"})):
            out = os.path.join(d, f"{label}.npz")
            # the portable kernel is timed only where it is the library's own choice (the native run)
            extra = ["--child", "bf16", "--save", out] + (["--no-timing"] if args.no_timing or label == "portable" else [])
            res, err = run_child(args, env, extra)
            if res is None:
                report(False, f"bf16 [{label}]: the subprocess failed: {err}")
                continue
            report(res["nfail"] == 0, f"bf16 [{label}: {res['path']} kernel, SIMD {res['level']}]: "
                                      f"{res['cases'] - min(res['nfail'], res['cases'])}/{res['cases']} small cases "
                                      f"bit-exact vs the numpy model (_reference.linear_4bit_bf16dot); 4096x11008 "
                                      f"batch 1/16 ran{'; ' + '; '.join(res['fails']) if res['fails'] else ''}")
            runs[label] = (res, dict(np.load(out)))
    if "native" in runs and "portable" in runs:
        (rn, a), (rp, b) = runs["native"], runs["portable"]
        same = [k for k in a if k in b and a[k].shape == b[k].shape and np.array_equal(a[k], b[k])]
        if rn["path"] == rp["path"]:
            print(f"SKIP bf16 kernels bit-for-bit: both runs used the {rn['path']} kernel (CPU "
                  f"{'has' if has_bf16 else 'lacks'} AVX512-BF16)", flush=True)
        else:
            report(len(same) == len(a) == len(b),
                   f"bf16 [{rn['path']}] vs [{rp['path']}]: {len(same)}/{len(a)} outputs byte-identical "
                   f"(small cases + 4096x11008 batch 1 and 16)")
    for label, (res, _) in runs.items():
        if not res["timing"] or "clinear_4bit_bf16" not in res["timing"].get("1", {}):
            continue
        print(f"\n4-bit linear, bf16 input, 4096 -> 11008 NF4 bs 64, {label} run ({res['path']} kernel; median ms):")
        print(f"  {'batch':>5} {'bf16 dot':>10} {'exact fp32':>11} {'speed-up':>9} {'max|dot-exact|':>15} {'max|exact|':>11}")
        for M in ("1", "16"):
            r = res["timing"][M]
            dot, ex = r["clinear_4bit_bf16dot_bf16"], r["clinear_4bit_bf16"]
            print(f"  {M:>5} {dot:10.3f} {ex:11.3f} {ex / dot:8.2f}x {r['max_abs_diff_vs_exact']:15.4g} "
                  f"{r['max_abs_exact']:11.4g}")
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-lib", required=True, help="path of libbitsandbytes_ms_cpu.so")
    ap.add_argument("--quick", action="store_true", help="fewer shapes and shorter timings (about a minute)")
    ap.add_argument("--only", choices=("gemm", "ops", "bf16"),
                    help="run only the int8 GEMM part, only the other ops, or only the 4-bit bf16-compute kernel")
    ap.add_argument("--child", choices=("gemm", "ops", "bf16"), help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--save", help=argparse.SUPPRESS)
    ap.add_argument("--no-timing", action="store_true", help="skip the GEMM timings")
    args = ap.parse_args()
    args.cpu_lib = str(Path(args.cpu_lib).resolve())

    if args.child == "gemm":
        print(json.dumps(child_gemm(Aot(args.cpu_lib), args.path, args.quick, not args.no_timing)))
        return 0
    if args.child == "bf16":
        print(json.dumps(child_bf16(Aot(args.cpu_lib), args.quick, not args.no_timing, args.save)))
        return 0
    if args.child == "ops":
        print(json.dumps(OpsChild(Aot(args.cpu_lib), args.quick, args.save).run()))
        return 0

    lib = Aot(args.cpu_lib)
    feats = int(lib.dll.bnb_ms_cpu_features()) if lib.has("bnb_ms_cpu_features") else 0
    names = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx_vnni",
             "avx512_bf16", "amx_int8", "amx_bf16")
    print(f"library {args.cpu_lib}")
    print(f"CPU features: {' '.join(n for i, n in enumerate(names) if feats & (1 << i)) or '(baseline)'}; "
          f"SIMD level {lib.simd_level()}; int8 GEMM path {lib.int8_gemm_path()} (M=1: {lib.int8_gemm_path(1)})")
    t_start = time.perf_counter()

    if args.only in (None, "gemm"):
        table = []
        for path in GEMM_PATHS + ("auto",):
            res, err = run_child(args, {} if path == "auto" else {"BNB_MS_INT8_GEMM": path},
                                 ["--child", "gemm", "--path", path] + (["--no-timing"] if args.no_timing else []))
            if res is None:
                report(False, f"int8 GEMM [{path}]: the subprocess failed: {err}")
                continue
            if path != "auto" and res["path"] != path:
                print(f"SKIP int8 GEMM [{path}]: CPU lacks {ISA[path]} (the library chose {res['path']})", flush=True)
                continue
            if path != "auto":
                report(res["nfail"] == 0 and res["path_m1"] == res["path_m16"] == path,
                       f"int8 GEMM [{path}]: {res['cases'] - res['nfail']}/{res['cases']} shapes exact vs numpy int64 "
                       f"(path used for M=1 and M=16: {res['path_m1']}/{res['path_m16']})"
                       f"{'; ' + '; '.join(res['fails']) if res['fails'] else ''}")
            else:
                report(res.get("nfail", 0) == 0, f"int8 GEMM [auto]: {res['path']} (M=1: {res['path_m1']}, "
                                                  f"M=16: {res['path_m16']}); timing rows spot-checked")
            if "timing" in res:
                table.append((path, res["timing"]))
        if table:
            print("\nint8 GEMM timings (median; GOP/s = 2*M*N*K / time; MxKxN):")
            hdr = "  {:<11}".format("path") + "".join(f"{f'{M}x{K}x{N}':>22}" for M, K, N in TIMING_SHAPES)
            print(hdr)
            for path, tm in table:
                cells = []
                for M, K, N in TIMING_SHAPES:
                    t = tm.get(f"{M}x{K}x{N}")
                    cells.append(f"{t['gops']:9.1f} GOP/s {t['ms']:7.2f}ms" if t else f"{'-':>22}")
                print("  {:<11}".format(path) + "".join(f"{c:>22}" for c in cells)
                      + (f"   (auto: {', '.join(sorted({v['path'] for v in tm.values()}))})" if path == "auto" else ""))
            print()

    if args.only in (None, "ops"):
        saved = {}
        with tempfile.TemporaryDirectory() as d:
            for level in LEVELS:
                out = os.path.join(d, f"{level}.npz")
                res, err = run_child(args, {"BNB_MS_SIMD": level}, ["--child", "ops", "--save", out])
                if res is None:
                    report(False, f"ops [{level}]: the subprocess failed: {err}")
                    continue
                if res["level"] != level:
                    print(f"SKIP ops [{level}]: CPU lacks {level} (ran at {res['level']})", flush=True)
                    continue
                for ok, msg in res["lines"]:
                    report(ok, msg)
                saved[level] = dict(np.load(out))
        base = saved.get("scalar")
        for level in ("avx2", "avx512"):
            if base is None or level not in saved:
                continue
            other = saved[level]
            diff = [k for k in base if k not in other or not np.array_equal(base[k], other[k])]
            report(not diff and len(other) == len(base),
                   f"[{level}] vs [scalar]: {len(base) - len(diff)}/{len(base)} outputs byte-identical (vector quant, "
                   f"mm dequant, blockwise, 4-bit, 8-bit optimizer state, weight-only quant)"
                   f"{'; differ: ' + ', '.join(diff[:6]) if diff else ''}")

    if args.only in (None, "bf16"):
        check_bf16(args, feats)

    print(f"\n{len(FAILURES)} failure(s); {time.perf_counter() - t_start:.0f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
