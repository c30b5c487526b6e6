"""The op table: every native entry point, declared once.

Each :class:`NativeOp` row names one C entry point of the native libraries (bitsandbytes' C names,
e.g. ``cquantize_blockwise_fp32``), lists its inputs and outputs in the order of the AOT ``params``
array, and gives the rule that derives the outputs' shapes and dtypes from the inputs. From this
table :mod:`bitsandbytes_ms.cextension` builds ``lib.<name>`` callables that run
``mindspore.ops.Custom("<lib>.so:<name>", ..., func_type="aot")``; nothing else declares an op.

Inputs that are Python scalars reach the kernel as 0-d tensors. A scalar listed in ``static`` also
decides output shapes (e.g. ``blocksize`` decides how many absmax values there are), so its value is
part of the cache key of the ``ops.Custom`` object (one object per distinct value, created once).

``bnb_args`` is upstream's positional argument order for the same symbol, so code written against
bitsandbytes (``lib.cquantize_blockwise_fp32(get_ptr(code), get_ptr(A), get_ptr(absmax),
get_ptr(out), ct.c_int32(blocksize), ct.c_int(n))``) runs unchanged: names that are not inputs or
outputs of ours (such as ``n``) are accepted; the sizes among them (``n``, ``m``/``k``, ``rows``/``cols``,
``numRows``/``numCols``) must match the tensors' (``cextension._check_bnb_sizes``), the others are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Optional, Sequence, Tuple

import mindspore as ms

from .utils import DTYPE_OF_SUFFIX, SUFFIX_OF_DTYPE  # noqa: F401  (views of the package's one dtype map)

Shape = Tuple[int, ...]



@dataclass(frozen=True)
class NativeOp:
    """One native entry point.

    Attributes:
        name: the exported C symbol (same in the CPU and the CUDA library).
        inputs: input names, in ``params`` order.
        outputs: output names, in ``params`` order after the inputs.
        infer: ``infer(shapes: dict[name, Shape], dtypes: dict[name, ms.dtype], static: dict) ->
            tuple[(shape, dtype), ...]`` for the outputs. MindSpore asks for output shapes and
            output dtypes separately, so the bridge calls the rule twice: once with real shapes
            (dtypes empty) and once with real dtypes (shapes all ``(1,)``); the shape part of a
            rule may only read shapes, and the dtype part only dtypes.
        static: scalar inputs whose values ``infer`` needs (part of the op cache key).
        bnb_args: upstream bitsandbytes' positional argument order for this symbol.
        has_error: the last output is an int32[1] status written by the kernel (see cextension).
        doc: one line on what the op computes and its source.
        cpu_only: only the CPU library exports it (a CPU inference path with no CUDA twin yet, e.g. the
            fused decoder layers); the CUDA library is not required to have it.
    """

    name: str
    inputs: Tuple[str, ...]
    outputs: Tuple[str, ...]
    infer: Callable[[Dict[str, Shape], Dict[str, object], Dict[str, object]], Sequence[Tuple[Shape, object]]]
    static: Tuple[str, ...] = ()
    bnb_args: Optional[Tuple[str, ...]] = None
    has_error: bool = False
    doc: str = ""
    cpu_only: bool = False


OPS: Dict[str, NativeOp] = {}


def define(op: NativeOp) -> NativeOp:
    if op.name in OPS:
        raise ValueError(f"native op {op.name!r} is declared twice")
    OPS[op.name] = op
    return op


def _numel(shape: Shape) -> int:
    return int(math.prod(shape))


# ---------------------------------------------------------------------------------------------
# Blockwise 8-bit quantization (functional.quantize_blockwise / dequantize_blockwise)
# ---------------------------------------------------------------------------------------------
for _sfx, _dt in DTYPE_OF_SUFFIX.items():
    define(NativeOp(
        name=f"cquantize_blockwise_{_sfx}",
        inputs=("code", "A", "blocksize"),
        outputs=("out", "absmax"),
        static=("blocksize",),
        infer=lambda s, d, st: (
            (s["A"], ms.uint8),
            ((-(-_numel(s["A"]) // max(1, int(st["blocksize"]))),), ms.float32),  # bad sizes: the kernel rejects them
        ),
        bnb_args=("code", "A", "absmax", "out", "blocksize", "n"),
        doc="blockwise absmax quantization of A onto a 256-entry code (uint8 indices + fp32 absmax per block)",
    ))
    define(NativeOp(
        name=f"cdequantize_blockwise_{_sfx}",
        inputs=("code", "A", "absmax", "blocksize"),
        outputs=("out",),
        infer=(lambda dt: lambda s, d, st: ((s["A"], dt),))(_dt),
        bnb_args=("code", "A", "absmax", "out", "blocksize", "n"),
        doc="out = code[A] * absmax[block], in the suffix's dtype",
    ))


# ---- optim ----
# Fused optimizer updates (functional.optimizer_update_32bit / optimizer_update_8bit_blockwise).
# The kernels update p, state1, state2, absmax1, absmax2 (and unorm_vec) IN PLACE in the input
# buffers, as bitsandbytes' C functions do; the only declared output is an int32[1] status, their has_error
# (0, or the status of a failure on valid input: scratch allocation, a CUDA launch).
# Scalars are read as double (functional passes float64 0-d tensors, so hyper-parameter
# expressions are evaluated like upstream's Python code does).
OPTIM_32BIT_NAMES = {
    # optimizer -> (fp32, fp16, bf16) entry points; upstream's names (its momentum/rmsprop/adagrad
    # kernels use the _32/_16 suffixes; the bf16 variants of those three are ours)
    "adam": ("cadam32bit_grad_fp32", "cadam32bit_grad_fp16", "cadam32bit_grad_bf16"),
    "ademamix": ("cademamix32bit_grad_fp32", "cademamix32bit_grad_fp16", "cademamix32bit_grad_bf16"),
    "lion": ("clion32bit_grad_fp32", "clion32bit_grad_fp16", "clion32bit_grad_bf16"),
    "momentum": ("cmomentum32bit_grad_32", "cmomentum32bit_grad_16", "cmomentum32bit_grad_bf16"),
    "rmsprop": ("crmsprop32bit_grad_32", "crmsprop32bit_grad_16", "crmsprop32bit_grad_bf16"),
    "adagrad": ("cadagrad32bit_grad_32", "cadagrad32bit_grad_16", "cadagrad32bit_grad_bf16"),
}
OPTIM_8BIT_BLOCKWISE_NAMES = {
    opt: tuple(f"c{opt}_8bit_blockwise_grad_{s}" for s in ("fp32", "fp16", "bf16"))
    for opt in ("adam", "ademamix", "momentum", "rmsprop", "lion", "adagrad")
}
_STATUS = lambda s, d, st: (((1,), ms.int32),)  # noqa: E731

for _opt, _names in OPTIM_32BIT_NAMES.items():
    for _nm in _names:
        define(NativeOp(
            name=_nm,
            inputs=("g", "p", "state1", "state2", "unorm_vec", "max_unorm", "param_norm", "beta1", "beta2",
                    "beta3", "alpha", "eps", "weight_decay", "step", "lr", "gnorm_scale", "skip_zeros"),
            outputs=("status",),
            infer=_STATUS,
            has_error=True,
            bnb_args=("g", "p", "state1", "state2", "unorm_vec", "max_unorm", "param_norm", "beta1", "beta2",
                      "beta3", "alpha", "eps", "weight_decay", "step", "lr", "gnorm_scale", "skip_zeros", "n"),
            doc=f"in-place {_opt} update with fp32 state (upstream 0.50 CPU rule)",
        ))
for _opt, _names in OPTIM_8BIT_BLOCKWISE_NAMES.items():
    for _nm in _names:
        define(NativeOp(
            name=_nm,
            inputs=("g", "p", "state1", "state2", "qmap1", "qmap2", "absmax1", "absmax2", "beta1", "beta2",
                    "beta3", "alpha", "eps", "step", "lr", "weight_decay", "gnorm_scale", "skip_zeros"),
            outputs=("status",),
            infer=_STATUS,
            has_error=True,
            bnb_args=("p", "g", "state1", "state2", "beta1", "beta2", "beta3", "alpha", "eps", "step", "lr",
                      "qmap1", "qmap2", "absmax1", "absmax2", "weight_decay", "gnorm_scale", "skip_zeros", "n"),
            doc=f"in-place {_opt} update with blockwise (256) 8-bit state: dequantize, update, requantize",
        ))

# ---- 4-bit (NF4/FP4) quantization and inference ----
for _sfx, _dt in DTYPE_OF_SUFFIX.items():
    for _qt in ("fp4", "nf4"):
        define(NativeOp(
            name=f"cquantize_blockwise_{_sfx}_{_qt}",
            inputs=("code", "A", "blocksize"),
            outputs=("out", "absmax"),
            static=("blocksize",),
            infer=lambda s, d, st: (
                (((_numel(s["A"]) + 1) // 2, 1), ms.uint8),
                ((-(-_numel(s["A"]) // max(1, int(st["blocksize"]))),), ms.float32),
            ),
            bnb_args=("code", "A", "absmax", "out", "blocksize", "n"),
            doc="4-bit blockwise quantization: absmax per block, bucket among the sorted code's midpoints, "
                "two codes per byte (element 2j in the high nibble); upstream's default quantize_4bit",
        ))
        define(NativeOp(
            name=f"cdequantize_blockwise_{_sfx}_{_qt}",
            inputs=("code", "A", "absmax", "blocksize", "n"),
            outputs=("out",),
            static=("n",),
            infer=(lambda dt: lambda s, d, st: (((int(st["n"]),), dt),))(_dt),
            bnb_args=("code", "A", "absmax", "out", "blocksize", "n"),
            doc="out[i] = code[nibble i] * absmax[i // blocksize] (fp32), rounded to the suffix's dtype; n elements",
        ))
    define(NativeOp(
        name=f"cgemm_4bit_inference_naive_{_sfx}",
        inputs=("A", "B", "absmax", "code", "blocksize", "n_out"),
        outputs=("out",),
        static=("n_out",),
        infer=(lambda dt: lambda s, d, st: ((tuple(s["A"][:-1]) + (int(st["n_out"]),), dt),))(_dt),
        bnb_args=("m", "n_out", "k", "A", "B", "absmax", "code", "out", "lda", "ldb", "ldc", "blocksize"),
        doc="out[..., n] = sum_k A[..., k] * code[B(n, k)] * absmax[block(n*K + k)]: 4-bit GEMV that decodes the "
            "packed weight [N, K] in registers (fp32 accumulation in 32 fixed slots, absmax applied once per block)",
    ))

for _sfx, _dt in DTYPE_OF_SUFFIX.items():
    define(NativeOp(
        name=f"clinear_4bit_{_sfx}",
        inputs=("A", "B", "absmax", "code", "absmax2", "code2", "offset", "bias", "blocksize", "blocksize2", "n_out"),
        outputs=("out",),
        static=("n_out",),
        infer=(lambda dt: lambda s, d, st: ((tuple(s["A"][:-1]) + (int(st["n_out"]),), dt),))(_dt),
        doc="the inference forward of a 4-bit linear layer in one call: for one row of A cgemm_4bit_inference_naive's "
            "sum, for more rows a fused dequantize-GEMM (code*absmax decoded per weight row, 16 fma lanes); absmax fp32, or uint8 double-quant codes decoded in the kernel as "
            "code2[q] * absmax2[b // blocksize2] + offset (absmax2/code2/offset None otherwise), and bias (or None) "
            "added to the result rounded to A's dtype, in fp32",
    ))

define(NativeOp(
    name="clinear_4bit_bf16dot_bf16",
    cpu_only=True,
    inputs=("A", "B", "absmax", "code", "absmax2", "code2", "offset", "bias", "blocksize", "blocksize2", "n_out"),
    outputs=("out",),
    static=("n_out",),
    infer=lambda s, d, st: ((tuple(s["A"][:-1]) + (int(st["n_out"]),), ms.bfloat16),),
    doc="clinear_4bit_bf16's forward computed as a bf16 dot product (upstream's bf16 compute on AVX512-BF16 CPUs): "
        "x and bf16(code*absmax) per block (RNE, bf16 denormals flushed), pairs accumulated in 16 fp32 lanes as "
        "vdpbf16ps does (odd element first, FTZ); vdpbf16ps where the CPU has AVX512-BF16, a portable kernel "
        "with the same bits elsewhere; csrc/cpu/fourbit.cpp documents the order and the bound vs clinear_4bit_bf16",
))

# ---- int8 (LLM.int8()) ----
# Names are bitsandbytes' C names for the same operations (csrc/pythonInterface.cpp, CUDA build):
# `cint8_vector_quant` (upstream: fp16 only; ours dispatches on A's dtype inside the one entry point,
# fp32/fp16/bf16, and also reports outlier columns), `cigemmlt_32` (upstream: cuBLASLt int8 GEMM with
# int32 output; the `_32` is the output width), `cdequant_mm_int32_fp16` (upstream: fp16 only; we add
# the `_fp32`/`_bf16` siblings in upstream's suffix style).
def _rows_of(shape: Shape) -> int:
    return _numel(shape[:-1]) if len(shape) else 1


define(NativeOp(
    name="cint8_vector_quant",
    inputs=("A", "threshold"),
    outputs=("out", "row_stats", "col_flags"),
    infer=lambda s, d, st: (
        (s["A"], ms.int8),
        ((_rows_of(s["A"]),), ms.float32),
        ((s["A"][-1] if len(s["A"]) else 1,), ms.uint8),
    ),
    bnb_args=("A", "out", "row_stats", "threshold", "rows", "cols"),
    doc="row-wise absmax int8 quantization, q = round(x * 127 / absmax(row)); |x| >= threshold are outliers "
        "(left out of absmax, zeroed, their columns flagged and zeroed when rows > 1)",
))
define(NativeOp(
    name="cigemmlt_32",
    inputs=("A", "B"),
    outputs=("out", "has_error"),
    infer=lambda s, d, st: ((tuple(s["A"][:-1]) + (s["B"][0],), ms.int32), ((1,), ms.int32)),
    has_error=True,
    # upstream passes the weight first: (ctx, m, n, k, weight, activations, C, row_scale, lda, ldb, ldc, stream)
    bnb_args=("context", "m", "n", "k", "B", "A", "out", "row_scale", "lda", "ldb", "ldc", "stream"),
    doc="out[..., n] = sum_k A[..., k] * B[n, k], int8 x int8 with exact int32 accumulation; has_error: 0, or "
        "the status of a failure on valid input (cuBLASLt on GPU, scratch allocation), as upstream's igemmlt returns",
))
for _sfx, _dt in DTYPE_OF_SUFFIX.items():
    define(NativeOp(
        name=f"cdequant_mm_int32_{_sfx}",
        inputs=("A", "row_stats", "col_stats", "bias"),
        outputs=("out",),
        infer=(lambda dt: lambda s, d, st: ((s["A"], dt),))(_dt),
        bnb_args=("A", "row_stats", "col_stats", "out", "bias", "numRows", "numCols", "stream"),
        doc="out = float(A) * (row_stats[r] * col_stats[c]) * 6.200124e-05 (+ bias[c]), in the suffix's dtype",
    ))

# LLM.int8() outlier columns and the fused linear forward (ours; no upstream C name): see csrc/cpu/int8.cpp
# ("mixed mm dequant") for the numerics. cint8_linear_<sfx> is MatMul8bitLt's inference forward in one call.
for _sfx, _dt in DTYPE_OF_SUFFIX.items():
    define(NativeOp(
        name=f"cint8_mixed_mm_dequant_{_sfx}",
        inputs=("C", "row_stats", "col_stats", "bias", "A", "CB", "col_flags"),
        outputs=("out",),
        infer=(lambda dt: lambda s, d, st: ((s["C"], dt),))(_dt),
        doc="out = dequant(C) (+ bias) + A[:, J] @ (CB[:, J] * col_stats / 127).T for the flagged columns J, "
            "in fp32 (J summed in ascending order), rounded once to the suffix's dtype; no flag: cdequant_mm_int32",
    ))
    define(NativeOp(
        name=f"cint8_linear_{_sfx}",
        inputs=("A", "CB", "SCB", "bias", "threshold"),
        outputs=("out", "col_flags"),
        infer=(lambda dt: lambda s, d, st: (
            (tuple(s["A"][:-1]) + (s["CB"][0],), dt),
            ((s["A"][-1] if len(s["A"]) else 1,), ms.uint8),
        ))(_dt),
        doc="LLM.int8() linear forward in one call: fp32 A rounded to fp16, row-wise int8 quantization with "
            "outlier columns (threshold > 0), int8 GEMM, mm dequant (+ bias) and the outlier columns' fp32 product",
    ))

# ---- weight-only int8/int4 (W8A16/W4A16) ----
# Per-output-channel symmetric absmax weights (ChatGLM's quantized-checkpoint scheme); see
# csrc/cpu/weightonly.cpp. int4 rows are packed two signed nibbles per byte (k even: high nibble).
def _wo_row_bytes(bits: int, K: int) -> int:
    return K if bits == 8 else (K + 1) // 2


for _sfx, _dt in DTYPE_OF_SUFFIX.items():
    for _bits in (8, 4):
        _qdt = ms.int8 if _bits == 8 else ms.uint8
        define(NativeOp(
            name=f"cquantize_weight_only_int{_bits}_{_sfx}",
            inputs=("W",),
            outputs=("q", "scale"),
            infer=(lambda b, qd: lambda s, d, st: (
                ((s["W"][0], _wo_row_bytes(b, s["W"][-1])), qd),
                ((s["W"][0],), ms.float32),
            ))(_bits, _qdt),
            doc=f"int{_bits} per-row absmax quantization of a [N, K] weight: scale = absmax/{127 if _bits == 8 else 7}, "
                "q = round(W/scale)",
        ))
        define(NativeOp(
            name=f"cdequantize_weight_only_int{_bits}_{_sfx}",
            inputs=("q", "scale", "K"),
            outputs=("out",),
            static=("K",),
            infer=(lambda dt: lambda s, d, st: (((s["scale"][0], int(st["K"])), dt),))(_dt),
            doc="W'[n, k] = q[n, k] * scale[n] (fp32, rounded to the suffix's dtype)",
        ))
        define(NativeOp(
            name=f"cgemm_weight_only_int{_bits}_{_sfx}",
            inputs=("A", "q", "scale"),
            outputs=("out",),
            infer=(lambda dt: lambda s, d, st: ((tuple(s["A"][:-1]) + (s["scale"][0],), dt),))(_dt),
            doc="out[..., n] = scale[n] * sum_k A[..., k] * q[n, k]: weight-only GEMM/GEMV that widens the "
                "int weight in registers (fp32 accumulation in 16 fixed lanes)",
        ))

# ---- fused decoder layers (Llama / Qwen2 / Mistral-style; csrc/cpu/decoder.cpp) ----
# A "linear spec" is 9 consecutive inputs describing one linear layer's weight (the table per weight kind is in
# csrc/cpu/decoder.cpp's header): W (fp32/fp16/bf16 [N, K], the packed 4-bit uint8 bytes, or int8 CB [N, K]),
# absmax (4-bit: fp32 | uint8 double-quant codes; int8: SCB fp32 [N]; dense: None), code (4-bit fp32[16] | None),
# absmax2, code2 (double quant, else None), offset (double quant; int8: the outlier threshold; else None),
# bias (fp32/fp16/bf16 [N] | None), blocksize, blocksize2 (4-bit). Activations are fp32; norm weights fp32/fp16/bf16.
LINEAR_SPEC = ("W", "absmax", "code", "absmax2", "code2", "offset", "bias", "blocksize", "blocksize2")


def _spec(prefix: str) -> Tuple[str, ...]:
    return tuple(f"{prefix}_{n}" for n in LINEAR_SPEC)


define(NativeOp(
    name="cdecoder_attention_fp32",
    cpu_only=True,
    inputs=("x", "positions", "key_mask", "k_cache", "v_cache", "norm_w", "inv_freq", "q_norm_w", "k_norm_w")
           + _spec("q") + _spec("k") + _spec("v") + _spec("o")
           + ("past", "n_heads", "eps", "scaling", "rope_scale", "window"),
    outputs=("out",),
    infer=lambda s, d, st: ((s["x"], ms.float32),),
    doc="the attention half of a decoder layer, fp32: out = x + O(attn) with RMSNorm(x; norm_w, eps), Q/K/V "
        "projections (+bias), QK-norm (q_norm_w/k_norm_w [D] or None: RMSNorm per head, Qwen3), RoPE (rotate_half; f = pos * inv_freq, cos/sin * rope_scale), K/V written IN PLACE "
        "into k_cache/v_cache [B, KVH, S_max, D] at [past, past+T), causal GQA softmax(q.k * scaling) over "
        "[0, past+T) with key_mask [B, >= past+T] (0 = padding; first past+T columns) and an optional sliding window (0 = none); "
        "x [B, T, H], positions int64 [B, T]; out may be x",
))
define(NativeOp(
    name="cdecoder_mlp_fp32",
    cpu_only=True,
    inputs=("x", "norm_w") + _spec("gate") + _spec("up") + _spec("down") + ("intermediate", "eps"),
    outputs=("out",),
    infer=lambda s, d, st: ((s["x"], ms.float32),),
    doc="the MLP half of a decoder layer, fp32: out = x + Down(silu(Gate(y)) * Up(y)), y = RMSNorm(x; norm_w, eps); "
        "out may be x",
))
define(NativeOp(
    name="cdecoder_linear_fp32",
    cpu_only=True,
    inputs=("x",) + _spec("w") + ("n_out",),
    outputs=("out",),
    static=("n_out",),
    infer=lambda s, d, st: ((tuple(s["x"][:-1]) + (int(st["n_out"]),), ms.float32),),
    doc="one linear layer given as a linear spec (fp32/fp16/bf16, 4-bit or int8 weight), fp32 x [..., K] -> "
        "[..., n_out] (e.g. the lm_head of a fused model)",
))
# The same three with a 4-bit weight's prefill (more than 8 rows) computed as a bf16 dot product (vdpbf16ps where
# the CPU has AVX512-BF16; csrc/cpu/gemm_panel.h's bf16 variant documents the order and the bound vs the exact
# entries); decode rows, and every other weight kind, run exactly as in the exact entries.
for _n in ("cdecoder_attention_fp32", "cdecoder_mlp_fp32", "cdecoder_linear_fp32"):
    define(replace(OPS[_n], name=f"{_n}_bf16dot",
                   doc=OPS[_n].doc + "; a 4-bit weight's prefill (> 8 rows) in bf16 (x and the dequantized weight "
                       "rounded to bf16, pairs accumulated in fp32 as vdpbf16ps)"))
define(NativeOp(
    name="crms_norm_fp32",
    cpu_only=True,
    inputs=("x", "w", "eps"),
    outputs=("out",),
    infer=lambda s, d, st: ((s["x"], ms.float32),),
    doc="RMSNorm over the last dimension, fp32 (w fp32/fp16/bf16): w * (x / sqrt(mean(x^2) + eps)); out may be x",
))
# All of them in an fp16 model's rounding: fp32 buffers holding fp16 values, each op's result rounded to fp16 where
# the unfused fp16 model's op rounds it (csrc/cpu/decoder.cpp's header; simd_math.h's fp16 rules).
for _n in ("cdecoder_attention_fp32", "cdecoder_mlp_fp32", "cdecoder_linear_fp32", "crms_norm_fp32",
           "cdecoder_attention_fp32_bf16dot", "cdecoder_mlp_fp32_bf16dot", "cdecoder_linear_fp32_bf16dot"):
    define(replace(OPS[_n], name=f"{_n}_r16",
                   doc=OPS[_n].doc + "; in an fp16 model's rounding (every op's result rounded to fp16 as the "
                       "unfused fp16 model's)"))


# ---- full-precision linear (the layers a quantized model keeps: lm_head) ----
# csrc/cpu/gemm_fp.cpp: fp32 accumulation in 16 fixed lanes (lane = k mod 16, fused multiply-add in k
# order), a fixed reduction tree, then + bias in fp32 and one rounding to the suffix's dtype; the same
# bits at every SIMD level (the order is spelled out in _reference.gemm_fp).
for _sfx, _dt in DTYPE_OF_SUFFIX.items():
    define(NativeOp(
        name=f"cgemm_fp_{_sfx}",
        inputs=("A", "W", "bias"),
        outputs=("out",),
        infer=(lambda dt: lambda s, d, st: ((tuple(s["A"][:-1]) + (s["W"][0],), dt),))(_dt),
        doc="out[..., n] = sum_k A[..., k] * W[n, k] (+ bias[n]): full-precision GEMV/GEMM on a [N, K] weight "
            "(fp16/bf16 widened in registers; fp32 accumulation in 16 fixed lanes, fixed reduction tree)",
    ))
