"""Adam (Kingma & Ba) with 32-bit or blockwise 8-bit state. Paged variants run unpaged on CPU."""

from .optimizer import Optimizer2State


class Adam(Optimizer2State):
    """Adam: weight_decay is decoupled (p *= 1 - lr*wd), as upstream's CPU kernels; optim_bits selects 8/32-bit state."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        if amsgrad:
            raise NotImplementedError("Adam: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=False)

class Adam8bit(Optimizer2State):
    """Adam8bit: weight_decay is decoupled (p *= 1 - lr*wd), as upstream's CPU kernels; optim_bits is fixed to 8."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=8,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        if amsgrad:
            raise NotImplementedError("Adam8bit: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=False)

class Adam32bit(Optimizer2State):
    """Adam32bit: weight_decay is decoupled (p *= 1 - lr*wd), as upstream's CPU kernels; optim_bits is fixed to 32."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        if amsgrad:
            raise NotImplementedError("Adam32bit: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=False)

class PagedAdam(Optimizer2State):
    """PagedAdam: weight_decay is decoupled (p *= 1 - lr*wd), as upstream's CPU kernels; optim_bits selects 8/32-bit state."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        if amsgrad:
            raise NotImplementedError("PagedAdam: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, optim_bits, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=True)

class PagedAdam8bit(Optimizer2State):
    """PagedAdam8bit: weight_decay is decoupled (p *= 1 - lr*wd), as upstream's CPU kernels; optim_bits is fixed to 8."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=8,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        if amsgrad:
            raise NotImplementedError("PagedAdam8bit: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 8, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=True)

class PagedAdam32bit(Optimizer2State):
    """PagedAdam32bit: weight_decay is decoupled (p *= 1 - lr*wd), as upstream's CPU kernels; optim_bits is fixed to 32."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32,
                 args=None, min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        if amsgrad:
            raise NotImplementedError("PagedAdam32bit: amsgrad is not supported")
        super().__init__("adam", params, lr, betas, eps, weight_decay, 32, args, min_8bit_size,
                         max_unorm, skip_zeros, is_paged=True)
