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
//    a row whose absmax is 0 gives 0 (upstream: NaN converted to int8, which is 0 on x86).  A NaN in a row
//    (never an outlier) makes its absmax NaN, as torch.max propagates it, and its codes 0, so the row's
//    outputs are NaN after the dequant.
//  * GEMM: out[m, n] = sum_k A[m, k] * B[n, k] exactly in int32 (upstream's AVX2 path uses an fp32
//    matmul, inexact once partial sums pass 2^24; its AVX-512 path uses torch._int_mm, exact).
//  * mm dequant: out = float(A) * (row * col) * 6.200124e-05f (+ float(bias)), each step rounded in
//    fp32, then rounded to the output dtype (upstream's default-backend constant, not CUDA's 6.200012e-05).
//
// Kernel paths (chosen at run time from CPUID; BNB_MS_SIMD=scalar|avx2|avx512 lowers the level):
//  * vector quant and mm dequant: portable, AVX2 (F16C for fp16) and AVX-512 variants that do the same
//    fp32 operations in the same order per element, so every level gives the same bytes.
//  * GEMM: scalar, AVX2 (vpmaddwd on int16-widened A; from 12 rows on against B widened into packed
//    16-column panels), AVX-512 (same as the former), AVX-VNNI and AVX-512 VNNI
//    (vpdpbusd: u8 x s8 with B fed as b + 128 and 128 * sum_k A[m, k] subtracted per output; the
//    non-saturating instruction wraps mod 2^32 and the true result fits int32, so it is exact), and
//    AMX-INT8 (tdpbssd, s8 x s8, for M >= 8).  BNB_MS_INT8_GEMM=scalar|avx2|avx512|avxvnni|avx512vnni|amx
//    forces one path when the CPU has it (for every M); bnb_ms_int8_gemm_path() names the path in use.
#include <immintrin.h>

// GCC 12's _mm512_reduce_add_epi32 trips a false -Wuninitialized inside its own header.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>
#include <new>
#include <vector>

#include "aot.h"
#include "checks/int8.h"
#include "cpu/cpu_features.h"
#include "cpu/linear_kernels.h"
#include "cpu/parallel.h"
#include "cpu/simd_convert.h"

namespace bnb_ms {
namespace {

// ------------------------------------------------------------------------------------------------
// vector quant
// ------------------------------------------------------------------------------------------------
// One element: outliers (|x| >= thr when `any`) give 0; else round_half_even(x * s) converted to int32
// and truncated to its low byte (NaN/inf give INT_MIN from the conversion, so 0).
BNB_MS_INLINE int8_t vq_elem(float x, float s, bool any, float thr) {
  if (any && std::fabs(x) >= thr) return 0;
  return (int8_t)(int)std::nearbyint(x * s);
}

// A row's absmax as upstream's torch.max: a NaN anywhere in the row (NaN is never an outlier) makes it NaN
// (the quiet NaN 0x7fc00000, whatever the input's NaN bits).  Stores it; true when the codes still have
// to be computed, false when they are all 0 (absmax 0, or NaN: x * NaN converts to 0, as upstream's).
BNB_MS_INLINE bool vq_row_stat(float amax, bool nan, int8_t *o, int64_t cols, float *stat) {
  if (nan) amax = std::numeric_limits<float>::quiet_NaN();
  *stat = amax;
  if (amax > 0.0f) return true;
  std::memset(o, 0, (size_t)cols);
  return false;
}

// The absmax of columns [c, cols) folded into *amax (outliers left out), NaN seen into *nan.
template <class T>
BNB_MS_INLINE void vq_absmax_tail(const T *a, int64_t c, int64_t cols, bool any, float thr, float *amax, bool *nan) {
  for (; c < cols; ++c) {
    const float v = std::fabs(to_f32<T>(a[c]));
    *nan |= v != v;
    if (!(any && v >= thr) && v > *amax) *amax = v;
  }
}

// One row: absmax (outliers left out, NaN propagated) into *stat, then the int8 codes; `zf` (the column
// flags, or null) zeroes whole outlier columns.
template <class T>
void vq_row_generic(const T *a, int8_t *o, int64_t cols, bool any, float thr, const uint8_t *zf, float *stat) {
  float amax = 0.0f;
  bool nan = false;
  vq_absmax_tail<T>(a, 0, cols, any, thr, &amax, &nan);
  if (!vq_row_stat(amax, nan, o, cols, stat)) return;
  // torch evaluates `127.0 / row_stats` (scalar / tensor) as reciprocal(row_stats) * 127: two roundings.
  const float s = (1.0f / amax) * 127.0f;
  for (int64_t c = 0; c < cols; ++c) o[c] = vq_elem(to_f32<T>(a[c]), s, any, thr);
  if (zf)
    for (int64_t c = 0; c < cols; ++c)
      if (zf[c]) o[c] = 0;
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

template <class T>
BNB_MS_TARGET_AVX2 void vq_row_avx2(const T *a, int8_t *o, int64_t cols, bool any, float thr, const uint8_t *zf,
                                    float *stat) {
  const __m256 sign = _mm256_set1_ps(-0.0f), vthr = _mm256_set1_ps(thr);
  __m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    __m256 v = _mm256_andnot_ps(sign, load8<T>(a + c));
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    if (any) v = _mm256_and_ps(v, _mm256_cmp_ps(v, vthr, _CMP_LT_OQ));  // outliers and NaN -> 0
    vmax = _mm256_max_ps(v, vmax);  // NaN lanes keep vmax (MAXPS returns its second operand); vnan has them
  }
  float amax = hmax8(vmax);
  bool nan = !_mm256_testz_ps(vnan, vnan);
  vq_absmax_tail<T>(a, c, cols, any, thr, &amax, &nan);
  if (!vq_row_stat(amax, nan, o, cols, stat)) return;
  const float s = (1.0f / amax) * 127.0f;
  const __m256 vs = _mm256_set1_ps(s);
  const __m256i low = _mm256_set1_epi32(0xff);
  c = 0;
  for (; c + 8 <= cols; c += 8) {
    const __m256 x = load8<T>(a + c);
    __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, vs));  // MXCSR rounding: nearest even, as nearbyint
    if (any) q = _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(_mm256_andnot_ps(sign, x), vthr, _CMP_GE_OQ)), q);
    q = _mm256_and_si256(q, low);  // the low byte, as the (int8_t) cast
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    __m128i b = _mm_packus_epi16(w, w);
    if (zf) b = _mm_and_si128(b, _mm_cmpeq_epi8(_mm_loadl_epi64((const __m128i *)(zf + c)), _mm_setzero_si128()));
    _mm_storel_epi64((__m128i *)(o + c), b);
  }
  for (; c < cols; ++c) o[c] = (zf && zf[c]) ? (int8_t)0 : vq_elem(to_f32<T>(a[c]), s, any, thr);
}

template <class T>
BNB_MS_TARGET_AVX512 void vq_row_avx512(const T *a, int8_t *o, int64_t cols, bool any, float thr, const uint8_t *zf,
                                        float *stat) {
  const __m512 vthr = _mm512_set1_ps(thr);
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 mnan = 0;
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    __m512 v = _mm512_abs_ps(load16<T>(a + c));
    mnan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (any) v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, vthr, _CMP_LT_OQ), v);  // outliers and NaN -> 0
    vmax = _mm512_max_ps(v, vmax);  // NaN lanes keep vmax; mnan has them
  }
  float amax = _mm512_reduce_max_ps(vmax);
  bool nan = mnan != 0;
  vq_absmax_tail<T>(a, c, cols, any, thr, &amax, &nan);
  if (!vq_row_stat(amax, nan, o, cols, stat)) return;
  const float s = (1.0f / amax) * 127.0f;
  const __m512 vs = _mm512_set1_ps(s);
  c = 0;
  for (; c + 16 <= cols; c += 16) {
    const __m512 x = load16<T>(a + c);
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x, vs));
    if (any) q = _mm512_mask_mov_epi32(q, _mm512_cmp_ps_mask(_mm512_abs_ps(x), vthr, _CMP_GE_OQ), _mm512_setzero_si512());
    __m128i b = _mm512_cvtepi32_epi8(q);  // truncation to the low byte
    if (zf) b = _mm_mask_mov_epi8(b, _mm_cmpneq_epi8_mask(_mm_loadu_si128((const __m128i *)(zf + c)), _mm_setzero_si128()),
                                  _mm_setzero_si128());
    _mm_storeu_si128((__m128i *)(o + c), b);
  }
  for (; c < cols; ++c) o[c] = (zf && zf[c]) ? (int8_t)0 : vq_elem(to_f32<T>(a[c]), s, any, thr);
}

// Column flags: flags[c] = 1 where some row has |x| >= thr, for columns [c0, c1).
template <class T>
void flag_cols_generic(const T *A, int64_t rows, int64_t cols, int64_t c0, int64_t c1, float thr, uint8_t *flags) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *a = A + r * cols;
    for (int64_t c = c0; c < c1; ++c)
      if (std::fabs(to_f32<T>(a[c])) >= thr) flags[c] = 1;
  }
}

template <class T>
BNB_MS_TARGET_AVX2 void flag_cols_avx2(const T *A, int64_t rows, int64_t cols, int64_t c0, int64_t c1, float thr,
                                       uint8_t *flags) {
  const __m256 sign = _mm256_set1_ps(-0.0f), vthr = _mm256_set1_ps(thr);
  for (int64_t r = 0; r < rows; ++r) {
    const T *a = A + r * cols;
    int64_t c = c0;
    for (; c + 8 <= c1; c += 8) {
      unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, load8<T>(a + c)), vthr, _CMP_GE_OQ));
      for (; m; m &= m - 1) flags[c + __builtin_ctz(m)] = 1;
    }
    for (; c < c1; ++c)
      if (std::fabs(to_f32<T>(a[c])) >= thr) flags[c] = 1;
  }
}

template <class T>
BNB_MS_TARGET_AVX512 void flag_cols_avx512(const T *A, int64_t rows, int64_t cols, int64_t c0, int64_t c1, float thr,
                                           uint8_t *flags) {
  const __m512 vthr = _mm512_set1_ps(thr);
  for (int64_t r = 0; r < rows; ++r) {
    const T *a = A + r * cols;
    int64_t c = c0;
    for (; c + 16 <= c1; c += 16) {
      unsigned m = (unsigned)_mm512_cmp_ps_mask(_mm512_abs_ps(load16<T>(a + c)), vthr, _CMP_GE_OQ);
      for (; m; m &= m - 1) flags[c + __builtin_ctz(m)] = 1;
    }
    for (; c < c1; ++c)
      if (std::fabs(to_f32<T>(a[c])) >= thr) flags[c] = 1;
  }
}

template <class T>
void vector_quant(const T *A, int8_t *out, float *row_stats, uint8_t *col_flags, int64_t rows, int64_t cols,
                  float threshold) {
  const bool split = threshold > 0.0f;
  const float thr = split ? to_f32<T>(from_f32<T>(threshold)) : 0.0f;
  const SimdLevel lvl = simd_level();
  std::memset(col_flags, 0, (size_t)cols);
  bool any = false;
  if (split) {
    // Column flags: one pass, rows in parallel would race on flags, so columns are split instead.
    parallel_for(cols, 1024, [&](int64_t c0, int64_t c1) {
      if (lvl >= SimdLevel::avx512) flag_cols_avx512<T>(A, rows, cols, c0, c1, thr, col_flags);
      else if (lvl >= SimdLevel::avx2) flag_cols_avx2<T>(A, rows, cols, c0, c1, thr, col_flags);
      else flag_cols_generic<T>(A, rows, cols, c0, c1, thr, col_flags);
    });
    for (int64_t c = 0; c < cols; ++c) any |= col_flags[c] != 0;
  }
  const uint8_t *zf = (any && rows > 1) ? col_flags : nullptr;
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T *a = A + r * cols;
      int8_t *o = out + r * cols;
      if (lvl >= SimdLevel::avx512) vq_row_avx512<T>(a, o, cols, any, thr, zf, row_stats + r);
      else if (lvl >= SimdLevel::avx2) vq_row_avx2<T>(a, o, cols, any, thr, zf, row_stats + r);
      else vq_row_generic<T>(a, o, cols, any, thr, zf, row_stats + r);
    }
  });
}

// ---- entry point: checks in checks/int8.h (shared with the CUDA library) -------------------------
int vector_quant_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::VectorQuant a;
  if (int s = checks::vector_quant(c, &a)) return s;
  if (a.empty) return OK;
  int8_t *o = a.out;
  float *rs = a.row_stats;
  uint8_t *fl = a.col_flags;
  if (a.dt == DType::f32) vector_quant<float>(static_cast<const float *>(a.A), o, rs, fl, a.rows, a.cols, a.threshold);
  else if (a.dt == DType::f16) vector_quant<fp16_t>(static_cast<const fp16_t *>(a.A), o, rs, fl, a.rows, a.cols, a.threshold);
  else vector_quant<bf16_t>(static_cast<const bf16_t *>(a.A), o, rs, fl, a.rows, a.cols, a.threshold);
  return OK;
}


// ------------------------------------------------------------------------------------------------
// int8 GEMM: C[M, N] = A[M, K] . B[N, K]^T, int32 accumulation (exact: |sum| <= K * 2^14 < 2^31 for
// K < 131072, which the entry point enforces).
//
// Paths (see the header): scalar / AVX2 / AVX-512 widen A to int16 once per call and multiply with
// vpmaddwd; AVX-VNNI / AVX-512 VNNI take B as u8 (b ^ 0x80 = b + 128, in registers) and A as s8 in
// vpdpbusd, then subtract 128 * sum_k A[m, k] (per row of A and K block, computed once per call);
// AMX-INT8 runs tdpbssd on 16 x 16 tiles (see int8_gemm_amx).
//
// Layout of the non-AMX paths: B stays int8 and is read in place. Work is split over N (B rows) in
// chunks handed out dynamically to the threads (a thread that is descheduled on a busy machine does
// not hold up the others); each chunk walks K in blocks of kKC (1-2 rows of A: all of K at once) and inside a block runs an MR x NR
// register tile of int32 accumulators over all M.
// ------------------------------------------------------------------------------------------------
#define BNB_MS_TARGET_AVX512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define BNB_MS_TARGET_AVXVNNI __attribute__((target("avxvnni,avx2,fma,f16c")))
#ifndef BNB_MS_TARGET_AMX  // (a test harness may predefine it, to run the AMX driver on emulated tiles)
#define BNB_MS_TARGET_AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

constexpr int64_t kKC = 2048;  // K block (A tile 4 x 2048 x 2 bytes = 16 KiB stays in L1)
constexpr int64_t kNB = 96;    // most B rows per chunk (96 x 2048 = 192 KiB in L2)
// The automatic choice uses AMX from this many rows of A on (measured on a 16-core Sapphire Rapids,
// K = 4096, N = 4096/11008: AVX-512 VNNI is faster at M = 1, level at M = 4, AMX 1.1-1.4x at M = 8,
// 1.4-2.2x at M = 16 and 3-4x from M = 64 on).
constexpr int64_t kAmxMinRows = 8;

int max_threads() { return max_parallel_threads(); }

// Runs f(begin, end) over [0, n) in chunks of `chunk`, handed out to the threads one at a time.
template <class F>
void parallel_chunks(int64_t n, int64_t chunk, bool parallel, F &&f) {
  if (n <= 0) return;
  if (parallel) parallel_for_dynamic(n, chunk, f);
  else f(0, n);
}

// ---- scalar / AVX2 / AVX-512: int16 A x int8 B ---------------------------------------------------
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

// AVX2 MR x NR tile: per 16 k, NR sign-extending loads of B (vpmovsxbw), MR*NR vpmaddwd against int16 A.
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

// AVX-512 (no VNNI) tile, same structure with 32 k per step. (Its target has no avx512vnni, so the
// compiler cannot fuse vpmaddwd + vpaddd into a VNNI instruction on CPUs without it.)
template <int MR, int NR>
BNB_MS_TARGET_AVX512 void tile_avx512(const int16_t *A16, const int8_t *B, int32_t *C, int64_t K, int64_t ldc,
                                      int64_t k0, int64_t k1, int64_t m0, int64_t n0, bool first) {
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
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_add_epi32(acc[i][j], _mm512_madd_epi16(va, vb[j]));
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

// ---- VNNI: u8 (b + 128) x s8 A, minus 128 * sum_k A ------------------------------------------------
// vpdpbusd multiplies unsigned by signed bytes. B is fed as u8 b ^ 0x80 = b + 128 (one vpxor per B
// vector, in registers: the weight is read once, in place) and A as s8, so each lane accumulates
// sum_k (b + 128) * a = sum_k a * b + 128 * sum_k a; the row sums of A (M per K block, computed once per
// call) are subtracted at the end.
// sum_k a[k] for k in [0, n) (AVX2: sum of the bytes a ^ 0x80 = a + 128 with vpsadbw, minus 128 n).
BNB_MS_TARGET_AVX2 int32_t row_sum_i8(const int8_t *a, int64_t n) {
  const __m256i flip = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
  __m256i acc = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 32 <= n; k += 32)
    acc = _mm256_add_epi64(acc, _mm256_sad_epu8(_mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(a + k)), flip), zero));
  const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  int64_t s = _mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1) - 128 * k;
  for (; k < n; ++k) s += a[k];
  return (int32_t)s;
}

// Adds (first: stores) the exact block result: `raw` = sum_k (b[k] + 128) * a[k] mod 2^32 over the
// block, `asum` = sum_k a[k] over the same k. Unsigned arithmetic wraps mod 2^32 (so does vpdpbusd,
// the non-saturating form), and the true value fits int32, so the conversion back is exact.
BNB_MS_INLINE void vnni_store(int32_t *c, uint32_t raw, int32_t asum, bool first) {
  const uint32_t s = raw - 128u * (uint32_t)asum;
  *c = first ? (int32_t)s : (int32_t)((uint32_t)*c + s);
}

// acc += u8 x s8 quads (vpdpbusd).  As inline asm: with the intrinsic GCC copied every accumulator through the
// stack on each step of the register tiles (the 8 x 48 panel tile: 370 -> 940 GOP/s single-threaded).
BNB_MS_TARGET_AVX512VNNI BNB_MS_INLINE __m512i dpbusd_reg(__m512i acc, __m512i u8, __m512i s8) {
  __asm__("vpdpbusd %[s], %[u], %[a]" : [a] "+v"(acc) : [u] "v"(u8), [s] "v"(s8));
  return acc;
}

// asum: sums of A over this K block, indexed by the row of A.
template <int MR, int NR>
BNB_MS_TARGET_AVX512VNNI void tile_avx512vnni(const int8_t *A, const int8_t *B, const int32_t *asum, int32_t *C,
                                              int64_t K, int64_t ldc, int64_t k0, int64_t k1, int64_t m0, int64_t n0,
                                              bool first) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_si512();
  const int8_t *a[MR];
  const int8_t *b[NR];
  for (int i = 0; i < MR; ++i) a[i] = A + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) b[j] = B + (n0 + j) * K;
  int64_t k = k0;
  for (; k + 64 <= k1; k += 64) {
    __m512i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(b[j] + k)), flip);
    for (int i = 0; i < MR; ++i) {
      const __m512i va = _mm512_loadu_si512((const void *)(a[i] + k));
      for (int j = 0; j < NR; ++j) acc[i][j] = dpbusd_reg(acc[i][j], vb[j], va);
    }
  }
  if (k < k1) {  // 1..63 bytes left: masked loads (no fault past the end); A's masked lanes are 0
    const __mmask64 mk = (__mmask64)((1ull << (k1 - k)) - 1);
    __m512i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mk, b[j] + k), flip);
    for (int i = 0; i < MR; ++i) {
      const __m512i va = _mm512_maskz_loadu_epi8(mk, a[i] + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = dpbusd_reg(acc[i][j], vb[j], va);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j)
      vnni_store(C + (m0 + i) * ldc + n0 + j, (uint32_t)_mm512_reduce_add_epi32(acc[i][j]), asum[m0 + i], first);
}

template <int MR, int NR>
BNB_MS_TARGET_AVXVNNI void tile_avxvnni(const int8_t *A, const int8_t *B, const int32_t *asum, int32_t *C, int64_t K,
                                        int64_t ldc, int64_t k0, int64_t k1, int64_t m0, int64_t n0, bool first) {
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  __m256i acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_si256();
  const int8_t *a[MR];
  const int8_t *b[NR];
  for (int i = 0; i < MR; ++i) a[i] = A + (m0 + i) * K;
  for (int j = 0; j < NR; ++j) b[j] = B + (n0 + j) * K;
  int64_t k = k0;
  for (; k + 32 <= k1; k += 32) {
    __m256i vb[NR];
    for (int j = 0; j < NR; ++j) vb[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b[j] + k)), flip);
    for (int i = 0; i < MR; ++i) {
      const __m256i va = _mm256_loadu_si256((const __m256i *)(a[i] + k));
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_dpbusd_avx_epi32(acc[i][j], vb[j], va);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      uint32_t raw = (uint32_t)hsum256(acc[i][j]);
      for (int64_t kk = k; kk < k1; ++kk) raw += (uint32_t)((int32_t)(uint8_t)(b[j][kk] ^ 0x80) * (int32_t)a[i][kk]);
      vnni_store(C + (m0 + i) * ldc + n0 + j, raw, asum[m0 + i], first);
    }
}

// ---- path choice -----------------------------------------------------------------------------------
enum class GemmPath : int { scalar = 0, avx2, avx512, avxvnni, avx512vnni, amx, count };
constexpr const char *kGemmPathNames[] = {"scalar", "avx2", "avx512", "avxvnni", "avx512vnni", "amx"};

// What the hardware (and OS) allows, independent of BNB_MS_SIMD.
bool gemm_path_supported(GemmPath p) {
  const uint32_t f = cpu_features();
  constexpr uint32_t avx2 = CPU_AVX2 | CPU_FMA | CPU_F16C;
  constexpr uint32_t avx512 = avx2 | CPU_AVX512F | CPU_AVX512BW | CPU_AVX512VL | CPU_AVX512DQ;
  switch (p) {
    case GemmPath::scalar: return true;
    case GemmPath::avx2: return (f & avx2) == avx2;
    case GemmPath::avx512: return (f & avx512) == avx512;
    case GemmPath::avxvnni: return (f & avx2) == avx2 && (f & CPU_AVXVNNI);
    case GemmPath::avx512vnni: return (f & avx512) == avx512 && (f & CPU_AVX512VNNI);
    case GemmPath::amx: return (f & avx512) == avx512 && (f & CPU_AMX_INT8);
    default: return false;
  }
}

// Automatic order amx > avx512vnni > avx512 > avxvnni > avx2 > scalar, within the SIMD level
// (BNB_MS_SIMD lowers it: avx2 keeps the 256-bit paths, scalar the portable one).
GemmPath auto_gemm_path(bool allow_amx) {
  const SimdLevel l = simd_level();
  if (l >= SimdLevel::avx512) {
    if (allow_amx && gemm_path_supported(GemmPath::amx)) return GemmPath::amx;
    if (gemm_path_supported(GemmPath::avx512vnni)) return GemmPath::avx512vnni;
    return GemmPath::avx512;
  }
  if (l >= SimdLevel::avx2) return gemm_path_supported(GemmPath::avxvnni) ? GemmPath::avxvnni : GemmPath::avx2;
  return GemmPath::scalar;
}

struct GemmChoice {
  GemmPath path;
  bool forced;  // BNB_MS_INT8_GEMM named a path this CPU has: used for every M
};

GemmChoice gemm_choice() {
  static const GemmChoice choice = [] {
    const char *env = std::getenv("BNB_MS_INT8_GEMM");
    if (env)
      for (int i = 0; i < (int)GemmPath::count; ++i)
        if (!std::strcmp(env, kGemmPathNames[i]) && gemm_path_supported((GemmPath)i)) return GemmChoice{(GemmPath)i, true};
    return GemmChoice{auto_gemm_path(true), false};
  }();
  return choice;
}

GemmPath gemm_path_for_rows(int64_t M) {
  const GemmChoice c = gemm_choice();
  if (!c.forced && c.path == GemmPath::amx && M < kAmxMinRows) return auto_gemm_path(false);
  return c.path;
}

// ---- driver of the non-AMX paths --------------------------------------------------------------------
// Ap: int16 A (scalar/AVX2/AVX-512) or the int8 A itself (VNNI); sums: the VNNI paths' row sums of A
// for this K block (indexed by row), unused otherwise.
template <int MR, int NR>
void run_tile(GemmPath p, const void *Ap, const int8_t *B, const int32_t *sums, int32_t *C, int64_t K, int64_t ldc,
              int64_t k0, int64_t k1, int64_t m0, int64_t n0, bool first) {
  switch (p) {
    case GemmPath::avx512vnni:
      tile_avx512vnni<MR, NR>((const int8_t *)Ap, B, sums, C, K, ldc, k0, k1, m0, n0, first);
      break;
    case GemmPath::avxvnni: tile_avxvnni<MR, NR>((const int8_t *)Ap, B, sums, C, K, ldc, k0, k1, m0, n0, first); break;
    case GemmPath::avx512: tile_avx512<MR, NR>((const int16_t *)Ap, B, C, K, ldc, k0, k1, m0, n0, first); break;
    case GemmPath::avx2: tile_avx2<MR, NR>((const int16_t *)Ap, B, C, K, ldc, k0, k1, m0, n0, first); break;
    default: tile_generic((const int16_t *)Ap, B, C, K, ldc, k0, k1, m0, MR, n0, NR, first); break;
  }
}

// All rows of C against NR rows of B starting at n0 (B stays in L1 while A is walked).
template <int NR>
void run_col_tile(GemmPath p, const void *Ap, const int8_t *B, const int32_t *sums, int32_t *C, int64_t M, int64_t K,
                  int64_t ldc, int64_t k0, int64_t k1, int64_t n0, bool first) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) run_tile<4, NR>(p, Ap, B, sums, C, K, ldc, k0, k1, m, n0, first);
  for (; m < M; ++m) run_tile<1, NR>(p, Ap, B, sums, C, K, ldc, k0, k1, m, n0, first);
}

// Rows m0..m0+MR-1 of C against B rows [n0, n1) (A stays in L1 while B is walked).
template <int MR>
void run_row_tile(GemmPath p, const void *Ap, const int8_t *B, const int32_t *sums, int32_t *C, int64_t K,
                  int64_t ldc, int64_t k0, int64_t k1, int64_t m0, int64_t n0, int64_t n1, bool first) {
  int64_t n = n0;
  for (; n + 3 <= n1; n += 3) run_tile<MR, 3>(p, Ap, B, sums, C, K, ldc, k0, k1, m0, n, first);
  if (n1 - n == 2) run_tile<MR, 2>(p, Ap, B, sums, C, K, ldc, k0, k1, m0, n, first);
  else if (n1 - n == 1) run_tile<MR, 1>(p, Ap, B, sums, C, K, ldc, k0, k1, m0, n, first);
}

// ---- AVX2, many rows: packed 16-column panels of B, 6 x 16 register tile ---------------------------
// B (int8, [N, K]) is widened per call into panels of 16 columns: pair p of a panel holds, for column
// j, (B[n0 + j][2p], B[n0 + j][2p + 1]) as two int16, columns 0-7 in one ymm and 8-15 in the next.
// vpmaddwd of such a ymm with a broadcast pair of A (int16) adds two products per column, so the
// 6 x 16 tile is 12 named accumulators + 2 panel registers + 1 broadcast (no horizontal sums; the
// 4 x 3 dot-product tile above keeps 12 accumulators + 3 widened B + 1 A and GCC spills it).
// int32 sums are exact, so any tiling gives the bytes of every other path.
constexpr int kI8Panel = 16;
constexpr int kI8MR = 6;
constexpr int64_t kI8KC = 512;   // k per block (even): a packed panel is 16 KiB, a 6-row A tile 6 KiB
constexpr int64_t kI8NC = 96;    // columns packed at a time per thread (6 panels, 96 KiB in L2)
constexpr int64_t kI8PanelMinRows = 12;  // below this the dot-product tiles win (packing B costs more than it saves)

// 8 columns x 8 pairs (16 k from k) of B into the panel's half at d (pair pr at d + 32 pr): each
// column's 16 int8 widened to 8 int32-sized pairs, then an 8 x 8 transpose of those pairs.
BNB_MS_TARGET_AVX2 void pack_i8_8x16_avx2(const int8_t *b, int64_t K, int16_t *d) {
  __m256i r[8];
  for (int j = 0; j < 8; ++j) r[j] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + j * K)));
  __m256i t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_epi32(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_epi32(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    u[j] = _mm256_unpacklo_epi64(t[j], t[j + 2]);
    u[j + 1] = _mm256_unpackhi_epi64(t[j], t[j + 2]);
    u[j + 2] = _mm256_unpacklo_epi64(t[j + 1], t[j + 3]);
    u[j + 3] = _mm256_unpackhi_epi64(t[j + 1], t[j + 3]);
  }
  // u[q] (q < 4) holds pairs q (low lane) and q + 4 (high lane) of columns 0-3, u[q + 4] of columns 4-7
  for (int q = 0; q < 4; ++q) {
    _mm256_storeu_si256((__m256i *)(d + q * 32), _mm256_permute2x128_si256(u[q], u[q + 4], 0x20));
    _mm256_storeu_si256((__m256i *)(d + (q + 4) * 32), _mm256_permute2x128_si256(u[q], u[q + 4], 0x31));
  }
}

// Panel of columns [n0, n0 + nc) (nc <= 16), k in [k0, k0 + kc) (kc even; k >= K reads as 0).
void pack_i8_panel(const int8_t *B, int64_t K, int64_t n0, int nc, int64_t k0, int64_t kc, int16_t *P) {
  int64_t pr = 0;
  if (nc == kI8Panel)
    for (; k0 + 2 * pr + 16 <= std::min(K, k0 + kc); pr += 8) {
      pack_i8_8x16_avx2(B + n0 * K + k0 + 2 * pr, K, P + pr * 32);
      pack_i8_8x16_avx2(B + (n0 + 8) * K + k0 + 2 * pr, K, P + pr * 32 + 16);
    }
  for (; pr < kc / 2; ++pr) {
    int16_t *d = P + pr * 2 * kI8Panel;
    const int64_t k = k0 + 2 * pr;
    for (int j = 0; j < kI8Panel; ++j) {
      const int8_t *b = B + (n0 + j) * K;
      const bool col = j < nc;
      d[2 * j] = (int16_t)(col && k < K ? b[k] : 0);
      d[2 * j + 1] = (int16_t)(col && k + 1 < K ? b[k + 1] : 0);
    }
  }
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256i bcast_pair(const int16_t *a) {
  int32_t v;
  std::memcpy(&v, a, sizeof(v));
  return _mm256_set1_epi32(v);
}

// C rows [0, mr) x columns [0, nc) (+)= the 6-row A tile (int16, row stride lda, 6 readable rows of
// 2 * npairs values) times one packed panel.
BNB_MS_TARGET_AVX2 void tile_i8_panel_avx2(const int16_t *A, int64_t lda, int64_t mr, const int16_t *P,
                                           int64_t npairs, int nc, int32_t *C, int64_t ldc, bool first) {
  const int16_t *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda, *a4 = A + 4 * lda, *a5 = A + 5 * lda;
  __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00,
          c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  for (int64_t pr = 0; pr < npairs; ++pr) {
    const __m256i b0 = _mm256_loadu_si256((const __m256i *)(P + pr * 32)),
                  b1 = _mm256_loadu_si256((const __m256i *)(P + pr * 32 + 16));
    __m256i a = bcast_pair(a0 + 2 * pr);
    c00 = _mm256_add_epi32(c00, _mm256_madd_epi16(a, b0));
    c01 = _mm256_add_epi32(c01, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a1 + 2 * pr);
    c10 = _mm256_add_epi32(c10, _mm256_madd_epi16(a, b0));
    c11 = _mm256_add_epi32(c11, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a2 + 2 * pr);
    c20 = _mm256_add_epi32(c20, _mm256_madd_epi16(a, b0));
    c21 = _mm256_add_epi32(c21, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a3 + 2 * pr);
    c30 = _mm256_add_epi32(c30, _mm256_madd_epi16(a, b0));
    c31 = _mm256_add_epi32(c31, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a4 + 2 * pr);
    c40 = _mm256_add_epi32(c40, _mm256_madd_epi16(a, b0));
    c41 = _mm256_add_epi32(c41, _mm256_madd_epi16(a, b1));
    a = bcast_pair(a5 + 2 * pr);
    c50 = _mm256_add_epi32(c50, _mm256_madd_epi16(a, b0));
    c51 = _mm256_add_epi32(c51, _mm256_madd_epi16(a, b1));
  }
  alignas(32) int32_t acc[kI8MR][kI8Panel];
  _mm256_store_si256((__m256i *)acc[0], c00);
  _mm256_store_si256((__m256i *)(acc[0] + 8), c01);
  _mm256_store_si256((__m256i *)acc[1], c10);
  _mm256_store_si256((__m256i *)(acc[1] + 8), c11);
  _mm256_store_si256((__m256i *)acc[2], c20);
  _mm256_store_si256((__m256i *)(acc[2] + 8), c21);
  _mm256_store_si256((__m256i *)acc[3], c30);
  _mm256_store_si256((__m256i *)(acc[3] + 8), c31);
  _mm256_store_si256((__m256i *)acc[4], c40);
  _mm256_store_si256((__m256i *)(acc[4] + 8), c41);
  _mm256_store_si256((__m256i *)acc[5], c50);
  _mm256_store_si256((__m256i *)(acc[5] + 8), c51);
  for (int64_t i = 0; i < mr; ++i) {
    int32_t *c = C + i * ldc;
    if (first) std::memcpy(c, acc[i], sizeof(int32_t) * (size_t)nc);
    else
      for (int j = 0; j < nc; ++j) c[j] += acc[i][j];
  }
}

void int8_gemm_panel_avx2(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  // A widened to int16 with an even row stride and whole 6-row tiles (zero padding).
  const int64_t lda = K + (K & 1), Mp = (M + kI8MR - 1) / kI8MR * kI8MR;
  std::vector<int16_t> a16((size_t)(Mp * lda), 0);
  parallel_for(M, std::max<int64_t>(1, 65536 / lda), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t k = 0; k < K; ++k) a16[(size_t)(r * lda + k)] = A[r * K + k];
  });
  const int64_t nkb = (lda + kI8KC - 1) / kI8KC;
  int64_t chunk = N / (4 * (int64_t)max_threads());  // ~4 chunks per thread, whole panels, <= kI8NC
  chunk = std::min<int64_t>(kI8NC, std::max<int64_t>(kI8Panel, (chunk + kI8Panel - 1) / kI8Panel * kI8Panel));
  parallel_chunks(N, chunk, true, [&](int64_t nc0, int64_t nc1) {
    static thread_local std::vector<int16_t> packed;
    for (int64_t nb = nc0; nb < nc1; nb += kI8NC) {
      const int64_t ne = std::min(nb + kI8NC, nc1), npan = (ne - nb + kI8Panel - 1) / kI8Panel;
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t k0 = kb * kI8KC, kc = std::min(kI8KC, lda - k0), pstride = kc * kI8Panel;
        packed.resize((size_t)(npan * pstride));
        for (int64_t q = 0; q < npan; ++q) {
          const int64_t n0 = nb + q * kI8Panel;
          pack_i8_panel(B, K, n0, (int)std::min<int64_t>(kI8Panel, ne - n0), k0, kc, packed.data() + q * pstride);
        }
        for (int64_t m = 0; m < M; m += kI8MR) {
          const int64_t mr = std::min<int64_t>(kI8MR, M - m);
          for (int64_t q = 0; q < npan; ++q) {
            const int64_t n0 = nb + q * kI8Panel;
            tile_i8_panel_avx2(a16.data() + m * lda + k0, lda, mr, packed.data() + q * pstride, kc / 2,
                               (int)std::min<int64_t>(kI8Panel, ne - n0), C + m * N + n0, N, kb == 0);
          }
        }
      }
    }
  });
}

// ---- AVX-512 VNNI, many rows: packed 16-column panels of u8 quads, 8 x 48 register tile ---------------
// B (int8 [N, K]) is packed per call into panels of 16 columns: quad p of a panel holds, for column j, the 4
// bytes B[n0 + j][4p .. 4p + 3] ^ 0x80 (= b + 128 as u8), one zmm per quad.  vpdpbusd of it with a
// broadcast quad of A (s8) adds 4 products per column: 24 accumulators for 8 rows x 3 panels, 3 panel
// loads and 8 broadcasts per quad, no horizontal sums (the dot-product tiles above reduce every output).
// raw = sum_k (b + 128) a wraps mod 2^32 like vpdpbusd; C = raw - 128 * sum_k a is exact (it fits int32),
// so the bytes are every other path's.  A is copied zero-padded to whole quads and 8-row tiles.
constexpr int kV8MR = 8, kV8NP = 3;
constexpr int64_t kV8KC = 1024;  // k per block (a multiple of 4): a panel is 16 KiB, the 8-row A tile 8 KiB
constexpr int64_t kV8NC = 192;   // columns packed at a time per thread (12 panels, 192 KiB in L2)
constexpr int64_t kV8PanelMinRows = 17;  // up to 16 rows the dot-product tiles win (packing B costs more)

// 16 quads (64 bytes from k) of 16 columns (rows of B, K apart) into quads 0..15 of a panel at P, ^ 0x80:
// a 16 x 16 dword transpose (32-bit and 64-bit unpacks within 128-bit lanes, then two lane shuffles).
BNB_MS_TARGET_AVX512 void pack_u8q_16x16_avx512(const int8_t *b, int64_t K, uint32_t *P) {
  const __m512i flip = _mm512_set1_epi8((char)0x80);
  __m512i r[16], t[16], u[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(b + j * K)), flip);
  for (int j = 0; j < 16; j += 2) {
    t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);
    t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
  }
  for (int j = 0; j < 16; j += 4) {  // u[j + c] lane L: quad 4L + c of rows j .. j + 3
    u[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
    u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
    u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
    u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i lo0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), lo1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i hi0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE), hi1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    _mm512_storeu_si512((void *)(P + (0 + c) * kI8Panel), _mm512_shuffle_i32x4(lo0, lo1, 0x88));
    _mm512_storeu_si512((void *)(P + (4 + c) * kI8Panel), _mm512_shuffle_i32x4(lo0, lo1, 0xDD));
    _mm512_storeu_si512((void *)(P + (8 + c) * kI8Panel), _mm512_shuffle_i32x4(hi0, hi1, 0x88));
    _mm512_storeu_si512((void *)(P + (12 + c) * kI8Panel), _mm512_shuffle_i32x4(hi0, hi1, 0xDD));
  }
}

// Panel of columns [n0, n0 + nc) (nc <= 16), quads [k0 / 4, (k0 + kc) / 4) (k >= K reads as b = 0).
void pack_u8q_panel(const int8_t *B, int64_t K, int64_t n0, int nc, int64_t k0, int64_t kc, uint32_t *P) {
  int64_t p0 = 0;
  if (nc == kI8Panel)  // whole 64-byte runs inside every row: the SIMD transpose
    for (; k0 + 4 * p0 + 64 <= std::min(K, k0 + kc); p0 += 16)
      pack_u8q_16x16_avx512(B + n0 * K + k0 + 4 * p0, K, P + p0 * kI8Panel);
  const int64_t nq = kc / 4;
  for (int j = 0; j < kI8Panel; ++j) {
    const int8_t *b = B + (n0 + j) * K;
    for (int64_t p = p0; p < nq; ++p) {
      const int64_t k = k0 + 4 * p;
      uint32_t v = 0x80808080u;  // b = 0
      if (j < nc) {
        if (k + 4 <= K) {
          std::memcpy(&v, b + k, 4);
          v ^= 0x80808080u;
        } else {
          uint8_t t[4] = {0x80, 0x80, 0x80, 0x80};
          for (int64_t e = 0; e < 4 && k + e < K; ++e) t[e] = (uint8_t)(b[k + e] ^ 0x80);
          std::memcpy(&v, t, 4);
        }
      }
      P[p * kI8Panel + j] = v;
    }
  }
}

// C rows [0, mr) x columns of NP panels (the last one ncl wide) (+)= the 8-row A tile (s8, row stride lda,
// nq quads) times the panels; corr[i] = -128 * sum_k A[i][k] over all K, added with the first block.
template <int NP>
BNB_MS_TARGET_AVX512VNNI void tile_u8q_avx512vnni(const int8_t *A, int64_t lda, int64_t mr, const uint32_t *P,
                                                  int64_t pstride, int64_t nq, int ncl, int32_t *C, int64_t ldc,
                                                  const int32_t *corr, bool first) {
  __m512i acc[kV8MR][NP];
#pragma GCC unroll 8
  for (int i = 0; i < kV8MR; ++i)
#pragma GCC unroll 3
    for (int q = 0; q < NP; ++q) acc[i][q] = _mm512_setzero_si512();
  for (int64_t p = 0; p < nq; ++p) {
    __m512i b[NP];
#pragma GCC unroll 3
    for (int q = 0; q < NP; ++q) b[q] = _mm512_loadu_si512((const void *)(P + q * pstride + p * kI8Panel));
#pragma GCC unroll 8
    for (int i = 0; i < kV8MR; ++i) {
      int32_t v;
      std::memcpy(&v, A + i * lda + 4 * p, 4);
      const __m512i a = _mm512_set1_epi32(v);
#pragma GCC unroll 3
      for (int q = 0; q < NP; ++q) acc[i][q] = dpbusd_reg(acc[i][q], b[q], a);
    }
  }
  alignas(64) uint32_t row[kI8Panel];
  for (int64_t i = 0; i < mr; ++i)
    for (int q = 0; q < NP; ++q) {
      _mm512_store_si512(row, acc[i][q]);
      int32_t *c = C + i * ldc + q * kI8Panel;
      const int nc = q == NP - 1 ? ncl : kI8Panel;
      if (first)
        for (int j = 0; j < nc; ++j) c[j] = (int32_t)(row[j] + (uint32_t)corr[i]);
      else
        for (int j = 0; j < nc; ++j) c[j] = (int32_t)((uint32_t)c[j] + row[j]);
    }
}

void int8_gemm_panel_avx512vnni(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  const int64_t lda = (K + 3) / 4 * 4, Mp = (M + kV8MR - 1) / kV8MR * kV8MR;
  std::vector<int8_t> a8((size_t)(Mp * lda), 0);
  std::vector<int32_t> corr((size_t)Mp, 0);
  parallel_for(M, std::max<int64_t>(1, 65536 / lda), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      std::memcpy(a8.data() + r * lda, A + r * K, (size_t)K);
      corr[(size_t)r] = (int32_t)(0u - 128u * (uint32_t)row_sum_i8(A + r * K, K));
    }
  });
  const int64_t nkb = (lda + kV8KC - 1) / kV8KC;
  int64_t chunk = N / (4 * (int64_t)max_threads());  // ~4 chunks per thread, whole panels, <= kV8NC
  chunk = std::min<int64_t>(kV8NC, std::max<int64_t>(kI8Panel, (chunk + kI8Panel - 1) / kI8Panel * kI8Panel));
  const int8_t *ap = a8.data();
  const int32_t *cp = corr.data();
  parallel_chunks(N, chunk, true, [&](int64_t nc0, int64_t nc1) {
    static thread_local std::vector<uint32_t> packed;
    for (int64_t nb = nc0; nb < nc1; nb += kV8NC) {
      const int64_t ne = std::min(nb + kV8NC, nc1), npan = (ne - nb + kI8Panel - 1) / kI8Panel;
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t k0 = kb * kV8KC, kc = std::min(kV8KC, lda - k0), nq = kc / 4, pstride = nq * kI8Panel;
        packed.resize((size_t)(npan * pstride));
        for (int64_t q = 0; q < npan; ++q) {
          const int64_t n0 = nb + q * kI8Panel;
          pack_u8q_panel(B, K, n0, (int)std::min<int64_t>(kI8Panel, ne - n0), k0, kc, packed.data() + q * pstride);
        }
        for (int64_t m = 0; m < M; m += kV8MR) {
          const int64_t mr = std::min<int64_t>(kV8MR, M - m);
          for (int64_t q = 0; q < npan; q += kV8NP) {
            const int np = (int)std::min<int64_t>(kV8NP, npan - q);
            const int64_t n0 = nb + q * kI8Panel;
            const int ncl = (int)std::min<int64_t>(kI8Panel, ne - (n0 + (np - 1) * kI8Panel));
            const int8_t *a = ap + m * lda + k0;
            const uint32_t *pp = packed.data() + q * pstride;
            int32_t *c = C + m * N + n0;
            if (np == 3) tile_u8q_avx512vnni<3>(a, lda, mr, pp, pstride, nq, ncl, c, N, cp + m, kb == 0);
            else if (np == 2) tile_u8q_avx512vnni<2>(a, lda, mr, pp, pstride, nq, ncl, c, N, cp + m, kb == 0);
            else tile_u8q_avx512vnni<1>(a, lda, mr, pp, pstride, nq, ncl, c, N, cp + m, kb == 0);
          }
        }
      }
    }
  });
}

void int8_gemm_simd(GemmPath p, const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  if (p == GemmPath::avx2 && M >= kI8PanelMinRows) return int8_gemm_panel_avx2(A, B, C, M, N, K);
  if (p == GemmPath::avx512vnni && M >= kV8PanelMinRows) return int8_gemm_panel_avx512vnni(A, B, C, M, N, K);
  const bool vnni = p == GemmPath::avx512vnni || p == GemmPath::avxvnni;
  // K block: kKC keeps an A tile in L1 for many rows; one or two rows of A fit in L1 whole, so each B row is then
  // read as one stream (K-blocking it cut every row into short streams that the prefetchers restart on)
  const int64_t kc = M <= 2 ? K : kKC;
  const int64_t nkb = (K + kc - 1) / kc;
  std::vector<int16_t> a16;
  std::vector<int32_t> asum;
  const int64_t arows = std::max<int64_t>(1, 65536 / K);
  if (vnni) {  // A is used as is; its row sums per K block
    asum.resize((size_t)(nkb * M));
    parallel_for(M, arows, [&](int64_t r0, int64_t r1) {
      for (int64_t kb = 0; kb < nkb; ++kb)
        for (int64_t r = r0; r < r1; ++r)
          asum[(size_t)(kb * M + r)] = row_sum_i8(A + r * K + kb * kc, std::min(kc, K - kb * kc));
    });
  } else {
    a16.resize((size_t)(M * K));
    parallel_for(M, arows, [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0 * K; i < r1 * K; ++i) a16[(size_t)i] = A[i];
    });
  }
  const void *Ap = vnni ? (const void *)A : (const void *)a16.data();
  // Loop order: few rows of A -> for each 3-row tile of B, all of A (the B tile is read from memory
  // once per K block); many rows -> for each 4-row tile of A, the chunk's B rows (L2).
  const bool n_outer = M <= 16;
  // chunks of B rows: about 8 per thread, a multiple of the 3-row tile, at most kNB rows
  int64_t chunk = N / (8 * (int64_t)max_threads());
  chunk = std::min<int64_t>(kNB, std::max<int64_t>(3, (chunk + 2) / 3 * 3));
  const bool par = (double)M * (double)N * (double)K >= (double)(1 << 20);  // (~35 us on one AVX2 core)
  parallel_chunks(N, chunk, par, [&](int64_t nc0, int64_t nc1) {
    for (int64_t nb = nc0; nb < nc1; nb += kNB) {
      const int64_t ne = std::min(nb + kNB, nc1);
      for (int64_t kb = 0; kb < nkb; ++kb) {
        const int64_t k0 = kb * kc, k1 = std::min(k0 + kc, K);
        const bool first = kb == 0;
        const int32_t *sums = vnni ? asum.data() + kb * M : nullptr;
        if (n_outer) {
          int64_t n = nb;
          // more weight rows per tile where the tile's registers allow: more memory streams in flight (M = 1,
          // 4096 x 11008: 1.86 -> 1.28 ms single-threaded)
          if (M <= 2)
            for (; n + 12 <= ne; n += 12) run_col_tile<12>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
          else
            for (; n + 6 <= ne; n += 6) run_col_tile<6>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
          for (; n + 3 <= ne; n += 3) run_col_tile<3>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
          if (ne - n == 2) run_col_tile<2>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
          else if (ne - n == 1) run_col_tile<1>(p, Ap, B, sums, C, M, K, N, k0, k1, n, first);
        } else {
          int64_t m = 0;
          for (; m + 4 <= M; m += 4) run_row_tile<4>(p, Ap, B, sums, C, K, N, k0, k1, m, nb, ne, first);
          for (; m < M; ++m) run_row_tile<1>(p, Ap, B, sums, C, K, N, k0, k1, m, nb, ne, first);
        }
      }
    }
  });
}

// ---- AMX-INT8 ---------------------------------------------------------------------------------------
// Computes C^T tile by tile: tdpbssd(dst, src1, src2) adds src1[r][k] * src2[k/4][4c + k%4] over the
// 64 k of one step into dst[r][c]. src1 = 16 rows of B straight from memory (row stride K: the weight
// is never repacked), src2 = A packed once per call into that 4-byte-interleaved layout, so
// dst[n][m] = sum_k B[n][k] * A[m][k]; the 16 x 16 int32 result tile is transposed into C on the way out.
// Tails: A is packed zero-padded to whole 16-row, 64-k tiles; the last partial k-step of a full B tile
// comes from a zero-padded 16 x 64 copy (never a read past a row that might be the buffer's end) and
// a last B tile of fewer than 16 rows from a zero-padded 16 x Kpad copy; M/N tails are cut when storing.
// Each thread configures 8 tiles of 16 rows x 64 bytes (ldtilecfg) and releases them when done.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "tile configuration is 64 bytes");

struct BTileSrc {
  const int8_t *p;     // k-step ks at p + 64 * ks, rows `stride` bytes apart
  int64_t stride;
  const int8_t *tail;  // if set: the last k-step comes from here instead (rows 64 bytes apart)
};

BNB_MS_TARGET_AMX void amx_configure() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // ldtilecfg's intrinsic names only the first bytes of cfg as its memory operand: make sure every
  // byte written above is in memory before it runs.
  __asm__ volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

BNB_MS_TARGET_AMX void amx_release() { _tile_release(); }

// Tiles: C^T in tmm0 (n-tile 0, m-tile 0), tmm1 (0, 1), tmm2 (1, 0), tmm3 (1, 1); B in tmm4/tmm5;
// packed A in tmm6/tmm7. cs receives the result tiles, 256 int32 each, in that order. (Software
// prefetch of the strided B rows and copying them to a contiguous buffer first were both measured:
// neither was faster on Sapphire Rapids.)
BNB_MS_TARGET_AMX void amx_block(const BTileSrc &b0, const BTileSrc &b1, bool two_n, const int8_t *pa0,
                                 const int8_t *pa1, bool two_m, int64_t Ks, int32_t *cs) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t ks = 0; ks < Ks; ++ks) {
    const bool last = ks + 1 == Ks;
    const int8_t *p0 = (last && b0.tail) ? b0.tail : b0.p + 64 * ks;
    const int64_t s0 = (last && b0.tail) ? 64 : b0.stride;
    _tile_loadd(4, p0, s0);
    _tile_loadd(6, pa0 + 1024 * ks, 64);
    _tile_dpbssd(0, 4, 6);
    if (two_m) {
      _tile_loadd(7, pa1 + 1024 * ks, 64);
      _tile_dpbssd(1, 4, 7);
    }
    if (two_n) {
      const int8_t *p1 = (last && b1.tail) ? b1.tail : b1.p + 64 * ks;
      const int64_t s1 = (last && b1.tail) ? 64 : b1.stride;
      _tile_loadd(5, p1, s1);
      _tile_dpbssd(2, 5, 6);
      if (two_m) _tile_dpbssd(3, 5, 7);
    }
  }
  _tile_stored(0, cs, 64);
  if (two_m) _tile_stored(1, cs + 256, 64);
  if (two_n) {
    _tile_stored(2, cs + 512, 64);
    if (two_m) _tile_stored(3, cs + 768, 64);
  }
}

void int8_gemm_amx(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  const int64_t Ks = (K + 63) / 64, Kpad = 64 * Ks, Mt = (M + 15) / 16, Nt = (N + 15) / 16;
  const int64_t ktail = K % 64;
  // Packed A: tile (mt, ks) is 1024 bytes at (mt * Ks + ks) * 1024; byte r * 64 + 4 m + q holds
  // A[16 mt + m][64 ks + 4 r + q] (zero outside A).
  std::vector<int8_t> P((size_t)(Mt * Ks * 1024), 0);
  parallel_for(Mt, std::max<int64_t>(1, 4096 / Kpad), [&](int64_t t0, int64_t t1) {
    for (int64_t mt = t0; mt < t1; ++mt)
      for (int64_t m = 0; m < 16 && mt * 16 + m < M; ++m) {
        const int8_t *a = A + (mt * 16 + m) * K;
        int8_t *dst = P.data() + mt * Ks * 1024 + 4 * m;
        for (int64_t k = 0; k < K; ++k) dst[(k >> 6) * 1024 + ((k & 63) >> 2) * 64 + (k & 3)] = a[k];
      }
  });
  const int64_t Ng = (Nt + 1) / 2, Mg = (Mt + 1) / 2;  // groups of two 16-row tiles
  // m-groups per pass: their packed A (2 x Ks KiB each) stays within about 1 MiB of L2
  const int64_t mg_block = std::max<int64_t>(1, 512 / Ks);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(8, Ng / (4 * (int64_t)max_threads())));
  const bool par = (double)M * (double)N * (double)K >= (double)(1 << 20);
  parallel_chunks(Ng, chunk, par, [&](int64_t g0, int64_t g1) {
    const int64_t t_begin = 2 * g0, t_end = std::min(2 * g1, Nt);
    std::vector<BTileSrc> src((size_t)(t_end - t_begin));
    std::vector<int8_t> kt(ktail ? (size_t)(t_end - t_begin) * 1024 : 0, 0), nt;
    for (int64_t t = t_begin; t < t_end; ++t) {
      const int64_t n0 = 16 * t, rows = std::min<int64_t>(16, N - n0);
      BTileSrc &s = src[(size_t)(t - t_begin)];
      if (rows < 16) {  // last tile of B: zero-padded 16 x Kpad copy
        nt.assign((size_t)(16 * Kpad), 0);
        for (int64_t r = 0; r < rows; ++r) std::memcpy(nt.data() + r * Kpad, B + (n0 + r) * K, (size_t)K);
        s = BTileSrc{nt.data(), Kpad, nullptr};
      } else {
        s = BTileSrc{B + n0 * K, K, nullptr};
        if (ktail) {  // last partial k-step: zero-padded 16 x 64 copy
          int8_t *d = kt.data() + (t - t_begin) * 1024;
          for (int64_t r = 0; r < 16; ++r) std::memcpy(d + r * 64, B + (n0 + r) * K + (Ks - 1) * 64, (size_t)ktail);
          s.tail = d;
        }
      }
    }
    alignas(64) int32_t cs[4 * 256];
    amx_configure();
    for (int64_t mb = 0; mb < Mg; mb += mg_block) {
      const int64_t me = std::min(Mg, mb + mg_block);
      for (int64_t t = t_begin; t < t_end; t += 2) {
        const bool two_n = t + 1 < t_end;
        const BTileSrc &b0 = src[(size_t)(t - t_begin)];
        const BTileSrc &b1 = two_n ? src[(size_t)(t + 1 - t_begin)] : b0;
        for (int64_t mg = mb; mg < me; ++mg) {
          const int64_t u = 2 * mg;
          const bool two_m = u + 1 < Mt;
          const int8_t *pa0 = P.data() + u * Ks * 1024;
          amx_block(b0, b1, two_n, pa0, two_m ? pa0 + Ks * 1024 : pa0, two_m, Ks, cs);
          for (int ni = 0; ni < (two_n ? 2 : 1); ++ni)
            for (int mi = 0; mi < (two_m ? 2 : 1); ++mi) {
              const int32_t *ct = cs + (2 * ni + mi) * 256;
              const int64_t nbase = 16 * (t + ni), mbase = 16 * (u + mi);
              const int64_t nn = std::min<int64_t>(16, N - nbase), mm = std::min<int64_t>(16, M - mbase);
              for (int64_t m = 0; m < mm; ++m) {
                int32_t *crow = C + (mbase + m) * N + nbase;
                for (int64_t n = 0; n < nn; ++n) crow[n] = ct[n * 16 + m];
              }
            }
        }
      }
    }
    amx_release();
  });
}

void int8_gemm(const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  const GemmPath p = gemm_path_for_rows(M);
  if (p == GemmPath::amx) int8_gemm_amx(A, B, C, M, N, K);
  else int8_gemm_simd(p, A, B, C, M, N, K);
}

// ---- entry point: checks in checks/int8.h (shared with the CUDA library) -------------------------
int igemm_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Igemm a;
  if (int s = checks::igemm(c, &a)) return s;
  // A failure on well-formed input (the scratch of the packed operands cannot be allocated, or one forced by
  // bnb_ms_force_error("igemm", code)) goes to has_error when the call has it, else to the status.
  const auto report = [&a](int code) {
    if (!a.has_error) return code;
    *a.has_error = code;
    return (int)OK;
  };
  if (a.has_error) *a.has_error = 0;
  if (int f = forced_error("igemm")) return report(f);
  if (a.empty) return OK;
  try {
    int8_gemm(a.A, a.B, a.out, a.M, a.N, a.K);
  } catch (const std::bad_alloc &) {
    return report(E_NOMEM);
  }
  return OK;
}


// ------------------------------------------------------------------------------------------------
// mm dequant
// ------------------------------------------------------------------------------------------------
constexpr float kMmDequant = 6.200124e-05f;

template <class T, class BT>
void mmdq_row_generic(const int32_t *a, float rv, const float *cs, const BT *bias, T *o, int64_t j0, int64_t cols) {
  for (int64_t j = j0; j < cols; ++j) {
    float v = (float)a[j] * (rv * cs[j]);
    v = v * kMmDequant;
    if (bias) v = v + to_f32<BT>(bias[j]);
    o[j] = from_f32<T>(v);
  }
}

// Same fp32 operations in the same order per element (no FMA), then the same output rounding.
template <class T, class BT>
BNB_MS_TARGET_AVX2 void mmdq_row_avx2(const int32_t *a, float rv, const float *cs, const BT *bias, T *o, int64_t cols) {
  const __m256 vrv = _mm256_set1_ps(rv), vk = _mm256_set1_ps(kMmDequant);
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    const __m256 rc = _mm256_mul_ps(vrv, _mm256_loadu_ps(cs + j));
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(a + j))), rc);
    v = _mm256_mul_ps(v, vk);
    if (bias) v = _mm256_add_ps(v, load8<BT>(bias + j));
    store8<T>(o + j, v);
  }
  mmdq_row_generic<T, BT>(a, rv, cs, bias, o, j, cols);
}

template <class T, class BT>
BNB_MS_TARGET_AVX512 void mmdq_row_avx512(const int32_t *a, float rv, const float *cs, const BT *bias, T *o,
                                          int64_t cols) {
  const __m512 vrv = _mm512_set1_ps(rv), vk = _mm512_set1_ps(kMmDequant);
  int64_t j = 0;
  for (; j + 16 <= cols; j += 16) {
    const __m512 rc = _mm512_mul_ps(vrv, _mm512_loadu_ps(cs + j));
    __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(a + j))), rc);
    v = _mm512_mul_ps(v, vk);
    if (bias) v = _mm512_add_ps(v, load16<BT>(bias + j));
    store16<T>(o + j, v);
  }
  mmdq_row_generic<T, BT>(a, rv, cs, bias, o, j, cols);
}

template <class T, class BT>
void mm_dequant(const int32_t *A, const float *rs, const float *cs, const BT *bias, T *out, int64_t rows,
                int64_t cols) {
  const SimdLevel lvl = simd_level();
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t *a = A + r * cols;
      T *o = out + r * cols;
      if (lvl >= SimdLevel::avx512) mmdq_row_avx512<T, BT>(a, rs[r], cs, bias, o, cols);
      else if (lvl >= SimdLevel::avx2) mmdq_row_avx2<T, BT>(a, rs[r], cs, bias, o, cols);
      else mmdq_row_generic<T, BT>(a, rs[r], cs, bias, o, 0, cols);
    }
  });
}

// ---- entry point: checks in checks/int8.h (shared with the CUDA library) -------------------------
template <class T>
int mm_dequant_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::MmDequant<T> a;
  if (int s = checks::mm_dequant<T>(c, &a)) return s;
  if (a.empty) return OK;
  const int32_t *A = a.A;
  const float *rs = a.row_stats, *cs = a.col_stats;
  const int64_t rows = a.rows, cols = a.cols;
  if (a.bias_dt == DType::none) mm_dequant<T, float>(A, rs, cs, nullptr, a.out, rows, cols);
  else if (a.bias_dt == DType::f32) mm_dequant<T, float>(A, rs, cs, static_cast<const float *>(a.bias), a.out, rows, cols);
  else if (a.bias_dt == DType::f16) mm_dequant<T, fp16_t>(A, rs, cs, static_cast<const fp16_t *>(a.bias), a.out, rows, cols);
  else mm_dequant<T, bf16_t>(A, rs, cs, static_cast<const bf16_t *>(a.bias), a.out, rows, cols);
  return OK;
}

// ------------------------------------------------------------------------------------------------
// LLM.int8() outlier columns (mixed mm dequant) and the fused linear forward
// ------------------------------------------------------------------------------------------------
// Mixed mm dequant (cint8_mixed_mm_dequant_<T>; the outlier part of functional.int8_mixed_scaled_mm):
//   J = the flagged columns, ascending.  J empty: out = mm dequant of C straight into T (the bytes of
//   cdequant_mm_int32_<T>).  Otherwise, in fp32:
//     d[r, n]   = mm dequant of C in fp32 (+ bias)                       (mmdq_row_*<float>)
//     w[n, j]   = (float(CB[n, j]) * col_stats[n]) * 7.874015718698502e-3f  (int8_vectorwise_dequant)
//     J is cut into blocks of mixed_block(|J|) columns (192; |J|/2 rounded up for 192 < |J| < 384); per block
//     acc = fma(A[r, j], w[n, j], acc) over its columns, ascending, from acc = 0, then d[r, n] = d[r, n] + acc
//     out[r, n] = T(d[r, n])
//   A NaN fma result takes the NaN of acc + A * w computed in two steps (x86 operand order), so the NaN bits
//   do not depend on which fma form the compiler picks.  This is upstream's `output.addmm(subA, subB)` for
//   fp32 bit for bit (torch 2.13's fp32 GEMM measured on an AVX2 host, from 5 rows; 1-4 rows take another
//   kernel there, which differs in the last bit; odd |J| in 193..383 splits differently there).
//   The SIMD variants run 8/16 columns of the same expression per step, so every level gives the same bytes,
//   and the fused forward and the unfused functional path share this code.
// Fused linear (cint8_linear_<T>): the unfused forward of MatMul8bitLt in one call, on per-thread scratch:
//   fp32 A is rounded to fp16 first (as `A.to(float16)` upstream, and _as_quant_input here), then
//   vector_quant (with outlier column flags for threshold > 0) -> int8_gemm (the path of
//   gemm_path_for_rows(rows)) -> for threshold > 0 the mixed mm dequant above, else the mm dequant
//   straight into T.  col_flags are those of cint8_vector_quant on the quantized input.
//   The same kernel serves the fused decoder layers (decoder.cpp) through int8_linear_f32 (linear_kernels.h).
constexpr float kInt8Dequant = 7.874015718698502e-3f;  // float32(1 / 127), functional.INT8_DEQUANT_SCALE

// Scratch of the fused entry points: per calling thread, reused across calls, grown on demand and
// released after a call that needed more than kScratchKeepBytes (one long prefill does not pin it).
constexpr size_t kScratchKeepBytes = size_t(64) << 20;

struct Int8Scratch {
  std::vector<fp16_t> a16;      // fp32 activations rounded to fp16 [rows, K]
  std::vector<int8_t> ca;       // int8 codes of A [rows, K]
  std::vector<float> sca;       // row stats [rows]
  std::vector<int32_t> c;       // int32 GEMM result [rows, N]
  std::vector<int64_t> cols;    // outlier columns [<= K]
  std::vector<float> wt;        // dequantized weight columns, transposed [nJ, N]
  std::vector<float> av;        // outlier activations in fp32 [rows, nJ]
  size_t bytes() const {
    return a16.capacity() * sizeof(fp16_t) + ca.capacity() + sca.capacity() * 4 + c.capacity() * 4 +
           cols.capacity() * 8 + wt.capacity() * 4 + av.capacity() * 4;
  }
  void trim() {
    if (bytes() > kScratchKeepBytes) *this = Int8Scratch();
  }
};

Int8Scratch &int8_scratch() {
  static thread_local Int8Scratch s;
  return s;
}

template <class X>
X *grow(std::vector<X> &v, int64_t n) {
  if (v.size() < (size_t)n) v.resize((size_t)n);
  return v.data();
}

// Outlier columns per block of the outlier sum (see "mixed mm dequant" above; _reference.mixed_block_size).
constexpr int64_t kMixedBlock = 192;
inline int64_t mixed_block(int64_t nJ) { return (nJ > kMixedBlock && nJ < 2 * kMixedBlock) ? (nJ + 1) / 2 : kMixedBlock; }

// fma(a, b, c) with a NaN result replaced by the NaN of c + a * b in two steps (SSE: the first NaN operand).
inline float fma_x86(float a, float b, float c) {
  const float r = std::fma(a, b, c);
  if (r == r) return r;
  const float p = a * b;
  return c + p;
}

// d + outlier sum for columns [j0, n) of one row: d, o and the columns of wt (row stride ldw) start at
// the row's first column; av holds the row's nJ outlier activations.
template <class T>
void mixed_cols_generic(const float *d, const float *av, const float *wt, int64_t ldw, int64_t nJ, T *o, int64_t j0,
                        int64_t n) {
  const int64_t bs = mixed_block(nJ);
  for (int64_t j = j0; j < n; ++j) {
    float v = d[j];
    for (int64_t t0 = 0; t0 < nJ; t0 += bs) {
      const int64_t t1 = std::min(nJ, t0 + bs);
      float acc = 0.0f;
      for (int64_t t = t0; t < t1; ++t) acc = fma_x86(av[t], wt[t * ldw + j], acc);
      v = v + acc;
    }
    o[j] = from_f32<T>(v);
  }
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 fma_x86_8(__m256 a, __m256 b, __m256 c) {
  const __m256 r = _mm256_fmadd_ps(a, b, c);
  const __m256 nan = _mm256_cmp_ps(r, r, _CMP_UNORD_Q);
  if (_mm256_testz_ps(nan, nan)) return r;
  return _mm256_blendv_ps(r, _mm256_add_ps(c, _mm256_mul_ps(a, b)), nan);
}

template <class T>
BNB_MS_TARGET_AVX2 void mixed_cols_avx2(const float *d, const float *av, const float *wt, int64_t ldw, int64_t nJ,
                                        T *o, int64_t n) {
  const int64_t bs = mixed_block(nJ);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_loadu_ps(d + j);
    for (int64_t t0 = 0; t0 < nJ; t0 += bs) {
      const int64_t t1 = std::min(nJ, t0 + bs);
      __m256 acc = _mm256_setzero_ps();
      for (int64_t t = t0; t < t1; ++t)
        acc = fma_x86_8(_mm256_set1_ps(av[t]), _mm256_loadu_ps(wt + t * ldw + j), acc);
      v = _mm256_add_ps(v, acc);
    }
    store8<T>(o + j, v);
  }
  mixed_cols_generic<T>(d, av, wt, ldw, nJ, o, j, n);
}

BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 fma_x86_16(__m512 a, __m512 b, __m512 c) {
  const __m512 r = _mm512_fmadd_ps(a, b, c);
  const __mmask16 nan = _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q);
  if (!nan) return r;
  return _mm512_mask_blend_ps(nan, r, _mm512_add_ps(c, _mm512_mul_ps(a, b)));
}

template <class T>
BNB_MS_TARGET_AVX512 void mixed_cols_avx512(const float *d, const float *av, const float *wt, int64_t ldw,
                                            int64_t nJ, T *o, int64_t n) {
  const int64_t bs = mixed_block(nJ);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m512 v = _mm512_loadu_ps(d + j);
    for (int64_t t0 = 0; t0 < nJ; t0 += bs) {
      const int64_t t1 = std::min(nJ, t0 + bs);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t t = t0; t < t1; ++t)
        acc = fma_x86_16(_mm512_set1_ps(av[t]), _mm512_loadu_ps(wt + t * ldw + j), acc);
      v = _mm512_add_ps(v, acc);
    }
    store16<T>(o + j, v);
  }
  mixed_cols_generic<T>(d, av, wt, ldw, nJ, o, j, n);
}

template <class T, class BT>
void mixed_mm_dequant(const int32_t *C, const float *rs, const float *cs, const BT *bias, const T *A, int64_t K,
                      const int8_t *CB, const uint8_t *flags, T *out, int64_t M, int64_t N, Int8Scratch &s) {
  int64_t nJ = 0;
  int64_t *J = grow(s.cols, std::max<int64_t>(K, 1));
  for (int64_t k = 0; k < K; ++k)
    if (flags[k]) J[nJ++] = k;
  if (nJ == 0) {
    mm_dequant<T, BT>(C, rs, cs, bias, out, M, N);
    return;
  }
  float *wt = grow(s.wt, nJ * N);
  parallel_for(N, std::max<int64_t>(1, 16384 / nJ), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t *b = CB + n * K;
      const float sn = cs[n];
      for (int64_t t = 0; t < nJ; ++t) wt[t * N + n] = ((float)b[J[t]] * sn) * kInt8Dequant;
    }
  });
  float *av = grow(s.av, M * nJ);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t t = 0; t < nJ; ++t) av[r * nJ + t] = to_f32<T>(A[r * K + J[t]]);
  constexpr int64_t kCols = 512;  // columns per task (the fp32 dequant of a task stays on the stack)
  const int64_t nch = (N + kCols - 1) / kCols;
  const SimdLevel lvl = simd_level();
  parallel_for(M * nch, std::max<int64_t>(1, 64 / (1 + nJ)), [&](int64_t t0, int64_t t1) {
    alignas(64) float d[kCols];
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t r = task / nch, n0 = (task % nch) * kCols, len = std::min(kCols, N - n0);
      const int32_t *c = C + r * N + n0;
      const BT *b = bias ? bias + n0 : nullptr;
      const float *a = av + r * nJ;
      T *o = out + r * N + n0;
      if (lvl >= SimdLevel::avx512) {
        mmdq_row_avx512<float, BT>(c, rs[r], cs + n0, b, d, len);
        mixed_cols_avx512<T>(d, a, wt + n0, N, nJ, o, len);
      } else if (lvl >= SimdLevel::avx2) {
        mmdq_row_avx2<float, BT>(c, rs[r], cs + n0, b, d, len);
        mixed_cols_avx2<T>(d, a, wt + n0, N, nJ, o, len);
      } else {
        mmdq_row_generic<float, BT>(c, rs[r], cs + n0, b, d, 0, len);
        mixed_cols_generic<T>(d, a, wt + n0, N, nJ, o, 0, len);
      }
    }
  });
}

// ---- entry point: checks in checks/int8.h (shared with the CUDA library) -------------------------
template <class T>
int mixed_mm_dequant_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::MixedMmDequant<T> a;
  if (int s = checks::mixed_mm_dequant<T>(c, &a)) return s;
  if (a.empty) return OK;
  Int8Scratch &s = int8_scratch();
  const int32_t *C = a.C;
  const float *rs = a.row_stats, *cs = a.col_stats;
  if (a.bias_dt == DType::none)
    mixed_mm_dequant<T, float>(C, rs, cs, nullptr, a.A, a.K, a.CB, a.col_flags, a.out, a.rows, a.N, s);
  else if (a.bias_dt == DType::f32)
    mixed_mm_dequant<T, float>(C, rs, cs, static_cast<const float *>(a.bias), a.A, a.K, a.CB, a.col_flags, a.out,
                               a.rows, a.N, s);
  else if (a.bias_dt == DType::f16)
    mixed_mm_dequant<T, fp16_t>(C, rs, cs, static_cast<const fp16_t *>(a.bias), a.A, a.K, a.CB, a.col_flags, a.out,
                                a.rows, a.N, s);
  else
    mixed_mm_dequant<T, bf16_t>(C, rs, cs, static_cast<const bf16_t *>(a.bias), a.A, a.K, a.CB, a.col_flags, a.out,
                                a.rows, a.N, s);
  s.trim();
  return OK;
}

// fp32 -> fp16, round to nearest even (f32_to_fp16's bytes at every level)
void to_fp16(const float *x, fp16_t *y, int64_t n) {
  parallel_for(n, 65536, [&](int64_t i0, int64_t i1) { convert_span<float, fp16_t>(x + i0, y + i0, i1 - i0); });
}

template <class T, class BT>
void int8_linear(const T *A, const int8_t *CB, const float *SCB, const BT *bias, float threshold, T *out,
                 uint8_t *flags, int64_t M, int64_t N, int64_t K) {
  Int8Scratch &s = int8_scratch();
  int8_t *ca = grow(s.ca, M * K);
  float *sca = grow(s.sca, M);
  if (std::is_same<T, float>::value) {  // quantized after the cast to fp16, as the unfused path
    fp16_t *a16 = grow(s.a16, M * K);
    to_fp16(reinterpret_cast<const float *>(A), a16, M * K);
    vector_quant<fp16_t>(a16, ca, sca, flags, M, K, threshold);
  } else {
    vector_quant<T>(A, ca, sca, flags, M, K, threshold);
  }
  int32_t *c = grow(s.c, M * N);
  int8_gemm(ca, CB, c, M, N, K);
  if (threshold > 0.0f) mixed_mm_dequant<T, BT>(c, sca, SCB, bias, A, K, CB, flags, out, M, N, s);
  else mm_dequant<T, BT>(c, sca, SCB, bias, out, M, N);
  s.trim();
}

// ---- entry point: checks in checks/int8.h (shared with the CUDA library) -------------------------
template <class T>
int int8_linear_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Int8Linear<T> a;
  if (int s = checks::int8_linear<T>(c, &a)) return s;
  if (a.empty) {
    if (a.col_flags && a.K) std::memset(a.col_flags, 0, (size_t)a.K);
    if (a.out && a.K == 0 && a.rows > 0 && a.N > 0) std::memset(static_cast<void *>(a.out), 0, (size_t)(a.rows * a.N) * sizeof(T));
    return OK;
  }
  const float thr = a.threshold;
  if (a.bias_dt == DType::none)
    int8_linear<T, float>(a.A, a.CB, a.SCB, nullptr, thr, a.out, a.col_flags, a.rows, a.N, a.K);
  else if (a.bias_dt == DType::f32)
    int8_linear<T, float>(a.A, a.CB, a.SCB, static_cast<const float *>(a.bias), thr, a.out, a.col_flags, a.rows, a.N, a.K);
  else if (a.bias_dt == DType::f16)
    int8_linear<T, fp16_t>(a.A, a.CB, a.SCB, static_cast<const fp16_t *>(a.bias), thr, a.out, a.col_flags, a.rows, a.N,
                           a.K);
  else
    int8_linear<T, bf16_t>(a.A, a.CB, a.SCB, static_cast<const bf16_t *>(a.bias), thr, a.out, a.col_flags, a.rows, a.N,
                           a.K);
  return OK;
}


}  // namespace

// Internal wrapper of the fused LLM.int8() forward for other feature files (linear_kernels.h).
void int8_linear_f32(const Int8Weight &w, const float *A, const float *bias, float *out, int64_t M, int64_t N,
                     int64_t K) {
  if (linear_without_products(bias, out, M, N, K)) return;
  static thread_local std::vector<uint8_t> flags;  // the outlier columns (the caller does not need them)
  int8_linear<float, float>(A, w.CB, w.SCB, bias, w.threshold, out, grow(flags, K), M, N, K);
}

}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cint8_vector_quant, bnb_ms::vector_quant_entry)
BNB_MS_ENTRY(cigemmlt_32, bnb_ms::igemm_entry)
BNB_MS_EXPORT_FORCE_ERROR
BNB_MS_ENTRY(cdequant_mm_int32_fp16, bnb_ms::mm_dequant_entry<fp16_t>)
BNB_MS_ENTRY(cdequant_mm_int32_fp32, bnb_ms::mm_dequant_entry<float>)
BNB_MS_ENTRY(cdequant_mm_int32_bf16, bnb_ms::mm_dequant_entry<bf16_t>)

// Plain C diagnostics (ctypes): the int8 GEMM path in use (for `rows` rows of A: the automatic choice
// takes AMX only from 8 rows on).
BNB_MS_EXPORT const char *bnb_ms_int8_gemm_path() {
  return bnb_ms::kGemmPathNames[(int)bnb_ms::gemm_choice().path];
}
BNB_MS_EXPORT const char *bnb_ms_int8_gemm_path_for_rows(int64_t rows) {
  return bnb_ms::kGemmPathNames[(int)bnb_ms::gemm_path_for_rows(rows)];
}

// LLM.int8() outlier columns and the fused linear forward (see "mixed mm dequant" above).
BNB_MS_ENTRY(cint8_mixed_mm_dequant_fp16, bnb_ms::mixed_mm_dequant_entry<fp16_t>)
BNB_MS_ENTRY(cint8_mixed_mm_dequant_fp32, bnb_ms::mixed_mm_dequant_entry<float>)
BNB_MS_ENTRY(cint8_mixed_mm_dequant_bf16, bnb_ms::mixed_mm_dequant_entry<bf16_t>)
BNB_MS_ENTRY(cint8_linear_fp16, bnb_ms::int8_linear_entry<fp16_t>)
BNB_MS_ENTRY(cint8_linear_fp32, bnb_ms::int8_linear_entry<float>)
BNB_MS_ENTRY(cint8_linear_bf16, bnb_ms::int8_linear_entry<bf16_t>)
