"""LAMB: Adam rule with a layer-wise trust ratio (max_unorm; 32-bit state only, the 8-bit path has no update-norm clipping, as upstream). bias_correction and adam_w_mode are accepted and ignored, as upstream."""

from ._variants import stamp
from .optimizer import Optimizer2State


def _lamb(self, cls, bits, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, adam_w_mode=True, optim_bits=32, args=None, min_8bit_size=4096, max_unorm=1.0):
    if bits == 8:  # the 8-bit blockwise update has no update-norm clipping: reject what it would silently ignore
        if amsgrad:
            raise ValueError(f"{cls.__name__} does not support amsgrad=True")
        if max_unorm != 1.0:
            raise ValueError(f"{cls.__name__}: `max_unorm` other than 1.0 is not supported by the 8-bit update; got {max_unorm}")
    super(cls, self).__init__("lamb", params, lr, betas, eps, weight_decay, bits or optim_bits, args, min_8bit_size,
                              max_unorm=max_unorm)


LAMB, LAMB8bit, LAMB32bit = stamp(__name__, Optimizer2State, _lamb, "LAMB")
