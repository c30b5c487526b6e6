"""AdamW (decoupled weight decay) with 32-bit or blockwise 8-bit state. Paged variants run unpaged on CPU."""

from .optimizer import Optimizer2State


class AdamW(Optimizer2State):
    """AdamW."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        if amsgrad:
            raise NotImplementedError("AdamW: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=False)

class AdamW8bit(Optimizer2State):
    """AdamW8bit."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=8,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        if amsgrad:
            raise NotImplementedError("AdamW8bit: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=False)

class AdamW32bit(Optimizer2State):
    """AdamW32bit."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        if amsgrad:
            raise NotImplementedError("AdamW32bit: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=False)

class PagedAdamW(Optimizer2State):
    """PagedAdamW."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        if amsgrad:
            raise NotImplementedError("PagedAdamW: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=True)

class PagedAdamW8bit(Optimizer2State):
    """PagedAdamW8bit."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=8,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        if amsgrad:
            raise NotImplementedError("PagedAdamW8bit: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=True)

class PagedAdamW32bit(Optimizer2State):
    """PagedAdamW32bit."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        if amsgrad:
            raise NotImplementedError("PagedAdamW32bit: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=True)
