"""Quantized modules, composed from :mod:`bitsandbytes_ms.autograd._functions`."""
