#!/usr/bin/env bash
# Compile check of the CUDA sources (for CI machines that have nvcc but no GPU): nvcc -c for one
# architecture, object discarded.  Sources that define BNB_MS_NEEDS_CUBLASLT need cublasLt.h: they are
# compiled when it is found (CUBLASLT_INCLUDE=/dir/with/cublasLt.h, or next to nvcc's own headers) and
# skipped (listed) otherwise -- CI has no cuBLAS headers; the pip wheel nvidia-cublas carries them
# (nvidia/cu13/include).  Exit status: 0 ok / no nvcc (skipped), 1 on an error.
#   bash tools/cuda_syntax_check.sh            NVCC=/path/to/nvcc to override
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || true)}
if [[ -z "$nvcc" ]]; then echo "cuda_syntax_check: no nvcc, skipped"; exit 0; fi
lt_inc=""
for d in "${CUBLASLT_INCLUDE:-}" "$(dirname "$(readlink -f "$nvcc")")/../include"; do
  if [[ -n "$d" && -f "$d/cublasLt.h" ]]; then lt_inc=$d; break; fi
done
rc=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for src in "$root"/csrc/cuda/*.cu; do
  [[ -e "$src" ]] || continue
  extra=()
  if grep -q '^#define BNB_MS_NEEDS_CUBLASLT' "$src"; then
    if [[ -z "$lt_inc" ]]; then echo "skip (needs cuBLASLt headers): ${src#$root/}"; continue; fi
    extra=(-I "$lt_inc")
  fi
  if "$nvcc" -std=c++17 -O0 -arch=sm_90 -D_GLIBCXX_USE_CXX11_ABI=0 -Werror all-warnings -I "$root/csrc" "${extra[@]}" \
      -c "$src" -o "$tmp/out.o"; then
    echo "ok: ${src#$root/}"
  else
    echo "FAILED: ${src#$root/}"; rc=1
  fi
done
exit $rc
