"""Weight-only int8/int4 (csrc/cuda/weightonly.cu): quantize/dequantize bit-exact with the CPU library, the
GEMM bit-identical or within 2K*2^-24*sum|a q s| + 1 ulp; malformed calls."""
from __future__ import annotations

import torch

from common import (Aot, SDT, BITS, QUICK, FAILURES, fail, checked, stream_ptr, dscalar, hscalar, same_bits,
                    mismatch, misaligned)


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


def test_weightonly_exact(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_weightonly(cuda, cpu, QUICK), n0)


def test_weightonly_malformed_calls(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_bad_calls_wo(cuda, cpu), n0)
