"""LARS: momentum rule with a trust ratio (max_unorm); PytorchLARS, the plain reference (upstream 0.50.2)."""

from ._variants import stamp
from .optimizer import Optimizer1State, PytorchLARS, _check_beta_args  # noqa: F401  (PytorchLARS: upstream exports it from lars)


def _lars(self, cls, bits, params, lr, momentum=0, dampening=0, weight_decay=0, nesterov=False, optim_bits=32, args=None, min_8bit_size=4096, max_unorm=0.02):
    if momentum == 0:
        raise NotImplementedError("LARS without momentum is not supported!")
    _check_beta_args(type(self).__name__, momentum=momentum, dampening=dampening)
    super(cls, self).__init__("lars", params, lr, (momentum, dampening), 0.0, weight_decay, bits or optim_bits, args,
                              min_8bit_size, max_unorm=max_unorm)


LARS, LARS8bit, LARS32bit = stamp(__name__, Optimizer1State, _lars, "LARS")
