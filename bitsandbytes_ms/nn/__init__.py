"""Quantized layers (Linear8bitLt, Linear4bit, embeddings) for mindnlp models."""

# ---- 4-bit ----
from .modules import Linear4bit, LinearFP4, LinearNF4, Params4bit  # noqa: E402,F401

# ---- int8 ----
from .modules import Int8Params, Linear8bitLt  # noqa: E402,F401

# ---- mindspore.nn Cell forms (PyNative and GRAPH_MODE / mindspore.jit; QLoRA-style training) ----
from .cells import Linear4bitCell, Linear8bitLtCell, LoRAAdapter  # noqa: E402,F401

# ---- embeddings ----
from .modules import (  # noqa: E402,F401
    Embedding, Embedding4bit, Embedding8bit, EmbeddingFP4, EmbeddingNF4, StableEmbedding,
)

# ---- weight-only int8/int4 ----
from .modules import LinearWeightOnly  # noqa: E402,F401

# ---- upstream's outlier-aware base class (OutlierTracer in bitsandbytes_ms.utils) ----
from .modules import OutlierAwareLinear  # noqa: E402,F401

# ---- full-precision layers kept in a quantized model (lm_head): native GEMV/GEMM forward ----
from .linear_fp import LinearFP, use_fast_fp_layers  # noqa: E402,F401

# ---- torch.save / torch.load of these layers, with or without bitsandbytes_ms.register() ----
# (mindtorch lacks int8/int16/int32 storages and turns bfloat16 into float16 on load; integrations/patches.py)
from ..integrations import mindtorch_patches as _mindtorch_patches  # noqa: E402,F401  (registers the patches)
from ..integrations.patches import registry as _registry  # noqa: E402

_registry.apply_on_import()
