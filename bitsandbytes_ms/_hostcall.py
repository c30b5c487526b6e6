"""Host calls: the low-overhead bridge from Python to the CPU library for the inference hot path.

A native entry point normally runs as ``mindspore.ops.Custom(..., func_type="aot")`` (see
:mod:`bitsandbytes_ms.cextension`). In PyNative mode on the CPU that costs ~200-300 us per call
(shape/dtype inference callbacks, the op pipeline) for kernels that take 10-50 us at batch 1. A host
call runs *the same AOT entry point* directly through ctypes on the tensors' host memory: no other
native code, no second implementation, ~5 us of overhead.

It is used only where it gives the same result as the ``ops.Custom`` path and nothing can be lost:

* :func:`active` is True: the CPU library is loaded, MindSpore runs in PyNative mode, and no gradient
  is being recorded (``mindspore.value_and_grad`` / mindtorch autograd tracing: the ops.Custom path
  with its custom ``bprop`` keeps running there). ``BNB_MS_HOSTCALL=0`` or :func:`set_enabled`
  switches it off (for comparisons; nothing needs it).
* :func:`host` gives a tensor's data as a C-contiguous numpy array. ``Tensor.asnumpy()`` waits for
  pending work on the tensor (MindSpore's CPU pipeline is asynchronous), shares memory with a
  contiguous CPU tensor and copies a non-contiguous one (so a view gives the contiguous copy's result).
* Results are numpy arrays allocated here and handed to MindSpore without a copy (:func:`wrap`:
  ``torch.from_numpy`` once mindtorch is imported, so they carry mindtorch's device tag).

    call = Entry("cgemm_4bit_inference_naive_fp32").bind(x, B, absmax, code, 64, N, out)
    call.set(0, x2); call.set(6, out2); call()      # re-point one argument, run again

Arguments are given in the op table's order (inputs, then outputs; :mod:`bitsandbytes_ms._native_table`):
numpy arrays, ``None`` (a null pointer with dtype "none") or Python scalars (0-d arrays: int ->
int64, float -> float32, bool -> bool, as MindSpore passes them). A nonzero status raises
``RuntimeError`` naming the entry point (Python validates arguments before, as for ops.Custom).
"""

from __future__ import annotations

import ctypes as ct
import math
import os
import sys
import threading
import weakref
from typing import Any, Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor
from mindspore import context as _ms_context
from mindspore.common.api import _pynative_executor

from . import _launch_blocking, _ms_threads, _native_table, cextension

_ARGTYPES = [ct.c_int, ct.POINTER(ct.c_void_p), ct.POINTER(ct.c_int), ct.POINTER(ct.POINTER(ct.c_int64)),
             ct.POINTER(ct.c_char_p), ct.c_void_p, ct.c_void_p]
_NONE = b"none"
_enabled = (os.environ.get("BNB_MS_HOSTCALL", "1") != "0" and cextension.BNB_BACKEND == "CPU"
            and cextension.LIBRARY_ERROR is None)
# ms.get_context("mode") costs ~16 us a call; the context object's own getter ~1.5 us
_ctx, _MODE = _ms_context._context, _ms_context.ms_ctx_param.mode
_MAX_RANK = 8
_DTYPE_NAME: dict = {}


def set_enabled(flag: bool) -> bool:
    """Switches host calls on or off (off: every op runs through ops.Custom). Returns the old value."""
    global _enabled
    old = _enabled
    _enabled = bool(flag) and cextension.BNB_BACKEND == "CPU" and cextension.LIBRARY_ERROR is None
    return old


def active() -> bool:
    """True where a host call may replace the ops.Custom call: CPU library, PyNative mode, no gradient
    being recorded."""
    return _enabled and not _pynative_executor.requires_grad() and _ctx().get_param(_MODE) == ms.PYNATIVE_MODE


def usable(*inputs) -> bool:
    """True where a host call may replace the ops.Custom call of an op that has no gradient (the dequantization of
    packed codes): :func:`active`'s conditions, and while a gradient is recorded only when no input asks for one
    (a packed weight's codes and absmax: the result is then a constant of the recorded graph, as the ops.Custom
    result is; an input that asks keeps the ops.Custom call, and whatever MindSpore makes of it)."""
    if active():
        return True
    return (_enabled and _ctx().get_param(_MODE) == ms.PYNATIVE_MODE
            and not any(getattr(t, "requires_grad", False) for t in inputs))


def host(t: Tensor) -> np.ndarray:
    """The tensor's data as a C-contiguous numpy array (shared with a contiguous CPU tensor)."""
    a = t.asnumpy()
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class DeviceView:
    """A numpy array over a tensor's own CPU memory, re-made only when the tensor's buffer moves.

    ``Tensor.asnumpy()`` of a tensor that lives in MindSpore's CPU device memory (a parameter, an op result)
    copies it into a second, persistent host buffer on every call (a 113 MB lm_head weight: ~15 ms and 113 MB
    more memory), so the weight is read in place instead: ``Tensor._data_ptr()`` (the CPU device address,
    < 1 us) wrapped once per address. The first sight of a tensor (and a null address) goes through
    mindtorch's ``data_ptr()``, which makes MindSpore allocate the device buffer of a tensor that has none
    yet; a new address waits for MindSpore's pipeline once (``wait_pipeline``) before its memory is read.
    Callers take the activation's host copy first (``asnumpy`` runs everything queued before it), so
    in-place updates of the weight made before the call have landed."""

    __slots__ = ("ref", "ptr", "array", "kind")

    def __init__(self):
        self.ref = None  # weak: a replaced weight is not kept alive by the cache
        self.ptr = 0
        self.array = None
        self.kind = None  # (dtype, shape) the array was made for

    def get(self, t) -> Optional[np.ndarray]:
        if not t.is_contiguous() or t.storage_offset() != 0:
            return None  # a view into another buffer: the caller copies it (H.host)
        same = self.ref is not None and self.ref() is t
        ptr = t._data_ptr() if same else 0
        if not ptr:
            ptr = _ms_threads.quiet_ptr(t.data_ptr)
        # the same object at the same address may hold other data: ``p.data = p.data.to(fp16)`` (Linear4bit's
        # bias cast) can land in the buffer just freed, so the dtype and shape are part of the key
        kind = (t.dtype, tuple(t.shape))
        if ptr != self.ptr or not same or self.array is None or kind != self.kind:
            if not ptr:
                return None
            t.wait_pipeline()
            dtype = np_dtype(t.dtype)
            shape = tuple(int(s) for s in kind[1])
            n = int(math.prod(shape))
            buf = (ct.c_char * max(n * dtype.itemsize, 1)).from_address(ptr)
            self.array = np.frombuffer(buf, dtype=dtype, count=n).reshape(shape)
            self.ref, self.ptr, self.kind = weakref.ref(t), ptr, kind
        return self.array


def own_memory(t: Tensor, fn: str, arg: str) -> Optional[np.ndarray]:
    """A numpy array over ``t``'s own CPU memory (its storage offset and strides), or None where the
    address is not available. Writing it changes ``t`` and every tensor sharing that memory (the base
    of a view), which an ops.Custom call cannot do: MindSpore hands an AOT kernel a contiguous copy of
    a view (non-contiguous or not), and mindtorch's ``contiguous()`` returns a non-contiguous tensor
    itself, so an in-place update of a view used to be lost."""
    # The storage's start (the offset is separate). `_data_ptr()` (< 1 us) is what mindtorch's `data_ptr()` returns
    # after a `dyn_shape` op (~70 us a call, five a call of an 8-bit optimizer step); that op only matters for a
    # tensor with no device buffer yet (`_data_ptr()` 0), where it makes MindSpore allocate one. mindtorch's
    # data_ptr raises for a tensor mindtorch never placed (no `_device`: an ms.Parameter made in plain MindSpore).
    ptr = _ms_threads.quiet_ptr(t._data_ptr)
    if not ptr and hasattr(t, "_device"):
        ptr = _ms_threads.quiet_ptr(t.data_ptr)
    if not ptr:
        return None
    dtype = np_dtype(t.dtype)
    shape = tuple(int(d) for d in t.shape)
    strides = tuple(int(d) for d in t.stride())
    if any(st == 0 and d > 1 for st, d in zip(strides, shape)) or any(st < 0 for st in strides):
        raise ValueError(f"{fn}: `{arg}` is updated in place and must not repeat memory (stride 0, as an "
                         f"expanded tensor); got shape {shape}, stride {strides}")
    extent = 1 + sum((d - 1) * st for d, st in zip(shape, strides)) if all(shape) else 0
    base = ptr + int(t.storage_offset()) * dtype.itemsize
    buf = (ct.c_char * max(extent * dtype.itemsize, 1)).from_address(base)
    flat = np.frombuffer(buf, dtype=dtype, count=extent)
    return np.lib.stride_tricks.as_strided(flat, shape=shape, strides=tuple(st * dtype.itemsize for st in strides))


def host_ptr(t) -> tuple:
    """``(array, address)``: :func:`host`'s array of the tensor (``asnumpy()``: waits for everything queued
    before, so in-place updates made before the call have landed; shares a host tensor's memory, copies a
    device-resident one) and the address of its data, for a call that re-points one argument."""
    a = t.asnumpy()
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a, a.ctypes.data


def act_ptr(t) -> tuple:
    """``(keep, address)`` of an activation's data for a call that re-points one argument, like :func:`host_ptr`,
    without the copy where there is none to make: a contiguous tensor whose data is in MindSpore's CPU device
    memory (an op's result: what a layer inside a model gets) is read in place once MindSpore's queue has run
    (``_pynative_executor.sync()``: its producer and in-place updates before the call have landed), where
    ``asnumpy()`` copies it into a new host buffer (measured: ~20 us of a ~75 us int8 576x576 layer call at
    batch 1). A tensor without device memory (made from numpy, or one of our own results not yet used by an op)
    or a view with an offset takes :func:`host_ptr`. ``keep`` must stay referenced during the call."""
    if t.is_contiguous() and t.storage_offset() == 0:
        ptr = _ms_threads.device_ptr(t)
        if ptr:
            _pynative_executor.sync()
            return t, ptr
    return host_ptr(t)


def act_array(t) -> np.ndarray:
    """:func:`act_ptr`'s data as a numpy array (over the tensor's device memory where it is read in place, then
    read-only; valid while ``t`` lives), for callers that only read it: conversions, an optimizer's gradient (its
    ``asnumpy()`` copied a 20M-parameter gradient, ~7 ms and 80 MB, on every step)."""
    keep, ptr = act_ptr(t)
    if isinstance(keep, np.ndarray):
        return keep
    dtype = np_dtype(t.dtype)
    shape = tuple(int(s) for s in t.shape)
    n = int(math.prod(shape))
    a = np.frombuffer((ct.c_char * max(n * dtype.itemsize, 1)).from_address(ptr), dtype=dtype, count=n).reshape(shape)
    a.flags.writeable = False
    return a


def lean_rows(A: Tensor, K: int, max_rows: int = 1 << 62) -> tuple:
    """``(shape, rows)`` of an activation a lean call (a plan's bound call re-pointed at a new activation: the 4-bit
    and int8 plans) can take: [..., K] with 1..max_rows rows and K > 0; rows is 0 otherwise (the caller runs its
    full path)."""
    shape = tuple(A.shape)
    if not shape or shape[-1] != K or K == 0:
        return shape, 0
    rows = math.prod(shape[:-1])
    return shape, (rows if rows <= max_rows else 0)


def unmoved(watch) -> bool:
    """True when every (tensor, address, dtype) a lean call reads in place still has that address and dtype
    (a parameter cast in place, ``p.data = p.data.to(dt)``, can get the address its old buffer had)."""
    for t, ptr, dt in watch:
        if t._data_ptr() != ptr or t.dtype != dt:
            return False
    return True


def host_view(view: "DeviceView", t: Tensor) -> np.ndarray:
    """``view.get(t)`` (the tensor's own memory), or :func:`host`'s copy where it cannot be viewed."""
    a = view.get(t)
    return host(t) if a is None else a


def wrap(a: np.ndarray) -> Tensor:
    """A tensor over ``a``'s memory (no copy), tagged for mindtorch once it is imported."""
    mt = sys.modules.get("mindtorch")
    return mt.from_numpy(a) if mt is not None else Tensor.from_numpy(a)


def _scalar(v) -> np.ndarray:
    if isinstance(v, (bool, np.bool_)):
        return np.array(v, dtype=np.bool_)
    if isinstance(v, (int, np.integer)):
        return np.array(v, dtype=np.int64)
    return np.array(v, dtype=np.float32)


class Bound:
    """One entry point with all its arguments bound: ``set(i, a)`` re-points argument ``i``, ``()`` runs."""

    __slots__ = ("_fn", "_name", "_n", "_params", "_ndims", "_shapes", "_dims", "_dtypes", "_keep")

    def __init__(self, fn, name: str, args):
        _ms_threads.ensure()  # MindSpore's idle workers stop yield-spinning over our calls (see _ms_threads)
        _launch_blocking.ensure()  # MindSpore's async CPU mode: ~6x slower (see _launch_blocking)
        self._fn, self._name, self._n = fn, name, len(args)
        self._params = (ct.c_void_p * self._n)()
        self._ndims = (ct.c_int * self._n)()
        self._dims = [(ct.c_int64 * _MAX_RANK)() for _ in range(self._n)]  # one shape buffer per argument
        self._shapes = (ct.POINTER(ct.c_int64) * self._n)(*[ct.cast(d, ct.POINTER(ct.c_int64)) for d in self._dims])
        self._dtypes = (ct.c_char_p * self._n)()
        self._keep: list = [None] * self._n
        for i, a in enumerate(args):
            self.set(i, a)

    def set(self, i: int, a: Any) -> None:
        if a is None:
            self._params[i], self._ndims[i], self._dtypes[i] = None, 0, _NONE
            self._keep[i] = None
            return
        if not isinstance(a, np.ndarray):
            a = _scalar(a)
        shape = a.shape
        if len(shape) > _MAX_RANK:
            raise ValueError(f"{self._name}: argument {i} has rank {len(shape)}; at most {_MAX_RANK} is supported")
        dims = self._dims[i]
        for d, s in enumerate(shape):
            dims[d] = s
        self._params[i] = a.ctypes.data
        self._ndims[i] = len(shape)
        name = _DTYPE_NAME.get(a.dtype)
        if name is None:
            name = _DTYPE_NAME[a.dtype] = a.dtype.name.encode()
        self._dtypes[i] = name
        self._keep[i] = a  # the memory stays alive while bound

    def release(self) -> None:
        """Lets go of the bound arrays (the pointers stay, unused until the next set)."""
        self._keep[:] = [None] * self._n
        for i in range(self._n):
            self._params[i] = None

    def _run(self, fn, name: str) -> None:
        rc = fn(self._n, self._params, self._ndims, self._shapes, self._dtypes, None, None)
        if rc:
            raise cextension.status_error(name, rc)

    def __call__(self) -> None:
        self._run(self._fn, self._name)

    def run_as(self, entry: "Entry") -> None:
        """Runs ``entry`` -- an entry point declared with this one's arguments (e.g. its ``*_bf16dot`` twin) --
        on the bound arguments."""
        self._run(entry._fn, entry.name)

    def run_rows(self, ia: int, a_ptr: int, rows: int, cols: int, io: int, out: np.ndarray, ix: int = -1,
                 extra: Optional[np.ndarray] = None) -> None:
        """The lean per-call form of ``set(ia, A); set(io, out); ()``: argument ``ia`` becomes the [rows, cols]
        array at address ``a_ptr`` (of the dtype bound there before) and ``io`` the [rows, N] ``out`` (dtype as
        bound, its last dimension unchanged). Neither is kept alive here: the caller holds both during the call,
        and every call re-points them. ``ix``/``extra``: one more output re-pointed (same shape and dtype)."""
        p, nd = self._params, self._ndims
        p[ia] = a_ptr
        nd[ia] = 2
        d = self._dims[ia]
        d[0] = rows
        d[1] = cols
        p[io] = out.ctypes.data
        d = self._dims[io]
        last = d[nd[io] - 1]
        nd[io] = 2
        d[0] = rows
        d[1] = last
        self._keep[ia] = self._keep[io] = None
        if ix >= 0:  # one more output re-pointed (same shape and dtype as bound)
            p[ix] = extra.ctypes.data
            self._keep[ix] = None
        rc = self._fn(self._n, p, nd, self._shapes, self._dtypes, None, None)
        p[ia] = p[io] = None  # not left pointing at memory the caller frees (a stray call gets a status)
        if ix >= 0:
            p[ix] = None
        if rc:
            raise cextension.status_error(self._name, rc)


class Entry:
    """A native entry point of the C ABI table (:mod:`bitsandbytes_ms._native_table`), called on host memory."""

    def __init__(self, name: str):
        op = _native_table.OPS[name]
        self.name = name
        self.nargs = len(op.inputs) + len(op.outputs)
        fn = getattr(cextension._dll, name)
        fn.restype, fn.argtypes = ct.c_int, _ARGTYPES
        self._fn = fn
        self._local = threading.local()  # run()'s Bound: one a thread (the ctypes call releases the GIL)

    def _check_count(self, args) -> None:
        if len(args) != self.nargs:
            raise TypeError(f"{self.name} takes {self.nargs} arguments (inputs then outputs), got {len(args)}")

    def bind(self, *args) -> Bound:
        self._check_count(args)
        return Bound(self._fn, self.name, args)

    def __call__(self, *args) -> None:
        self.run(*args)

    def run(self, *args) -> None:
        """One call with these arguments, through this thread's reused :class:`Bound` (its ctypes arrays, ~45 us to
        make, are made once per entry point and thread; every optimizer step and dequantization calls here). The
        arguments are let go after the call."""
        self._check_count(args)
        b = getattr(self._local, "bound", None)
        if b is None:
            b = self._local.bound = Bound(self._fn, self.name, args)
        else:
            for i, a in enumerate(args):
                b.set(i, a)
        try:
            b()
        finally:
            b.release()


_ENTRIES: dict = {}


def entry(name: str) -> Entry:
    """The cached :class:`Entry` for ``name``."""
    e = _ENTRIES.get(name)
    if e is None:
        e = _ENTRIES[name] = Entry(name)
    return e


def np_dtype(dtype) -> np.dtype:
    """numpy dtype of a MindSpore float/int dtype (bfloat16: ml_dtypes')."""
    return _NP_DTYPES[dtype]


def _np_dtypes():
    # bfloat16: the numpy type MindSpore's own asnumpy() returns (it registers one of its own), so host
    # arrays of inputs and results compare and convert with each other
    # (taken from mindspore.common.np_dtype: computing one with asnumpy() at import ran a kernel, which initialises
    # MindSpore's runtime, so a later ms.set_device() -- the CLI's first step -- raised)
    try:
        from mindspore.common.np_dtype import bfloat16 as _ms_bf16

        bf16 = np.dtype(_ms_bf16)
    except ImportError:  # pragma: no cover - other MindSpore versions
        bf16 = Tensor(np.zeros(1, np.float32)).astype(ms.bfloat16).asnumpy().dtype
    return {ms.float32: np.dtype(np.float32), ms.float16: np.dtype(np.float16), ms.bfloat16: bf16,
            ms.int8: np.dtype(np.int8), ms.uint8: np.dtype(np.uint8), ms.int16: np.dtype(np.int16),
            ms.int32: np.dtype(np.int32), ms.int64: np.dtype(np.int64)}  # int16: a 4-bit quant_storage


_NP_DTYPES = _np_dtypes()


def empty(shape, dtype) -> np.ndarray:
    """An uninitialised host array of a MindSpore dtype (the result buffer of a host call)."""
    return np.empty(shape, dtype=_NP_DTYPES[dtype])


_CONVERT_CODES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, _NP_DTYPES[ms.bfloat16]: 2}
_convert_fn = None
_CONVERT_MIN = 4096  # elements from which the native cast is faster (measured: equal at ~4096)


def convert(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a.astype(dtype)`` for fp32/fp16/bf16 host arrays through the native library's SIMD conversion
    (``bnb_ms_convert``: round to nearest even, the library's NaN rule; numpy's bf16 cast is ~20x slower)."""
    global _convert_fn
    dtype = np.dtype(dtype)
    src, dst = _CONVERT_CODES.get(a.dtype), _CONVERT_CODES.get(dtype)
    if src is None or dst is None or a.size < _CONVERT_MIN:  # small arrays: numpy's call costs less (~1 vs ~3 us)
        return a.astype(dtype)
    if _convert_fn is None:
        fn = cextension._dll.bnb_ms_convert
        fn.restype, fn.argtypes = ct.c_int, [ct.c_void_p, ct.c_int, ct.c_void_p, ct.c_int, ct.c_int64]
        _convert_fn = fn
    a = np.ascontiguousarray(a)
    out = np.empty(a.shape, dtype)
    if _convert_fn(a.ctypes.data, src, out.ctypes.data, dst, a.size) != 0:  # pragma: no cover - codes checked above
        raise RuntimeError("bnb_ms_convert failed")
    return out


__all__ = ["active", "set_enabled", "convert", "host", "own_memory", "host_view", "host_ptr", "act_ptr", "act_array", "lean_rows", "unmoved", "DeviceView", "wrap", "entry", "Entry", "Bound", "empty", "np_dtype", "write_out"]


def write_out(out: Optional[Tensor], result: Tensor, fn: str = "functional", arg: str = "out") -> Tensor:
    """Honours an ``out=`` argument: writes ``result`` into ``out``'s own memory and returns ``out``. A view (a row,
    a slice, a transpose of a preallocated buffer) is written where it lives, so its base holds the result too, as
    torch's ``out=`` does: mindtorch's ``copy_`` into a view leaves the base as it was (as its ``contiguous()``
    returns the view itself, see :func:`own_memory`). Where host memory is not available, ``copy_``."""
    if out is None or result is out:
        return result
    if active():
        out.wait_pipeline()
        mem = own_memory(out, fn, arg)
        if mem is not None:
            mem[...] = host(result).reshape(mem.shape)
            return out
    out.copy_(result)
    return out
