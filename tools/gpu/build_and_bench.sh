#!/usr/bin/env bash
# On a CUDA machine (torch, nvcc, cmake, ninja; no MindSpore): build the CPU and CUDA libraries for this card,
# run every check (tools/gpu/run_checks.py, via bench.py) and the timings, and write benchmarks/gpu.md (or --out).
#   bash tools/gpu/build_and_bench.sh [--out FILE] [--no-checks] [--quick]
# CUDA_ARCH (default 90) picks the architecture; BNB_MS_OP_NAMES=<file> where MindSpore cannot be imported.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
t0=$(date +%s)
mkdir -p build
cmake -S . -B build/cuda -G Ninja -DBNB_MS_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" > build/cuda_configure.log 2>&1 || { cat build/cuda_configure.log; exit 1; }
cmake --build build/cuda -j "$(nproc)" 2>&1 | tail -n 3
echo "build: $(( $(date +%s) - t0 )) s"
PYTHONUNBUFFERED=1 python3 tools/gpu/bench.py "$@"
echo "total: $(( $(date +%s) - t0 )) s"
