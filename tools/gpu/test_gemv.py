"""gemv_4bit (cgemm_4bit_inference_naive_*, csrc/cuda/fourbit.cu): CUDA within fp32 rounding of the CPU
library (the sums are taken in another order): |cuda - cpu| <= 1e-5 sum|w x| (+ 1 output ulp for fp16/bf16)."""
from __future__ import annotations

import torch

from common import (Aot, TDT, QUICK, FAILURES, fail, checked, stream_ptr, dscalar, hscalar, code4)
from test_fourbit import run_dq4, run_q4


def run_gemv(lib, A, B, absmax, code, bs, N, stream=None, mk=hscalar):
    sfx = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[A.dtype]
    out = torch.full(tuple(A.shape[:-1]) + (N,), float("nan"), dtype=A.dtype, device=A.device)
    rc = lib(f"cgemm_4bit_inference_naive_{sfx}", [A, B, absmax, code, mk(bs), mk(N), out], stream)
    return rc, out


def check_gemv(cuda: Aot, cpu: Aot, quick: bool) -> list[str]:
    rows = []
    st = stream_ptr()
    shapes = [(1, 11008, 4096, 64), (1, 4096, 11008, 64), (1, 333, 4096, 128), (1, 64, 100, 64), (1, 50, 96, 32),
              (3, 128, 256, 64), (1, 129, 512, 100), (2, 17, 34, 2), (1, 256, 1024, 4096),
              (2, 20, 16896, 256), (5, 9, 8192, 32)]
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


def test_gemv_within_tolerance(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_gemv(cuda, cpu, QUICK), n0)
