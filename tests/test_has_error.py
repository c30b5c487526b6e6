"""``has_error`` outputs (csrc/aot.h; cextension): the int8 GEMM ``cigemmlt_32`` and the optimizer updates write
an int32 status (0, or the status of a failure on well-formed input) instead of failing the call; nothing reads it
unless the checking mode is on (``BNB_MS_CHECK_ERRORS=1`` / ``cextension.set_check_errors``), which raises a clear
``RuntimeError``; upstream-style calls return it as upstream's ``cigemmlt_32`` does.  Failures are forced through
the libraries' ``bnb_ms_force_error`` hook (``cextension.force_error``)."""
import ctypes as ct
import sys
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor

from bitsandbytes_ms import _hostcall, cextension
from bitsandbytes_ms import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from aot_ctypes import Aot  # noqa: E402


@pytest.fixture
def forced():
    """Yields a function forcing a failure on a kernel family; clears every forced failure and the checking mode."""
    families = []

    def force(family, code):
        families.append(family)
        cextension.force_error(family, code)

    yield force
    for f in families:
        cextension.force_error(f, 0)
    cextension.set_check_errors(False)


def _int8(shape, seed):
    return np.random.RandomState(seed).randint(-128, 128, shape).astype(np.int8)


def test_igemm_has_error_zero_and_result():
    a, b = _int8((5, 33), 0), _int8((7, 33), 1)
    out, has_error = cextension.lib.cigemmlt_32(Tensor(a), Tensor(b))
    assert has_error.shape == (1,) and has_error.dtype == ms.int32 and int(has_error.asnumpy()[0]) == 0
    np.testing.assert_array_equal(out.asnumpy(), a.astype(np.int64) @ b.astype(np.int64).T)


def test_igemm_forced_failure(forced):
    a, b = Tensor(_int8((4, 16), 2)), Tensor(_int8((3, 16), 3))
    forced("igemm", 7)
    # off: no error raised (nothing reads has_error), the output says it
    assert not cextension.check_errors_enabled()
    _, has_error = cextension.lib.cigemmlt_32(a, b)
    assert int(has_error.asnumpy()[0]) == 7
    F.int8_linear_matmul(a, b)
    # checking mode: a clear error naming the entry point and the status
    cextension.set_check_errors(True)
    with pytest.raises(RuntimeError, match=r"lib\.cigemmlt_32: the native kernel reported has_error 7 \(device "
                                           r"runtime error\)"):
        F.int8_linear_matmul(a, b)
    # cleared: the same call passes and is exact
    cextension.force_error("igemm", 0)
    got = F.int8_linear_matmul(a, b).asnumpy()
    np.testing.assert_array_equal(got, a.asnumpy().astype(np.int64) @ b.asnumpy().astype(np.int64).T)


def test_igemm_upstream_style_returns_has_error(forced):
    a, b = Tensor(_int8((2, 8), 4)), Tensor(_int8((3, 8), 5))
    out = Tensor(np.zeros((2, 3), np.int32))
    gp = cextension.get_ptr
    args = lambda: (None, ct.c_int32(2), ct.c_int32(3), ct.c_int32(8), gp(b), gp(a), gp(out), None,  # noqa: E731
                    ct.c_int32(8), ct.c_int32(8), ct.c_int32(3), None)
    assert cextension.lib.cigemmlt_32(*args()) == 0
    np.testing.assert_array_equal(out.asnumpy(), a.asnumpy().astype(np.int64) @ b.asnumpy().astype(np.int64).T)
    forced("igemm", 6)
    assert cextension.lib.cigemmlt_32(*args()) == 6


def test_igemm_ctypes_without_has_error_gets_status(forced):
    """A 3-param ctypes call (tools) has no has_error output: a failure is its return status."""
    lib = Aot(str(cextension.LIBRARY_PATH))
    a, b = _int8((3, 8), 6), _int8((2, 8), 7)
    out, he = np.zeros((3, 2), np.int32), np.full(1, -1, np.int32)
    assert lib("cigemmlt_32", [a, b, out]) == 0 and lib("cigemmlt_32", [a, b, out, he]) == 0 and he[0] == 0
    forced("igemm", 8)
    assert lib("cigemmlt_32", [a, b, out]) == 8
    assert lib("cigemmlt_32", [a, b, out, he]) == 0 and he[0] == 8


@pytest.mark.parametrize("host", [True, False], ids=["hostcall", "custom"])
@pytest.mark.parametrize("bits", [32, 8])
def test_optimizer_forced_failure(forced, host, bits):
    n = 300
    rng = np.random.RandomState(bits)
    p0 = rng.randn(n).astype(np.float32)
    P, G = Tensor(p0.copy()), Tensor((rng.randn(n) * 0.1).astype(np.float32))

    def step():
        if bits == 32:
            F.optimizer_update_32bit("adam", G, P, Tensor(np.zeros(n, np.float32)), 0.9, 1e-8, 1, 1e-3,
                                     state2=Tensor(np.zeros(n, np.float32)), beta2=0.999)
        else:
            nb = -(-n // 256)
            F.optimizer_update_8bit_blockwise(
                "adam", G, P, Tensor(np.full(n, 128, np.uint8)), Tensor(np.zeros(n, np.uint8)), 0.9, 0.999, 0.0, 0.0,
                1e-8, 1, 1e-3, F.create_dynamic_map(True), F.create_dynamic_map(False),
                Tensor(np.zeros(nb, np.float32)), Tensor(np.zeros(nb, np.float32)))

    was = _hostcall.set_enabled(host)
    assert _hostcall.active() == host
    try:
        forced("optim", 7)
        step()  # off: nothing raised; the forced failure skipped the update
        np.testing.assert_array_equal(P.asnumpy(), p0)
        cextension.set_check_errors(True)
        with pytest.raises(RuntimeError, match=r"has_error 7 \(device runtime error\)"):
            step()
        cextension.force_error("optim", 0)
        step()
        assert (P.asnumpy() != p0).sum() > n // 2
    finally:
        _hostcall.set_enabled(was)
