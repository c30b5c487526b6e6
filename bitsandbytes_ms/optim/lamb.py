"""LAMB: Adam rule with a layer-wise trust ratio (max_unorm; 32-bit state only, the 8-bit path has no update-norm clipping, as upstream). bias_correction and adam_w_mode are accepted and ignored, as upstream."""

from .optimizer import Optimizer2State


class LAMB(Optimizer2State):
    """LAMB."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, adam_w_mode=True, optim_bits=32, args=None, min_8bit_size=4096, max_unorm=1.0):
        super().__init__("lamb", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size, max_unorm=max_unorm)


class LAMB8bit(Optimizer2State):
    """LAMB8bit."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, adam_w_mode=True, args=None, min_8bit_size=4096, max_unorm=1.0):
        # the 8-bit blockwise update has no update-norm clipping: reject what it would silently ignore
        if amsgrad:
            raise ValueError("LAMB8bit does not support amsgrad=True")
        if max_unorm != 1.0:
            raise ValueError(f"LAMB8bit: `max_unorm` other than 1.0 is not supported by the 8-bit update; got {max_unorm}")
        super().__init__("lamb", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size, max_unorm=max_unorm)


class LAMB32bit(Optimizer2State):
    """LAMB32bit."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, adam_w_mode=True, args=None, min_8bit_size=4096, max_unorm=1.0):
        super().__init__("lamb", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size, max_unorm=max_unorm)
