"""Blockwise 8-bit quantize/dequantize (csrc/cuda/blockwise.cu): CUDA vs the CPU library bit for bit, and
malformed calls (the CPU library's status, no CUDA error after)."""
from __future__ import annotations

import torch

from common import (Aot, TDT, SDT, QUICK, FAILURES, fail, checked, stream_ptr, dscalar, hscalar, same_bits,
                    mismatch, codes8, make_input)


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
    codes = codes8()
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


def check_bad_calls_blockwise(cuda: Aot, cpu: Aot) -> list[str]:
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


def test_blockwise_bit_exact(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_blockwise(cuda, cpu, QUICK), n0)


def test_blockwise_malformed_calls(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_bad_calls_blockwise(cuda, cpu), n0)
