"""Records upstream bitsandbytes' optimizer constructor / method signatures as a JSON fixture.

Run with the throwaway upstream env's Python (real torch + bitsandbytes 0.50.2):

    ~/.cache/bitsandbytes_ms/upstream-env/bin/python tools/record_optim_signatures.py

It writes ``compat_tests/fixtures/upstream_optim_signatures.json``: per public class of
``bitsandbytes.optim`` the ``__init__`` parameters (name, kind, default as ``repr``) and, for the
base class ``Optimizer8bit``, the public methods that take arguments. ``tests/test_optim_signatures.py``
compares ours with it.
"""

import inspect
import json
import os
import sys

import bitsandbytes
import bitsandbytes.optim as upstream_optim
from bitsandbytes.optim.optimizer import Optimizer8bit

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compat_tests", "fixtures",
                   "upstream_optim_signatures.json")
BASE_METHODS = ("load_state_dict", "get_state_buffer", "to_gpu", "prefetch_state", "fill_qmap", "check_overrides",
                "get_config", "init_state", "state_dict")


def describe(fn):
    """[[name, kind, repr(default) or None when there is none], ...] (annotations are left out)."""
    return [[p.name, p.kind.name, None if p.default is inspect.Parameter.empty else repr(p.default)]
            for p in inspect.signature(fn).parameters.values()]


def main():
    classes = {}
    for name in sorted(dir(upstream_optim)):
        obj = getattr(upstream_optim, name)
        if isinstance(obj, type) and obj.__module__.startswith("bitsandbytes.optim"):
            classes[name] = describe(obj.__init__)
    methods = {m: describe(getattr(Optimizer8bit, m)) for m in BASE_METHODS}
    doc = {"bitsandbytes": bitsandbytes.__version__, "python": sys.version.split()[0],
           "classes": classes, "Optimizer8bit_methods": methods}
    with open(OUT, "w") as f:  # one line per class: small and diff-friendly
        f.write("{\n")
        f.write(f' "bitsandbytes": {json.dumps(doc["bitsandbytes"])},\n "python": {json.dumps(doc["python"])},\n')
        for key in ("classes", "Optimizer8bit_methods"):
            rows = [f'  {json.dumps(k)}: {json.dumps(v)}' for k, v in sorted(doc[key].items())]
            f.write(f' {json.dumps(key)}: {{\n' + ",\n".join(rows) + "\n }" + ("," if key == "classes" else "") + "\n")
        f.write("}\n")
    print(f"wrote {len(classes)} classes to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
