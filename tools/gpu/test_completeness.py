"""Every row of the C ABI table (bitsandbytes_ms/_native_table.py) that is not cpu_only is exported by the CUDA library."""
from __future__ import annotations

import os
from pathlib import Path

from common import (FAILURES, fail, checked)


def op_names() -> list[str]:
    """Names of every row of the op table the CUDA library must export: the table module loaded standalone
    (tools/status_diff.op_table; needs MindSpore), else $BNB_MS_OP_NAMES, a file of names (one a line) written
    where MindSpore is installed (`python3 tools/gpu/run_checks.py --write-op-names FILE`)."""
    path = os.environ.get("BNB_MS_OP_NAMES")
    if path:
        return [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    from status_diff import op_table  # the one standalone loader of the op table (tools/ is on sys.path)

    return [n for n, op in op_table().OPS.items() if not getattr(op, "cpu_only", False)]


def test_op_table_exported(cuda):
    n0 = len(FAILURES)
    names = op_names()
    missing = [n for n in names if not cuda.has(n)]
    if not names:
        fail("op table completeness: no op names")
    if missing:
        fail(f"op table completeness: {len(missing)} of {len(names)} rows not exported: {', '.join(missing)}")
    checked([f"op table completeness: {len(names) - len(missing)}/{len(names)} rows of the op table are exported by "
             f"{Path(cuda.path).name} (dlsym)"], n0)
