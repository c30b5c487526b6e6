#!/usr/bin/env bash
# The main job: set-up, then the bnb-ms CLI (default: `demo`).
#   bash tools/run.sh                      # python -m bitsandbytes_ms demo
#   bash tools/run.sh diagnostics          # any CLI arguments
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash tools/setup.sh >/dev/null || { echo "run: set-up failed; run 'bash tools/setup.sh' to see why" >&2; exit 1; }
if [[ $# -eq 0 ]]; then set -- demo; fi
exec .venv/bin/python -m bitsandbytes_ms "$@"
