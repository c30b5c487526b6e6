"""AdamW with 32-bit or blockwise 8-bit state (upstream 0.50.2 signatures; weight decay is decoupled, p *= 1 - lr*wd, as upstream's CPU kernels). Paged variants run unpaged on CPU (no unified memory)."""

from ._variants import stamp
from .adam import _adam
from .optimizer import Optimizer2State

# Adam's family with weight_decay=1e-2; upstream's Paged variants drop is_paged here (not in Adam)
AdamW, AdamW8bit, AdamW32bit, PagedAdamW, PagedAdamW8bit, PagedAdamW32bit = stamp(
    __name__, Optimizer2State, _adam, "AdamW", paged=True, keep=("optim_bits",), defaults=dict(weight_decay=1e-2),
    doc="{name}: amsgrad is accepted and ignored, as upstream.", doc8="{name}: always 8-bit state.")
