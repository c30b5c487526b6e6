"""Optimizers (csrc/cuda/optim.cu): every 32-bit and 8-bit blockwise entry point, in place, 3 steps with 2
hyper-parameter sets: p, states and absmax bit-exact with the CPU library; the LAMB/LARS (max_unorm) path within
2 ulps; malformed calls."""
from __future__ import annotations

import torch

from common import (Aot, TDT, QUICK, FAILURES, fail, checked, stream_ptr, same_bits, fsc, isc, ulps, dynamic_code,
                    unsigned_dynamic_code, statuses_match)


OPT32 = {"adam": ("cadam32bit_grad_fp32", "cadam32bit_grad_fp16", "cadam32bit_grad_bf16"),
         "ademamix": ("cademamix32bit_grad_fp32", "cademamix32bit_grad_fp16", "cademamix32bit_grad_bf16"),
         "lion": ("clion32bit_grad_fp32", "clion32bit_grad_fp16", "clion32bit_grad_bf16"),
         "momentum": ("cmomentum32bit_grad_32", "cmomentum32bit_grad_16", "cmomentum32bit_grad_bf16"),
         "rmsprop": ("crmsprop32bit_grad_32", "crmsprop32bit_grad_16", "crmsprop32bit_grad_bf16"),
         "adagrad": ("cadagrad32bit_grad_32", "cadagrad32bit_grad_16", "cadagrad32bit_grad_bf16")}
OPT8 = {o: tuple(f"c{o}_8bit_blockwise_grad_{s}" for s in ("fp32", "fp16", "bf16"))
        for o in ("adam", "ademamix", "momentum", "rmsprop", "lion", "adagrad")}
TWO = ("adam", "ademamix")
HP = [dict(b1=0.9, b2=0.999, b3=0.9999, alpha=5.0, eps=1e-8, wd=0.0, lr=1e-3, gnorm=1.0),
      dict(b1=0.8, b2=0.99, b3=0.999, alpha=2.0, eps=1e-6, wd=1e-2, lr=3e-3, gnorm=0.5)]


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


def bad_cases_optim(d: str, sc) -> dict:
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
    q8 = torch.zeros(300, dtype=torch.uint8, device=d)
    qm = torch.linspace(-1, 1, 256, device=d)
    a1 = torch.ones(2, device=d)
    hp8 = [f(0.9), f(0.999), f(0.0), f(0.0), f(1e-8), i(1), f(1e-3), f(0.0), f(1.0), torch.tensor(False, device=d)]
    a8 = "cadam_8bit_blockwise_grad_fp32"
    return {
        "adam32 nparam": (a32, base32),
        "adam32 state2 none": (a32, [g, p, s1, None, None, f(0.0), f(0.0)] + hp + [stt]),
        "adam32 p dtype": (a32, [g, p.half(), s1, s2, None, f(0.0), f(0.0)] + hp + [stt]),
        "adam32 state1 size": (a32, [g, p, s1[:299], s2, None, f(0.0), f(0.0)] + hp + [stt]),
        "adam32 step 0": (a32, [g, p, s1, s2, None, f(0.0), f(0.0)] + hp[:6] + [i(0)] + hp[7:] + [stt]),
        "adam32 status dtype": (a32, base32 + [stt.float()]),
        "adam8 nparam": (a8, [g, p, q8, q8.clone(), qm, qm, a1, a1.clone()] + hp8),
        "adam8 state dtype": (a8, [g, p, s1, q8.clone(), qm, qm, a1, a1.clone()] + hp8 + [stt]),
        "adam8 absmax size": (a8, [g, p, q8, q8.clone(), qm, qm, a1[:1], a1.clone()] + hp8 + [stt]),
        "adam8 qmap2 none": (a8, [g, p, q8, q8.clone(), qm, None, a1, a1.clone()] + hp8 + [stt]),
        "adam8 step 0": (a8, [g, p, q8, q8.clone(), qm, qm, a1, a1.clone()] + hp8[:5] + [i(0)] + hp8[6:] + [stt]),
    }


def test_optim_bit_exact(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_optim(cuda, cpu, QUICK), n0)


def test_optim_malformed_calls(cuda, cpu):
    n0 = len(FAILURES)
    ok, total = statuses_match(cuda, cpu, bad_cases_optim, "optimizers")
    checked([f"malformed calls (optimizers): {ok}/{total} return the CPU library's nonzero status; no CUDA error "
             f"after"], n0)
