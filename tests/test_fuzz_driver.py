"""The bad-input suite's own machinery: a worker that crashes, exits or hangs is recorded as a crash and replaced
(the run goes on), and the classification of errors (tests/fuzz_classify.py) tells clear errors from unclear ones."""

import pytest

from fuzz_classify import call, clarity, differ, expect_error
from fuzz_pool import Tally


def test_crashes_and_hangs_are_recorded_and_the_worker_is_replaced(fuzz_pool):
    tally = Tally()
    before = fuzz_pool.run("selftest", [("selftest", dict(action="pid"))] * 2, tally=tally)
    pids = {detail for _, detail in before}
    cases = [("selftest", dict(action=a)) for a in ("segfault", "ok", "abort", "exit", "hang", "ok")]
    out = fuzz_pool.run("selftest", cases, tally=tally, timeout=5)
    kinds = [k for k, _ in out]
    assert kinds == ["crash", "ok", "crash", "crash", "crash", "ok"], out
    details = [d for _, d in out]
    assert "signal 11" in details[0] and "Fatal Python error: Segmentation fault" in details[0]  # the worker's log
    assert "signal 6" in details[2] and "exit code 3" in details[3] and details[4].startswith("hung")
    after = fuzz_pool.run("selftest", [("selftest", dict(action="pid"))] * 2, tally=tally)
    assert not pids & {detail for _, detail in after}, "the crashed workers were replaced by new processes"
    assert tally.total("crash") == 4 and tally.total() == 10
    assert tally.summary() == "bad-input suite: tried 10, clear error 0, wrong 0, crash 4"


def _raise(exc):
    raise exc


def test_clear_and_unclear_errors():
    ok, _ = clarity(call(lambda: _raise(ValueError("quantize_blockwise: `blocksize` must be one of (64,); got 3"))).exc)
    assert ok
    for exc, why in [
        (KeyError("absmax"), "internal"),
        (RuntimeError("Return value from CPU AOT kernel(x.so)'s function(f) is 3."), "native status"),
        (TypeError("For 'Gather', the type of 'x' should be Tensor\n- C++ Call Stack: (For framework developers)"),
         "native status"),
        (ValueError("something went wrong"), "names no argument"),
        (ValueError("`x` is odd"), "does not say what was expected"),
    ]:
        res = call(lambda: _raise(exc))
        clear, reason = clarity(res.exc)
        assert not clear and why in reason, (exc, reason)
    inner = call(lambda: (1, 2)[5])  # the interpreter's own IndexError, not a check
    assert clarity(inner.exc) == (False, "not raised by a check (an error inside the code)")
    sig = call(lambda: (lambda a: a)(b=1))
    assert clarity(sig.exc)[0]  # Python's signature check names the argument
    assert expect_error(42, "a bad blocksize") == ("wrong", "accepted a bad blocksize (no error)")


@pytest.mark.parametrize("got,want,same", [([1.0, float("nan")], [1.0, float("nan")], True), ([0.0], [-0.0], True),
                                           ([1.0], [1.0000001], False), ([[1]], [1], False)])
def test_differ(got, want, same):
    import numpy as np

    assert (differ(np.array(got, np.float32), np.array(want, np.float32), "x") is None) == same
