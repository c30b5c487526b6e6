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
//  * GEMM (out[m, n] above): its kernels and the path choice (BNB_MS_INT8_GEMM) are in int8_gemm.cpp (scalar,
//    AVX2, AVX-512, AVX-VNNI, AVX-512 VNNI) and int8_gemm_amx.cpp (AMX-INT8), behind int8_gemm.h; this file
//    holds its entry point and bnb_ms_int8_gemm_path(), which names the path in use.
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
#include "cpu/int8_gemm.h"
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
void int8_vector_quant_portable(const T *a, int8_t *o, int64_t cols, bool any, float thr, const uint8_t *zf,
                                float *stat) {
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
BNB_MS_TARGET_AVX2 void int8_vector_quant_avx2(const T *a, int8_t *o, int64_t cols, bool any, float thr,
                                               const uint8_t *zf, float *stat) {
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
BNB_MS_TARGET_AVX512 void int8_vector_quant_avx512(const T *a, int8_t *o, int64_t cols, bool any, float thr,
                                                   const uint8_t *zf, float *stat) {
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
void int8_vector_quant_flags_portable(const T *A, int64_t rows, int64_t cols, int64_t c0, int64_t c1, float thr,
                                      uint8_t *flags) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *a = A + r * cols;
    for (int64_t c = c0; c < c1; ++c)
      if (std::fabs(to_f32<T>(a[c])) >= thr) flags[c] = 1;
  }
}

template <class T>
BNB_MS_TARGET_AVX2 void int8_vector_quant_flags_avx2(const T *A, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                                                     float thr, uint8_t *flags) {
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
BNB_MS_TARGET_AVX512 void int8_vector_quant_flags_avx512(const T *A, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                                                         float thr, uint8_t *flags) {
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
void int8_vector_quant(const T *A, int8_t *out, float *row_stats, uint8_t *col_flags, int64_t rows, int64_t cols,
                       float threshold) {
  const bool split = threshold > 0.0f;
  const float thr = split ? to_f32<T>(from_f32<T>(threshold)) : 0.0f;
  const SimdLevel lvl = simd_level();
  std::memset(col_flags, 0, (size_t)cols);
  bool any = false;
  if (split) {
    // Column flags: one pass, rows in parallel would race on flags, so columns are split instead.
    parallel_for(cols, 1024, [&](int64_t c0, int64_t c1) {
      if (lvl >= SimdLevel::avx512) int8_vector_quant_flags_avx512<T>(A, rows, cols, c0, c1, thr, col_flags);
      else if (lvl >= SimdLevel::avx2) int8_vector_quant_flags_avx2<T>(A, rows, cols, c0, c1, thr, col_flags);
      else int8_vector_quant_flags_portable<T>(A, rows, cols, c0, c1, thr, col_flags);
    });
    for (int64_t c = 0; c < cols; ++c) any |= col_flags[c] != 0;
  }
  const uint8_t *zf = (any && rows > 1) ? col_flags : nullptr;
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T *a = A + r * cols;
      int8_t *o = out + r * cols;
      if (lvl >= SimdLevel::avx512) int8_vector_quant_avx512<T>(a, o, cols, any, thr, zf, row_stats + r);
      else if (lvl >= SimdLevel::avx2) int8_vector_quant_avx2<T>(a, o, cols, any, thr, zf, row_stats + r);
      else int8_vector_quant_portable<T>(a, o, cols, any, thr, zf, row_stats + r);
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
  if (a.dt == DType::f32)
    int8_vector_quant<float>(static_cast<const float *>(a.A), o, rs, fl, a.rows, a.cols, a.threshold);
  else if (a.dt == DType::f16)
    int8_vector_quant<fp16_t>(static_cast<const fp16_t *>(a.A), o, rs, fl, a.rows, a.cols, a.threshold);
  else int8_vector_quant<bf16_t>(static_cast<const bf16_t *>(a.A), o, rs, fl, a.rows, a.cols, a.threshold);
  return OK;
}

// ------------------------------------------------------------------------------------------------
// int8 GEMM entry point (the kernels: int8_gemm.cpp, int8_gemm_amx.cpp)
// ------------------------------------------------------------------------------------------------
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
void int8_mm_dequant_portable(const int32_t *a, float rv, const float *cs, const BT *bias, T *o, int64_t j0,
                              int64_t cols) {
  for (int64_t j = j0; j < cols; ++j) {
    float v = (float)a[j] * (rv * cs[j]);
    v = v * kMmDequant;
    if (bias) v = v + to_f32<BT>(bias[j]);
    o[j] = from_f32<T>(v);
  }
}

// Same fp32 operations in the same order per element (no FMA), then the same output rounding.
template <class T, class BT>
BNB_MS_TARGET_AVX2 void int8_mm_dequant_avx2(const int32_t *a, float rv, const float *cs, const BT *bias, T *o,
                                             int64_t cols) {
  const __m256 vrv = _mm256_set1_ps(rv), vk = _mm256_set1_ps(kMmDequant);
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    const __m256 rc = _mm256_mul_ps(vrv, _mm256_loadu_ps(cs + j));
    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(a + j))), rc);
    v = _mm256_mul_ps(v, vk);
    if (bias) v = _mm256_add_ps(v, load8<BT>(bias + j));
    store8<T>(o + j, v);
  }
  int8_mm_dequant_portable<T, BT>(a, rv, cs, bias, o, j, cols);
}

template <class T, class BT>
BNB_MS_TARGET_AVX512 void int8_mm_dequant_avx512(const int32_t *a, float rv, const float *cs, const BT *bias, T *o,
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
  int8_mm_dequant_portable<T, BT>(a, rv, cs, bias, o, j, cols);
}

template <class T, class BT>
void int8_mm_dequant(const int32_t *A, const float *rs, const float *cs, const BT *bias, T *out, int64_t rows,
                     int64_t cols) {
  const SimdLevel lvl = simd_level();
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t *a = A + r * cols;
      T *o = out + r * cols;
      if (lvl >= SimdLevel::avx512) int8_mm_dequant_avx512<T, BT>(a, rs[r], cs, bias, o, cols);
      else if (lvl >= SimdLevel::avx2) int8_mm_dequant_avx2<T, BT>(a, rs[r], cs, bias, o, cols);
      else int8_mm_dequant_portable<T, BT>(a, rs[r], cs, bias, o, 0, cols);
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
  if (a.bias_dt == DType::none) int8_mm_dequant<T, float>(A, rs, cs, nullptr, a.out, rows, cols);
  else if (a.bias_dt == DType::f32)
    int8_mm_dequant<T, float>(A, rs, cs, static_cast<const float *>(a.bias), a.out, rows, cols);
  else if (a.bias_dt == DType::f16)
    int8_mm_dequant<T, fp16_t>(A, rs, cs, static_cast<const fp16_t *>(a.bias), a.out, rows, cols);
  else int8_mm_dequant<T, bf16_t>(A, rs, cs, static_cast<const bf16_t *>(a.bias), a.out, rows, cols);
  return OK;
}

// ------------------------------------------------------------------------------------------------
// LLM.int8() outlier columns (mixed mm dequant) and the fused linear forward
// ------------------------------------------------------------------------------------------------
// Mixed mm dequant (cint8_mixed_mm_dequant_<T>; the outlier part of functional.int8_mixed_scaled_mm):
//   J = the flagged columns, ascending.  J empty: out = mm dequant of C straight into T (the bytes of
//   cdequant_mm_int32_<T>).  Otherwise, in fp32:
//     d[r, n]   = mm dequant of C in fp32 (+ bias)                       (int8_mm_dequant_*<float>)
//     w[n, j]   = (float(CB[n, j]) * col_stats[n]) * 7.874015718698502e-3f  (int8_vectorwise_dequant)
//     J is cut into blocks of mixed_block_size(|J|) columns (192; |J|/2 rounded up for 192 < |J| < 384); per block
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
//   int8_vector_quant (with outlier column flags for threshold > 0) -> int8_gemm (the path of
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
inline int64_t mixed_block_size(int64_t nJ) {
  return (nJ > kMixedBlock && nJ < 2 * kMixedBlock) ? (nJ + 1) / 2 : kMixedBlock;
}

// a + b with SSE's NaN rule spelled out: where both are NaN the result is a's.  Why: the compiler may emit a
// scalar `a + b` as addss with the operands swapped (addition commutes for numbers, not for NaN payloads), and
// did for `v + acc` below, giving the second NaN's sign (BNB_MS_SIMD=scalar differed from the reference there).
inline float add_x86_portable(float a, float b) {
  const float r = a + b;
  if (r == r || a == a) return r;  // a number, or a is a number so r is b's NaN or the default NaN
  uint32_t u;
  std::memcpy(&u, &a, 4);
  u |= 0x00400000u;  // quieted, as SSE returns a signalling operand
  float q;
  std::memcpy(&q, &u, 4);
  return q;
}

// fma(a, b, c) with a NaN result replaced by the NaN of c + a * b in two steps (SSE: the first NaN operand).
inline float fma_x86_portable(float a, float b, float c) {
  const float r = std::fma(a, b, c);
  if (r == r) return r;
  const float p = a * b;
  return add_x86_portable(c, p);
}

// d + outlier sum for columns [j0, n) of one row: d, o and the columns of wt (row stride ldw) start at
// the row's first column; av holds the row's nJ outlier activations.
template <class T>
void int8_mixed_mm_dequant_portable(const float *d, const float *av, const float *wt, int64_t ldw, int64_t nJ, T *o,
                                    int64_t j0, int64_t n) {
  const int64_t bs = mixed_block_size(nJ);
  for (int64_t j = j0; j < n; ++j) {
    float v = d[j];
    for (int64_t t0 = 0; t0 < nJ; t0 += bs) {
      const int64_t t1 = std::min(nJ, t0 + bs);
      float acc = 0.0f;
      for (int64_t t = t0; t < t1; ++t) acc = fma_x86_portable(av[t], wt[t * ldw + j], acc);
      v = add_x86_portable(v, acc);
    }
    o[j] = from_f32<T>(v);
  }
}

// add_x86_portable's rule per lane: where a is NaN, a (the compiler may swap _mm256_add_ps's operands).
BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 add_x86_avx2(__m256 a, __m256 b) {
  const __m256 r = _mm256_add_ps(a, b);
  const __m256 an = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
  if (_mm256_testz_ps(an, an)) return r;
  return _mm256_blendv_ps(r, a, an);
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 fma_x86_avx2(__m256 a, __m256 b, __m256 c) {
  const __m256 r = _mm256_fmadd_ps(a, b, c);
  const __m256 nan = _mm256_cmp_ps(r, r, _CMP_UNORD_Q);
  if (_mm256_testz_ps(nan, nan)) return r;
  return _mm256_blendv_ps(r, add_x86_avx2(c, _mm256_mul_ps(a, b)), nan);
}

template <class T>
BNB_MS_TARGET_AVX2 void int8_mixed_mm_dequant_avx2(const float *d, const float *av, const float *wt, int64_t ldw,
                                                   int64_t nJ, T *o, int64_t n) {
  const int64_t bs = mixed_block_size(nJ);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m256 v = _mm256_loadu_ps(d + j);
    for (int64_t t0 = 0; t0 < nJ; t0 += bs) {
      const int64_t t1 = std::min(nJ, t0 + bs);
      __m256 acc = _mm256_setzero_ps();
      for (int64_t t = t0; t < t1; ++t)
        acc = fma_x86_avx2(_mm256_set1_ps(av[t]), _mm256_loadu_ps(wt + t * ldw + j), acc);
      v = add_x86_avx2(v, acc);
    }
    store8<T>(o + j, v);
  }
  int8_mixed_mm_dequant_portable<T>(d, av, wt, ldw, nJ, o, j, n);
}

BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 add_x86_avx512(__m512 a, __m512 b) {
  const __m512 r = _mm512_add_ps(a, b);
  const __mmask16 an = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
  return an ? _mm512_mask_blend_ps(an, r, a) : r;
}

BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 fma_x86_avx512(__m512 a, __m512 b, __m512 c) {
  const __m512 r = _mm512_fmadd_ps(a, b, c);
  const __mmask16 nan = _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q);
  if (!nan) return r;
  return _mm512_mask_blend_ps(nan, r, add_x86_avx512(c, _mm512_mul_ps(a, b)));
}

template <class T>
BNB_MS_TARGET_AVX512 void int8_mixed_mm_dequant_avx512(const float *d, const float *av, const float *wt, int64_t ldw,
                                                       int64_t nJ, T *o, int64_t n) {
  const int64_t bs = mixed_block_size(nJ);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    __m512 v = _mm512_loadu_ps(d + j);
    for (int64_t t0 = 0; t0 < nJ; t0 += bs) {
      const int64_t t1 = std::min(nJ, t0 + bs);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t t = t0; t < t1; ++t)
        acc = fma_x86_avx512(_mm512_set1_ps(av[t]), _mm512_loadu_ps(wt + t * ldw + j), acc);
      v = add_x86_avx512(v, acc);
    }
    store16<T>(o + j, v);
  }
  int8_mixed_mm_dequant_portable<T>(d, av, wt, ldw, nJ, o, j, n);
}

// The outlier sums in tiles (int8_mixed_mm_dequant): tasks of kMixedRows rows x one chunk of columns.  wt is kept
// chunk by chunk ([chunk][nJ][cols], contiguous per chunk) and the tasks run chunk-major, so a chunk's slice
// (nJ x cols floats, at most 256 KiB) stays in L2 while every row group reads it.
constexpr int64_t kMixedRows = 4;    // rows per tile
constexpr int kMixedVecs = 4;        // vectors of columns per tile step
constexpr int64_t kMixedCols = 512;  // most columns per chunk
inline int64_t mixed_chunk_cols(int64_t nJ) {
  return std::max<int64_t>(64, std::min<int64_t>(kMixedCols, 65536 / std::max<int64_t>(nJ, 1)) / 64 * 64);
}

// Vector traits of the tiles below (one per SIMD level); tile(R, ...) runs the level's tile for R rows.
template <int R>
BNB_MS_TARGET_AVX2 void mixed_rows_tile_avx2(float *v, int64_t ldv, const float *av, int64_t nJ, const float *wt,
                                             int64_t ldw, int64_t n);
template <int R>
BNB_MS_TARGET_AVX512 void mixed_rows_tile_avx512(float *v, int64_t ldv, const float *av, int64_t nJ, const float *wt,
                                                 int64_t ldw, int64_t n);
#define BNB_MS_MIXED_TILE_DISPATCH(NAME)                                                                              \
  static void tile(int64_t R, float *v, int64_t ldv, const float *av, int64_t nJ, const float *wt, int64_t ldw,      \
                   int64_t n) {                                                                                      \
    if (R == 4) NAME<4>(v, ldv, av, nJ, wt, ldw, n);                                                                 \
    else if (R == 3) NAME<3>(v, ldv, av, nJ, wt, ldw, n);                                                            \
    else if (R == 2) NAME<2>(v, ldv, av, nJ, wt, ldw, n);                                                            \
    else NAME<1>(v, ldv, av, nJ, wt, ldw, n);                                                                        \
  }
struct VecAvx2 {
  using F = __m256;
  static constexpr int64_t W = 8;
  BNB_MS_TARGET_AVX2 static BNB_MS_INLINE F load(const float *p) { return _mm256_loadu_ps(p); }
  BNB_MS_TARGET_AVX2 static BNB_MS_INLINE void store(float *p, F x) { _mm256_storeu_ps(p, x); }
  BNB_MS_TARGET_AVX2 static BNB_MS_INLINE F zero() { return _mm256_setzero_ps(); }
  BNB_MS_TARGET_AVX2 static BNB_MS_INLINE F set1(float x) { return _mm256_set1_ps(x); }
  BNB_MS_TARGET_AVX2 static BNB_MS_INLINE F add_x86(F a, F b) { return add_x86_avx2(a, b); }
  BNB_MS_TARGET_AVX2 static BNB_MS_INLINE F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  BNB_MS_TARGET_AVX2 static BNB_MS_INLINE F fma_x86(F a, F b, F c) { return fma_x86_avx2(a, b, c); }
  BNB_MS_TARGET_AVX2 static BNB_MS_INLINE bool any_nan(F x) {
    const F m = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    return !_mm256_testz_ps(m, m);
  }
  static void mixed_row(float *v, const float *av, const float *wt, int64_t ldw, int64_t nJ, int64_t n) {
    int8_mixed_mm_dequant_avx2<float>(v, av, wt, ldw, nJ, v, n);
  }
  template <class BT>
  static void dequant(const int32_t *c, float rv, const float *cs, const BT *bias, float *d, int64_t n) {
    int8_mm_dequant_avx2<float, BT>(c, rv, cs, bias, d, n);
  }
  BNB_MS_MIXED_TILE_DISPATCH(mixed_rows_tile_avx2)
};
struct VecAvx512 {
  using F = __m512;
  static constexpr int64_t W = 16;
  BNB_MS_TARGET_AVX512 static BNB_MS_INLINE F load(const float *p) { return _mm512_loadu_ps(p); }
  BNB_MS_TARGET_AVX512 static BNB_MS_INLINE void store(float *p, F x) { _mm512_storeu_ps(p, x); }
  BNB_MS_TARGET_AVX512 static BNB_MS_INLINE F zero() { return _mm512_setzero_ps(); }
  BNB_MS_TARGET_AVX512 static BNB_MS_INLINE F set1(float x) { return _mm512_set1_ps(x); }
  BNB_MS_TARGET_AVX512 static BNB_MS_INLINE F add_x86(F a, F b) { return add_x86_avx512(a, b); }
  BNB_MS_TARGET_AVX512 static BNB_MS_INLINE F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  BNB_MS_TARGET_AVX512 static BNB_MS_INLINE F fma_x86(F a, F b, F c) { return fma_x86_avx512(a, b, c); }
  BNB_MS_TARGET_AVX512 static BNB_MS_INLINE bool any_nan(F x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) != 0; }
  static void mixed_row(float *v, const float *av, const float *wt, int64_t ldw, int64_t nJ, int64_t n) {
    int8_mixed_mm_dequant_avx512<float>(v, av, wt, ldw, nJ, v, n);
  }
  template <class BT>
  static void dequant(const int32_t *c, float rv, const float *cs, const BT *bias, float *d, int64_t n) {
    int8_mm_dequant_avx512<float, BT>(c, rv, cs, bias, d, n);
  }
  BNB_MS_MIXED_TILE_DISPATCH(mixed_rows_tile_avx512)
};
#undef BNB_MS_MIXED_TILE_DISPATCH

// The outlier sums of R rows at once over the columns [0, n) of a chunk, in place: row r's d (v + r * ldv) becomes
// d + its sums, the bits of the per-row kernels above.  Why: the per-row loop read the chunk's whole wt slice again
// for every row, from memory once nJ x N floats outgrew the caches (a 512-token prefill through an 11008 x 4096
// int8 layer with 2048 outlier columns took 4.4 s); here each wt vector is loaded once for R rows.  Every (row,
// column) is still its own chain in the same order (per block: from 0, fma over the block's columns ascending,
// then v + acc).  The NaN rule of fma_x86_* is applied per block instead of per step: a chain ends its block NaN
// exactly when some step made it NaN (a NaN stays NaN).  A NaN block is recomputed with the per-step rule.
// Stamped per SIMD level (V: its vector traits); kMixedVecs vectors of columns per step, the last (< kMixedVecs W)
// columns by the per-row kernel.
#define BNB_MS_MIXED_ROWS_TILE(NAME, TARGET, V)                                                                        \
template <int R>                                                                                                       \
TARGET void NAME(float *v, int64_t ldv, const float *av, int64_t nJ, const float *wt, int64_t ldw, int64_t n) {        \
  using F = typename V::F;                                                                                             \
  constexpr int64_t W = V::W;                                                                                          \
  constexpr int NV = kMixedVecs;                                                                                       \
  const int64_t bs = mixed_block_size(nJ);                                                                             \
  int64_t j = 0;                                                                                                       \
  for (; j + NV * W <= n; j += NV * W) {                                                                               \
    F s[R][NV];                                                                                                        \
    for (int r = 0; r < R; ++r)                                                                                        \
      for (int k = 0; k < NV; ++k) s[r][k] = V::load(v + r * ldv + j + k * W);                                         \
    for (int64_t t0 = 0; t0 < nJ; t0 += bs) {                                                                          \
      const int64_t t1 = std::min(nJ, t0 + bs);                                                                        \
      F acc[R][NV];                                                                                                    \
      for (int r = 0; r < R; ++r)                                                                                      \
        for (int k = 0; k < NV; ++k) acc[r][k] = V::zero();                                                            \
      for (int64_t t = t0; t < t1; ++t) {                                                                              \
        F w[NV];                                                                                                       \
        for (int k = 0; k < NV; ++k) w[k] = V::load(wt + t * ldw + j + k * W);                                         \
        for (int r = 0; r < R; ++r) {                                                                                  \
          const F x = V::set1(av[r * nJ + t]);                                                                         \
          for (int k = 0; k < NV; ++k) acc[r][k] = V::fmadd(x, w[k], acc[r][k]);                                       \
        }                                                                                                              \
      }                                                                                                                \
      for (int r = 0; r < R; ++r)                                                                                      \
        for (int k = 0; k < NV; ++k) {                                                                                 \
          if (V::any_nan(acc[r][k])) {                                                                                 \
            acc[r][k] = V::zero();                                                                                     \
            for (int64_t t = t0; t < t1; ++t)                                                                          \
              acc[r][k] = V::fma_x86(V::set1(av[r * nJ + t]), V::load(wt + t * ldw + j + k * W), acc[r][k]);           \
          }                                                                                                            \
          s[r][k] = V::add_x86(s[r][k], acc[r][k]);                                                                    \
        }                                                                                                              \
    }                                                                                                                  \
    for (int r = 0; r < R; ++r)                                                                                        \
      for (int k = 0; k < NV; ++k) V::store(v + r * ldv + j + k * W, s[r][k]);                                         \
  }                                                                                                                    \
  if (j < n)                                                                                                           \
    for (int r = 0; r < R; ++r) V::mixed_row(v + r * ldv + j, av + r * nJ, wt + j, ldw, nJ, n - j);                    \
}
BNB_MS_MIXED_ROWS_TILE(mixed_rows_tile_avx2, BNB_MS_TARGET_AVX2, VecAvx2)
BNB_MS_MIXED_ROWS_TILE(mixed_rows_tile_avx512, BNB_MS_TARGET_AVX512, VecAvx512)
#undef BNB_MS_MIXED_ROWS_TILE

// The rows [r0, r0 + R) of the chunk starting at column n0 (len columns; Cc: its int32 products, rows ldc apart;
// wc: its outlier weights): d in fp32, the outlier sums, out in T.
template <class T, class BT>
void mixed_task(SimdLevel lvl, const int32_t *Cc, int64_t ldc, const float *rs, const float *cs, const BT *bias,
                const float *av, const float *wc, int64_t nJ, T *out, int64_t N, int64_t r0, int64_t R, int64_t n0,
                int64_t len, int64_t kc, float *d) {
  for (int64_t r = 0; r < R; ++r) {
    const int32_t *c = Cc + (r0 + r) * ldc;
    const BT *b = bias ? bias + n0 : nullptr;
    if (lvl >= SimdLevel::avx512) VecAvx512::dequant<BT>(c, rs[r0 + r], cs + n0, b, d + r * kc, len);
    else if (lvl >= SimdLevel::avx2) VecAvx2::dequant<BT>(c, rs[r0 + r], cs + n0, b, d + r * kc, len);
    else int8_mm_dequant_portable<float, BT>(c, rs[r0 + r], cs + n0, b, d + r * kc, 0, len);
  }
  const float *a = av + r0 * nJ;
  if (lvl >= SimdLevel::avx512) VecAvx512::tile(R, d, kc, a, nJ, wc, kc, len);
  else if (lvl >= SimdLevel::avx2) VecAvx2::tile(R, d, kc, a, nJ, wc, kc, len);
  else
    for (int64_t r = 0; r < R; ++r) int8_mixed_mm_dequant_portable<float>(d + r * kc, a + r * nJ, wc, kc, nJ, d + r * kc, 0, len);
  for (int64_t r = 0; r < R; ++r) convert_span<float, T>(d + r * kc, out + (r0 + r) * N + n0, len);
}

// The outlier columns (flags set), ascending, into s.cols; returns their count.
inline int64_t outlier_cols(const uint8_t *flags, int64_t K, Int8Scratch &s) {
  int64_t nJ = 0;
  int64_t *J = grow(s.cols, std::max<int64_t>(K, 1));
  for (int64_t k = 0; k < K; ++k)
    if (flags[k]) J[nJ++] = k;
  return nJ;
}

// The outlier activations in fp32 [M, nJ] (into s.av).
template <class T>
const float *outlier_acts(const T *A, int64_t M, int64_t K, const int64_t *J, int64_t nJ, Int8Scratch &s) {
  float *av = grow(s.av, M * nJ);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t t = 0; t < nJ; ++t) av[r * nJ + t] = to_f32<T>(A[r * K + J[t]]);
  return av;
}

// Weight row n's outlier columns dequantized (int8_vectorwise_dequant's value): w[t * ldw] for t < nJ.
inline void outlier_weights(const int8_t *CB, int64_t K, const float *cs, const int64_t *J, int64_t nJ, int64_t n,
                            float *w, int64_t ldw) {
  const int8_t *b = CB + n * K;
  const float sn = cs[n];
  for (int64_t t = 0; t < nJ; ++t) w[t * ldw] = ((float)b[J[t]] * sn) * kInt8Dequant;
}

template <class T, class BT>
void int8_mixed_mm_dequant(const int32_t *C, const float *rs, const float *cs, const BT *bias, const T *A, int64_t K,
                           const int8_t *CB, const uint8_t *flags, T *out, int64_t M, int64_t N, Int8Scratch &s) {
  const int64_t nJ = outlier_cols(flags, K, s);
  if (nJ == 0) {
    int8_mm_dequant<T, BT>(C, rs, cs, bias, out, M, N);
    return;
  }
  const int64_t *J = s.cols.data();
  const int64_t kc = mixed_chunk_cols(nJ), nch = (N + kc - 1) / kc, G = (M + kMixedRows - 1) / kMixedRows;
  float *wt = grow(s.wt, nch * nJ * kc);  // [chunk][t][column of the chunk]
  parallel_for(N, std::max<int64_t>(1, 16384 / nJ), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) outlier_weights(CB, K, cs, J, nJ, n, wt + (n / kc) * nJ * kc + n % kc, kc);
  });
  const float *av = outlier_acts(A, M, K, J, nJ, s);
  const SimdLevel lvl = simd_level();
  parallel_for(nch * G, std::max<int64_t>(1, 64 / (1 + nJ)), [&](int64_t t0, int64_t t1) {
    alignas(64) float d[kMixedRows * kMixedCols];
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t c = task / G, n0 = c * kc, r0 = (task % G) * kMixedRows;
      mixed_task<T, BT>(lvl, C + n0, N, rs, cs, bias, av, wt + c * nJ * kc, nJ, out, N, r0,
                        std::min(kMixedRows, M - r0), n0, std::min(kc, N - n0), kc, d);
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
    int8_mixed_mm_dequant<T, float>(C, rs, cs, nullptr, a.A, a.K, a.CB, a.col_flags, a.out, a.rows, a.N, s);
  else if (a.bias_dt == DType::f32)
    int8_mixed_mm_dequant<T, float>(C, rs, cs, static_cast<const float *>(a.bias), a.A, a.K, a.CB, a.col_flags, a.out,
                               a.rows, a.N, s);
  else if (a.bias_dt == DType::f16)
    int8_mixed_mm_dequant<T, fp16_t>(C, rs, cs, static_cast<const fp16_t *>(a.bias), a.A, a.K, a.CB, a.col_flags, a.out,
                                a.rows, a.N, s);
  else
    int8_mixed_mm_dequant<T, bf16_t>(C, rs, cs, static_cast<const bf16_t *>(a.bias), a.A, a.K, a.CB, a.col_flags, a.out,
                                a.rows, a.N, s);
  s.trim();
  return OK;
}

// fp32 -> fp16, round to nearest even (f32_to_fp16's bytes at every level)
void to_fp16(const float *x, fp16_t *y, int64_t n) {
  parallel_for(n, 65536, [&](int64_t i0, int64_t i1) { convert_span<float, fp16_t>(x + i0, y + i0, i1 - i0); });
}

// Decode rows (M <= kDecodeMaxRows) with outlier columns: the int8 GEMM and the outlier sums chunk by chunk of
// weight rows, each chunk's outlier weights gathered while its rows are still in L2, then the same tiles as
// int8_mixed_mm_dequant (mixed_task: the same bits).  Why: int8_mixed_mm_dequant gathers every row's outlier
// columns again after the whole GEMM (written transposed), from memory: one row through an 11008 x 4096 layer with
// 16 / 64 outlier columns took 3.2 / 4.8 ms against 2.2 ms without.
constexpr int64_t kDecodeMaxRows = 4;  // (<= kMixedRows: one tile of rows)
constexpr int64_t kDecodeChunk = 64;   // weight rows per chunk: 64 x K bytes stay in L2; one 64-column tile step

template <class T, class BT>
void int8_decode_mixed(const T *A, const int8_t *ca, const float *sca, const int8_t *CB, const float *cs,
                       const BT *bias, const int64_t *J, int64_t nJ, T *out, int64_t M, int64_t N, int64_t K,
                       Int8Scratch &s) {
  const float *av = outlier_acts(A, M, K, J, nJ, s);
  const SimdLevel lvl = simd_level();
  parallel_for_dynamic(N, kDecodeChunk, [&](int64_t c0, int64_t c1) {
    static thread_local std::vector<int32_t> cc;
    static thread_local std::vector<float> wc;  // the chunk's outlier weights, [t][column of the chunk]
    cc.resize((size_t)(M * kDecodeChunk));
    wc.resize((size_t)(nJ * kDecodeChunk));
    alignas(64) float d[kMixedRows * kMixedCols];
    for (int64_t n0 = c0; n0 < c1; n0 += kDecodeChunk) {
      const int64_t len = std::min(kDecodeChunk, c1 - n0);
      int8_gemm(ca, CB + n0 * K, cc.data(), M, len, K);  // serial here (inside the pool's task)
      for (int64_t j = 0; j < len; ++j) outlier_weights(CB, K, cs, J, nJ, n0 + j, wc.data() + j, kDecodeChunk);
      mixed_task<T, BT>(lvl, cc.data(), len, sca, cs, bias, av, wc.data(), nJ, out, N, 0, M, n0, len, kDecodeChunk, d);
    }
  });
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
    int8_vector_quant<fp16_t>(a16, ca, sca, flags, M, K, threshold);
  } else {
    int8_vector_quant<T>(A, ca, sca, flags, M, K, threshold);
  }
  if (threshold > 0.0f && M <= kDecodeMaxRows) {
    const int64_t nJ = outlier_cols(flags, K, s);
    if (nJ > 0) {
      int8_decode_mixed<T, BT>(A, ca, sca, CB, SCB, bias, s.cols.data(), nJ, out, M, N, K, s);
      s.trim();
      return;
    }
  }
  int32_t *c = grow(s.c, M * N);
  int8_gemm(ca, CB, c, M, N, K);
  if (threshold > 0.0f) int8_mixed_mm_dequant<T, BT>(c, sca, SCB, bias, A, K, CB, flags, out, M, N, s);
  else int8_mm_dequant<T, BT>(c, sca, SCB, bias, out, M, N);
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
