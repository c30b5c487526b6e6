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
    BF16_DOT_AUTO_MIN_ROWS, FOURBIT_STORAGE, _4bit_size_errors, _BF16_DOT_ENV, _BF16_DOT_WORDS, _Linear4bitPlan,
    _NEVER, _absmax_4bit, _as_uint8, _bf16_dot_rows, _check_4bit_sizes, _check_quant_type, _plan_4bit,
    _resolve_bf16_dot, _use_bf16_dot, bf16_dot_enabled, bf16_dot_one_row, bf16_gemv_applies,
    dequantize_4bit, dequantize_fp4, dequantize_nf4, gemv_4bit, linear_4bit, linear_4bit_compute, quantize_4bit,
    quantize_fp4, quantize_nf4, set_bf16_dot)
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

# ---- 4-bit (NF4/FP4): bitsandbytes_ms/formats/fourbit.py (re-exported above) ----
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
