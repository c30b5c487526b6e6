"""AdEMAMix (Pagliardini et al. 2024): Adam plus a slow EMA (beta3) mixed in with weight alpha; optional alpha / beta3 warm-up schedules (t_alpha, t_beta3). Upstream 0.50.2 signatures."""

from ._variants import stamp
from .optimizer import Optimizer2State


def _ademamix(self, cls, bits, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha=None, t_beta3=None, eps=1e-8, weight_decay=1e-2, optim_bits=32, min_8bit_size=4096, is_paged=False):
    super(cls, self).__init__("ademamix", params, lr, betas, eps, weight_decay, bits or optim_bits, None,
                              min_8bit_size, is_paged=is_paged, alpha=alpha, t_alpha=t_alpha, t_beta3=t_beta3)


AdEMAMix, AdEMAMix8bit, AdEMAMix32bit, PagedAdEMAMix, PagedAdEMAMix8bit, PagedAdEMAMix32bit = stamp(
    __name__, Optimizer2State, _ademamix, "AdEMAMix", paged=True)
