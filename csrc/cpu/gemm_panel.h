// gemm_panel.h -- internal (not exported) fp32 GEMM on packed 16-column panels, for the many-row
// (prefill) paths inside the library: the fused decoder's linears (weights fp32, or 4-bit dequantized
// into panels) and its attention (Q K^T and P V).
//
//   C[m, n] = (sum over k of A[m, k] * B[n, k]) (+ bias[n])      m < M, n < N
//
// B comes packed as ceil(N / kPanel) panels, panel p at P + p * pstride: it holds columns [16p, 16p + 16)
// as K (or more) rows of kPanel floats (zero beyond N).  A is row-major with row stride lda.  Rows of A are taken 6 at a time
// and run against every panel, so a call should get as many panels as fit in L2 beside 6 rows of A.
// Numerics (the same bits at every SIMD level): every output is ONE fma chain in k order,
//   acc = 0; for k = 0 .. K-1: acc = fma(A[m, k], P[k][j], acc);  C[m, j] = acc (+ bias[j], an fp32 add)
// The AVX2 kernel keeps a 6 x 16 tile of such chains in registers (one broadcast of A, two panel loads
// and 12 fmas per k); the portable kernel runs the same chains with std::fma.
#pragma once
#include <cstdint>

namespace bnb_ms {

constexpr int kPanel = 16;

// C rows [0, M) (row stride ldc), columns [0, N).  bias: N floats or null.  pstride >= K * kPanel.
void gemm_panel_f32(const float *A, int64_t lda, int64_t M, const float *P, int64_t pstride, int64_t K, int64_t N,
                    const float *bias, float *C, int64_t ldc);

// P[k][j] = W[j * ldw + k] for j < nc (a panel from nc rows of a row-major [N, K] matrix: weights, keys),
// zero for nc <= j < kPanel.
void pack_panel_rows(const float *W, int64_t ldw, int64_t K, int nc, float *P);

// P[k][j] = V[k * ldv + j] for j < nc (a panel from nc columns of a row-major [K, N] matrix: values).
void pack_panel_cols(const float *V, int64_t ldv, int64_t K, int nc, float *P);

}  // namespace bnb_ms
