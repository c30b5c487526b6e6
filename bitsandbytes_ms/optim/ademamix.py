"""AdEMAMix (Pagliardini et al. 2024): Adam plus a slow EMA (beta3) mixed in with weight alpha; optional alpha / beta3 warm-up schedules (t_alpha, t_beta3). Upstream 0.50.2 signatures."""

from .optimizer import Optimizer2State


class AdEMAMix(Optimizer2State):
    """AdEMAMix."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8, weight_decay=1e-2, optim_bits=32, min_8bit_size=4096, is_paged=False):
        super().__init__("ademamix", params, lr, betas, eps, weight_decay, optim_bits, None, min_8bit_size,
                         is_paged=is_paged, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3)


class AdEMAMix8bit(Optimizer2State):
    """AdEMAMix8bit."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8, weight_decay=1e-2, min_8bit_size=4096, is_paged=False):
        super().__init__("ademamix", params, lr, betas, eps, weight_decay, 8, None, min_8bit_size,
                         is_paged=is_paged, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3)


class AdEMAMix32bit(Optimizer2State):
    """AdEMAMix32bit."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8, weight_decay=1e-2, min_8bit_size=4096, is_paged=False):
        super().__init__("ademamix", params, lr, betas, eps, weight_decay, 32, None, min_8bit_size,
                         is_paged=is_paged, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3)


class PagedAdEMAMix(Optimizer2State):
    """PagedAdEMAMix."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8, weight_decay=1e-2, optim_bits=32, min_8bit_size=4096):
        super().__init__("ademamix", params, lr, betas, eps, weight_decay, optim_bits, None, min_8bit_size,
                         is_paged=True, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3)


class PagedAdEMAMix8bit(Optimizer2State):
    """PagedAdEMAMix8bit."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8, weight_decay=1e-2, min_8bit_size=4096):
        super().__init__("ademamix", params, lr, betas, eps, weight_decay, 8, None, min_8bit_size,
                         is_paged=True, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3)


class PagedAdEMAMix32bit(Optimizer2State):
    """PagedAdEMAMix32bit."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8, weight_decay=1e-2, min_8bit_size=4096):
        super().__init__("ademamix", params, lr, betas, eps, weight_decay, 32, None, min_8bit_size,
                         is_paged=True, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3)
