"""The optimizers on a plain MindSpore program: ``mindspore.Parameter`` made without mindnlp/mindtorch ever
imported has no mindtorch device, and the host-call path asked mindtorch's ``data_ptr`` for its address, which
raised ``ValueError: Tensor must have device`` on the first ``step(grads=...)`` (found 2026-12-06 timing the
optimizers from a bare script). The same steps must give the same parameter bytes as in this (mindnlp) process."""
import json
import subprocess
import sys

import numpy as np
import pytest

import mindspore as ms

import bitsandbytes_ms as bnb

_SCRIPT = r"""
import json, sys
import numpy as np, mindspore as ms
ms.set_device("CPU")
import bitsandbytes_ms as bnb
name, n = sys.argv[1], int(sys.argv[2])
rng = np.random.RandomState(0)
p = ms.Parameter(ms.Tensor(rng.randn(n).astype(np.float32)), name="p")
opt = getattr(bnb.optim, name)([p], lr=1e-3)
for _ in range(3):
    opt.step(grads=[ms.Tensor((rng.randn(n) * 0.01).astype(np.float32))])
print(json.dumps(p.asnumpy().tolist()))
"""


def _here(name, n):
    rng = np.random.RandomState(0)
    p = ms.Parameter(ms.Tensor(rng.randn(n).astype(np.float32)), name="p")
    opt = getattr(bnb.optim, name)([p], lr=1e-3)
    for _ in range(3):
        opt.step(grads=[ms.Tensor((rng.randn(n) * 0.01).astype(np.float32))])
    return p.asnumpy()


@pytest.mark.parametrize("name", ["Adam8bit", "Adam32bit", "Lion8bit"])
def test_plain_mindspore_parameter(name):
    n = 5000  # above min_8bit_size: 8-bit state
    r = subprocess.run([sys.executable, "-c", _SCRIPT, name, str(n)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = np.asarray(json.loads(r.stdout.strip().splitlines()[-1]), np.float32)
    want = _here(name, n)
    start = np.random.RandomState(0).randn(n).astype(np.float32)
    assert not np.array_equal(got, start)  # the steps moved the parameter
    np.testing.assert_array_equal(got, want)
