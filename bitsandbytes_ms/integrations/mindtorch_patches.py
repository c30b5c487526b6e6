"""The patches transformers' bitsandbytes path needs on mindtorch (MindSpore NLP's torch API).
Each is registered with :data:`bitsandbytes_ms.integrations.patches.registry` and has a test."""

from .patches import registry  # noqa: F401
