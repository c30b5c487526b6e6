"""The 8-bit optimizers' format door: upstream's functional optimizer updates (optimizer_update_32bit,
optimizer_update_8bit_blockwise), validated here and run in place by the op (the native kernels update p, the
states and absmax in the tensors' own buffers, as bitsandbytes' C functions do; see
:mod:`bitsandbytes_ms.backends.native`). :mod:`bitsandbytes_ms.functional` re-exports every name here."""

from __future__ import annotations

from typing import Optional

import numpy as np
import mindspore as ms
from mindspore import Tensor

from .. import _ops
from .._formats_common import (FLOAT_DTYPES, _check_dtype, _fn_name, _numel)


# ---- optim ----
# Optimizer updates (upstream functional.optimizer_update_32bit / optimizer_update_8bit_blockwise): validated
# here, run by the op (in place: the native kernels update p / state / absmax in the tensors' own buffers, as
# bitsandbytes' C functions do; see bitsandbytes_ms.backends.native).

OPTIM_BLOCKSIZE = 256
_OPT_ALIAS = {"lamb": "adam", "lars": "momentum"}
_TWO_STATE = ("adam", "ademamix")


def _optim_name(fn: str, optimizer_name: str) -> str:
    name = _OPT_ALIAS.get(optimizer_name, optimizer_name)
    if name not in _ops.OPTIMIZERS:
        raise ValueError(f"{_fn_name(fn, 'optimizer_name')} must be one of "
                         f"{tuple(sorted(set(_ops.OPTIMIZERS) | set(_OPT_ALIAS)))}; got {optimizer_name!r}")
    return name


def _check_numel(t: Tensor, n: int, fn: str, arg: str) -> None:
    if _numel(t) != n:
        raise ValueError(f"{_fn_name(fn, arg)} must have {n} elements; got shape {tuple(t.shape)}")


def _check_optim_scalars(fn: str, step, **values) -> None:
    """The update's scalar hyper-parameters must be numbers and ``step`` an int, as upstream's ctypes call
    (``c_float("0.1")`` / ``c_int32(1.5)`` raise TypeError there): a string would otherwise pass ``float()`` here
    and run (issue 34)."""
    for arg, v in values.items():
        if isinstance(v, Tensor) and v.ndim == 0 and v.dtype in FLOAT_DTYPES + (ms.int32, ms.int64):
            continue
        if not isinstance(v, (int, float, np.integer, np.floating)):
            raise TypeError(f"{_fn_name(fn, arg)} must be a number; got {type(v).__name__} {v!r}")
    ok = isinstance(step, (int, np.integer)) and not isinstance(step, bool)
    if isinstance(step, Tensor) and step.ndim == 0 and step.dtype in (ms.int32, ms.int64):
        ok = True
    if not ok:
        raise TypeError(f"{_fn_name(fn, 'step')} must be an int; got {type(step).__name__} {step!r}")


def optimizer_update_32bit(optimizer_name: str, g: Tensor, p: Tensor, state1: Tensor, beta1: float, eps: float,
                           step: int, lr: float, state2: Optional[Tensor] = None, beta2: float = 0.0,
                           beta3: float = 0.0, alpha: float = 0.0, weight_decay: float = 0.0,
                           gnorm_scale: float = 1.0, unorm_vec: Optional[Tensor] = None, max_unorm: float = 0.0,
                           skip_zeros=False) -> None:
    """In-place optimizer update with 32-bit state (upstream 0.50 CPU numerics, native kernel).

    Args:
        optimizer_name: adam, momentum, rmsprop, lion, adagrad, ademamix, lamb (adam rule + trust
            ratio), lars (momentum rule + trust ratio).
        g, p: gradient and parameter, same dtype (float32 / float16 / bfloat16) and element count.
        state1: float32, p's size ([2, *p.shape] for ademamix: m1, m2). state2: float32 (adam,
            ademamix: the second moment), else None.
        max_unorm: > 0 scales the step so that ||update|| <= max_unorm * ||p|| (LAMB/LARS;
            adam/momentum/rmsprop rules); ``unorm_vec`` (float32[1]) then receives ||update||.
        skip_zeros: accepted and ignored, as on upstream's CPU backend.

    p, state1, state2 and unorm_vec are updated in place. Raises ValueError/TypeError naming the
    argument for a bad optimizer name, dtype or size.
    """
    fn = "optimizer_update_32bit"
    _check_dtype(p, FLOAT_DTYPES, fn, "p")
    _check_dtype(g, (p.dtype,), fn, "g")
    name = _optim_name(fn, optimizer_name)
    n = _numel(p)
    _check_numel(g, n, fn, "g")
    _check_dtype(state1, (ms.float32,), fn, "state1")
    _check_numel(state1, 2 * n if name == "ademamix" else n, fn, "state1")
    if name in _TWO_STATE:
        if state2 is None:
            raise ValueError(f"{_fn_name(fn, 'state2')} is required for {optimizer_name}")
        _check_dtype(state2, (ms.float32,), fn, "state2")
        _check_numel(state2, n, fn, "state2")
    else:
        state2 = None
    if unorm_vec is not None:
        _check_dtype(unorm_vec, (ms.float32,), fn, "unorm_vec")
        _check_numel(unorm_vec, 1, fn, "unorm_vec")  # upstream's float32[1]: receives ||update||
    _check_optim_scalars(fn, step, beta1=beta1, beta2=beta2, beta3=beta3, alpha=alpha, eps=eps, lr=lr,
                         weight_decay=weight_decay, gnorm_scale=gnorm_scale, max_unorm=max_unorm)
    if int(step) < 1:
        raise ValueError(f"{_fn_name(fn, 'step')} must be >= 1; got {step}")
    if n == 0:
        return None
    _ops.optimizer_update_32bit(name, g, p, state1, state2, unorm_vec, float(max_unorm), 0.0, float(beta1),
                                float(beta2), float(beta3), float(alpha), float(eps), float(weight_decay), int(step),
                                float(lr), float(gnorm_scale), bool(skip_zeros))
    return None


def optimizer_update_8bit_blockwise(optimizer_name: str, g: Tensor, p: Tensor, state1: Tensor,
                                    state2: Optional[Tensor], beta1: float, beta2: float, beta3: float, alpha: float,
                                    eps: float, step: int, lr: float, qmap1: Tensor, qmap2: Optional[Tensor],
                                    absmax1: Tensor, absmax2: Optional[Tensor], weight_decay: float = 0.0,
                                    gnorm_scale: float = 1.0, skip_zeros=False) -> None:
    """In-place optimizer update with blockwise 8-bit state (blocksize 256), fused per block:
    dequantize ``code[q] * absmax``, update in float32 (upstream 0.50 CPU rules), requantize with
    quantize_blockwise's lookup table (same bytes as upstream's CPU kernel).

    Args:
        g, p: same float dtype and size. state1: uint8 (``[2, *p.shape]`` for ademamix), state2:
            uint8 or None (adam, ademamix need it). qmap1/qmap2: float32[256] codes (upstream uses
            the signed / unsigned dynamic maps). absmax1: float32[ceil(n/256)] (``[2, nb]`` for
            ademamix), absmax2 likewise or None.

    p, state1, state2, absmax1, absmax2 are updated in place.
    """
    fn = "optimizer_update_8bit_blockwise"
    _check_dtype(p, FLOAT_DTYPES, fn, "p")
    _check_dtype(g, (p.dtype,), fn, "g")
    name = _optim_name(fn, optimizer_name)
    n = _numel(p)
    nb = -(-n // OPTIM_BLOCKSIZE)
    mult = 2 if name == "ademamix" else 1
    _check_numel(g, n, fn, "g")
    _check_dtype(state1, (ms.uint8,), fn, "state1")
    _check_numel(state1, mult * n, fn, "state1")
    _check_dtype(qmap1, (ms.float32,), fn, "qmap1")
    _check_numel(qmap1, 256, fn, "qmap1")
    _check_dtype(absmax1, (ms.float32,), fn, "absmax1")
    _check_numel(absmax1, mult * nb, fn, "absmax1")
    if name in _TWO_STATE:
        for t, arg in ((state2, "state2"), (qmap2, "qmap2"), (absmax2, "absmax2")):
            if t is None:
                raise ValueError(f"{_fn_name(fn, arg)} is required for {optimizer_name}")
        _check_dtype(state2, (ms.uint8,), fn, "state2")
        _check_numel(state2, n, fn, "state2")
        _check_dtype(qmap2, (ms.float32,), fn, "qmap2")
        _check_numel(qmap2, 256, fn, "qmap2")
        _check_dtype(absmax2, (ms.float32,), fn, "absmax2")
        _check_numel(absmax2, nb, fn, "absmax2")
    else:
        state2 = qmap2 = absmax2 = None
    _check_optim_scalars(fn, step, beta1=beta1, beta2=beta2, beta3=beta3, alpha=alpha, eps=eps, lr=lr,
                         weight_decay=weight_decay, gnorm_scale=gnorm_scale)
    if int(step) < 1:
        raise ValueError(f"{_fn_name(fn, 'step')} must be >= 1; got {step}")
    if n == 0:
        return None
    _ops.optimizer_update_8bit_blockwise(name, g, p, state1, state2, float(beta1), float(beta2), float(beta3),
                                         float(alpha), float(eps), int(step), float(lr), qmap1, qmap2, absmax1,
                                         absmax2, float(weight_decay), float(gnorm_scale), bool(skip_zeros))
    return None
