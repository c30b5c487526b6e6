import os
import random

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
# MindSpore's CPU ops run asynchronously by default; on 2 cores that is ~10x slower for small ops.
ms.runtime.launch_blocking()


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    yield


# ---- the bad-input suite (tests/test_fuzz_*.py): one worker pool per session, its summary line ----
@pytest.fixture(scope="session")
def fuzz_pool():
    from fuzz_pool import POOL

    yield POOL
    POOL.close()


def pytest_runtest_teardown(item, nextitem):
    # the workers (MindSpore + mindnlp each) are let go as soon as the run leaves the fuzz tests
    import sys

    mod = sys.modules.get("fuzz_pool")
    if mod is not None and mod.POOL.started and (nextitem is None or "fuzz_pool" not in nextitem.fixturenames):
        mod.POOL.close()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    import sys

    mod = sys.modules.get("fuzz_pool")
    if mod is None or not mod.TALLY.total():
        return
    tally = mod.TALLY
    terminalreporter.section("bad-input suite")
    for area in tally.areas():
        terminalreporter.write_line(tally.area_line(area))
    terminalreporter.write_line(tally.summary())
