"""Copies of a parameter stay independent of it when an optimizer step updates the parameter in place
(integrations/mindtorch_copies.py): ``copy.deepcopy`` of a parameter or a model, ``buf.copy_(p)`` and
``model2.load_state_dict(model1.state_dict())``. mindtorch's versions share the parameter's buffer, and this
library's kernels write that buffer in place, so before the patches every such copy trained along with the
parameter (found by a fresh-user trial: an EMA / reference model made with deepcopy moved with the model)."""

import copy

import numpy as np
import pytest

import mindspore as ms
import mindnlp  # noqa: F401  (before `import torch`: torch becomes mindtorch)
import torch

import bitsandbytes_ms as bnb
from bitsandbytes_ms.integrations import mindtorch_copies
from bitsandbytes_ms.integrations.patches import registry

ms.set_device("CPU")


def _param(seed, shape):
    return torch.nn.Parameter(torch.tensor(np.random.RandomState(seed).randn(*shape).astype(np.float32)))


def test_patches_registered_documented_and_applied_by_importing_optim():
    names = {p.name: p for p in registry.patches()}
    for n in mindtorch_copies.NAMES:
        assert n in names and len(names[n].why) > 200 and names[n].on_import
        assert registry.is_applied(n)  # bnb.optim's import applied them; register() was not called


@pytest.mark.parametrize("cls", [bnb.optim.Adam8bit, bnb.optim.Adam32bit, bnb.optim.Lion8bit, bnb.optim.SGD8bit])
def test_copies_keep_their_values_through_a_step(cls):
    p = _param(0, (64, 80))  # 5120 elements: 8-bit state where the class has it
    before = p.asnumpy().copy()
    snap = copy.deepcopy(p)
    buf = torch.empty(64, 80)
    buf.copy_(p)
    src, dst = torch.nn.Linear(80, 64, bias=False), torch.nn.Linear(80, 64, bias=False)
    dst.load_state_dict(src.state_dict())
    src_before = src.weight.asnumpy().copy()
    kw = {"momentum": 0.9} if cls is bnb.optim.SGD8bit else {}
    opt = cls([p, src.weight], lr=0.1, **kw)
    p.grad = torch.ones(64, 80)
    src.weight.grad = torch.ones(64, 80)
    opt.step()
    assert not np.array_equal(p.asnumpy(), before) and not np.array_equal(src.weight.asnumpy(), src_before)
    np.testing.assert_array_equal(snap.asnumpy(), before)
    np.testing.assert_array_equal(buf.asnumpy(), before)
    np.testing.assert_array_equal(dst.weight.asnumpy(), src_before)


def test_deepcopy_of_a_model_keeps_values_and_requires_grad():
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    m[0].weight.requires_grad = False  # frozen, as a PEFT base
    c = copy.deepcopy(m)
    for (n, a), (_, b) in zip(m.named_parameters(), c.named_parameters()):
        assert type(b) is type(a) and b.requires_grad == a.requires_grad, n
        np.testing.assert_array_equal(b.asnumpy(), a.asnumpy())
        assert b._data_ptr() != a._data_ptr(), n
    x = torch.tensor(np.arange(8, dtype=np.float32).reshape(1, 8))
    np.testing.assert_array_equal(c(x).asnumpy(), m(x).asnumpy())


def test_copy_to_another_dtype_and_a_plain_tensor_deepcopy():
    p = _param(1, (5,))
    h = torch.empty(5, dtype=torch.float16)
    h.copy_(p)
    np.testing.assert_array_equal(h.asnumpy(), p.asnumpy().astype(np.float16))
    t = torch.tensor(np.arange(6, dtype=np.float32))
    d = copy.deepcopy(t)
    assert d._data_ptr() != t._data_ptr() and d.device.type == "cpu"
    np.testing.assert_array_equal(d.asnumpy(), t.asnumpy())


def test_bfloat16_copies():
    """bfloat16 (mindtorch's CPU clone has no kernel for it: the copy goes through the host)."""
    vals = np.array([1.5, -2.25, 3.0, 0.125], np.float32)
    b = torch.nn.Parameter(torch.tensor(vals).to(torch.bfloat16))
    dst = torch.zeros(4).to(torch.bfloat16)
    dst.copy_(b)
    d = copy.deepcopy(b)
    for t in (dst, d):
        assert t.dtype == torch.bfloat16 and t._data_ptr() != b._data_ptr() and t.device.type == "cpu"
        np.testing.assert_array_equal(t.float().asnumpy(), vals)
    assert d.requires_grad and type(d) is type(b)


def test_without_the_patches_copies_share_the_parameter_memory():
    """mindtorch's own behaviour, which the patches exist for (if mindtorch changes it, the patches can go)."""
    registry.remove(list(mindtorch_copies.NAMES))
    try:
        p = _param(2, (6,))
        buf = torch.empty(6)
        buf.copy_(p)
        frozen = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
        assert copy.deepcopy(p)._data_ptr() == p._data_ptr() and buf._data_ptr() == p._data_ptr()
        assert copy.deepcopy(frozen).requires_grad
    finally:
        mindtorch_copies.ensure()
    assert copy.deepcopy(p)._data_ptr() != p._data_ptr()
