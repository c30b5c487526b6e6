"""RMSprop (momentum=0, centered=False only, as upstream 0.50.2)."""

from ._variants import stamp
from .optimizer import Optimizer1State, _check_beta_args


def _rmsprop(self, cls, bits, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0, centered=False, optim_bits=32, args=None, min_8bit_size=4096):
    if alpha == 0:
        raise NotImplementedError("RMSprop with alpha==0.0 is not supported!")
    if centered:
        raise NotImplementedError("Centered RMSprop is not supported!")
    _check_beta_args(type(self).__name__, alpha=alpha, momentum=momentum)
    super(cls, self).__init__("rmsprop", params, lr, (alpha, momentum), eps, weight_decay, bits or optim_bits, args,
                              min_8bit_size)


RMSprop, RMSprop8bit, RMSprop32bit = stamp(__name__, Optimizer1State, _rmsprop, "RMSprop")
