"""One NaN rule for every float32 -> fp16/bf16 store of the CPU library, at every SIMD level: a NaN keeps its
sign and the top bits of its payload and is made quiet (fp16 ``sign | 0x7e00 | payload >> 13``, what x86's
vcvtps2ph, upstream's CPU kernels' ``_Float16`` casts and torch's vectorised casts give; bf16 ``bits >> 16 |
0x40``), csrc/aot.h f32_to_fp16 / f32_to_bf16 and cpu/simd_convert.h.  The blockwise (simd_convert.h), 4-bit
(fourbit.cpp) and optimizer (optim.cpp) stores are checked against the numpy reference's rounding
(``_reference.convert_span``) and literal bit patterns.  tests/_nan_payloads.py runs the kernels through ctypes, one
process per level (the level is fixed at library load)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bitsandbytes_ms import _reference as R
from bitsandbytes_ms import cextension

ROOT = Path(__file__).resolve().parent.parent
DT = {"fp16": "float16", "bf16": "bfloat16"}


def _levels():
    best = cextension.simd_level()
    return [lv for lv in ("scalar", "avx2", "avx512") if lv == "scalar" or lv == best or (best == "avx512" and lv == "avx2")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("nan16")
    out = {}
    for lv in _levels():
        env = dict(os.environ, BNB_MS_SIMD=lv)
        f = d / f"{lv}.npz"
        subprocess.run([sys.executable, str(ROOT / "tests" / "_nan_payloads.py"), str(cextension.LIBRARY_PATH), str(f)],
                       env=env, check=True)
        out[lv] = dict(np.load(f))
    return out


def test_levels_run(runs):
    assert "scalar" in runs and cextension.simd_level() in runs


def test_rule_literals():
    nan = np.array([0x7FC12345, 0xFFC0A000, 0x7F812345, 0xFF800001], np.uint32).view(np.float32)
    assert [hex(b) for b in R.nan_bits16(nan, "float16")] == ["0x7e09", "0xfe05", "0x7e09", "0xfe00"]
    assert [hex(b) for b in R.nan_bits16(nan, "bfloat16")] == ["0x7fc1", "0xffc0", "0x7fc1", "0xffc0"]


@pytest.mark.parametrize("sfx", ["fp16", "bf16"])
def test_dequantize_stores(runs, sfx):
    for lv, r in runs.items():
        absmax = r["absmax"]
        n = r[f"dq8_{sfx}"].size
        blk = np.arange(n) // 256
        with np.errstate(invalid="ignore"):
            want8 = R.convert_span(r["code8"][r[f"q8_{sfx}"]] * absmax[blk], DT[sfx]).view(np.uint16)
            nib = np.stack([r[f"q4_{sfx}"] >> 4, r[f"q4_{sfx}"] & 15], 1).reshape(-1)[:n]
            want4 = R.convert_span(r["code4"][nib] * absmax[blk], DT[sfx]).view(np.uint16)
        assert np.isnan(absmax).sum() == 7
        np.testing.assert_array_equal(r[f"dq8_{sfx}"], want8, err_msg=f"8-bit dequantize {sfx} at {lv}")
        np.testing.assert_array_equal(r[f"dq4_{sfx}"], want4, err_msg=f"4-bit dequantize {sfx} at {lv}")
        # the first block's absmax is 0x7fc12345: its payload's top bits survive
        assert r[f"dq8_{sfx}"][0] == (0x7E09 if sfx == "fp16" else 0x7FC1)


@pytest.mark.parametrize("sfx", ["fp16", "bf16"])
@pytest.mark.parametrize("kind", ["adam32", "adam8"])
def test_optimizer_stores(runs, sfx, kind):
    quiet = 0x200 if sfx == "fp16" else 0x40
    ref = runs["scalar"][f"{kind}_{sfx}"]
    for lv, r in runs.items():
        idx, p0 = r[f"idx_{sfx}"], r[f"p0_{sfx}"]
        # a NaN parameter stays that NaN, made quiet (x86 arithmetic keeps the NaN operand's payload)
        np.testing.assert_array_equal(r[f"{kind}_{sfx}"][idx], p0[idx] | quiet, err_msg=f"{kind} {sfx} at {lv}")
        np.testing.assert_array_equal(r[f"{kind}_{sfx}"], ref, err_msg=f"{kind} {sfx}: {lv} differs from scalar")
        assert (r[f"{kind}_{sfx}"] != p0).sum() > len(p0) // 2  # the other parameters were updated
