"""bitsandbytes_ms: bitsandbytes' quantization (blockwise 8-bit, LLM.int8(), NF4/FP4, 8-bit
optimizers) for MindSpore and MindSpore NLP. ``import bitsandbytes_ms as bnb`` gives the names
bitsandbytes users know."""

from . import cextension, functional, utils  # noqa: F401  (cextension raises one clear error if the library is missing)

__version__ = "0.1.0"
#: The upstream bitsandbytes release whose API and numerics this package follows.
__upstream_version__ = "0.50.2"

#: transformers checks this to accept a non-CUDA bitsandbytes.
features = {"multi_backend"}
#: Devices whose tensors our kernels accept (MindSpore's CPU; the CUDA library on GPU).
supported_devices = {"cpu", "cuda"}
supported_torch_devices = supported_devices

# ---- int8 ----
from .autograd._functions import MatmulLtState, matmul  # noqa: E402,F401


def __getattr__(name):
    # `bnb.nn` is imported on first use: it imports mindnlp (for mindtorch), which is heavy.
    if name == "nn":
        import importlib

        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
