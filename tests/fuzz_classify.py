"""How the bad-input suite classifies what a call did (used by tests/fuzz_cases.py inside the workers, and by
tests/test_fuzz_driver.py directly): clear errors, unclear ones, and comparisons with the reference."""

from __future__ import annotations

import re
import traceback
from typing import Any, Callable, Optional, Tuple

import numpy as np

Outcome = Tuple[str, str]

#: Messages of errors that do not tell a user what is wrong: native statuses and MindSpore's C++ errors.
UNCLEAR_MARKERS = ("C++ Call Stack", "Return value from CPU AOT kernel", "Kernel select failed", "error_code[",
                   "For '", "mindspore/ccsrc", "mindspore/ops/kernel")
_EXPECTED = re.compile(r"must|expect|should|need|require|only|one of|out of range|not supported|unsupported|cannot|"
                       r"can't|does not|do not|has no|have no|invalid|unknown|missing|lacks|not allowed|no such|"
                       r"not a |not an |is not|are not|at least|at most|between|instead|mismatch|differ|no longer|"
                       r"not implemented|before|not found|too (?:short|long|many|few|large|small)|empty", re.I)
_NAMES = re.compile(r"`[^`]+`|'[^']+'|\"[^\"]+\"|--[a-z][a-z-]+")
#: Python's own errors (a bug inside the code, not a check of the input) are never clear.
_INTERNAL = (KeyError, AttributeError, UnboundLocalError, NameError, ZeroDivisionError, AssertionError,
             RecursionError, SystemError, MemoryError, StopIteration)


class Raised(Exception):
    """The exception a call under test raised (wrapping it so the case can look at it)."""

    def __init__(self, exc: BaseException):
        super().__init__(str(exc))
        self.exc = exc

    def describe(self) -> str:
        return f"{type(self.exc).__name__}: {str(self.exc)[:500]}"


def call(f: Callable[[], Any]):
    """f() or the :class:`Raised` wrapper of what it raised (a SystemExit too, for the CLI)."""
    try:
        return f()
    except (Exception, SystemExit) as e:  # noqa: BLE001
        return Raised(e)


def _deliberate(exc: BaseException) -> bool:
    """Raised by a ``raise`` statement (in this package, mindtorch or the standard library's argparse), not by
    the interpreter inside some expression (``tuple index out of range``, ``'NoneType' object has no ...``)."""
    tb = traceback.extract_tb(exc.__traceback__)
    if not tb:
        return False
    last = tb[-1]
    line = (last.line or "").strip()
    return line.startswith("raise") or line.startswith("self.error(") or "parser.error(" in line


_SIGNATURE = re.compile(r"got an unexpected keyword argument '\w+'|missing \d+ required (?:positional|keyword-only) "
                        r"argument|takes \d+ positional arguments? but \d+ (?:was|were) given")


def clarity(exc: BaseException) -> Tuple[bool, str]:
    """(clear?, why not) for an exception raised on a bad input."""
    msg = str(exc)
    if isinstance(exc, TypeError) and _SIGNATURE.search(msg):
        return True, ""  # Python's own call check names the argument
    if isinstance(exc, _INTERNAL):
        return False, f"internal {type(exc).__name__}"
    if any(m in msg for m in UNCLEAR_MARKERS):
        return False, "a native status or MindSpore C++ error"
    if not _deliberate(exc):
        return False, "not raised by a check (an error inside the code)"
    if not _NAMES.search(msg):
        return False, "names no argument or key"
    if not _EXPECTED.search(msg):
        return False, "does not say what was expected"
    return True, ""


def expect_error(res, why: str) -> Outcome:
    """The outcome of a call on an input that must be refused (``why`` says what is wrong with it)."""
    if not isinstance(res, Raised):
        return "wrong", f"accepted {why} (no error)"
    ok, reason = clarity(res.exc)
    if ok:
        return "clear", res.describe()
    return "wrong", f"unclear error ({reason}) for {why}: {res.describe()}"


def must(res):
    """The result of a call on a valid input (its exception, if any, makes the case wrong)."""
    if isinstance(res, Raised):
        raise res
    return res


def differ(got, want, what: str, rtol: float = 0.0, atol: float = 0.0, nan_ok: bool = True) -> Optional[str]:
    """None if ``got`` equals ``want`` (bit for bit for rtol = atol = 0, NaN equal to NaN), else a description."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"{what}: shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype and rtol == atol == 0.0:
        got, want = got.astype(np.float64), want.astype(np.float64)
    if rtol == 0.0 and atol == 0.0:
        if got.dtype.kind == "f" and nan_ok:
            same = (got == want) | (np.isnan(got) & np.isnan(want))
        else:
            same = got == want
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        with np.errstate(invalid="ignore"):
            same = (np.abs(g - w) <= atol + rtol * np.abs(w)) | (np.isnan(g) & np.isnan(w)) | (g == w)
    if same.all():
        return None
    i = np.argwhere(~same)[0]
    return (f"{what}: {int((~same).sum())} of {same.size} differ, first at {tuple(int(v) for v in i)}: "
            f"{got[tuple(i)]!r} vs {want[tuple(i)]!r}")


def outcome(*problems: Optional[str]) -> Outcome:
    bad = [p for p in problems if p]
    return ("wrong", "; ".join(bad)) if bad else ("ok", "")


