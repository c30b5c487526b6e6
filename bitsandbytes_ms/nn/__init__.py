"""Quantized layers (Linear8bitLt, Linear4bit, embeddings) for mindnlp models."""

# ---- int8 ----
from .modules import Int8Params, Linear8bitLt  # noqa: E402,F401
