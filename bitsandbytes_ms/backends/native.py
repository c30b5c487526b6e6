"""The native backend: the kernels of :mod:`bitsandbytes_ms._ops` on the native library (``"cpu"`` and ``"cuda"``).

Each kernel picks the C entry point of its op for the arguments' dtype (the rows of
:mod:`bitsandbytes_ms._native_table`, named ``c<op>_<fp32|fp16|bf16>`` as upstream names its symbols) and runs it
through :data:`bitsandbytes_ms.cextension.lib` (``ops.Custom``). The CPU and the CUDA library export the same names
with the same arguments, so every kernel here is registered for both; the CPU-only entry points (the bf16
dot-product 4-bit kernel) are chosen only on the CPU. This module is the one place that spells C symbol names.

Hot inference paths (:func:`bitsandbytes_ms.functional.linear_4bit`, the int8 linear plan) take their host calls
(:func:`linear_4bit_bound`, bound here; :func:`int8_linear_entry`, bound by the plan) once and call them
(:mod:`bitsandbytes_ms._hostcall`); the optimizer kernels take the host call themselves where it is available.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor

from .. import _hostcall, _ops, cextension
from ..cextension import check_host_status
from .._native_table import OPTIM_32BIT_NAMES, OPTIM_8BIT_BLOCKWISE_NAMES
from ..utils import SUFFIX_OF_DTYPE as _SUFFIX
from .._formats_common import as_uint8, code_4bit, storage_view

NATIVE = ("cpu", "cuda")
_FLOAT_ORDER = tuple(_SUFFIX)  # fp32, fp16, bf16: the order of the optimizer rows of the C ABI table


def _fn(name: str):
    return getattr(cextension.lib, name)


# ---- the C names of the ops (the only place they are spelled): one function per format ----
# The kernels below, the host-call handles and the graph forms (bitsandbytes_ms/_graph.py) all take their entry
# point from these. ``dtype``: the MindSpore dtype of the activations (quantize, gemv, linear, gemm) or of the
# output (dequantize, mm_dequant).
def _kind(fmt: str, kind, kinds) -> str:
    if kind not in kinds:
        raise ValueError(f"{fmt}: `kind` must be one of {kinds}; got {kind!r}")
    return kind


def blockwise_name(kind: str, dtype) -> str:
    """Blockwise 8-bit: ``kind`` "quantize" | "dequantize"."""
    return f"c{_kind('blockwise_name', kind, ('quantize', 'dequantize'))}_blockwise_{_SUFFIX[dtype]}"


def fourbit_name(kind: str, dtype, quant_type: Optional[str] = None, bf16_dot: bool = False) -> str:
    """4-bit: ``kind`` "quantize" | "dequantize" (``quant_type`` "nf4" | "fp4"), "gemv", or "linear"
    (``bf16_dot``: the CPU's bf16 dot-product kernel)."""
    _kind("fourbit_name", kind, ("quantize", "dequantize", "gemv", "linear"))
    if kind == "linear":
        return "clinear_4bit_bf16dot_bf16" if bf16_dot else f"clinear_4bit_{_SUFFIX[dtype]}"
    if kind == "gemv":
        return f"cgemm_4bit_inference_naive_{_SUFFIX[dtype]}"
    if quant_type not in ("nf4", "fp4"):
        raise ValueError(f"fourbit_name: `quant_type` must be 'nf4' or 'fp4'; got {quant_type!r}")
    return f"c{kind}_blockwise_{_SUFFIX[dtype]}_{quant_type}"


def int8_name(kind: str, dtype=None) -> str:
    """LLM.int8(): ``kind`` "vector_quant" | "matmul" (int32 out, no dtype) | "mm_dequant" | "mixed_mm_dequant" |
    "linear"."""
    _kind("int8_name", kind, ("vector_quant", "matmul", "mm_dequant", "mixed_mm_dequant", "linear"))
    if kind == "vector_quant":
        return "cint8_vector_quant"
    if kind == "matmul":
        return "cigemmlt_32"
    stem = {"mm_dequant": "cdequant_mm_int32", "mixed_mm_dequant": "cint8_mixed_mm_dequant",
            "linear": "cint8_linear"}[kind]
    return f"{stem}_{_SUFFIX[dtype]}"


def weight_only_name(kind: str, dtype, bits: int) -> str:
    """Weight-only int8/int4: ``kind`` "quantize" | "dequantize" | "gemm", ``bits`` 8 | 4."""
    if bits not in (4, 8):
        raise ValueError(f"weight_only_name: `bits` must be 4 or 8; got {bits!r}")
    _kind("weight_only_name", kind, ("quantize", "dequantize", "gemm"))
    return f"c{kind}_weight_only_int{bits}_{_SUFFIX[dtype]}"


def gemm_fp_name(dtype) -> str:
    """The full-precision linear (``gemm_fp``)."""
    return f"cgemm_fp_{_SUFFIX[dtype]}"


def linear_4bit_name(dtype, bf16_dot: bool = False) -> str:
    return fourbit_name("linear", dtype, bf16_dot=bf16_dot)


def int8_linear_name(dtype) -> str:
    return int8_name("linear", dtype)


_DECODER_PARTS = ("attention", "mlp", "linear", "rms_norm")


def decoder_entry(part: str, bf16_dot: bool = False, r16: bool = False) -> _hostcall.Entry:
    """The host-call handle of a fused decoder entry (csrc/cpu/decoder.cpp): ``part`` one of attention, mlp, linear
    (a decoder layer's halves, one linear such as lm_head; ``bf16_dot``: their twin whose 4-bit layers compute in
    bf16) or rms_norm; ``r16``: the twin in an fp16 model's rounding (each op's result rounded to fp16)."""
    if part not in _DECODER_PARTS:
        raise ValueError(f"decoder_entry: `part` must be one of {_DECODER_PARTS}; got {part!r}")
    sfx = "_r16" if r16 else ""
    if part == "rms_norm":
        if bf16_dot:
            raise ValueError("decoder_entry: `bf16_dot` applies to attention, mlp and linear, not rms_norm")
        return _hostcall.entry("crms_norm_fp32" + sfx)
    return _hostcall.entry(f"cdecoder_{part}_fp32" + ("_bf16dot" if bf16_dot else "") + sfx)


def linear_4bit_bound(dtype, bf16_dot: bool, *args) -> _hostcall.Bound:
    """The 4-bit linear forward for activations of ``dtype`` (``bf16_dot``: the CPU's bf16 dot-product kernel) as a
    host call bound to ``args`` (the table's order; the handle is cached): the format's plan gets its call from this
    one door, the C name spelled here, and re-points the arguments it binds on every call."""
    name = linear_4bit_name(dtype, bf16_dot)
    return _hostcall.entry(name).bind(*args)


def gemm_fp_entry(dtype) -> _hostcall.Entry:
    """The host-call handle of the full-precision linear (``gemm_fp``) for activations of ``dtype`` (cached)."""
    return _hostcall.entry(gemm_fp_name(dtype))


def int8_linear_entry(dtype) -> _hostcall.Entry:
    """The host-call handle of the LLM.int8() linear forward for activations of ``dtype`` (cached)."""
    return _hostcall.entry(int8_linear_name(dtype))


# ---- blockwise 8-bit ----
@_ops.quantize_blockwise.register(*NATIVE)
def _(A, code, blocksize):
    return _fn(blockwise_name("quantize", A.dtype))(code, A, blocksize)


@_ops.dequantize_blockwise.register(*NATIVE)
def _(A, absmax, code, blocksize, dtype):
    name = blockwise_name("dequantize", dtype)
    if _hostcall.usable(A, absmax, code):
        return _dequantize_host(name, dtype, tuple(int(s) for s in A.shape), code, A, absmax, blocksize)
    return _fn(name)(code, A, absmax, blocksize)


def _dequantize_host(name: str, dtype, shape, code, A, absmax, *scalars) -> Tensor:
    """A dequantization entry point (code, codes, absmax, then its scalars -> out) as a host call on the tensors'
    own memory, shaped ``shape``: the same kernel and bytes as its ops.Custom launch, ~4x faster for a 576 x 1536
    4-bit weight on the 2-core Xeon (0.29 vs 1.2 ms; training dequantizes every 4-bit weight twice a step)."""
    out = np.empty(int(np.prod(shape)), _hostcall.np_dtype(dtype))
    arr = _hostcall.act_array
    _hostcall.entry(name)(arr(code), arr(A).reshape(-1), arr(absmax), *scalars, out)
    return _hostcall.wrap(out.reshape(shape))


# ---- 4-bit ----
@_ops.quantize_4bit.register(*NATIVE)
def _(A, blocksize, quant_type, quant_storage=ms.uint8):
    packed, absmax = _fn(fourbit_name("quantize", A.dtype, quant_type))(code_4bit(quant_type), A, blocksize)
    return storage_view(packed, quant_storage), absmax


@_ops.dequantize_4bit.register(*NATIVE)
def _(A, absmax, blocksize, quant_type, shape, dtype, code=None):
    n = int(np.prod(shape))
    code = code_4bit(quant_type) if code is None else code
    name = fourbit_name("dequantize", dtype, quant_type)
    if _hostcall.usable(A, absmax, code):
        return _dequantize_host(name, dtype, tuple(int(s) for s in shape), code, as_uint8(A), absmax, blocksize, n)
    out = _fn(name)(code, as_uint8(A), absmax, blocksize, n)
    return ms.ops.reshape(out, tuple(int(s) for s in shape))


@_ops.gemv_4bit.register(*NATIVE)
def _(A, B, shapeB, absmax, code, blocksize):
    return _fn(fourbit_name("gemv", A.dtype))(A, as_uint8(B), absmax, code, blocksize,
                                                                  int(shapeB[0]))


@_ops.linear_4bit.register(*NATIVE)
def _(A, B, shapeB, absmax, code, blocksize, bias=None, absmax2=None, code2=None, offset=None, blocksize2=256,
      bf16_dot=False):
    dot = bool(bf16_dot) and A.dtype == ms.bfloat16 and cextension.BNB_BACKEND == "CPU"
    return _fn(linear_4bit_name(A.dtype, dot))(A, as_uint8(B), absmax, code, absmax2, code2, offset, bias, blocksize,
                                               blocksize2, int(shapeB[0]))


# ---- int8 ----
@_ops.int8_vectorwise_quant.register(*NATIVE)
def _(A, threshold=0.0):
    return _fn(int8_name("vector_quant"))(A, float(threshold))


@_ops.int8_linear_matmul.register(*NATIVE)
def _(A, B):
    return _fn(int8_name("matmul"))(A, B)[0]  # [1]: has_error (cextension reads it in the checking mode)


@_ops.int8_mm_dequant.register(*NATIVE)
def _(A, row_stats, col_stats, dtype=None, bias=None):
    return _fn(int8_name("mm_dequant", dtype or ms.float16))(A, row_stats, col_stats, bias)


@_ops.int8_mixed_mm_dequant.register(*NATIVE)
def _(C, row_stats, col_stats, bias, A, CB, col_flags, dtype):
    return _fn(int8_name("mixed_mm_dequant", dtype))(C, row_stats, col_stats, bias, A, CB, col_flags)


@_ops.int8_linear.register(*NATIVE)
def _(A, CB, SCB, bias, threshold):
    return _fn(int8_linear_name(A.dtype))(A, CB, SCB, bias, float(threshold))


# ---- optimizers: in place ----
# The kernels update p / state / absmax IN PLACE in the buffers they are given, as bitsandbytes' C functions do.
# On the CPU in PyNative mode (no gradient recorded) they run as host calls on the tensors' own memory (a strided
# argument through a contiguous copy written back); otherwise through ops.Custom (MindSpore hands an AOT kernel
# the real input buffers on the CPU), a non-contiguous argument through a contiguous clone copied back.
_F64_CACHE: dict = {}


def _f64(x) -> Tensor:
    """A float64 0-d tensor for a hyper-parameter (cached by value: they rarely change)."""
    key = (type(x), x)
    t = _F64_CACHE.get(key)
    if t is None:
        if len(_F64_CACHE) > 4096:
            _F64_CACHE.clear()
        t = _F64_CACHE[key] = Tensor(np.float64(x))
    return t


def _host_call(entry_name: str, fn: str, args, inplace) -> bool:
    """Runs an optimizer entry point on host memory: ``args`` in the table's order (tensors, None, numpy scalars;
    the int32[1] status is appended), ``inplace`` the names of the in-place arguments by position. Returns False
    (nothing done) where host calls are not available."""
    if not _hostcall.active():
        return False
    host_args, back = [], []
    for i, a in enumerate(args):  # g comes first: act_array waits for the ops queued before
        if isinstance(a, Tensor):
            if i in inplace:
                a.wait_pipeline()
                mem = _hostcall.own_memory(a, fn, inplace[i])
                if mem is None:
                    return False
                if not mem.flags.c_contiguous:
                    c = np.ascontiguousarray(mem)
                    back.append((mem, c))
                    mem = c
                host_args.append(mem)
            else:
                host_args.append(_hostcall.act_array(a))
        else:
            host_args.append(a)
    status = np.zeros(1, np.int32)  # has_error: read only in the checking mode (cextension)
    host_args.append(status)
    _hostcall.entry(entry_name).run(*host_args)
    for mem, c in back:
        mem[...] = c
    check_host_status(f"{fn} ({entry_name})", status)
    return True


class _InPlace:
    """In-place arguments for the ops.Custom path: a non-contiguous argument is run on a real contiguous copy
    (``clone()``: mindtorch's ``contiguous()`` returns the tensor itself) and copied back."""

    def __init__(self):
        self._back = []

    def __call__(self, t: Optional[Tensor]) -> Optional[Tensor]:
        if t is None or t.is_contiguous():
            return t
        c = t.clone()
        self._back.append((t, c))
        return c

    def finish(self) -> None:
        for t, c in self._back:
            t.copy_(c)


def _contig(t):
    return t if t is None or t.is_contiguous() else t.contiguous()


def _h64(x) -> np.ndarray:
    return np.array(x, dtype=np.float64)


@_ops.optimizer_update_32bit.register(*NATIVE)
def _(optimizer_name, g, p, state1, state2, unorm_vec, max_unorm, param_norm, beta1, beta2, beta3, alpha, eps,
      weight_decay, step, lr, gnorm_scale, skip_zeros=False):
    entry = OPTIM_32BIT_NAMES[optimizer_name][_FLOAT_ORDER.index(p.dtype)]
    scal = (float(max_unorm), float(param_norm), float(beta1), float(beta2), float(beta3), float(alpha), float(eps),
            float(weight_decay), int(step), float(lr), float(gnorm_scale))
    fn = "optimizer_update_32bit"
    if _host_call(entry, fn, (g, p, state1, state2, unorm_vec, *map(_h64, scal), np.array(bool(skip_zeros))),
                  {1: "p", 2: "state1", 3: "state2", 4: "unorm_vec"}):
        return None
    ip = _InPlace()
    _fn(entry)(_contig(g), ip(p), ip(state1), ip(state2), ip(unorm_vec), *map(_f64, scal), bool(skip_zeros))
    ip.finish()
    return None


@_ops.optimizer_update_8bit_blockwise.register(*NATIVE)
def _(optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr, qmap1, qmap2, absmax1,
      absmax2, weight_decay, gnorm_scale, skip_zeros=False):
    entry = OPTIM_8BIT_BLOCKWISE_NAMES[optimizer_name][_FLOAT_ORDER.index(p.dtype)]
    scal = (float(beta1), float(beta2), float(beta3), float(alpha), float(eps), int(step), float(lr),
            float(weight_decay), float(gnorm_scale))
    fn = "optimizer_update_8bit_blockwise"
    if _host_call(entry, fn, (g, p, state1, state2, qmap1, qmap2, absmax1, absmax2, *map(_h64, scal),
                              np.array(bool(skip_zeros))),
                  {1: "p", 2: "state1", 3: "state2", 6: "absmax1", 7: "absmax2"}):
        return None
    ip = _InPlace()
    _fn(entry)(_contig(g), ip(p), ip(state1), ip(state2), _contig(qmap1), _contig(qmap2), ip(absmax1), ip(absmax2),
               *map(_f64, scal), bool(skip_zeros))
    ip.finish()
    return None


# ---- weight-only int8/int4, full-precision linear ----
@_ops.quantize_weight_only.register(*NATIVE)
def _(W, bits):
    return _fn(weight_only_name("quantize", W.dtype, bits))(W)


@_ops.dequantize_weight_only.register(*NATIVE)
def _(q, scale, K, bits, dtype):
    return _fn(weight_only_name("dequantize", dtype, bits))(q, scale, int(K))


@_ops.gemm_weight_only.register(*NATIVE)
def _(A, q, scale, bits):
    return _fn(weight_only_name("gemm", A.dtype, bits))(A, q, scale)


@_ops.gemm_fp.register(*NATIVE)
def _(A, W, bias=None):
    return _fn(gemm_fp_name(A.dtype))(A, W, bias)
