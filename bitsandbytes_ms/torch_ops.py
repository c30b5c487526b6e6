"""Upstream's ``torch.ops.bitsandbytes.<op>`` operators (bitsandbytes 0.50 ``_ops.py`` schemas), as plain
callables over :mod:`bitsandbytes_ms.functional`.

Upstream registers its kernels as torch custom ops and code such as its test-suite or Hugging Face
integrations calls them directly, e.g. ``torch.ops.bitsandbytes.quantize_4bit(A, blocksize, quant_type,
quant_storage) -> (packed, absmax)``. MindSpore has no torch op registry, so the same signatures live in
the namespace :data:`bitsandbytes` here (``from bitsandbytes_ms.torch_ops import bitsandbytes as ops``;
``ops.quantize_4bit(...)`` and ``ops.quantize_4bit.default(...)`` both work, as on a torch ``OpOverloadPacket``).

Only the blockwise 8-bit and 4-bit operators are defined in this file; each returns plain tensors (no
QuantState), in the dtypes/shapes of upstream's schema.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import mindspore as ms
from mindspore import Tensor

from . import functional as F
from .cextension import tag_device


class _Op:
    """A callable with a ``.default`` overload (and ``.out`` where upstream has one), like torch's OpOverloadPacket."""

    def __init__(self, fn, name: str):
        self._fn = fn
        self.default = fn
        self.__name__ = name
        self.__doc__ = fn.__doc__

    def __call__(self, *args, **kwargs):
        return self._fn(*args, **kwargs)

    def __repr__(self):
        return f"bitsandbytes_ms.torch_ops.bitsandbytes.{self.__name__}"


class _Namespace:
    def __repr__(self):
        return "bitsandbytes_ms.torch_ops.bitsandbytes"


#: The ``torch.ops.bitsandbytes`` namespace.
bitsandbytes = _Namespace()


def _register(name: str):
    def deco(fn):
        def op(*args, **kwargs):
            # results (and tensors taken from a QuantState) carry the inputs' mindtorch device, as torch ops' do
            res = fn(*args, **kwargs)
            tag_device(res, like=tuple(a for a in args if isinstance(a, Tensor)))
            return res

        op.__doc__, op.__name__ = fn.__doc__, name
        setattr(bitsandbytes, name, _Op(op, name))
        return fn
    return deco


# ---- blockwise 8-bit ----
@_register("quantize_blockwise")
def quantize_blockwise(A: Tensor, code: Tensor, blocksize: int) -> Tuple[Tensor, Tensor]:
    """``quantize_blockwise(Tensor A, Tensor code, int blocksize) -> (Tensor uint8 [A.shape], Tensor fp32 absmax)``."""
    out, state = F.quantize_blockwise(A, code=code, blocksize=blocksize)
    return out, state.absmax


@_register("dequantize_blockwise")
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


@_register("dequantize_4bit")
def dequantize_4bit(A: Tensor, absmax: Tensor, blocksize: int, quant_type: str, shape: Sequence[int], dtype) -> Tensor:
    """``dequantize_4bit(Tensor A, Tensor absmax, int blocksize, str quant_type, int[] shape, ScalarType dtype)``."""
    state = F.QuantState(absmax=absmax, shape=tuple(int(s) for s in shape), dtype=dtype, blocksize=blocksize,
                         quant_type=quant_type, code=F.get_4bit_type(quant_type))
    res = F.dequantize_4bit(A.reshape(-1, 1), state)
    return res


@_register("gemv_4bit")
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
    absmax_offset=None) -> Tensor``: ``A[..., K] @ W[N, K]^T + bias``.

    With double quantization, ``absmax`` is the nested (fp32) absmax, ``absmax_8bit`` the uint8 codes,
    ``absmax_code`` their 256-entry code and ``absmax_offset`` the offset (any float dtype, read as fp32);
    the nested blocksize is 256, as upstream's quantize_4bit produces.
    """
    from .autograd._functions import matmul_4bit

    code = F.get_4bit_type(quant_type)
    shape = tuple(int(s) for s in shapeB)
    if absmax_8bit is not None:
        if absmax_code is None or absmax_offset is None:
            raise ValueError("gemm_4bit: `absmax_code` and `absmax_offset` are required with `absmax_8bit`")
        offset = absmax_offset if isinstance(absmax_offset, Tensor) else Tensor(float(absmax_offset), ms.float32)
        offset = offset.astype(ms.float32)
        state2 = F.QuantState(absmax=absmax, code=absmax_code, blocksize=256, dtype=ms.float32)
        state = F.QuantState(absmax=absmax_8bit, shape=shape, dtype=A.dtype, blocksize=blocksize, code=code,
                             quant_type=quant_type, offset=offset, state2=state2)
    else:
        state = F.QuantState(absmax=absmax, shape=shape, dtype=A.dtype, blocksize=blocksize, code=code,
                             quant_type=quant_type)
    return matmul_4bit(A, B, state, bias=bias)


# ---- int8 (LLM.int8()) ----
# Upstream schemas (bitsandbytes 0.50 _ops.py): int8_linear_matmul(A, B) / .out(A, B, out);
# int8_vectorwise_quant(A, threshold=0.0) -> (int8, fp32 row_stats, outlier_cols?);
# int8_vectorwise_dequant(A, stats); int8_mm_dequant(A, row_stats, col_stats, dtype=None, bias=None);
# int8_scaled_mm(A, B, row_stats, col_stats, bias=None, dtype=None);
# int8_mixed_scaled_mm(A, CA, CB, SCA, SCB, outlier_cols=None, bias=None) -> (out, subA?).
@_register("int8_linear_matmul")
def int8_linear_matmul(A: Tensor, B: Tensor) -> Tensor:
    """``int8_linear_matmul(Tensor A int8 [..., K], Tensor B int8 [N, K]) -> Tensor int32 [..., N]``."""
    return F.int8_linear_matmul(A, B)


def _int8_linear_matmul_out(A: Tensor, B: Tensor, out: Tensor) -> Tensor:
    """``int8_linear_matmul.out(Tensor A, Tensor B, Tensor(a!) out) -> Tensor(a!)``: writes into ``out``."""
    return F.int8_linear_matmul(A, B, out=out)


bitsandbytes.int8_linear_matmul.out = _int8_linear_matmul_out


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
    res = F._mm_dequant(A, row_stats, col_stats, bias, ms.float16 if dtype is None else dtype, "int8_mm_dequant")
    return F._tag(res, (A,))


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
