"""What every format module and backend shares, below them all: blocksizes and row limits, the 4-bit codes, the
byte views of packed 4-bit tensors, the dtype sizes and the argument checks on tensors, dtypes and blocksizes
(issue 35's ``formats/_common``).

It imports nothing from this package but :mod:`bitsandbytes_ms.utils` and :mod:`bitsandbytes_ms._device_tag`,
so :mod:`bitsandbytes_ms.functional` (which re-exports these names under upstream's spelling),
:mod:`bitsandbytes_ms._graph` and :mod:`bitsandbytes_ms.backends` take them from here without import circles."""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import numpy as np
import mindspore as ms
from mindspore import Tensor

from . import _reference
from ._device_tag import tag as _tag
from .utils import ITEMSIZES as _ITEMSIZE, NP_DTYPES as _NP_DTYPE, dtype_name

#: Blocksizes accepted by blockwise 8-bit quantization: powers of two from 32 to 16384 (upstream's
#: CUDA kernels take 64..4096; its CPU kernel any size, and its CPU tests use 16384).
BLOCKWISE_BLOCKSIZES = tuple(2**k for k in range(5, 15))

#: Blocksizes accepted by 4-bit quantization (upstream's list).
FOURBIT_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)

#: Up to this many rows of activations a 4-bit linear forward is one fused native call (linear_4bit: the
#: gemv kernel for one row, the fused dequantize-GEMM for more); more rows (prefill of long prompts)
#: dequantize the weight to fp32 once and use MindSpore's matmul, which is faster there. Measured on the 2-core
#: Zen 4 EPYC (2026-12-06, min of 10-40 calls, the native call vs the fp32 weight + MindSpore's matmul): fp32 x,
#: 4096 x 4096 at 33 / 128 / 256 / 512 / 1024 rows 7 / 26 / 50 / 106 / 321 ms vs 47-57 / 66 / 91 / 122-143 / 186 ms
#: (11008 x 4096 alike; 576 x 576 even from 512); bf16 x (the bf16 dot kernel) 4.3 / 13 / - / 49 ms vs 64 / 66 / - /
#: 158. The AVX2 kernels (BNB_MS_SIMD=avx2, MindSpore's matmul still AVX-512) win up to 128 rows (4096 x 4096: 11 vs
#: 55 ms at 33), are even at 256 (87 vs 91; small weights 10-18% behind) and behind at 512 -- so 256 (it was 32).
LINEAR_4BIT_MAX_ROWS = 256

#: int8_vectorwise_dequant's scale, 1/127 as upstream writes it (rounded to float32 when applied).
INT8_DEQUANT_SCALE = 7.874015718698502e-3

#: Longest K of the int8 GEMM (csrc/checks/int8.h kIgemmMaxK: |sum| <= K * 2^14 < 2^31).
checks_int8_max_K = 131071

#: Rows of activations up to which :func:`gemm_weight_only` runs the native streaming kernel; above it
#: the weight is dequantized once (native) and multiplied with MindSpore's matmul.
WEIGHT_ONLY_NATIVE_MAX_ROWS = 16

#: Rows of activations up to which :func:`gemm_fp` runs the native kernel (``cgemm_fp_*``), per dtype;
#: above it MindSpore's ``MatMul(transpose_b=True)`` (fp32) is faster. ``None``: always native (MindSpore's
#: CPU matmul rejects bf16, and fp16 would need a float32 copy of the weight). Measured crossover:
#: see README ("Full-precision layers in a quantized model").
GEMM_FP_NATIVE_MAX_ROWS = {ms.float32: 16, ms.float16: None, ms.bfloat16: None}


def gemm_fp_uses_native(rows: int, dtype) -> bool:
    """Whether :func:`gemm_fp` runs the native kernel for ``rows`` rows of activations of ``dtype``."""
    limit = GEMM_FP_NATIVE_MAX_ROWS.get(dtype)
    return limit is None or rows <= limit


def _itemsize(dtype) -> int:
    return _ITEMSIZE.get(dtype, 1)  # a dict lookup: comparing MindSpore dtypes one by one costs ~1 us each


# ---- the 4-bit codes ----
_FOUR_BIT_TYPES = {
    # NF4: create_normal_map(0.9677083, True) restricted to its 16 values (upstream's canonical table)
    "nf4": [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
            -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
            0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
            0.7229568362236023, 1.0],
    # FP4 (1 sign, 2 exponent, 1 mantissa bit, bias 2) in bit-pattern order; normalised by 12
    # (upstream writes `-0`, a Python int, so index 8 is +0.0)
    "fp4": [0, 0.0625, 8.0, 12.0, 4.0, 6.0, 2.0, 3.0, 0, -0.0625, -8.0, -12.0, -4.0, -6.0, -2.0, -3.0],
    "int4": [7, 6, 5, 4, 3, 2, 1, 0, 0, -1, -2, -3, -4, -5, -6, -7],
}
# AbnormalFloat 4 (arXiv 2306.06965), defined for blocksize 64 only
_AF4_64 = [-1.0, -0.69441008, -0.51243739, -0.3736951, -0.25607552, -0.14982478, -0.04934812, 0.0,
           0.04273164, 0.12934483, 0.21961274, 0.31675666, 0.42563882, 0.55496234, 0.72424863, 1.0][::-1]


def get_4bit_type(typename: str, device=None, blocksize: int = 64) -> Tensor:
    """The 16-entry float32 code of a 4-bit type, indexed by the 4-bit value: ``"nf4"``, ``"fp4"``,
    ``"int4"``, or ``"af4"`` (blocksize 64 only), normalised by its largest magnitude.
    ``device`` is accepted for upstream compatibility and ignored.

    Raises:
        NotImplementedError: unknown ``typename``, or af4 with a blocksize other than 64.
    """
    if typename == "af4":
        if blocksize != 64:
            raise NotImplementedError("4-bit AbnormalFloats currently only support blocksize 64.")
        data = _AF4_64
    elif typename in _FOUR_BIT_TYPES:
        data = _FOUR_BIT_TYPES[typename]
    else:
        raise NotImplementedError(f"Typename {typename} not supported")
    arr = np.array(data, dtype=np.float32)
    return Tensor((arr / np.abs(arr).max()).astype(np.float32))


_code4_cache: Dict[str, Tensor] = {}


def _code4(quant_type: str) -> Tensor:
    if quant_type not in _code4_cache:
        _code4_cache[quant_type] = get_4bit_type(quant_type)
    return _tag(_code4_cache[quant_type])  # cached before mindtorch was imported: give it a device now


def code_4bit(quant_type: str) -> Tensor:
    """The 16-entry float32 code of ``quant_type`` ("nf4" | "fp4"), cached."""
    return _code4(quant_type)


# ---- bytes of packed 4-bit tensors ----
def storage_view(packed_u8: Tensor, quant_storage) -> Tensor:
    """Reinterprets packed uint8 bytes [(n+1)//2, 1] as ``quant_storage`` ([bytes/itemsize, 1])."""
    if quant_storage == ms.uint8:
        return packed_u8
    arr = packed_u8.asnumpy().reshape(-1)
    if quant_storage == ms.bfloat16:
        from ._reference import np_bfloat16
        # straight from the bytes: a round trip through float32 would canonicalise NaN bit patterns
        t = Tensor(arr.view(np.uint16).view(np_bfloat16).copy())
    else:
        t = Tensor(arr.view(_NP_DTYPE[quant_storage]).copy())
    return ms.ops.reshape(t, (-1, 1))


def as_uint8(A: Tensor) -> Tensor:
    """The raw bytes of a packed 4-bit tensor stored in any ``quant_storage`` dtype, as flat uint8."""
    if A.dtype == ms.uint8:
        return ms.ops.reshape(A, (-1,))
    raw = A.asnumpy().view(np.uint8)  # bf16 bits as stored (not via float32: NaN patterns would change)
    return Tensor(np.ascontiguousarray(raw).reshape(-1))


# ---- argument checks on shapes and dtypes (functional re-exports them; the format modules call them) ----
FLOAT_DTYPES = (ms.float32, ms.float16, ms.bfloat16)
FLOAT_SET = frozenset(FLOAT_DTYPES)  # a hash lookup: comparing MindSpore dtypes one by one costs ~1 us each


def _fn_name(fn: str, arg: str) -> str:
    return f"{fn}: `{arg}`"


def _check_tensor(t, fn: str, arg: str) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"{_fn_name(fn, arg)} must be a mindspore.Tensor, got {type(t).__name__}")


def _check_dtype(t: Tensor, allowed: Sequence, fn: str, arg: str) -> None:
    _check_tensor(t, fn, arg)
    if t.dtype not in allowed:
        names = ", ".join(dtype_name(d) for d in allowed)
        raise ValueError(f"{_fn_name(fn, arg)} must have dtype {names}; got {dtype_name(t.dtype)}")


def _check_blocksize(blocksize, allowed: Sequence[int], fn: str) -> int:
    if isinstance(blocksize, bool) or not isinstance(blocksize, (int, np.integer)):
        raise TypeError(f"{_fn_name(fn, 'blocksize')} must be an int, got {type(blocksize).__name__}")
    if int(blocksize) not in allowed:
        raise ValueError(f"{_fn_name(fn, 'blocksize')} must be one of {tuple(allowed)}; got {blocksize}")
    return int(blocksize)


def _contiguous(t: Tensor) -> Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _numel(t: Tensor) -> int:
    return int(math.prod(t.shape))


def _empty_np(shape, dtype) -> Tensor:
    """A zero-filled tensor (used for zero-size results, where there is nothing to compute)."""
    if dtype == ms.bfloat16:
        t = Tensor(np.zeros(tuple(shape), dtype=np.float32)).astype(dtype)
    else:
        t = Tensor(np.zeros(tuple(shape), dtype=_NP_DTYPE[dtype]))
    return _tag(t)


# ---------------------------------------------------------------------------------------------
# code maps (functional re-exports them; _graph reads the dynamic map at compile time, so they live here)
# ---------------------------------------------------------------------------------------------
name2qmap: Dict[str, Tensor] = {}


def _check_code_range(values: np.ndarray, fn: str, arg: str, value, expected: str) -> np.ndarray:
    """A code's entries must be finite and in [-1, 1] (quantize_blockwise maps x/absmax onto them): else a
    ValueError naming the argument that produced them."""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(values) | (np.abs(values) > 1)
    if bad.any():
        raise ValueError(f"{fn}: `{arg}` must be {expected}; got {value!r}, which gives entries outside [-1, 1] "
                         f"or non-finite ones (e.g. {values[bad][0]})")
    return values


def _check_map_bits(fn: str, lo: int, hi: int, **bits) -> None:
    """The code maps' bit counts: ints in [lo, hi] (a code has at most 256 entries), else an error naming them."""
    for name, v in bits.items():
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{fn}: `{name}` must be an int; got {type(v).__name__} {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"{fn}: `{name}` must be in [{lo}, {hi}]; got {v}")


def create_dynamic_map(signed: bool = True, max_exponent_bits: int = 7, total_bits: int = 8) -> Tensor:
    """The dynamic (tree) quantization code (Dettmers, "8-Bit Approximations for Parallelism in Deep
    Learning", arXiv 1511.04561): for exponent ``i`` a run of ``10**(i - max_exponent_bits + 1)``
    scaled bucket means, plus 0 and 1, sorted; 256 float32 entries. Same values as upstream."""
    _check_map_bits("create_dynamic_map", 0, 8, max_exponent_bits=max_exponent_bits, total_bits=total_bits)
    data = []
    non_sign_bits = total_bits - 1
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    i = 0
    for i in range(max_exponent_bits):
        items = int(2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed
                    else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1)
        b = _reference.torch_linspace_f32(0.1, 1, items)
        means = ((b[:-1] + b[1:]) / np.float32(2.0)).astype(np.float32)
        scale = np.float32(10 ** (-(max_exponent_bits - 1) + i))
        data += (scale * means).astype(np.float32).tolist()
        if signed:
            data += (-scale * means).astype(np.float32).tolist()
    if additional_items > 0:
        b = _reference.torch_linspace_f32(0.1, 1, additional_items + 1)
        means = ((b[:-1] + b[1:]) / np.float32(2.0)).astype(np.float32)
        scale = np.float32(10 ** (-(max_exponent_bits - 1) + i))
        data += (scale * means).astype(np.float32).tolist()
        if signed:
            data += (-scale * means).astype(np.float32).tolist()
    data += [0.0, 1.0]
    if len(data) != 2**total_bits:
        raise ValueError(f"create_dynamic_map: inconsistent max_exponent_bits/total_bits: `max_exponent_bits` "
                         f"{max_exponent_bits} gives {len(data)} values, `total_bits` {total_bits} needs "
                         f"2**total_bits = {2**total_bits}")
    data += [0.0] * (256 - len(data))
    code = _check_code_range(np.array(sorted(data), dtype=np.float32), "create_dynamic_map", "max_exponent_bits",
                             max_exponent_bits, ">= 1 (0 scales the last run by 10)")
    return Tensor(code)


def _dynamic_code() -> Tensor:
    if "dynamic" not in name2qmap:
        name2qmap["dynamic"] = create_dynamic_map()
    return _tag(name2qmap["dynamic"])  # cached before mindtorch was imported: give it a device now


# ---------------------------------------------------------------------------------------------
# out= buffers (every format's public functions take upstream's out= arguments; written by _hostcall.write_out)
# ---------------------------------------------------------------------------------------------
def _check_out(out: Optional[Tensor], shape, dtype, fn: str, arg: str = "out") -> None:
    if out is None:
        return
    _check_tensor(out, fn, arg)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{_fn_name(fn, arg)} must have shape {tuple(shape)}; got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise ValueError(f"{_fn_name(fn, arg)} must have dtype {dtype_name(dtype)}; got {dtype_name(out.dtype)}")


def _needs_input_grad(ctx):
    """``ctx.needs_input_grad`` as torch sets it for (A, B, out, bias, state) of upstream's autograd functions (the
    4-bit and int8 ones alike); every gradient when unset."""
    need = getattr(ctx, "needs_input_grad", None)
    return tuple(need) if need is not None else (True, True, False, True, False)
