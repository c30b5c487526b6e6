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
