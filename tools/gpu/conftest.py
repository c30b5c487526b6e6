"""pytest fixtures of the CUDA checks: `cuda` and `cpu`, the two libraries through tools/aot_ctypes.py.  Without
torch nothing is collected; without a CUDA device or a built library every test is skipped (run
`python3 tools/gpu/run_checks.py` to have that reported as an error instead)."""
import importlib.util

import pytest

if importlib.util.find_spec("torch") is None:
    collect_ignore_glob = ["test_*.py"]  # the checks need torch (and a device)


def _lib(index: int):
    from common import libs, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    return libs()[index]


@pytest.fixture(scope="session")
def cuda():
    return _lib(0)


@pytest.fixture(scope="session")
def cpu():
    return _lib(1)
