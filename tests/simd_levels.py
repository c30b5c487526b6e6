"""Runs a snippet at every SIMD level of the CPU library and checks that they agree.

The snippet (``python -c``) must end by writing ``<simd level> <digest>`` to stdout (``cextension.simd_level()``
and a hash of everything it computed). ``BNB_MS_SIMD=scalar`` is the reference kernel; the CPU's own level must
give the same digest, and on an AVX-512 machine the AVX2 level too."""

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


def assert_levels_agree(code: str) -> None:
    ref_level, ref = run_at(code, "scalar")
    assert ref_level == "scalar"
    native_level, native = run_at(code, None)
    assert native == ref, f"{native_level} differs from scalar"
    if native_level == "avx512":
        assert run_at(code, "avx2")[1] == ref, "avx2 differs from scalar"
