"""Graph mode: the functional ops inside ``mindspore.jit`` and ``GRAPH_MODE``.

MindSpore compiles a ``jit`` function or a ``GRAPH_MODE`` Cell by *parsing* its Python source (and that of the
functions it calls) into a graph; the code never runs in Python. The native ops are ``ops.Custom(...,
func_type="aot")`` primitives, which compile like any other primitive; what does not compile is the Python
around them in :mod:`bitsandbytes_ms.functional` (host calls, numpy, ``asnumpy``, mindtorch device tags, caches).
So every public op of ``functional`` starts with ``if _graph.compiling(A): return _graph.<op>(...)`` and this
module holds the graph form of each op: the same argument checks (evaluated once, at compile time, on the
constant shapes and dtypes), the same native primitive (``cextension.NativeFunction._custom``: the very object
PyNative runs) and the same MindSpore ops around it, so both modes give the same bytes.

How the code tells: :func:`compiling` is ``not hasattr(A, "asnumpy")`` for a tensor ``A``. In Python (PyNative)
every ``Tensor`` has ``asnumpy``; while MindSpore's graph compiler parses the function, ``hasattr`` is answered
from the graph's tensor type, which has no ``asnumpy`` (a host-side method). One attribute lookup (~60 ns) on
the PyNative hot path. ``tests/test_graph_mode.py`` checks both answers, so a MindSpore release that changed
this would fail there, not silently.

Quant states: a graph cannot create a :class:`~bitsandbytes_ms.functional.QuantState` (a Python object) from
tensors computed in it, so the graph forms return a :class:`GraphQuantState` (a namedtuple with the same
attribute names) and accept either one (a ``QuantState`` made in PyNative and captured by the compiled
function or Cell works too). Not in graph mode: ``out=`` / ``absmax=`` output arguments (a graph does not write
into a caller's tensor; use the return value), ``quant_storage`` other than uint8, and the int8 ops that return
outlier columns (``int8_vectorwise_quant`` / ``int8_double_quant`` with ``threshold > 0``: their count is
data-dependent); MatMul8bitLt (``bnb.matmul``, Linear8bitLt) with a threshold does run, through the fused forward,
whose result has a fixed shape.

Names: ``_C`` is :mod:`bitsandbytes_ms._formats_common` (the blocksizes, row limits and codes functional
re-exports); ``ops`` is ``mindspore.ops``. This module does not import :mod:`bitsandbytes_ms.functional` (which
imports it) nor any format: the dynamic 8-bit map comes from ``_C``. The 4-bit graph forms stand beside their
PyNative forms in :mod:`bitsandbytes_ms.formats.fourbit` (``graph_<op>``), over the helpers here.

Everything here uses MindSpore's functional ``ops``, not Tensor methods or operators: the 4-bit dequantize and
backward also run in PyNative from a Cell's ``bprop``, on tensors without mindtorch's device tag, which
mindtorch's Tensor methods (installed by ``import mindnlp``) would refuse.
"""

from __future__ import annotations

import collections
import math

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops
from mindspore.ops import constexpr

from . import _formats_common as _C  # the constants and codes functional shares (no import circle)
from .cextension import compiling, lib  # noqa: F401  (compiling: the test every hand-over uses)
from .utils import dtype_name


def graph_state(absmax, shape, code, blocksize, quant_type, dtype, offset=None, state2=None):
    """A quant state made inside a graph, in the layout of ``QuantState.as_dict()`` (upstream's keys; ``dtype`` by
    name, ``nested_offset`` a 0-d tensor): MindSpore 2.7 compiles dicts across function boundaries and as jit
    outputs, but a class instance (or a namedtuple holding a dtype or None) returned from a function becomes an
    opaque object. Return the tensors a caller needs (``state["absmax"]``, ...) from a jit function, not the dict:
    MindSpore 2.7 fails at run time on some dict outputs that hold ``ops.Custom`` results ("The pointer[abstract]
    is null")."""
    if state2 is None:
        return {"quant_type": quant_type, "absmax": absmax, "blocksize": blocksize, "quant_map": code,
                "dtype": _name_of(dtype), "shape": shape}
    return {"quant_type": quant_type, "absmax": absmax, "blocksize": blocksize, "quant_map": code,
            "dtype": _name_of(dtype), "shape": shape, "nested_absmax": state2["absmax"],
            "nested_blocksize": state2["blocksize"], "nested_quant_map": state2["quant_map"],
            "nested_dtype": state2["dtype"], "nested_offset": offset}


def as_graph_state(state):
    """``state`` (a QuantState the compiled code captured, or a dict from :func:`graph_state` / ``as_dict()``) as
    such a dict."""
    if isinstance(state, dict):
        return state
    if state.nested:
        s2 = state.state2
        return graph_state(state.absmax, state.shape, state.code, state.blocksize, state.quant_type, state.dtype,
                           _offset_tensor(state.offset),
                           graph_state(s2.absmax, s2.shape, s2.code, s2.blocksize, s2.quant_type, s2.dtype))
    return graph_state(state.absmax, state.shape, state.code, state.blocksize, state.quant_type, state.dtype)


# ---- compile-time helpers (constexpr: run in Python on the graph's constants) ----
@constexpr
def _prim_name(name, static):
    """Makes sure ``lib.<name>`` has created its ``ops.Custom`` primitive for the values of its table row's
    ``static`` scalars (the object PyNative calls) and returns ``name``; see :func:`_prim`."""
    fn = getattr(lib, name)
    fn._custom(dict(zip(fn.op.static, static)))
    return name


def _prim(name, static):
    """The ``ops.Custom`` primitive of entry point ``name`` (``static``: the values of its row's static scalars).
    The graph reads it from ``lib.<name>``'s cache, which :func:`_prim_name` filled at compile time (the lookup
    depends on its result, so it is resolved after; a Primitive returned by a constexpr itself would not be a
    primitive in the graph)."""
    return getattr(lib, _prim_name(name, static))._cache[static]


@constexpr
def _offset_tensor(offset):
    return offset if isinstance(offset, Tensor) else Tensor(np.float32(offset))


@constexpr
def _name_of(dtype):
    return dtype if isinstance(dtype, str) else dtype_name(dtype)


@constexpr
def _dtype_of(dtype):
    """A state's dtype (a MindSpore dtype in a QuantState, its name in a GraphQuantState) as a MindSpore dtype."""
    from .utils import dtype_from_name
    return dtype_from_name(dtype) if isinstance(dtype, str) else dtype


@constexpr
def _cname(namer, kind, dtype, extra=None):
    """The C entry point that ``bitsandbytes_ms.backends.native.<namer>`` (one per format: the one place C names are
    spelled) gives for ``kind`` and ``dtype`` (a MindSpore dtype, its name, or None), ``extra`` its last argument
    (the 4-bit quant_type, the weight-only bits), e.g. ``_cname("blockwise_name", "quantize", ms.float32)``."""
    from .backends import native
    from .utils import dtype_from_name
    dt = dtype_from_name(dtype) if isinstance(dtype, str) else dtype
    head = () if kind is None else (kind,)  # gemm_fp_name takes the dtype only
    return getattr(native, namer)(*head, dt, *(() if extra is None else (extra,)))


@constexpr
def _const_code(kind):
    """The default code tensors (the dynamic 8-bit map, the NF4/FP4 maps), as graph constants."""
    if kind == "dynamic":
        return _C._dynamic_code()
    return _C._code4(kind)


@constexpr
def _fail(exc, msg):
    raise exc(msg)


@constexpr
def _no_output_arg(fn, arg, given):
    if given:
        raise NotImplementedError(f"{fn}: `{arg}` (an output argument) is not supported under mindspore.jit / "
                                  f"GRAPH_MODE, where an op cannot write into a caller's tensor; use the return value")


@constexpr
def _check_dtype(dtype, allowed, fn, arg):
    from .utils import dtype_from_name
    if isinstance(dtype, str):
        dtype = dtype_from_name(dtype)
    if dtype not in allowed:
        raise ValueError(f"{fn}: `{arg}` must have dtype {', '.join(dtype_name(d) for d in allowed)}; got "
                         f"{dtype_name(dtype)}")


@constexpr
def _check_blocksize(blocksize, allowed, fn):
    if isinstance(blocksize, bool) or not isinstance(blocksize, (int, np.integer)):
        raise TypeError(f"{fn}: `blocksize` must be an int, got {type(blocksize).__name__}")
    if int(blocksize) not in allowed:
        raise ValueError(f"{fn}: `blocksize` must be one of {tuple(allowed)}; got {blocksize}")


@constexpr
def _check_numel(shape, n, fn, arg):
    if int(math.prod(shape)) != n:
        raise ValueError(f"{fn}: `{arg}` must have {n} entries; got {int(math.prod(shape))}")


@constexpr
def _nblocks(shape, blocksize):
    return -(-int(math.prod(shape)) // int(blocksize))


@constexpr
def _numel(shape):
    return int(math.prod(shape))


@constexpr
def _f32(x):
    return Tensor(np.float32(x))


_FLOAT = (ms.float32, ms.float16, ms.bfloat16)


def _reshape(t, shape):
    """``t.reshape(shape)``; MindSpore 2.7's CPU Reshape kernel (graph mode) has no bfloat16, so a bfloat16 tensor
    is reshaped as float32 (exact both ways for every value a kernel here writes)."""
    if t.dtype == ms.bfloat16:
        return ops.cast(ops.reshape(ops.cast(t, ms.float32), shape), ms.bfloat16)
    return ops.reshape(t, shape)


def _mean_f32(t):
    """``functional._mean_f32`` (the offset of double quantization): the sum in float64, rounded once to float32,
    divided by n in float32. numpy's float64 sum and MindSpore's can differ in the last float64 bit, which
    changes the float32 result only when it lies within 2^-29 of a rounding boundary."""
    s = ops.cast(ops.reduce_sum(ops.cast(ops.reshape(t, (-1,)), ms.float64)), ms.float32)
    return ops.div(s, _f32(max(_numel(t.shape), 1)))


# ---- blockwise 8-bit ----
def _quantize_blockwise(A, code, blocksize):
    return _prim(_cname("blockwise_name", "quantize", A.dtype), (blocksize,))(code, A, blocksize)


def _nested_state(A, qabsmax, amax, amax2, offset, code, code2, blocksize, blocksize2, quant_type):
    return graph_state(qabsmax, A.shape, code, blocksize, quant_type, A.dtype, offset,
                       graph_state(amax2, None, code2, blocksize2, None, ms.float32))


def quantize_blockwise(A, code=None, absmax=None, out=None, blocksize=4096, nested=False):
    fn = "quantize_blockwise"
    _check_dtype(A.dtype, _FLOAT, fn, "A")
    _check_blocksize(blocksize, _C.BLOCKWISE_BLOCKSIZES, fn)
    _no_output_arg(fn, "out", out is not None)
    _no_output_arg(fn, "absmax", absmax is not None)
    if code is None:
        code = _const_code("dynamic")
    _check_dtype(code.dtype, (ms.float32,), fn, "code")
    _check_numel(code.shape, 256, fn, "code")
    _check_nonempty(A.shape, fn, "A")
    q, amax = _quantize_blockwise(A, code, blocksize)
    if nested:
        offset = _mean_f32(amax)
        qabsmax, amax2 = _quantize_blockwise(ops.sub(amax, offset), code, blocksize)
        return q, _nested_state(A, qabsmax, amax, amax2, offset, code, code, blocksize, blocksize, None)
    return q, graph_state(amax, A.shape, code, blocksize, None, A.dtype)


def _dequantize_blockwise(A, code, amax, blocksize, dtype):
    return _prim(_cname("blockwise_name", "dequantize", dtype), ())(code, A, amax, blocksize)


def _absmax(state):
    """fp32 absmax of a state dict, undoing double quantization as ``functional`` does."""
    if "nested_absmax" in state:
        amax = ops.add(_dequantize_blockwise(state["absmax"], state["nested_quant_map"], state["nested_absmax"],
                                             state["nested_blocksize"], state["nested_dtype"]), state["nested_offset"])
        if amax.dtype != ms.float32:
            amax = ops.cast(amax, ms.float32)
        return amax
    return state["absmax"]


def dequantize_blockwise(A, quant_state=None, absmax=None, code=None, out=None, blocksize=4096, nested=False):
    fn = "dequantize_blockwise"
    _check_dtype(A.dtype, (ms.uint8,), fn, "A")
    _no_output_arg(fn, "out", out is not None)
    if quant_state is None:
        if absmax is None:
            _fail(ValueError, f"{fn} requires either `quant_state` or `absmax`")
        if code is None:
            code = _const_code("dynamic")
        st = graph_state(absmax, None, code, blocksize, None, ms.float32)
    else:
        st = as_graph_state(quant_state)
    _check_blocksize(st["blocksize"], _C.BLOCKWISE_BLOCKSIZES, fn)
    _check_dtype(st["quant_map"].dtype, (ms.float32,), fn, "code")
    _check_numel(st["quant_map"].shape, 256, fn, "code")
    _check_dtype(st["dtype"], _FLOAT, fn, "quant_state.dtype")
    _check_nonempty(A.shape, fn, "A")
    amax = _absmax(st)
    _check_dtype(amax.dtype, (ms.float32,), fn, "absmax")
    _check_numel(amax.shape, _nblocks(A.shape, st["blocksize"]), fn, "absmax")
    return _dequantize_blockwise(A, st["quant_map"], amax, st["blocksize"], st["dtype"])


# ---- 4-bit ----


@constexpr
def _check_nonempty(shape, fn, arg):
    if int(math.prod(shape)) == 0:
        raise NotImplementedError(f"{fn}: an empty `{arg}` is not supported under mindspore.jit / GRAPH_MODE")
















# ---- int8 (LLM.int8()) ----
@constexpr
def _check_threshold(threshold, fn):
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: `threshold` must be a float, got {type(threshold).__name__}")
    if not float(threshold) >= 0.0:
        raise ValueError(f"{fn}: `threshold` must be >= 0; got {threshold}")
    if float(threshold) > 0.0:
        raise NotImplementedError(f"{fn}: `threshold` > 0 (outlier columns, a data-dependent count) is not "
                                  f"supported under mindspore.jit / GRAPH_MODE")


@constexpr
def _check_rank(shape, fn, arg):
    if len(shape) < 1:
        raise ValueError(f"{fn}: `{arg}` must have at least 1 dimension(s); got shape {tuple(shape)}")
    if int(math.prod(shape)) == 0:
        raise NotImplementedError(f"{fn}: an empty `{arg}` is not supported under mindspore.jit / GRAPH_MODE")


def int8_vectorwise_quant(A, threshold=0.0):
    fn = "int8_vectorwise_quant"
    _check_dtype(A.dtype, _FLOAT, fn, "A")
    _check_rank(A.shape, fn, "A")
    _check_threshold(threshold, fn)
    CA, stats, _ = _prim(_cname("int8_name", "vector_quant", None), ())(A, 0.0)
    return CA, stats, None


@constexpr
def _no_preallocated(given):
    for name, v in given:
        if v:
            raise ValueError(f"{name} must be None. int8_double_quant() does not support pre-allocated {name}.")


def int8_double_quant(A, col_stats=None, row_stats=None, out_col=None, out_row=None, threshold=0.0):
    """``functional.int8_double_quant`` without outlier columns (threshold 0): the same MindSpore ops."""
    fn = "int8_double_quant"
    _no_preallocated((("row_stats", row_stats is not None), ("col_stats", col_stats is not None),
                      ("out_col", out_col is not None), ("out_row", out_row is not None)))
    CA, rstats, outlier_cols = int8_vectorwise_quant(A, threshold)
    K = A.shape[-1]
    a = ops.cast(_reshape(A, (-1, K)), ms.float32)
    cstats = ops.reduce_max(ops.abs(a), 0)
    # MindSpore's CPU max skips NaN; upstream's amax propagates it (a NaN column gets a NaN scale)
    cstats = ops.select(ops.any(ops.isnan(a), 0), ops.full_like(cstats, float("nan")), cstats)
    q = ops.round(ops.div(ops.mul(a, 127.0), ops.reshape(cstats, (1, K))))
    q = ops.select(ops.isfinite(q), q, ops.zeros_like(q))
    return CA, ops.reshape(ops.cast(q, ms.int8), A.shape), rstats, cstats, outlier_cols


@constexpr
def _check_matmul_shapes(a_shape, b_shape, fn):
    if len(b_shape) != 2:
        raise ValueError(f"{fn}: `B` must be 2-D [N, K]; got shape {tuple(b_shape)}")
    if a_shape[-1] != b_shape[-1]:
        raise ValueError(f"{fn}: inner dimensions do not match: `A` {tuple(a_shape)} @ `B`.T {tuple(b_shape)} "
                         f"(A.shape[-1] must equal B.shape[1])")
    if a_shape[-1] > _C.checks_int8_max_K or b_shape[0] == 0:
        raise NotImplementedError(f"{fn}: K > {_C.checks_int8_max_K} or N = 0 is not supported under "
                                  f"mindspore.jit / GRAPH_MODE")


def int8_linear_matmul(A, B, out=None, dtype=ms.int32):
    fn = "int8_linear_matmul"
    _check_dtype(A.dtype, (ms.int8,), fn, "A")
    _check_dtype(B.dtype, (ms.int8,), fn, "B")
    _check_dtype(dtype, (ms.int32,), fn, "dtype")
    _no_output_arg(fn, "out", out is not None)
    _check_rank(A.shape, fn, "A")
    _check_matmul_shapes(A.shape, B.shape, fn)
    return _prim(_cname("int8_name", "matmul", None), ())(A, B)[0]  # [1]: has_error, read only in the checking mode (cextension)


@constexpr
def _check_mm_dequant(a_shape, rs_shape, cs_shape, bias_shape, fn):
    N = a_shape[-1]
    rows = int(math.prod(a_shape[:-1]))
    if int(math.prod(rs_shape)) != rows:
        raise ValueError(f"{fn}: `row_stats` must have one value per row of `A` ({rows}); got {int(math.prod(rs_shape))}")
    if int(math.prod(cs_shape)) != N:
        raise ValueError(f"{fn}: `col_stats` must have A.shape[-1] = {N} values; got {int(math.prod(cs_shape))}")
    if bias_shape is not None and int(math.prod(bias_shape)) != N:
        raise ValueError(f"{fn}: `bias` must have A.shape[-1] = {N} values; got {int(math.prod(bias_shape))}")
    return rows, N


def mm_dequant(A, row_stats, col_stats, bias, dtype, fn):
    """``functional._mm_dequant`` without outlier columns: [rows, N] in ``dtype``."""
    _check_dtype(A.dtype, (ms.int32,), fn, "A")
    _check_dtype(row_stats.dtype, (ms.float32,), fn, "row_stats")
    _check_dtype(col_stats.dtype, (ms.float32,), fn, "col_stats")
    _check_rank(A.shape, fn, "A")
    _check_dtype(dtype, _FLOAT, fn, "dtype")
    if bias is None:
        rows, N = _check_mm_dequant(A.shape, row_stats.shape, col_stats.shape, None, fn)
    else:
        _check_dtype(bias.dtype, _FLOAT, fn, "bias")
        rows, N = _check_mm_dequant(A.shape, row_stats.shape, col_stats.shape, bias.shape, fn)
        bias = _reshape(bias, (N,))
    return _prim(_cname("int8_name", "mm_dequant", dtype), ())(
        A.reshape(rows, N), row_stats.reshape(rows), col_stats.reshape(N), bias)


def int8_mm_dequant(A, row_stats, col_stats, out=None, bias=None):
    fn = "int8_mm_dequant"
    _no_output_arg(fn, "out", out is not None)
    return mm_dequant(A, row_stats, col_stats, bias, ms.float16, fn)


def int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None):
    fn = "int8_scaled_mm"
    if dtype is None:
        dtype = ms.float16
    C = int8_linear_matmul(A, B)
    return _reshape(mm_dequant(C, row_stats, col_stats, bias, dtype, fn), C.shape)


@constexpr
def _dequant_scale():
    return float(np.float32(_C.INT8_DEQUANT_SCALE))


def int8_vectorwise_dequant(A, stats):
    fn = "int8_vectorwise_dequant"
    _check_dtype(A.dtype, (ms.int8,), fn, "A")
    _check_dtype(stats.dtype, (ms.float32,), fn, "stats")
    _check_rank(A.shape, fn, "A")
    rows = _numel(A.shape[:-1])
    _check_numel(stats.shape, rows, fn, "stats")
    out = ops.mul(ops.reshape(ops.cast(A, ms.float32), (rows, A.shape[-1])), ops.reshape(stats, (rows, 1)))
    out = ops.mul(out, _dequant_scale())
    return ops.reshape(out, A.shape)


# ---- the layers' forwards and backwards (autograd.MatMul4Bit, MatMul8bitLt; nn.cells) ----






_MATMUL_NT = ops.MatMul(transpose_b=True)








@constexpr
def _lt_threshold(threshold, state_threshold):
    """MatMul8bitLt's outlier threshold as PyNative takes it: ``threshold`` > 0 (bnb.matmul's argument, which sets
    the state's), else the state's; 0.0 (no outlier columns) unless that is > 0."""
    for t in (threshold, state_threshold):
        if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)):
            raise TypeError(f"matmul: `threshold` must be a float, got {type(t).__name__}")
    t = threshold if threshold > 0.0 else state_threshold
    return float(t) if t > 0.0 else 0.0


def int8_forward(A, CB, SCB, bias, threshold=0.0):
    """``autograd._int8_forward`` for an already quantized weight (CB int8 [N, K], SCB float32 [N]): float32
    activations quantized after a cast to float16, as upstream. ``threshold`` > 0 (outlier columns): the fused
    forward ``cint8_linear_<dtype>``, PyNative's inference call, whose result has a fixed shape (the outlier
    columns are found and multiplied inside it; bit for bit the unfused path)."""
    N = CB.shape[0]
    K = A.shape[-1]
    threshold = _lt_threshold(threshold, 0.0)
    if threshold > 0.0:
        _check_rank(A.shape, "matmul", "A")
        _check_matmul_shapes(A.shape, CB.shape, "matmul")
        if bias is not None:
            bias = _reshape(bias, (N,))
        out, _ = _prim(_cname("int8_name", "linear", A.dtype), ())(A, CB, _reshape(SCB, (N,)), bias, threshold)
        return out
    A2 = _reshape(A, (-1, K))
    Aq = ops.cast(A2, ms.float16) if A2.dtype == ms.float32 else A2
    CA, SCA, _ = int8_vectorwise_quant(Aq)
    out = int8_scaled_mm(CA, CB, SCA, SCB, bias=bias, dtype=A.dtype)
    return _reshape(out, A.shape[:-1] + (N,))


def int8_backward(A, CB, SCB, dout, bias):
    """``autograd._backward`` for a frozen int8 weight: (dA = dout @ dequant(CB) in A's dtype, dbias or None)."""
    N = CB.shape[0]
    d = ops.reshape(ops.cast(dout, ms.float32), (-1, N))
    W = _dequant_int8_weight(CB, SCB)
    gA = ops.cast(ops.reshape(ops.matmul(d, W), A.shape), A.dtype)
    if bias is None:
        return gA, None
    return gA, ops.cast(ops.reshape(ops.reduce_sum(d, 0), bias.shape), bias.dtype)


@constexpr
def _inv127():
    return float(np.float32(1.0 / 127.0))


def _dequant_int8_weight(CB, SCB):
    """``autograd._dequant_weight``: CB * (SCB / 127) in float32 ([N, K])."""
    return ops.mul(ops.cast(CB, ms.float32), ops.mul(ops.reshape(SCB, (-1, 1)), _inv127()))


def fp_forward(A, CB, SCB, bias):
    """``autograd._fp_forward`` (MatMul8bitFp, upstream's CPU training path): A @ dequant(CB).T (+ bias) in float32,
    returned in A's dtype."""
    N = CB.shape[0]
    K = A.shape[-1]
    a = ops.reshape(ops.cast(A, ms.float32), (-1, K))
    out = ops.matmul(a, ops.transpose(_dequant_int8_weight(CB, SCB), (1, 0)))
    if bias is not None:
        out = ops.add(out, ops.reshape(ops.cast(bias, ms.float32), (1, -1)))
    return ops.cast(ops.reshape(out, A.shape[:-1] + (N,)), A.dtype)


def _int8_weight(B, state):
    """(CB, SCB): the state's, or B (float) quantized row-wise after a cast to float16 for float32, as
    ``autograd._quantize_weight`` (the state is not written)."""
    if state is not None and state.CB is not None and state.SCB is not None:
        return state.CB, state.SCB
    Bq = ops.cast(B, ms.float16) if B.dtype == ms.float32 else B
    CB, SCB, _ = int8_vectorwise_quant(Bq)
    return CB, SCB


def matmul_8bit(A, B, state, bias, has_out, kind):
    """``MatMul8bitLt.apply`` (``kind`` "lt": :func:`int8_forward` with the state's threshold) and
    ``MatMul8bitFp.apply`` ("fp": :func:`fp_forward`)."""
    _check_dtype(A.dtype, _FLOAT, "matmul", "A")
    _no_output_arg("matmul", "out", has_out)
    CB, SCB = _int8_weight(B, state)
    if kind == "fp":
        return fp_forward(A, CB, SCB, bias)
    return int8_forward(A, CB, SCB, bias, state.threshold if state is not None else 0.0)


def graph_matmul(A, B, state=None, threshold=0.0, bias=None):
    """``bnb.matmul``'s forward (its graph form, named apart from MindSpore's ``ops.matmul``): as upstream,
    ``state.is_training`` (True for a fresh MatmulLtState) selects MatMul8bitFp (:func:`fp_forward`), otherwise
    MatMul8bitLt (:func:`int8_forward`, no outlier columns). B int8 with ``state.CB``/``state.SCB``, or float (quantized row-wise here, after a cast to float16 for float32, as
    ``autograd._quantize_weight``; the state is not written). Outlier columns (``threshold`` or
    ``state.threshold`` > 0) as PyNative's MatMul8bitLt (see :func:`int8_forward`)."""
    _check_dtype(A.dtype, _FLOAT, "matmul", "A")
    CB, SCB = _int8_weight(B, state)
    if state is None or state.is_training:
        return fp_forward(A, CB, SCB, bias)
    return int8_forward(A, CB, SCB, bias, _lt_threshold(threshold, state.threshold))


# ---- weight-only int8/int4 (W8A16 / W4A16) ----
@constexpr
def _check_weight_only(bits, q_dtype, q_shape, scale_shape, K, fn):
    if isinstance(bits, bool) or bits not in (8, 4):
        raise ValueError(f"{fn}: `bits` must be 8 or 4; got {bits!r}")
    want = ms.int8 if bits == 8 else ms.uint8
    if q_dtype != want:
        raise ValueError(f"{fn}: `q` must have dtype {dtype_name(want)}; got {dtype_name(q_dtype)}")
    N = int(math.prod(scale_shape))
    width = K if bits == 8 else (K + 1) // 2
    if len(q_shape) != 2 or tuple(q_shape) != (N, width):
        raise ValueError(f"{fn}: `q` must have shape [{N}, {width}] for {N} output channels, K={K}, bits={bits}; "
                         f"got {tuple(q_shape)}")
    if N * K == 0:
        raise NotImplementedError(f"{fn}: empty weights are not supported under mindspore.jit / GRAPH_MODE")
    return N


@constexpr
def _wo_bits(bits, fn):
    if isinstance(bits, bool) or bits not in (8, 4):
        raise ValueError(f"{fn}: `bits` must be 8 or 4; got {bits!r}")
    return bits


def quantize_weight_only(W, bits=8):
    fn = "quantize_weight_only"
    _check_dtype(W.dtype, _FLOAT, fn, "W")
    _check_2d(W.shape, fn)
    return _prim(_cname("weight_only_name", "quantize", W.dtype, _wo_bits(bits, fn)), ())(W)


@constexpr
def _check_2d(shape, fn):
    if len(shape) != 2:
        raise ValueError(f"{fn}: `W` must be 2-D [out_features, in_features]; got shape {tuple(shape)}")
    if int(math.prod(shape)) == 0:
        raise NotImplementedError(f"{fn}: empty weights are not supported under mindspore.jit / GRAPH_MODE")


@constexpr
def _wo_k(in_features, q_shape, bits):
    return int(in_features) if in_features is not None else int(q_shape[-1]) * (1 if bits == 8 else 2)


def _scale_f32(scale):
    s = ops.reshape(scale, (-1,)) if scale.dtype == ms.float32 else ops.cast(_reshape(scale, (-1,)), ms.float32)
    return s


def dequantize_weight_only(q, scale, in_features=None, bits=8, dtype=ms.float32, out=None):
    fn = "dequantize_weight_only"
    _no_output_arg(fn, "out", out is not None)
    _check_dtype(dtype, _FLOAT, fn, "dtype")
    K = _wo_k(in_features, q.shape, bits)
    _check_weight_only(bits, q.dtype, q.shape, scale.shape, K, fn)
    return _prim(_cname("weight_only_name", "dequantize", dtype, bits), (K,))(q, _scale_f32(scale), K)


@constexpr
def _wo_gemm_plan(a_shape, in_features, bias_shape, N, fn):
    if len(a_shape) == 0:
        raise ValueError(f"{fn}: `A` must have at least one dimension")
    K = int(a_shape[-1])
    if in_features is not None and K != int(in_features):
        raise ValueError(f"{fn}: `A` must have last dimension in_features = {int(in_features)}; got shape "
                         f"{tuple(a_shape)}")
    if bias_shape is not None and int(math.prod(bias_shape)) != N:
        raise ValueError(f"{fn}: `bias` must have {N} elements; got {int(math.prod(bias_shape))}")
    rows = int(math.prod(a_shape[:-1]))
    if rows == 0:
        raise NotImplementedError(f"{fn}: empty inputs are not supported under mindspore.jit / GRAPH_MODE")
    return rows <= _C.WEIGHT_ONLY_NATIVE_MAX_ROWS, rows


def gemm_weight_only(A, q, scale, bits=8, bias=None, out=None, in_features=None):
    """``functional.gemm_weight_only``: the native kernel up to ``WEIGHT_ONLY_NATIVE_MAX_ROWS`` rows, else the fp32
    weight and MindSpore's matmul (the same ops as PyNative)."""
    fn = "gemm_weight_only"
    _no_output_arg(fn, "out", out is not None)
    _check_dtype(A.dtype, _FLOAT, fn, "A")
    K = A.shape[-1]
    N = _check_weight_only(_wo_bits(bits, fn), q.dtype, q.shape, scale.shape, K, fn)
    s = _scale_f32(scale)
    if bias is None:
        native, rows = _wo_gemm_plan(A.shape, in_features, None, N, fn)
    else:
        native, rows = _wo_gemm_plan(A.shape, in_features, bias.shape, N, fn)
    if native:
        res = _prim(_cname("weight_only_name", "gemm", A.dtype, bits), ())(A, q, s)
        if bias is not None:
            res = ops.cast(ops.add(ops.cast(res, ms.float32), ops.cast(_reshape(bias, (-1,)), ms.float32)), A.dtype)
        return res
    W = _prim(_cname("weight_only_name", "dequantize", ms.float32, bits), (K,))(q, s, K)
    res = ops.matmul(ops.cast(_reshape(A, (rows, K)), ms.float32), ops.transpose(W, (1, 0)))
    if bias is not None:
        res = ops.add(res, ops.cast(_reshape(bias, (-1,)), ms.float32))
    return ops.cast(ops.reshape(res, A.shape[:-1] + (N,)), A.dtype)


# ---- full-precision linear (lm_head) ----
@constexpr
def _gemm_fp_plan(a_shape, a_dtype, w_shape, w_dtype, bias_shape, fn):
    if w_dtype != a_dtype:
        raise ValueError(f"{fn}: `W` must have A's dtype {dtype_name(a_dtype)}; got {dtype_name(w_dtype)}")
    if len(a_shape) == 0:
        raise ValueError(f"{fn}: `A` must have at least one dimension")
    if len(w_shape) != 2 or int(w_shape[1]) != int(a_shape[-1]):
        raise ValueError(f"{fn}: `W` must have shape [N, {int(a_shape[-1])}] (A.shape[-1] = K); got {tuple(w_shape)}")
    N = int(w_shape[0])
    if bias_shape is not None and int(math.prod(bias_shape)) != N:
        raise ValueError(f"{fn}: `bias` must have W.shape[0] = {N} elements; got {int(math.prod(bias_shape))}")
    rows = int(math.prod(a_shape[:-1]))
    if rows * N == 0:
        raise NotImplementedError(f"{fn}: empty inputs are not supported under mindspore.jit / GRAPH_MODE")
    return _C.gemm_fp_uses_native(rows, a_dtype) or int(a_shape[-1]) == 0, rows, N


def gemm_fp(A, W, bias=None, out=None):
    """``functional.gemm_fp``: the native kernel, or MindSpore's ``MatMul(transpose_b=True)`` for more fp32 rows."""
    fn = "gemm_fp"
    _no_output_arg(fn, "out", out is not None)
    _check_dtype(A.dtype, _FLOAT, fn, "A")
    if bias is None:
        native, rows, N = _gemm_fp_plan(A.shape, A.dtype, W.shape, W.dtype, None, fn)
        b = None
    else:
        _check_dtype(bias.dtype, _FLOAT, fn, "bias")
        native, rows, N = _gemm_fp_plan(A.shape, A.dtype, W.shape, W.dtype, bias.shape, fn)
        b = _reshape(bias, (N,))
    if native:
        return _prim(_cname("gemm_fp_name", None, A.dtype), ())(A, W, b)
    res = _MATMUL_NT(ops.reshape(A, (rows, A.shape[-1])), W)
    if b is not None:
        res = ops.add(res, ops.cast(b, res.dtype))
    return ops.reshape(res, A.shape[:-1] + (N,))
