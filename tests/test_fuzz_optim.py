"""Bad-input suite, optimizers: the functional update kernels (every rule, fp32/fp16/bf16, 32-bit and 8-bit
state, strided parameters, NaN/inf gradients) against the numpy reference, constructor hyper-parameters out of
range, and corrupted state dicts (tests/fuzz_pool.py says how outcomes are classified)."""

from hypothesis import strategies as st

from fuzz_pool import collect, run_area
from fuzz_strategies import FLOATS, mostly, seeds, specials

NAMES = ("adam", "momentum", "rmsprop", "lion", "adagrad", "ademamix", "lamb", "lars")
OPTIMS = ("Adam", "AdamW", "Adam8bit", "AdamW8bit", "SGD", "SGD8bit", "Lion", "Lion8bit", "RMSprop8bit",
          "Adagrad8bit", "LAMB", "LARS", "AdEMAMix8bit", "PagedAdamW8bit")


def optim32_params():
    return st.fixed_dictionaries(dict(
        name=mostly(NAMES, ("adamw", "sgd", "")), dtype=mostly(FLOATS, ("float64", "int32")),
        n=st.sampled_from([0, 1, 7, 256, 300, 1000, 5000]), g_delta=mostly((0,), (-1, 1), 10),
        s1_dtype=mostly(("float32",), ("float16",), 12), step=mostly((1, 2, 10), (0, -1), 6),
        special=specials(6), seed=seeds, lr=st.sampled_from([1e-3, 0.1, 0.0]),
        max_unorm=st.sampled_from([0.0, 0.0, 0.0, 1.0]), view=st.sampled_from(["none", "none", "step"])))


def optim8_params():
    return st.fixed_dictionaries(dict(
        name=st.sampled_from(NAMES), dtype=st.sampled_from(FLOATS), n=st.sampled_from([1, 255, 256, 257, 1000, 4096]),
        special=specials(6), seed=seeds, step=st.sampled_from([1, 3]), lr=st.sampled_from([1e-3, 0.01]),
        absmax_delta=mostly((0,), (-1, 2), 10)))


def optim_args_params():
    return st.one_of(
        st.fixed_dictionaries(dict(name=st.sampled_from(OPTIMS), arg=st.sampled_from(["lr", "eps", "weight_decay"]),
                                   value=st.sampled_from([-1.0, -1e-9, float("nan"), 0.0, 1e-3, "0.1x", None])))
        .filter(lambda p: not (p["arg"] == "eps" and p["name"].startswith(("SGD", "LARS", "Lion")))),
        st.fixed_dictionaries(dict(name=st.sampled_from(OPTIMS), arg=st.just("betas"),
                                   value=st.sampled_from([(0.9,), (0.9, 0.999), (1.0, 0.9), (-0.1, 0.9), (0.9, 0.999, 0.99),
                                                          (0.9, float("nan"))]))))


def optim_load_params():
    return st.fixed_dictionaries(dict(
        name=st.sampled_from(OPTIMS),
        corrupt=st.sampled_from(["none", "no_state", "no_param_groups", "no_params", "group_count", "param_count",
                                 "state_shape", "other_optimizer", "not_a_dict"]), seed=seeds))


def test_fuzz_optim_kernels(fuzz_pool):
    p32, p8 = collect((optim32_params, 200), (optim8_params, 120))
    run_area(fuzz_pool, "optim", [("optim32", p) for p in p32] + [("optim8", p) for p in p8])


def test_fuzz_optim_classes(fuzz_pool):
    args, load = collect((optim_args_params, 90), (optim_load_params, 70))
    run_area(fuzz_pool, "optim", [("optim_args", p) for p in args] + [("optim_load", p) for p in load])
