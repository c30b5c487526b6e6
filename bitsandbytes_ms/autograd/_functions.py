"""Autograd functions (MatMul8bitLt, MatMul4Bit, matmul, matmul_4bit) — built on
:mod:`bitsandbytes_ms.functional`."""
