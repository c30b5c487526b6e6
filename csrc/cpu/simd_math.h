// simd_math.h -- elementwise math for the fused decoder's softmax and SiLU: exp in fp32 with the same bits on
// every SIMD level (the scalar and AVX2 forms run the same operations in the same order).
//
// exp(x): n = nearbyint(x * log2(e)) (round half to even), r = (x - n * ln2_hi) - n * ln2_lo (two fmas),
// e^r by its degree-7 Taylor polynomial in Horner form (fmas; |r| <= ln2 / 2, truncation < 1e-8 relative),
// times 2^n built in the exponent bits.  x < -87.33 (including -inf) gives 0, x > 88 is taken as 88
// (1.65e38), NaN stays NaN; the result is within 2 ulp of the correctly rounded exp over the normal range.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/cpu_features.h"

namespace bnb_ms {
namespace simd_math {

constexpr float kExpLo = -87.33654f, kExpHi = 88.0f;  // 88 * log2(e) < 127: 2^n stays finite
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kC[8] = {1.0f, 1.0f, 0.5f, 1.0f / 6, 1.0f / 24, 1.0f / 120, 1.0f / 720, 1.0f / 5040};

BNB_MS_INLINE float exp_f32(float x) {
  if (!(x >= kExpLo)) return x != x ? x : 0.0f;  // NaN stays NaN, below the range (and -inf) gives 0
  x = x < kExpHi ? x : kExpHi;
  const float n = std::nearbyint(x * kLog2e);
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float p = kC[7];
  for (int i = 6; i >= 0; --i) p = std::fma(p, r, kC[i]);
  const int32_t bits = ((int32_t)n + 127) << 23;
  float s;
  std::memcpy(&s, &bits, sizeof s);
  return p * s;
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 exp_avx2(__m256 x) {
  const __m256 below = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_NGE_UQ);  // x < lo or NaN
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 xin = x;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC[7]);
  for (int i = 6; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  return _mm256_blendv_ps(_mm256_andnot_ps(below, y), xin, nan);
}

// y[i] = exp(x[i] - shift) for i < n (in place allowed).
inline void exp_shifted(const float *x, float shift, float *y, int64_t n) {
  int64_t i = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(const float *x, float shift, float *y, int64_t n) {
        const __m256 s = _mm256_set1_ps(shift);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
        return i;
      }
    };
    i = K::run(x, shift, y, n);
  }
  for (; i < n; ++i) y[i] = exp_f32(x[i] - shift);
}

// g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u, each step rounded in fp32.
inline void silu_mul(float *g, const float *u, int64_t n) {
  int64_t i = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(float *g, const float *u, int64_t n) {
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
          const __m256 a = _mm256_loadu_ps(g + i);
          const __m256 d = _mm256_add_ps(one, exp_avx2(_mm256_sub_ps(zero, a)));
          _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(a, d), _mm256_loadu_ps(u + i)));
        }
        return i;
      }
    };
    i = K::run(g, u, n);
  }
  for (; i < n; ++i) g[i] = g[i] / (1.0f + exp_f32(0.0f - g[i])) * u[i];
}

}  // namespace simd_math
}  // namespace bnb_ms
