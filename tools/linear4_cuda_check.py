"""clinear_4bit_* (the fused 4-bit linear forward) of the CUDA library against the CPU library, through ctypes
(numpy + torch for device memory; no MindSpore). One row: the CUDA gemv's order, so within gemv tolerance;
plain and double-quant absmax, bias, fp32/fp16/bf16, odd shapes; malformed calls get the CPU's statuses.

    python3 tools/linear4_cuda_check.py --cpu-lib build/cpu.so --cuda-lib build/cuda.so
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from aot_ctypes import Aot  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-lib", required=True)
    ap.add_argument("--cuda-lib", required=True)
    args = ap.parse_args()
    import torch

    cpu, cuda = Aot(args.cpu_lib), Aot(args.cuda_lib)
    st = torch.cuda.current_stream().cuda_stream
    TD = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    SFX = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
    rng = np.random.RandomState(3)
    nf4 = np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0], np.float32)
    code2 = np.sort(np.concatenate([np.linspace(-1, 1, 255), [0.0]]).astype(np.float32))
    fails = total = 0
    worst = 0.0
    tol = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
    for dt in TD:
        for (M, N, K, bs) in [(1, 64, 256, 64), (1, 333, 4096, 128), (3, 33, 100, 64), (1, 77, 518, 64),
                              (5, 576, 1536, 64), (1, 1536, 576, 64)]:
            for nested in (False, True):
                total += 1
                W = rng.randn(N * K).astype(np.float32)
                q = np.empty(((N * K + 1) // 2, 1), np.uint8)
                nb = -(-N * K // bs)
                am = np.empty(nb, np.float32)
                assert cpu("cquantize_blockwise_fp32_nf4", [nf4, W, np.array(bs), q, am]) == 0
                if nested:
                    off = np.float32(am.mean())
                    aq = np.empty(nb, np.uint8)
                    am2 = np.empty(-(-nb // 256), np.float32)
                    assert cpu("cquantize_blockwise_fp32", [code2, (am - off).astype(np.float32), np.array(256), aq, am2]) == 0
                    amx, extra = aq, [am2, code2, np.array(off, np.float32)]
                else:
                    amx, extra = am, [None, None, None]
                A = torch.randn(M, K, dtype=torch.float32).to(TD[dt])
                bias = torch.randn(N, dtype=torch.float32).to(TD[dt])
                out_c = torch.empty(M, N, dtype=TD[dt])
                rc_c = cpu(f"clinear_4bit_{SFX[dt]}", [A, q, amx, nf4] + extra + [bias, np.array(bs), np.array(256),
                                                                                   np.array(N), out_c])
                # the 0-d offset alternates between host and device memory (both are valid AOT scalars);
                # np.ascontiguousarray would make it 1-d
                dev = [x if x is None or (x.ndim == 0 and total % 2) else
                       torch.from_numpy(x.copy() if x.ndim == 0 else np.ascontiguousarray(x)).cuda()
                       for x in [q, amx, nf4] + extra]
                out_g = torch.full((M, N), 7, dtype=TD[dt], device="cuda")
                rc_g = cuda(f"clinear_4bit_{SFX[dt]}", [A.cuda()] + dev + [bias.cuda(), np.array(bs), np.array(256),
                                                                          np.array(N), out_g], st)
                torch.cuda.synchronize()
                r, g = out_c.float().numpy(), out_g.float().cpu().numpy()
                t = tol[dt]
                err = np.abs(g - r) / (t * (np.abs(r).max() + 1) + t * np.abs(r))
                worst = max(worst, float(err.max()))
                if rc_c or rc_g or err.max() > 1:
                    fails += 1
                    print(f"FAIL {dt} {M}x{N}x{K} bs={bs} nested={nested} rc={rc_c},{rc_g} err/tol {err.max():.3f}")
    print(f"{'PASS' if not fails else 'FAIL'} clinear_4bit CUDA vs CPU: {total - fails}/{total} within the gemv "
          f"tolerance; worst err/tol {worst:.3f}")
    # malformed calls: the CUDA library answers with the CPU library's status
    bad = 0
    A = torch.randn(1, 64)
    q = np.zeros((16 * 64 // 2, 1), np.uint8)
    am = np.ones(16, np.float32)
    for name, argl in [("short B", [A, q[:10], am, nf4, None, None, None, None, 64, 256, 16]),
                       ("bad bs", [A, q, am, nf4, None, None, None, None, 3, 256, 16]),
                       ("bias len", [A, q, am, nf4, None, None, None, torch.ones(5), 64, 256, 16])]:
        argl = [np.array(a) if isinstance(a, int) else a for a in argl]
        oc = torch.empty(1, 16)
        rc_c = cpu("clinear_4bit_fp32", argl + [oc])
        dargs = [a.cuda() if isinstance(a, torch.Tensor) else (torch.from_numpy(a).cuda() if isinstance(a, np.ndarray) and a.ndim else a) for a in argl]
        rc_g = cuda("clinear_4bit_fp32", dargs + [torch.empty(1, 16, device="cuda")], st)
        if rc_c == 0 or rc_c != rc_g:
            bad += 1
            print(f"FAIL malformed {name}: cpu {rc_c} cuda {rc_g}")
    print(f"{'PASS' if not bad else 'FAIL'} clinear_4bit malformed calls: CUDA status == CPU status != 0 (3 cases)")
    return 1 if fails or bad else 0


if __name__ == "__main__":
    sys.exit(main())
