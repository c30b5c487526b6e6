"""Bad-input suite, native layer: every row of the op table called through ``lib.<name>`` (ops.Custom) and
straight through the C ABI (ctypes, each buffer exactly its declared size in front of a PROT_NONE guard page, so
an out-of-bounds read or write is a crash), starting from tools/status_diff.py's well-formed calls with one or
two of their parameters changed (arity, dtypes, shapes, scalar values, null pointers). A malformed call must get
a nonzero status (through ``lib``: a RuntimeError naming the op, the status and the inputs), never a crash."""

import importlib.util
import sys
from pathlib import Path

from hypothesis import strategies as st

from fuzz_pool import collect, run_area


def _status_diff():
    name = "bnb_ms_status_diff"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / "status_diff.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def lib_params(n):
    return st.fixed_dictionaries(dict(template=st.integers(0, n - 1), mutation=st.integers(0, 400),
                                      seed=st.integers(0, 2**16)))


def c_abi_params(n):
    return st.fixed_dictionaries(dict(template=st.integers(0, n - 1), mutations=st.lists(st.integers(0, 400), min_size=1,
                                                                                         max_size=2),
                                      seed=st.integers(0, 2**16)))


def test_fuzz_lib_calls(fuzz_pool):
    (params,) = collect((lib_params, 300, (len(list(_status_diff().templates())),)))
    for i, p in enumerate(params):  # one in six is the template itself (well-formed: must compute)
        if i % 6 == 0:
            p["mutation"] = 0
    run_area(fuzz_pool, "lib", [("lib_call", p) for p in params])


def test_fuzz_c_abi(fuzz_pool):
    (params,) = collect((c_abi_params, 700, (len(list(_status_diff().templates())),)))
    run_area(fuzz_pool, "C ABI", [("c_abi", p) for p in params])
