"""Bad-input suite, CLI: ``bnb-ms`` (``python -m bitsandbytes_ms``) with bad arguments and bad models, run in a
worker process: each must end with exit code 2 and one line saying what is wrong, before any model is
quantized (no traceback, no run on random weights). tests/test_cli.py checks the successful runs."""

from hypothesis import strategies as st

from fuzz_pool import collect, run_area

# (argv, setup): setup prepares {tmp} (fuzz_cases._cli_setup)
BAD = [
    (["quantize", "--mode", "int4"], "none"),
    (["quantize", "--mode", "NF4"], "none"),
    (["quantize", "--threshold", "six"], "none"),
    (["quantize", "--compute-dtype", "fp8"], "none"),
    (["quantize", "--max-new-tokens", "many"], "none"),
    (["quantize", "--eval-window", "1.5"], "none"),
    (["quantize", "--prompt"], "none"),
    (["quantize", "--no-such-flag"], "none"),
    (["frobnicate"], "none"),
    (["quantize", "--model", "{tmp}/nonexistent"], "none"),
    (["quantize", "--model", "{tmp}/model"], "empty_dir"),
    (["quantize", "--model", "{tmp}/model"], "bad_json"),
    (["quantize", "--model", "{tmp}/model"], "not_causal"),
    (["quantize", "--model", "{tmp}/model"], "no_weights"),
    (["quantize", "--model", "{tmp}/model.gguf"], "text_file"),
    (["quantize", "--save", "{tmp}/blocker/sub"], "file_in_the_way"),
    (["quantize", "--max-new-tokens", "-1"], "none"),
    (["quantize", "--eval-window", "0"], "none"),
    (["quantize", "--eval-windows", "-2"], "none"),
    (["quantize", "--threshold", "-1"], "none"),
    (["quantize", "--threshold", "nan"], "none"),
    (["quantize", "--eval-file", "{tmp}/eval.txt"], "text_file"),
    (["quantize", "--eval-file", "{tmp}/missing.txt"], "none"),
]
EXTRA = [[], [], ["--mode", "nf4"], ["--mode", "fp4", "--double-quant"], ["--no-fuse"], ["--max-new-tokens", "1"]]


def cli_params():
    return st.fixed_dictionaries(dict(bad=st.integers(0, len(BAD) - 1), extra=st.integers(0, len(EXTRA) - 1)))


def test_fuzz_cli(fuzz_pool):
    cases, seen = [], set()
    (params,) = collect((cli_params, 60))
    for p in params:
        argv, setup = BAD[p["bad"]]
        extra = EXTRA[p["extra"]] if argv[0] == "quantize" else []
        key = (p["bad"], tuple(extra))
        if key not in seen:
            seen.add(key)
            cases.append(("cli", dict(argv=argv[:1] + extra + argv[1:], setup=setup)))
    for i, (argv, setup) in enumerate(BAD):  # every bad input at least once
        if not any(k[0] == i for k in seen):
            cases.append(("cli", dict(argv=argv, setup=setup)))
    run_area(fuzz_pool, "CLI", cases)
