"""The CPU library (the level this host picks, then BNB_MS_SIMD=avx2 and scalar) against the numpy reference
bitsandbytes_ms/_reference.py (loaded by path; no MindSpore): blockwise 8-bit quantize + dequantize bit-exact."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import torch

from common import (Aot, TDT, BITS, lib_paths, FAILURES, fail, checked, hscalar, load_reference, dynamic_code,
                    make_input)
from test_blockwise import run_dequant, run_quant


LEVELS = ("avx2", "scalar")  # besides the level the host picks; each in its own process (chosen at load)


def cpu_vs_reference(cpu: Aot) -> str:
    ref = load_reference()
    if ref is None:
        return "CPU vs numpy reference: _reference.py not available"
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


def test_cpu_library_vs_reference(cpu):
    n0 = len(FAILURES)
    checked([cpu_vs_reference(cpu)], n0)


def test_cpu_library_vs_reference_other_levels(cpu):
    n0 = len(FAILURES)
    lines = []
    for lvl in LEVELS:
        env = dict(os.environ, BNB_MS_SIMD=lvl)
        r = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True)
        line = (r.stdout.strip().splitlines() or ["(no output) " + r.stderr[-300:]])[-1]
        lines.append(f"BNB_MS_SIMD={lvl}: {line}")
        if r.returncode:
            fail(f"CPU reference check at BNB_MS_SIMD={lvl}: {line}")
    checked(lines, n0)


if __name__ == "__main__":  # one level, in this process (BNB_MS_SIMD chosen by the caller)
    print(cpu_vs_reference(Aot(lib_paths()[1])), flush=True)
    sys.exit(1 if FAILURES else 0)
