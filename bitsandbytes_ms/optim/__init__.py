"""8-bit optimizers (blockwise-quantized state)."""
