"""Runs a snippet at every SIMD level of the CPU library and checks that they agree.

The snippet (``python -c``) must end by writing ``<simd level> <digest>`` to stdout (``cextension.simd_level()``
and a hash of everything it computed). ``BNB_MS_SIMD=scalar`` is the reference kernel; the CPU's own level must
give the same digest, and on an AVX-512 machine the AVX2 level too, and on one with AVX-512 VBMI the AVX-512 level
without it (``BNB_MS_SIMD=avx512-novbmi``: the gather paths of CPUs without VBMI)."""

import os
import subprocess
import sys


def run_at(code: str, level):
    """``[level, digest]`` printed by ``code`` run with ``BNB_MS_SIMD=level`` (None: the CPU's best)."""
    env = dict(os.environ)
    env.pop("BNB_MS_SIMD", None)
    if level:
        env["BNB_MS_SIMD"] = level
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def _has_vbmi() -> bool:
    """Whether this CPU has AVX-512 VBMI (cpu_features.h's CPU_AVX512VBMI bit, read through the library)."""
    from bitsandbytes_ms import cextension
    return "avx512_vbmi" in cextension.cpu_features()


def assert_levels_agree(code: str) -> None:
    ref_level, ref = run_at(code, "scalar")
    assert ref_level == "scalar"
    native_level, native = run_at(code, None)
    assert native == ref, f"{native_level} differs from scalar"
    if native_level == "avx512":
        assert run_at(code, "avx2")[1] == ref, "avx2 differs from scalar"
        if _has_vbmi():
            assert run_at(code, "avx512-novbmi")[1] == ref, "avx512 without VBMI differs from scalar"
