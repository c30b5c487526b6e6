"""The 8-bit optimizers divide by their per-call bias corrections (Adam's sqrt(1 - beta2^t), AdEMAMix's
1 - beta1^t) with two FMA corrections of x * (1/d) instead of the divider (csrc/cpu/optim_simd.inc, vdiv_by); the
bytes must be the divider's.  tools/check_div_const.cpp compares the two over the whole input range the kernel uses
that way (|x| in [2^-80, 2^100], both signs) for Adam's and AdEMAMix's divisors at common betas and steps and edge
divisors; here every 97th float of that range (~31M per divisor), the whole range in the benchmark notes.  It also
checks that the checker can fail: without the last correction step the quotients are not the divider's."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tools" / "check_div_const.cpp"


def _compile(src: Path, exe: Path) -> Path:
    subprocess.run([shutil.which("g++") or shutil.which("c++"), "-O2", "-mavx2", "-mfma", "-o", str(exe), str(src)],
                   check=True)
    return exe


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    if (shutil.which("g++") or shutil.which("c++")) is None:
        pytest.skip("no C++ compiler")
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    if " avx2" not in flags or " fma" not in flags:
        pytest.skip("the checker needs AVX2 + FMA (so does the kernel path it checks)")
    return _compile(SRC, tmp_path_factory.mktemp("divc") / "check_div_const")


def test_division_by_constant_is_the_dividers(checker):
    r = subprocess.run([str(checker), "97"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:]
    assert r.stdout.rstrip().endswith(": 0 mismatches"), r.stdout[-2000:]
    assert r.stdout.count(": ok") >= 40  # every divisor of the built-in set was checked


def test_checker_finds_a_wrong_quotient(checker, tmp_path):
    # the same checker with one correction step removed must report mismatches (it is not vacuous)
    src = SRC.read_text()
    step = "      q = _mm256_fmadd_ps(_mm256_fnmadd_ps(q, vd, x), vy, q);\n"
    assert src.count(step) == 2
    weak = tmp_path / "weak.cpp"
    weak.write_text(src.replace(step, "", 2))
    exe = _compile(weak, tmp_path / "weak")
    r = subprocess.run([str(exe), "4096", "0.0316227749"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "MISMATCH" in r.stdout
