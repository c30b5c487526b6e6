"""bitsandbytes_ms: bitsandbytes' quantization (blockwise 8-bit, LLM.int8(), NF4/FP4, 8-bit
optimizers) for MindSpore and MindSpore NLP. ``import bitsandbytes_ms as bnb`` gives the names
bitsandbytes users know."""

from . import cextension, functional, utils  # noqa: F401  (cextension warns once if the native library is missing)
from . import _hints  # noqa: E402

_hints.install()  # one-line hints: `import torch` before mindnlp; transformers' bitsandbytes path before register()

#: The upstream bitsandbytes release whose API and numerics this package follows. ``__version__`` is that
#: release too, as ``importlib.metadata.version("bitsandbytes")`` is after ``register()``: clients (transformers,
#: peft, user code) gate features on ``bitsandbytes.__version__``.
__upstream_version__ = "0.50.2"
__version__ = __upstream_version__
#: This package's own release (its distribution metadata, ``importlib.metadata.version("bitsandbytes_ms")``).
__ms_version__ = "0.1.0"

#: transformers checks this to accept a non-CUDA bitsandbytes.
features = {"multi_backend"}
#: Devices whose tensors our kernels accept (MindSpore's CPU; the CUDA library on GPU).
supported_devices = {"cpu", "cuda"}
supported_torch_devices = supported_devices


# ---- int8 ----
from .autograd._functions import MatmulLtState, matmul  # noqa: E402,F401

# ---- 4-bit ----
from .autograd._functions import MatMul4Bit, matmul_4bit  # noqa: E402,F401


def register(patches: bool = True) -> None:
    """Opt-in: make ``import bitsandbytes`` resolve to this package (with
    ``importlib.metadata.version("bitsandbytes") == __upstream_version__``) so transformers' own
    bitsandbytes quantizers, peft and accelerate run on it, and apply the registered mindtorch
    patches. See :func:`bitsandbytes_ms.integrations.hf.register`."""
    from .integrations.hf import register as _register

    _register(patches=patches)


def __getattr__(name):
    # `bnb.nn` / `bnb.optim` work right after `import bitsandbytes_ms as bnb`, as upstream, without making the
    # plain import pay for mindnlp / mindtorch (`nn`'s layers are mindtorch modules, `optim`'s classes mindtorch
    # Optimizers; importing mindtorch replaces MindSpore Tensor methods with ones that refuse the untagged tensors
    # of MindSpore-only code using `functional`).
    if name in ("nn", "integrations", "optim"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
