"""Worker of tests/test_nan_payloads.py: runs the entry points that store fp16/bf16 results from float32 NaNs
with payloads through ctypes (no MindSpore) at the SIMD level fixed by BNB_MS_SIMD, and saves what they wrote.

    python tests/_nan_payloads.py LIB.so OUT.npz"""
import sys
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from aot_ctypes import Aot  # noqa: E402

# float32 NaNs: quiet and signalling, both signs, payload bits in the top 10 (kept) and below (dropped)
NANS32 = np.array([0x7FC12345, 0xFFC0A000, 0x7F812345, 0x7FE00001, 0xFF800001, 0x7FFFFFFF, 0x7FC00000],
                  np.uint32)
# 16-bit NaN inputs (parameters): quiet and signalling, both signs
NANS16 = {"fp16": np.array([0x7E09, 0xFC05, 0x7C01, 0xFFFF, 0x7E00], np.uint16),
          "bf16": np.array([0x7FC5, 0xFF81, 0x7F81, 0xFFFF, 0x7FC0], np.uint16)}
NP = {"fp16": np.float16, "bf16": bfloat16}


def f64(v):
    return np.array(v, np.float64)


def main(lib_path, out_path):
    lib = Aot(lib_path)
    res = {}
    rng = np.random.default_rng(0)
    n = 8 * 256 + 13  # vector bodies and a scalar tail
    code8 = np.linspace(-1, 1, 256).astype(np.float32)
    code4 = np.linspace(-1, 1, 16).astype(np.float32)
    for sfx in ("fp16", "bf16"):
        # blockwise 8-bit dequantize (simd_convert.h stores): out = code[q] * absmax, absmax NaN in 7 of 9 blocks
        nb = -(-n // 256)
        absmax = np.ones(nb, np.float32)
        absmax[: len(NANS32)] = NANS32.view(np.float32)
        q = rng.integers(0, 256, n, dtype=np.uint8)
        out = np.zeros(n, NP[sfx])
        assert lib(f"cdequantize_blockwise_{sfx}", [code8, q, absmax, np.array(256, np.int64), out]) == 0
        res[f"dq8_{sfx}"] = out.view(np.uint16).copy()
        res[f"q8_{sfx}"] = q
        # 4-bit dequantize (fourbit.cpp's stores)
        q4 = rng.integers(0, 256, (n + 1) // 2, dtype=np.uint8)
        out = np.zeros(n, NP[sfx])
        assert lib(f"cdequantize_blockwise_{sfx}_nf4",
                   [code4, q4, absmax, np.array(256, np.int64), np.array(n, np.int64), out]) == 0
        res[f"dq4_{sfx}"] = out.view(np.uint16).copy()
        res[f"q4_{sfx}"] = q4
        # optimizers (optim.cpp's loads/stores): NaN parameters with payloads, finite gradients
        p0 = rng.standard_normal(n).astype(NP[sfx])
        idx = np.arange(len(NANS16[sfx])) * 300 + 3
        idx[-1] = n - 2  # one in the scalar tail
        p0.view(np.uint16)[idx] = NANS16[sfx]
        g = (rng.standard_normal(n) * 0.1).astype(NP[sfx])
        hp = [f64(0.9), f64(0.999), f64(0.9999), f64(5.0), f64(1e-8)]
        p = p0.copy()
        s1, s2 = np.zeros(n, np.float32), np.zeros(n, np.float32)
        assert lib(f"cadam32bit_grad_{sfx}", [g, p, s1, s2, None, f64(0), f64(0)] + hp +
                   [f64(0.01), np.array(1, np.int64), f64(0.05), f64(1.0), np.array(False), np.zeros(1, np.int32)]) == 0
        res[f"adam32_{sfx}"] = p.view(np.uint16).copy()
        p = p0.copy()
        s1, s2 = np.full(n, 128, np.uint8), np.zeros(n, np.uint8)
        a1, a2 = np.zeros(nb, np.float32), np.zeros(nb, np.float32)
        assert lib(f"cadam_8bit_blockwise_grad_{sfx}", [g, p, s1, s2, code8, (code8 + 1) / 2, a1, a2] + hp +
                   [np.array(1, np.int64), f64(0.05), f64(0.01), f64(1.0), np.array(False), np.zeros(1, np.int32)]) == 0
        res[f"adam8_{sfx}"] = p.view(np.uint16).copy()
        res[f"p0_{sfx}"] = p0.view(np.uint16).copy()
        res[f"idx_{sfx}"] = idx
    res["absmax"] = absmax
    res["code8"], res["code4"] = code8, code4
    np.savez(out_path, **res)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
