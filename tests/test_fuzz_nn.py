"""Bad-input suite, nn: the linear layers (Linear4bit NF4 / FP4 with double quant, Linear8bitLt, LinearWeightOnly
int8/int4, LinearFP) on inputs of random rank, rows (0, 1, above the fused-kernel row limits), dtype, feature
count and special values, checked against the layer's own dequantized weight in float64; and the embeddings
with random, negative, out-of-range and non-integer indices (tests/fuzz_pool.py says how outcomes are classified)."""

from hypothesis import strategies as st

from fuzz_pool import collect, run_area
from fuzz_strategies import FLOATS, mostly, seeds

LAYERS = ("Linear4bit", "Linear4bit_fp4_dq", "Linear8bitLt", "LinearWeightOnly8", "LinearWeightOnly4", "LinearFP")
EMBEDDINGS = ("Embedding", "StableEmbedding", "Embedding8bit", "EmbeddingNF4", "EmbeddingFP4")


def linear_params():
    return st.fixed_dictionaries(dict(
        kind=st.sampled_from(LAYERS), in_f=st.sampled_from([1, 16, 63, 64, 100]), out_f=st.sampled_from([1, 8, 33]),
        bias=st.booleans(), lead=st.sampled_from([[], [1], [3], [2, 5], [0], [40], [1, 1, 2]]),
        features_delta=mostly((0,), (-1, 1), 10), dtype=mostly(FLOATS, ("int64", "int32", "float64"), 8),
        special=st.sampled_from(["none"] * 8 + ["nan", "inf", "zero", "negzero"]), seed=st.sampled_from([0, 1]),
        rank0=mostly((False,), (True,), 25), train=st.booleans()))


def embedding_params():
    return st.fixed_dictionaries(dict(
        kind=st.sampled_from(EMBEDDINGS), num=st.sampled_from([1, 10, 50]), dim=st.sampled_from([64, 128, 96]),
        idx_shape=st.sampled_from([[], [1], [7], [2, 3], [0], [3, 0], [2, 2, 2]]),
        idx_dtype=mostly(("int64", "int32"), ("float32", "uint8", "bool", "int16", "float16"), 8),
        bad=mostly((None,), ("neg", "past", "far", "min"), 8), seed=seeds))


def test_fuzz_linear_layers(fuzz_pool):
    (params,) = collect((linear_params, 260))
    for p in params:  # in_features 1 has no fewer features to give
        if p["features_delta"] < 0 and p["in_f"] == 1:
            p["features_delta"] = 1
    run_area(fuzz_pool, "nn", [("linear_forward", p) for p in params])


def test_fuzz_embeddings(fuzz_pool):
    (params,) = collect((embedding_params, 160))
    run_area(fuzz_pool, "nn", [("embedding", p) for p in params])


def linear_dtype_sequence_params():
    # issue 34: caches keyed on the first call's dtype must follow every later call's
    return st.fixed_dictionaries(dict(
        dtypes=st.lists(st.sampled_from(FLOATS), min_size=2, max_size=7), bias_dtype=st.sampled_from(FLOATS),
        compute_dtype=st.sampled_from(("none",) + FLOATS), rows=st.sampled_from([1, 3, 40]), seed=seeds))


def test_fuzz_linear_state_across_calls(fuzz_pool):
    (cases,) = collect((linear_dtype_sequence_params, 40))
    run_area(fuzz_pool, "nn", [("linear4bit_dtype_sequence", p) for p in cases])
