"""Adagrad (lr_decay=0 and initial_accumulator_value=0 only, as upstream)."""

from .optimizer import Optimizer1State, _check_nonnegative


class Adagrad(Optimizer1State):
    """Adagrad."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 optim_bits=32, args=None, min_8bit_size=4096):
        _check_nonnegative(type(self).__name__, lr=lr, weight_decay=weight_decay, eps=eps)
        if initial_accumulator_value != 0.0:
            raise ValueError("Initial accumulator value != 0.0 not supported!")
        if lr_decay != 0.0:
            raise ValueError("Lr Decay != 0.0 not supported!")
        super().__init__("adagrad", params, lr, (0.0, 0.0), eps, weight_decay, optim_bits, args, min_8bit_size)

class Adagrad8bit(Optimizer1State):
    """Adagrad8bit."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 optim_bits=8, args=None, min_8bit_size=4096):
        _check_nonnegative(type(self).__name__, lr=lr, weight_decay=weight_decay, eps=eps)
        if initial_accumulator_value != 0.0:
            raise ValueError("Initial accumulator value != 0.0 not supported!")
        if lr_decay != 0.0:
            raise ValueError("Lr Decay != 0.0 not supported!")
        if optim_bits != 8:
            raise ValueError(f"Adagrad8bit: `optim_bits` must be 8; got {optim_bits}")
        super().__init__("adagrad", params, lr, (0.0, 0.0), eps, weight_decay, 8, args, min_8bit_size)

class Adagrad32bit(Optimizer1State):
    """Adagrad32bit."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 optim_bits=32, args=None, min_8bit_size=4096):
        _check_nonnegative(type(self).__name__, lr=lr, weight_decay=weight_decay, eps=eps)
        if initial_accumulator_value != 0.0:
            raise ValueError("Initial accumulator value != 0.0 not supported!")
        if lr_decay != 0.0:
            raise ValueError("Lr Decay != 0.0 not supported!")
        super().__init__("adagrad", params, lr, (0.0, 0.0), eps, weight_decay, 32, args, min_8bit_size)
