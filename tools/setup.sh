#!/usr/bin/env bash
# Idempotent set-up on a fresh clone: .venv/ with the pinned stack, then the package installed in
# editable mode, which builds the native library with scikit-build-core + CMake (incremental).
# Re-running it is cheap: the lock is only re-installed when requirements-lock.txt changes.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

py=${BNB_MS_PYTHON:-}
if [[ -z "$py" ]]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      py=$cand; break
    fi
  done
fi
[[ -n "$py" ]] || { echo "setup: Python 3.11 is required (MindSpore 2.7 / mindnlp 0.5.1 wheels)" >&2; exit 1; }

if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv with $py"
  "$py" -m venv .venv
fi
stamp=.venv/.requirements-lock.installed
if ! cmp -s requirements-lock.txt "$stamp"; then
  echo "setup: installing the pinned stack (requirements-lock.txt)"
  .venv/bin/python -m pip install --no-deps -r requirements-lock.txt 2> >(grep -v "^WARNING: Location" >&2)
  cp requirements-lock.txt "$stamp"
fi

echo "setup: building the native library (pip install -e .)"
.venv/bin/python -m pip install --no-deps --no-build-isolation -e . -q 2> >(grep -v "^WARNING: Location" >&2)
.venv/bin/python -c "import bitsandbytes_ms.cextension as c; print('setup: native library', c.LIBRARY_PATH, '-', c.simd_level())"
