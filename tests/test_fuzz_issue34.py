"""Bad-input suite, issue 34's classes as generators (tests/fuzz_cases.py, second half): state across calls
(each linear layer type driven through random input dtypes, row counts, bad inputs and weight / bias mutations,
every output against the weights it should hold now), preallocated out/absmax buffers with random defects,
random code-map and optimizer hyper-parameter combinations, and whole blocks of edge values (subnormals, zeros,
inf, NaN, huge) against the numpy reference (tests/fuzz_pool.py says how outcomes are classified)."""

from hypothesis import strategies as st

from fuzz_pool import collect, run_area
from fuzz_strategies import EDGE_KINDS, FLOATS, MAP_ARGS, OUT_BUFFERS, mostly, seeds

STATE_KINDS = ("Linear4bit-nf4", "Linear4bit-nf4-dq", "Linear4bit-fp4", "Linear4bit-fp4-dq", "LinearNF4", "LinearFP4",
               "Linear8bitLt-0", "Linear8bitLt-6", "LinearWeightOnly8", "LinearWeightOnly4", "LinearFP")
MUTATIONS = ("load", "inplace_w", "assign_w", "inplace_b", "assign_b", "grad", "train")


ROWS = (1, 1, 2, 3, 40)  # 40: above the lean kernels' one-row paths


def _step():
    # (op, input dtype, n): n picks the rows of a call, the weight generation of a mutation, the flag of a toggle;
    # grad_call: the input gradient (recorded by value_and_grad) between the lean calls
    ops = st.sampled_from(("call",) * 6 + ("bad_call", "grad_call") + MUTATIONS)
    return st.tuples(ops, st.sampled_from(FLOATS), st.integers(1, 50))


def layer_state_params():
    return st.fixed_dictionaries(dict(
        bias=mostly((True,), (False,), 3), compute_dtype=st.sampled_from(("none",) + FLOATS),
        bias_dtype=st.sampled_from(FLOATS), steps=st.lists(_step(), min_size=3, max_size=14), seed=seeds))


def out_buffer_params():
    fn_name = st.sampled_from([(f, n) for f, names in OUT_BUFFERS.items() for n in names])
    return st.builds(lambda fn, d, other, rows, cols, seed: dict(fn=fn[0], name=fn[1], defect=d, other_dtype=other,
                                                                 rows=rows, cols=cols, seed=seed),
                     fn_name, mostly(("none",), ("dtype", "short", "long", "shape", "strided", "numpy", "list"), 4),
                     st.sampled_from(("float32", "float16", "bfloat16", "uint8", "int8", "int32", "float64")),
                     st.sampled_from([1, 2, 5]), st.sampled_from([64, 100, 256]), seeds)


_ARG_VALUES = st.sampled_from([True, False, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, -1, 0.5, 0.6, 0.9677083, 0.99, 1.0, 1.5,
                               float("nan"), float("inf"), "8", None])


def code_map_params():
    return st.sampled_from(sorted(MAP_ARGS)).flatmap(lambda fn: st.fixed_dictionaries(dict(
        fn=st.just(fn), kw=st.dictionaries(st.sampled_from(MAP_ARGS[fn]), _ARG_VALUES, max_size=len(MAP_ARGS[fn])))))


OPTIMS = ("Adam", "AdamW", "Adam8bit", "AdamW8bit", "SGD", "SGD8bit", "Lion", "Lion8bit", "RMSprop8bit",
          "Adagrad8bit", "LAMB", "LARS", "AdEMAMix8bit", "PagedAdamW8bit")
HYPERS = ("lr", "eps", "weight_decay", "momentum", "alpha", "dampening", "nesterov", "min_8bit_size", "max_unorm",
          "t_alpha", "t_beta3", "percentile_clipping", "block_wise")


def optim_hyper_params():
    return st.fixed_dictionaries(dict(
        name=st.sampled_from(OPTIMS), arg=st.sampled_from(HYPERS),
        value=st.sampled_from([0.0, 1e-3, 0.1, 0.5, 0.9, 0.999, 1.0, 2.0, 10, 0, 1, 5, 100, 5000, -1, -1e-9,
                               float("nan"), float("inf"), True, False, None, "0.1"]), seed=seeds))


def edge_params():
    return st.fixed_dictionaries(dict(
        fn=st.sampled_from(("blockwise", "fourbit_nf4", "fourbit_fp4", "int8")), dtype=st.sampled_from(FLOATS),
        blocksize=st.sampled_from([64, 128, 256]),
        kinds=st.lists(st.sampled_from(EDGE_KINDS),
                       min_size=1, max_size=6),
        seed=seeds, threshold=st.sampled_from([0.0, 0.0, 3.0])))


def test_fuzz_layer_state_across_calls(fuzz_pool):
    (cases,) = collect((layer_state_params, 154))
    for i, p in enumerate(cases):  # every layer type equally often; a call's n picks its rows
        p["kind"] = STATE_KINDS[i % len(STATE_KINDS)]
        p["steps"] = [(op, dt, ROWS[n % len(ROWS)] if op == "call" else 1 if op in ("bad_call", "grad_call") else n)
                      for op, dt, n in p["steps"]]
    run_area(fuzz_pool, "state", [("layer_state_sequence", p) for p in cases])


def test_fuzz_out_buffers(fuzz_pool):
    (cases,) = collect((out_buffer_params, 160))
    run_area(fuzz_pool, "out buffers", [("out_buffer", p) for p in cases])


def test_fuzz_code_maps_and_optimizer_hyperparameters(fuzz_pool):
    maps, hyper = collect((code_map_params, 150), (optim_hyper_params, 120))
    run_area(fuzz_pool, "arguments", [("code_map", p) for p in maps] + [("optim_hyper", p) for p in hyper])


def test_fuzz_edge_value_blocks(fuzz_pool):
    (cases,) = collect((edge_params, 160))
    run_area(fuzz_pool, "edge values", [("edge_blocks", p) for p in cases])


EMBEDDINGS = ("Embedding", "StableEmbedding", "Embedding8bit", "EmbeddingNF4", "EmbeddingFP4")


def embedding_state_params():
    step = st.tuples(st.sampled_from(("call",) * 4 + ("load", "inplace_w", "assign_w")), st.integers(1, 50))
    return st.fixed_dictionaries(dict(steps=st.lists(step, min_size=2, max_size=10), seed=seeds))


def test_fuzz_embedding_state_across_calls(fuzz_pool):
    (cases,) = collect((embedding_state_params, 40))
    for i, p in enumerate(cases):  # every embedding type equally often
        p["kind"] = EMBEDDINGS[i % len(EMBEDDINGS)]
    run_area(fuzz_pool, "state", [("embedding_state_sequence", p) for p in cases])
