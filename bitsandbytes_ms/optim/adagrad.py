"""Adagrad (lr_decay=0 and initial_accumulator_value=0 only, as upstream)."""

from ._variants import stamp
from .optimizer import Optimizer1State, _check_nonnegative


def _adagrad(self, cls, bits, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
             optim_bits=32, args=None, min_8bit_size=4096):
    _check_nonnegative(type(self).__name__, lr=lr, weight_decay=weight_decay, eps=eps)
    if initial_accumulator_value != 0.0:
        raise ValueError("Initial accumulator value != 0.0 not supported!")
    if lr_decay != 0.0:
        raise ValueError("Lr Decay != 0.0 not supported!")
    if bits == 8 and optim_bits != 8:  # Adagrad32bit ignores its optim_bits, as upstream
        raise ValueError(f"{cls.__name__}: `optim_bits` must be 8; got {optim_bits}")
    super(cls, self).__init__("adagrad", params, lr, (0.0, 0.0), eps, weight_decay, bits or optim_bits, args,
                              min_8bit_size)


# upstream's Adagrad8bit / Adagrad32bit keep optim_bits, defaulting to their width
Adagrad, Adagrad8bit, Adagrad32bit = stamp(__name__, Optimizer1State, _adagrad, "Adagrad", keep=("optim_bits",),
                                           pin_bits=True)
