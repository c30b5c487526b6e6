#!/usr/bin/env bash
# The test command: set-up (venv, pinned install, native build), then pytest.
#   bash tools/test.sh            # the CI set: everything not marked slow
#   bash tools/test.sh --full     # every test, including the slow ones
#   bash tools/test.sh -k blockwise   # extra arguments go to pytest
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tools/setup.sh || exit 1

# CUDA sources: a compile check where nvcc exists (no GPU needed; skips sources that need cuBLAS headers)
bash tools/cuda_syntax_check.sh || { echo "test: CUDA compile check failed" >&2; exit 1; }

marker=(-m "not slow")
args=()
for a in "$@"; do
  if [[ "$a" == "--full" ]]; then marker=(); else args+=("$a"); fi
done
.venv/bin/python -m pytest -q -p no:cacheprovider "${marker[@]}" "${args[@]}"
rc=$?
if [[ $rc -eq 5 ]]; then
  echo "test: pytest collected no tests (exit 5)" >&2
  exit 1
fi
exit $rc
