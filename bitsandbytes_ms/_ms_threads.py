"""A bounded spin for MindSpore's own CPU worker threads, so they do not compete with our kernels.

MindSpore 2.7 runs its CPU ops on the mindrt thread pool (``ActorThread_0``, ``KernelThread_*``). After a task a
worker polls for the next one with ``sched_yield`` up to its spin count (300000 yields, ~0.1-0.5 s) before it
sleeps, so during one of our native calls that follows a MindSpore op (every fused decode step, every
Linear4bit forward inside a mindtorch model) that thread keeps taking a share of the cores our pool is using:
measured on the 2-core dev machine in a fused NF4 decode, ``ActorThread_0`` used ~15% of a core, almost all in
``sched_yield``. :func:`ensure` lowers the pool's spin count to ``BNB_MS_MS_SPIN`` yields (default 3000, about a
millisecond): ops that follow each other closely still find the worker awake; after a longer pause it sleeps and
the next op wakes it (measured: ~40 us more for that op). ``BNB_MS_MS_SPIN=0`` leaves MindSpore's setting alone.

MindSpore has no Python API for this. The pool is reached through the exported C++ symbols of
``libmindspore_core.so`` (``ActorMgr::actorMgr``, whose second member is the ``ActorThreadPool *``, and
``ThreadPool::SetMaxSpinCount`` / ``SetSpinCountMaxValue``); the pointer is used only when the object's vtable is
``ActorThreadPool``'s, and only on the MindSpore version this was checked on. Anything unexpected leaves MindSpore
as it is.

The same library's exported log levels make :func:`device_ptr` possible: the CPU device address of a tensor's
data, or 0 when it has none (a tensor made from numpy and not yet used by an op). ``Tensor._data_ptr()`` is the
only Python-visible way to ask, and for such a tensor it prints an ERROR line ("Tensor device address is null",
sub-module ANALYZER) every time; :func:`device_ptr` raises that sub-module's log threshold to EXCEPTION around the
question (one int written and restored in ``g_ms_submodule_log_levels``; an ANALYZER error logged by another thread
in that microsecond is lost). Where the symbol is missing or the MindSpore version is not a checked one it returns
0 without asking, and callers take the ``asnumpy()`` path.
"""

from __future__ import annotations

import ctypes as ct
import os

import mindspore as ms

CHECKED_VERSIONS = ("2.7.0",)
DEFAULT_SPIN = 3000
_state = {"done": False, "result": None}


def _spin_setting() -> int:
    try:
        return max(0, int(os.environ.get("BNB_MS_MS_SPIN", DEFAULT_SPIN)))
    except ValueError:
        return DEFAULT_SPIN


_SM_ANALYZER, _LOG_EXCEPTION = 2, 4  # SubModuleId::SM_ANALYZER, MsLogLevel::EXCEPTION (utils/log_adapter.h)
_core_lib = {}


def _core():
    """libmindspore_core.so (loaded once; None where it cannot be)."""
    if "lib" not in _core_lib:
        try:
            _core_lib["lib"] = ct.CDLL(os.path.join(os.path.dirname(ms.__file__), "lib", "libmindspore_core.so"))
        except OSError:
            _core_lib["lib"] = None
    return _core_lib["lib"]


def _analyzer_level():
    core = _core() if ms.__version__ in CHECKED_VERSIONS else None
    try:
        levels = (ct.c_int * (_SM_ANALYZER + 1)).in_dll(core, "_ZN9mindspore25g_ms_submodule_log_levelsE")
    except (ValueError, TypeError, AttributeError):  # no such symbol / no library
        return None
    return ct.c_int.from_address(ct.addressof(levels) + _SM_ANALYZER * ct.sizeof(ct.c_int))


_ANALYZER_LEVEL = _analyzer_level()


def device_ptr(t) -> int:
    """The address of ``t``'s data in MindSpore's CPU device memory (the buffer's start: the caller checks
    ``storage_offset() == 0``), or 0 when it has none or this MindSpore is not one this was checked on."""
    if _ANALYZER_LEVEL is None:
        return 0
    return quiet_ptr(t._data_ptr)


def quiet_ptr(ask) -> int:
    """``ask()`` (``t._data_ptr`` or ``t.data_ptr``: both end in the same MindSpore call) with its "Tensor device
    address is null" ERROR line silenced where this MindSpore is a checked one; 0 for a tensor without data in
    device memory either way."""
    lv = _ANALYZER_LEVEL
    if lv is None:
        return int(ask())
    old = lv.value
    lv.value = _LOG_EXCEPTION
    try:
        return int(ask())
    finally:
        lv.value = old


def _actor_pool(core):
    mgr = ct.addressof(ct.c_char.in_dll(core, "_ZN9mindspore8ActorMgr8actorMgrE"))
    if not ct.c_bool.from_address(mgr).value:  # ActorMgr::initialized_
        return None
    pool = ct.c_void_p.from_address(mgr + ct.sizeof(ct.c_void_p)).value  # ActorMgr::inner_pool_
    vtable = ct.addressof(ct.c_char.in_dll(core, "_ZTVN9mindspore15ActorThreadPoolE")) + 2 * ct.sizeof(ct.c_void_p)
    if not pool or ct.c_void_p.from_address(pool).value != vtable:
        return None
    return pool


def set_spin(yields: int) -> bool:
    """Sets the spin count of MindSpore's mindrt CPU pool to ``yields`` (> 0). False (and nothing changed) where
    the pool is not running yet or this MindSpore is not one this was checked on."""
    if ms.__version__ not in CHECKED_VERSIONS or yields <= 0:
        return False
    try:
        core = _core()
        pool = _actor_pool(core)
        if pool is None:
            return False
        set_max = core._ZN9mindspore10ThreadPool15SetMaxSpinCountEi
        set_max.argtypes, set_max.restype = [ct.c_void_p, ct.c_int], None
        apply = core._ZN9mindspore10ThreadPool20SetSpinCountMaxValueEv
        apply.argtypes, apply.restype = [ct.c_void_p], None
    except (OSError, AttributeError, ValueError):
        return False
    set_max(pool, int(yields))
    apply(pool)
    return True


def ensure() -> bool:
    """Applies ``BNB_MS_MS_SPIN`` once MindSpore's pool exists (cheap after the first success)."""
    if _state["done"]:
        return _state["result"]
    n = _spin_setting()
    if n == 0:
        _state.update(done=True, result=False)
        return False
    ok = set_spin(n)
    if ok or ms.__version__ not in CHECKED_VERSIONS:
        _state.update(done=True, result=ok)
    return ok
