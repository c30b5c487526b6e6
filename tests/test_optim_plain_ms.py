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


_LOSS_SCRIPT = r"""
import numpy as np, mindspore as ms
from mindspore import nn, ops
ms.set_device("CPU")
import bitsandbytes_ms as bnb
rng = np.random.RandomState(0)
net = nn.Dense(16, 1)
X, Y = ms.Tensor(rng.randn(32, 16).astype(np.float32)), ms.Tensor(rng.randn(32, 1).astype(np.float32))
vg_ops = ms.value_and_grad(lambda x, y: ops.mean(ops.square(ops.sub(net(x), y))), None, net.trainable_params())
vg_op = ms.value_and_grad(lambda x, y: ((net(x) - y) ** 2).mean(), None, net.trainable_params())
l0, g0 = vg_op(X, Y)  # before mindtorch: MindSpore's own operators
opt = bnb.optim.AdamW8bit(net.trainable_params(), lr=1e-2)  # imports mindtorch
try:
    vg_op(X, Y)
    print("OPERATORS_WORK")
except ValueError as e:
    print("MESSAGE", "mindspore.ops" in str(e) and "bitsandbytes_ms.optim" in str(e))
l1, g1 = vg_ops(X, Y)  # the loss written with mindspore.ops: the same gradients as before the import
print("SAME_GRADS", all(np.array_equal(a.asnumpy(), b.asnumpy()) for a, b in zip(g0, g1)), float(l0) == float(l1))
for _ in range(20):
    loss, grads = vg_ops(X, Y)
    opt.step(grads=grads)
print("LOSS", float(l1), float(vg_ops(X, Y)[0]))
"""


def test_plain_mindspore_loss_after_importing_optim():
    # importing bnb.optim imports mindtorch, which takes over mindspore.Tensor's operators: a tensor made by a
    # mindspore.nn.Cell then cannot use them; the error must say so and what to write instead, and a loss written
    # with mindspore.ops must keep its gradients and train (mindtorch_device.py says why no default device)
    r = subprocess.run([sys.executable, "-c", _LOSS_SCRIPT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert out.get("MESSAGE") == "True", r.stdout
    assert out["SAME_GRADS"] == "True True"
    first, last = map(float, out["LOSS"].split())
    assert last < 0.9 * first
