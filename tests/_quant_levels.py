"""Subprocess helper of tests/test_quant_levels.py: runs the blockwise 8-bit / 4-bit quantize and dequantize
entry points and the 8-bit blockwise optimizer updates through ctypes (no MindSpore) on the cases in argv[2]
(npz) at the SIMD level the environment selects (BNB_MS_SIMD) and writes every output to argv[3]."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from aot_ctypes import Aot, Typed, scalar  # noqa: E402

SFX = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
OPT_HP = {"adam": (0.9, 0.999, 0.0, 0.0, 1e-8, 1e-3), "momentum": (0.9, 0.0, 0.0, 0.0, 1e-8, 1e-2),
          "rmsprop": (0.99, 0.0, 0.0, 0.0, 1e-8, 1e-2), "lion": (0.9, 0.99, 0.0, 0.0, 1e-8, 1e-4),
          "adagrad": (0.0, 0.0, 0.0, 0.0, 1e-10, 1e-2), "ademamix": (0.9, 0.999, 0.9999, 5.0, 1e-8, 1e-3)}


def arg(bits: np.ndarray, dtype: str):
    """An input held as its bit pattern (uint32 for float32, uint16 for the 16-bit types)."""
    return bits.view(np.float32) if dtype == "float32" else Typed(bits, dtype)


def run_case(lib, key, c, res):
    kind, dtype = str(c["kind"]), str(c["dtype"])
    bs = int(c["bs"])
    if kind == "q8":
        x, code = c["x"], c["code"]
        n = x.size
        q, am = np.empty(n, np.uint8), np.empty(-(-n // bs), np.float32)
        assert lib(f"cquantize_blockwise_{SFX[dtype]}", [code, arg(x, dtype), scalar(bs), q, am]) == 0, key
        res[key + "/q"], res[key + "/absmax"] = q, am.view(np.uint32)
    elif kind == "dq8":
        q, code, am = c["q"], c["code"], c["absmax"]
        out = np.empty(q.size, np.float32 if dtype == "float32" else np.uint16)
        assert lib(f"cdequantize_blockwise_{SFX[dtype]}", [code, q, am, scalar(bs), arg(out, dtype)]) == 0, key
        res[key + "/out"] = out.view(np.uint32) if dtype == "float32" else out
    elif kind == "q4":
        x, code = c["x"], c["code"]
        n = x.size
        q, am = np.empty(((n + 1) // 2, 1), np.uint8), np.empty(-(-n // bs), np.float32)
        assert lib(f"cquantize_blockwise_{SFX[dtype]}_nf4", [code, arg(x, dtype), scalar(bs), q, am]) == 0, key
        res[key + "/q"], res[key + "/absmax"] = q, am.view(np.uint32)
    elif kind == "opt":
        opt, wd = str(c["opt"]), float(c["wd"])
        b1, b2, b3, al, eps, lr = OPT_HP[opt]
        p = c["p"].copy()
        n = p.size
        nb, mult, two = -(-n // 256), 2 if opt == "ademamix" else 1, opt in ("adam", "ademamix")
        s1, a1 = np.zeros(mult * n, np.uint8), np.zeros(mult * nb, np.float32)
        s2, a2 = (np.zeros(n, np.uint8), np.zeros(nb, np.float32)) if two else (None, None)
        f64 = lambda v: scalar(v, np.float64)  # noqa: E731
        for step, g in enumerate(c["g"], 1):
            st = np.zeros(1, np.int32)
            rc = lib(f"c{opt}_8bit_blockwise_grad_{SFX[dtype]}",
                     [arg(g, dtype), arg(p, dtype), s1, s2, c["code1"], c["code2"] if two else None, a1, a2,
                      f64(b1), f64(b2), f64(b3), f64(al), f64(eps), scalar(step), f64(lr), f64(wd), f64(1.0),
                      scalar(False), st])
            assert rc == 0, (key, step)
            res[f"{key}/{step}"] = np.concatenate([p.view(np.uint8), s1, a1.view(np.uint8)]
                                                  + ([s2, a2.view(np.uint8)] if two else []))
    else:
        raise ValueError(kind)


def main(lib_path, cases_path, out_path):
    lib = Aot(lib_path)
    cases = np.load(cases_path)
    grouped = {}
    for f in cases.files:
        key, field = f.rsplit("/", 1)
        grouped.setdefault(key, {})[field] = cases[f]
    res = {}
    for key in sorted(grouped):
        run_case(lib, key, grouped[key], res)
    res["_level"] = np.array(lib.dll.bnb_ms_simd_level())
    np.savez(out_path, **res)


if __name__ == "__main__":
    main(*sys.argv[1:4])
