"""Ported upstream bitsandbytes tests run on MindSpore NLP's torch API: `import mindnlp` first makes
`import torch` give mindtorch, so the upstream test code runs with only its imports changed."""

import random

import numpy as np
import pytest

import mindspore as ms

ms.set_device("CPU")
ms.runtime.launch_blocking()  # MindSpore CPU ops are asynchronous by default; ~10x slower on 2 cores

import mindnlp  # noqa: E402,F401  (must come before any `import torch`)


@pytest.fixture(autouse=True)
def _seed():
    random.seed(0)
    np.random.seed(0)
    yield


# PORT: mindtorch's CPU randn/rand ignore torch.manual_seed (they draw from an unseeded generator), so
# upstream's statistical thresholds would be checked on different data every run. Upstream's conftest
# seeds torch with 0 before each test; we get the same determinism by drawing from a seeded numpy
# generator instead. Only the random-number source changes, not the tests.
import torch  # noqa: E402  (mindtorch)

_np_rng = np.random.RandomState(0)


def _shape_args(size, kw=None):
    if not size and kw and kw.get("size") is not None:  # torch.randn(size=(m, n))
        size = (kw.pop("size"),)
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        return tuple(size[0])
    return tuple(int(s) for s in size)


def _seeded_randn(*size, dtype=None, device=None, requires_grad=False, **kw):
    t = torch.tensor(_np_rng.standard_normal(_shape_args(size, kw)).astype(np.float32))
    return t.to(dtype) if dtype is not None else t


def _seeded_rand(*size, dtype=None, device=None, requires_grad=False, **kw):
    t = torch.tensor(_np_rng.random_sample(_shape_args(size, kw)).astype(np.float32))
    return t.to(dtype) if dtype is not None else t


@pytest.fixture(autouse=True)
def _seeded_torch_random(monkeypatch):
    global _np_rng
    _np_rng = np.random.RandomState(0)
    monkeypatch.setattr(torch, "randn", _seeded_randn)
    monkeypatch.setattr(torch, "rand", _seeded_rand)
    yield


# ---- fourbit3: bitsandbytes_ms's registered mindtorch patches ----
# PORT: where mindtorch itself lacks what upstream's tests use (CPU isfinite, bf16 equal/isclose, randint's dtype,
# view(dtype), __torch_function__ for chunk/split, ...), bitsandbytes_ms ships patches in
# bitsandbytes_ms/integrations/mindtorch_patches.py that users opt into with bnb.register(). Test modules that need
# them say `pytestmark = pytest.mark.usefixtures("bnb_ms_patches")`; they are removed again after the module.
@pytest.fixture(scope="module")
def bnb_ms_patches():
    from bitsandbytes_ms.integrations import mindtorch_patches  # noqa: F401  (registers the patches)
    from bitsandbytes_ms.integrations.patches import registry

    applied = registry.apply()
    yield registry
    registry.remove(applied)
