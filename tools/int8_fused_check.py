#!/usr/bin/env python3
"""Checks of the fused LLM.int8() linear forward without MindSpore (numpy + ctypes; torch only for CUDA).

    python3 tools/int8_fused_check.py [--cpu-lib PATH] [--cuda-lib PATH] [--bench]

* CPU: for every int8 GEMM path (``BNB_MS_INT8_GEMM``) and SIMD level (``BNB_MS_SIMD``) a subprocess runs
  ``cint8_linear_<dtype>`` and the unfused composition of native ops the Python path makes (the fp16 cast
  of fp32 activations, ``cint8_vector_quant``, ``cigemmlt_32``, ``cdequant_mm_int32_*`` or, with flagged
  columns, ``cint8_mixed_mm_dequant_*``) on the cases of :func:`make_cases`; fused == unfused bit for bit,
  and both equal the numpy reference (``bitsandbytes_ms/_reference.py``, loaded by path). A path the CPU
  lacks is reported as skipped, never tested on another path.
* CUDA (``--cuda-lib``, torch with a GPU): the same entry points of the CUDA library against the CPU
  library's bytes on the same cases (default GEMM path and ``BNB_MS_IGEMM=simt``), malformed calls give the
  CPU library's status, and (``--bench``) CUDA-event times of the fused call against the unfused
  composition at 4096 -> 11008.

tests/test_int8_fused.py runs the CPU part through :func:`make_cases`, :func:`run_cpu_paths` and
:func:`reference`. Exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))
from aot_ctypes import Aot  # noqa: E402

try:
    from ml_dtypes import bfloat16
except ImportError:  # pragma: no cover
    bfloat16 = None

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": bfloat16}
SFX = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
GEMM_PATHS = ("scalar", "avx2", "avx512", "avxvnni", "avx512vnni", "amx")
ISA = {"scalar": "nothing", "avx2": "AVX2", "avx512": "AVX-512 (F/BW/VL/DQ)", "avxvnni": "AVX-VNNI",
       "avx512vnni": "AVX-512 VNNI", "amx": "AMX-INT8 (or the OS did not grant the AMX tile state)"}
# (GEMM path, SIMD level): each GEMM path at the default level, the scalar GEMM under the AVX2 float kernels,
# and the automatic choice at each level
RUNS = [(p, None) for p in GEMM_PATHS] + [("scalar", "avx2"), (None, "scalar"), (None, "avx2"), (None, None)]


def load_reference():
    """bitsandbytes_ms/_reference.py as a standalone module (no MindSpore import)."""
    spec = importlib.util.spec_from_file_location("bnb_ms_reference", ROOT / "bitsandbytes_ms" / "_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def bits(a):
    a = np.asarray(a)
    return a.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.dtype.itemsize])


# ---------------------------------------------------------------------------------------------
# cases: A values, CB/SCB (quantized from a random weight), bias, threshold
# ---------------------------------------------------------------------------------------------
def weight(N, K, rng, R):
    W = (rng.standard_normal((N, K)) * 0.05).astype(np.float32)
    if N > 2:
        W[1] = 0.0  # a zero row: SCB 0
    CB, SCB, _ = R.int8_vector_quant(W.astype(np.float16).astype(np.float32), 0.0, "float16")
    return CB, SCB


def activations(lead, K, dtype, rng, plant):
    x = rng.standard_normal(tuple(lead) + (K,)).astype(np.float32)
    a = x.reshape(-1, K)
    if plant and K > 8:
        a[:, 7] = 20.0 * np.sign(a[:, 7] + 0.5)  # an outlier column in every row
        a[0, K // 2] = -9.0                       # an outlier in one row only
        a[-1, K - 1] = 6.0                        # exactly the threshold counts
        if dtype == "float32" and a.shape[0] > 1:
            a[1, 3] = 7.0e4  # beyond fp16: inf after the cast; an outlier at threshold 6; at threshold 0 the row's
            # absmax is inf, its codes 0 and its outputs NaN (0 * inf), as upstream
    if a.shape[0] > 2:
        a[2] = 0.0                                # an all-zero row
    if a.shape[0] > 3:
        a[3, K // 3] = np.nan                     # a NaN: the row's absmax NaN (torch.max), its outputs NaN
    if K > 5:
        a[0, 5] = -0.0
        a[0, 4] = 3e-6                            # fp16 subnormal after the cast
    return x.astype(NP[dtype])


SHAPES = [((1,), 100, 37), ((3,), 100, 37), ((16,), 100, 37), ((2, 3), 129, 50), ((1,), 1, 3), ((3,), 15, 8),
          ((16,), 33, 17), ((1,), 63, 64), ((3,), 65, 1), ((5,), 200, 130), ((16,), 576, 96), ((17,), 1000, 19)]


def make_cases(R=None):
    """216 cases: 12 shapes (1/3/5/16/17 rows, 3-D, K = 1..1000 incl. non-multiples of 16/32/64) x fp32/fp16/bf16
    x threshold 0/6 x bias none / same dtype / another dtype."""
    R = R or load_reference()
    rng = np.random.RandomState(2024)
    cases = {}
    i = 0
    for lead, K, N in SHAPES:
        CB, SCB = weight(N, K, rng, R)
        for dt in ("float32", "float16", "bfloat16"):
            for thr in (0.0, 6.0):
                for bias_kind in ("none", "same", "other"):
                    A = activations(lead, K, dt, rng, plant=thr > 0 or i % 2 == 0)
                    b = (rng.standard_normal(N) * 0.5).astype(np.float32)
                    bias = None if bias_kind == "none" else b.astype(
                        NP[dt] if bias_kind == "same" else (np.float32 if dt != "float32" else np.float16))
                    cases[f"c{i:03d}"] = dict(A=A, CB=CB, SCB=SCB, bias=bias, thr=np.float32(thr), dtype=dt)
                    i += 1
    return cases


def save_cases(cases, path):
    flat = {}
    for key, c in cases.items():
        for name, v in c.items():
            if v is None:
                continue
            v = np.asarray(v)
            if bfloat16 is not None and v.dtype == bfloat16:  # npz keeps the bits; the dtype travels in the name
                flat[f"{key}/{name}__bf16"] = v.view(np.uint16)
            else:
                flat[f"{key}/{name}"] = v
    np.savez(path, **flat)


def load_cases(path):
    raw = np.load(path)
    cases = {}
    for name in raw.files:
        key, field = name.split("/")
        v = raw[name]
        if field.endswith("__bf16"):
            field, v = field[:-6], v.view(bfloat16)
        cases.setdefault(key, {"bias": None})[field] = v
    for c in cases.values():
        c["dtype"] = str(c["dtype"])
    return cases


def reference(c, R):
    """(output bits, flags) of the numpy reference for one case."""
    dt = c["dtype"]
    bias = None if c["bias"] is None else np.asarray(c["bias"]).astype(np.float32)
    with np.errstate(all="ignore"):  # fp32 beyond fp16 overflows on the cast (as in the kernels)
        out, flags = R.int8_linear(np.asarray(c["A"]).astype(np.float32), c["CB"], c["SCB"], bias, float(c["thr"]), dt)
    return bits(out.astype(NP[dt])), flags


# ---------------------------------------------------------------------------------------------
# one library, all cases: fused vs the unfused composition
# ---------------------------------------------------------------------------------------------
def run_cases(lib: Aot, cases):
    """Returns ({key/out: output bits, key/flags: flags}, failures) for the fused entry point, checking it
    against the unfused composition of native ops on the same library."""
    res, fails = {}, []

    def call(name, args):
        rc = lib(name, args)
        if rc != 0:
            raise RuntimeError(f"{name} returned status {rc}")

    for key in sorted(cases):
        c = cases[key]
        A, CB, SCB, bias, thr, dt = c["A"], c["CB"], c["SCB"], c["bias"], np.float32(c["thr"]), c["dtype"]
        K, N = A.shape[-1], CB.shape[0]
        rows = int(np.prod(A.shape[:-1]))
        sfx = SFX[dt]
        out = np.full(A.shape[:-1] + (N,), 7, A.dtype)
        flags = np.full(K, 9, np.uint8)
        call("cint8_linear_" + sfx, [A, CB, SCB, bias, np.array(thr, np.float32), out, flags])
        with np.errstate(over="ignore"):
            q_in = A.astype(np.float16) if dt == "float32" else A  # = MindSpore's cast (round to nearest even)
        CA, SCA, fl = np.empty(A.shape, np.int8), np.empty(rows, np.float32), np.empty(K, np.uint8)
        call("cint8_vector_quant", [q_in, np.array(thr, np.float32), CA, SCA, fl])
        C = np.empty(A.shape[:-1] + (N,), np.int32)
        call("cigemmlt_32", [CA, CB, C])
        ref = np.empty_like(out)
        if thr > 0 and fl.any():
            call("cint8_mixed_mm_dequant_" + sfx, [C, SCA, SCB, bias, A, CB, fl, ref])
        else:
            call("cdequant_mm_int32_" + sfx, [C, SCA, SCB, bias, ref])
        if thr > 0:  # the mixed op without flagged columns is the plain mm dequant
            z1, z2 = np.empty_like(out), np.empty_like(out)
            call("cint8_mixed_mm_dequant_" + sfx, [C, SCA, SCB, bias, A, CB, np.zeros(K, np.uint8), z1])
            call("cdequant_mm_int32_" + sfx, [C, SCA, SCB, bias, z2])
            if z1.tobytes() != z2.tobytes():
                fails.append(f"{key}: mixed op with no flags != cdequant_mm_int32")
        if out.tobytes() != ref.tobytes() or flags.tobytes() != fl.tobytes():
            fails.append(f"{key}: fused != unfused ({dt}, thr={float(thr)}, A{A.shape}, N={N}, "
                         f"{int((out.view(np.uint8) != ref.view(np.uint8)).sum())} bytes differ)")
        res[key + "/out"] = bits(out)
        res[key + "/flags"] = flags
    return res, fails


def worker(lib_path, want, cases_path, out_path):
    """Subprocess body: the library under this process's BNB_MS_* environment."""
    lib = Aot(lib_path)
    info = {"path": lib.int8_gemm_path(), "path_m1": lib.int8_gemm_path(1), "simd": lib.simd_level()}
    if want == "auto" or info["path"] == want:
        cases = load_cases(cases_path)
        res, fails = run_cases(lib, cases)
        np.savez(out_path, **res)
        info.update(cases=len(cases), fails=fails[:10], nfail=len(fails))
    print(json.dumps(info))


def run_cpu_paths(lib_path, cases, tmpdir, runs=RUNS):
    """{(gemm, simd): (info, outputs or None)} with one subprocess per run."""
    tmpdir = Path(tmpdir)
    save_cases(cases, tmpdir / "cases.npz")
    out = {}
    for gemm, simd in runs:
        res = tmpdir / f"{gemm}_{simd}.npz"
        env = {k: v for k, v in os.environ.items() if k not in ("BNB_MS_SIMD", "BNB_MS_INT8_GEMM")}
        env.update({k: v for k, v in (("BNB_MS_INT8_GEMM", gemm), ("BNB_MS_SIMD", simd)) if v is not None})
        r = subprocess.run([sys.executable, __file__, "--worker", str(lib_path), gemm or "auto",
                            str(tmpdir / "cases.npz"), str(res)], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"worker {gemm}/{simd} failed:\n{r.stderr[-3000:]}")
        info = json.loads(r.stdout.strip().splitlines()[-1])
        out[(gemm, simd)] = (info, dict(np.load(res)) if res.exists() else None)
    return out


def skip_reason(info, gemm, simd):
    if gemm is not None and info["path"] != gemm:
        return f"CPU lacks {ISA[gemm]} (the library used {info['path']})"
    if simd is not None and info["simd"] != simd:
        return f"CPU lacks the {simd} level (ran at {info['simd']})"
    return None


def check_cpu(lib_path, R):
    """Summary lines and failures of the CPU part."""
    cases = make_cases(R)
    refs = {k: reference(c, R) for k, c in cases.items()}
    lines, fails = [], []
    with tempfile.TemporaryDirectory() as d:
        runs = run_cpu_paths(lib_path, cases, d)
    for (gemm, simd), (info, got) in runs.items():
        name = f"GEMM {gemm or 'auto'} / SIMD {simd or 'default'}"
        why = skip_reason(info, gemm, simd)
        if why:
            lines.append(f"{name}: skipped ({why})")
            continue
        bad = list(info["fails"])
        for k, (ref, fl) in refs.items():
            if not (np.array_equal(got[k + "/out"], ref) and np.array_equal(got[k + "/flags"], fl)):
                bad.append(f"{k}: != reference")
        fails += [f"{name}: {b}" for b in bad]
        lines.append(f"{name} (path {info['path']}, level {info['simd']}): {len(cases) - len(bad)}/{len(cases)} cases "
                     f"fused == unfused == reference")
    return lines, fails


# ---------------------------------------------------------------------------------------------
# CUDA
# ---------------------------------------------------------------------------------------------
def check_cuda(cuda_lib, cpu_lib, R, bench=False):
    import torch

    cuda, cpu = Aot(cuda_lib), Aot(cpu_lib)
    st = torch.cuda.current_stream().cuda_stream
    cases = make_cases(R)
    lines, fails = [], []
    TD = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

    def dev(a):
        if a is None:
            return None
        a = np.asarray(a)
        if bfloat16 is not None and a.dtype == bfloat16:
            return torch.from_numpy(a.view(np.uint16).copy()).view(torch.bfloat16).cuda()
        return torch.from_numpy(np.ascontiguousarray(a)).cuda()

    def host_bits(t):
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16)
        return bits(t.numpy())

    cpu_res, cpu_fails = run_cases(cpu, cases)
    fails += [f"CPU: {f}" for f in cpu_fails]
    for mode in ("", "simt"):
        os.environ["BNB_MS_IGEMM"] = mode
        ok = 0
        for key, c in cases.items():
            A, CB, SCB, bias, thr, dt = c["A"], c["CB"], c["SCB"], c["bias"], float(c["thr"]), c["dtype"]
            K, N = A.shape[-1], CB.shape[0]
            Ag, CBg, SCBg, bg = dev(A), dev(CB), dev(SCB), dev(bias)
            out = torch.full(tuple(A.shape[:-1]) + (N,), 7, dtype=TD[dt], device="cuda")
            fl = torch.full((K,), 9, dtype=torch.uint8, device="cuda")
            thr_t = torch.tensor(thr, dtype=torch.float32, device="cuda" if ok % 2 else "cpu")
            rc = cuda("cint8_linear_" + SFX[dt], [Ag, CBg, SCBg, bg, thr_t, out, fl], st)
            torch.cuda.synchronize()
            good = rc == 0 and np.array_equal(host_bits(out), cpu_res[key + "/out"]) and \
                np.array_equal(fl.cpu().numpy(), cpu_res[key + "/flags"])
            if good and thr > 0 and cpu_res[key + "/flags"].any():  # the mixed op alone, from the CPU's C/SCA
                rows = int(np.prod(A.shape[:-1]))
                with np.errstate(over="ignore"):
                    q_in = A.astype(np.float16) if dt == "float32" else A
                CA, SCA, f2 = np.empty(A.shape, np.int8), np.empty(rows, np.float32), np.empty(K, np.uint8)
                cpu("cint8_vector_quant", [q_in, np.array(thr, np.float32), CA, SCA, f2])
                C = np.empty(A.shape[:-1] + (N,), np.int32)
                cpu("cigemmlt_32", [CA, CB, C])
                o2 = torch.full_like(out, 7)
                rc = cuda("cint8_mixed_mm_dequant_" + SFX[dt], [dev(C), dev(SCA), SCBg, bg, Ag, CBg, dev(f2), o2], st)
                torch.cuda.synchronize()
                good = rc == 0 and np.array_equal(host_bits(o2), cpu_res[key + "/out"])
            if good:
                ok += 1
            else:
                fails.append(f"CUDA[{mode or 'default'}] {key} ({dt}, thr={thr}, A{A.shape}, N={N}): status {rc} or bytes differ")
        lines.append(f"CUDA cint8_linear_* / cint8_mixed_mm_dequant_* (GEMM {mode or 'default'}): {ok}/{len(cases)} "
                     f"cases bit-exact vs the CPU library")
    os.environ.pop("BNB_MS_IGEMM", None)
    lines += check_bad_calls(cuda, cpu, st, torch, fails)
    if bench:
        lines += bench_cuda(cuda, st, torch)
    return lines, fails


def check_bad_calls(cuda, cpu, st, torch, fails):
    results = {}
    for d, lib in (("cuda", cuda), ("cpu", cpu)):
        A = torch.randn(3, 64, device=d)
        CB = torch.zeros(16, 64, dtype=torch.int8, device=d)
        SCB = torch.ones(16, device=d)
        out = torch.empty(3, 16, device=d)
        fl = torch.empty(64, dtype=torch.uint8, device=d)
        C = torch.zeros(3, 16, dtype=torch.int32, device=d)
        rs = torch.ones(3, device=d)
        T = lambda v: torch.tensor(float(v), dtype=torch.float32, device=d)  # noqa: E731
        lin, mix = "cint8_linear_fp32", "cint8_mixed_mm_dequant_fp32"
        cases = {
            "lin nparam": (lin, [A, CB, SCB, None, T(6), out]),
            "lin A dtype": (lin, [A.half(), CB, SCB, None, T(6), out, fl]),
            "lin CB dtype": (lin, [A, CB.to(torch.uint8), SCB, None, T(6), out, fl]),
            "lin bias dtype": (lin, [A, CB, SCB, torch.zeros(16, dtype=torch.int32, device=d), T(6), out, fl]),
            "lin K mismatch": (lin, [A, CB[:, :63].contiguous(), SCB, None, T(6), out, fl]),
            "lin SCB size": (lin, [A, CB, SCB[:15], None, T(6), out, fl]),
            "lin out shape": (lin, [A, CB, SCB, None, T(6), out[:, :15], fl]),
            "lin flags size": (lin, [A, CB, SCB, None, T(6), out, fl[:63]]),
            "lin threshold <0": (lin, [A, CB, SCB, None, T(-1), out, fl]),
            "lin threshold not 0-d": (lin, [A, CB, SCB, None, torch.zeros(1, device=d), out, fl]),
            "lin null A": (lin, [(None, (3, 64), "float32"), CB, SCB, None, T(6), out, fl]),
            "mix nparam": (mix, [C, rs, SCB, None, A, CB, fl]),
            "mix A dtype": (mix, [C, rs, SCB, None, A.half(), CB, fl, out]),
            "mix flags dtype": (mix, [C, rs, SCB, None, A, CB, fl.to(torch.int8), out]),
            "mix A rows": (mix, [C, rs, SCB, None, A[:2], CB, fl, out]),
            "mix CB shape": (mix, [C, rs, SCB, None, A, CB[:15], fl, out]),
            "mix null out": (mix, [C, rs, SCB, None, A, CB, fl, (None, (3, 16), "float32")]),
        }
        for k, (nm, args) in cases.items():
            results.setdefault(k, {})[d] = lib(nm, args, st if d == "cuda" else None)
    torch.cuda.synchronize()
    n_ok = 0
    for k, r in results.items():
        if r["cuda"] != 0 and r["cuda"] == r["cpu"]:
            n_ok += 1
        else:
            fails.append(f"malformed call '{k}': cuda={r['cuda']} cpu={r['cpu']}")
    return [f"CUDA malformed fused/mixed calls: {n_ok}/{len(results)} return the CPU library's nonzero status"]


def bench_cuda(cuda, st, torch, reps=50):
    lines = []
    K, N = 4096, 11008
    g = torch.Generator().manual_seed(0)
    CB = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8).cuda()
    SCB = (torch.rand(N, generator=g) + 0.5).cuda()
    bias = torch.randn(N, generator=g).half().cuda()
    for M in (1, 16):
        for thr in (0.0, 6.0):
            A = torch.randn(M, K, generator=g).half()
            A[:, 7] = 20.0
            A = A.cuda()
            out = torch.empty(M, N, dtype=torch.float16, device="cuda")
            fl = torch.empty(K, dtype=torch.uint8, device="cuda")
            thr_t = torch.tensor(thr, dtype=torch.float32)
            fused = cuda.prepare("cint8_linear_fp16", [A, CB, SCB, bias, thr_t, out, fl], st)
            CA = torch.empty(M, K, dtype=torch.int8, device="cuda")
            SCA = torch.empty(M, device="cuda")
            C = torch.empty(M, N, dtype=torch.int32, device="cuda")
            o2 = torch.empty_like(out)
            steps = [cuda.prepare("cint8_vector_quant", [A, thr_t, CA, SCA, fl], st),
                     cuda.prepare("cigemmlt_32", [CA, CB, C], st),
                     cuda.prepare("cint8_mixed_mm_dequant_fp16" if thr else "cdequant_mm_int32_fp16",
                                  [C, SCA, SCB, bias, A, CB, fl, o2] if thr else [C, SCA, SCB, bias, o2], st)]

            def unfused():
                for s in steps:
                    s()

            ts = {}
            for name, fn in (("fused", fused), ("unfused", unfused)):
                for _ in range(5):
                    fn()
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(reps):
                    fn()
                e1.record()
                torch.cuda.synchronize()
                ts[name] = e0.elapsed_time(e1) / reps * 1e3
            same = torch.equal(out.view(torch.int16), o2.view(torch.int16))
            lines.append(f"CUDA fp16 {M}x{K} -> {N}, threshold {thr:g}: fused {ts['fused']:.1f} us, unfused composition "
                         f"{ts['unfused']:.1f} us (same bytes: {same})")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-lib", default=str(ROOT / "bitsandbytes_ms" / "libbitsandbytes_ms_cpu.so"))
    ap.add_argument("--cuda-lib", default=None)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--worker", nargs=4, metavar=("LIB", "PATH", "CASES", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(*a.worker)
        return 0
    R = load_reference()
    lines, fails = check_cpu(a.cpu_lib, R)
    if a.cuda_lib:
        l2, f2 = check_cuda(a.cuda_lib, a.cpu_lib, R, a.bench)
        lines += l2
        fails += f2
    for ln in lines:
        print(ln, flush=True)
    for f in fails[:40]:
        print("FAIL:", f)
    print(f"int8_fused_check: {len(fails)} failures")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
