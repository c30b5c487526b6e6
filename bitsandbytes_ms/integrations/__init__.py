"""Model-level integration with MindSpore NLP (mindnlp): model surgery, post-training quantization,
evaluation, and the opt-in registration that lets transformers' bitsandbytes code run on this package."""

from .fused import fuse, is_fused, unfuse  # noqa: F401
from .hf import register, unregister  # noqa: F401
from .models import (  # noqa: F401
    default_modules_to_not_convert,
    dequantize,
    find_linear_layers,
    quant_4bit,
    quant_8bit,
    replace_with_bnb_linear,
)
