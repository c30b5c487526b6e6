// gemm_panel.cpp -- the packed-panel fp32 GEMM of gemm_panel.h (numerics documented there).
#include "cpu/gemm_panel.h"

#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/cpu_features.h"

namespace bnb_ms {
namespace {

constexpr int kMR = 6;  // rows of A per register tile (AVX2: 6 x 2 accumulators + 2 panel + 1 broadcast = 15 ymm)

// Stores a finished row of the tile: acc (+ bias) into C's first nc columns.
BNB_MS_INLINE void store_row(const float *acc, const float *bias, int nc, float *c) {
  if (bias)
    for (int j = 0; j < nc; ++j) c[j] = acc[j] + bias[j];
  else
    std::memcpy(c, acc, sizeof(float) * (size_t)nc);
}

void tile_scalar(const float *A, int64_t lda, int64_t mr, const float *P, int64_t K, int nc, const float *bias,
                 float *C, int64_t ldc) {
  for (int64_t i = 0; i < mr; ++i) {
    float acc[kPanel] = {0};
    const float *a = A + i * lda;
    for (int64_t k = 0; k < K; ++k)
      for (int j = 0; j < kPanel; ++j) acc[j] = std::fma(a[k], P[k * kPanel + j], acc[j]);
    store_row(acc, bias, nc, C + i * ldc);
  }
}

// Rows [0, mr) of a 6-row tile (mr <= 6; A must have 6 readable rows: the caller pads a short tail).
// The 12 accumulators are named variables: with arrays GCC spilled them to the stack on every k.
BNB_MS_TARGET_AVX2 void tile_avx2(const float *A, int64_t lda, int64_t mr, const float *P, int64_t K, int nc,
                                  const float *bias, float *C, int64_t ldc) {
  const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda, *a4 = A + 4 * lda, *a5 = A + 5 * lda;
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(P + k * kPanel), b1 = _mm256_loadu_ps(P + k * kPanel + 8);
    __m256 a = _mm256_broadcast_ss(a0 + k);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    c01 = _mm256_fmadd_ps(a, b1, c01);
    a = _mm256_broadcast_ss(a1 + k);
    c10 = _mm256_fmadd_ps(a, b0, c10);
    c11 = _mm256_fmadd_ps(a, b1, c11);
    a = _mm256_broadcast_ss(a2 + k);
    c20 = _mm256_fmadd_ps(a, b0, c20);
    c21 = _mm256_fmadd_ps(a, b1, c21);
    a = _mm256_broadcast_ss(a3 + k);
    c30 = _mm256_fmadd_ps(a, b0, c30);
    c31 = _mm256_fmadd_ps(a, b1, c31);
    a = _mm256_broadcast_ss(a4 + k);
    c40 = _mm256_fmadd_ps(a, b0, c40);
    c41 = _mm256_fmadd_ps(a, b1, c41);
    a = _mm256_broadcast_ss(a5 + k);
    c50 = _mm256_fmadd_ps(a, b0, c50);
    c51 = _mm256_fmadd_ps(a, b1, c51);
  }
  alignas(32) float acc[kMR][kPanel];
  _mm256_store_ps(acc[0], c00);
  _mm256_store_ps(acc[0] + 8, c01);
  _mm256_store_ps(acc[1], c10);
  _mm256_store_ps(acc[1] + 8, c11);
  _mm256_store_ps(acc[2], c20);
  _mm256_store_ps(acc[2] + 8, c21);
  _mm256_store_ps(acc[3], c30);
  _mm256_store_ps(acc[3] + 8, c31);
  _mm256_store_ps(acc[4], c40);
  _mm256_store_ps(acc[4] + 8, c41);
  _mm256_store_ps(acc[5], c50);
  _mm256_store_ps(acc[5] + 8, c51);
  for (int64_t i = 0; i < mr; ++i) store_row(acc[i], bias, nc, C + i * ldc);
}

}  // namespace

void gemm_panel_f32(const float *A, int64_t lda, int64_t M, const float *P, int64_t pstride, int64_t K, int64_t N,
                    const float *bias, float *C, int64_t ldc) {
  const bool avx2 = has_avx2();
  static thread_local std::vector<float> tail;  // the last < 6 rows of A, zero-padded to 6 (AVX2 tile)
  for (int64_t m = 0; m < M; m += kMR) {
    const int64_t mr = M - m < kMR ? M - m : kMR;
    const float *a = A + m * lda;
    int64_t la = lda;
    if (avx2 && mr < kMR) {
      tail.assign((size_t)(kMR * K), 0.0f);
      for (int64_t i = 0; i < mr; ++i) std::memcpy(tail.data() + i * K, a + i * lda, sizeof(float) * (size_t)K);
      a = tail.data();
      la = K;
    }
    for (int64_t n = 0; n < N; n += kPanel) {
      const int nc = (int)(N - n < kPanel ? N - n : kPanel);
      const float *p = P + n / kPanel * pstride, *b = bias ? bias + n : nullptr;
      float *c = C + m * ldc + n;
      if (avx2) tile_avx2(a, la, mr, p, K, nc, b, c, ldc);
      else tile_scalar(a, la, mr, p, K, nc, b, c, ldc);
    }
  }
}

void pack_panel_rows(const float *W, int64_t ldw, int64_t K, int nc, float *P) {
  for (int64_t k = 0; k < K; ++k) {
    float *p = P + k * kPanel;
    for (int j = 0; j < nc; ++j) p[j] = W[j * ldw + k];
    for (int j = nc; j < kPanel; ++j) p[j] = 0.0f;
  }
}

void pack_panel_cols(const float *V, int64_t ldv, int64_t K, int nc, float *P) {
  for (int64_t k = 0; k < K; ++k) {
    float *p = P + k * kPanel;
    std::memcpy(p, V + k * ldv, sizeof(float) * (size_t)nc);
    for (int j = nc; j < kPanel; ++j) p[j] = 0.0f;
  }
}

}  // namespace bnb_ms
