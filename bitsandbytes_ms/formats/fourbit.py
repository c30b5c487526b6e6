"""The 4-bit format's one door (NF4/FP4, QLoRA arXiv 2305.14314): the inference plan of a weight, the bf16-dot
switch, the host-call forms of ``linear_4bit`` / ``linear_4bit_compute``, and :func:`linear`, the one function
:class:`~bitsandbytes_ms.nn.Linear4bit` calls (issue 35: layers call one function per format and choose no kernel).

The route of a layer's call (the lean re-pointed call, the compute-dtype call, the full call, or none: the layer's
autograd form) is a function of the activation, compute and bias dtypes alone, so it is decided once per weight's
plan and dtypes (:meth:`Linear4bitPlan.route`) and read from the plan on every later call.

This module sits below :mod:`bitsandbytes_ms.functional` (which re-exports its names under their old spellings,
``functional._Linear4bitPlan`` included) and imports neither it nor :mod:`bitsandbytes_ms._graph`: the graph form of
``linear_4bit`` stays behind ``functional.linear_4bit``'s compile-time door, and ``_graph`` reads the bf16-dot switch
from here, so no import circle is made."""

from __future__ import annotations

import math
import os
from threading import get_ident as _get_ident
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

from .. import _hostcall, _ops, _reference
from .._formats_common import (BLOCKWISE_BLOCKSIZES, FLOAT_DTYPES, FLOAT_SET as _FLOAT_SET, FOURBIT_BLOCKSIZES,
                               LINEAR_4BIT_MAX_ROWS, _check_blocksize, _check_dtype, _check_tensor, _contiguous,
                               _empty_np, _itemsize, _lean_rows, _numel, _unmoved)
from ..backends import native as _native
from ..cextension import BNB_BACKEND
from ..quant_state import QuantState


# ---- sizes of a 4-bit weight against its state ----
def _4bit_size_errors(state: QuantState, packed_bytes: Optional[int], packed: str = "`A`",
                      st: str = "quant_state", keys: Optional[Tuple[str, str, str]] = None) -> List[str]:
    """What disagrees, exactly, between a 4-bit weight's sizes and ``state.shape`` / ``state.blocksize``: the packed
    bytes (``(n+1)//2``), the absmax entries (one a block) and, nested, the second-level absmax entries. A state
    of another shape or blocksize decodes garbage, so longer is as wrong as shorter. ``packed`` / ``st`` name the
    packed tensor and the state in the messages; ``keys`` (shape, absmax, nested absmax) name those instead (the
    state-dict keys). The blocksizes must have been checked. Returns the messages (empty when all match)."""
    k_shape, k_absmax, k_nested = keys or (f"{st}.shape", f"{st}.absmax", f"{st}.state2.absmax")
    shape = tuple(int(d) for d in state.shape)
    n = int(math.prod(shape))
    bs = int(state.blocksize)
    nb = -(-n // bs)
    errs = []
    if packed_bytes is not None and packed_bytes != (n + 1) // 2:
        errs.append(f"{packed} holds {packed_bytes} bytes; {k_shape} {shape} needs exactly {(n + 1) // 2} "
                    f"(two 4-bit codes a byte)")
    if _numel(state.absmax) != nb:
        errs.append(f"{k_absmax} has {_numel(state.absmax)} entries; {k_shape} {shape} at blocksize {bs} needs "
                    f"exactly ceil({n}/{bs}) = {nb}")
    if state.nested and isinstance(getattr(state.state2, "blocksize", None), (int, np.integer)):
        bs2 = int(state.state2.blocksize)
        nb2 = -(-nb // bs2)
        if _numel(state.state2.absmax) != nb2:
            errs.append(f"{k_nested} has {_numel(state.state2.absmax)} entries; {nb} absmax codes at nested "
                        f"blocksize {bs2} need exactly ceil({nb}/{bs2}) = {nb2}")
    return errs


def _check_4bit_sizes(state: QuantState, packed_bytes: Optional[int], fn: str, packed: str = "`A`",
                      st: str = "quant_state") -> None:
    errs = _4bit_size_errors(state, packed_bytes, packed, st)
    if errs:
        raise ValueError(f"{fn}: {errs[0]}")



# ---- bf16 compute for 4-bit linear layers --------------------------------------------------------
# bf16 activations (Linear4bit with compute_dtype bf16, bf16 or fp32 input) can run a bf16 dot-product
# kernel, clinear_4bit_bf16dot_bf16 (csrc/cpu/fourbit.cpp "bf16 compute": vdpbf16ps where the CPU has
# AVX512-BF16, a portable kernel with the same bits elsewhere), instead of the exact fp32-accumulation one.
# Default ("auto"), decided on measurements (benchmarks/cpu_avx512_host.md, Sapphire Rapids, 4096 -> 11008):
#   * CPU with AVX512-BF16: the dot kernel for 2+ rows (batch 16: 2.41 ms vs 3.59 ms exact); for one row the
#     one-row bf16 kernel where it applies (bf16_gemv_applies: AVX-512 EPYC, 4096 -> 11008, 2 threads, 0.545 ms vs
#     the exact gemv's 0.75-0.80), else the exact gemv (the table kernel at one row: 0.53 ms vs 0.27 there);
#   * any other CPU: the exact kernels (the portable dot kernel is ~35x slower than the AVX2 exact path).
# The choice is made on the CPU feature, never on BNB_MS_SIMD, so a call's result does not depend on the SIMD
# level. BNB_MS_4BIT_BF16_DOT=auto|1|0 (also on/off, 0 = "exact") or set_bf16_dot() sets it for the process
# (1: the dot kernel for every row count, the portable kernel without the instruction; 0: never); the
# ``bf16_dot`` argument of linear_4bit / linear_4bit_compute for one call.
_BF16_DOT_ENV = "BNB_MS_4BIT_BF16_DOT"
_BF16_DOT_WORDS = {"auto": None, "1": True, "on": True, "true": True, "bf16": True,
                   "0": False, "off": False, "false": False, "exact": False}
#: auto on an AVX512-BF16 CPU: the dot kernel from this many rows of activations on
BF16_DOT_AUTO_MIN_ROWS = 2
_NEVER = 1 << 62
_bf16_dot_min_rows: Optional[int] = None  # resolved lazily: rows from which the dot kernel runs by default


def _resolve_bf16_dot(mode) -> int:
    if BNB_BACKEND != "CPU":  # the kernel is CPU-only; the CUDA library has no twin
        return _NEVER
    if mode is None:
        from .. import cextension
        return BF16_DOT_AUTO_MIN_ROWS if "avx512_bf16" in cextension.cpu_features() else _NEVER
    return 1 if mode else _NEVER


def set_bf16_dot(mode="auto") -> None:
    """Sets the process-wide default of the 4-bit bf16-compute kernels: ``"auto"`` (where the CPU has AVX512-BF16
    the dot kernels for 2+ rows and for one row where :func:`bf16_gemv_applies`, else the exact kernels),
    ``True``/``"on"`` (the bf16 dot-product kernel for every call; the portable one without the instruction), ``False``/``"off"``/``"exact"`` (always the exact
    fp32-accumulation kernels), or ``None`` (read ``BNB_MS_4BIT_BF16_DOT`` again). The fused decoder
    (integrations.fused) follows the same switch for its 4-bit layers, fp32 models too: prefill (more than 8
    rows) and the one-row decode step (:func:`bf16_dot_one_row`)."""
    global _bf16_dot_min_rows
    if mode is None:
        _bf16_dot_min_rows = None
        return
    if isinstance(mode, (bool, np.bool_)):
        _bf16_dot_min_rows = _resolve_bf16_dot(bool(mode))
        return
    word = str(mode).strip().lower()
    if word not in _BF16_DOT_WORDS:
        raise ValueError(f"set_bf16_dot: `mode` must be one of 'auto', 'on', 'off', True, False or None; got {mode!r}")
    _bf16_dot_min_rows = _resolve_bf16_dot(_BF16_DOT_WORDS[word])


def _bf16_dot_rows() -> int:
    global _bf16_dot_min_rows
    if _bf16_dot_min_rows is None:
        raw = os.environ.get(_BF16_DOT_ENV, "auto")
        word = raw.strip().lower()
        if word not in _BF16_DOT_WORDS:
            raise ValueError(f"{_BF16_DOT_ENV} must be one of auto, 1, 0, on, off, exact; got {raw!r}")
        _bf16_dot_min_rows = _resolve_bf16_dot(_BF16_DOT_WORDS[word])
    return _bf16_dot_min_rows


def bf16_dot_enabled(rows: int = BF16_DOT_AUTO_MIN_ROWS, K: int = 0, blocksize: int = 0) -> bool:
    """Whether a bf16 4-bit linear forward of ``rows`` activation rows (of a weight with ``K`` in_features and that
    ``blocksize``, which decide for one row) runs the bf16 dot-product kernels by default (see
    :func:`set_bf16_dot`)."""
    return _use_bf16_dot(None, rows, "bf16_dot_enabled", K, blocksize)


def bf16_dot_one_row() -> bool:
    """Whether one activation row runs the one-row bf16 kernel by default where its shape applies (see
    :func:`bf16_gemv_applies`): "auto" on a CPU with AVX512-BF16, or the switch on. The fused decoder's decode
    step follows it for its 4-bit layers (its native side checks each weight's shape)."""
    return _bf16_dot_rows() <= BF16_DOT_AUTO_MIN_ROWS


def bf16_gemv_applies(K: int, blocksize: int) -> bool:
    """Whether one activation row of a [N, K] 4-bit weight runs the one-row bf16 kernel (K a multiple of 64 and
    of the blocksize, the blocksize a power of two >= 64: csrc/cpu/fourbit.cpp ``bf16_gemv_applies``); other
    shapes run the table kernel, slower than the exact gemv at one row."""
    return _reference.bf16_gemv_applies(K, blocksize)


def _use_bf16_dot(bf16_dot, rows: int, fn: str = "linear_4bit", K: int = 0, blocksize: int = 0) -> bool:
    if bf16_dot is None:
        least = _bf16_dot_min_rows if _bf16_dot_min_rows is not None else _bf16_dot_rows()
        if rows == 1 and least == BF16_DOT_AUTO_MIN_ROWS:  # "auto" on an AVX512-BF16 CPU: the one-row kernel
            return bf16_gemv_applies(K, blocksize)
        return rows >= least
    if not isinstance(bf16_dot, (bool, np.bool_)):
        raise TypeError(f"{fn}: `bf16_dot` must be True, False or None; got {type(bf16_dot).__name__}")
    return bool(bf16_dot) and BNB_BACKEND == "CPU"



# ---- the plan of one weight ----
class Linear4bitPlan:
    """What :func:`linear_4bit` needs of one quant_state, checked once: shapes, blocksizes, dtypes and sizes
    of its tensors, and the bound host call per activation dtype and thread. Rebuilt when a tensor of the
    quant_state is replaced or its blocksize or shape is changed. No data is cached: every call reads the tensors' current memory (host calls
    through :class:`~bitsandbytes_ms._hostcall.DeviceView`, which follows a buffer that an in-place update
    moved), so a weight changed in place is never served stale."""

    __slots__ = ("key", "N", "K", "bs", "bs2", "nested", "calls", "views", "weight_ok", "weight_kind", "routes")

    def __init__(self, state: QuantState, fn: str):
        if state.shape is None or len(state.shape) != 2:
            raise ValueError(f"{fn}: `quant_state.shape` must be 2-D [N, K]; got {state.shape}")
        self.key = Linear4bitPlan.key_of(state)
        self.N, self.K = (int(x) for x in state.shape)
        self.bs = _check_blocksize(state.blocksize, FOURBIT_BLOCKSIZES, fn)
        code = state.code
        _check_dtype(code, (ms.float32,), fn, "quant_state.code")
        if _numel(code) != 16:
            raise ValueError(f"{fn}: `quant_state.code` must have 16 entries; got {_numel(code)}")
        self.nested = bool(state.nested)
        if self.nested:
            s2 = state.state2
            _check_dtype(state.absmax, (ms.uint8,), fn, "quant_state.absmax")
            _check_dtype(s2.absmax, (ms.float32,), fn, "quant_state.state2.absmax")
            _check_dtype(s2.code, (ms.float32,), fn, "quant_state.state2.code")
            self.bs2 = _check_blocksize(s2.blocksize, BLOCKWISE_BLOCKSIZES, fn)
            if _numel(s2.code) != 256:
                raise ValueError(f"{fn}: quant_state.state2.code must have 256 entries; got {_numel(s2.code)}")
            off = state.offset
            if isinstance(off, Tensor) and (off.dtype != ms.float32 or _numel(off) != 1):
                raise ValueError(f"{fn}: `quant_state.offset` must be one float32 value; got {off.dtype} "
                                 f"shape {tuple(off.shape)}")
        else:
            _check_dtype(state.absmax, (ms.float32,), fn, "quant_state.absmax")
            self.bs2 = 256
        _check_4bit_sizes(state, None, fn)
        self.calls: Dict[Any, Any] = {}
        self.views = [_hostcall.DeviceView() for _ in range(7)]  # B, absmax, code, absmax2, code2, offset, bias
        self.weight_ok = None  # the last weight whose byte count was checked
        self.weight_kind = None  # and its (dtype, numel) then: `.data =` keeps the object, not its size
        self.routes: List[tuple] = []  # (x, compute, bias dtype, the layer's call): each decided once (linear)

    def __reduce__(self):  # a cache: copies and pickles of the QuantState start without one
        return (type(None), ())

    @staticmethod
    def key_of(state):
        s2 = state.state2
        return (state.absmax, state.code, state.offset, s2.absmax if s2 is not None else None,
                s2.code if s2 is not None else None)

    def matches(self, state) -> bool:
        # the tensors by identity; the blocksizes and shape by value (they can be set on the state in place)
        return (all(a is b for a, b in zip(self.key, Linear4bitPlan.key_of(state))) and state.blocksize == self.bs
                and state.shape == (self.N, self.K) and (not self.nested or state.state2.blocksize == self.bs2))

    def check_weight(self, B: Tensor, fn: str) -> None:
        if B is not self.weight_ok or (B.dtype, _numel(B)) != self.weight_kind:
            _check_tensor(B, fn, "B")
            need = (self.N * self.K + 1) // 2
            have = _numel(B) * _itemsize(B.dtype)
            if have != need:
                raise ValueError(f"{fn}: `B` holds {have} bytes; quant_state.shape ({self.N}, {self.K}) needs exactly "
                                 f"{need} (two 4-bit codes a byte)")
            self.weight_ok, self.weight_kind = B, (B.dtype, _numel(B))

    def host_args(self, B: Tensor, state: QuantState, bias: Optional[Tensor], dtype):
        """The host arrays of the weight, its state and the bias (call argument order 1..7), read now."""
        v, hv = self.views, _hostcall.host_view
        raw = hv(v[0], B)
        if raw.dtype != np.uint8 or raw.ndim != 1:
            raw = raw.reshape(-1).view(np.uint8)
        args = [raw, hv(v[1], state.absmax), hv(v[2], state.code)]
        if self.nested:
            s2, off = state.state2, state.offset
            off = hv(v[5], off).reshape(()) if isinstance(off, Tensor) else np.array(off, np.float32)
            args += [hv(v[3], s2.absmax), hv(v[4], s2.code), off]
        else:
            args += [None, None, None]
        if bias is None:
            args.append(None)
        else:
            b = hv(v[6], bias)
            args.append(b if b.dtype == _hostcall.np_dtype(dtype) else _hostcall.convert(b, _hostcall.np_dtype(dtype)))
        return args

    def host_call(self, dtype, dot: bool = False):
        """The bound host call for ``dtype`` on this thread, and the arrays it is bound to now (one per
        activation dtype, kernel (``dot``: the bf16 dot-product entry point) and thread: a bound call's arguments
        are re-pointed on every call, and ctypes releases the GIL while the kernel runs)."""
        key = (dtype, _get_ident(), dot)
        entry = self.calls.get(key)
        if entry is None:
            npdt = _hostcall.np_dtype(dtype)
            call = _native.linear_4bit_entry(dtype, dot).bind(
                np.empty((1, self.K), npdt), np.empty(1, np.uint8), np.empty(1, np.float32),
                np.empty(16, np.float32), None, None, None, None, self.bs, self.bs2, self.N,
                np.empty((1, self.N), npdt))
            # [lean record of linear_4bit, lean record of linear_4bit_compute (fp32 activations)]
            entry = self.calls[key] = (call, [None] * 8, [None, None])
        return entry

    def watch_of(self, B: Tensor, state: QuantState, bias: Optional[Tensor], bound: list,
                 converted_bias: bool = False):
        """What the lean call checks (see :meth:`fast`): the weight and bias objects, and (tensor, address)
        of every tensor whose memory the bound call reads in place. None where an argument is a host copy
        (a view; a converted bias unless ``converted_bias``: the lean call of :func:`linear_4bit_compute`
        converts it from the bias's own memory on every call): such calls keep the full path, which copies anew
        every time."""
        s2 = state.state2
        tensors = [B, state.absmax, state.code]
        if self.nested:
            tensors += [s2.absmax, s2.code, state.offset]
        if bias is not None:
            tensors.append(bias)
        watch = []
        for t in tensors:
            if not isinstance(t, Tensor):
                continue  # a Python float offset (its identity is in the plan's key)
            v = next((v for v in self.views if v.ref is not None and v.ref() is t), None)
            if v is None or v.array is None:
                return None
            if not (converted_bias and t is bias) and not any(
                    isinstance(b, np.ndarray) and b.ctypes.data == v.ptr for b in bound):
                return None
            watch.append((t, v.ptr, t.dtype))
        return (B, bias, tuple(watch))

    def _lean_entry(self, dtype, bf16_dot, rows: int, slot: int, B: Tensor, bias: Optional[Tensor]):
        """This thread's bound call for ``dtype`` and kernel whose lean record ``slot`` (0: :meth:`fast`, 1:
        :meth:`fast_compute`) was made with these very weight and bias objects, or None."""
        entry = self.calls.get((dtype, _get_ident(),
                                dtype == ms.bfloat16 and _use_bf16_dot(bf16_dot, rows, "linear_4bit", self.K, self.bs)))
        f = entry[2][slot] if entry is not None else None
        if f is None or f[1] is not bias:
            return None
        if f[0] is B:
            return entry
        # A new tensor over the same bytes at the same address: ``matmul_4bit(x, w.t())`` (upstream's Linear4bit
        # forward, and code ported from it) makes a fresh [1, n] view of the packed [n, 1] weight every call,
        # the same bytes in the same order. Its memory is read where it is now, so it is never stale.
        w0, p0, _ = f[2][0]
        if (isinstance(B, Tensor) and B.is_contiguous() and B.storage_offset() == 0 and B.dtype == w0.dtype
                and _numel(B) == _numel(w0) and B._data_ptr() == p0):
            return entry
        return None

    def fast(self, A: Tensor, B: Tensor, bias: Optional[Tensor], max_rows: int = 1 << 62,
             bf16_dot: Optional[bool] = None):
        """The lean host call: when this thread already ran a full call with these very weight/bias objects
        for A's dtype and kernel (``bf16_dot`` as :func:`linear_4bit` takes it) and none of the tensors it
        reads in place has moved (one address read each), only A and the output are re-pointed. Returns the
        result, or None (the caller runs the full path)."""
        dt = A.dtype
        shape, rows = _lean_rows(A, self.K, max_rows)
        if not rows:
            return None
        K = self.K
        entry = self._lean_entry(dt, bf16_dot, rows, 0, B, bias)
        if entry is None:
            return None
        f = entry[2][0]
        xa, xp = _hostcall.act_ptr(A)  # first: waits for everything queued before (in-place updates too)
        if not _unmoved(f[2]):
            return None
        out = np.empty(shape[:-1] + (self.N,), _hostcall.np_dtype(A.dtype))
        entry[0].run_rows(0, xp, rows, K, 11, out)
        return _hostcall.wrap(out)

    def fast_compute(self, A: Tensor, B: Tensor, bias: Optional[Tensor], compute_dtype, max_rows: int = 1 << 62):
        """The lean form of :func:`linear_4bit_compute` (fp32 activations, 16-bit compute dtype), as :meth:`fast`:
        after one full call with these weight/bias objects on this thread, and nothing moved, A is rounded to the
        compute dtype and re-pointed with the output; an fp32 bias is converted from its own memory again (it may
        have been rewritten in place). Returns the fp32 result, or None (the caller runs the full call)."""
        if A.dtype != ms.float32:
            return None
        shape, rows = _lean_rows(A, self.K, max_rows)
        if not rows:
            return None
        K = self.K
        entry = self._lean_entry(compute_dtype, None, rows, 1, B, bias)
        if entry is None:
            return None
        f = entry[2][1]
        npdt = _hostcall.np_dtype(compute_dtype)
        xa = _hostcall.convert(_hostcall.act_array(A), npdt)  # first: waits for everything queued before (in-place updates too)
        if not _unmoved(f[2]):
            return None
        if bias is not None and bias.dtype != compute_dtype:
            b = _hostcall.convert(_hostcall.host_view(self.views[6], bias).reshape(-1), npdt)  # the bias's own memory
            entry[0].set(7, b)
            entry[1][7] = b
        out = np.empty(shape[:-1] + (self.N,), npdt)
        entry[0].run_rows(0, xa.ctypes.data, rows, K, 11, out)
        return _hostcall.wrap(_hostcall.convert(out, np.float32))


_Linear4bitPlan = Linear4bitPlan  # the name functional and the fused decoder knew it by


def _plan_4bit(state: QuantState, fn: str) -> Linear4bitPlan:
    plan = state.__dict__.get("_linear_plan")
    if plan is None or not plan.matches(state):
        plan = Linear4bitPlan(state, fn)
        state.__dict__["_linear_plan"] = plan
    return plan


def linear_4bit_compute(A: Tensor, B: Tensor, quant_state: QuantState, bias: Optional[Tensor], compute_dtype,
                        bf16_dot: Optional[bool] = None) -> Tensor:
    """Linear4bit's inference forward for float32 activations with a 16-bit ``compute_dtype`` (bf16/fp16), in
    one host call: exactly the unfused ``(A.to(compute_dtype) @ W.T + bias.to(compute_dtype)).to(A.dtype)``
    (A rounded to the compute dtype to nearest-even, :func:`linear_4bit` in that dtype with the same
    ``bf16_dot`` choice, the result widened back; no MindSpore ops). Returns None where no host call can run
    (the caller keeps the unfused path)."""
    fn = "linear_4bit"
    if not _hostcall.active() or A.dtype != ms.float32 or compute_dtype not in (ms.bfloat16, ms.float16):
        return None
    plan = _plan_4bit(quant_state, fn)
    shape = tuple(A.shape)
    if not shape or shape[-1] != plan.K:
        raise ValueError(f"{fn}: `A` must have last dimension {plan.K} (quant_state.shape[1]); got shape {shape}")
    if bias is not None:
        _check_dtype(bias, FLOAT_DTYPES, fn, "bias")
        if _numel(bias) != plan.N:
            raise ValueError(f"{fn}: `bias` must have {plan.N} elements; got shape {tuple(bias.shape)}")
    if 0 in shape or plan.N == 0 or plan.K == 0:
        return None
    plan.check_weight(B, fn)
    dot = compute_dtype == ms.bfloat16 and _use_bf16_dot(bf16_dot, math.prod(shape[:-1]), fn, plan.K, plan.bs)
    call, bound, fast = plan.host_call(compute_dtype, dot)
    npdt = _hostcall.np_dtype(compute_dtype)
    xa = _hostcall.convert(_hostcall.act_array(A), npdt)  # first: waits for everything queued before (in-place updates too)
    for i, arr in enumerate(plan.host_args(B, quant_state, bias, compute_dtype), 1):
        if arr is not bound[i]:
            call.set(i, arr)
            bound[i] = arr
    out = np.empty(shape[:-1] + (plan.N,), npdt)
    call.set(0, xa)
    call.set(11, out)
    call()
    fast[1] = plan.watch_of(B, quant_state, bias, bound, converted_bias=bias is not None and bias.dtype != compute_dtype)
    return _hostcall.wrap(_hostcall.convert(out, np.float32))


def linear_4bit(A: Tensor, B: Tensor, quant_state: QuantState, bias: Optional[Tensor] = None,
                bf16_dot: Optional[bool] = None) -> Tensor:
    """:func:`bitsandbytes_ms.functional.linear_4bit` in PyNative mode (its docstring tells the numerics): the lean
    call where this thread already ran the full one with these weight and bias objects, else the full call."""
    fn = "linear_4bit"  # (functional.linear_4bit hands a graph being compiled to _graph before this)
    if quant_state is None:
        raise ValueError(f"{fn}: `quant_state` is required")
    plan = quant_state.__dict__.get("_linear_plan")
    if plan is not None and plan.matches(quant_state) and isinstance(A, Tensor) and _hostcall.active():
        res = plan.fast(A, B, bias, bf16_dot=bf16_dot)  # the same call as below, only A and the output re-pointed
        if res is not None:
            return res
    return _linear_4bit_full(A, B, quant_state, bias, bf16_dot)


def _linear_4bit_full(A: Tensor, B: Tensor, quant_state: QuantState, bias: Optional[Tensor], bf16_dot,
                      fn: str = "linear_4bit") -> Tensor:
    """:func:`linear_4bit` past its lean call: every argument checked, then the full host call (or ops.Custom)."""
    plan = _plan_4bit(quant_state, fn)
    if not isinstance(A, Tensor) or A.dtype not in _FLOAT_SET:
        _check_dtype(A, FLOAT_DTYPES, fn, "A")
    shape = A.shape
    if len(shape) == 0 or shape[-1] != plan.K:
        raise ValueError(f"{fn}: `A` must have last dimension {plan.K} (quant_state.shape[1]); got shape {tuple(shape)}")
    if bias is not None:
        _check_dtype(bias, FLOAT_DTYPES, fn, "bias")
        if _numel(bias) != plan.N:
            raise ValueError(f"{fn}: `bias` must have {plan.N} elements; got shape {tuple(bias.shape)}")
    out_shape = tuple(shape[:-1]) + (plan.N,)
    if 0 in shape or plan.N == 0:
        return _empty_np(out_shape, A.dtype)
    plan.check_weight(B, fn)
    dot = A.dtype == ms.bfloat16 and _use_bf16_dot(bf16_dot, math.prod(shape[:-1]), fn, plan.K, plan.bs)
    if _hostcall.active():
        return _host_linear(plan, A, B, quant_state, bias, dot, out_shape)
    return _custom_linear(plan, A, B, quant_state, bias, dot)


def _host_linear(plan: Linear4bitPlan, A, B, quant_state, bias, dot: bool, out_shape) -> Tensor:
    """The full host call: every argument re-pointed where it moved, and the lean record (:meth:`fast`) made."""
    call, bound, fast = plan.host_call(A.dtype, dot)
    out = _hostcall.empty(out_shape, A.dtype)
    call.set(0, _hostcall.host(A))  # first: waits for everything queued before (in-place updates too)
    for i, arr in enumerate(plan.host_args(B, quant_state, bias, A.dtype), 1):
        if arr is not bound[i]:  # re-point only what moved
            call.set(i, arr)
            bound[i] = arr
    call.set(11, out)
    call()
    fast[0] = plan.watch_of(B, quant_state, bias, bound)
    return _hostcall.wrap(out)


def _custom_linear(plan: Linear4bitPlan, A, B, quant_state, bias, dot: bool) -> Tensor:
    """The same kernel through ops.Custom (gradients recorded, or no host call on this backend)."""
    s2 = quant_state.state2
    absmax2 = code2 = offset = None
    if plan.nested:
        absmax2, code2 = _contiguous(s2.absmax), s2.code
        offset = quant_state.offset
        offset = ms.ops.reshape(offset if isinstance(offset, Tensor) else Tensor(np.float32(offset)), ())
    if bias is not None and bias.dtype != A.dtype:
        bias = ms.ops.cast(bias, A.dtype)
    return _ops.linear_4bit(_contiguous(A), B, (plan.N, plan.K), _contiguous(quant_state.absmax), quant_state.code,
                            plan.bs, bias, absmax2, code2, offset, plan.bs2, dot)


# ---- the layer's door ----
def linear(x: Tensor, weight: Tensor, state: QuantState, bias: Optional[Tensor], compute_dtype) -> Optional[Tensor]:
    """Linear4bit's inference forward: ``x @ W.T + bias`` computed in ``compute_dtype`` (None: x's own dtype) and
    returned in x's dtype, by the call that the route of these dtypes names (:func:`_route_of`, kept on the weight's
    plan). Returns None where no inference call serves it -- gradients recorded or a graph compiled (no host call),
    more than LINEAR_4BIT_MAX_ROWS rows, x not [..., K], a bias not yet in the compute dtype, an fp16 x with an fp32
    compute dtype -- and the layer runs its own path (its checks, its one-time bias cast, the autograd form)."""
    plan = state.__dict__.get("_linear_plan")
    xdt, bdt = x.dtype, None if bias is None else bias.dtype
    if plan is None or not plan.matches(state):  # the first call of this weight (or of a replaced state)
        return _route_of(xdt, compute_dtype, bdt)(None, x, weight, state, bias, compute_dtype)
    for r in plan.routes:  # MindSpore's dtypes are singletons: `is` finds the route (`==` and hashing cost ~2 us)
        if r[0] is xdt and r[1] is compute_dtype and r[2] is bdt:
            return r[3](plan, x, weight, state, bias, compute_dtype)
    return _new_route(plan, xdt, compute_dtype, bdt)(plan, x, weight, state, bias, compute_dtype)


def _new_route(plan: Linear4bitPlan, xdt, cdt, bdt):
    route = _route_of(xdt, cdt, bdt)
    if len(plan.routes) < 16:  # (a bound, should some dtype object ever not be the singleton)
        plan.routes.append((xdt, cdt, bdt, route))
    return route


def _route_of(xdt, cdt, bdt):
    """The call for these x, compute and bias dtypes: it depends on the dtypes alone, so each plan asks once."""
    cdt = cdt or xdt
    if xdt not in _FLOAT_SET or (bdt is not None and bdt != cdt):
        return _route_none  # the layer checks x, and casts its bias parameter to the compute dtype once (upstream)
    if xdt == cdt:
        return _route_same
    if xdt == ms.float32 and cdt in (ms.bfloat16, ms.float16):
        return _route_compute
    return _route_none  # an fp16 x with an fp32 compute dtype: the layer's autograd form, as upstream computes it


def _route_same(plan, x, weight, state, bias, compute_dtype):
    """x already in the compute dtype: the lean call (:meth:`Linear4bitPlan.fast`), else the full linear_4bit."""
    if not _hostcall.active():
        return None
    if plan is not None:
        res = plan.fast(x, weight, bias, LINEAR_4BIT_MAX_ROWS)
        if res is not None:
            return res
    if not _fits(x, state):
        return None
    return _linear_4bit_full(x, weight, state, bias, None)


def _route_compute(plan, x, weight, state, bias, compute_dtype):
    """fp32 x with a 16-bit compute dtype: the lean form of linear_4bit_compute, else the full one (x rounded to the
    compute dtype, the layer, the result widened back, in one host call)."""
    if not _hostcall.active():
        return None
    if plan is not None:
        res = plan.fast_compute(x, weight, bias, compute_dtype, LINEAR_4BIT_MAX_ROWS)
        if res is not None:
            return res
    if not _fits(x, state):
        return None
    return linear_4bit_compute(x, weight, state, bias, compute_dtype)


def _route_none(plan, x, weight, state, bias, compute_dtype):
    return None


def _fits(x: Tensor, state: QuantState) -> bool:
    """Whether the fused call serves x: [..., K] (another width: the layer raises its own error) with at most
    LINEAR_4BIT_MAX_ROWS rows (more: dequantize once and MindSpore's matmul, the layer's autograd form, is faster)."""
    shape, s = x.shape, state.shape
    if s is not None and len(s) == 2 and shape[-1] != s[1]:
        return False
    return math.prod(shape[:-1]) <= LINEAR_4BIT_MAX_ROWS
