// weightonly.cpp -- weight-only per-output-channel int8 / int4 linear (W8A16 / W4A16), the scheme of
// ChatGLM-6B's quantized checkpoints (THUDM, quantization.py): a [N, K] weight is stored as
//   scale[n] = max_k |W[n, k]| / qmax        (qmax = 127 for int8, 7 for int4; fp32 here)
//   q[n, k]  = round_half_even(W[n, k] / scale[n]) clamped to [-qmax, qmax]   (0 where scale == 0)
// as torch computes the scheme: a row holding NaN gets scale NaN (the max propagates it; the quiet NaN
// 0x7fc00000) and codes 0; a row holding inf gets scale inf and codes 0 (inf / inf is NaN, cast as 0), so
// either row dequantizes to NaN and poisons only its own outputs.
// int4: two signed (two's complement) nibbles per byte, row by row: byte j of row n holds k = 2j in the
// high nibble and k = 2j+1 in the low one; an odd K pads each row with a zero nibble (row stride (K+1)/2).
//
// Ops (entry points at the bottom):
//   cquantize_weight_only_int{8,4}_{fp32,fp16,bf16}:  W T[N, K] -> q i8[N, K] | u8[N, (K+1)/2], scale f32[N]
//   cdequantize_weight_only_int{8,4}_{fp32,fp16,bf16}: q, scale -> W' T[N, K] = q * scale (fp32, rounded to T)
//   cgemm_weight_only_int{8,4}_{fp32,fp16,bf16}:        A T[..., K], q, scale -> out T[..., N]
//       out[m, n] = scale[n] * sum_k A[m, k] * q[n, k]: the quantized weight is read once per row of A
//       and widened in registers (never materialised in floating point); fp32 accumulation in 16 fixed
//       lanes (lane = k mod 16, fused multiply-add, fixed reduction tree), so the portable, AVX2 and AVX-512
//       paths give identical bits.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "aot.h"
#include "checks/weightonly.h"
#include "cpu/cpu_features.h"
#include "cpu/parallel.h"

namespace bnb_ms {
namespace {

constexpr float kWoNaN = __builtin_nanf("");  // 0x7fc00000, the CUDA library's too

BNB_MS_INLINE float wo_reduce16(const float *acc) {
  float t[8], u[4];
  for (int l = 0; l < 8; ++l) t[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) u[l] = t[l] + t[l + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

template <int BITS>
BNB_MS_INLINE float wq(const uint8_t *row, int64_t k) {
  if (BITS == 8) return (float)(int8_t)row[k];
  const int8_t b = (int8_t)row[k >> 1];
  return (float)((k & 1) ? (int8_t)(b << 4) >> 4 : b >> 4);
}

// Scalar lanes for k in [k0, K) added to acc (same fma sequence the SIMD paths end with).
template <int BITS>
BNB_MS_INLINE void tail_lanes(const uint8_t *row, const float *a, int64_t k0, int64_t K, float *acc) {
  for (int64_t k = k0; k < K; ++k) acc[k & 15] = std::fma(a[k], wq<BITS>(row, k), acc[k & 15]);
}

template <int BITS>
float gemm_weight_only_portable(const uint8_t *row, const float *a, int64_t K) {
  float acc[16] = {0};
  tail_lanes<BITS>(row, a, 0, K, acc);
  return wo_reduce16(acc);
}

// 16 weights starting at k (k % 16 == 0) as two fp32 vectors.
template <int BITS>
BNB_MS_TARGET_AVX2 BNB_MS_INLINE void load16_avx2(const uint8_t *row, int64_t k, __m256 *w0, __m256 *w1) {
  if (BITS == 8) {
    const __m128i b = _mm_loadu_si128((const __m128i *)(row + k));
    *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
  } else {
    const __m128i x = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(row + (k >> 1))));
    const __m128i hi = _mm_srai_epi16(x, 4), lo = _mm_srai_epi16(_mm_slli_epi16(x, 12), 12);
    *w0 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_unpacklo_epi16(hi, lo)));
    *w1 = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm_unpackhi_epi16(hi, lo)));
  }
}

template <int BITS>
BNB_MS_TARGET_AVX2 float gemm_weight_only_avx2(const uint8_t *row, const float *a, int64_t K) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256 w0, w1;
    load16_avx2<BITS>(row, k, &w0, &w1);
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k), w0, acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + k + 8), w1, acc1);
  }
  alignas(32) float acc[16];
  _mm256_store_ps(acc, acc0);
  _mm256_store_ps(acc + 8, acc1);
  tail_lanes<BITS>(row, a, k, K, acc);
  return wo_reduce16(acc);
}

template <int BITS>
BNB_MS_TARGET_AVX512 float gemm_weight_only_avx512(const uint8_t *row, const float *a, int64_t K) {
  __m512 acc = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 w;
    if (BITS == 8) {
      w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(row + k))));
    } else {
      const __m128i x = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(row + (k >> 1))));
      const __m128i hi = _mm_srai_epi16(x, 4), lo = _mm_srai_epi16(_mm_slli_epi16(x, 12), 12);
      const __m256i v = _mm256_set_m128i(_mm_unpackhi_epi16(hi, lo), _mm_unpacklo_epi16(hi, lo));
      w = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(v));
    }
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), w, acc);
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, acc);
  tail_lanes<BITS>(row, a, k, K, out);
  return wo_reduce16(out);
}

template <class T, int BITS>
void gemm_weight_only(const T *A, const uint8_t *q, const float *scale, T *out, int64_t M, int64_t N, int64_t K) {
  std::vector<float> a32((size_t)(M * K));
  for (int64_t i = 0; i < M * K; ++i) a32[(size_t)i] = to_f32(A[i]);
  const SimdLevel lvl = simd_level();
  const int64_t rb = checks::wo_row_bytes(BITS, K);
  parallel_for(N, std::max<int64_t>(1, 16384 / std::max<int64_t>(K * std::max<int64_t>(M, 1), 1)),
               [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t *row = q + n * rb;
      for (int64_t m = 0; m < M; ++m) {
        const float *a = a32.data() + m * K;
        float r;
        if (lvl >= SimdLevel::avx512) r = gemm_weight_only_avx512<BITS>(row, a, K);
        else if (lvl >= SimdLevel::avx2) r = gemm_weight_only_avx2<BITS>(row, a, K);
        else r = gemm_weight_only_portable<BITS>(row, a, K);
        out[m * N + n] = from_f32<T>(r * scale[n]);
      }
    }
  });
}

// ---- entry points: checks in checks/weightonly.h (shared with the CUDA library) -----------------
template <class T, int BITS>
int quantize_wo_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::QuantizeWeightOnly<T> a;
  if (int s = checks::quantize_weight_only<T, BITS>(c, &a)) return s;
  const int64_t N = a.N, K = a.K, rb = a.rb;
  if (a.empty) {
    if (N && a.scale) std::memset(a.scale, 0, sizeof(float) * (size_t)N);
    return OK;
  }
  const float qmax = BITS == 8 ? 127.0f : 7.0f;
  parallel_for(N, std::max<int64_t>(1, 16384 / K), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const T *r = a.W + n * K;
      float am = 0.0f;
      bool nan = false;
      for (int64_t k = 0; k < K; ++k) {
        const float x = to_f32(r[k]);
        nan |= std::isnan(x);
        am = std::max(am, std::fabs(x));
      }
      const float s = nan ? kWoNaN : am / qmax;
      a.scale[n] = s;
      uint8_t *o = a.q + n * rb;
      if (BITS == 4) std::memset(o, 0, (size_t)rb);
      for (int64_t k = 0; k < K; ++k) {
        float v = s > 0.0f ? std::nearbyint(to_f32(r[k]) / s) : 0.0f;
        if (std::isnan(v)) v = 0.0f;  // inf / inf in a row holding inf
        v = std::min(qmax, std::max(-qmax, v));
        const int iv = (int)v;
        if (BITS == 8) o[k] = (uint8_t)(int8_t)iv;
        else o[k >> 1] |= (uint8_t)((k & 1) ? (iv & 0xF) : ((iv & 0xF) << 4));
      }
    }
  });
  return OK;
}

template <class T, int BITS>
int dequantize_wo_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::DequantizeWeightOnly<T> a;
  if (int s = checks::dequantize_weight_only<T, BITS>(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t K = a.K, rb = a.rb;
  const uint8_t *q = a.q;
  const float *sc = a.scale;
  T *o = a.out;
  parallel_for(a.N, std::max<int64_t>(1, 65536 / K), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n)
      for (int64_t k = 0; k < K; ++k) o[n * K + k] = from_f32<T>(wq<BITS>(q + n * rb, k) * sc[n]);
  });
  return OK;
}

template <class T, int BITS>
int gemm_wo_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::GemmWeightOnly<T> a;
  if (int s = checks::gemm_weight_only<T, BITS>(c, &a)) return s;
  if (a.empty) return OK;
  gemm_weight_only<T, BITS>(a.A, a.q, a.scale, a.out, a.M, a.N, a.K);
  return OK;
}

}  // namespace
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cquantize_weight_only_int8_fp32, bnb_ms::quantize_wo_entry<float, 8>)
BNB_MS_ENTRY(cquantize_weight_only_int4_fp32, bnb_ms::quantize_wo_entry<float, 4>)
BNB_MS_ENTRY(cdequantize_weight_only_int8_fp32, bnb_ms::dequantize_wo_entry<float, 8>)
BNB_MS_ENTRY(cdequantize_weight_only_int4_fp32, bnb_ms::dequantize_wo_entry<float, 4>)
BNB_MS_ENTRY(cgemm_weight_only_int8_fp32, bnb_ms::gemm_wo_entry<float, 8>)
BNB_MS_ENTRY(cgemm_weight_only_int4_fp32, bnb_ms::gemm_wo_entry<float, 4>)
BNB_MS_ENTRY(cquantize_weight_only_int8_fp16, bnb_ms::quantize_wo_entry<fp16_t, 8>)
BNB_MS_ENTRY(cquantize_weight_only_int4_fp16, bnb_ms::quantize_wo_entry<fp16_t, 4>)
BNB_MS_ENTRY(cdequantize_weight_only_int8_fp16, bnb_ms::dequantize_wo_entry<fp16_t, 8>)
BNB_MS_ENTRY(cdequantize_weight_only_int4_fp16, bnb_ms::dequantize_wo_entry<fp16_t, 4>)
BNB_MS_ENTRY(cgemm_weight_only_int8_fp16, bnb_ms::gemm_wo_entry<fp16_t, 8>)
BNB_MS_ENTRY(cgemm_weight_only_int4_fp16, bnb_ms::gemm_wo_entry<fp16_t, 4>)
BNB_MS_ENTRY(cquantize_weight_only_int8_bf16, bnb_ms::quantize_wo_entry<bf16_t, 8>)
BNB_MS_ENTRY(cquantize_weight_only_int4_bf16, bnb_ms::quantize_wo_entry<bf16_t, 4>)
BNB_MS_ENTRY(cdequantize_weight_only_int8_bf16, bnb_ms::dequantize_wo_entry<bf16_t, 8>)
BNB_MS_ENTRY(cdequantize_weight_only_int4_bf16, bnb_ms::dequantize_wo_entry<bf16_t, 4>)
BNB_MS_ENTRY(cgemm_weight_only_int8_bf16, bnb_ms::gemm_wo_entry<bf16_t, 8>)
BNB_MS_ENTRY(cgemm_weight_only_int4_bf16, bnb_ms::gemm_wo_entry<bf16_t, 4>)
