#!/usr/bin/env bash
# Compile check of the CUDA sources that need no cuBLAS headers (for CI machines that have nvcc but
# no GPU and no cuBLAS): nvcc -c for one architecture, object discarded.  Sources that define
# BNB_MS_NEEDS_CUBLASLT are skipped (listed).  Exit status: 0 ok / no nvcc (skipped), 1 on an error.
#   bash tools/cuda_syntax_check.sh            NVCC=/path/to/nvcc to override
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || true)}
if [[ -z "$nvcc" ]]; then echo "cuda_syntax_check: no nvcc, skipped"; exit 0; fi
rc=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for src in "$root"/csrc/cuda/*.cu; do
  [[ -e "$src" ]] || continue
  if grep -q '^#define BNB_MS_NEEDS_CUBLASLT' "$src"; then echo "skip (needs cuBLASLt): ${src#$root/}"; continue; fi
  if "$nvcc" -std=c++17 -O0 -arch=sm_90 -D_GLIBCXX_USE_CXX11_ABI=0 -Werror all-warnings -I "$root/csrc" \
      -c "$src" -o "$tmp/out.o"; then
    echo "ok: ${src#$root/}"
  else
    echo "FAILED: ${src#$root/}"; rc=1
  fi
done
exit $rc
