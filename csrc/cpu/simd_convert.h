// simd_convert.h -- SIMD loads/stores of fp32/fp16/bf16 for the CPU kernels: 8 lanes (AVX2 + F16C) and
// 16 lanes (AVX-512). The values and roundings are those of to_f32/from_f32 in aot.h, NaNs included (a NaN keeps
// its sign and top payload bits and is made quiet), so a SIMD path gives the same bytes as its scalar twin. Every
// kernel file that converts element types in vectors uses these (blockwise, fourbit, int8, gemm_fp, decoder,
// optim).
// convert_span<S, D>(src, dst, n): dst[i] = D(src[i]) over a span at the best level (serial; callers split it).
#pragma once
#include <immintrin.h>

#include "aot.h"
#include "cpu/cpu_features.h"

namespace bnb_ms {
template <class T> BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 load8(const T *p);
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 load8<float>(const float *p) { return _mm256_loadu_ps(p); }
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 load8<fp16_t>(const fp16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 load8<bf16_t>(const bf16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
template <class T> BNB_MS_TARGET_AVX2 BNB_MS_INLINE void store8(T *p, __m256 v);
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE void store8<float>(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE void store8<fp16_t>(fp16_t *p, __m256 v) {
  // vcvtps2ph: round to nearest even; NaN -> sign | 0x7e00 | payload >> 13 (f32_to_fp16's rule)
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE void store8<bf16_t>(bf16_t *p, __m256 v) {
  // round to nearest even; NaN -> (bits >> 16) | 0x40 (same as f32_to_bf16)
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40)), nan);
  _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

template <class T> BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 load16(const T *p);
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 load16<float>(const float *p) { return _mm512_loadu_ps(p); }
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 load16<fp16_t>(const fp16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 load16<bf16_t>(const bf16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
template <class T> BNB_MS_TARGET_AVX512 BNB_MS_INLINE void store16(T *p, __m512 v);
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE void store16<float>(float *p, __m512 v) { _mm512_storeu_ps(p, v); }
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE void store16<fp16_t>(fp16_t *p, __m512 v) {
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE void store16<bf16_t>(bf16_t *p, __m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(r));
}

// dst[i] = from_f32<D>(to_f32<S>(src[i])) for i < n: widening is exact, narrowing rounds to nearest even with
// from_f32's NaNs, the same bytes at every level (numpy twin: _reference.convert_span).
template <class S, class D>
BNB_MS_INLINE void convert_span_portable(const S *src, D *dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = from_f32<D>(to_f32<S>(src[i]));
}
template <class S, class D>
BNB_MS_TARGET_AVX2 void convert_span_avx2(const S *src, D *dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8<D>(dst + i, load8<S>(src + i));
  for (; i < n; ++i) dst[i] = from_f32<D>(to_f32<S>(src[i]));
}
template <class S, class D>
BNB_MS_TARGET_AVX512 void convert_span_avx512(const S *src, D *dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store16<D>(dst + i, load16<S>(src + i));
  for (; i < n; ++i) dst[i] = from_f32<D>(to_f32<S>(src[i]));
}
template <class S, class D>
void convert_span(const S *src, D *dst, int64_t n) {
  const SimdLevel lvl = simd_level();
  if (lvl >= SimdLevel::avx512) convert_span_avx512<S, D>(src, dst, n);
  else if (lvl >= SimdLevel::avx2) convert_span_avx2<S, D>(src, dst, n);
  else convert_span_portable<S, D>(src, dst, n);
}
}  // namespace bnb_ms
