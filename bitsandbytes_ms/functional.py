"""bitsandbytes' ``functional`` API on MindSpore.

Every public function validates its arguments (raising ``ValueError``/``TypeError`` that names the
argument, before any native code runs), makes inputs contiguous, and calls an op of the op layer
(:mod:`bitsandbytes_ms._ops`), which runs the active backend's kernel (the native library, or numpy where it
did not load) and tags the results for mindtorch. Results composed here of MindSpore ops are tagged once, at
the return (:func:`bitsandbytes_ms._ops.tag`). The hot inference paths (:func:`linear_4bit`, the int8 linear
plan) call the native backend's cached host-call handles directly.

Tensors are ``mindspore.Tensor`` (after ``import mindnlp``, ``torch.Tensor`` is the same class), so
these functions serve plain MindSpore code and mindnlp models alike.
"""

from __future__ import annotations

import itertools
import math
from typing import Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor

from . import _graph, _hostcall, _ops, _reference
from ._ops import tag as _tag
from ._formats_common import (  # noqa: F401  (upstream's names, re-exported; constants shared with _graph)
    BLOCKWISE_BLOCKSIZES, FOURBIT_BLOCKSIZES, GEMM_FP_NATIVE_MAX_ROWS, INT8_DEQUANT_SCALE, LINEAR_4BIT_MAX_ROWS,
    WEIGHT_ONLY_NATIVE_MAX_ROWS, _code4, _itemsize, as_uint8 as _raw_bytes, checks_int8_max_K, get_4bit_type,
    gemm_fp_uses_native, storage_view as _storage_view)
from .backends import native as _native
from .formats import fourbit as _fourbit
from .formats.fourbit import (  # noqa: F401  (the 4-bit format's names under their old spellings here)
    BF16_DOT_AUTO_MIN_ROWS, _4bit_size_errors, _BF16_DOT_ENV, _BF16_DOT_WORDS, _Linear4bitPlan, _NEVER,
    _bf16_dot_rows, _check_4bit_sizes, _lean_rows, _plan_4bit, _resolve_bf16_dot, _unmoved, _use_bf16_dot,
    bf16_dot_enabled, bf16_dot_one_row, bf16_gemv_applies, linear_4bit_compute, set_bf16_dot)
from .formats.int8 import (  # noqa: F401  (the int8 format's names under their old spellings here)
    Int8LinearPlan, _check_rank, _check_threshold, _int8_matmul_long_k, _mm_dequant, _outlier_flags,
    int8_double_quant, int8_linear, int8_linear_matmul, int8_linear_plan, int8_mixed_scaled_mm, int8_mm_dequant,
    int8_scaled_mm, int8_vectorwise_dequant, int8_vectorwise_quant)
from .formats.blockwise import (  # noqa: F401  (the blockwise format's names under their old spellings here)
    _mean_f32, dequantize_blockwise, quantize_blockwise)
from .formats.optim import (  # noqa: F401  (the optim format's names under their old spellings here)
    OPTIM_BLOCKSIZE, _OPT_ALIAS, _TWO_STATE, _check_numel, _check_optim_scalars, _optim_name,
    optimizer_update_32bit, optimizer_update_8bit_blockwise)
from .formats.weightonly import (  # noqa: F401  (the weightonly format's names under their old spellings here)
    _check_bits, _check_weight_only, _scale_f32, dequantize_weight_only, gemm_weight_only, quantize_weight_only)
from .quant_state import QuantState  # noqa: F401  (upstream: bitsandbytes.functional.QuantState)
from .cextension import BNB_BACKEND, get_ptr, lib  # noqa: F401  (get_ptr, lib re-exported as upstream)
from .utils import Singleton as _Singleton, dtype_from_name, dtype_name, pack_dict_to_tensor, to_numpy as _to_numpy
from .utils import NP_DTYPES as _NP_DTYPE  # the one dtype map
from .utils import unpack_tensor_to_dict  # noqa: F401  (upstream's functional imports it; QuantState's)

from ._formats_common import (  # noqa: F401  (the checks every format shares, written once there)
    FLOAT_DTYPES, FLOAT_SET as _FLOAT_SET, _check_blocksize, _check_dtype, _check_out, _check_tensor, _contiguous,
    _empty_np, _fn_name, _numel)
from ._hostcall import write_out as _write  # the out= rule every format follows
from ._formats_common import (  # noqa: F401  (the code maps _graph needs at compile time live there: no circle)
    _check_code_range, _check_map_bits, _dynamic_code, create_dynamic_map, name2qmap)



# ---------------------------------------------------------------------------------------------
# allocation (the argument checks every format shares live in _formats_common)
# ---------------------------------------------------------------------------------------------
def empty(shape, dtype=ms.float32) -> Tensor:
    """An uninitialised tensor of ``shape`` and ``dtype``: no zero fill and no numpy round trip.

    Uses MindSpore's C++ tensor constructor directly (``mint.empty`` is Ascend-only in MindSpore 2.7).
    Zero-size shapes are allowed. See ``tools/bench_cpu.py`` for its cost against ``ops.zeros``.
    """
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"empty: `shape` must be non-negative, got {shape}")
    return Tensor(shape=shape, dtype=dtype)


def empty_like(A: Tensor, dtype=None) -> Tensor:
    """``empty(A.shape, dtype or A.dtype)``."""
    _check_tensor(A, "empty_like", "A")
    return empty(A.shape, A.dtype if dtype is None else dtype)


# ---------------------------------------------------------------------------------------------
# code maps (upstream values, bit for bit)
# ---------------------------------------------------------------------------------------------


def create_linear_map(signed: bool = True, total_bits: int = 8, add_zero: bool = True) -> Tensor:
    """A linear code of ``2**total_bits`` values on [-1, 1] (signed) or [0, 1], padded with zeros
    in the middle to 256 entries. Same values as ``bitsandbytes.functional.create_linear_map``."""
    _check_map_bits("create_linear_map", 1, 8, total_bits=total_bits)
    sign = -1.0 if signed else 0.0
    total = 2**total_bits
    if add_zero or total_bits < 8:
        total = 2**total_bits if not signed else 2**total_bits - 1
    values = _reference.torch_linspace_f32(sign, 1.0, total)
    gap = 256 - values.size
    if gap:
        half = values.size // 2
        values = np.concatenate([values[:half], np.zeros(gap, np.float32), values[half:]])
    return Tensor(values.astype(np.float32))


def create_normal_map(offset: float = 0.9677083, use_extra_value: bool = True) -> Tensor:
    """The NormalFloat code (QLoRA, arXiv 2305.14314): quantiles of N(0, 1) between ``offset`` and
    0.5, normalised to [-1, 1]; 16 (or 15) non-zero values placed in a 256-entry table (float32).
    ``use_extra_value=True`` gives the asymmetric NF4 (8 negative, 7 positive values and 0).
    Needs scipy. Same values as upstream's ``create_normal_map``."""
    from scipy.stats import norm

    if not (isinstance(offset, (int, float, np.floating)) and 0.5 < offset < 1):
        raise ValueError(f"create_normal_map: `offset` must be a number in (0.5, 1) (a quantile of N(0, 1) above "
                         f"the median); got {offset!r}")
    pos = norm.ppf(_reference.torch_linspace_f32(offset, 0.5, 9 if use_extra_value else 8)[:-1])
    neg = -norm.ppf(_reference.torch_linspace_f32(offset, 0.5, 8)[:-1])
    zeros = np.zeros(256 - (15 if use_extra_value else 14))
    values = np.sort(np.concatenate([pos, zeros, neg]).astype(np.float32))
    values = values / values.max()
    return Tensor(values.astype(np.float32))


def create_fp8_map(signed: bool = True, exponent_bits: int = 5, precision_bits: int = 2, total_bits: int = 8) -> Tensor:
    """A minifloat code with ``exponent_bits`` exponent bits (bias ``2**(e-1)``) and
    ``precision_bits`` mantissa bits, normalised to [-1, 1] and zero-padded to 256 entries
    (float32). Same values as upstream's ``create_fp8_map``.

    Raises:
        ValueError: if ``exponent_bits + precision_bits + signed != total_bits``.
    """
    # (bounded: the loops below take 2**exponent_bits * 2**precision_bits steps; 8 overflows, checked at the end)
    _check_map_bits("create_fp8_map", 0, 8, exponent_bits=exponent_bits, precision_bits=precision_bits)
    _check_map_bits("create_fp8_map", 0, 17, total_bits=total_bits)
    has_sign = 1 if signed else 0
    if exponent_bits + precision_bits != total_bits - has_sign:
        raise ValueError(f"create_fp8_map: exponent_bits + precision_bits + sign bit must equal total_bits: "
                         f"`exponent_bits` {exponent_bits} + `precision_bits` {precision_bits} + `signed` {has_sign} "
                         f"!= `total_bits` {total_bits}")
    bias = 2 ** (exponent_bits - 1)
    values = []
    for evalue in range(2**exponent_bits):
        for bits in itertools.product([0, 1], repeat=precision_bits):
            v = 1.0 if evalue != 0 else 0.0
            for i, b in enumerate(bits):
                v += b * 2 ** -(i + 1)
            v = v * 2**-bias if evalue == 0 else v * 2 ** -(evalue - bias - 1)
            values.append(v)
            if signed:
                values.append(-v)
    values += [0.0] * (256 - len(values)) if total_bits < 8 else []
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        code = np.array(sorted(values), dtype=np.float32)
        code = code / code.max()
    _check_code_range(code, "create_fp8_map", "exponent_bits",  # 0 (and no precision bits) or >= 8 (overflows)
                      exponent_bits, "in [1, 7] (and exponent_bits + precision_bits >= 1)")
    return Tensor(code.astype(np.float32))


# get_4bit_type and the 4-bit code tables live in bitsandbytes_ms/_formats_common.py (imported above).


# ---------------------------------------------------------------------------------------------
# QuantState
# ---------------------------------------------------------------------------------------------
# :class:`QuantState` lives in bitsandbytes_ms/quant_state.py (imported above, re-exported under this name).


# ---- blockwise 8-bit: bitsandbytes_ms/formats/blockwise.py (re-exported above) ----
# ---- optimizer updates: bitsandbytes_ms/formats/optim.py (re-exported above) ----


# ---------------------------------------------------------------------------------------------
# ---- 4-bit (NF4/FP4) ----
# ---------------------------------------------------------------------------------------------
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
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.quantize_4bit(A, absmax, out, blocksize, compress_statistics, quant_type, quant_storage)
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
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.dequantize_4bit(A, quant_state, absmax, out, blocksize, quant_type)
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
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.gemv_4bit(A, B, out, transposed_A, transposed_B, state)
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
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.linear_4bit(A, B, quant_state, bias, bf16_dot)
    return _fourbit.linear_4bit(A, B, quant_state, bias, bf16_dot)  # the 4-bit format's PyNative form


# ---- int8 (LLM.int8()): bitsandbytes_ms/formats/int8.py (re-exported above) ----




# ---- weight-only int8/int4 (W8A16/W4A16): bitsandbytes_ms/formats/weightonly.py (re-exported above) ----

# ---- full-precision linear (the layers a quantized model keeps in full precision: lm_head) ----
_MATMUL_TB = None


def _matmul_tb():
    global _MATMUL_TB
    if _MATMUL_TB is None:
        _MATMUL_TB = ms.ops.MatMul(transpose_b=True)
    return _MATMUL_TB


def _check_gemm_fp(A, W, bias, fn: str) -> None:
    _check_dtype(A, FLOAT_DTYPES, fn, "A")
    _check_tensor(W, fn, "W")
    if W.dtype != A.dtype:
        raise ValueError(f"{_fn_name(fn, 'W')} must have A's dtype {dtype_name(A.dtype)}; got {dtype_name(W.dtype)}")
    if len(A.shape) == 0:
        raise ValueError(f"{_fn_name(fn, 'A')} must have at least one dimension")
    if len(W.shape) != 2 or int(W.shape[1]) != int(A.shape[-1]):
        raise ValueError(f"{_fn_name(fn, 'W')} must have shape [N, {int(A.shape[-1])}] (A.shape[-1] = K); "
                         f"got {tuple(W.shape)}")
    if bias is not None:
        _check_dtype(bias, FLOAT_DTYPES, fn, "bias")
        if _numel(bias) != int(W.shape[0]):
            raise ValueError(f"{_fn_name(fn, 'bias')} must have W.shape[0] = {int(W.shape[0])} elements; "
                             f"got {_numel(bias)}")


def gemm_fp(A: Tensor, W: Tensor, bias: Optional[Tensor] = None, out: Optional[Tensor] = None) -> Tensor:
    """Full-precision linear ``A @ W.T (+ bias)`` in A's dtype (what ``nn.Linear`` computes), for the layers a
    quantized model keeps in full precision (``lm_head``).

    Up to :data:`GEMM_FP_NATIVE_MAX_ROWS` rows of ``A`` the native kernel streams ``W`` once (fp16/bf16
    widened in registers) and accumulates in fp32 in a fixed order (:func:`bitsandbytes_ms._reference.gemm_fp`;
    the same bits at every SIMD level); more fp32 rows go to MindSpore's ``MatMul(transpose_b=True)``.

    Args:
        A: [..., K] float32/float16/bfloat16 activations.
        W: [N, K] weight, A's dtype. bias: optional [N] float tensor (added in fp32).
        out: optional [..., N] tensor of A's dtype.

    Raises:
        ValueError / TypeError: wrong dtypes or shapes (the message names the argument).
    """
    if _graph.compiling(A):  # mindspore.jit / GRAPH_MODE: the graph form (bitsandbytes_ms/_graph.py)
        return _graph.gemm_fp(A, W, bias, out)
    fn = "gemm_fp"
    _check_gemm_fp(A, W, bias, fn)
    K, N = int(A.shape[-1]), int(W.shape[0])
    out_shape = tuple(A.shape[:-1]) + (N,)
    _check_out(out, out_shape, A.dtype, fn)
    rows = int(math.prod(A.shape[:-1]))
    if rows * N == 0:
        return _write(out, _empty_np(out_shape, A.dtype), fn)
    b = None if bias is None else _contiguous(ms.ops.reshape(bias, (N,)))
    if gemm_fp_uses_native(rows, A.dtype) or K == 0:
        res = _ops.gemm_fp(_contiguous(A), _contiguous(W), b)
    else:
        # MindSpore ops throughout (their results carry no mindtorch device tag until the end)
        res = _matmul_tb()(ms.ops.reshape(_contiguous(A), (rows, K)), _contiguous(W))
        if b is not None:
            res = ms.ops.add(res, ms.ops.cast(b, res.dtype))
        res = ms.ops.reshape(res, out_shape)
    return _write(out, _tag(res, (A,)), fn)


# ---- upstream's remaining public names (issue 15) -------------------------------------------------------------
# Paging, cuBLAS contexts and the deprecated int8 matmul helpers exist upstream for CUDA; here they keep their
# names and contracts on MindSpore's CPU (no unified memory: a "paged" tensor is an ordinary host tensor marked
# ``is_paged``, and prefetching it does nothing).
class GlobalPageManager(_Singleton):
    """Upstream's registry of paged tensors (``get_instance()``, ``paged_tensors``, ``prefetch_all``)."""

    def initialize(self):
        self.paged_tensors = []

    def prefetch_all(self, to_cpu: bool = False) -> None:
        for t in self.paged_tensors[::-1]:
            prefetch_tensor(t, to_cpu)


class CUBLAS_Context(_Singleton):
    """Upstream's per-device cuBLAS handle cache; there is no cuBLAS handle to hold on the CPU library."""

    def initialize(self):
        self.context = {}

    def get_context(self, device=None):
        if BNB_BACKEND != "CUDA":
            raise RuntimeError("CUBLAS_Context: the CPU library has no cuBLAS context (the CUDA library creates "
                               "its handles itself)")
        return self.context.setdefault(getattr(device, "index", 0), None)


def get_paged(*shape, dtype=ms.float32, device=None) -> Tensor:
    """A zero-filled tensor marked ``is_paged`` (upstream: CUDA managed memory; here host memory)."""
    shape = tuple(int(s) for s in (shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape))
    out = Tensor(np.zeros(shape, dtype=_hostcall.np_dtype(dtype)))
    out.is_paged = True
    out.page_deviceid = getattr(device, "index", 0) or 0
    return out


def prefetch_tensor(A: Tensor, to_cpu: bool = False) -> None:
    """Upstream moves a paged tensor's pages to the GPU (or host); host memory needs nothing."""
    if not getattr(A, "is_paged", False):
        raise ValueError("prefetch_tensor: only paged tensors can be prefetched (A.is_paged is not set)")


def elementwise_func(func_name: str, A: Tensor, B: Optional[Tensor], value, prefetch: bool = True) -> None:
    """In-place ``fill`` (A[:] = value) and ``_mul`` (A *= B) on float32 / uint8 tensors, as upstream's
    ``cfill_*`` / ``c_mul_*``; any other name or dtype raises NotImplementedError as upstream does."""
    if A.dtype not in (ms.float32, ms.uint8) or func_name not in ("fill", "_mul"):
        raise NotImplementedError(f"Function not implemented: {func_name}")
    if func_name == "fill":
        A[...] = Tensor(np.asarray(value, dtype=_hostcall.np_dtype(A.dtype)))
        return
    if B is None or tuple(B.shape) != tuple(A.shape):
        raise ValueError(f"elementwise_func('_mul'): B must have A's shape {tuple(A.shape)}, got "
                         f"{None if B is None else tuple(B.shape)}")
    a = _to_numpy(A)
    A[...] = Tensor((a * _to_numpy(B).astype(a.dtype)).astype(a.dtype))


def fill(A: Tensor, value, device=None, prefetch: bool = True) -> None:
    elementwise_func("fill", A, None, value)


def _mul(A: Tensor, B: Tensor, device=None) -> None:
    elementwise_func("_mul", A, B, 0)


def is_on_gpu(tensors) -> bool:
    """Upstream's same-device check: True when the (non-None, non-paged) tensors are all on one device; mixing
    devices raises RuntimeError. MindSpore places tensors by context, so on this CPU library they always agree."""
    devices = set()
    for t in tensors:
        if t is not None and not getattr(t, "is_paged", False):
            dev = getattr(t, "device", "cpu")
            devices.add(str(getattr(dev, "type", dev)).split(":")[0].lower())
    if len(devices) > 1:
        raise RuntimeError(f"Input tensors need to be on the same device, but found {sorted(devices)}")
    return True


def has_avx512bf16() -> bool:
    """True when the CPU has AVX512-BF16 (upstream's CPU bf16 gemv_4bit runs there)."""
    from .cextension import cpu_features

    try:
        return "avx512_bf16" in cpu_features()
    except (AttributeError, RuntimeError, OSError):
        return False


def check_matmul(A, B, out, transposed_A, transposed_B, expected_type=ms.int8):
    """Upstream's deprecated shape check of an int8 matmul: the output shape of ``A @ B`` (with the given
    transposes) for 2-D x 2-D, 3-D x 2-D and 3-D x 3-D operands; TypeError on other dtypes, ValueError on
    shapes that do not multiply."""
    if A.dtype != expected_type or B.dtype != expected_type:
        raise TypeError(f"Expected {expected_type} input tensors A and B, but got {A.dtype} and {B.dtype}")
    sA, sB = tuple(A.shape), tuple(B.shape)
    kA = (sA[-2] if transposed_A else sA[-1]) if len(sA) >= 2 else None
    kB = (sB[-1] if transposed_B else sB[-2]) if len(sB) >= 2 else None
    if len(sA) not in (2, 3) or len(sB) not in (2, 3) or (len(sA) == 2 and len(sB) == 3) or kA != kB:
        raise ValueError(f"Tensor dimensions incorrect for matrix multiplication: A x B: {sA} x {sB} with "
                         f"transpose for A x B: {transposed_A} x {transposed_B}.")
    rows = sA[-1] if transposed_A else sA[-2]
    cols = sB[-2] if transposed_B else sB[-1]
    return (sA[0], rows, cols) if len(sA) == 3 else (rows, cols)


def _igemm_host(a: np.ndarray, b: np.ndarray, transposed_A: bool, transposed_B: bool) -> np.ndarray:
    """int32 ``op(a) @ op(b)`` of host int8 arrays (a 2-D or 3-D, b 2-D) through :func:`int8_linear_matmul`."""
    a = np.swapaxes(a, -1, -2) if transposed_A else a
    bt = b if transposed_B else b.T  # int8_linear_matmul takes B as [N, K]
    return int8_linear_matmul(Tensor(np.ascontiguousarray(a)), Tensor(np.ascontiguousarray(bt))).asnumpy()


def igemm(A: Tensor, B: Tensor, out: Optional[Tensor] = None, transposed_A: bool = False,
          transposed_B: bool = False) -> Tensor:
    """Upstream's deprecated int8 matmul ``A @ B`` (int32, exact) with optional transposes; A may be 3-D
    (its leading dimensions are rows); 3-D A and B run :func:`batched_igemm`. (A deprecated helper: the
    transposes are made on the host.)"""
    if B.ndim == 3:
        return batched_igemm(A, B, out, transposed_A, transposed_B)
    shape = check_matmul(A, B, out, transposed_A, transposed_B)
    res = _igemm_host(_to_numpy(A), _to_numpy(B), transposed_A, transposed_B)
    return _write(out, Tensor(res.reshape(shape)), "igemm")


def batched_igemm(A: Tensor, B: Tensor, out: Optional[Tensor] = None, transposed_A: bool = False,
                  transposed_B: bool = False) -> Tensor:
    """Upstream's deprecated batched int8 matmul: ``A[i] @ B[i]`` for 3-D A and B (int32, exact)."""
    if A.ndim != 3 or B.ndim != 3 or A.shape[0] != B.shape[0]:
        raise ValueError(f"batched_igemm: expected 3-D A and B with the same batch size, got {tuple(A.shape)} "
                         f"and {tuple(B.shape)}")
    shape = check_matmul(A, B, out, transposed_A, transposed_B)
    a, b = _to_numpy(A), _to_numpy(B)
    parts = [_igemm_host(a[i], b[i], transposed_A, transposed_B) for i in range(a.shape[0])]
    return _write(out, Tensor(np.stack(parts).reshape(shape)), "batched_igemm")
