"""Lion (Chen et al. 2023), sign update with decoupled weight decay."""

from .optimizer import Optimizer1State


class Lion(Optimizer1State):
    """Lion."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None,
                 min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        super().__init__("lion", params, lr, betas, 0.0, weight_decay, optim_bits, args, min_8bit_size, max_unorm,
                         skip_zeros, is_paged=False)

class Lion8bit(Optimizer1State):
    """Lion8bit."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=8, args=None,
                 min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        super().__init__("lion", params, lr, betas, 0.0, weight_decay, 8, args, min_8bit_size, max_unorm,
                         skip_zeros, is_paged=False)

class Lion32bit(Optimizer1State):
    """Lion32bit."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None,
                 min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=False):
        super().__init__("lion", params, lr, betas, 0.0, weight_decay, 32, args, min_8bit_size, max_unorm,
                         skip_zeros, is_paged=False)

class PagedLion(Optimizer1State):
    """PagedLion."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None,
                 min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        super().__init__("lion", params, lr, betas, 0.0, weight_decay, optim_bits, args, min_8bit_size, max_unorm,
                         skip_zeros, is_paged=True)

class PagedLion8bit(Optimizer1State):
    """PagedLion8bit."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=8, args=None,
                 min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        super().__init__("lion", params, lr, betas, 0.0, weight_decay, 8, args, min_8bit_size, max_unorm,
                         skip_zeros, is_paged=True)

class PagedLion32bit(Optimizer1State):
    """PagedLion32bit."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None,
                 min_8bit_size=4096, max_unorm=0.0, skip_zeros=False, is_paged=True):
        super().__init__("lion", params, lr, betas, 0.0, weight_decay, 32, args, min_8bit_size, max_unorm,
                         skip_zeros, is_paged=True)
