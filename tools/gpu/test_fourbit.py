"""4-bit NF4/FP4 quantize/dequantize (csrc/cuda/fourbit.cu): CUDA vs the CPU library bit for bit (packed
bytes, absmax, dequantized values) over blocksizes 2..4096, partial blocks, NaN/inf/-0/subnormals; malformed
calls of the 4-bit and gemv entry points."""
from __future__ import annotations

import torch

from common import (Aot, TDT, QUICK, FAILURES, fail, checked, stream_ptr, dscalar, hscalar, same_bits, mismatch,
                    code4, make_input, statuses_match)


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


def bad_cases_fourbit(d: str, sc) -> dict:
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
    return {
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


def test_fourbit_bit_exact(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_fourbit(cuda, cpu, QUICK), n0)


def test_fourbit_malformed_calls(cuda, cpu):
    n0 = len(FAILURES)
    ok, total = statuses_match(cuda, cpu, bad_cases_fourbit, "4-bit, gemv")
    checked([f"malformed calls (4-bit quantize/dequantize, gemv): {ok}/{total} return the CPU library's nonzero "
             f"status; no CUDA error after"], n0)
