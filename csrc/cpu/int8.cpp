// int8.cpp -- LLM.int8() CPU kernels (Dettmers et al., "LLM.int8(): 8-bit Matrix Multiplication for
// Transformers at Scale", arXiv 2208.07339): row-wise absmax quantization with outlier columns,
// an int8 x int8 -> int32 GEMM, and the int32 -> float dequantization with row/col scales and bias.
//
// Numerics follow upstream bitsandbytes 0.50.2 on CPU (bitsandbytes/backends/default/ops.py), so the
// bytes match upstream where upstream is deterministic:
//  * vector quant: x is widened to fp32; with threshold > 0 the elements with |x| >= threshold (the
//    threshold rounded to the input dtype, as torch compares in that dtype) are outliers: they are
//    left out of the row absmax and quantize to 0, and when there is more than one row every column
//    that holds an outlier is zeroed in the output.  q = round_half_even(x * ((1 / absmax) * 127)) in
//    fp32 (torch computes the scalar / tensor `127.0 / row_stats` as a reciprocal times 127);
//    a row whose absmax is 0 gives 0 (upstream: NaN converted to int8, which is 0 on x86).
//  * GEMM: out[m, n] = sum_k A[m, k] * B[n, k] exactly in int32 (upstream's AVX2 path uses an fp32
//    matmul, inexact once partial sums pass 2^24; its AVX-512 path uses torch._int_mm, exact).
//  * mm dequant: out = float(A) * (row * col) * 6.200124e-05f (+ float(bias)), each step rounded in
//    fp32, then rounded to the output dtype (upstream's default-backend constant, not CUDA's 6.200012e-05).
#include <immintrin.h>

// GCC 12's _mm512_reduce_add_epi32 trips a false -Wuninitialized inside its own header.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "aot.h"
#include "cpu/cpu_features.h"
#include "cpu/parallel.h"

namespace bnb_ms {
namespace {

// ------------------------------------------------------------------------------------------------
// vector quant
// ------------------------------------------------------------------------------------------------
template <class T>
void vector_quant(const T *A, int8_t *out, float *row_stats, uint8_t *col_flags, int64_t rows, int64_t cols,
                  float threshold) {
  const bool split = threshold > 0.0f;
  const float thr = split ? to_f32<T>(from_f32<T>(threshold)) : 0.0f;
  std::memset(col_flags, 0, (size_t)cols);
  bool any = false;
  if (split) {
    // Column flags: one pass, rows in parallel would race on flags, so columns are split instead.
    parallel_for(cols, 1024, [&](int64_t c0, int64_t c1) {
      for (int64_t r = 0; r < rows; ++r) {
        const T *a = A + r * cols;
        for (int64_t c = c0; c < c1; ++c)
          if (std::fabs(to_f32<T>(a[c])) >= thr) col_flags[c] = 1;
      }
    });
    for (int64_t c = 0; c < cols; ++c) any |= col_flags[c] != 0;
  }
  const bool zero_cols = any && rows > 1;
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T *a = A + r * cols;
      int8_t *o = out + r * cols;
      float amax = 0.0f;
      if (any) {
        for (int64_t c = 0; c < cols; ++c) {
          float v = std::fabs(to_f32<T>(a[c]));
          if (!(v >= thr) && v > amax) amax = v;
        }
      } else {
        for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(to_f32<T>(a[c])));
      }
      row_stats[r] = amax;
      if (amax == 0.0f) {
        std::memset(o, 0, (size_t)cols);
        continue;
      }
      // torch evaluates `127.0 / row_stats` (scalar / tensor) as reciprocal(row_stats) * 127: two roundings.
      const float s = (1.0f / amax) * 127.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float x = to_f32<T>(a[c]);
        if (any && std::fabs(x) >= thr) { o[c] = 0; continue; }
        o[c] = (int8_t)(int)std::nearbyint(x * s);
      }
      if (zero_cols)
        for (int64_t c = 0; c < cols; ++c)
          if (col_flags[c]) o[c] = 0;
    }
  });
}

// params: A T[..., K], threshold f32 -> out i8[like A], row_stats f32[rows], col_flags u8[K]
int vector_quant_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  if (nparam != 5) return E_NPARAM;
  enum { A, THR, OUT, ROWS, FLAGS };
  const DType dt = c.dtype(A);
  if ((dt != DType::f32 && dt != DType::f16 && dt != DType::bf16) || c.dtype(OUT) != DType::i8 ||
      c.dtype(ROWS) != DType::f32 || c.dtype(FLAGS) != DType::u8)
    return E_DTYPE;
  float thr;
  if (!c.scalar_f32(THR, &thr) || !(thr >= 0.0f)) return E_VALUE;
  if (c.rank(A) < 1) return E_SHAPE;
  const int64_t cols = c.cols(A), n = c.numel(A), rows = cols ? n / cols : 0;
  if (c.numel(OUT) != n || c.numel(ROWS) != rows || c.numel(FLAGS) != cols) return E_SHAPE;
  if (n == 0) return OK;
  if (!c.params[A] || !c.params[OUT] || !c.params[ROWS] || !c.params[FLAGS]) return E_NULL;
  int8_t *o = c.ptr<int8_t>(OUT);
  float *rs = c.ptr<float>(ROWS);
  uint8_t *fl = c.ptr<uint8_t>(FLAGS);
  if (dt == DType::f32) vector_quant<float>(c.ptr<float>(A), o, rs, fl, rows, cols, thr);
  else if (dt == DType::f16) vector_quant<fp16_t>(c.ptr<fp16_t>(A), o, rs, fl, rows, cols, thr);
  else vector_quant<bf16_t>(c.ptr<bf16_t>(A), o, rs, fl, rows, cols, thr);
  return OK;
}

// ------------------------------------------------------------------------------------------------
// int8 GEMM: C[M, N] = A[M, K] . B[N, K]^T, int32 accumulation (exact: |sum| <= K * 2^14 < 2^31 for
// K < 131072, which the entry point enforces).
//
// Layout: A is first widened to int16 (M*K*2 bytes, once per call); B stays int8 and each 16-byte
// chunk is widened in registers.  Work is split over N (B rows) between threads; each thread walks
// N in blocks of kNB rows (kNB*KC bytes of B stay in L2) and K in blocks of kKC, and inside a block
// runs an MR x NR register tile of int32 accumulators over all M.
// ------------------------------------------------------------------------------------------------
constexpr int64_t kKC = 2048;  // K block (A tile 4 x 2048 x 2 bytes = 16 KiB stays in L1)
constexpr int64_t kNB = 96;    // B rows per L2 block (96 x 2048 = 192 KiB)
constexpr int64_t kMaxK = 131071;

void widen_a(const int8_t *A, int16_t *A16, int64_t n) {
  for (int64_t i = 0; i < n; ++i) A16[i] = A[i];
}

// portable tile: any mr <= 4, nr <= 3
void tile_generic(const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc, int64_t k0, int64_t k1,
                  int64_t m0, int64_t mr, int64_t n0, int64_t nr, bool first) {
  for (int64_t i = 0; i < mr; ++i)
    for (int64_t j = 0; j < nr; ++j) {
      const int16_t *a = A16 + (m0 + i) * K;
      const int8_t *b = B + (n0 + j) * K;
      int32_t s = 0;
      for (int64_t k = k0; k < k1; ++k) s += (int32_t)a[k] * (int32_t)b[k];
      int32_t *c = C + (m0 + i) * ldc + n0 + j;
      *c = first ? s : *c + s;
    }
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE int32_t hsum256(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// AVX2 4x3 tile: per 16 k, 3 sign-extending loads of B (vpmovsxbw), 12 vpmaddwd against int16 A.
template <int MR, int NR>
BNB_MS_TARGET_AVX2 void tile_avx2(const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc,
                                  int64_t k0, int64_t k1, int64_t m0, int64_t n0, bool first) {
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  const int16_t *a[MR];
  const int8_t *b[NR];
  for (int i = 0; i < MR; ++i) a[i] = A16 + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) b[j] = B + (n0 + j) * K;
  int64_t k = k0;
  for (; k + 16 <= k1; k += 16) {
    __m256i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b[j] + k)));
    for (int i = 0; i < MR; ++i) {
      const __m256i va = _mm256_loadu_si256((const __m256i *)(a[i] + k));
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_add_epi32(acc[i][j], _mm256_madd_epi16(va, vb[j]));
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      int32_t s = hsum256(acc[i][j]);
      for (int64_t kk = k; kk < k1; ++kk) s += (int32_t)a[i][kk] * (int32_t)b[j][kk];
      int32_t *c = C + (m0 + i) * ldc + n0 + j;
      *c = first ? s : *c + s;
    }
}

// AVX-512 (+VNNI when present) 4x3 tile, same structure with 32 k per step.
template <int MR, int NR, bool VNNI>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
void tile_avx512(const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc, int64_t k0, int64_t k1,
                 int64_t m0, int64_t n0, bool first) {
  __m512i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  const int16_t *a[MR];
  const int8_t *b[NR];
  for (int i = 0; i < MR; ++i) a[i] = A16 + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) b[j] = B + (n0 + j) * K;
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) {
    __m512i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b[j] + k)));
    for (int i = 0; i < MR; ++i) {
      const __m512i va = _mm512_loadu_si512((const void *)(a[i] + k));
      for (int j = 0; j < NR; ++j)
        acc[i][j] = VNNI ? _mm512_dpwssd_epi32(acc[i][j], va, vb[j])
                         : _mm512_add_epi32(acc[i][j], _mm512_madd_epi16(va, vb[j]));
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      int32_t s = _mm512_reduce_add_epi32(acc[i][j]);
      for (int64_t kk = k; kk < k1; ++kk) s += (int32_t)a[i][kk] * (int32_t)b[j][kk];
      int32_t *c = C + (m0 + i) * ldc + n0 + j;
      *c = first ? s : *c + s;
    }
}

enum class GemmPath { scalar, avx2, avx512, avx512vnni };

GemmPath gemm_path() {
  const SimdLevel l = simd_level();
  if (l >= SimdLevel::avx512) return (cpu_features() & CPU_AVX512VNNI) ? GemmPath::avx512vnni : GemmPath::avx512;
  if (l >= SimdLevel::avx2) return GemmPath::avx2;
  return GemmPath::scalar;
}

template <int MR, int NR>
void run_tile(GemmPath p, const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc, int64_t k0,
              int64_t k1, int64_t m0, int64_t n0, bool first) {
  switch (p) {
    case GemmPath::avx512vnni: tile_avx512<MR, NR, true>(A16, B, C, K, ldc, k0, k1, m0, n0, first); break;
    case GemmPath::avx512: tile_avx512<MR, NR, false>(A16, B, C, K, ldc, k0, k1, m0, n0, first); break;
    case GemmPath::avx2: tile_avx2<MR, NR>(A16, B, C, K, ldc, k0, k1, m0, n0, first); break;
    default: tile_generic(A16, B, C, K, ldc, k0, k1, m0, MR, n0, NR, first); break;
  }
}

template <int MR>
void run_row_tile(GemmPath p, const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc, int64_t k0,
                  int64_t k1, int64_t m0, int64_t n0, int64_t n1, bool first) {
  int64_t n = n0;
  for (; n + 3 <= n1; n += 3) run_tile<MR, 3>(p, A16, B, C, K, ldc, k0, k1, m0, n, first);
  if (n1 - n == 2) run_tile<MR, 2>(p, A16, B, C, K, ldc, k0, k1, m0, n, first);
  else if (n1 - n == 1) run_tile<MR, 1>(p, A16, B, C, K, ldc, k0, k1, m0, n, first);
}

void int8_gemm(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  std::vector<int16_t> a16((size_t)(M * K));
  parallel_for(M, std::max<int64_t>(1, 65536 / K), [&](int64_t r0, int64_t r1) {
    widen_a(A + r0 * K, a16.data() + r0 * K, (r1 - r0) * K);
  });
  const GemmPath p = gemm_path();
  // N chunks of whole L2 blocks when there is enough work, else finer (multiples of 3 rows).
  const int64_t grain = std::max<int64_t>(3, std::min<int64_t>(kNB, (int64_t)(1 << 22) / std::max<int64_t>(M * K, 1) * 3));
  parallel_for(N, grain, [&](int64_t nb0, int64_t nb1) {
    for (int64_t nb = nb0; nb < nb1; nb += kNB) {
      const int64_t ne = std::min(nb + kNB, nb1);
      for (int64_t k0 = 0; k0 < K; k0 += kKC) {
        const int64_t k1 = std::min(k0 + kKC, K);
        const bool first = k0 == 0;
        int64_t m = 0;
        for (; m + 4 <= M; m += 4) run_row_tile<4>(p, a16.data(), B, C, K, N, k0, k1, m, nb, ne, first);
        for (; m < M; ++m) run_row_tile<1>(p, a16.data(), B, C, K, N, k0, k1, m, nb, ne, first);
      }
    }
  });
}

// params: A i8[..., K], B i8[N, K] -> out i32[..., N]
int igemm_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  if (nparam != 3) return E_NPARAM;
  enum { A, B, OUT };
  if (c.dtype(A) != DType::i8 || c.dtype(B) != DType::i8 || c.dtype(OUT) != DType::i32) return E_DTYPE;
  if (c.rank(A) < 1 || c.rank(B) != 2) return E_SHAPE;
  const int64_t K = c.cols(A), N = c.dim(B, 0);
  if (c.dim(B, 1) != K || K > kMaxK) return E_SHAPE;
  const int64_t M = K ? c.numel(A) / K : 0;
  if (c.numel(OUT) != M * N || c.cols(OUT) != N) return E_SHAPE;
  if (M == 0 || N == 0) return OK;
  if (!c.params[OUT]) return E_NULL;
  int32_t *C = c.ptr<int32_t>(OUT);
  if (K == 0) { std::memset(C, 0, sizeof(int32_t) * (size_t)(M * N)); return OK; }
  if (!c.params[A] || !c.params[B]) return E_NULL;
  int8_gemm(c.ptr<int8_t>(A), c.ptr<int8_t>(B), C, M, N, K);
  return OK;
}

// ------------------------------------------------------------------------------------------------
// mm dequant
// ------------------------------------------------------------------------------------------------
constexpr float kMmDequant = 6.200124e-05f;

template <class T, class BT>
void mm_dequant(const int32_t *A, const float *rs, const float *cs, const BT *bias, T *out, int64_t rows,
                int64_t cols) {
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float rv = rs[r];
      const int32_t *a = A + r * cols;
      T *o = out + r * cols;
      for (int64_t j = 0; j < cols; ++j) {
        float v = (float)a[j] * (rv * cs[j]);
        v = v * kMmDequant;
        if (bias) v = v + to_f32<BT>(bias[j]);
        o[j] = from_f32<T>(v);
      }
    }
  });
}

// params: A i32[..., N], row_stats f32[rows], col_stats f32[N], bias (f32|f16|bf16)[N] | none -> out T[like A]
template <class T>
int mm_dequant_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  if (nparam != 5) return E_NPARAM;
  enum { A, RS, CS, BIAS, OUT };
  if (c.dtype(A) != DType::i32 || c.dtype(RS) != DType::f32 || c.dtype(CS) != DType::f32 ||
      c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  const bool has_bias = !c.is_none(BIAS);
  const DType bdt = has_bias ? c.dtype(BIAS) : DType::none;
  if (has_bias && bdt != DType::f32 && bdt != DType::f16 && bdt != DType::bf16) return E_DTYPE;
  if (c.rank(A) < 1) return E_SHAPE;
  const int64_t cols = c.cols(A), n = c.numel(A), rows = cols ? n / cols : 0;
  if (c.numel(OUT) != n || c.numel(RS) != rows || c.numel(CS) != cols || (has_bias && c.numel(BIAS) != cols))
    return E_SHAPE;
  if (n == 0) return OK;
  if (!c.params[A] || !c.params[RS] || !c.params[CS] || !c.params[OUT]) return E_NULL;
  const int32_t *a = c.ptr<int32_t>(A);
  const float *rs = c.ptr<float>(RS), *cs = c.ptr<float>(CS);
  T *o = c.ptr<T>(OUT);
  if (!has_bias) mm_dequant<T, float>(a, rs, cs, nullptr, o, rows, cols);
  else if (bdt == DType::f32) mm_dequant<T, float>(a, rs, cs, c.ptr<float>(BIAS), o, rows, cols);
  else if (bdt == DType::f16) mm_dequant<T, fp16_t>(a, rs, cs, c.ptr<fp16_t>(BIAS), o, rows, cols);
  else mm_dequant<T, bf16_t>(a, rs, cs, c.ptr<bf16_t>(BIAS), o, rows, cols);
  return OK;
}

}  // namespace
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_EXPORT int cint8_vector_quant(BNB_MS_AOT_ARGS) { return bnb_ms::vector_quant_entry(nparam, params, ndims, shapes, dtypes, stream, extra); }
BNB_MS_EXPORT int cigemmlt_32(BNB_MS_AOT_ARGS) { return bnb_ms::igemm_entry(nparam, params, ndims, shapes, dtypes, stream, extra); }
BNB_MS_EXPORT int cdequant_mm_int32_fp16(BNB_MS_AOT_ARGS) { return bnb_ms::mm_dequant_entry<fp16_t>(nparam, params, ndims, shapes, dtypes, stream, extra); }
BNB_MS_EXPORT int cdequant_mm_int32_fp32(BNB_MS_AOT_ARGS) { return bnb_ms::mm_dequant_entry<float>(nparam, params, ndims, shapes, dtypes, stream, extra); }
BNB_MS_EXPORT int cdequant_mm_int32_bf16(BNB_MS_AOT_ARGS) { return bnb_ms::mm_dequant_entry<bf16_t>(nparam, params, ndims, shapes, dtypes, stream, extra); }
