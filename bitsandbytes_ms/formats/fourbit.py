"""The 4-bit format's one door (NF4/FP4, QLoRA arXiv 2305.14314): its public functions (quantize_4bit,
dequantize_4bit, gemv_4bit, linear_4bit; :mod:`bitsandbytes_ms.functional` re-exports them under upstream's names),
each with its graph form beside it (``graph_<op>``: plain functions, which MindSpore's graph compiler parses, over
:mod:`bitsandbytes_ms._graph`'s helpers), the inference plan of a weight, the bf16-dot switch, the host-call forms of
``linear_4bit`` / ``linear_4bit_compute``, the autograd form (MatMul4Bit, matmul_4bit: upstream's
``bnb.matmul_4bit``; :mod:`bitsandbytes_ms.autograd._functions` re-exports them), and :func:`linear`, the one
function :class:`~bitsandbytes_ms.nn.Linear4bit` calls (issue 35: layers call one function per format and choose no
kernel).

The route of a layer's call (the lean re-pointed call, the compute-dtype call, the full call, the autograd form, or
the bias parameter cast first) is a function of the activation, compute and bias dtypes alone, so it is decided once
per weight's plan and dtypes (:func:`_route_of`) and read from the plan on every later call; where a host-call route
cannot serve a call, the door runs the autograd form. The functions on the layer's paths (linear_4bit, matmul_4bit,
_forward_4bit, MatMul4Bit.apply) are their graph form or their PyNative form (``_<op>_pynative``); the door, which
runs in PyNative only, calls the PyNative forms.

This module sits below :mod:`bitsandbytes_ms.functional` and :mod:`bitsandbytes_ms.autograd` and imports neither;
of the formats it imports only :mod:`~bitsandbytes_ms.formats.blockwise` (the double quantization of the absmax)."""

from __future__ import annotations

import math
import os
import warnings
from threading import get_ident as _get_ident
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, ops
from mindspore.ops import constexpr

from .. import _graph as _G, _hostcall, _ops, _reference
from .._formats_common import (BLOCKWISE_BLOCKSIZES, FLOAT_DTYPES, FLOAT_SET as _FLOAT_SET, FOURBIT_BLOCKSIZES,
                               LINEAR_4BIT_MAX_ROWS, _check_blocksize, _check_dtype, _check_out, _check_tensor,
                               _code4, _contiguous, _empty_np, _itemsize, _needs_input_grad, _numel,
                               as_uint8 as _raw_bytes, storage_view as _storage_view)
from ..backends import native as _native
from .._hostcall import write_out as _write
from .._ops import tag as _tag
from ..cextension import BNB_BACKEND, compiling as _compiling
from ..quant_state import QuantState
from ..utils import dtype_name
from .blockwise import _mean_f32, dequantize_blockwise, quantize_blockwise


# ---- the public functions (functional re-exports them under upstream's names) ----
#: dtypes a packed 4-bit tensor may be stored in (the uint8 bytes reinterpreted, as upstream's quant_storage).
FOURBIT_STORAGE = (ms.uint8, ms.int8, ms.float16, ms.bfloat16, ms.float32, ms.int16, ms.int32)


def _check_quant_type(quant_type, fn: str) -> str:
    if quant_type not in ("nf4", "fp4"):
        raise ValueError(f"{fn}: `quant_type` must be 'nf4' or 'fp4', got {quant_type!r}")
    return quant_type


def _as_uint8(A: Tensor) -> Tensor:
    """The raw bytes of a packed 4-bit tensor stored in any ``quant_storage`` dtype, as flat uint8."""
    return _tag(_raw_bytes(A), (A,))


def quantize_4bit(A: Tensor, absmax: Optional[Tensor] = None, out: Optional[Tensor] = None, blocksize=None,
                  compress_statistics: bool = False, quant_type: str = "fp4", quant_storage=ms.uint8
                  ) -> Tuple[Tensor, QuantState]:
    """Blockwise 4-bit quantization (upstream ``bitsandbytes.functional.quantize_4bit``; NF4/FP4 from
    QLoRA, Dettmers et al., arXiv 2305.14314).

    ``A`` (flattened) is split into blocks of ``blocksize`` elements (the last may be partial). Each
    block is scaled by its absmax and every value gets the 4-bit index of the nearest entry of the
    code (ties to the lower value), as upstream's CPU implementation does (``torch.bucketize`` on the
    midpoints of the sorted code). Two indices per byte: element ``2j`` in the high nibble, ``2j+1``
    in the low one; an odd count is padded with the code of 0.

    Args:
        A: float32/float16/bfloat16 tensor of any shape (non-contiguous input is copied first).
        absmax: optional fp32 [ceil(n/blocksize)] (uint8 when ``compress_statistics``) tensor that receives absmax.
        out: optional tensor of ``quant_storage`` dtype shaped like the result that receives it.
        blocksize: one of :data:`FOURBIT_BLOCKSIZES` (default 64).
        compress_statistics: also quantize the absmax (minus its mean, the ``offset``) with
            :func:`quantize_blockwise` at blocksize 256 (double quantization).
        quant_type: ``"fp4"`` (default) or ``"nf4"``.
        quant_storage: dtype the packed bytes are reinterpreted as (default uint8).

    Returns:
        (packed [(n+1)//2 bytes as [bytes/itemsize, 1]], :class:`QuantState`).

    Raises:
        ValueError: wrong dtype of ``A``, blocksize, quant_type, quant_storage or ``out``/``absmax``.
    """
    if _compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return graph_quantize_4bit(A, absmax, out, blocksize, compress_statistics, quant_type, quant_storage)
    fn = "quantize_4bit"
    if blocksize is None:
        blocksize = 64
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    blocksize = _check_blocksize(blocksize, FOURBIT_BLOCKSIZES, fn)
    _check_quant_type(quant_type, fn)
    if quant_storage not in FOURBIT_STORAGE:
        raise ValueError(f"{fn}: `quant_storage` must be one of {[dtype_name(d) for d in FOURBIT_STORAGE]}; "
                         f"got {quant_storage}")
    n = _numel(A)
    nbytes = (n + 1) // 2
    item = _itemsize(quant_storage)
    if nbytes % item:
        raise ValueError(f"{fn}: `quant_storage` {dtype_name(quant_storage)} must hold a whole number of "
                         f"{item}-byte words; `A` ({n} elements) packs into {nbytes} bytes")
    code = _code4(quant_type)
    if n == 0:
        packed, amax = _tag(_storage_view(_empty_np((0, 1), ms.uint8), quant_storage)), _empty_np((0,), ms.float32)
    else:
        packed, amax = _ops.quantize_4bit(_contiguous(A), blocksize, quant_type, quant_storage)
    _check_out(out, packed.shape, quant_storage, fn, "out")
    if compress_statistics and n:
        offset = _mean_f32(amax)
        qabsmax, state2 = quantize_blockwise(amax - offset, blocksize=256)
        state2.shape = None  # upstream's nested state has no shape (and from_dict restores none)
        state = QuantState(absmax=qabsmax, shape=A.shape, dtype=A.dtype, blocksize=blocksize, code=code.copy(),
                           quant_type=quant_type, offset=offset, state2=state2)
    else:
        state = QuantState(absmax=amax, shape=A.shape, dtype=A.dtype, blocksize=blocksize, code=code.copy(),
                           quant_type=quant_type)
    if absmax is not None:
        _check_out(absmax, state.absmax.shape, state.absmax.dtype, fn, "absmax")
        state.absmax = _write(absmax, state.absmax, fn, "absmax")
    return _write(out, packed, fn), state


def quantize_fp4(A: Tensor, absmax: Optional[Tensor] = None, out: Optional[Tensor] = None, blocksize=None,
                 compress_statistics: bool = False, quant_storage=ms.uint8):
    """:func:`quantize_4bit` with ``quant_type="fp4"``."""
    return quantize_4bit(A, absmax, out, blocksize, compress_statistics, "fp4", quant_storage)


def quantize_nf4(A: Tensor, absmax: Optional[Tensor] = None, out: Optional[Tensor] = None, blocksize=None,
                 compress_statistics: bool = False, quant_storage=ms.uint8):
    """:func:`quantize_4bit` with ``quant_type="nf4"``."""
    return quantize_4bit(A, absmax, out, blocksize, compress_statistics, "nf4", quant_storage)


def _absmax_4bit(state: QuantState) -> Tensor:
    """fp32 absmax of a 4-bit state, undoing double quantization (dequantize_blockwise + offset)."""
    amax = state.absmax
    if state.nested:
        amax = dequantize_blockwise(state.absmax, state.state2) + state.offset
        if amax.dtype != ms.float32:
            amax = amax.astype(ms.float32)
    return amax


def dequantize_4bit(A: Tensor, quant_state: Optional[QuantState] = None, absmax: Optional[Tensor] = None,
                    out: Optional[Tensor] = None, blocksize=None, quant_type: str = "fp4") -> Tensor:
    """Inverse of :func:`quantize_4bit` (upstream ``dequantize_4bit``): ``code[nibble] * absmax[block]``
    in fp32, rounded to ``quant_state.dtype``, shaped ``quant_state.shape``.

    Args:
        A: packed tensor (any ``quant_storage`` dtype).
        quant_state: from :func:`quantize_4bit`; without it both ``absmax`` and ``out`` are required
            (shape and dtype then come from ``out``).
        absmax, out, blocksize (default 64), quant_type: as upstream.

    Returns:
        The dequantized tensor. As upstream, a packed ``A`` of shape ``[1, m]`` with ``m > 1`` (a transposed
        view) gives the 2-D result transposed; a ``[1, 1]`` one (a weight of 1 or 2 values) is the weight itself
        (upstream transposes it too, giving a [2, 1] result for a [1, 2] weight).

    Raises:
        ValueError: neither quant_state nor absmax+out; bad blocksize/quant_type/dtype; packed bytes or absmax
            entries other than exactly what ``quant_state.shape`` and ``blocksize`` need.
    """
    if _compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return graph_dequantize_4bit(A, quant_state, absmax, out, blocksize, quant_type)
    fn = "dequantize_4bit"
    if blocksize is None:
        blocksize = 64
    _check_tensor(A, fn, "A")
    if quant_state is None:
        if absmax is None or out is None:
            raise ValueError("dequantize_4bit requires both absmax and out when quant_state is not provided")
        quant_state = QuantState(absmax=absmax, shape=out.shape, dtype=out.dtype, blocksize=blocksize,
                                 quant_type=quant_type, code=_code4(quant_type) if quant_type in ("nf4", "fp4") else None)
    bs = _check_blocksize(quant_state.blocksize, FOURBIT_BLOCKSIZES, fn)
    qt = _check_quant_type(quant_state.quant_type, fn)
    if quant_state.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{fn}: quant_state.dtype must be float32, float16 or bfloat16; got {quant_state.dtype}")
    if quant_state.shape is None:
        raise ValueError(f"{fn}: `quant_state.shape` must be the shape of the quantized tensor; got None")
    shape = tuple(quant_state.shape)
    n = int(math.prod(shape))
    transpose = len(A.shape) == 2 and A.shape[0] == 1 and A.shape[1] > 1 and len(shape) == 2
    res_shape = (shape[1], shape[0]) if transpose else shape
    _check_out(out, res_shape if out is not None and tuple(out.shape) == res_shape else shape, quant_state.dtype, fn)
    code = quant_state.code if quant_state.code is not None else _code4(qt)
    _check_dtype(code, (ms.float32,), fn, "quant_state.code")
    if _numel(code) != 16:
        raise ValueError(f"{fn}: `quant_state.code` must have 16 entries; got {_numel(code)}")
    _check_4bit_sizes(quant_state, _numel(A) * _itemsize(A.dtype), fn)
    amax = _absmax_4bit(quant_state)
    _check_dtype(amax, (ms.float32,), fn, "absmax")
    if n == 0:
        res = _empty_np(shape, quant_state.dtype)
    else:
        res = _ops.dequantize_4bit(_contiguous(A), _contiguous(amax), bs, qt, shape, quant_state.dtype, code)
    if transpose:
        res = res.t()
    if out is not None and tuple(out.shape) != tuple(res.shape):
        res = res.reshape(out.shape)
    return _write(out, res, fn)


def dequantize_fp4(A: Tensor, quant_state: Optional[QuantState] = None, absmax: Optional[Tensor] = None,
                   out: Optional[Tensor] = None, blocksize=None) -> Tensor:
    """:func:`dequantize_4bit` with ``quant_type="fp4"``."""
    return dequantize_4bit(A, quant_state, absmax, out, blocksize, "fp4")


def dequantize_nf4(A: Tensor, quant_state: Optional[QuantState] = None, absmax: Optional[Tensor] = None,
                   out: Optional[Tensor] = None, blocksize=None) -> Tensor:
    """:func:`dequantize_4bit` with ``quant_type="nf4"``."""
    return dequantize_4bit(A, quant_state, absmax, out, blocksize, "nf4")


def gemv_4bit(A: Tensor, B: Tensor, out: Optional[Tensor] = None, transposed_A: bool = False,
              transposed_B: bool = False, state: Optional[QuantState] = None) -> Tensor:
    """4-bit inference GEMV (upstream ``gemv_4bit``): ``A @ dequantize_4bit(B, state).T`` without
    materialising the weight. The native kernel streams the packed weight once, decodes nibbles in
    registers (AVX2: ``vpshufb`` on the code's 4 byte planes; AVX-512: 16-entry ``vpermps``), accumulates
    ``code * x`` in fp32 per absmax block and applies absmax once per block (fixed order, the same bits at
    every SIMD level).

    Args:
        A: [..., K] float32/float16/bfloat16 activations (normally one row; more rows are allowed).
        B: packed weight from :func:`quantize_4bit` of a [N, K] matrix (any quant_storage; ``B.t()`` accepted).
        out: optional [..., N] tensor of A's dtype.
        transposed_A, transposed_B: accepted for upstream compatibility (ignored, as upstream).
        state: the weight's :class:`QuantState` (nested absmax is dequantized first).

    Returns:
        [..., N] in A's dtype.

    Raises:
        ValueError: ``state`` missing, A not float, K != state.shape[1], packed bytes or absmax entries other than
            exactly what ``state.shape`` and ``state.blocksize`` need, or bad ``out``.
    """
    if _compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return graph_gemv_4bit(A, B, out, transposed_A, transposed_B, state)
    fn = "gemv_4bit"
    if state is None:
        raise ValueError("state cannot be None. gemv_4bit() requires the state from quantize_4bit()")
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    _check_tensor(B, fn, "B")
    if state.shape is None or len(state.shape) != 2:
        raise ValueError(f"{fn}: `state.shape` must be 2-D [N, K]; got {state.shape}")
    N, K = (int(x) for x in state.shape)
    if len(A.shape) == 0 or A.shape[-1] != K:
        raise ValueError(f"{fn}: `A` must have last dimension {K} (state.shape[1]); got shape {tuple(A.shape)}")
    bs = _check_blocksize(state.blocksize, FOURBIT_BLOCKSIZES, fn)
    out_shape = tuple(A.shape[:-1]) + (N,)
    _check_out(out, out_shape, A.dtype, fn)
    code = state.code
    _check_dtype(code, (ms.float32,), fn, "state.code")
    if _numel(code) != 16:
        raise ValueError(f"{fn}: `state.code` must have 16 entries (a 4-bit code); got {_numel(code)}")
    _check_4bit_sizes(state, _numel(B) * _itemsize(B.dtype), fn, "`B`", "state")
    if not state.nested:  # (named here: the host call below would name linear_4bit's `quant_state.absmax`)
        _check_dtype(state.absmax, (ms.float32,), fn, "state.absmax")
    if _numel(A) == K and N and _hostcall.active():
        # one row of inference: one host call of the same kernel (the double-quant absmax decoded in it, the
        # same bits as dequantizing it first), without ops.Custom's per-call cost (~1 ms for a 4096 x 4096
        # weight here, 3.4 ms for 11008 x 4096, against the kernel's 1.6 / 4.3 ms on one thread)
        return _write(out, linear_4bit(A, B, state, bf16_dot=False), fn)
    amax = _contiguous(_absmax_4bit(state))
    _check_dtype(amax, (ms.float32,), fn, "state.absmax")
    if _numel(A) == 0 or N == 0:
        return _write(out, _empty_np(out_shape, A.dtype), fn)
    res = _ops.gemv_4bit(_contiguous(A), _contiguous(B), (N, K), amax, code, bs)
    return _write(out, res, fn)


def linear_4bit(A: Tensor, B: Tensor, quant_state: QuantState, bias: Optional[Tensor] = None,
                bf16_dot: Optional[bool] = None) -> Tensor:
    """The inference forward of a 4-bit linear layer in one native call: ``A @ W.T (+ bias)`` with W the
    [N, K] weight behind the packed ``B`` and ``quant_state`` (NF4/FP4, with or without double quant).

    Numerics: one row of A gives exactly :func:`gemv_4bit`'s result (fp32 accumulation in the kernel's
    fixed order); 2+ rows run the fused dequantize-GEMM: the fp32 dequantized weight (``code * absmax``,
    decoded once per call and row, never stored as a matrix) times A in 16 fma lanes, in the fixed order
    csrc/cpu/fourbit.cpp documents (same bits at every SIMD level). bf16 ``A`` with ``bf16_dot`` (default: on
    where the CPU has AVX512-BF16, see :func:`set_bf16_dot`) runs the bf16 dot-product kernel instead
    (``clinear_4bit_bf16dot_bf16``; by default for 2+ rows; x and ``bf16(code * absmax)`` multiplied in pairs, accumulated in fp32 as
    vdpbf16ps does; within ``2^-6 (S + |bias|) + K 2^-22 S`` of the exact path, S = sum |x w|; the same bits
    with or without the instruction, at every SIMD level). The double-quant absmax is decoded in
    the kernel as ``dequantize_blockwise`` + offset computes it; ``bias`` is added to the result rounded to A's dtype, in fp32, and rounded again
    (as the unfused ``gemv_4bit(...) + bias`` does). In PyNative mode with no gradient being recorded the
    entry point runs as a host call (:mod:`bitsandbytes_ms._hostcall`), otherwise through ops.Custom. The
    weight's arrays are checked and prepared once per weight (cached on ``quant_state``).

    Args:
        A: [..., K] float32/float16/bfloat16.
        B: packed weight (any quant_storage; ``B.t()`` accepted).
        quant_state: its QuantState (2-D shape [N, K]).
        bias: optional [N] (cast to A's dtype).
        bf16_dot: bf16 ``A`` only: True runs the bf16 dot-product kernel, False the exact fp32-accumulation
            kernel, None (default) the process-wide choice (:func:`bf16_dot_enabled`).

    Returns:
        [..., N] in A's dtype.
    """
    if _compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return graph_linear_4bit(A, B, quant_state, bias, bf16_dot)
    return _linear_4bit_pynative(A, B, quant_state, bias, bf16_dot)  # the 4-bit format's PyNative form


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
#   * CPU with AVX512-BF16: the dot kernel for 2+ rows (batch 16: 2.41 ms vs 3.59 ms exact; up to 8 rows the
#     one-row kernel for each row where it applies, natively); for one row the one-row bf16 kernel where it applies
#     (bf16_gemv_applies: AVX-512 EPYC, 4096 -> 11008, 2 threads, 0.545 ms vs
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

    def host_args(self, B: Tensor, state: QuantState, bias: Optional[Tensor]) -> list:
        """The host arrays of the weight, its state and the bias (call argument order 1..7), read now: each
        tensor's own memory where it can be read in place. The bias keeps its own dtype: the caller, which knows
        the call's dtype, converts it."""
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
        args.append(None if bias is None else hv(v[6], bias))
        return args

    def host_call(self, dtype, dot: bool = False):
        """The bound host call for ``dtype`` on this thread, and the arrays it is bound to now (one per
        activation dtype, kernel (``dot``: the bf16 dot-product entry point) and thread: a bound call's arguments
        are re-pointed on every call, and ctypes releases the GIL while the kernel runs)."""
        key = (dtype, _get_ident(), dot)
        entry = self.calls.get(key)
        if entry is None:
            npdt = _hostcall.np_dtype(dtype)
            call = _native.linear_4bit_bound(
                dtype, dot, np.empty((1, self.K), npdt), np.empty(1, np.uint8), np.empty(1, np.float32),
                np.empty(16, np.float32), None, None, None, None, self.bs, self.bs2, self.N, np.empty((1, self.N), npdt))
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

    def _lean_entry(self, A: Tensor, dtype, bf16_dot, max_rows: int, slot: int, B: Tensor, bias: Optional[Tensor]):
        """``(entry, shape, rows)``: A's shape and rows, where a lean call takes it ([..., K] with 1..max_rows rows,
        K > 0; the rows choose the bf16 kernel), and this thread's bound call for ``dtype`` and that kernel whose
        lean record ``slot`` (0: :meth:`fast`, 1: :meth:`fast_compute`) was made with these very weight and bias
        objects; None where there is none."""
        K = self.K
        shape, rows = _hostcall.lean_rows(A, K, max_rows)
        if not rows:
            return None
        entry = self.calls.get((dtype, _get_ident(),
                                dtype == ms.bfloat16 and _use_bf16_dot(bf16_dot, rows, "linear_4bit", K, self.bs)))
        f = entry[2][slot] if entry is not None else None
        if f is None or f[1] is not bias:
            return None
        if f[0] is not B:
            # A new tensor over the same bytes at the same address: ``matmul_4bit(x, w.t())`` (upstream's Linear4bit
            # forward, and code ported from it) makes a fresh [1, n] view of the packed [n, 1] weight every call,
            # the same bytes in the same order. Its memory is read where it is now, so it is never stale.
            w0, p0, _ = f[2][0]
            if not (isinstance(B, Tensor) and B.is_contiguous() and B.storage_offset() == 0 and B.dtype == w0.dtype
                    and _numel(B) == _numel(w0) and B._data_ptr() == p0):
                return None
        return entry, shape, rows

    def fast(self, A: Tensor, B: Tensor, bias: Optional[Tensor], max_rows: int = 1 << 62,
             bf16_dot: Optional[bool] = None):
        """The lean host call: when this thread already ran a full call with these very weight/bias objects
        for A's dtype and kernel (``bf16_dot`` as :func:`linear_4bit` takes it) and none of the tensors it
        reads in place has moved (one address read each), only A and the output are re-pointed. Returns the
        result, or None (the caller runs the full path)."""
        dt = A.dtype
        lean = self._lean_entry(A, dt, bf16_dot, max_rows, 0, B, bias)
        if lean is None:
            return None
        entry, shape, rows = lean
        xa, xp = _hostcall.act_ptr(A)  # first: waits for everything queued before (in-place updates too)
        if not _hostcall.unmoved(entry[2][0][2]):
            return None
        out = np.empty(shape[:-1] + (self.N,), _hostcall.np_dtype(dt))
        entry[0].run_rows(0, xp, rows, self.K, 11, out)
        return _hostcall.wrap(out)

    def fast_compute(self, A: Tensor, B: Tensor, bias: Optional[Tensor], compute_dtype, max_rows: int = 1 << 62):
        """The lean form of :func:`linear_4bit_compute` (fp32 activations, 16-bit compute dtype), as :meth:`fast`:
        after one full call with these weight/bias objects on this thread, and nothing moved, A is rounded to the
        compute dtype and re-pointed with the output; an fp32 bias is converted from its own memory again (it may
        have been rewritten in place). Returns the fp32 result, or None (the caller runs the full call)."""
        if A.dtype != ms.float32:
            return None
        lean = self._lean_entry(A, compute_dtype, None, max_rows, 1, B, bias)
        if lean is None:
            return None
        entry, shape, rows = lean
        npdt = _hostcall.np_dtype(compute_dtype)
        xa = _hostcall.convert(_hostcall.act_array(A), npdt)  # first: waits for everything queued before (in-place updates too)
        if not _hostcall.unmoved(entry[2][1][2]):
            return None
        if bias is not None and bias.dtype != compute_dtype:
            b = _hostcall.convert(_hostcall.host_view(self.views[6], bias).reshape(-1), npdt)  # the bias's own memory
            entry[0].set(7, b)
            entry[1][7] = b
        out = np.empty(shape[:-1] + (self.N,), npdt)
        entry[0].run_rows(0, xa.ctypes.data, rows, self.K, 11, out)
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
    args = plan.host_args(B, quant_state, bias)
    if bias is not None and args[6].dtype != npdt:
        args[6] = _hostcall.convert(args[6], npdt)  # the bias in the compute dtype
    for i, arr in enumerate(args, 1):
        if arr is not bound[i]:
            call.set(i, arr)
            bound[i] = arr
    out = np.empty(shape[:-1] + (plan.N,), npdt)
    call.set(0, xa)
    call.set(11, out)
    call()
    fast[1] = plan.watch_of(B, quant_state, bias, bound, converted_bias=bias is not None and bias.dtype != compute_dtype)
    return _hostcall.wrap(_hostcall.convert(out, np.float32))


def _linear_4bit_pynative(A: Tensor, B: Tensor, quant_state: QuantState, bias: Optional[Tensor] = None,
                          bf16_dot: Optional[bool] = None) -> Tensor:
    """:func:`bitsandbytes_ms.functional.linear_4bit` in PyNative mode (its docstring tells the numerics): the lean
    call where this thread already ran the full one with these weight and bias objects, else the full call."""
    fn = "linear_4bit"  # (linear_4bit hands a graph being compiled to graph_linear_4bit before this)
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
    args = plan.host_args(B, quant_state, bias)
    if bias is not None and args[6].dtype != out.dtype:
        args[6] = _hostcall.convert(args[6], out.dtype)  # the bias in A's dtype
    for i, arr in enumerate(args, 1):
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


# ---- the graph forms (mindspore.jit / GRAPH_MODE: MindSpore parses their source; see _graph.py) ----
@constexpr
def _graph_check_quant_type(quant_type, fn):
    if quant_type not in ("nf4", "fp4"):
        raise ValueError(f"{fn}: `quant_type` must be 'nf4' or 'fp4', got {quant_type!r}")


@constexpr
def _check_storage(dtype, fn):
    if dtype != ms.uint8:
        raise NotImplementedError(f"{fn}: a packed weight stored as {dtype_name(dtype)} (quant_storage) is not "
                                  f"supported under mindspore.jit / GRAPH_MODE; quantize with quant_storage=uint8")


@constexpr
def _graph_check_4bit_sizes(shape, blocksize, packed_shape, packed_dtype, absmax_shape, fn, packed):
    """:func:`_4bit_size_errors` on constants."""
    if shape is None:
        raise ValueError(f"{fn}: `quant_state.shape` must be the shape of the quantized tensor; got None")
    n = int(math.prod(shape))
    nbytes = int(math.prod(packed_shape)) * _G._C._itemsize(packed_dtype)
    if nbytes != (n + 1) // 2:
        raise ValueError(f"{fn}: {packed} holds {nbytes} bytes; quant_state.shape {tuple(shape)} needs exactly "
                         f"{(n + 1) // 2} (two 4-bit codes a byte)")
    nb = -(-n // int(blocksize))
    if int(math.prod(absmax_shape)) != nb:
        raise ValueError(f"{fn}: quant_state.absmax has {int(math.prod(absmax_shape))} entries; quant_state.shape "
                         f"{tuple(shape)} at blocksize {blocksize} needs exactly ceil({n}/{blocksize}) = {nb}")


def _check_4bit_state(st, B, fn, packed):
    _G._check_blocksize(st["blocksize"], _G._C.FOURBIT_BLOCKSIZES, fn)
    _graph_check_quant_type(st["quant_type"], fn)
    _G._check_dtype(st["dtype"], _G._FLOAT, fn, "quant_state.dtype")
    _G._check_dtype(st["quant_map"].dtype, (ms.float32,), fn, "quant_state.code")
    _G._check_numel(st["quant_map"].shape, 16, fn, "quant_state.code")
    _graph_check_4bit_sizes(st["shape"], st["blocksize"], B.shape, B.dtype, st["absmax"].shape, fn, packed)
    _check_storage(B.dtype, fn)


def graph_quantize_4bit(A, absmax=None, out=None, blocksize=None, compress_statistics=False, quant_type="fp4",
                        quant_storage=ms.uint8):
    fn = "quantize_4bit"
    if blocksize is None:
        blocksize = 64
    _G._check_dtype(A.dtype, _G._FLOAT, fn, "A")
    _G._check_blocksize(blocksize, _G._C.FOURBIT_BLOCKSIZES, fn)
    _graph_check_quant_type(quant_type, fn)
    _G._no_output_arg(fn, "out", out is not None)
    _G._no_output_arg(fn, "absmax", absmax is not None)
    _check_storage(quant_storage, fn)
    _G._check_nonempty(A.shape, fn, "A")
    code = _G._const_code(quant_type)
    packed, amax = _G._prim(_G._cname("fourbit_name", "quantize", A.dtype, quant_type), (blocksize,))(code, A, blocksize)
    if compress_statistics:
        offset = _G._mean_f32(amax)
        code8 = _G._const_code("dynamic")
        qabsmax, amax2 = _G._quantize_blockwise(ops.sub(amax, offset), code8, 256)
        return packed, _G._nested_state(A, qabsmax, amax, amax2, offset, code, code8, blocksize, 256, quant_type)
    return packed, _G.graph_state(amax, A.shape, code, blocksize, quant_type, A.dtype)


def graph_dequantize_4bit(A, quant_state=None, absmax=None, out=None, blocksize=None, quant_type="fp4"):
    fn = "dequantize_4bit"
    _G._no_output_arg(fn, "out", out is not None)
    if quant_state is None:
        _G._fail(ValueError, f"{fn}: `quant_state` is required under mindspore.jit / GRAPH_MODE (without it upstream "
                          f"needs `out`, an output argument)")
    st = _G.as_graph_state(quant_state)
    _check_4bit_state(st, A, fn, "`A`")
    shape = st["shape"]
    n = _G._numel(shape)
    _G._check_nonempty(shape, fn, "A")
    amax = _G._absmax(st)
    res = _G._prim(_G._cname("fourbit_name", "dequantize", st["dtype"], st["quant_type"]), (n,))(
        st["quant_map"], ops.reshape(A, (-1,)), amax, st["blocksize"], n)
    res = _G._reshape(res, shape)
    if len(A.shape) == 2 and A.shape[0] == 1 and A.shape[1] > 1 and len(shape) == 2:
        res = ops.transpose(res, (1, 0))  # upstream's transposed-view case (see functional.dequantize_4bit)
    return res


@constexpr
def _check_gemv_shapes(shape, a_shape, fn):
    if shape is None or len(shape) != 2:
        raise ValueError(f"{fn}: `state.shape` must be 2-D [N, K]; got {shape}")
    if len(a_shape) == 0 or a_shape[-1] != shape[1]:
        raise ValueError(f"{fn}: `A` must have last dimension {shape[1]} (state.shape[1]); got shape {tuple(a_shape)}")
    if int(math.prod(a_shape)) == 0 or shape[0] == 0:
        raise NotImplementedError(f"{fn}: empty inputs are not supported under mindspore.jit / GRAPH_MODE")


def graph_gemv_4bit(A, B, out=None, transposed_A=False, transposed_B=False, state=None):
    fn = "gemv_4bit"
    _G._no_output_arg(fn, "out", out is not None)
    if state is None:
        _G._fail(ValueError, "state cannot be None. gemv_4bit() requires the state from quantize_4bit()")
    st = _G.as_graph_state(state)
    _G._check_dtype(A.dtype, _G._FLOAT, fn, "A")
    _check_gemv_shapes(st["shape"], A.shape, fn)
    _check_4bit_state(st, B, fn, "`B`")
    N = st["shape"][0]
    amax = _G._absmax(st)
    return _G._prim(_G._cname("fourbit_name", "gemv", A.dtype), (N,))(
        A, B.reshape(-1), amax, st["quant_map"], st["blocksize"], N)


@constexpr
def _linear4_plan(shape, a_shape, a_dtype, bias_shape, bf16_dot, blocksize, fn):
    """(N, rows, entry point) of :func:`linear_4bit` for these constants (the bf16 dot-product kernel where
    PyNative would choose it)."""
    if shape is None or len(shape) != 2:
        raise ValueError(f"{fn}: quant_state.shape must be 2D [N, K]")
    N, K = int(shape[0]), int(shape[1])
    if len(a_shape) == 0 or a_shape[-1] != K:
        raise ValueError(f"{fn}: `A` must have last dimension {K} (quant_state.shape[1]); got shape {tuple(a_shape)}")
    if bias_shape is not None and int(math.prod(bias_shape)) != N:
        raise ValueError(f"{fn}: `bias` must have {N} elements; got shape {tuple(bias_shape)}")
    rows = int(math.prod(a_shape[:-1]))
    if rows == 0 or N == 0:
        raise NotImplementedError(f"{fn}: empty inputs are not supported under mindspore.jit / GRAPH_MODE")
    dot = a_dtype == ms.bfloat16 and _use_bf16_dot(bf16_dot, rows, fn, K, blocksize)
    return N, rows, _native.linear_4bit_name(a_dtype, dot)  # the op layer's native backend spells the C names


def graph_linear_4bit(A, B, quant_state, bias=None, bf16_dot=None):
    fn = "linear_4bit"
    st = _G.as_graph_state(quant_state)
    _G._check_dtype(A.dtype, _G._FLOAT, fn, "A")
    if bias is None:
        N, rows, name = _linear4_plan(st["shape"], A.shape, A.dtype, None, bf16_dot, st["blocksize"], fn)
    else:
        _G._check_dtype(bias.dtype, _G._FLOAT, fn, "bias")
        N, rows, name = _linear4_plan(st["shape"], A.shape, A.dtype, bias.shape, bf16_dot, st["blocksize"], fn)
        if bias.dtype != A.dtype:
            bias = bias.astype(A.dtype)
    _check_4bit_state(st, B, fn, "`B`")
    raw = B.reshape(-1)
    if "nested_absmax" in st:
        return _G._prim(name, (N,))(A, raw, st["absmax"], st["quant_map"], st["nested_absmax"], st["nested_quant_map"],
                                 st["nested_offset"].reshape(()), bias, st["blocksize"], st["nested_blocksize"], N)
    return _G._prim(name, (N,))(A, raw, st["absmax"], st["quant_map"], None, None, None, bias, st["blocksize"], 256, N)  # bs2 unused: 256 as functional passes


@constexpr
def _use_linear_4bit(a_shape, a_dtype):
    return int(math.prod(a_shape[:-1])) <= _G._C.LINEAR_4BIT_MAX_ROWS and a_dtype in _G._FLOAT


def graph_dequant_weight_f32(B, quant_state):
    """:func:`_dequant_weight_f32`: the [N, K] weight in float32."""
    st = _G.as_graph_state(quant_state)
    W = graph_dequantize_4bit(ops.reshape(B, (-1, 1)), st)
    if W.dtype != ms.float32:
        W = ops.cast(W, ms.float32)
    return ops.reshape(W, st["shape"])


def graph_forward_4bit(A, B, quant_state, bias):
    """:func:`_forward_4bit`: one native call up to ``LINEAR_4BIT_MAX_ROWS`` rows, else the fp32 weight and
    MindSpore's matmul (the same ops, so the same bytes)."""
    st = _G.as_graph_state(quant_state)
    if _use_linear_4bit(A.shape, A.dtype):
        return graph_linear_4bit(A, B, st, bias)
    N = st["shape"][0]
    K = A.shape[-1]
    res = _G._MATMUL_NT(A.astype(ms.float32).reshape(-1, K), graph_dequant_weight_f32(B, st))
    if bias is not None:
        res = res + bias.astype(ms.float32)
    return res.reshape(A.shape[:-1] + (N,)).astype(A.dtype)


def graph_grad_4bit(A, B, quant_state, dout, bias):
    """:func:`_grad_4bit`: (dA, dbias or None). MindSpore's functional ops only (no Tensor methods), so it also
    runs in PyNative on tensors without mindtorch's device tag (a Cell's ``bprop``)."""
    st = _G.as_graph_state(quant_state)
    N = st["shape"][0]
    g = ops.reshape(ops.cast(dout, ms.float32), (-1, N))
    dA = ops.cast(ops.reshape(ops.matmul(g, graph_dequant_weight_f32(B, st)), A.shape), A.dtype)
    if bias is None:
        return dA, None
    return dA, ops.cast(ops.reshape(ops.reduce_sum(g, 0), bias.shape), bias.dtype)


# ---- the autograd form (MatMul4Bit, matmul_4bit: upstream's bnb.matmul_4bit; autograd._functions re-exports) ----
def _mm(a, b, like=()):
    """MindSpore matmul whose result carries a device tag (mindtorch needs one on every tensor)."""
    r = ms.ops.matmul(a, b)
    _tag(r, like=like)
    return r


_MATMUL_NT = ms.ops.MatMul(transpose_b=True)


def _mm_nt(a, b, like=()):
    """``a @ b.T`` with the transpose folded into the matmul: MindSpore's CPU matmul on a transposed view
    (``b.T``) is ~15x slower for a [11008, 4096] weight (it walks the strided view)."""
    r = _MATMUL_NT(a, b)
    _tag(r, like=like)
    return r


def _dequant_weight_f32(B, quant_state):
    """The [N, K] weight as float32 (MindSpore's CPU MatMul has no bf16, so 4-bit matmuls run in fp32)."""
    W = dequantize_4bit(B.reshape(-1, 1), quant_state)
    W = W.reshape(tuple(quant_state.shape))
    return W if W.dtype == ms.float32 else W.astype(ms.float32)


def _forward_4bit(A, B, quant_state, bias):
    """A[..., K] @ W[N, K]^T (+ bias) in A's dtype: up to ``LINEAR_4BIT_MAX_ROWS`` rows one
    native call (:func:`linear_4bit`: the gemv kernel per row, bias fused),
    otherwise dequantize to fp32, matmul in fp32, cast."""
    if _compiling(A):
        return graph_forward_4bit(A, B, quant_state, bias)
    return _forward_4bit_pynative(A, B, quant_state, bias)


def _forward_4bit_pynative(A, B, quant_state, bias):
    """:func:`_forward_4bit` in PyNative mode."""
    N = int(quant_state.shape[0])
    K = A.shape[-1]
    rows = int(math.prod(A.shape[:-1]))
    if rows > LINEAR_4BIT_MAX_ROWS or A.dtype not in FLOAT_DTYPES:  # the weight dequantized once, MindSpore's matmul
        W = _dequant_weight_f32(B, quant_state)
        a = A.reshape(-1, K).astype(ms.float32)
        res = _mm_nt(a, W, (A,))
        if bias is not None:
            res = res + bias.astype(ms.float32)
        return res.reshape(tuple(A.shape[:-1]) + (N,)).astype(A.dtype)
    return _linear_4bit_pynative(A, B, quant_state, bias)  # linear_4bit's PyNative form (the process's bf16 choice)


class MatMul4Bit(ms.nn.Cell):
    """4-bit linear with a custom backward (upstream ``MatMul4Bit``): forward as
    :func:`matmul_4bit`; backward gives ``dA = dout @ W`` (W dequantized, fp32, cast to A's dtype)
    and ``dbias = sum(dout)`` over the leading dimensions. No gradient for the packed weight.

    ``MatMul4Bit.apply(A, B, out=None, bias=None, quant_state=None)`` mirrors upstream's call.
    Gradients come from MindSpore autograd (``mindspore.grad``/``value_and_grad``, or mindtorch's
    ``torch.autograd.value_and_grad``), which uses :meth:`bprop`.
    """

    def __init__(self, B, quant_state, has_bias: bool):
        super().__init__()
        self.B = B
        self.quant_state = quant_state
        self.has_bias = has_bias

    def construct(self, A, bias):
        _tag((A, bias), like=(A,))
        return _forward_4bit(A, self.B, self.quant_state, bias if self.has_bias else None)

    def bprop(self, A, bias, out, dout):
        _tag((A, bias, out, dout), like=(A,))  # autograd hands over tensors without mindtorch's device tag
        dA, dbias = _grad_4bit(A, self.B, self.quant_state, dout, bias if self.has_bias else None)
        if dbias is None:
            dbias = ms.ops.zeros_like(bias)
            _tag(dbias, like=(A,))
        return dA, dbias

    @staticmethod
    def apply(A, B, out=None, bias=None, quant_state=None):
        if _compiling(A):  # in a graph: the forward (a Cell cannot be made there; nn.Linear4bitCell trains)
            return graph_forward_4bit(A, B, quant_state, bias)
        return _write(out, MatMul4Bit._apply_pynative(A, B, bias, quant_state))

    @staticmethod
    def _apply_pynative(A, B, bias, quant_state):
        """:meth:`apply` in PyNative mode, without ``out``: the cell made and called (autograd records it)."""
        cell = MatMul4Bit(B, quant_state, bias is not None)
        return cell(A, bias if bias is not None else Tensor(0.0, ms.float32))

    # upstream's torch.autograd.Function interface, for code that drives it by hand with a ctx object
    @staticmethod
    def forward(ctx, A, B, out=None, bias=None, quant_state=None):
        """Upstream's ``MatMul4Bit.forward(ctx, A, B, out, bias, quant_state)``: the forward of :func:`matmul_4bit`
        (no autograd recording); saves what :meth:`backward` needs on ``ctx``."""
        ctx.is_empty = math.prod(A.shape) == 0
        ctx.A, ctx.B, ctx.bias, ctx.state = A, B, bias, quant_state
        ctx.dtype_A, ctx.dtype_B, ctx.dtype_bias = A.dtype, B.dtype, None if bias is None else bias.dtype
        return _write(out, _forward_4bit(A, B, quant_state, bias))

    @staticmethod
    def backward(ctx, grad_output):
        """Upstream's five gradients ``(grad_A, grad_B, None, grad_bias, None)``: no gradient for the packed
        weight; None where ``ctx.needs_input_grad`` (if set) asks for none."""
        need = _needs_input_grad(ctx)
        dA, dbias = _grad_4bit(ctx.A, ctx.B, ctx.state, grad_output, ctx.bias)
        return dA if need[0] else None, None, None, dbias if need[3] else None, None


def _grad_4bit(A, B, quant_state, dout, bias):
    """Gradients of ``A @ W.T + bias`` for A (``dout @ W``, W dequantized in fp32, cast to A's dtype) and the bias
    (``dout`` summed over the leading dimensions; None without a bias)."""
    if _compiling(dout):
        return graph_grad_4bit(A, B, quant_state, dout, bias)
    N = int(quant_state.shape[0])
    g = dout.reshape(-1, N).astype(ms.float32)
    W = _dequant_weight_f32(B, quant_state)
    dA = _mm(g, W, (A,)).reshape(A.shape).astype(A.dtype)
    dbias = None if bias is None else g.sum(axis=0).reshape(bias.shape).astype(bias.dtype)
    return dA, dbias


def matmul_4bit(A, B, quant_state, out: Optional[Tensor] = None, bias: Optional[Tensor] = None):
    """``A @ dequantize_4bit(B, quant_state).T + bias`` (upstream ``bnb.matmul_4bit``).

    Args:
        A: [..., K] float activations.
        B: packed weight of a [N, K] matrix (``[(N*K+1)//2, 1]`` or its ``.t()``).
        quant_state: the weight's :class:`~bitsandbytes_ms.functional.QuantState` (2-D shape).
        out: optional [..., N] tensor of A's dtype.
        bias: optional [N].

    Single-row inputs use the native gemv kernel (reads the packed weight once); others dequantize
    to fp32 and use MindSpore's matmul. Differentiable w.r.t. ``A`` and ``bias`` (see :class:`MatMul4Bit`).

    As upstream 0.50.2, a weight quantized from a [K, N] tensor (``A``'s last dimension equals
    ``quant_state.shape[0]`` and not ``shape[1]``) still runs, with a DeprecationWarning.

    Raises:
        ValueError: quant_state missing or not 2-D; ``A``'s last dimension matches neither dimension of
            ``quant_state.shape``; ``B``'s bytes or the absmax entries other than exactly what
            ``quant_state.shape`` and ``blocksize`` need; ``bias`` or ``out`` of the wrong size.
    """
    if _compiling(A):  # mindspore.jit / GRAPH_MODE: the forward (bitsandbytes_ms/_graph.py; no autograd cell)
        return graph_forward_4bit(A, B, quant_state, bias)
    return _matmul_4bit_pynative(A, B, quant_state, out, bias)


def _matmul_4bit_pynative(A, B, quant_state, out: Optional[Tensor], bias: Optional[Tensor]):
    """:func:`matmul_4bit` in PyNative mode (the layer's autograd route calls it directly: the door runs in PyNative
    only). An empty A gives its empty result first; then the autograd cell where gradients are recorded (or no host
    call runs), else the forward itself."""
    fn = "matmul_4bit"
    if quant_state is None:
        raise ValueError("quant_state is required")
    if quant_state.shape is None or len(quant_state.shape) != 2:
        raise ValueError("matmul_4bit: quant_state.shape must be 2D [N, K]")
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    _check_tensor(B, fn, "B")
    _check_blocksize(quant_state.blocksize, FOURBIT_BLOCKSIZES, fn)
    _check_4bit_sizes(quant_state, _numel(B) * _itemsize(B.dtype), fn, "`B`")
    N, Kq = (int(x) for x in quant_state.shape)
    if len(A.shape) == 0:
        raise ValueError(f"{fn}: `A` must have at least one dimension, [..., {Kq}]; got a 0-d tensor")
    K = A.shape[-1]
    kn = K == N and K != Kq  # the deprecated [K, N] orientation: the result has shape[1] columns
    if not kn and K != Kq:
        raise ValueError(f"{fn}: `A` must have last dimension {Kq} (quant_state.shape[1]); got shape {tuple(A.shape)}")
    n_out = Kq if kn else N
    if bias is not None:
        _check_dtype(bias, FLOAT_DTYPES, fn, "bias")
        if _numel(bias) != n_out:
            raise ValueError(f"{fn}: `bias` must have {n_out} elements (the output features); got shape "
                             f"{tuple(bias.shape)}")
    _check_out(out, tuple(A.shape[:-1]) + (n_out,), A.dtype, fn)
    if not kn and math.prod(A.shape) == 0:  # (the deprecated orientation computes its own empty result)
        return _write(out, _empty_np(tuple(A.shape[:-1]) + (N,), A.dtype))
    if kn:
        warnings.warn(f"matmul_4bit: weight was quantized from a [K, N] tensor (quant_state.shape={list(quant_state.shape)}). "
                       "Re-quantize from the weight in [N, K] (out_features, in_features) orientation. "
                       "This will be an error in a future version.", DeprecationWarning, stacklevel=3)
        W = _dequant_weight_f32(B, quant_state)
        res = _mm(A.reshape(-1, K).astype(ms.float32), W, (A,))
        if bias is not None:
            res = res + bias.astype(ms.float32)
        return _write(out, res.reshape(tuple(A.shape[:-1]) + (Kq,)).astype(A.dtype))
    if not _hostcall.active():  # gradients recorded (or no host call here): the autograd cell
        return _write(out, MatMul4Bit._apply_pynative(A, B, bias, quant_state))
    return _write(out, _forward_4bit_pynative(A, B, quant_state, bias))  # inference: the forward itself


# ---- the layer's door ----
def linear(x: Tensor, weight: Tensor, state: QuantState, bias: Optional[Tensor], compute_dtype,
           owner: str = "Linear4bit") -> Tensor:
    """Linear4bit's forward: ``x @ W.T + bias`` computed in ``compute_dtype`` (None: x's own dtype) and returned in
    x's dtype, by the call that the route of these dtypes names (:func:`_route_of`, decided once per weight's plan and
    dtypes, and kept on the plan): the lean or full host call of the same dtype, or the fp32-input / 16-bit compute
    call. What no host call serves -- gradients recorded, more than LINEAR_4BIT_MAX_ROWS rows, another width, dtypes
    no host call takes -- the autograd form serves (:func:`_route_autograd`: :func:`matmul_4bit`, as upstream's layer
    computes it). A bias of another dtype than the compute dtype is cast first, the parameter itself and once, as
    upstream's layer does. ``owner`` names the layer in the error raised for an x that is not [..., K]."""
    plan = state.__dict__.get("_linear_plan")
    xdt, bdt = x.dtype, None if bias is None else bias.dtype
    if plan is None or not plan.matches(state):  # the first call of this weight (or of a replaced state)
        res = _route_of(xdt, compute_dtype, bdt)(None, x, weight, state, bias, compute_dtype, owner)
    else:
        for r in plan.routes:  # MindSpore's dtypes are singletons: `is` finds the route (`==` and hashing cost ~2 us)
            if r[0] is xdt and r[1] is compute_dtype and r[2] is bdt:
                res = r[3](plan, x, weight, state, bias, compute_dtype, owner)
                break
        else:
            res = _new_route(plan, xdt, compute_dtype, bdt)(plan, x, weight, state, bias, compute_dtype, owner)
    if res is None:  # no host call serves this call: the autograd form
        return _route_autograd(plan, x, weight, state, bias, compute_dtype, owner)
    return res


def _new_route(plan: Linear4bitPlan, xdt, cdt, bdt):
    route = _route_of(xdt, cdt, bdt)
    if len(plan.routes) < 16:  # (a bound, should some dtype object ever not be the singleton)
        plan.routes.append((xdt, cdt, bdt, route))
    return route


def _route_of(xdt, cdt, bdt):
    """The call for these x, compute and bias dtypes: it depends on the dtypes alone, so each plan asks once. A
    route returns the result, or None where its host call cannot serve this call (the door then runs the autograd
    form)."""
    cdt = cdt or xdt
    if bdt is not None and bdt != cdt and cdt in _FLOAT_SET:
        return _route_cast_bias  # the bias parameter is cast to the compute dtype once (upstream), then routed anew
    if xdt not in _FLOAT_SET or (bdt is not None and bdt != cdt):
        return _route_autograd
    if xdt == cdt:
        return _route_same
    if xdt == ms.float32 and cdt in (ms.bfloat16, ms.float16):
        return _route_compute
    return _route_autograd  # an fp16 x with an fp32 compute dtype: the autograd form, as upstream computes it


def _route_same(plan, x, weight, state, bias, compute_dtype, owner):
    """x already in the compute dtype: the lean call (:meth:`Linear4bitPlan.fast`), else the full linear_4bit; None
    where neither serves (gradients recorded, too many rows, another width)."""
    if _hostcall.active():
        if plan is not None:
            res = plan.fast(x, weight, bias, LINEAR_4BIT_MAX_ROWS)
            if res is not None:
                return res
        if _fits(x, state):
            return _linear_4bit_full(x, weight, state, bias, None)
    return None


def _route_compute(plan, x, weight, state, bias, compute_dtype, owner):
    """fp32 x with a 16-bit compute dtype: the lean form of linear_4bit_compute, else the full one (x rounded to the
    compute dtype, the layer, the result widened back, in one host call); None where neither serves."""
    if _hostcall.active():
        if plan is not None:
            res = plan.fast_compute(x, weight, bias, compute_dtype, LINEAR_4BIT_MAX_ROWS)
            if res is not None:
                return res
        if _fits(x, state):
            return linear_4bit_compute(x, weight, state, bias, compute_dtype)
    return None


def _route_cast_bias(plan, x, weight, state, bias, compute_dtype, owner):
    """A bias of another dtype than the compute dtype: as upstream's layer, the bias parameter itself is cast (once:
    the next call finds it in the compute dtype), then the call goes the route of the new dtypes."""
    _check_width(x, state, owner)  # (an x the layer refuses leaves its bias as it was)
    data = bias.data.to(compute_dtype or x.dtype)
    if not hasattr(data, "_device"):
        _tag(data)  # mindtorch's device tag
    bias.data = data
    return _route_of(x.dtype, compute_dtype, bias.dtype)(plan, x, weight, state, bias, compute_dtype, owner)


def _route_autograd(plan, x, weight, state, bias, compute_dtype, owner):
    """The layer's autograd form, upstream's forward: x cast to the compute dtype, :func:`matmul_4bit` with the
    packed weight's ``.t()`` (MatMul4Bit where gradients are recorded; its PyNative form: the door never runs in a
    graph), the result cast back to x's dtype."""
    _check_width(x, state, owner)
    inp_dtype = x.dtype
    if compute_dtype is not None:
        x = x.to(compute_dtype)
    return _matmul_4bit_pynative(x, weight.t(), state, None, bias).to(inp_dtype)


def _check_width(x: Tensor, state: QuantState, owner: str) -> None:
    """The layer's check of x: [..., K] (never matmul_4bit's deprecated [K, N] branch: the weight is [N, K])."""
    if state.shape is not None and x.shape[-1] != int(state.shape[1]):
        raise ValueError(f"{owner}: `x` must have last dimension {int(state.shape[1])} (in_features); got shape "
                         f"{tuple(x.shape)}")


def _fits(x: Tensor, state: QuantState) -> bool:
    """Whether the fused call serves x: [..., K] (another width: the autograd form raises the layer's error) with at
    most LINEAR_4BIT_MAX_ROWS rows (more: dequantize once and MindSpore's matmul, the autograd form, is faster)."""
    shape, s = x.shape, state.shape
    if s is not None and len(s) == 2 and shape[-1] != s[1]:
        return False
    return math.prod(shape[:-1]) <= LINEAR_4BIT_MAX_ROWS
