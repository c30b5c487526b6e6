#!/usr/bin/env python3
"""Runs every CUDA check of tools/gpu/test_*.py in one process, without pytest (the H200 image need not have
it): each test function in file order, with the two libraries; prints each summary line and a verdict per test.

    python3 tools/gpu/run_checks.py [--cuda-lib SO] [--cpu-lib SO] [--quick] [--only blockwise,fourbit,...]
    python3 tools/gpu/run_checks.py --write-op-names FILE   # where MindSpore is installed: the op table's names

The same tests run under pytest (`pytest tools/gpu`; skipped without a device).  tools/gpu/bench.py calls
run_all() to put the summary lines in benchmarks/gpu.md.  Exit status 1 when a check fails.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

FEATURES = ("blockwise", "fourbit", "gemv", "optim", "int8", "weightonly", "cpu_reference", "completeness")


def run_all(only: tuple[str, ...] = FEATURES) -> tuple[list[tuple[str, str, list[str]]], int]:
    """[(feature, test, summary lines or the failure)], number of failed tests."""
    import common

    why = common.unavailable()
    if why:
        raise SystemExit(f"run_checks: cannot run: {why}")
    cuda, cpu = common.libs()
    results, failed = [], 0
    for feat in only:
        mod = importlib.import_module(f"test_{feat}")
        tests = [(n, f) for n, f in vars(mod).items() if n.startswith("test_") and inspect.isfunction(f)
                 and f.__module__ == mod.__name__]
        for name, fn in tests:
            args = {"cuda": cuda, "cpu": cpu}
            params = [p for p in inspect.signature(fn).parameters]
            n0 = len(common.FAILURES)
            t0 = time.perf_counter()
            buf = _Capture()
            try:
                with buf:
                    fn(*[args[p] for p in params])
                lines, verdict = buf.lines, "ok"
            except Exception as e:  # noqa: BLE001 -- a failed or broken check is reported, the run goes on
                failed += 1
                if not isinstance(e, AssertionError):
                    traceback.print_exc()
                lines = buf.lines + [f"FAILED: {type(e).__name__}: {str(e)[:400]}"] + \
                    [f"  - {x}" for x in common.FAILURES[n0:][:20]]
                verdict = "FAILED"
            print(f"[{verdict}] {feat}::{name} ({time.perf_counter() - t0:.1f} s)", flush=True)
            results.append((feat, name, lines))
    return results, failed


class _Capture:
    """Collects the summary lines a test prints (common.checked prints them), still echoing them."""

    def __init__(self):
        self.lines: list[str] = []

    def __enter__(self):
        self._old = sys.stdout
        sys.stdout = self
        return self

    def __exit__(self, *exc):
        sys.stdout = self._old

    def write(self, s):
        self._old.write(s)
        for line in s.splitlines():
            if line.strip() and not line.startswith("FAIL:"):
                self.lines.append(line.rstrip())

    def flush(self):
        self._old.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda-lib")
    ap.add_argument("--cpu-lib")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=",".join(FEATURES))
    ap.add_argument("--write-op-names", metavar="FILE")
    a = ap.parse_args()
    if a.write_op_names:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from status_diff import op_table

        names = [n for n, op in op_table().OPS.items() if not getattr(op, "cpu_only", False)]
        Path(a.write_op_names).write_text("\n".join(names) + "\n")
        print(f"wrote {len(names)} names to {a.write_op_names}")
        return 0
    if a.cuda_lib:
        os.environ["BNB_MS_CUDA_LIB"] = a.cuda_lib
    if a.cpu_lib:
        os.environ["BNB_MS_CPU_LIB"] = a.cpu_lib
    if a.quick:
        os.environ["BNB_MS_GPU_QUICK"] = "1"
    _, failed = run_all(tuple(x for x in a.only.split(",") if x))
    print(f"run_checks: {failed} failed test(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
