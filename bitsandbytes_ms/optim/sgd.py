"""SGD with momentum (momentum must be > 0, as upstream 0.50.2)."""

from .optimizer import Optimizer1State, _check_beta_args


class SGD(Optimizer1State):
    """SGD."""

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, optim_bits=32, args=None, min_8bit_size=4096):
        if momentum == 0:
            raise NotImplementedError("SGD without momentum is not supported!")
        _check_beta_args(type(self).__name__, momentum=momentum, dampening=dampening)
        super().__init__("momentum", params, lr, (momentum, dampening), 0.0, weight_decay, optim_bits, args,
                         min_8bit_size)


class SGD8bit(Optimizer1State):
    """SGD8bit."""

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096):
        if momentum == 0:
            raise NotImplementedError("SGD without momentum is not supported!")
        _check_beta_args(type(self).__name__, momentum=momentum, dampening=dampening)
        super().__init__("momentum", params, lr, (momentum, dampening), 0.0, weight_decay, 8, args,
                         min_8bit_size)


class SGD32bit(Optimizer1State):
    """SGD32bit."""

    def __init__(self, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, args=None, min_8bit_size=4096):
        if momentum == 0:
            raise NotImplementedError("SGD without momentum is not supported!")
        _check_beta_args(type(self).__name__, momentum=momentum, dampening=dampening)
        super().__init__("momentum", params, lr, (momentum, dampening), 0.0, weight_decay, 32, args,
                         min_8bit_size)
