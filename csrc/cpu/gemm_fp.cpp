// gemm_fp.cpp -- full-precision linear layer: out[..., N] = A[..., K] @ W[N, K]^T (+ bias), for the layers a
// quantized model keeps in full precision (lm_head).  MindSpore's CPU `dense` (what mindtorch's nn.Linear runs)
// is very slow at small batch, and its matmul rejects bf16.
//
// Ops (entry points at the bottom):
//   cgemm_fp_{fp32,fp16,bf16}: A T[..., K], W T[N, K], bias (f32|f16|bf16)[N] | none -> out T[..., N]
//
// Numerics (the same bits at every SIMD level; the numpy twin is _reference.gemm_fp):
//   a = fp32(A[m, k]), w = fp32(W[n, k])            (fp16/bf16 widened exactly, W in registers)
//   acc[l] = 0 for the 16 lanes l = 0..15; for k = 0, 1, ..., K-1 in order:
//       acc[k mod 16] = fma(a, w, acc[k mod 16])    (fused multiply-add, one rounding)
//   r = ((t0 + t2) + (t1 + t3)) with t[i] = u[i] + u[i+4], u[i] = acc[i] + acc[i+8]   (fixed tree)
//   out[m, n] = round_T(r)  or  round_T(r + fp32(bias[n]))   (fp32 add, round to nearest even)
// The AVX2 path keeps lanes 0-7 and 8-15 in two ymm registers, the AVX-512 path all 16 in one zmm,
// the portable path 16 floats; a K that is not a multiple of 16 ends with scalar fmas into the same lanes.
//
// Memory: at batch 1 the op is bound by reading W, which is streamed once per call (several W rows at a
// time, so enough independent fma chains are in flight).  For more rows of A, rows are taken in blocks of
// MB (A block ~128 KiB, kept in L2) and each W tile (NR rows) is used for every row of the block, so W is
// read once per block of A rows.  Threads split N (parallel.h).
#include <immintrin.h>

// GCC 12's AVX-512 cast/extract intrinsics trip a false -Wuninitialized inside its own header (as in int8.cpp).
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "aot.h"
#include "checks/gemm_fp.h"
#include "cpu/cpu_features.h"
#include "cpu/linear_kernels.h"
#include "cpu/parallel.h"
#include "cpu/simd_convert.h"
#ifndef BNB_GEMM_FP_MR
#define BNB_GEMM_FP_MR 3
#define BNB_GEMM_FP_NR 2
#endif

namespace bnb_ms {
namespace {

// The fixed reduction tree of the 16 lanes (see the header comment).
BNB_MS_INLINE float reduce16(const float *acc) {
  float u[8], t[4];
  for (int l = 0; l < 8; ++l) u[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) t[l] = u[l] + u[l + 4];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// ---- portable path --------------------------------------------------------------------------------
struct GemmFpPortable {
  static constexpr int MR = 1, NR = 1, NR1 = 1;
  template <class T, int R, int C>
  static void tile(const float *a, int64_t lda, const T *w, int64_t K, float *res, const T *pf) {
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j) {
        float acc[16] = {0};
        const float *ai = a + i * lda;
        const T *wj = w + j * K;
        for (int64_t k = 0; k < K; ++k) acc[k & 15] = std::fma(ai[k], to_f32(wj[k]), acc[k & 15]);
        res[i * C + j] = reduce16(acc);
      }
  }
};

// Copies the last K - k (1..15) values of R rows (stride ld) into zero-padded fp32 rows of 16.
template <class T, int R>
BNB_MS_INLINE void tail_rows(const T *p, int64_t ld, int64_t k, int64_t K, float (*dst)[16]) {
  for (int i = 0; i < R; ++i) {
    for (int64_t l = 0; l < 16; ++l) dst[i][l] = k + l < K ? to_f32(p[i * ld + k + l]) : 0.0f;
  }
}

// ---- AVX2 + FMA + F16C: two ymm accumulators per output (lanes 0-7, 8-15) ------------------------------
struct GemmFpAvx2 {
  // gemm tile 3 x 2 (12 accumulators + 3 + 2 loaded vectors); gemv tile 1 x 4 (8 independent fma chains)
  static constexpr int MR = BNB_GEMM_FP_MR, NR = BNB_GEMM_FP_NR, NR1 = 4;
  // The fixed tree on lanes 0-7 (lo) and 8-15 (hi): u = lo + hi, t[i] = u[i] + u[i+4], (t0 + t2) + (t1 + t3).
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE static float reduce(__m256 lo, __m256 hi) {
    const __m256 u = _mm256_add_ps(lo, hi);
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    const __m128 v = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(v, _mm_movehdup_ps(v)));
  }
  template <class T, int R, int C>
  BNB_MS_TARGET_AVX2 static void tile(const float *a, int64_t lda, const T *w, int64_t K, float *res, const T *pf) {
    __m256 acc[R][C][2];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j) acc[i][j][0] = acc[i][j][1] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      if (pf)  // the next W tile, one cache line per row and step (fp16/bf16: every other step is a repeat)
        for (int j = 0; j < C; ++j) _mm_prefetch((const char *)(pf + j * K + k), _MM_HINT_T0);
      // lanes 0-7, then 8-15: each A and W vector is loaded once and used C (R) times
      for (int h = 0; h < 2; ++h) {
        __m256 av[R], wv[C];
        for (int i = 0; i < R; ++i) av[i] = _mm256_loadu_ps(a + i * lda + k + 8 * h);
        for (int j = 0; j < C; ++j) wv[j] = load8<T>(w + j * K + k + 8 * h);
        for (int i = 0; i < R; ++i)
          for (int j = 0; j < C; ++j) acc[i][j][h] = _mm256_fmadd_ps(av[i], wv[j], acc[i][j][h]);
      }
    }
    if (k < K) {  // the last K % 16 values into lanes 0.., the other lanes untouched
      alignas(32) float at[R][16], wt[C][16];
      tail_rows<float, R>(a, lda, k, K, at);
      tail_rows<T, C>(w, K, k, K, wt);
      const int64_t rem = K - k;
      for (int h = 0; h < 2; ++h) {
        if (8 * h >= rem) break;
        const __m256 mask = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
            _mm256_set1_epi32((int)(rem - 8 * h)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        for (int i = 0; i < R; ++i)
          for (int j = 0; j < C; ++j) {
            const __m256 f = _mm256_fmadd_ps(_mm256_load_ps(at[i] + 8 * h), _mm256_load_ps(wt[j] + 8 * h), acc[i][j][h]);
            acc[i][j][h] = _mm256_blendv_ps(acc[i][j][h], f, mask);
          }
      }
    }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j) res[i * C + j] = reduce(acc[i][j][0], acc[i][j][1]);
  }
};

// ---- AVX-512: one zmm accumulator per output ------------------------------------------------------------
struct GemmFpAvx512 {
  static constexpr int MR = 4, NR = 4, NR1 = 8;
  template <class T, int R, int C>
  BNB_MS_TARGET_AVX512 static void tile(const float *a, int64_t lda, const T *w, int64_t K, float *res, const T *pf) {
    __m512 acc[R][C];
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
      if (pf)
        for (int j = 0; j < C; ++j) _mm_prefetch((const char *)(pf + j * K + k), _MM_HINT_T0);
      __m512 av[R], wv[C];
      for (int i = 0; i < R; ++i) av[i] = _mm512_loadu_ps(a + i * lda + k);
      for (int j = 0; j < C; ++j) wv[j] = load16<T>(w + j * K + k);
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j) acc[i][j] = _mm512_fmadd_ps(av[i], wv[j], acc[i][j]);
    }
    if (k < K) {
      alignas(64) float at[R][16], wt[C][16];
      tail_rows<float, R>(a, lda, k, K, at);
      tail_rows<T, C>(w, K, k, K, wt);
      const __mmask16 mask = (__mmask16)((1u << (K - k)) - 1u);
      for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j)
          acc[i][j] = _mm512_mask3_fmadd_ps(_mm512_load_ps(at[i]), _mm512_load_ps(wt[j]), acc[i][j], mask);
    }
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < C; ++j)
        res[i * C + j] = GemmFpAvx2::reduce(_mm512_castps512_ps256(acc[i][j]), _mm512_extractf32x8_ps(acc[i][j], 1));
  }
};

// Rows of A per block: the block (MB x K fp32, up to ~192 KiB) stays in L2 while every W tile of a thread's
// range passes; W is read from memory once per block.  Blocks are balanced (ceil(M / nblocks) rows, a
// multiple of MR when it can be) so that no thin last block re-reads W for a few rows.
inline int64_t rows_per_block(int64_t M, int64_t K, int MR) {
  const int64_t cap = std::max<int64_t>(MR, (49152 / std::max<int64_t>(K, 1)) / MR * MR);
  const int64_t nblocks = (M + cap - 1) / cap;
  const int64_t mb = (M + nblocks - 1) / nblocks;
  return std::min(cap, (mb + MR - 1) / MR * MR);
}

// T: the weight's element type; O: the result's (T for the entry points, fp32 for dense_linear_f32).
template <class Kern, int MR, int NR, class T, class O>
void drive(const float *a32, const T *W, const float *bias, O *out, int64_t M, int64_t N, int64_t K) {
  const int64_t NT = (N + NR - 1) / NR;  // tiles of NR weight rows
  const int64_t MB = rows_per_block(M, K, MR);
  // ~64K multiply-adds per chunk at least (thread start-up is ~10 us)
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, K * std::min<int64_t>(M, MB) * NR));
  parallel_for(NT, grain, [&](int64_t t0, int64_t t1) {
    float res[MR * NR];
    auto store = [&](int64_t m, int64_t n, float r) {
      if (bias) r = r + bias[n];
      out[m * N + n] = from_f32<O>(r);
    };
    for (int64_t m0 = 0; m0 < M; m0 += MB) {
      const int64_t m1 = std::min(M, m0 + MB);
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * NR;
        const T *w = W + n0 * K;
        // the first row tile of A prefetches the next W tile (rows are only K values long: the
        // hardware prefetchers stop at page ends and restart late on every row)
        const T *pf = t + 1 < t1 && n0 + 2 * NR <= N ? w + NR * K : nullptr;
        if (n0 + NR <= N) {
          int64_t m = m0;
          for (; m + MR <= m1; m += MR) {
            Kern::template tile<T, MR, NR>(a32 + m * K, K, w, K, res, m == m0 ? pf : nullptr);
            for (int i = 0; i < MR; ++i)
              for (int j = 0; j < NR; ++j) store(m + i, n0 + j, res[i * NR + j]);
          }
          for (; m < m1; ++m) {
            Kern::template tile<T, 1, NR>(a32 + m * K, K, w, K, res, m == m0 ? pf : nullptr);
            for (int j = 0; j < NR; ++j) store(m, n0 + j, res[j]);
          }
        } else {
          for (int64_t n = n0; n < N; ++n) {
            const T *wn = W + n * K;
            int64_t m = m0;
            for (; m + MR <= m1; m += MR) {
              Kern::template tile<T, MR, 1>(a32 + m * K, K, wn, K, res, nullptr);
              for (int i = 0; i < MR; ++i) store(m + i, n, res[i]);
            }
            for (; m < m1; ++m) {
              Kern::template tile<T, 1, 1>(a32 + m * K, K, wn, K, res, nullptr);
              store(m, n, res[0]);
            }
          }
        }
      }
    }
  });
}

template <class Kern, class T, class O>
void run(const float *a32, const T *W, const float *bias, O *out, int64_t M, int64_t N, int64_t K) {
  if (M < Kern::MR) drive<Kern, 1, Kern::NR1, T, O>(a32, W, bias, out, M, N, K);
  else drive<Kern, Kern::MR, Kern::NR, T, O>(a32, W, bias, out, M, N, K);
}

// The kernel at the CPU's SIMD level (K > 0).
template <class T, class O>
void gemm_fp(const float *a32, const T *W, const float *bias, O *out, int64_t M, int64_t N, int64_t K) {
  const SimdLevel lvl = simd_level();
  if (lvl >= SimdLevel::avx512) run<GemmFpAvx512>(a32, W, bias, out, M, N, K);
  else if (lvl >= SimdLevel::avx2) run<GemmFpAvx2>(a32, W, bias, out, M, N, K);
  else run<GemmFpPortable>(a32, W, bias, out, M, N, K);
}

template <class B>
void widen(const B *src, float *dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_f32(src[i]);
}

template <class T>
int gemm_fp_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::GemmFp<T> a;
  if (int s = checks::gemm_fp<T>(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t M = a.M, N = a.N, K = a.K;
  // bias as fp32 (widened once per call when it is fp16/bf16)
  std::vector<float> bias_buf;
  const float *bias = nullptr;
  if (a.bias) {
    if (a.bias_dt == DType::f32) {
      bias = static_cast<const float *>(a.bias);
    } else {
      bias_buf.resize((size_t)N);
      if (a.bias_dt == DType::f16) widen(static_cast<const fp16_t *>(a.bias), bias_buf.data(), N);
      else widen(static_cast<const bf16_t *>(a.bias), bias_buf.data(), N);
      bias = bias_buf.data();
    }
  }
  if (K == 0) {  // empty sums: out = bias, or +0
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) a.out[m * N + n] = from_f32<T>(bias ? 0.0f + bias[n] : 0.0f);
    return OK;
  }
  // activations as fp32 (small next to W: widened once per call)
  std::vector<float> a_buf;
  const float *a32;
  if (dtype_of<T>() == DType::f32) {
    a32 = reinterpret_cast<const float *>(a.A);
  } else {
    a_buf.resize((size_t)(M * K));
    widen(a.A, a_buf.data(), M * K);
    a32 = a_buf.data();
  }
  gemm_fp(a32, a.W, bias, a.out, M, N, K);
  return OK;
}

}  // namespace

void dense_linear_f32(const float *A, const void *W, DType wdt, const float *bias, float *out, int64_t M, int64_t N,
                      int64_t K) {
  if (linear_without_products(bias, out, M, N, K)) return;
  if (wdt == DType::f16) gemm_fp(A, static_cast<const fp16_t *>(W), bias, out, M, N, K);
  else if (wdt == DType::bf16) gemm_fp(A, static_cast<const bf16_t *>(W), bias, out, M, N, K);
  else gemm_fp(A, static_cast<const float *>(W), bias, out, M, N, K);
}

}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cgemm_fp_fp32, bnb_ms::gemm_fp_entry<float>)
BNB_MS_ENTRY(cgemm_fp_fp16, bnb_ms::gemm_fp_entry<fp16_t>)
BNB_MS_ENTRY(cgemm_fp_bf16, bnb_ms::gemm_fp_entry<bf16_t>)
