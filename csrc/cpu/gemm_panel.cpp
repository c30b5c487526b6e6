// gemm_panel.cpp -- the packed-panel fp32 GEMM of gemm_panel.h (numerics documented there).
#include "cpu/gemm_panel.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/amx_tiles.h"
#include "cpu/bf16_round.h"
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

void gemm_panel_f32_portable(const float *A, int64_t lda, int64_t mr, const float *P, int64_t K, int nc,
                             const float *bias, float *C, int64_t ldc) {
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
BNB_MS_TARGET_AVX2 void gemm_panel_f32_avx2(const float *A, int64_t lda, int64_t mr, const float *P, int64_t K, int nc,
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

// AVX-512: rows [0, mr) of an 8-row tile (A must have 8 readable rows) against NP consecutive panels (the
// last may be short: ncl columns); one zmm per panel row, the same chains as the AVX2 tile.  (8 x 3
// accumulators + 3 panel rows + 1 broadcast = 28 zmm; the bf16 tile below has the same shape.)
constexpr int kMR16 = 8, kNP16 = 3;

template <int NP>
BNB_MS_TARGET_AVX512 void gemm_panel_f32_avx512(const float *A, int64_t lda, int64_t mr, const float *P,
                                                int64_t pstride, int64_t K, int ncl, const float *bias, float *C,
                                                int64_t ldc) {
  __m512 acc[kMR16][NP];
#pragma GCC unroll 8
  for (int i = 0; i < kMR16; ++i)
#pragma GCC unroll 3
    for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[NP];
#pragma GCC unroll 3
    for (int q = 0; q < NP; ++q) b[q] = _mm512_loadu_ps(P + q * pstride + k * kPanel);
#pragma GCC unroll 8
    for (int i = 0; i < kMR16; ++i) {
      const __m512 a = _mm512_set1_ps(A[i * lda + k]);
#pragma GCC unroll 3
      for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_fmadd_ps(a, b[q], acc[i][q]);
    }
  }
  alignas(64) float row[kPanel];
  for (int64_t i = 0; i < mr; ++i)
    for (int q = 0; q < NP; ++q) {
      _mm512_store_ps(row, acc[i][q]);
      store_row(row, bias ? bias + q * kPanel : nullptr, q == NP - 1 ? ncl : kPanel, C + i * ldc + q * kPanel);
    }
}

// An 8-row tile against up to 3 panels (fp32 floats, or bf16 pairs as dwords): A, lda, mr, P, pstride, K
// (elements per row), ncl (the last panel's columns), bias, C, ldc.
template <class E>
using Tile8 = void (*)(const E *, int64_t, int64_t, const E *, int64_t, int64_t, int, const float *, float *, int64_t);

// The driver of the AVX-512 tiles: rows of A 8 at a time (the last < 8 copied zero-padded), panels 3 at a time;
// tiles[np - 1] takes np panels.
template <class E>
void gemm_tiles8(const Tile8<E> *tiles, const E *A, int64_t lda, int64_t M, const E *P, int64_t pstride, int64_t K,
                 int64_t N, const float *bias, float *C, int64_t ldc) {
  static thread_local std::vector<E> tail;
  const int64_t npan = (N + kPanel - 1) / kPanel;
  for (int64_t m = 0; m < M; m += kMR16) {
    const int64_t mr = M - m < kMR16 ? M - m : kMR16;
    const E *a = A + m * lda;
    int64_t la = lda;
    if (mr < kMR16) {
      tail.assign((size_t)(kMR16 * K), E(0));
      for (int64_t i = 0; i < mr; ++i) std::memcpy(tail.data() + i * K, a + i * lda, sizeof(E) * (size_t)K);
      a = tail.data();
      la = K;
    }
    for (int64_t q = 0; q < npan; q += kNP16) {
      const int np = (int)(npan - q < kNP16 ? npan - q : kNP16);
      const int ncl = (int)std::min<int64_t>(kPanel, N - (q + np - 1) * kPanel);
      tiles[np - 1](a, la, mr, P + q * pstride, pstride, K, ncl, bias ? bias + q * kPanel : nullptr,
                    C + m * ldc + q * kPanel, ldc);
    }
  }
}

void gemm_panel_f32_tiles8(const float *A, int64_t lda, int64_t M, const float *P, int64_t pstride, int64_t K,
                           int64_t N, const float *bias, float *C, int64_t ldc) {
  static const Tile8<float> tiles[kNP16] = {gemm_panel_f32_avx512<1>, gemm_panel_f32_avx512<2>,
                                            gemm_panel_f32_avx512<3>};
  gemm_tiles8(tiles, A, lda, M, P, pstride, K, N, bias, C, ldc);
}

}  // namespace

void gemm_panel_f32(const float *A, int64_t lda, int64_t M, const float *P, int64_t pstride, int64_t K, int64_t N,
                    const float *bias, float *C, int64_t ldc) {
  if (has_avx512()) return gemm_panel_f32_tiles8(A, lda, M, P, pstride, K, N, bias, C, ldc);
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
      if (avx2) gemm_panel_f32_avx2(a, la, mr, p, K, nc, b, c, ldc);
      else gemm_panel_f32_portable(a, la, mr, p, K, nc, b, c, ldc);
    }
  }
}

// The transpose of nc rows (row stride ld) into a panel, kPanel columns of K at a time in blocks of kPanel: each row
// read a cache line at a time and each block of the panel (1 KiB) written in L1.  (Column by column, the reads
// strode a whole row apart: one line per element, 4 KiB-aliased, ~40% of a 48-row bf16 prefill of a 7B-shaped
// model on the Zen 4 EPYC.)
template <class E>
BNB_MS_INLINE void transpose_into_panel(const E *W, int64_t ld, int64_t K, int nc, E *P) {
  for (int64_t k0 = 0; k0 < K; k0 += kPanel) {
    const int ke = (int)std::min<int64_t>(kPanel, K - k0);
    E *d = P + k0 * kPanel;
    for (int j = 0; j < nc; ++j) {
      const E *src = W + j * ld + k0;
      for (int t = 0; t < ke; ++t) d[t * kPanel + j] = src[t];
    }
    for (int t = 0; t < ke; ++t)
      for (int j = nc; j < kPanel; ++j) d[t * kPanel + j] = E(0);
  }
}

void pack_panel_rows(const float *W, int64_t ldw, int64_t K, int nc, float *P) {
  transpose_into_panel(W, ldw, K, nc, P);
}

void pack_panel_cols(const float *V, int64_t ldv, int64_t K, int nc, float *P) {
  for (int64_t k = 0; k < K; ++k) {
    float *p = P + k * kPanel;
    std::memcpy(p, V + k * ldv, sizeof(float) * (size_t)nc);
    for (int j = nc; j < kPanel; ++j) p[j] = 0.0f;
  }
}

// ---- bf16 dot-product variant ------------------------------------------------------------------------
namespace {


BNB_MS_INLINE float bf16_lo(uint32_t d) { return bf16_to_f32((uint16_t)(d & 0xffffu)); }
BNB_MS_INLINE float bf16_hi(uint32_t d) { return bf16_to_f32((uint16_t)(d >> 16)); }

void gemm_panel_bf16_portable(const uint32_t *A2, int64_t lda2, int64_t mr, const uint32_t *P2, int64_t K2, int nc,
                              const float *bias, float *C, int64_t ldc) {
  for (int64_t i = 0; i < mr; ++i) {
    float acc[kPanel] = {0};
    const uint32_t *a = A2 + i * lda2;
    for (int64_t p = 0; p < K2; ++p) {
      const float xh = bf16_hi(a[p]), xl = bf16_lo(a[p]);
      for (int j = 0; j < kPanel; ++j) {
        const uint32_t w = P2[p * kPanel + j];
        acc[j] = ftz32(std::fma(bf16_hi(w), xh, acc[j]));
        acc[j] = ftz32(std::fma(bf16_lo(w), xl, acc[j]));
      }
    }
    store_row(acc, bias, nc, C + i * ldc);
  }
}

// Rows [0, mr) (mr <= 8; A2 must have 8 readable rows) against NP consecutive panels (the last may be short:
// ncl columns).  Loops over constants, fully unrolled: the 8 x NP accumulators stay in registers.
template <int NP>
BNB_MS_TARGET_AVX512BF16 void gemm_panel_bf16_avx512bf16(const uint32_t *A2, int64_t lda2, int64_t mr,
                                                         const uint32_t *P2, int64_t pstride2, int64_t K2, int ncl,
                                                         const float *bias, float *C, int64_t ldc) {
  __m512 acc[kMR16][NP];
#pragma GCC unroll 8
  for (int i = 0; i < kMR16; ++i)
#pragma GCC unroll 3
    for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_setzero_ps();
  for (int64_t p = 0; p < K2; ++p) {
    __m512bh b[NP];
#pragma GCC unroll 3
    for (int q = 0; q < NP; ++q) b[q] = (__m512bh)_mm512_loadu_si512(P2 + q * pstride2 + p * kPanel);
#pragma GCC unroll 8
    for (int i = 0; i < kMR16; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A2[i * lda2 + p]);
#pragma GCC unroll 3
      for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_dpbf16_ps(acc[i][q], a, b[q]);
    }
  }
  alignas(64) float row[kPanel];
  for (int64_t i = 0; i < mr; ++i)
    for (int q = 0; q < NP; ++q) {
      const int nc = q == NP - 1 ? ncl : kPanel;
      _mm512_store_ps(row, acc[i][q]);
      store_row(row, bias ? bias + q * kPanel : nullptr, nc, C + i * ldc + q * kPanel);
    }
}

void gemm_panel_bf16_tiles8(const uint32_t *A2, int64_t lda2, int64_t M, const uint32_t *P2, int64_t pstride2,
                            int64_t K2, int64_t N, const float *bias, float *C, int64_t ldc) {
  static const Tile8<uint32_t> tiles[kNP16] = {gemm_panel_bf16_avx512bf16<1>, gemm_panel_bf16_avx512bf16<2>,
                                               gemm_panel_bf16_avx512bf16<3>};
  gemm_tiles8(tiles, A2, lda2, M, P2, pstride2, K2, N, bias, C, ldc);
}

// K fp32 -> K flushed bf16 words, zero-padded to an even count (one row of pairs: dword p = (x[2p], x[2p+1])).
BNB_MS_TARGET_AVX512BF16 void round_row_avx512bf16(const float *x, int64_t K, uint16_t *d) {
  int64_t k = 0;
  for (; k + 16 <= K; k += 16)
    _mm256_storeu_si256((__m256i *)(d + k), _mm512_cvtepi32_epi16(bf16_flushed16(_mm512_loadu_ps(x + k))));
  for (; k < K; ++k) d[k] = to_bf16_flushed(x[k]);
  if (K & 1) d[K] = 0;
}

void round_row(const float *x, int64_t K, uint16_t *d) {
  if (bf16dot_native()) return round_row_avx512bf16(x, K, d);
  for (int64_t k = 0; k < K; ++k) d[k] = to_bf16_flushed(x[k]);
  if (K & 1) d[K] = 0;
}

}  // namespace

void gemm_panel_bf16(const uint32_t *A2, int64_t lda2, int64_t M, const uint32_t *P2, int64_t pstride2, int64_t K2,
                     int64_t N, const float *bias, float *C, int64_t ldc) {
  if (bf16dot_native()) return gemm_panel_bf16_tiles8(A2, lda2, M, P2, pstride2, K2, N, bias, C, ldc);
  for (int64_t m = 0; m < M; m += kMR16) {
    const int64_t mr = M - m < kMR16 ? M - m : kMR16;
    for (int64_t n = 0; n < N; n += kPanel) {
      const int nc = (int)(N - n < kPanel ? N - n : kPanel);
      gemm_panel_bf16_portable(A2 + m * lda2, lda2, mr, P2 + n / kPanel * pstride2, K2, nc, bias ? bias + n : nullptr,
                         C + m * ldc + n, ldc);
    }
  }
}

bool gemm_bf16_amx_applies(int64_t M) {
  if (M < 16 || !(cpu_features() & CPU_AMX_BF16) || !bf16dot_native()) return false;
  const char *e = std::getenv("BNB_MS_4BIT_AMX");  // read per call: a test or user may switch it at run time
  return !(e && std::strcmp(e, "0") == 0);
}

#define BNB_MS_TARGET_AMX_BF16 \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

// Tiles: C in tmm0 (m-tile mt, panel q), tmm1 (mt, q + 1), tmm2 (mt + 1, q), tmm3 (mt + 1, q + 1); A in tmm4 / tmm5
// (16 rows x 16 pairs), panels in tmm6 / tmm7 (16 pair rows x 16 columns: a panel is already that layout).
BNB_MS_TARGET_AMX_BF16 void gemm_panel_bf16_amx_bf16(const uint32_t *A2, int64_t M, const uint32_t *P2,
                                                     int64_t pstride2, int64_t K2p, int64_t N, const float *bias,
                                                     float *C, int64_t ldc) {
  const int64_t Mt = (M + 15) / 16, npan = (N + kPanel - 1) / kPanel, KS = K2p / 16, lda = K2p * 4;
  alignas(64) float ct[4][256];
  amx_configure();
  for (int64_t mt = 0; mt < Mt; mt += 2) {
    const bool two_m = mt + 1 < Mt;
    const uint32_t *a0 = A2 + mt * 16 * K2p, *a1 = a0 + 16 * K2p;
    for (int64_t q = 0; q < npan; q += 2) {
      const bool two_n = q + 1 < npan;
      const uint32_t *b0 = P2 + q * pstride2, *b1 = b0 + pstride2;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t ks = 0; ks < KS; ++ks) {
        _tile_loadd(4, a0 + ks * 16, lda);
        _tile_loadd(6, b0 + ks * 256, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_n) {
          _tile_loadd(7, b1 + ks * 256, 64);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_m) {
          _tile_loadd(5, a1 + ks * 16, lda);
          _tile_dpbf16ps(2, 5, 6);
          if (two_n) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, ct[0], 64);
      _tile_stored(1, ct[1], 64);
      _tile_stored(2, ct[2], 64);
      _tile_stored(3, ct[3], 64);
      for (int t = 0; t < 4; ++t) {
        const int64_t m0 = 16 * (mt + (t >> 1)), n0 = kPanel * (q + (t & 1));
        if (m0 >= M || n0 >= N) continue;
        const int nc = (int)std::min<int64_t>(kPanel, N - n0);
        for (int64_t i = 0; i < std::min<int64_t>(16, M - m0); ++i)
          store_row(ct[t] + i * 16, bias ? bias + n0 : nullptr, nc, C + (m0 + i) * ldc + n0);
      }
    }
  }
  amx_release();
}

void pack_panel_pairs(const uint32_t *R, int64_t K2, int nc, uint32_t *P2) { transpose_into_panel(R, K2, K2, nc, P2); }

void pack_rows_bf16(const float *X, int64_t ldx, int64_t M, int64_t K, uint32_t *A2) {
  const int64_t K2 = (K + 1) / 2;
  for (int64_t m = 0; m < M; ++m) round_row(X + m * ldx, K, reinterpret_cast<uint16_t *>(A2 + m * K2));
}

}  // namespace bnb_ms