"""bitsandbytes_ms._ms_threads: MindSpore's mindrt CPU workers stop yield-spinning soon after their last op, so
they leave the cores to our kernels (issue 12, "threads that cooperate with MindSpore")."""

import glob
import os
import time

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")

from bitsandbytes_ms import _ms_threads  # noqa: E402


def _ms_worker_ticks() -> int:
    """CPU time (clock ticks) used so far by MindSpore's ActorThread_* / KernelThread_* threads."""
    total = 0
    for t in glob.glob(f"/proc/{os.getpid()}/task/*"):
        try:
            if not open(t + "/comm").read().startswith(("ActorThread", "KernelThread")):
                continue
            f = open(t + "/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except OSError:
            pass
    return total


def _idle_ticks_after_ops() -> int:
    x = ms.Tensor(np.ones((64, 64), np.float32))
    for _ in range(20):
        x = x * 1.0001
    x.asnumpy()
    t0 = _ms_worker_ticks()
    time.sleep(0.4)  # what a long native call looks like to MindSpore's workers
    return _ms_worker_ticks() - t0


@pytest.mark.skipif(ms.__version__ not in _ms_threads.CHECKED_VERSIONS, reason="checked on MindSpore 2.7.0 only")
def test_bounded_spin_leaves_the_cpu_idle_after_ops():
    (ms.Tensor(np.ones(4, np.float32)) * 2).asnumpy()  # MindSpore's pool is running after a first op
    assert _ms_threads.set_spin(300000)  # MindSpore's own default: the worker yield-spins ~0.1-0.5 s
    default = _idle_ticks_after_ops()
    assert _ms_threads.set_spin(_ms_threads.DEFAULT_SPIN)
    bounded = _idle_ticks_after_ops()
    tick = os.sysconf("SC_CLK_TCK")
    print(f"MindSpore workers' CPU during 0.4 s idle after ops: default spin {default / tick:.2f} s, "
          f"bounded {bounded / tick:.2f} s")
    assert bounded <= 0.05 * tick, (default, bounded)
    # MindSpore still computes right after it (the worker is woken for the next op)
    np.testing.assert_array_equal((ms.Tensor(np.arange(6, dtype=np.float32)) * 2).asnumpy(), np.arange(6) * 2.0)


def test_spin_setting_from_the_environment(monkeypatch):
    monkeypatch.setenv("BNB_MS_MS_SPIN", "0")
    assert _ms_threads._spin_setting() == 0
    monkeypatch.setenv("BNB_MS_MS_SPIN", "500")
    assert _ms_threads._spin_setting() == 500
    monkeypatch.setenv("BNB_MS_MS_SPIN", "junk")
    assert _ms_threads._spin_setting() == _ms_threads.DEFAULT_SPIN
    assert not _ms_threads.set_spin(0)
