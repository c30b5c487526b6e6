"""pytest fixtures of the CUDA checks: `cuda` and `cpu`, the two libraries through tools/aot_ctypes.py; every test
is skipped where no CUDA device or no built library is found (run `python3 tools/gpu/run_checks.py` to have a
missing device reported as an error instead)."""
import pytest

pytest.importorskip("torch")

from common import libs, unavailable  # noqa: E402  (after the torch check)


@pytest.fixture(scope="session")
def cuda():
    why = unavailable()
    if why:
        pytest.skip(why)
    return libs()[0]


@pytest.fixture(scope="session")
def cpu():
    why = unavailable()
    if why:
        pytest.skip(why)
    return libs()[1]
