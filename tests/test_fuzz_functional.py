"""Bad-input suite, functional: blockwise 8-bit, 4-bit, LLM.int8() and weight-only quantization on random
shapes (empty ones included), dtypes, views, blocksizes and special values (NaN, inf, subnormals, -0), each
case run in a worker process and checked against the numpy reference or refused with a clear error
(tests/fuzz_pool.py says how outcomes are classified)."""

from hypothesis import strategies as st

from fuzz_pool import collect, run_area
from fuzz_strategies import FLOATS, mostly, seeds, shapes, specials, views

BLOCKWISE = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FOURBIT = (32, 64, 128, 256, 512, 1024, 2048, 4096)


def blockwise_params():
    return st.fixed_dictionaries(dict(
        shape=shapes(), dtype=mostly(FLOATS, ("int8", "int32", "float64", "uint8")), view=views(),
        blocksize=mostly(BLOCKWISE, (0, 16, 100, 3000, 32768, -64), 2),
        bs_kind=mostly(("int",), ("float", "bool", "str", "none"), 12), special=specials(), seed=seeds,
        nested=st.booleans(), code_len=mostly((256,), (255, 16, 257), 12), code_dtype=mostly(("float32",), ("float16",), 20)))


def dequantize_params():
    return st.fixed_dictionaries(dict(
        n=st.integers(0, 5000), blocksize=mostly(BLOCKWISE, (0, 100, -1)), absmax_len=st.integers(0, 200),
        absmax_dtype=mostly(("float32",), ("float16", "bfloat16")), a_dtype=mostly(("uint8",), ("int8", "float32")),
        out_shape=st.one_of(st.none(), st.none(), st.lists(st.integers(0, 5000), min_size=1, max_size=2)), seed=seeds))


def fourbit_params():
    return st.fixed_dictionaries(dict(
        shape=shapes(), dtype=mostly(FLOATS, ("int8", "float64")), view=views(), blocksize=mostly(FOURBIT, (16, 100, 8192)),
        quant_type=mostly(("nf4", "fp4"), ("int4", "NF4")), compress=st.booleans(),
        storage=mostly(("uint8",), ("int8", "float16", "bfloat16", "float32", "int16", "int32", "float64"), 20),
        special=specials(), seed=seeds))


def gemv4_params():
    return st.fixed_dictionaries(dict(
        N=st.integers(1, 96), K=st.sampled_from([0, 16, 32, 33, 64, 100, 128, 256, 512, 1000]),
        rows=st.sampled_from([1, 1, 2, 3, 5, 33]), dtype=st.sampled_from(FLOATS), blocksize=st.sampled_from((32, 64, 128, 256)),
        quant_type=st.sampled_from(("nf4", "fp4")), compress=st.booleans(), k_delta=mostly((0,), (-1, 1, 7), 10),
        code_len=mostly((16,), (256, 15), 14), absmax_dtype=mostly(("float32",), ("float16",), 14), seed=seeds,
        fn=st.sampled_from(("gemv_4bit", "linear_4bit", "matmul_4bit"))))


def int8_quant_params():
    return st.fixed_dictionaries(dict(
        shape=shapes(big=False), dtype=mostly(FLOATS, ("int32", "float64")),
        threshold=st.sampled_from([0.0, 0.0, 0.0, 1.5, 3.0, 6.0, 1e5, -1.0, float("nan")]), special=specials(),
        seed=seeds, view=views()))


def int8_matmul_params():
    return st.fixed_dictionaries(dict(
        M=st.integers(0, 40), K=st.one_of(st.integers(0, 300), st.sampled_from([131071, 131072, 140000])),
        N=st.integers(0, 40), a_dtype=mostly(("int8",), ("float16", "int32")), b_dtype=mostly(("int8",), ("uint8",)),
        k_delta=mostly((0,), (-1, 3), 12), seed=seeds, lead=st.sampled_from([[], [], [2]])))


def int8_linear_params():
    return st.fixed_dictionaries(dict(
        rows=st.sampled_from([0, 1, 2, 5, 17]), K=st.integers(1, 200), N=st.integers(1, 64), dtype=st.sampled_from(FLOATS),
        threshold=st.sampled_from([0.0, 0.0, 2.0, 6.0]), bias=st.sampled_from([None, "float32", "float16", "bfloat16"]),
        special=st.sampled_from(["none"] * 6 + ["zero", "negzero", "huge"]), seed=seeds))


def weight_only_params():
    return st.fixed_dictionaries(dict(
        N=st.integers(0, 70), K=st.integers(0, 300), bits=mostly((8, 4), (3, 16, 0)), dtype=mostly(FLOATS, ("int32",)),
        special=specials(), seed=seeds, rows=st.sampled_from([1, 2, 3, 17, 40]), k_delta=mostly((0,), (-1, 1, 2), 8),
        in_features=st.booleans()))


def test_fuzz_blockwise(fuzz_pool):
    quant, deq = collect((blockwise_params, 260), (dequantize_params, 100))
    for i, p in enumerate(deq):  # mostly the right absmax length and out shape
        if i % 4 and p["blocksize"] > 0:
            p["absmax_len"] = -(-p["n"] // p["blocksize"])
        if i % 5 and p["out_shape"] is not None:
            p["out_shape"] = [p["n"]]
    run_area(fuzz_pool, "blockwise", [("blockwise", p) for p in quant] + [("dequantize_blockwise_args", p) for p in deq])


def test_fuzz_fourbit(fuzz_pool):
    quant, gemv = collect((fourbit_params, 240), (gemv4_params, 150))
    run_area(fuzz_pool, "4-bit", [("fourbit", p) for p in quant] + [("gemv4", p) for p in gemv])


def test_fuzz_int8(fuzz_pool):
    quant, mm, lin = collect((int8_quant_params, 200), (int8_matmul_params, 110), (int8_linear_params, 80))
    for p in mm:  # the long K take ~1 s each at full size: few rows and columns
        if p["K"] > 100000:
            p["M"], p["N"], p["lead"] = min(p["M"], 2), min(p["N"], 3), []
    run_area(fuzz_pool, "int8", [("int8_quant", p) for p in quant] + [("int8_matmul", p) for p in mm]
             + [("int8_linear", p) for p in lin])


def test_fuzz_weight_only(fuzz_pool):
    (params,) = collect((weight_only_params, 180))
    run_area(fuzz_pool, "weight-only", [("weight_only", p) for p in params])
