// simd_math.h -- elementwise math and row sums of the fused decoder, in the rounding of the unfused model.
//
// The fused decoder reproduces what transformers' eager forward computes on MindSpore 2.7's CPU kernels (the
// unfused model it replaces), operation by operation, so that a fused model's perplexity is the unfused one's
// (an LLM.int8() model amplifies any 1-ulp difference between layers: benchmarks/user_path_cpu.md).  Measured
// against MindSpore 2.7.0 on x86 (tests/test_ms_rounding.py re-checks every rule below on mindtorch's ops):
//
// exp(x) (MindSpore's Exp, Softmax and Sigmoid on CPU): x clamped to [-87.3365478515625, 88.72283935546875];
//   n = floor(x * log2(e) + 0.5); d = fma(-n, 0.693147f, x);
//   t = fma(d, fma(d, 1/120, 1/24), 1/6); t = fma(d, fma(d, t, 0.5), 1); e = fma(d, t, 1);
//   exp = (e * 2^(n-1)) * 2  (2^(n-1) from the exponent bits: n = -126 gives 0, n = 128 may give inf).
//   Its error is up to ~1e-5 relative near the clamps (the 0.693147f constant), ~1e-7 near 0; kept because it
//   is the unfused model's.  NaN stays NaN (ours).
// softmax sum (Softmax's sum of exponentials over a row): 8 lane accumulators, lane j % 8, over the row's whole
//   8-element blocks, the lanes then added in order 0..7 to 0, then the next 4 values (if 4 remain) as one
//   ordered sum, then the remaining values one by one.  (ReduceMean of a rank >= 3 tensor, RMSNorm's mean, sums in
//   double in order: decoder.cpp.)
// square (RMSNorm's pow(x, 2)): glibc's powf(x, 2), which is not always the rounded x * x (a near-tie is
//   rounded the other way in ~1e-3 of the values): x * x where the exact square is not near a tie, powf else.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "aot.h"
#include "cpu/cpu_features.h"

namespace bnb_ms {
namespace simd_math {

constexpr float kExpLo = -87.3365478515625f, kExpHi = 88.72283935546875f;  // log(FLT_MIN), log(FLT_MAX)
constexpr float kLog2e = 1.44269504088896341f, kLn2 = 0.693147f;
constexpr float kP1 = 1.0f / 120, kP2 = 1.0f / 24, kP3 = 1.0f / 6;

BNB_MS_INLINE float exp_ms_portable(float x) {
  if (x != x) return x;
  x = x > kExpLo ? x : kExpLo;
  x = x < kExpHi ? x : kExpHi;
  const float n = std::floor(x * kLog2e + 0.5f);
  const float d = std::fma(-n, kLn2, x);
  float t = std::fma(d, std::fma(d, kP1, kP2), kP3);
  t = std::fma(d, std::fma(d, t, 0.5f), 1.0f);
  const float e = std::fma(d, t, 1.0f);
  const int32_t bits = ((int32_t)n + 126) << 23;
  float s;
  std::memcpy(&s, &bits, sizeof s);
  return (e * s) * 2.0f;
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 exp_ms_avx2(__m256 x) {
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 xin = x;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLo)), _mm256_set1_ps(kExpHi));
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f)));
  const __m256 d = _mm256_fmadd_ps(_mm256_sub_ps(_mm256_setzero_ps(), n), _mm256_set1_ps(kLn2), x);
  __m256 t = _mm256_fmadd_ps(d, _mm256_fmadd_ps(d, _mm256_set1_ps(kP1), _mm256_set1_ps(kP2)), _mm256_set1_ps(kP3));
  t = _mm256_fmadd_ps(d, _mm256_fmadd_ps(d, t, _mm256_set1_ps(0.5f)), _mm256_set1_ps(1.0f));
  const __m256 e = _mm256_fmadd_ps(d, t, _mm256_set1_ps(1.0f));
  const __m256i s = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(e, _mm256_castsi256_ps(s)), _mm256_set1_ps(2.0f));
  return _mm256_blendv_ps(y, xin, nan);
}

// y[i] = exp(x[i] - shift) for i < n (in place allowed).
inline void exp_shifted(const float *x, float shift, float *y, int64_t n) {
  int64_t i = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(const float *x, float shift, float *y, int64_t n) {
        const __m256 s = _mm256_set1_ps(shift);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_ms_avx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
        return i;
      }
    };
    i = K::run(x, shift, y, n);
  }
  for (; i < n; ++i) y[i] = exp_ms_portable(x[i] - shift);
}

// g[i] = silu(g[i]) * u[i] as the unfused model computes it: (g * sigmoid(g)) * u, sigmoid = 1 / (1 + exp(-g)),
// each step rounded in fp32.
inline void silu_mul(float *g, const float *u, int64_t n) {
  int64_t i = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(float *g, const float *u, int64_t n) {
        const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
          const __m256 a = _mm256_loadu_ps(g + i);
          const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp_ms_avx2(_mm256_sub_ps(zero, a))));
          _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_mul_ps(a, s), _mm256_loadu_ps(u + i)));
        }
        return i;
      }
    };
    i = K::run(g, u, n);
  }
  for (; i < n; ++i) g[i] = (g[i] * (1.0f / (1.0f + exp_ms_portable(0.0f - g[i])))) * u[i];
}

// ---- an fp16 model's rounding (the *_r16 entries of decoder.cpp) ----
// MindSpore's CPU ops on fp16 tensors compute each op in fp32 and round the result to fp16 (Mul, Add, Div,
// MatMul / BatchMatMul: the fp32 sum, in the fp32 kernel's order, rounded once; RMSNorm runs in fp32 in the
// model's code and casts): the fused path keeps fp32 buffers holding fp16 values and rounds where the unfused
// fp16 model does.  Its fp16 Softmax (sdpa calls it without a dtype) and Sigmoid call glibc's expf on the fp32
// value of an fp16 input and round: exp16(x) = r16(expf(x)); sigmoid16(g) = r16(1 / r16(1 + exp16(-g))).
// Both are functions of an fp16 value, so they are tables over its 65536 bit patterns, built once with this
// process's expf (the unfused model's own; every fp16 input checked: tests/test_ms_rounding.py).
BNB_MS_INLINE float r16(float x) { return fp16_to_f32(f32_to_fp16(x)); }

struct Fp16Tables {
  uint16_t exp[65537], sigmoid[65537];  // fp16 bits by fp16 bits (+1 entry: 4-byte gathers read past the last)
  Fp16Tables() {
    for (uint32_t h = 0; h < 65536; ++h) exp[h] = f32_to_fp16(std::exp(fp16_to_f32((uint16_t)h)));
    for (uint32_t h = 0; h < 65536; ++h)
      sigmoid[h] = f32_to_fp16(1.0f / r16(1.0f + fp16_to_f32(exp[h ^ 0x8000u])));
    exp[65536] = sigmoid[65536] = 0;
  }
};
inline const Fp16Tables &fp16_tables() {
  static const Fp16Tables t;
  return t;
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 r16_avx2(__m256 x) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}
// tab[fp16 bits of x] widened, for 8 lanes holding fp16 values
BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 lookup16_avx2(const uint16_t *tab, __m256 x) {
  const __m256i idx = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  const __m256i v = _mm256_and_si256(_mm256_i32gather_epi32((const int *)tab, idx, 2), _mm256_set1_epi32(0xffff));
  return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}
BNB_MS_INLINE float lookup16(const uint16_t *tab, float x) { return fp16_to_f32(tab[f32_to_fp16(x)]); }

// x[i] = r16(x[i]) for i < n (vcvtps2ph rounds to nearest even, as f32_to_fp16).
inline void round16(float *x, int64_t n) {
  int64_t i = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(float *x, int64_t n) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, r16_avx2(_mm256_loadu_ps(x + i)));
        return i;
      }
    };
    i = K::run(x, n);
  }
  for (; i < n; ++i) x[i] = r16(x[i]);
}

// RoPE of one head in an fp16 model: p[i] = r16(r16(a c) - r16(b s)), p[i + h2] = r16(r16(b c) + r16(a s)) with
// a = p[i], b = p[i + h2] (q * cos + rotate_half(q) * sin as fp16 ops; rotate_half's -b is exact).
inline void rope_r16(float *p, const float *cs, const float *sn, int64_t h2) {
  int64_t i = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(float *p, const float *cs, const float *sn, int64_t h2) {
        int64_t i = 0;
        for (; i + 8 <= h2; i += 8) {
          const __m256 a = _mm256_loadu_ps(p + i), b = _mm256_loadu_ps(p + i + h2);
          const __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
          _mm256_storeu_ps(p + i, r16_avx2(_mm256_sub_ps(r16_avx2(_mm256_mul_ps(a, c)), r16_avx2(_mm256_mul_ps(b, s)))));
          _mm256_storeu_ps(p + i + h2, r16_avx2(_mm256_add_ps(r16_avx2(_mm256_mul_ps(b, c)), r16_avx2(_mm256_mul_ps(a, s)))));
        }
        return i;
      }
    };
    i = K::run(p, cs, sn, h2);
  }
  for (; i < h2; ++i) {
    const float a = p[i], b = p[i + h2];
    p[i] = r16(r16(a * cs[i]) - r16(b * sn[i]));
    p[i + h2] = r16(r16(b * cs[i]) + r16(a * sn[i]));
  }
}

// x[i] = r16(r16(x[i]) * k) for i < n (a product's fp16 result, then an fp16 Mul by a constant k: the scaled
// scores of an fp16 model).
inline void round16_scale(float *x, float k, int64_t n) {
  round16(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] *= k;
  round16(x, n);
}

// silu_mul of an fp16 model (g, u hold fp16 values): silu = r16(g * sigmoid16(g)), then r16(silu * u).
inline void silu_mul_r16(float *g, const float *u, int64_t n) {
  const uint16_t *sig = fp16_tables().sigmoid;
  int64_t i = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(const uint16_t *sig, float *g, const float *u, int64_t n) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
          const __m256 a = _mm256_loadu_ps(g + i);
          const __m256 si = r16_avx2(_mm256_mul_ps(a, lookup16_avx2(sig, a)));
          _mm256_storeu_ps(g + i, r16_avx2(_mm256_mul_ps(si, _mm256_loadu_ps(u + i))));
        }
        return i;
      }
    };
    i = K::run(sig, g, u, n);
  }
  for (; i < n; ++i) g[i] = r16(r16(g[i] * lookup16(sig, g[i])) * u[i]);
}

// Softmax of an fp16 row (MindSpore's fp16 kernel): d = r16(x - max), e = exp16(d), the sum of e in fp32 in
// order, p = r16(e / r16(sum)).  In place on p[j0, n) (p[0, j0) zeros, the keys after n masked: 0 in the sum).
inline void softmax_row_r16(float *p, int64_t j0, int64_t n, float mx) {
  const uint16_t *ex = fp16_tables().exp;
  int64_t j = j0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(const uint16_t *ex, float *p, int64_t j, int64_t n, float mx) {
        const __m256 m = _mm256_set1_ps(mx);
        for (; j + 8 <= n; j += 8)
          _mm256_storeu_ps(p + j, lookup16_avx2(ex, r16_avx2(_mm256_sub_ps(_mm256_loadu_ps(p + j), m))));
        return j;
      }
    };
    j = K::run(ex, p, j, n, mx);
  }
  for (; j < n; ++j) p[j] = lookup16(ex, r16(p[j] - mx));
  float sum = 0.0f;
  for (j = j0; j < n; ++j) sum += p[j];
  const float s16 = r16(sum);
  for (j = j0; j < n; ++j) p[j] = p[j] / s16;
  round16(p + j0, n - j0);
}

// The unfused model's Softmax sum of a row of length L whose values are v[0, n) (n <= L; the rest are zeros,
// which leave every partial sum unchanged).
inline float softmax_sum(const float *v, int64_t n, int64_t L) {
  const int64_t L8 = L / 8 * 8, n8 = n < L8 ? n : L8;
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(const float *v, int64_t n8, float *lane) {
        __m256 acc = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= n8; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(v + j));
        _mm256_storeu_ps(lane, acc);
        return j;
      }
    };
    j = K::run(v, n8, lane);
  }
  for (; j < n8; ++j) lane[j & 7] += v[j];
  float tot = 0.0f;
  for (int l = 0; l < 8; ++l) tot += lane[l];
  j = L8;
  if (L - L8 >= 4) {
    float t4 = 0.0f;
    for (int64_t i = L8; i < L8 + 4 && i < n; ++i) t4 += v[i];
    tot += t4;
    j = L8 + 4;
  }
  for (; j < n; ++j) tot += v[j];
  return tot;
}

// x^2 as glibc's powf(x, 2) gives it (RMSNorm's pow): the rounded x * x unless the exact square lies within
// kPowTie ulp of a tie, where powf decides.  tools/dev/powf_square_check.cpp compared the two over every
// float: they differ only within 0.0017 ulp of a tie (the same 6061 values in every binade of x); kPowTie leaves a 6x margin.
constexpr float kPowTie = 0.01f;
inline float square_powf(float x) {
  static float (*volatile pw)(float, float) = powf;  // (through a pointer: a compiler folds powf(x, 2) to x * x)
  const float p = x * x;
  if (!(p >= 0x1p-100f) || !(p <= 3.4028235e38f)) return pw(x, 2.0f);  // tiny (half an ulp below), 0, inf, NaN
  const float err = std::fma(x, x, -p);  // the exact square is p + err
  uint32_t pb;
  std::memcpy(&pb, &p, sizeof pb);
  const uint32_t hb = (pb & 0x7f800000u) - (24u << 23);  // half an ulp of p
  float half;
  std::memcpy(&half, &hb, sizeof half);
  return std::fabs(std::fabs(err) - half) <= kPowTie * 2.0f * half ? pw(x, 2.0f) : p;
}

// sq[i] = square_powf(x[i]) for i < n: the rounded squares 8 at a time, powf for the lanes near a tie.
inline void squares_powf(const float *x, float *sq, int64_t n) {
  int64_t i = 0;
  if (has_avx2()) {
    struct K {
      BNB_MS_TARGET_AVX2 static int64_t run(const float *x, float *sq, int64_t n) {
        const __m256 lo = _mm256_set1_ps(0x1p-100f), hi = _mm256_set1_ps(3.4028235e38f);
        const __m256 tie = _mm256_set1_ps(kPowTie * 2.0f), abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        const __m256i expo = _mm256_set1_epi32(0x7f800000), shift = _mm256_set1_epi32(24 << 23);
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
          const __m256 v = _mm256_loadu_ps(x + i), p = _mm256_mul_ps(v, v);
          const __m256 err = _mm256_and_ps(_mm256_fmsub_ps(v, v, p), abs);
          const __m256 half = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(p), expo), shift));
          const __m256 off = _mm256_and_ps(_mm256_sub_ps(err, half), abs);
          const __m256 bad = _mm256_or_ps(_mm256_cmp_ps(off, _mm256_mul_ps(tie, half), _CMP_LE_OQ),
                                          _mm256_or_ps(_mm256_cmp_ps(p, lo, _CMP_NGE_UQ), _mm256_cmp_ps(p, hi, _CMP_NLE_UQ)));
          _mm256_storeu_ps(sq + i, p);
          if (_mm256_movemask_ps(bad))
            for (int l = 0; l < 8; ++l) sq[i + l] = square_powf(x[i + l]);
        }
        return i;
      }
    };
    i = K::run(x, sq, n);
  }
  for (; i < n; ++i) sq[i] = square_powf(x[i]);
}

}  // namespace simd_math
}  // namespace bnb_ms
