"""Lion (Chen et al. 2023): sign update, decoupled weight decay (upstream 0.50.2 signatures)."""

from ._variants import stamp
from .optimizer import Optimizer1State


def _lion(self, cls, bits, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False):
    super(cls, self).__init__("lion", params, lr, betas, 0.0, weight_decay, bits or optim_bits, args, min_8bit_size,
                              is_paged=is_paged)


Lion, Lion8bit, Lion32bit, PagedLion, PagedLion8bit, PagedLion32bit = stamp(
    __name__, Optimizer1State, _lion, "Lion", paged=True)
