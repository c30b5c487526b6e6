#!/usr/bin/env bash
# The main job: set-up, then the bnb-ms CLI (default: `quantize` on the embedded model).
#   bash tools/run.sh                      # python -m bitsandbytes_ms quantize (int8, embedded model)
#   bash tools/run.sh quantize --mode nf4  # any CLI arguments; `diagnostics`, `demo` too
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[[ -x .venv/bin/python ]] || echo "run: first run: creating .venv (pinned stack) and building the native library, a few minutes" >&2
bash tools/setup.sh >/dev/null || { echo "run: set-up failed; run 'bash tools/setup.sh' to see why" >&2; exit 1; }
if [[ $# -eq 0 ]]; then set -- quantize; fi
exec .venv/bin/python -m bitsandbytes_ms "$@"
