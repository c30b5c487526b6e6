"""The int8 format's one door (LLM.int8(): Dettmers et al., "LLM.int8(): 8-bit Matrix Multiplication for
Transformers at Scale", arXiv 2208.07339): row-wise quantization, the int8 GEMM and its dequantization, the mixed
(outlier) matmul, and the inference plan :class:`Int8LinearPlan` that :class:`~bitsandbytes_ms.nn.Linear8bitLt` and
the fused decoder bind once per weight. Semantics and constants follow upstream bitsandbytes 0.50.2
(functional.py and backends/default/ops.py).

Each public function keeps its graph form beside it (``_graph``: MindSpore parses graph functions' source, so they
stay plain functions there). :mod:`bitsandbytes_ms.functional` re-exports every name here under its old spelling;
this module imports neither it nor any other format."""

from __future__ import annotations

import math
import threading
from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor

from .. import _graph, _hostcall, _ops, _reference
from .._formats_common import (FLOAT_DTYPES, FLOAT_SET as _FLOAT_SET, INT8_DEQUANT_SCALE, _check_dtype, _check_out,
                               _contiguous, _empty_np, _fn_name, _numel, checks_int8_max_K)
from .._hostcall import write_out as _write
from .._ops import tag as _tag
from ..backends import native as _native
from ..utils import dtype_name, to_numpy as _to_numpy


def _check_threshold(threshold, fn: str) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
        raise TypeError(f"{_fn_name(fn, 'threshold')} must be a float, got {type(threshold).__name__}")
    threshold = float(threshold)
    if not threshold >= 0.0:
        raise ValueError(f"{_fn_name(fn, 'threshold')} must be >= 0; got {threshold}")
    return threshold


def _check_rank(t: Tensor, min_rank: int, fn: str, arg: str) -> None:
    if t.ndim < min_rank:
        raise ValueError(f"{_fn_name(fn, arg)} must have at least {min_rank} dimension(s); got shape {tuple(t.shape)}")


def int8_vectorwise_quant(A: Tensor, threshold: float = 0.0):
    """Row-wise absmax int8 quantization with optional outlier columns (upstream
    ``int8_vectorwise_quant``; LLM.int8()).

    ``A`` is viewed as ``[rows, K]`` (rows = product of the leading dims). Per row,
    ``row_stats = max|x|`` and ``CA = round_half_even(x * (127 / row_stats))``. With ``threshold > 0``
    the elements with ``|x| >= threshold`` are outliers: they are left out of ``row_stats``, quantize to 0,
    and (when there is more than one row) every column that holds one is zeroed in ``CA``.

    Args:
        A: float16/bfloat16/float32 tensor, at least 1-D (non-contiguous input is copied first).
        threshold: outlier threshold (>= 0); 0 disables outlier handling.

    Returns:
        ``(CA int8 shaped like A, row_stats float32 [rows], outlier_cols)``: ``outlier_cols`` is ``None``
        for ``threshold == 0``, else an int64 tensor of the sorted outlier column indices (possibly empty).

    Raises:
        ValueError: ``A`` not a 16/32-bit float tensor or 0-d; negative threshold.
        TypeError: ``A`` not a tensor; threshold not a number.
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.int8_vectorwise_quant(A, threshold)
    fn = "int8_vectorwise_quant"
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    _check_rank(A, 1, fn, "A")
    threshold = _check_threshold(threshold, fn)
    K = int(A.shape[-1])
    rows = _numel(A) // K if K else int(math.prod(A.shape[:-1]))
    if _numel(A) == 0:
        CA, stats, flags = _empty_np(A.shape, ms.int8), _empty_np((rows,), ms.float32), np.zeros(K, np.uint8)
    else:
        CA, stats, flags_t = _ops.int8_vectorwise_quant(_contiguous(A), threshold)
        flags = flags_t.asnumpy() if threshold > 0.0 else None
    outlier_cols = None
    if threshold > 0.0:
        outlier_cols = _tag(Tensor(np.nonzero(flags)[0].astype(np.int64)), (A,))
    return CA, stats, outlier_cols


def int8_vectorwise_dequant(A: Tensor, stats: Tensor) -> Tensor:
    """Inverse of :func:`int8_vectorwise_quant`: ``float32(A) * stats[row] * 7.874015718698502e-3``
    (two float32 roundings, as upstream). ``A`` int8 ``[..., K]``, ``stats`` float32 with one value per
    row (any shape of that size). Returns float32 shaped like ``A``.

    Raises:
        ValueError: wrong dtypes, or ``stats`` size differs from the number of rows of ``A``.
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.int8_vectorwise_dequant(A, stats)
    fn = "int8_vectorwise_dequant"
    _check_dtype(A, (ms.int8,), fn, "A")
    _check_dtype(stats, (ms.float32,), fn, "stats")
    _check_rank(A, 1, fn, "A")
    rows = int(math.prod(A.shape[:-1]))
    if _numel(stats) != rows:
        raise ValueError(f"{fn}: `stats` must have one value per row of `A` ({rows}); got {_numel(stats)}")
    if _numel(A) == 0:
        return _empty_np(A.shape, ms.float32)
    O = ms.ops
    a2 = O.cast(O.reshape(A, (rows, int(A.shape[-1]))), ms.float32)
    out = O.mul(O.mul(a2, O.reshape(stats, (rows, 1))), float(np.float32(INT8_DEQUANT_SCALE)))
    return _tag(O.reshape(out, A.shape), (A,))


def int8_double_quant(A: Tensor, col_stats=None, row_stats=None, out_col=None, out_row=None, threshold: float = 0.0):
    """Row-wise and column-wise int8 quantization (upstream ``int8_double_quant``, which is CUDA-only
    in 0.50.2; here it runs on CPU with the CUDA backend's semantics).

    Returns ``(CA, CAt, row_stats, col_stats, outlier_cols)``: ``CA``/``row_stats``/``outlier_cols`` as
    :func:`int8_vectorwise_quant`; ``col_stats`` float32 [K] = column absmax (outliers left out when
    ``threshold > 0``; NaN for a column holding a NaN, as upstream's amax), ``CAt = round_half_even(x * 127 /
    col_stats)`` int8 shaped like ``A`` (outliers and NaN columns 0).

    Raises:
        ValueError: any of the preallocated arguments is given (upstream does not support them), or ``A``
            is not a 16/32-bit float tensor.
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.int8_double_quant(A, col_stats, row_stats, out_col, out_row, threshold)
    fn = "int8_double_quant"
    for name, v in (("row_stats", row_stats), ("col_stats", col_stats), ("out_col", out_col), ("out_row", out_row)):
        if v is not None:
            raise ValueError(f"{name} must be None. int8_double_quant() does not support pre-allocated {name}.")
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    _check_rank(A, 1, fn, "A")
    CA, rstats, outlier_cols = int8_vectorwise_quant(A, threshold)
    K = int(A.shape[-1])
    O = ms.ops  # MindSpore ops throughout: their results are tagged once, at the return
    a = O.cast(O.reshape(_contiguous(A), (-1, K)), ms.float32)
    if threshold > 0.0:
        thr = float(np.float32(_reference.convert_span(np.array([threshold], np.float32), dtype_name(A.dtype))[0]))
        a = O.select(O.ge(O.abs(a), thr), O.zeros_like(a), a)
    if _numel(A):
        cstats = O.reduce_max(O.abs(a), 0)
        # MindSpore's CPU max skips NaN; upstream's amax propagates it (a NaN column gets a NaN scale)
        cstats = O.select(O.any(O.isnan(a), 0), O.full_like(cstats, float("nan")), cstats)
        # upstream CUDA computes round(A * 127 / col_stats); a zero column gives NaN -> 0 here
        q = O.round(O.div(O.mul(a, 127.0), O.reshape(cstats, (1, K))))
        q = O.select(O.isfinite(q), q, O.zeros_like(q))
        CAt = O.reshape(O.cast(q, ms.int8), A.shape)
    else:
        cstats = _empty_np((K,), ms.float32)
        CAt = _empty_np(A.shape, ms.int8)
    return CA, _tag(CAt, (A,)), rstats, _tag(cstats, (A,)), outlier_cols


def int8_linear_matmul(A: Tensor, B: Tensor, out: Optional[Tensor] = None, dtype=ms.int32) -> Tensor:
    """``A @ B.T`` for int8 ``A [..., K]`` and int8 ``B [N, K]`` with exact int32 accumulation
    (upstream ``int8_linear_matmul``). Native GEMM: AMX-INT8 (from 8 rows of A) / AVX-512 VNNI /
    AVX-512 / AVX-VNNI / AVX2 / portable, chosen at run time (``cextension.int8_gemm_path()``;
    ``BNB_MS_INT8_GEMM`` forces one); every path gives the same exact result.

    Returns:
        int32 ``[..., N]`` (written into ``out`` when given).

    Raises:
        ValueError: ``A``/``B`` not int8, ``B`` not 2-D, inner dimensions differ, ``dtype`` not int32,
            ``out`` of the wrong shape/dtype.
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.int8_linear_matmul(A, B, out, dtype)
    fn = "int8_linear_matmul"
    _check_dtype(A, (ms.int8,), fn, "A")
    _check_dtype(B, (ms.int8,), fn, "B")
    if dtype != ms.int32:
        raise ValueError(f"{_fn_name(fn, 'dtype')} must be int32; got {dtype_name(dtype)}")
    _check_rank(A, 1, fn, "A")
    if B.ndim != 2:
        raise ValueError(f"{_fn_name(fn, 'B')} must be 2-D [N, K]; got shape {tuple(B.shape)}")
    if A.shape[-1] != B.shape[-1]:
        raise ValueError(f"{fn}: inner dimensions do not match: `A` {tuple(A.shape)} @ `B`.T {tuple(B.shape)} "
                         f"(A.shape[-1] must equal B.shape[1])")
    shape = tuple(A.shape[:-1]) + (int(B.shape[0]),)
    _check_out(out, shape, ms.int32, fn, "out")
    if math.prod(shape) == 0:
        return _write(out, _empty_np(shape, ms.int32), fn)
    K = int(A.shape[-1])
    if K == 0:
        return _write(out, _empty_np(shape, ms.int32), fn)
    if K > checks_int8_max_K:
        return _write(out, _int8_matmul_long_k(A, B, shape), fn)
    return _write(out, _ops.int8_linear_matmul(_contiguous(A), _contiguous(B)), fn)


def _int8_matmul_long_k(A: Tensor, B: Tensor, shape) -> Tensor:
    """``A @ B.T`` for K beyond the kernel's exact int32 range (upstream accepts any K): the kernel on slices
    of at most :data:`checks_int8_max_K` columns, each exact, summed with int32 wrap-around -- the sum modulo
    2^32 whatever the order, which is what upstream's int32-accumulating ``torch._int_mm`` returns."""
    a, b = _to_numpy(A), _to_numpy(B)
    K = a.shape[-1]
    total = None
    for k in range(0, K, checks_int8_max_K):
        part = _ops.int8_linear_matmul(Tensor(np.ascontiguousarray(a[..., k:k + checks_int8_max_K])),
                                       Tensor(np.ascontiguousarray(b[:, k:k + checks_int8_max_K]))).asnumpy()
        total = part if total is None else total + part  # int32 + int32 wraps in numpy
    return _tag(Tensor(total.reshape(shape)), (A,))


def _mm_dequant(A, row_stats, col_stats, bias, dtype, fn, mixed=None):
    _check_dtype(A, (ms.int32,), fn, "A")
    _check_dtype(row_stats, (ms.float32,), fn, "row_stats")
    _check_dtype(col_stats, (ms.float32,), fn, "col_stats")
    _check_rank(A, 1, fn, "A")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"{_fn_name(fn, 'dtype')} must be float16, bfloat16 or float32; got {dtype_name(dtype)}")
    N = int(A.shape[-1])
    rows = int(math.prod(A.shape[:-1]))
    if _numel(row_stats) != rows:
        raise ValueError(f"{fn}: `row_stats` must have one value per row of `A` ({rows}); got {_numel(row_stats)}")
    if _numel(col_stats) != N:
        raise ValueError(f"{fn}: `col_stats` must have A.shape[-1] = {N} values; got {_numel(col_stats)}")
    if bias is not None:
        _check_dtype(bias, FLOAT_DTYPES, fn, "bias")
        if _numel(bias) != N:
            raise ValueError(f"{fn}: `bias` must have A.shape[-1] = {N} values; got {_numel(bias)}")
        bias = _contiguous(bias).reshape(N)
    if _numel(A) == 0:
        return _empty_np((rows, N), dtype)
    if mixed is not None:  # (activations [rows, K] of `dtype`, CB [N, K], uint8 flags [K]): the outlier columns
        a2, CB, flags = mixed
        _check_dtype(CB, (ms.int8,), fn, "CB")
        if tuple(CB.shape) != (N, int(a2.shape[-1])):
            raise ValueError(f"{_fn_name(fn, 'CB')} must be [{N}, {int(a2.shape[-1])}]; got {tuple(CB.shape)}")
        return _ops.int8_mixed_mm_dequant(
            _contiguous(A).reshape(rows, N), _contiguous(row_stats).reshape(rows), _contiguous(col_stats).reshape(N),
            bias, a2, _contiguous(CB), Tensor(flags), dtype)
    return _ops.int8_mm_dequant(_contiguous(A).reshape(rows, N), _contiguous(row_stats).reshape(rows),
                                _contiguous(col_stats).reshape(N), dtype, bias)


def int8_mm_dequant(A: Tensor, row_stats: Tensor, col_stats: Tensor, out: Optional[Tensor] = None,
                    bias: Optional[Tensor] = None) -> Tensor:
    """Dequantizes an int8 GEMM result (upstream ``int8_mm_dequant``):
    ``float(A) * (row_stats[r] * col_stats[c]) * 6.200124e-05 (+ bias[c])`` in float32, returned as
    float16 ``[rows, N]`` (a 3-D ``A`` gives a 2-D result, as upstream).

    Raises:
        ValueError: wrong dtypes (A int32, stats float32, bias float), stats/bias sizes that do not match.
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.int8_mm_dequant(A, row_stats, col_stats, out, bias)
    fn = "int8_mm_dequant"
    res = _mm_dequant(A, row_stats, col_stats, bias, ms.float16, fn)
    if out is not None:
        _check_out(out, res.shape, ms.float16, fn, "out")
    return _write(out, res, fn)


def int8_scaled_mm(A: Tensor, B: Tensor, row_stats: Tensor, col_stats: Tensor, bias: Optional[Tensor] = None,
                   dtype=None) -> Tensor:
    """``int8_mm_dequant(int8_linear_matmul(A, B), row_stats, col_stats, bias)`` in ``dtype`` (default
    float16), shaped ``[..., N]`` like ``A`` (upstream op ``bitsandbytes::int8_scaled_mm``)."""
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.int8_scaled_mm(A, B, row_stats, col_stats, bias, dtype)
    fn = "int8_scaled_mm"
    dtype = ms.float16 if dtype is None else dtype
    C = int8_linear_matmul(A, B)
    return _tag(ms.ops.reshape(_mm_dequant(C, row_stats, col_stats, bias, dtype, fn), C.shape), (A,))


def _outlier_flags(outlier_cols: Tensor, K: int, fn: str) -> np.ndarray:
    """uint8 [K] flags of the outlier columns (a set: duplicates count once, any order)."""
    _check_dtype(outlier_cols, (ms.int64, ms.int32), fn, "outlier_cols")
    cols = outlier_cols.asnumpy().reshape(-1).astype(np.int64)
    if cols.size and (cols.min() < 0 or cols.max() >= K):
        raise ValueError(f"{_fn_name(fn, 'outlier_cols')} must hold column indices in [0, {K}); got "
                         f"{int(cols.min())}..{int(cols.max())}")
    flags = np.zeros(K, np.uint8)
    flags[cols] = 1
    return flags


def int8_mixed_scaled_mm(A: Tensor, CA: Tensor, CB: Tensor, SCA: Tensor, SCB: Tensor,
                         outlier_cols: Optional[Tensor] = None, bias: Optional[Tensor] = None):
    """LLM.int8() mixed-precision matmul (upstream op ``bitsandbytes::int8_mixed_scaled_mm``):
    ``int8_scaled_mm(CA, CB, SCA, SCB, bias)`` plus, for the outlier columns, ``A[:, cols] @
    dequant(CB[:, cols]).T``. Upstream adds the outlier part with torch's ``addmm`` in ``A.dtype``; here
    (native ``cint8_mixed_mm_dequant_<dtype>``, the code the fused :func:`int8_linear` runs) the int8 part
    is dequantized to float32 (+ bias) and the outlier product is added as torch's fp32 ``addmm`` does on an
    AVX2 host: per output an fma chain from 0 over the outlier columns in ascending order, in blocks of 192
    columns (two halves for 193..383), each block's sum added in turn (upstream's fp32 bytes from 5 rows;
    bit-identical on every SIMD level and to the fused forward); the sum is rounded once to ``A.dtype``. ``outlier_cols`` is
    taken as a set (duplicates count once). Without outlier columns the result is ``int8_scaled_mm``'s.

    Args:
        A: [rows, K] float activations; CA int8 [rows, K]; CB int8 [N, K]; SCA float32 [rows];
            SCB float32 [N]; outlier_cols int64 column indices or None; bias [N] or None.

    Returns:
        ``(out [rows, N] in A.dtype, subA)`` where ``subA = A[:, outlier_cols]`` (empty when none).

    Raises:
        ValueError: wrong dtypes, shapes that do not match, outlier columns outside ``[0, K)``.
    """
    fn = "int8_mixed_scaled_mm"
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    _check_rank(A, 1, fn, "A")
    C = int8_linear_matmul(CA, CB)
    has_outliers = outlier_cols is not None and _numel(outlier_cols) > 0
    if not has_outliers:
        out = _tag(ms.ops.reshape(_mm_dequant(C, SCA, SCB, bias, A.dtype, fn), C.shape), (A,))
        return out, _tag(Tensor(np.zeros((0,), np.float32)).astype(A.dtype), (A,))
    K = int(A.shape[-1])
    rows = int(math.prod(C.shape[:-1]))
    N = int(C.shape[-1])
    if int(math.prod(A.shape[:-1])) != rows or K != int(CB.shape[-1]):
        raise ValueError(f"{fn}: `A` must be [{rows}, {int(CB.shape[-1])}] (the rows of `CA`, the columns of `CB`); "
                         f"got {tuple(A.shape)}")
    flags = _outlier_flags(outlier_cols, K, fn)
    O = ms.ops
    a2 = O.reshape(_contiguous(A), (rows, K))
    # subA (returned, as upstream): gathered in fp32 (MindSpore's CPU gather has no bfloat16)
    subA = O.cast(O.gather(O.cast(a2, ms.float32), O.cast(outlier_cols, ms.int32), 1), A.dtype)
    out = _mm_dequant(C, SCA, SCB, bias, A.dtype, fn, mixed=(a2, CB, flags))
    return _tag(O.reshape(out, C.shape), (A,)), _tag(subA, (A,))


class Int8LinearPlan:
    """What the fused LLM.int8() forward needs of one quantized weight, checked and prepared once: ``CB``
    (int8 [N, K]) and ``SCB`` (float32 [N]), their host arrays (made on the first host call) and the bound
    host call per activation dtype and thread. As :class:`_Linear4bitPlan`, a plan is tied to the tensor
    objects it was made from: :meth:`matches` tells whether a state still holds them, and callers rebuild
    the plan when ``CB`` or ``SCB`` is replaced (``load_state_dict``, re-quantization). Host calls read
    ``CB``/``SCB`` in place on every call (:class:`~bitsandbytes_ms._hostcall.DeviceView`: no copy of the
    weight, and an in-place write, which gives a MindSpore tensor new storage, is seen by the next call)."""

    __slots__ = ("CB", "SCB", "N", "K", "views", "_local")

    def __init__(self, CB: Tensor, SCB: Tensor, fn: str = "int8_linear"):
        _check_dtype(CB, (ms.int8,), fn, "CB")
        if CB.ndim != 2:
            raise ValueError(f"{_fn_name(fn, 'CB')} must be 2-D [N, K]; got shape {tuple(CB.shape)}")
        self.N, self.K = int(CB.shape[0]), int(CB.shape[1])
        if self.K > checks_int8_max_K:
            raise ValueError(f"{_fn_name(fn, 'CB')} must have at most {checks_int8_max_K} columns (exact int32 "
                             f"accumulation); got {self.K}")
        _check_dtype(SCB, (ms.float32,), fn, "SCB")
        if _numel(SCB) != self.N:
            raise ValueError(f"{_fn_name(fn, 'SCB')} must have CB.shape[0] = {self.N} values; got {_numel(SCB)}")
        self.CB, self.SCB = CB, SCB
        self.views = (_hostcall.DeviceView(), _hostcall.DeviceView(), _hostcall.DeviceView())  # CB, SCB, bias
        self._local = threading.local()  # bound host calls: per thread (a call runs without the GIL)

    def refresh(self) -> None:
        """Kept for callers of earlier versions: host calls read CB/SCB in place on every call."""
        self._local = threading.local()

    def __reduce__(self):  # a cache: copies and pickles of its owner start without one
        return (type(None), ())

    def matches(self, CB, SCB) -> bool:
        # the shapes too: `.data =` of another shape keeps the objects
        return CB is self.CB and SCB is self.SCB and CB.shape == (self.N, self.K) and _numel(SCB) == self.N

    def host_call(self, dtype):
        calls = getattr(self._local, "calls", None)
        if calls is None:
            calls = self._local.calls = {}
        entry = calls.get(dtype)
        if entry is None:
            npdt = _hostcall.np_dtype(dtype)
            a, b = np.empty((1, self.K), npdt), np.empty(self.K, np.uint8)  # placeholders: set on every call
            call = _native.int8_linear_entry(dtype).bind(a, np.empty((self.N, self.K), np.int8),
                                                             np.empty(self.N, np.float32), None, 0.0, a, b)
            # the call, its threshold, CB, SCB and bias arrays bound, the lean call's state (see fast)
            entry = calls[dtype] = [call, 0.0, None, None, None, None]
        return entry

    def fast(self, A: Tensor, bias: Optional[Tensor], threshold: float):
        """The lean host call: when this thread already ran a full call for A's dtype with this bias object
        and none of CB, SCB and bias has moved (one address read each), only A and the outputs are re-pointed.
        Returns ``(out, col_flags)`` as :meth:`__call__`, or None (the caller runs the full path)."""
        calls = getattr(self._local, "calls", None)
        entry = calls.get(A.dtype) if calls is not None else None
        if entry is None:
            return None
        f = entry[5]
        if f is None or f[0] is not bias or threshold != entry[1]:
            return None
        shape, rows = _hostcall.lean_rows(A, self.K)
        if not rows or self.N == 0:
            return None
        K = self.K
        xa, xp = _hostcall.act_ptr(A)  # first: waits for everything queued before (in-place updates too)
        if not _hostcall.unmoved(f[1]):
            return None
        out = np.empty(shape[:-1] + (self.N,), _hostcall.np_dtype(A.dtype))
        if threshold > 0.0:
            flags = np.empty(K, np.uint8)  # kept by the caller (state.idx): a new array every call
            entry[0].run_rows(0, xp, rows, K, 5, out, 6, flags)
        else:  # nobody reads the flags of threshold 0: this thread's entry keeps one scratch array bound
            flags = f[2]
            entry[0].run_rows(0, xp, rows, K, 5, out)
        return _hostcall.wrap(out), flags

    def check_shapes(self, A: Tensor, bias: Optional[Tensor], fn: str) -> None:
        """``A`` [..., K] against the weight, and ``bias`` (a float tensor of N values or None)."""
        shape = A.shape
        if len(shape) == 0 or shape[-1] != self.K:
            raise ValueError(f"{fn}: inner dimensions do not match: `A` {tuple(shape)} @ `CB`.T ({self.N}, {self.K}) "
                             f"(A.shape[-1] must equal CB.shape[1])")
        if bias is not None:
            _check_dtype(bias, FLOAT_DTYPES, fn, "bias")
            if _numel(bias) != self.N:
                raise ValueError(f"{_fn_name(fn, 'bias')} must have CB.shape[0] = {self.N} values; got {_numel(bias)}")

    def __call__(self, A: Tensor, bias: Optional[Tensor], threshold: float, fn: str = "int8_linear"):
        """``(out [..., N] in A.dtype, col_flags)`` for validated-here ``A``/``bias`` and a checked threshold;
        ``col_flags`` (uint8 [K], the outlier columns) is a host numpy array after a host call, else a tensor."""
        shape = A.shape
        if not isinstance(A, Tensor) or A.dtype not in _FLOAT_SET:
            _check_dtype(A, FLOAT_DTYPES, fn, "A")
        self.check_shapes(A, bias, fn)
        out_shape = tuple(shape[:-1]) + (self.N,)
        if _hostcall.active():
            entry = self.host_call(A.dtype)
            call = entry[0]
            out = _hostcall.empty(out_shape, A.dtype)
            flags = np.empty(self.K, np.uint8)
            host = _hostcall.host
            call.set(0, host(A))  # first: waits for everything queued before (in-place updates too)
            cb = _hostcall.host_view(self.views[0], self.CB)
            scb = _hostcall.host_view(self.views[1], self.SCB).reshape(self.N)
            if cb is not entry[2]:
                call.set(1, cb)
                entry[2] = cb
            if scb is not entry[3]:
                call.set(2, scb)
                entry[3] = scb
            b = None if bias is None else _hostcall.host_view(self.views[2], bias).reshape(self.N)
            if b is None or b is not entry[4]:
                call.set(3, b)
                entry[4] = b
            if threshold != entry[1]:
                call.set(4, threshold)
                entry[1] = threshold
            call.set(5, out)
            call.set(6, flags)
            call()
            # the lean call (fast) may follow when every array read is the tensor's own memory
            watch = [(t, v) for t, v in zip((self.CB, self.SCB, bias), self.views) if t is not None]
            scratch = np.empty(self.K, np.uint8)
            call.set(6, scratch)  # the lean call's flags for threshold 0 (nobody reads them), bound from now on
            entry[5] = (bias, tuple((t, v.ptr, t.dtype) for t, v in watch), scratch) if all(
                v.ref is not None and v.ref() is t and v.array is not None and a is not None
                and a.ctypes.data == v.ptr for (t, v), a in zip(watch, (cb, scb, b))) else None
            return _hostcall.wrap(out), flags
        out, flags = _ops.int8_linear(_contiguous(A), _contiguous(self.CB), _contiguous(self.SCB).reshape(self.N),
                                      None if bias is None else _contiguous(bias).reshape(self.N), threshold)
        return out, flags


def int8_linear_plan(owner, CB: Tensor, SCB: Tensor, fn: str = "int8_linear") -> Int8LinearPlan:
    """The :class:`Int8LinearPlan` cached on ``owner`` (e.g. a MatmulLtState), rebuilt when ``CB``/``SCB``
    are other tensors than the plan's."""
    plan = owner.__dict__.get("_int8_linear_plan")
    if plan is None or not plan.matches(CB, SCB):
        plan = Int8LinearPlan(CB, SCB, fn)
        owner.__dict__["_int8_linear_plan"] = plan
    return plan


def int8_linear(A: Tensor, CB: Tensor, SCB: Tensor, bias: Optional[Tensor] = None, threshold: float = 0.0):
    """LLM.int8() linear forward ``A @ dequant(CB, SCB).T (+ bias)`` in one native call
    (``cint8_linear_<dtype of A>``; what :class:`~bitsandbytes_ms.nn.Linear8bitLt` runs at inference).

    Bit for bit what the unfused path computes: ``int8_vectorwise_quant`` of A (float32 A cast to float16
    first, as upstream), the int8 GEMM, then ``int8_scaled_mm``'s dequant in ``A.dtype`` (threshold 0) or
    ``int8_mixed_scaled_mm`` (threshold > 0: the outlier columns, those holding |x| >= threshold in some
    row, multiplied in float32 in a fixed order; see there). In PyNative mode with no gradient being
    recorded the entry point runs as a host call (:mod:`bitsandbytes_ms._hostcall`), otherwise through
    ops.Custom.

    Args:
        A: float16/bfloat16/float32 activations [..., K].
        CB: int8 weight [N, K]; SCB: its float32 row scales [N].
        bias: optional float [N] (any float dtype).
        threshold: outlier threshold (>= 0).

    Returns:
        ``(out [..., N] in A.dtype, outlier_cols)``: ``outlier_cols`` None for threshold 0, else the sorted
        int64 outlier column indices (as :func:`int8_vectorwise_quant`).

    Raises:
        ValueError / TypeError naming the argument: wrong dtypes, shapes that do not match, negative threshold.
    """
    fn = "int8_linear"
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    _check_rank(A, 1, fn, "A")
    plan = Int8LinearPlan(CB, SCB, fn)
    plan.check_shapes(A, bias, fn)
    threshold = _check_threshold(threshold, fn)
    shape = tuple(A.shape[:-1]) + (plan.N,)
    if _numel(A) == 0 or plan.N == 0:
        return _empty_np(shape, A.dtype), (_tag(Tensor(np.zeros(0, np.int64)), (A,)) if threshold > 0.0 else None)
    out, flags = plan(A, bias, threshold, fn)
    if threshold == 0.0:
        return out, None
    f = flags if isinstance(flags, np.ndarray) else flags.asnumpy()
    return out, _tag(Tensor(np.nonzero(f)[0].astype(np.int64)), (A,))
