"""Subprocess helper of tests/test_linear_fp.py: runs cgemm_fp_* through ctypes (no MindSpore) on the cases in
argv[1] (npz) at the SIMD level the environment selects (BNB_MS_SIMD) and writes the outputs to argv[2]."""

import sys
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from aot_ctypes import Aot  # noqa: E402

NP = {"fp32": np.float32, "fp16": np.float16, "bf16": bfloat16}


def main(lib_path, cases_path, out_path):
    lib = Aot(lib_path)
    cases = np.load(cases_path)
    keys = sorted({k.rsplit("/", 1)[0] for k in cases.files})
    res = {}
    for key in keys:
        sfx = key.split(":")[0]
        dt = NP[sfx]
        A = np.ascontiguousarray(cases[key + "/A"].astype(dt))
        W = np.ascontiguousarray(cases[key + "/W"].astype(dt))
        bias = cases[key + "/bias"] if key + "/bias" in cases.files else None
        if bias is not None:
            bias = np.ascontiguousarray(bias.astype(NP[str(cases[key + "/bias_dt"])]))
        out = np.empty(A.shape[:-1] + (W.shape[0],), dt)
        rc = lib(f"cgemm_fp_{sfx}", [A, W, bias, out])
        assert rc == 0, (key, rc)
        res[key] = out.view(np.uint16 if dt != np.float32 else np.uint32)
    res["_level"] = np.array(lib.dll.bnb_ms_simd_level())
    np.savez(out_path, **res)


if __name__ == "__main__":
    main(*sys.argv[1:4])
