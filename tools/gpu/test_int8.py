"""LLM.int8() (csrc/cuda/int8.cu): vector quant and mm_dequant bit-exact with the CPU library, the int8 GEMM
exact through each path (default, BNB_MS_IGEMM=simt, BNB_MS_IGEMM=lt); malformed calls."""
from __future__ import annotations

import os

import torch

from common import (Aot, TDT, QUICK, FAILURES, fail, checked, stream_ptr, same_bits, mismatch, f32sc)


I8_DEQ = {"fp16": "cdequant_mm_int32_fp16", "fp32": "cdequant_mm_int32_fp32", "bf16": "cdequant_mm_int32_bf16"}


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


def test_int8_bit_exact(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_int8(cuda, cpu, QUICK), n0)


def test_int8_malformed_calls(cuda, cpu):
    n0 = len(FAILURES)
    checked(check_bad_calls_int8(cuda, cpu), n0)
