"""Adam with 32-bit or blockwise 8-bit state (upstream 0.50.2 signatures; weight decay is decoupled, p *= 1 - lr*wd, as upstream's CPU kernels). Paged variants run unpaged on CPU (no unified memory)."""

from .optimizer import Optimizer2State


class Adam(Optimizer2State):
    """Adam: amsgrad is accepted and ignored, as upstream."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False):
        super().__init__("adam", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size,
                         is_paged=is_paged)


class Adam8bit(Optimizer2State):
    """Adam8bit: always 8-bit state."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False):
        if amsgrad:
            raise ValueError("Adam8bit does not support amsgrad=True")
        if optim_bits != 32:  # kept in the signature for compatibility; the state is always 8-bit
            raise ValueError(f"Adam8bit: `optim_bits` must be left at 32 (the state is always 8-bit); got {optim_bits!r}")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size,
                         is_paged=is_paged)


class Adam32bit(Optimizer2State):
    """Adam32bit: amsgrad is accepted and ignored, as upstream."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False):
        super().__init__("adam", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size,
                         is_paged=is_paged)


class PagedAdam(Optimizer2State):
    """PagedAdam: amsgrad is accepted and ignored, as upstream."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False):
        super().__init__("adam", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size,
                         is_paged=True)


class PagedAdam8bit(Optimizer2State):
    """PagedAdam8bit: always 8-bit state."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False):
        if amsgrad:
            raise ValueError("PagedAdam8bit does not support amsgrad=True")
        if optim_bits != 32:  # kept in the signature for compatibility; the state is always 8-bit
            raise ValueError(f"PagedAdam8bit: `optim_bits` must be left at 32 (the state is always 8-bit); got {optim_bits!r}")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size,
                         is_paged=True)


class PagedAdam32bit(Optimizer2State):
    """PagedAdam32bit: amsgrad is accepted and ignored, as upstream."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False):
        super().__init__("adam", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size,
                         is_paged=True)
