"""hypothesis strategies shared by the bad-input suite's test files (tests/test_fuzz_*.py)."""

from hypothesis import strategies as st

FLOATS = ("float32", "float16", "bfloat16")
SPECIALS = ("none", "nan", "inf", "-inf", "subnormal", "zero", "negzero", "huge", "tiny_block", "mixed")
seeds = st.integers(0, 2**16)


def shapes(rank_max: int = 4, big: bool = True):
    """Shapes of rank 0..rank_max with at most ~20k elements (empty ones included); ``big`` adds 1-D sizes
    that take the kernels' threaded paths."""
    ranks = [st.just([]), st.lists(st.integers(0, 3000), min_size=1, max_size=1),
             st.lists(st.integers(0, 90), min_size=2, max_size=2), st.lists(st.integers(0, 20), min_size=3, max_size=3),
             st.lists(st.integers(0, 9), min_size=4, max_size=4)][: rank_max + 1]
    if big:
        ranks.append(st.lists(st.integers(20000, 70000), min_size=1, max_size=1))
    return st.one_of(*ranks)


def mostly(valid, invalid, ratio: int = 6):
    """sampled_from with each valid value ``ratio`` times as likely as each invalid one."""
    return st.sampled_from(list(valid) * ratio + list(invalid))


def specials(none_weight: int = 4):
    return st.sampled_from(("none",) * none_weight + SPECIALS[1:])


def views():
    return st.sampled_from(("none", "none", "none", "T", "step", "offset"))


# ---- issue 34's classes (tests/test_fuzz_issue34.py; the cases in tests/fuzz_cases.py read the same tables) ----
#: functional -> the preallocated buffer arguments it takes
OUT_BUFFERS = {
    "quantize_blockwise": ("out", "absmax"), "quantize_blockwise_nested": ("out", "absmax"),
    "dequantize_blockwise": ("out",), "quantize_4bit": ("out", "absmax"), "dequantize_4bit": ("out",),
    "int8_linear_matmul": ("out",), "int8_mm_dequant": ("out",),
    "int8_double_quant": ("out_row", "out_col", "row_stats", "col_stats"),
}
#: code-map constructor -> its arguments
MAP_ARGS = {
    "create_dynamic_map": ("signed", "max_exponent_bits", "total_bits"),
    "create_normal_map": ("offset", "use_extra_value"),
    "create_fp8_map": ("signed", "exponent_bits", "precision_bits", "total_bits"),
    "create_linear_map": ("signed", "total_bits", "add_zero"),
}
#: kinds of whole blocks of edge values
EDGE_KINDS = ("normal", "zeros", "negzeros", "subnormal", "subnormal_zeros", "min_normal", "inf", "-inf", "nan",
              "huge", "huge_and_tiny", "one_value")
