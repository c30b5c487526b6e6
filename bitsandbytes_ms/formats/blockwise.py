"""The blockwise 8-bit format's one door (Dettmers et al., "8-bit Optimizers via Block-wise Quantization",
arXiv 2110.02861): quantize_blockwise / dequantize_blockwise with upstream 0.50.2's semantics (the dynamic map by
default, nested absmax), each with its graph form beside it (``_graph``). :mod:`bitsandbytes_ms.functional`
re-exports every name here; this module imports neither it nor any other format."""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

from .. import _graph, _ops
from .._formats_common import (BLOCKWISE_BLOCKSIZES, FLOAT_DTYPES, _check_blocksize, _check_dtype, _check_out,
                               _contiguous, _dynamic_code, _empty_np, _numel)
from ..quant_state import QuantState
from .._ops import tag as _tag
from .._hostcall import write_out as _write


def _mean_f32(t: Tensor) -> Tensor:
    """float32 mean as upstream gets it from ``torch.mean`` to within its summation order: the sum
    is taken in float64 and rounded once, then divided in float32 (matches torch's cascaded float32
    sum in most cases; the two can differ by a few ulps)."""
    a = t.asnumpy().astype(np.float64).reshape(-1)
    n = max(a.size, 1)
    return _tag(Tensor(np.float32(np.float32(a.sum()) / np.float32(n))), (t,))


def quantize_blockwise(A: Tensor, code: Optional[Tensor] = None, absmax: Optional[Tensor] = None,
                       out: Optional[Tensor] = None, blocksize: int = 4096, nested: bool = False
                       ) -> Tuple[Tensor, QuantState]:
    """Blockwise 8-bit quantization (upstream ``bitsandbytes.functional.quantize_blockwise``;
    Dettmers et al., arXiv 2110.02861).

    ``A`` is split into consecutive blocks of ``blocksize`` elements (the last may be partial); each
    block is scaled by its absolute maximum to [-1, 1] and every value is replaced by the index of
    the nearest entry of ``code``.

    Args:
        A: float32/float16/bfloat16 tensor of any shape (non-contiguous input is copied first).
        code: fp32 [256] code; default the signed dynamic map (:func:`create_dynamic_map`).
        absmax: optional fp32 [ceil(n/blocksize)] tensor that receives the absmax values.
        out: optional uint8 tensor shaped like ``A`` that receives the codes.
        blocksize: one of :data:`BLOCKWISE_BLOCKSIZES` (default 4096).
        nested: also quantize the absmax values (minus their mean) with the same blocksize.

    Returns:
        (uint8 tensor shaped like ``A``, :class:`QuantState`).

    Raises:
        ValueError: ``A`` not a 16/32-bit float tensor, blocksize not allowed, ``code`` not fp32
            [256], ``out``/``absmax`` of the wrong shape or dtype.
        TypeError: an argument is not a tensor / int.
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.quantize_blockwise(A, code, absmax, out, blocksize, nested)
    fn = "quantize_blockwise"
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    blocksize = _check_blocksize(blocksize, BLOCKWISE_BLOCKSIZES, fn)
    if code is None:
        code = _dynamic_code()
    _check_dtype(code, (ms.float32,), fn, "code")
    if _numel(code) != 256:
        raise ValueError(f"{fn}: `code` must have 256 entries; got {_numel(code)}")
    n = _numel(A)
    nblocks = -(-n // blocksize)
    _check_out(out, A.shape, ms.uint8, fn, "out")
    _check_out(absmax, (nblocks,), ms.float32, fn, "absmax")

    if n == 0:
        q, amax = _empty_np(A.shape, ms.uint8), _empty_np((0,), ms.float32)
    else:
        q, amax = _ops.quantize_blockwise(_contiguous(A), code, blocksize)

    if nested:
        offset = _mean_f32(amax)
        qabsmax, state2 = quantize_blockwise(amax - offset, blocksize=blocksize, nested=False)
        state = QuantState(absmax=qabsmax, code=code.copy(), blocksize=blocksize, dtype=A.dtype, offset=offset,
                           state2=state2, shape=A.shape)
    else:
        state = QuantState(absmax=amax, code=code.copy(), blocksize=blocksize, dtype=A.dtype, shape=A.shape)
    q = _write(out, q, fn)
    if absmax is not None and nested:
        # the buffer receives the block absmax it is declared for (fp32 [nblocks]); the state keeps its nested
        # uint8 codes (upstream copies those codes into the float buffer and makes it the state's absmax)
        _write(absmax, amax, fn, "absmax")
    elif absmax is not None:
        state.absmax = _write(absmax, state.absmax, fn, "absmax")
    return q, state


def dequantize_blockwise(A: Tensor, quant_state: Optional[QuantState] = None, absmax: Optional[Tensor] = None,
                         code: Optional[Tensor] = None, out: Optional[Tensor] = None, blocksize: int = 4096,
                         nested: bool = False) -> Tensor:
    """Inverse of :func:`quantize_blockwise` (upstream ``dequantize_blockwise``):
    ``out = code[A] * absmax[block]`` in ``quant_state.dtype`` (float32 when only ``absmax`` is given).

    Args:
        A: uint8 codes of any shape.
        quant_state: from :func:`quantize_blockwise`; if given, ``absmax``/``code``/``blocksize`` are ignored.
        absmax: fp32 [ceil(n/blocksize)] scales, when there is no ``quant_state``.
        code: fp32 [256] code (default dynamic map), when there is no ``quant_state``.
        out: optional tensor shaped like ``A`` in the output dtype.
        blocksize: when there is no ``quant_state``.

    Raises:
        ValueError: ``A`` not uint8; neither ``quant_state`` nor ``absmax``; blocksize not allowed;
            absmax length not ceil(n/blocksize); ``out`` of the wrong shape/dtype.
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.dequantize_blockwise(A, quant_state, absmax, code, out, blocksize, nested)
    fn = "dequantize_blockwise"
    _check_dtype(A, (ms.uint8,), fn, "A")
    if quant_state is not None and not isinstance(quant_state, QuantState):  # not an AttributeError further down
        raise TypeError(f"{fn}: `quant_state` must be a QuantState (from quantize_blockwise) or None; got "
                        f"{type(quant_state).__name__}")
    if quant_state is None and absmax is None:
        raise ValueError(f"{fn} requires either `quant_state` or `absmax`")
    if quant_state is None:
        quant_state = QuantState(absmax=absmax, code=code if code is not None else _dynamic_code(),
                                 blocksize=blocksize, dtype=ms.float32)
    bs = _check_blocksize(quant_state.blocksize, BLOCKWISE_BLOCKSIZES, fn)
    _check_dtype(quant_state.code, (ms.float32,), fn, "code")
    if _numel(quant_state.code) != 256:
        raise ValueError(f"{fn}: `code` must have 256 entries; got {_numel(quant_state.code)}")
    if quant_state.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{fn}: quant_state.dtype must be float32, float16 or bfloat16; got {quant_state.dtype}")
    _check_out(out, A.shape, quant_state.dtype, fn, "out")

    amax = quant_state.absmax
    if quant_state.nested:
        amax = dequantize_blockwise(quant_state.absmax, quant_state.state2) + quant_state.offset
        if amax.dtype != ms.float32:
            amax = amax.astype(ms.float32)
    _check_dtype(amax, (ms.float32,), fn, "absmax")
    n = _numel(A)
    if _numel(amax) != -(-n // bs):
        raise ValueError(f"{fn}: `absmax` must have ceil({n}/{bs}) = {-(-n // bs)} entries; got {_numel(amax)}")
    if n == 0:
        return _write(out, _empty_np(A.shape, quant_state.dtype), fn)
    res = _ops.dequantize_blockwise(_contiguous(A), _contiguous(amax), quant_state.code, bs, quant_state.dtype)
    return _write(out, res, fn)
