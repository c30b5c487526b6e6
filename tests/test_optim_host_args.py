"""How an optimizer step hands its tensors to the native kernel (backends/native.py _host_call).

A gradient made by MindSpore ops lives in MindSpore's CPU device memory, and ``asnumpy()`` copied it into a second
host buffer on every step (a 20M-parameter gradient: ~7 ms and 80 MB a step); it is now read where it lives
(``_hostcall.act_array``). The parameter and state addresses come from ``_data_ptr()`` instead of mindtorch's
``data_ptr()`` (a ``dyn_shape`` op, ~70 us, five per 8-bit step), and the bound ctypes arguments are reused per
thread (``Entry.run``): per-tensor overhead 940 -> 220 us for 400 adapter-sized tensors. These tests pin that the
faster path gives the same bytes for every kind of gradient, leaves the gradient alone, and is safe from threads."""
import threading

import numpy as np
import pytest

import mindspore as ms

import bitsandbytes_ms as bnb
from bitsandbytes_ms import _hostcall

SHAPE = (48, 80)  # 3840 elements: 8-bit state needs min_8bit_size=4096, so the 8-bit cases use a larger one


def _grads(kind, rng, shape, steps):
    out = []
    for _ in range(steps):
        g = (rng.randn(*shape) * 0.01).astype(np.float32)
        if kind == "host":  # a tensor over numpy memory (no device buffer)
            out.append((g, ms.Tensor(g)))
        elif kind == "op":  # an op result: MindSpore's CPU device memory
            t = ms.ops.mul(ms.Tensor(g), 1.0)
            assert t._data_ptr() != 0
            out.append((g, t))
        else:  # a transposed view: not contiguous, so copied
            t = ms.ops.transpose(ms.ops.mul(ms.Tensor(np.ascontiguousarray(g.T)), 1.0), (1, 0))
            out.append((g, t))
    return out


def _run(name, kind, shape, steps=3):
    rng = np.random.RandomState(0)
    p = ms.Parameter(ms.Tensor(rng.randn(*shape).astype(np.float32)), name="p")
    opt = getattr(bnb.optim, name)([p], lr=1e-3)
    for g_np, g in _grads(kind, rng, shape, steps):
        opt.step(grads=[g])
        np.testing.assert_array_equal(g.asnumpy(), g_np)  # the gradient is only read
    state = opt.state[p]
    return p.asnumpy(), {k: v.asnumpy() for k, v in state.items() if hasattr(v, "asnumpy")}


@pytest.mark.parametrize("name,shape", [("Adam8bit", (64, 80)), ("Adam32bit", SHAPE), ("Lion8bit", (64, 80))])
def test_every_gradient_kind_gives_the_same_bytes(name, shape):
    p_host, st_host = _run(name, "host", shape)
    start = np.random.RandomState(0).randn(*shape).astype(np.float32)
    assert not np.array_equal(p_host, start)
    for kind in ("op", "view"):
        p, st = _run(name, kind, shape)
        np.testing.assert_array_equal(p, p_host, err_msg=kind)
        assert st.keys() == st_host.keys()
        for k in st:
            np.testing.assert_array_equal(st[k], st_host[k], err_msg=f"{kind} {k}")


def test_act_array_shares_device_memory_read_only():
    g = ms.ops.mul(ms.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)), 2.0)
    a = _hostcall.act_array(g)
    assert a.ctypes.data == g._data_ptr()  # no copy
    assert not a.flags.writeable
    np.testing.assert_array_equal(a, np.arange(12, dtype=np.float32).reshape(3, 4) * 2)
    # a host tensor (no device buffer) keeps asnumpy's array over its own memory, and is not given one
    h = ms.Tensor(np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(_hostcall.act_array(h), np.ones((2, 2), np.float32))


def _entry_args(seed, n=64 * 256):
    """numpy arguments of cadam_8bit_blockwise_grad_fp32 (the table's order: inputs, then the status)."""
    rng = np.random.RandomState(seed)
    code1 = np.asarray(bnb.functional.create_dynamic_map(signed=True).asnumpy(), np.float32)
    code2 = np.asarray(bnb.functional.create_dynamic_map(signed=False).asnumpy(), np.float32)
    nb = n // 256
    f64 = lambda v: np.array(v, np.float64)  # noqa: E731
    return [(rng.randn(n) * 0.01).astype(np.float32), rng.randn(n).astype(np.float32), np.full(n, 127, np.uint8),
            np.zeros(n, np.uint8), code1, code2, np.zeros(nb, np.float32), np.zeros(nb, np.float32), f64(0.9),
            f64(0.999), f64(0.0), f64(0.0), f64(1e-8), np.array(1, np.int64), f64(1e-3), f64(0.0), f64(1.0),
            np.array(False), np.zeros(1, np.int32)]


def test_entry_run_from_two_threads_matches_sequential_calls():
    # Entry.run reuses one Bound a thread; the native call releases the GIL, so two threads calling the same entry
    # point at once must not see each other's arguments (pure ctypes + numpy: MindSpore's PyNative ops are not
    # safe to run from two Python threads at once, whatever this library does)
    entry = _hostcall.entry("cadam_8bit_blockwise_grad_fp32")

    def run(args, steps=30):
        for t in range(steps):
            args[13][...] = t + 1
            entry.run(*args)
        return args[1]  # p

    seq = [run(_entry_args(s)).copy() for s in (1, 2)]
    par_args = [_entry_args(s) for s in (1, 2)]
    ts = [threading.Thread(target=run, args=(a,)) for a in par_args]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for a, want in zip(par_args, seq):
        np.testing.assert_array_equal(a[1], want)
    assert not np.array_equal(seq[0], _entry_args(1)[1])  # the steps moved the parameter
