"""Adam with 32-bit or blockwise 8-bit state (upstream 0.50.2 signatures; weight decay is decoupled, p *= 1 - lr*wd, as upstream's CPU kernels). Paged variants run unpaged on CPU (no unified memory)."""

from ._variants import stamp
from .optimizer import Optimizer2State


def _adam(self, cls, bits, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, optim_bits=32, args=None, min_8bit_size=4096, is_paged=False):
    # (AdamW's family too.) amsgrad is accepted and ignored, as upstream, except by the 8-bit variants
    if bits == 8:
        if amsgrad:
            raise ValueError(f"{cls.__name__} does not support amsgrad=True")
        if optim_bits != 32:  # kept in the signature for compatibility; the state is always 8-bit
            raise ValueError(f"{cls.__name__}: `optim_bits` must be left at 32 (the state is always 8-bit); got {optim_bits!r}")
    super(cls, self).__init__("adam", params, lr, betas, eps, weight_decay, bits or optim_bits, args, min_8bit_size,
                              is_paged=is_paged)


# every variant keeps optim_bits and is_paged in its signature (the Paged ones ignore is_paged), as upstream
Adam, Adam8bit, Adam32bit, PagedAdam, PagedAdam8bit, PagedAdam32bit = stamp(
    __name__, Optimizer2State, _adam, "Adam", paged=True, keep=("optim_bits", "is_paged"),
    doc="{name}: amsgrad is accepted and ignored, as upstream.", doc8="{name}: always 8-bit state.")
