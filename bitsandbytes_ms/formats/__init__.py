"""One module per quantization format, each the one door to its kernels (issue 35): :mod:`.fourbit` (NF4/FP4)."""
