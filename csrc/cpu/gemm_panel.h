// gemm_panel.h -- internal (not exported) fp32 GEMM on packed 16-column panels, for the many-row
// (prefill) paths inside the library: the fused decoder's linears (weights fp32, or 4-bit dequantized
// into panels) and its attention (Q K^T and P V).
//
//   C[m, n] = (sum over k of A[m, k] * B[n, k]) (+ bias[n])      m < M, n < N
//
// B comes packed as ceil(N / kPanel) panels, panel p at P + p * pstride: it holds columns [16p, 16p + 16)
// as K (or more) rows of kPanel floats (zero beyond N).  A is row-major with row stride lda.  Rows of A are taken 6 (AVX2) or 8 (AVX-512) at a time
// and run against every panel, so a call should get as many panels as fit in L2 beside those rows of A.
// Numerics (the same bits at every SIMD level): every output is ONE fma chain in k order,
//   acc = 0; for k = 0 .. K-1: acc = fma(A[m, k], P[k][j], acc);  C[m, j] = acc (+ bias[j], an fp32 add)
// The AVX-512 kernel keeps an 8 x 48 tile of such chains in registers (three panels: 24 zmm accumulators, three
// panel loads and eight broadcasts per k), the AVX2 kernel a 6 x 16 tile (one broadcast of A, two panel loads
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

// ---- bf16 dot-product variant (vdpbf16ps; the 4-bit prefill of the fused decoder where bf16 compute is
// chosen, integrations/fused.py).  Operands are bf16 PAIRS in dwords: element 2p in bits 0..15, 2p+1 in bits
// 16..31, rounded by bf16_round.h (nearest even, bf16 denormals flushed; an odd K's last pair holds 0 high).
//   A2: M rows of K2 = ceil(K / 2) dwords (row stride lda2);  P2: ceil(N / kPanel) panels of K2 rows x kPanel
//   dwords (row p of panel q: the pairs (W[16q + j][2p], W[16q + j][2p + 1]), zero beyond N), at pstride2.
// Numerics (the same bits with vdpbf16ps and in the portable kernel): every output is ONE chain in p order,
//   acc = 0; for p: acc = ftz(fma(w_hi, x_hi, acc)); acc = ftz(fma(w_lo, x_lo, acc));  C = acc (+ bias, fp32)
// (vdpbf16ps per lane: the odd element first, each product exact in fp32, one rounding per step, FTZ out).
// Bound vs the exact fp32 panel GEMM on the same fp32 x and W (each rounded once to bf16 here):
//   |C_bf16 - C_exact| <= (2^-7 + 2^-16 + K 2^-23) S,   S = sum_k |x_k w_k|   (per output)
// (each operand rounded to 8 significant bits: 2^-8 relative, so a product within 2^-7 + 2^-16; each fp32
// chain within about K 2^-24 S; operands of normal size: a flushed bf16 denormal adds < 2^-126 per term).
void gemm_panel_bf16(const uint32_t *A2, int64_t lda2, int64_t M, const uint32_t *P2, int64_t pstride2, int64_t K2,
                     int64_t N, const float *bias, float *C, int64_t ldc);

// AMX-BF16 form of gemm_panel_bf16, for the callers that check gemm_bf16_amx_applies(M) (the CPU and OS allow
// AMX-BF16, the vdpbf16ps kernel is the library's choice, M >= 16, BNB_MS_4BIT_AMX is not 0).  Operands padded:
// A2 has 16 * ceil(M / 16) rows of K2p dwords (K2p = ceil(K2 / 16) * 16), zero beyond M rows and K2 pairs; panels
// have K2p rows, zero beyond K2.  Same inputs, products exact in fp32, summed by TDPBF16PS in the tile unit's own
// order (not a sequential chain: measured within 2e-7 S of the exact sum for K = 32..1024), so its bits are not
// the vdpbf16ps kernel's and it keeps that kernel's bound vs the exact GEMM (tests/test_fused_bf16_prefill.py).
bool gemm_bf16_amx_applies(int64_t M);
void gemm_panel_bf16_amx_bf16(const uint32_t *A2, int64_t M, const uint32_t *P2, int64_t pstride2, int64_t K2p,
                              int64_t N, const float *bias, float *C, int64_t ldc);

// P2 rows [0, K2) of one panel from nc (<= kPanel) rows already rounded into bf16 pairs (R: row j's K2 pairs at
// R + j * K2; pair p = (x[2p], x[2p+1]), as pack_rows_bf16 lays out A).
void pack_panel_pairs(const uint32_t *R, int64_t K2, int nc, uint32_t *P2);

// A2 (row stride K2) from M rows of fp32 X (row stride ldx, K values).
void pack_rows_bf16(const float *X, int64_t ldx, int64_t M, int64_t K, uint32_t *A2);

}  // namespace bnb_ms
