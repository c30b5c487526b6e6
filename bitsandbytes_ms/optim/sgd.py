"""SGD with momentum (momentum must be > 0, as upstream 0.50.2)."""

from ._variants import stamp
from .optimizer import Optimizer1State, _check_beta_args


def _sgd(self, cls, bits, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, optim_bits=32, args=None, min_8bit_size=4096):
    if momentum == 0:
        raise NotImplementedError("SGD without momentum is not supported!")
    _check_beta_args(type(self).__name__, momentum=momentum, dampening=dampening)
    super(cls, self).__init__("momentum", params, lr, (momentum, dampening), 0.0, weight_decay, bits or optim_bits,
                              args, min_8bit_size)


SGD, SGD8bit, SGD32bit = stamp(__name__, Optimizer1State, _sgd, "SGD")
