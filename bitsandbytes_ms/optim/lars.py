"""LARS: momentum rule with a trust ratio (max_unorm); PytorchLARS, the plain reference (upstream 0.50.2)."""

from .optimizer import Optimizer1State, PytorchLARS, _check_beta_args  # noqa: F401  (PytorchLARS: upstream exports it from lars)


class LARS(Optimizer1State):
    """LARS."""

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, optim_bits=32, args=None, min_8bit_size=4096, max_unorm=0.02):
        if momentum == 0:
            raise NotImplementedError("LARS without momentum is not supported!")
        _check_beta_args(type(self).__name__, momentum=momentum, dampening=dampening)
        super().__init__("lars", params, lr, (momentum, dampening), 0.0, weight_decay, optim_bits, args, min_8bit_size,
                         max_unorm=max_unorm)


class LARS8bit(Optimizer1State):
    """LARS8bit."""

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096, max_unorm=0.02):
        if momentum == 0:
            raise NotImplementedError("LARS without momentum is not supported!")
        _check_beta_args(type(self).__name__, momentum=momentum, dampening=dampening)
        super().__init__("lars", params, lr, (momentum, dampening), 0.0, weight_decay, 8, args, min_8bit_size,
                         max_unorm=max_unorm)


class LARS32bit(Optimizer1State):
    """LARS32bit."""

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096, max_unorm=0.02):
        if momentum == 0:
            raise NotImplementedError("LARS without momentum is not supported!")
        _check_beta_args(type(self).__name__, momentum=momentum, dampening=dampening)
        super().__init__("lars", params, lr, (momentum, dampening), 0.0, weight_decay, 32, args, min_8bit_size,
                         max_unorm=max_unorm)
