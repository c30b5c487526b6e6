// int8_gemm.h -- internal (not exported) interface of the LLM.int8() int8 GEMM, C[M, N] = A[M, K] . B[N, K]^T
// in exact int32 (K < 131072, which the callers check): the x86 kernels and the path choice live in int8_gemm.cpp,
// the AMX-INT8 kernel in int8_gemm_amx.cpp; int8.cpp holds the entry point (cigemmlt_32), the path diagnostics
// (bnb_ms_int8_gemm_path*) and the fused linear that call them.
// Everything here was file-local to int8.cpp before the split: it is declared with hidden visibility, so the
// library's dynamic symbol table (its C ABI) is unchanged.
#pragma once
#include <cstdint>

#include "cpu/parallel.h"

namespace bnb_ms {
#pragma GCC visibility push(hidden)

// ---- for int8.cpp -------------------------------------------------------------------------------
// The GEMM paths; kGemmPathNames are the values of BNB_MS_INT8_GEMM and what bnb_ms_int8_gemm_path() returns.
enum class GemmPath : int { scalar = 0, avx2, avx512, avxvnni, avx512vnni, amx, count };
constexpr const char *kGemmPathNames[] = {"scalar", "avx2", "avx512", "avxvnni", "avx512vnni", "amx"};

struct GemmChoice {
  GemmPath path;
  bool forced;  // BNB_MS_INT8_GEMM named a path this CPU has: used for every M
};

// The path chosen once per process: BNB_MS_INT8_GEMM when it names a path this CPU has, else the automatic one.
GemmChoice gemm_choice();
// The path int8_gemm takes for M rows of A (the automatic choice takes AMX only from 8 rows on).
GemmPath gemm_path_for_rows(int64_t M);
// C = A . B^T (row-major, int8 A [M, K] and B [N, K], int32 C [M, N]) on the path of gemm_path_for_rows(M); the
// same bytes on every path.  Throws std::bad_alloc when the scratch of the packed operands cannot be allocated.
void int8_gemm(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K);

// ---- between int8_gemm.cpp and int8_gemm_amx.cpp ------------------------------------------------
// The AMX-INT8 kernel (int8_gemm_amx.cpp): the caller has checked that the CPU and OS allow AMX.
void int8_gemm_amx(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K);

// The pool's threads, and the chunked work split of both kernel files.
inline int max_threads() { return max_parallel_threads(); }

// Runs f(begin, end) over [0, n) in chunks of `chunk`, handed out to the threads one at a time.
template <class F>
void parallel_chunks(int64_t n, int64_t chunk, bool parallel, F &&f) {
  if (n <= 0) return;
  if (parallel) parallel_for_dynamic(n, chunk, f);
  else f(0, n);
}

#pragma GCC visibility pop
}  // namespace bnb_ms
