#!/usr/bin/env python3
"""Times the CUDA library against upstream bitsandbytes (when `import bitsandbytes` works), torch and a device
copy, runs the checks of tools/gpu/test_*.py first (tools/gpu/run_checks.py), and writes benchmarks/gpu.md: the
checks' summary lines, the issue-17 bars read off the timings, and one table per feature.

    python3 tools/gpu/bench.py [--cuda-lib SO] [--cpu-lib SO] [--out benchmarks/gpu.md] [--no-checks]

Times are CUDA-event medians with a busy queue (tools/gpu/common.time_gpu); GB/s counts bytes read + written.
Exit status 1 when a check failed.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (Aot, TDT, ROOT, FAILURES, fail, card, libs, upstream, stream_ptr, dscalar, hscalar, time_gpu, time_rot,  # noqa: E402
                    copy_bandwidth, dynamic_code, unsigned_dynamic_code, code4, fsc, isc, f32sc)
from test_optim import HP, OPT32, OPT8  # noqa: E402
from test_weightonly import WO_SFX, wo_rb, wo_unpack  # noqa: E402


def bench_blockwise(cuda: Aot, up) -> list[dict]:
    """Blockwise 8-bit quantize/dequantize of 8192x8192 fp16 and fp32, blocksizes 64/256/4096, against upstream
    and a copy_ of the input (same run)."""
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
        qdev(); torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            qdev()
        torch.cuda.synchronize()
        rows.append(dict(op="quantize (device scalar, wall)", dtype=sfx, bs=256, ours_us=(time.perf_counter() - t0) / 20 * 1e6,
                         up_us=float("nan"), speedup=float("nan"), gbs=float("nan"), pct=float("nan"), copy_gbs=copy_bw, note="host wall time per call incl. scalar sync"))
        del A, dst
    return rows


def bench_fourbit(cuda: Aot, up, copy_bw: float) -> list[dict]:
    """4-bit quantize/dequantize of 8192x8192 (two input sets rotated) against upstream; % of copy_bw."""
    nan = float("nan")
    rows = []
    st = stream_ptr()

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
    return rows


def bench_gemv(cuda: Aot, up, copy_bw: float) -> list[dict]:
    """gemv_4bit at batch 1 (weights rotated so they are not L2-resident) against upstream and torch's F.linear
    on the dequantized weight."""
    nan = float("nan")
    rows = []
    st = stream_ptr()

    def row(op, dtype, shape, t, tu, traffic, note=""):
        bw = traffic / t / 1e6
        rows.append(dict(op=op, dtype=dtype, bs=shape, ours_us=t * 1e3, up_us=tu * 1e3,
                         speedup=(tu / t) if tu == tu else nan, gbs=bw, pct=100 * bw / copy_bw, copy_gbs=copy_bw,
                         note=note))

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
            # torch's gemv on the same weight dequantized to the input dtype (what the 4-bit weight replaces)
            Wd = torch.empty(N * K, dtype=dt, device="cuda")
            cuda(f"cdequantize_blockwise_{sfx}_nf4", [code, q0, a0, hscalar(bs), hscalar(N * K), Wd], st)
            Wds = [Wd.view(N, K).clone() for _ in range(max(2, min(R, int(2**30 // (N * K * Wd.element_size())))))]
            del Wd
            t_torch = time_rot([lambda r=r: torch.nn.functional.linear(A, Wds[r]) for r in range(len(Wds))], 50)
            del Wds
            tu = nan
            note = (f"{R} weight copies rotated (not L2-resident); torch F.linear on the dequantized {sfx} weight: "
                    f"{t_torch * 1e3:.1f} us ({t_torch / t:.2f}x ours)")
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
            rows[-1]["torch_us"] = t_torch * 1e3
            del qs, ams, outs
    return rows


def bench_optim(cuda: Aot, up, copy_bw: float) -> list[dict]:
    """Adam with 32-bit and 8-bit blockwise state, 2^26 fp32/bf16 parameters, against upstream."""
    nan = float("nan")
    rows = []
    st = stream_ptr()

    def row(op, dtype, shape, t, tu, traffic, note=""):
        bw = traffic / t / 1e6
        rows.append(dict(op=op, dtype=dtype, bs=shape, ours_us=t * 1e3, up_us=tu * 1e3,
                         speedup=(tu / t) if tu == tu else nan, gbs=bw, pct=100 * bw / copy_bw, copy_gbs=copy_bw,
                         note=note))

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


def bench_int8(cuda: Aot, up, copy_bw: float):
    """int8 GEMM (cuBLASLt / SIMT), vector quant and mm_dequant against upstream's int8 ops."""
    rows = []
    st = stream_ptr()
    nan = float("nan")

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
    return rows


def bench_weightonly(cuda: Aot, copy_bw: float):
    """Weight-only int8/int4: quantize/dequantize vs a copy of W, the GEMM vs torch's fp16 matmul on the
    dequantized weight (no upstream op exists)."""
    st = stream_ptr()
    nan = float("nan")
    rows = []

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
    return rows


def fmt_table(rows) -> str:
    head = "| op | dtype | blocksize / shape | ours (us) | upstream (us) | speed-up | ours GB/s | % of copy BW | note |\n|---|---|---|---|---|---|---|---|---|\n"
    body = ""
    for r in rows:
        f = lambda v, p=1: "n/a" if v != v else f"{v:.{p}f}"
        body += (f"| {r['op']} | {r['dtype']} | {r['bs']} | {f(r['ours_us'])} | {f(r['up_us'])} | {f(r['speedup'], 2)}x | "
                 f"{f(r['gbs'], 0)} | {f(r['pct'])}% | {r['note']} |\n")
    return head + body


def fmt_table_int8(rows) -> str:
    head = ("| op | dtype | shape | ours (us) | upstream (us) | speed-up | ours TOP/s | upstream TOP/s | ours GB/s "
            "| % of copy BW | note |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    f = lambda v, p=1: "n/a" if v != v else f"{v:.{p}f}"
    body = ""
    for r in rows:
        body += (f"| {r['op']} | {r['dtype']} | {r['bs']} | {f(r['ours_us'])} | {f(r['up_us'])} | {f(r['speedup'], 2)}x | "
                 f"{f(r['tops'])} | {f(r['up_tops'])} | {f(r['gbs'], 0)} | {f(r['pct'])}% | {r['note']} |\n")
    return head + body


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


def bars(rows: list[dict]) -> list[str]:
    """Issue 17's H200 bars, read off this run's rows."""
    out = []

    def line(what, vals, ok):
        out.append(f"- {what}: {vals} -- {'met' if ok else 'NOT met'}")

    for sfx in ("fp16", "fp32"):
        q = [r for r in rows if r["op"] == "quantize" and r["dtype"] == sfx]
        if q:
            line(f"quantize_blockwise {sfx} >= 50% of copy bandwidth",
                 ", ".join(f"bs{r['bs']} {r['pct']:.1f}%" for r in q), all(r["pct"] >= 50 for r in q))
    q4 = [r for r in rows if r["op"].startswith("quantize_4bit")]
    if q4:
        line("quantize_4bit >= 70% of copy bandwidth", ", ".join(f"{r['op'][14:]} {r['dtype']} {r['pct']:.1f}%" for r in q4),
             all(r["pct"] >= 70 for r in q4))
    gv = [r for r in rows if r["op"].startswith("gemv_4bit")]
    if gv:
        line("gemv_4bit (batch 1) >= 70% of copy bandwidth",
             ", ".join(f"{r['dtype']} {r['bs'].split(' bs')[0]} {r['pct']:.1f}%" for r in gv), all(r["pct"] >= 70 for r in gv))
        line("gemv_4bit (batch 1) faster than torch F.linear on the dequantized weight",
             ", ".join(f"{r['dtype']} {r['bs'].split(' bs')[0]} {r['ours_us']:.1f} vs {r['torch_us']:.1f} us" for r in gv),
             all(r["ours_us"] < r["torch_us"] for r in gv))
    a8 = [r for r in rows if r["op"] == "adam 8-bit blockwise state"]
    if a8:
        line("8-bit Adam >= 3x upstream 0.50.2", ", ".join(f"{r['dtype']} {r['speedup']:.2f}x" for r in a8),
             all(r["speedup"] >= 3 for r in a8))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda-lib")
    ap.add_argument("--cpu-lib")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "gpu.md"))
    ap.add_argument("--no-checks", action="store_true", help="timings only (the Checks section says so)")
    ap.add_argument("--quick", action="store_true", help="the checks' smaller sizes (BNB_MS_GPU_QUICK=1)")
    a = ap.parse_args()
    if a.cuda_lib:
        os.environ["BNB_MS_CUDA_LIB"] = a.cuda_lib
    if a.cpu_lib:
        os.environ["BNB_MS_CPU_LIB"] = a.cpu_lib
    if a.quick:
        os.environ["BNB_MS_GPU_QUICK"] = "1"
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    checks, failed = [], 0
    if not a.no_checks:
        from run_checks import run_all

        checks, failed = run_all()
    cuda, _ = libs()
    up, _, up_name = upstream()
    print(up_name, flush=True)
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth (1 GiB copy_): {copy_bw:.0f} GB/s", flush=True)
    sections = []
    rows = bench_blockwise(cuda, up)
    for fn in (bench_fourbit, bench_gemv, bench_optim):
        rows += fn(cuda, up, copy_bw)
    t_main = fmt_table(rows)
    print(t_main, flush=True)
    t_int8 = fmt_table_int8(bench_int8(cuda, up, copy_bw))
    print(t_int8, flush=True)
    t_wo = fmt_table_wo(bench_weightonly(cuda, copy_bw))
    print(t_wo, flush=True)
    cpuinfo = platform.processor() or ""
    try:
        cpuinfo = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    bar_lines = bars(rows)
    for ln in bar_lines:
        print(ln, flush=True)
    if a.no_checks:
        check_md = "- not run (`--no-checks`)\n"
    else:
        check_md = ""
        for feat, name, lines in checks:
            check_md += "".join(f"- {ln}\n" for ln in lines) or f"- {feat}::{name}: ok\n"
        check_md += (f"- FAILED tests: {failed}\n" if failed else f"- all {len(checks)} check functions passed\n")
    sections.append("## Bars (issue 17)\n\n" + "\n".join(bar_lines) + "\n")
    sections.append(f"## Checks (tools/gpu/run_checks.py)\n\n{check_md}")
    sections.append("## Timings: blockwise 8-bit, 4-bit, gemv_4bit, optimizers\n\n"
                    "Sizes 8192x8192 (blockwise, 4-bit) and 2^26 parameters (optimizers); copy = torch copy_ of the "
                    "input, same run (blockwise rows) or of a 1 GiB buffer (other rows); gemv rotates up to 16 weight "
                    f"copies so they are not L2-resident.\n\n{t_main}")
    sections.append("## Timings: int8 (LLM.int8())\n\nBaseline: upstream's CUDA ops `int8_linear_matmul`, "
                    "`int8_vectorwise_quant`, `int8_mm_dequant`; TOP/s = 2*M*N*K / time.\n\n" + t_int8)
    sections.append("## Timings: weight-only int8/int4 (W8A16/W4A16)\n\nNo upstream op exists; baselines: a device "
                    "copy of W (quantize/dequantize) and torch's fp16 matmul on the dequantized weight (GEMM); GEMM "
                    "rows rotate 8 weight copies (4 for torch's fp16 weights).\n\n" + t_wo)
    md = (f"# CUDA library: checks and timings\n\n"
          f"- date: {started} (written by `tools/gpu/bench.py`)\n- card: {card()}\n- host CPU: {cpuinfo}\n"
          f"- baseline: {up_name} (torch.ops.bitsandbytes, its CUDA kernels)\n"
          f"- copy bandwidth (1 GiB copy_): {copy_bw:.0f} GB/s\n\n" + "\n".join(sections))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(md)
    print(f"wrote {a.out}; failed checks: {failed}; failures during the timings: {len(FAILURES)}")
    return 1 if failed or FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
