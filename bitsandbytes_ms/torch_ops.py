"""``torch.ops.bitsandbytes.<op>``: the ops of :mod:`bitsandbytes_ms._ops` registered under upstream's schemas.

Upstream registers its ops with ``torch.library`` (``bitsandbytes/_ops.py``) and code such as its test suite calls
them directly, e.g. ``torch.ops.bitsandbytes.quantize_4bit(A, blocksize, quant_type, quant_storage) -> (packed,
absmax)``. mindtorch's ``torch.library`` has no op registry (its ``custom_op`` returns None, ``register_fake`` does
nothing, there is no ``define``/``impl``), so -- the MindSpore-forced difference -- the same ops live in the
namespace object :data:`bitsandbytes` here, which :func:`bitsandbytes_ms.register` installs as
``torch.ops.bitsandbytes`` (patch ``mindtorch-torch-ops-bitsandbytes``; ``from bitsandbytes_ms.torch_ops import
bitsandbytes`` works without it). Each entry is an overload packet: ``op(...)`` and ``op.default(...)`` run it,
``op.out(..., out)`` writes into ``out`` where upstream has an ``.out`` overload (then returns None, as upstream's
``-> ()``).

Each op takes upstream's arguments, validates them (:mod:`bitsandbytes_ms.functional`'s checks: a clear error naming
the argument; inputs made contiguous) and runs the op of :mod:`bitsandbytes_ms._ops` on the active backend; the
composite ops (``int8_scaled_mm``, ``int8_mixed_scaled_mm``, ``int8_vectorwise_dequant``, ``int8_double_quant``)
are functional's compositions of those ops, as upstream's default kernels compose theirs. Results are plain tensors
(no QuantState). This module sits beside ``functional``, below ``autograd`` and ``nn``.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Tensor

from . import _ops
from . import functional as F


class _Op:
    """One op as torch's ``OpOverloadPacket``: callable, ``.default``, and ``.out`` where upstream has one."""

    def __init__(self, name: str, fn, out=None):
        self.__name__ = name
        self.default = fn
        self.__doc__ = fn.__doc__
        if out is not None:
            self.out = out

    def __call__(self, *args, **kwargs):
        return self.default(*args, **kwargs)

    def __repr__(self):
        return f"torch.ops.bitsandbytes.{self.__name__}"


class _Namespace:
    """``torch.ops.bitsandbytes``."""

    def __repr__(self):
        return "torch.ops.bitsandbytes (bitsandbytes_ms.torch_ops)"

    def __iter__(self):
        return iter(sorted(k for k, v in vars(self).items() if isinstance(v, _Op)))


#: The ``torch.ops.bitsandbytes`` namespace.
bitsandbytes = _Namespace()


def _register(name: str, out=None):
    def deco(fn):
        setattr(bitsandbytes, name, _Op(name, fn, out))
        return fn
    return deco


def _into(out: Tensor, res: Tensor) -> None:
    F._write(out, res)


# ---- blockwise 8-bit ----
@_register("quantize_blockwise")
def quantize_blockwise(A: Tensor, code: Tensor, blocksize: int) -> Tuple[Tensor, Tensor]:
    """``quantize_blockwise(Tensor A, Tensor code, int blocksize) -> (Tensor uint8 [A.shape], Tensor fp32 absmax)``."""
    out, state = F.quantize_blockwise(A, code=code, blocksize=blocksize)
    return out, state.absmax


def _dequantize_blockwise_out(A, absmax, code, blocksize: int, dtype, out: Tensor) -> None:
    """``dequantize_blockwise.out(..., Tensor! out) -> ()``."""
    _into(out, dequantize_blockwise(A, absmax, code, blocksize, dtype))


@_register("dequantize_blockwise", out=_dequantize_blockwise_out)
def dequantize_blockwise(A: Tensor, absmax: Tensor, code: Tensor, blocksize: int, dtype) -> Tensor:
    """``dequantize_blockwise(Tensor A, Tensor absmax, Tensor code, int blocksize, ScalarType dtype) -> Tensor``."""
    state = F.QuantState(absmax=absmax, code=code, blocksize=blocksize, dtype=dtype, shape=A.shape)
    return F.dequantize_blockwise(A, state)


# ---- 4-bit ----
@_register("quantize_4bit")
def quantize_4bit(A: Tensor, blocksize: int, quant_type: str, quant_storage=ms.uint8) -> Tuple[Tensor, Tensor]:
    """``quantize_4bit(Tensor A, int blocksize, str quant_type, ScalarType quant_storage) -> (packed, fp32 absmax)``;
    packed is ``[(n+1)//2 / itemsize(quant_storage), 1]``."""
    packed, state = F.quantize_4bit(A, blocksize=blocksize, quant_type=quant_type, quant_storage=quant_storage)
    return packed, state.absmax


def _dequantize_4bit_out(A, absmax, blocksize: int, quant_type: str, shape, dtype, out: Tensor) -> None:
    """``dequantize_4bit.out(..., Tensor! out) -> ()``."""
    _into(out, dequantize_4bit(A, absmax, blocksize, quant_type, shape, dtype))


@_register("dequantize_4bit", out=_dequantize_4bit_out)
def dequantize_4bit(A: Tensor, absmax: Tensor, blocksize: int, quant_type: str, shape: Sequence[int], dtype) -> Tensor:
    """``dequantize_4bit(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype)``."""
    state = F.QuantState(absmax=absmax, shape=tuple(int(s) for s in shape), dtype=dtype, blocksize=blocksize,
                         quant_type=quant_type, code=F.get_4bit_type(quant_type))
    return F.dequantize_4bit(A.reshape(-1, 1), state)


def _gemv_4bit_out(A, B, shapeB, absmax, code, blocksize: int, out: Tensor) -> None:
    """``gemv_4bit.out(..., Tensor! out) -> ()``."""
    _into(out, gemv_4bit(A, B, shapeB, absmax, code, blocksize))


@_register("gemv_4bit", out=_gemv_4bit_out)
def gemv_4bit(A: Tensor, B: Tensor, shapeB: Sequence[int], absmax: Tensor, code: Tensor, blocksize: int) -> Tensor:
    """``gemv_4bit(Tensor A, Tensor B, int[] shapeB, Tensor absmax, Tensor code, int blocksize) -> Tensor``:
    ``A[..., K] @ W[N, K]^T`` with W packed in ``B``."""
    state = F.QuantState(absmax=absmax, shape=tuple(int(s) for s in shapeB), dtype=A.dtype, blocksize=blocksize,
                         code=code, quant_type=None)
    return F.gemv_4bit(A, B, state=state)


@_register("gemm_4bit")
def gemm_4bit(A: Tensor, B: Tensor, shapeB: Sequence[int], absmax: Tensor, blocksize: int, quant_type: str,
              bias: Optional[Tensor] = None, absmax_8bit: Optional[Tensor] = None, absmax_code: Optional[Tensor] = None,
              absmax_offset=None) -> Tensor:
    """``gemm_4bit(A, B, shapeB, absmax, blocksize, quant_type, bias=None, absmax_8bit=None, absmax_code=None,
    absmax_offset=None) -> Tensor``: ``A[..., K] @ W[N, K]^T + bias`` (the op ``linear_4bit``).

    With double quantization, ``absmax`` is the nested (fp32) absmax, ``absmax_8bit`` the uint8 codes,
    ``absmax_code`` their 256-entry code and ``absmax_offset`` the offset (any float dtype, read as fp32);
    the nested blocksize is 256, as upstream's quantize_4bit produces.
    """
    code = F.get_4bit_type(quant_type)
    shape = tuple(int(s) for s in shapeB)
    if absmax_8bit is not None:
        if absmax_code is None or absmax_offset is None:
            raise ValueError("gemm_4bit: `absmax_code` and `absmax_offset` are required with `absmax_8bit`")
        offset = absmax_offset if isinstance(absmax_offset, Tensor) else Tensor(float(absmax_offset), ms.float32)
        offset = _ops.tag(ms.ops.cast(offset, ms.float32), (A,))  # read in place by the host call: mindtorch's data_ptr
        state2 = F.QuantState(absmax=absmax, code=absmax_code, blocksize=256, dtype=ms.float32)
        state = F.QuantState(absmax=absmax_8bit, shape=shape, dtype=A.dtype, blocksize=blocksize, code=code,
                             quant_type=quant_type, offset=offset, state2=state2)
    else:
        state = F.QuantState(absmax=absmax, shape=shape, dtype=A.dtype, blocksize=blocksize, code=code,
                             quant_type=quant_type)
    return F.linear_4bit(A, B, state, bias=bias)


# ---- int8 (LLM.int8()) ----
def _int8_linear_matmul_out(A: Tensor, B: Tensor, out: Tensor) -> None:
    """``int8_linear_matmul.out(Tensor A, Tensor B, Tensor! out) -> ()``: writes into ``out``."""
    F.int8_linear_matmul(A, B, out=out)


@_register("int8_linear_matmul", out=_int8_linear_matmul_out)
def int8_linear_matmul(A: Tensor, B: Tensor) -> Tensor:
    """``int8_linear_matmul(Tensor A int8 [..., K], Tensor B int8 [N, K]) -> Tensor int32 [..., N]``."""
    return F.int8_linear_matmul(A, B)


@_register("int8_vectorwise_quant")
def int8_vectorwise_quant(A: Tensor, threshold: float = 0.0):
    """``int8_vectorwise_quant(Tensor A, float threshold=0.0) -> (Tensor int8, Tensor fp32, Tensor?)``."""
    return F.int8_vectorwise_quant(A, threshold=threshold)


@_register("int8_vectorwise_dequant")
def int8_vectorwise_dequant(A: Tensor, stats: Tensor) -> Tensor:
    """``int8_vectorwise_dequant(Tensor A int8, Tensor stats fp32) -> Tensor fp32``."""
    return F.int8_vectorwise_dequant(A, stats)


@_register("int8_mm_dequant")
def int8_mm_dequant(A: Tensor, row_stats: Tensor, col_stats: Tensor, dtype=None, bias: Optional[Tensor] = None):
    """``int8_mm_dequant(Tensor A int32, Tensor row_stats, Tensor col_stats, ScalarType? dtype=None,
    Tensor? bias=None) -> Tensor`` (float16 unless ``dtype``)."""
    # one rounding, straight from the fp32 dequantization into `dtype` (not via float16: that rounded fp32 and
    # bf16 results twice and overflowed to inf above 65504)
    return F._mm_dequant(A, row_stats, col_stats, bias, ms.float16 if dtype is None else dtype, "int8_mm_dequant")


@_register("int8_double_quant")
def int8_double_quant(A: Tensor, threshold: float = 0.0):
    """``int8_double_quant(Tensor A, float threshold=0.0) -> (Tensor, Tensor, Tensor, Tensor, Tensor?)``."""
    return F.int8_double_quant(A, threshold=threshold)


@_register("int8_scaled_mm")
def int8_scaled_mm(A: Tensor, B: Tensor, row_stats: Tensor, col_stats: Tensor, bias: Optional[Tensor] = None,
                   dtype=None) -> Tensor:
    """``int8_scaled_mm(Tensor A, Tensor B, Tensor row_stats, Tensor col_stats, Tensor? bias=None,
    ScalarType? dtype=None) -> Tensor``."""
    return F.int8_scaled_mm(A, B, row_stats, col_stats, bias=bias, dtype=dtype)


@_register("int8_mixed_scaled_mm")
def int8_mixed_scaled_mm(A: Tensor, CA: Tensor, CB: Tensor, SCA: Tensor, SCB: Tensor,
                         outlier_cols: Optional[Tensor] = None, bias: Optional[Tensor] = None):
    """``int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, Tensor? outlier_cols=None, Tensor? bias=None)
    -> (Tensor, Tensor?)``."""
    return F.int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols, bias)


# ---- optimizers (in place) ----
@_register("optimizer_update_32bit")
def optimizer_update_32bit(optimizer_name: str, g: Tensor, p: Tensor, state1: Tensor, state2: Optional[Tensor],
                           unorm_vec: Optional[Tensor], max_unorm: float, param_norm: float, beta1: float,
                           beta2: float, beta3: float, alpha: float, eps: float, weight_decay: float, step: int,
                           lr: float, gnorm_scale: float, skip_zeros: bool = False) -> None:
    """``optimizer_update_32bit(str optimizer_name, g, p, state1, state2?, unorm_vec?, max_unorm, param_norm, beta1,
    beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale, skip_zeros=False) -> ()`` (``param_norm`` is
    computed by the kernel where ``max_unorm > 0``, as upstream's CPU kernel)."""
    F.optimizer_update_32bit(optimizer_name, g, p, state1, beta1, eps, step, lr, state2=state2, beta2=beta2,
                             beta3=beta3, alpha=alpha, weight_decay=weight_decay, gnorm_scale=gnorm_scale,
                             unorm_vec=unorm_vec, max_unorm=max_unorm, skip_zeros=skip_zeros)


@_register("optimizer_update_8bit_blockwise")
def optimizer_update_8bit_blockwise(optimizer_name: str, g: Tensor, p: Tensor, state1: Tensor,
                                    state2: Optional[Tensor], beta1: float, beta2: float, beta3: float, alpha: float,
                                    eps: float, step: int, lr: float, qmap1: Tensor, qmap2: Optional[Tensor],
                                    absmax1: Tensor, absmax2: Optional[Tensor], weight_decay: float,
                                    gnorm_scale: float, skip_zeros: bool = False) -> None:
    """``optimizer_update_8bit_blockwise(str optimizer_name, g, p, state1, state2?, beta1, beta2, beta3, alpha, eps,
    step, lr, qmap1, qmap2?, absmax1, absmax2?, weight_decay, gnorm_scale, skip_zeros=False) -> ()``."""
    F.optimizer_update_8bit_blockwise(optimizer_name, g, p, state1, state2, beta1, beta2, beta3, alpha, eps, step, lr,
                                      qmap1, qmap2, absmax1, absmax2, weight_decay, gnorm_scale, skip_zeros)


#: The upstream ops of the op layer, each registered above (tests check this).
UPSTREAM_OPS = tuple(sorted(name for name, op in _ops.OPS.items() if op.upstream))
