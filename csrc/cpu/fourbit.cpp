// fourbit.cpp -- 4-bit blockwise quantization (NF4 / FP4; QLoRA, Dettmers et al., arXiv 2305.14314)
// and the batch-1 4-bit inference GEMV.
//
// Numerics follow upstream bitsandbytes 0.50.2 on CPU (its default torch implementation of
// quantize_4bit, which the fixtures in compat_tests/fixtures/fourbit.npz pin):
//   * Input is widened to fp32.  Full blocks: absmax = max|x|, v = clamp(x * (1 / max(absmax, 1e-38)), -1, 1)
//     and the stored absmax is the raw max (0 for an all-zero block).  The trailing partial block
//     divides instead: v = clamp(x / am, -1, 1) with am = max(max|x|, 1e-38), and stores am.
//   * The 4-bit value is the code index of the bucket of v among the midpoints of the code sorted by
//     value (a stable argsort): bucket = #{midpoints m : !(v <= m)} (torch.bucketize, right=False; a
//     value equal to a midpoint goes to the lower bucket, NaN to the last one).
//   * Two values per byte: element 2j in the high nibble, 2j+1 in the low nibble; an odd count is
//     padded with the code of 0.
// Dequantize: out = code[nibble] * absmax[block] in fp32, rounded to the output dtype.
// GEMV: out[n] = sum_k A[k] * (code[q(n, k)] * absmax[block(n*K + k)]), fp32 accumulation in 16
// fixed lanes (lane = position within a 16-element group of a block segment) so the scalar, AVX2 and
// AVX-512 paths give identical bits; the packed weight is read once and decoded in registers.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "aot.h"
#include "cpu/cpu_features.h"
#include "cpu/parallel.h"

namespace bnb_ms {
namespace {

constexpr int kCode4 = 16;

struct Bounds4 {
  float mid[kCode4 - 1];
  uint8_t order[kCode4];
  uint8_t zero_code;  // code of 0.0 (padding of an odd element count)
};

void make_bounds(const float *code, Bounds4 *b) {
  int idx[kCode4];
  for (int i = 0; i < kCode4; ++i) idx[i] = i;
  std::stable_sort(idx, idx + kCode4, [&](int x, int y) { return code[x] < code[y]; });
  for (int i = 0; i < kCode4; ++i) b->order[i] = (uint8_t)idx[i];
  for (int i = 0; i < kCode4 - 1; ++i) b->mid[i] = (code[idx[i]] + code[idx[i + 1]]) / 2.0f;
  int z = 0;
  for (int i = 0; i < kCode4 - 1; ++i) z += !(0.0f <= b->mid[i]);
  b->zero_code = b->order[z];
}

BNB_MS_INLINE uint8_t bucket(const Bounds4 &b, float v) {
  int c = 0;
  for (int i = 0; i < kCode4 - 1; ++i) c += !(v <= b.mid[i]);
  return b.order[c];
}

BNB_MS_INLINE float clamp1(float v) { return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v); }  // keeps NaN

template <class T>
void quantize4_blocks(const Bounds4 &bd, const T *A, float *absmax, uint8_t *out, int64_t bs, int64_t n,
                      int64_t b0, int64_t b1) {
  const int64_t full_blocks = n / bs;
  float vals[2];
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t s = blk * bs, e = std::min(s + bs, n);
    float amax = 0.0f;
    bool nan = false;
    for (int64_t i = s; i < e; ++i) {
      const float a = std::fabs(to_f32(A[i]));
      if (a != a) nan = true;
      amax = a > amax ? a : amax;
    }
    if (nan) amax = NAN;
    const bool partial = blk >= full_blocks;
    const float am = amax > 1e-38f || amax != amax ? amax : 1e-38f;
    absmax[blk] = partial ? am : amax;
    const float inv = 1.0f / am;
    // s is even (bs is even), so the block starts on a byte boundary
    for (int64_t i = s; i < e; i += 2) {
      for (int k = 0; k < 2; ++k) {
        if (i + k < e) {
          const float x = to_f32(A[i + k]);
          vals[k] = clamp1(partial ? x / am : x * inv);
        }
      }
      const uint8_t hi = bucket(bd, vals[0]);
      const uint8_t lo = i + 1 < e ? bucket(bd, vals[1]) : bd.zero_code;
      out[i >> 1] = (uint8_t)((hi << 4) | lo);
    }
  }
}

// ---- dequantize --------------------------------------------------------------------------------
BNB_MS_INLINE float nib(const uint8_t *q, int64_t i) { return (float)((q[i >> 1] >> ((i & 1) ? 0 : 4)) & 15); }

template <class T>
void dequantize4_generic(const float *code, const uint8_t *q, const float *absmax, T *out, int64_t bs, int64_t n,
                         int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n);
    const float sc = absmax[b];
    for (int64_t i = s; i < e; ++i) out[i] = from_f32<T>(code[(int)nib(q, i)] * sc);
  }
}

// AVX2 helpers: 8 floats from T, 8 floats to T, 16 nibbles (8 bytes) to two index vectors.
template <class T> BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 ld8(const T *p);
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 ld8<float>(const float *p) { return _mm256_loadu_ps(p); }
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 ld8<fp16_t>(const fp16_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 ld8<bf16_t>(const bf16_t *p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
template <class T> BNB_MS_TARGET_AVX2 BNB_MS_INLINE void st8(T *p, __m256 v);
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE void st8<float>(float *p, __m256 v) { _mm256_storeu_ps(p, v); }
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE void st8<fp16_t>(fp16_t *p, __m256 v) {
  _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
template <> BNB_MS_TARGET_AVX2 BNB_MS_INLINE void st8<bf16_t>(bf16_t *p, __m256 v) {
  // code*absmax is never NaN for finite absmax; NaN handled like f32_to_bf16 anyway
  const __m256i b = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i q = _mm256_or_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, q, nan);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128((__m128i *)p, packed);
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE void nibbles16_avx2(const uint8_t *p, __m256i *i0, __m256i *i1) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
  const __m256i hi = _mm256_srli_epi32(b, 4), lo = _mm256_and_si256(b, _mm256_set1_epi32(15));
  const __m256i ul = _mm256_unpacklo_epi32(hi, lo), uh = _mm256_unpackhi_epi32(hi, lo);
  *i0 = _mm256_permute2x128_si256(ul, uh, 0x20);
  *i1 = _mm256_permute2x128_si256(ul, uh, 0x31);
}
// 16-entry table lookup: two 8-entry permutes, blended on bit 3 of the index.
BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256 lut16_avx2(__m256 tlo, __m256 thi, __m256i idx) {
  const __m256 a = _mm256_permutevar8x32_ps(tlo, idx), b = _mm256_permutevar8x32_ps(thi, idx);
  return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

template <class T>
BNB_MS_TARGET_AVX2 void dequantize4_avx2(const float *code, const uint8_t *q, const float *absmax, T *out, int64_t bs,
                                         int64_t n, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n);
    const float sc = absmax[b];
    const __m256 vs = _mm256_set1_ps(sc);
    const __m256 tlo = _mm256_mul_ps(_mm256_loadu_ps(code), vs), thi = _mm256_mul_ps(_mm256_loadu_ps(code + 8), vs);
    int64_t i = s;
    for (; i + 16 <= e; i += 16) {
      __m256i i0, i1;
      nibbles16_avx2(q + (i >> 1), &i0, &i1);
      st8<T>(out + i, lut16_avx2(tlo, thi, i0));
      st8<T>(out + i + 8, lut16_avx2(tlo, thi, i1));
    }
    for (; i < e; ++i) out[i] = from_f32<T>(code[(int)nib(q, i)] * sc);
  }
}

template <class T> BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 ld16(const T *p);
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 ld16<float>(const float *p) { return _mm512_loadu_ps(p); }
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 ld16<fp16_t>(const fp16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
template <> BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512 ld16<bf16_t>(const bf16_t *p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512i nibbles16_avx512(const uint8_t *p) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
  const __m256i hi = _mm256_srli_epi32(b, 4), lo = _mm256_and_si256(b, _mm256_set1_epi32(15));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(hi), lo, 1);
  const __m512i perm = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  return _mm512_permutexvar_epi32(perm, both);
}

template <class T>
BNB_MS_TARGET_AVX512 void dequantize4_avx512(const float *code, const uint8_t *q, const float *absmax, T *out,
                                             int64_t bs, int64_t n, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n);
    const float sc = absmax[b];
    const __m512 tab = _mm512_mul_ps(_mm512_loadu_ps(code), _mm512_set1_ps(sc));
    int64_t i = s;
    for (; i + 16 <= e; i += 16) {
      const __m512 w = _mm512_permutexvar_ps(nibbles16_avx512(q + (i >> 1)), tab);
      st8<T>(out + i, _mm512_castps512_ps256(w));
      st8<T>(out + i + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));
    }
    for (; i < e; ++i) out[i] = from_f32<T>(code[(int)nib(q, i)] * sc);
  }
}

// ---- GEMV -------------------------------------------------------------------------------------
BNB_MS_INLINE float reduce16(const float *acc) {
  float t[8], u[4];
  for (int l = 0; l < 8; ++l) t[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; ++l) u[l] = t[l] + t[l + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

// Row n of the weight occupies flat elements [n*K, n*K + K).  `seg` calls f(seg_begin, seg_end, scale)
// for the parts of the row that lie in one absmax block.
template <class F>
BNB_MS_INLINE void for_segments(int64_t r0, int64_t K, int64_t bs, const float *absmax, F &&f) {
  int64_t i = r0;
  const int64_t e = r0 + K;
  while (i < e) {
    const int64_t blk = i / bs, be = std::min((blk + 1) * bs, e);
    f(i, be, absmax[blk]);
    i = be;
  }
}

template <class T>
float gemv_row_generic(const float *code, const uint8_t *q, const float *absmax, const T *a, int64_t K, int64_t bs,
                       int64_t r0) {
  float acc[16] = {0};
  for_segments(r0, K, bs, absmax, [&](int64_t s, int64_t e, float sc) {
    float tab[16];
    for (int j = 0; j < 16; ++j) tab[j] = code[j] * sc;
    for (int64_t g = s; g < e; g += 16) {
      for (int l = 0; l < 16; ++l) {
        const int64_t i = g + l;
        const float w = i < e ? tab[(int)nib(q, i)] : tab[0];
        const float x = i < e ? to_f32(a[i - r0]) : 0.0f;
        acc[l] = std::fma(w, x, acc[l]);
      }
    }
  });
  return reduce16(acc);
}

template <class T>
BNB_MS_TARGET_AVX2 float gemv_row_avx2(const float *code, const uint8_t *q, const float *absmax, const T *a, int64_t K,
                                       int64_t bs, int64_t r0) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const __m256 c0 = _mm256_loadu_ps(code), c1 = _mm256_loadu_ps(code + 8);
  for (int64_t s = r0, e; s < r0 + K; s = e) {
    e = std::min((s / bs + 1) * bs, r0 + K);
    const float sc = absmax[s / bs];
    const __m256 vs = _mm256_set1_ps(sc);
    const __m256 tlo = _mm256_mul_ps(c0, vs), thi = _mm256_mul_ps(c1, vs);
    int64_t g = s;
    for (; g + 16 <= e; g += 16) {
      __m256i i0, i1;
      nibbles16_avx2(q + (g >> 1), &i0, &i1);
      acc0 = _mm256_fmadd_ps(lut16_avx2(tlo, thi, i0), ld8<T>(a + (g - r0)), acc0);
      acc1 = _mm256_fmadd_ps(lut16_avx2(tlo, thi, i1), ld8<T>(a + (g - r0) + 8), acc1);
    }
    if (g < e) {  // zero-padded last group, same lanes as the scalar path
      alignas(32) float w[16], x[16];
      for (int l = 0; l < 16; ++l) {
        const int64_t i = g + l;
        w[l] = i < e ? code[(int)nib(q, i)] * sc : code[0] * sc;
        x[l] = i < e ? to_f32(a[i - r0]) : 0.0f;
      }
      acc0 = _mm256_fmadd_ps(_mm256_load_ps(w), _mm256_load_ps(x), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_load_ps(w + 8), _mm256_load_ps(x + 8), acc1);
    }
  }
  alignas(32) float acc[16];
  _mm256_store_ps(acc, acc0);
  _mm256_store_ps(acc + 8, acc1);
  return reduce16(acc);
}

template <class T>
BNB_MS_TARGET_AVX512 float gemv_row_avx512(const float *code, const uint8_t *q, const float *absmax, const T *a,
                                           int64_t K, int64_t bs, int64_t r0) {
  __m512 acc = _mm512_setzero_ps();
  const __m512 c = _mm512_loadu_ps(code);
  for (int64_t s = r0, e; s < r0 + K; s = e) {
    e = std::min((s / bs + 1) * bs, r0 + K);
    const float sc = absmax[s / bs];
    const __m512 tab = _mm512_mul_ps(c, _mm512_set1_ps(sc));
    int64_t g = s;
    for (; g + 16 <= e; g += 16)
      acc = _mm512_fmadd_ps(_mm512_permutexvar_ps(nibbles16_avx512(q + (g >> 1)), tab), ld16<T>(a + (g - r0)), acc);
    if (g < e) {
      alignas(64) float w[16], x[16];
      for (int l = 0; l < 16; ++l) {
        const int64_t i = g + l;
        w[l] = i < e ? code[(int)nib(q, i)] * sc : code[0] * sc;
        x[l] = i < e ? to_f32(a[i - r0]) : 0.0f;
      }
      acc = _mm512_fmadd_ps(_mm512_load_ps(w), _mm512_load_ps(x), acc);
    }
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, acc);
  return reduce16(out);
}

template <class T>
void gemv4(const float *code, const uint8_t *q, const float *absmax, const T *A, T *out, int64_t M, int64_t N,
           int64_t K, int64_t bs) {
  // The vector paths need every row to start on a byte boundary (K even); odd K uses the generic
  // path at every SIMD level, so the levels still agree bit for bit.
  const SimdLevel lvl = (K % 2 == 0) ? simd_level() : SimdLevel::scalar;
  parallel_for(N, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)), [&](int64_t n0, int64_t n1) {
    for (int64_t m = 0; m < M; ++m) {
      const T *a = A + m * K;
      for (int64_t n = n0; n < n1; ++n) {
        float r;
        if (lvl >= SimdLevel::avx512) r = gemv_row_avx512<T>(code, q, absmax, a, K, bs, n * K);
        else if (lvl >= SimdLevel::avx2) r = gemv_row_avx2<T>(code, q, absmax, a, K, bs, n * K);
        else r = gemv_row_generic<T>(code, q, absmax, a, K, bs, n * K);
        out[m * N + n] = from_f32<T>(r);
      }
    }
  });
}

// ---- entry points ------------------------------------------------------------------------------
// params: code f32[16], A T[...], blocksize i64 -> out u8[(n+1)/2, 1], absmax f32[ceil(n/bs)]
template <class T>
int quantize4_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  if (nparam != 5) return E_NPARAM;
  enum { CODE, A, BS, OUT, ABSMAX };
  int64_t bs;
  if (c.dtype(CODE) != DType::f32 || c.dtype(A) != dtype_of<T>() || c.dtype(OUT) != DType::u8 ||
      c.dtype(ABSMAX) != DType::f32)
    return E_DTYPE;
  if (!c.scalar_i64(BS, &bs) || bs <= 0 || bs % 2) return E_VALUE;
  const int64_t n = c.numel(A), nb = (n + bs - 1) / bs;
  if (c.numel(CODE) != kCode4 || c.numel(OUT) != (n + 1) / 2 || c.numel(ABSMAX) != nb) return E_SHAPE;
  if (n == 0) return OK;
  if (!c.params[CODE] || !c.params[A] || !c.params[OUT] || !c.params[ABSMAX]) return E_NULL;
  Bounds4 bd;
  make_bounds(c.ptr<float>(CODE), &bd);
  const T *a = c.ptr<T>(A);
  float *amax = c.ptr<float>(ABSMAX);
  uint8_t *o = c.ptr<uint8_t>(OUT);
  parallel_for(nb, std::max<int64_t>(1, 16384 / bs), [&](int64_t b0, int64_t b1) {
    quantize4_blocks<T>(bd, a, amax, o, bs, n, b0, b1);
  });
  return OK;
}

// params: code f32[16], A u8[>= (n+1)/2], absmax f32[ceil(n/bs)], blocksize i64, n i64 -> out T[n]
// FP4: bit 3 of a code is its sign, so code 8 (+0 in upstream's table) decodes to -0.0, as upstream's
// native CPU kernel does (its torch fallback for an odd last dimension gives +0.0; same value).
template <class T, bool FP4>
int dequantize4_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  if (nparam != 6) return E_NPARAM;
  enum { CODE, A, ABSMAX, BS, N, OUT };
  int64_t bs, n;
  if (c.dtype(CODE) != DType::f32 || c.dtype(A) != DType::u8 || c.dtype(ABSMAX) != DType::f32 ||
      c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  if (!c.scalar_i64(BS, &bs) || bs <= 0 || bs % 2 || !c.scalar_i64(N, &n) || n < 0) return E_VALUE;
  if (c.numel(CODE) != kCode4 || c.numel(OUT) != n || c.numel(A) < (n + 1) / 2 || c.numel(ABSMAX) < (n + bs - 1) / bs)
    return E_SHAPE;
  if (n == 0) return OK;
  if (!c.params[CODE] || !c.params[A] || !c.params[OUT] || !c.params[ABSMAX]) return E_NULL;
  alignas(64) float code[kCode4];
  std::memcpy(code, c.ptr<float>(CODE), sizeof(code));
  if (FP4 && code[8] == 0.0f) code[8] = -0.0f;
  const float *amax = c.ptr<float>(ABSMAX);
  const uint8_t *q = c.ptr<uint8_t>(A);
  T *o = c.ptr<T>(OUT);
  const SimdLevel lvl = simd_level();
  parallel_for((n + bs - 1) / bs, std::max<int64_t>(1, 65536 / bs), [&](int64_t b0, int64_t b1) {
    if (lvl >= SimdLevel::avx512) dequantize4_avx512<T>(code, q, amax, o, bs, n, b0, b1);
    else if (lvl >= SimdLevel::avx2) dequantize4_avx2<T>(code, q, amax, o, bs, n, b0, b1);
    else dequantize4_generic<T>(code, q, amax, o, bs, n, b0, b1);
  });
  return OK;
}

// params: A T[..., K] (M rows), B u8[>= (N*K+1)/2], absmax f32[ceil(N*K/bs)], code f32[16], blocksize i64,
// n_out i64 -> out T[..., N]
template <class T>
int gemv4_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  if (nparam != 7) return E_NPARAM;
  enum { A, B, ABSMAX, CODE, BS, NOUT, OUT };
  int64_t bs, N;
  if (c.dtype(A) != dtype_of<T>() || c.dtype(B) != DType::u8 || c.dtype(ABSMAX) != DType::f32 ||
      c.dtype(CODE) != DType::f32 || c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  if (!c.scalar_i64(BS, &bs) || bs <= 0 || bs % 2 || !c.scalar_i64(NOUT, &N) || N < 0) return E_VALUE;
  if (c.rank(A) < 1) return E_SHAPE;
  const int64_t K = c.cols(A), M = c.rows(A);
  if (c.numel(CODE) != kCode4 || c.numel(OUT) != M * N || c.numel(B) < (N * K + 1) / 2 ||
      c.numel(ABSMAX) < (N * K + bs - 1) / bs)
    return E_SHAPE;
  if (M * N == 0) return OK;
  if (!c.params[A] || !c.params[B] || !c.params[ABSMAX] || !c.params[CODE] || !c.params[OUT]) return E_NULL;
  T *o = c.ptr<T>(OUT);
  if (K == 0) {
    for (int64_t i = 0; i < M * N; ++i) o[i] = from_f32<T>(0.0f);
    return OK;
  }
  gemv4<T>(c.ptr<float>(CODE), c.ptr<uint8_t>(B), c.ptr<float>(ABSMAX), c.ptr<T>(A), o, M, N, K, bs);
  return OK;
}

}  // namespace
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
#define BNB_MS_FWD(...) return __VA_ARGS__(nparam, params, ndims, shapes, dtypes, stream, extra)
BNB_MS_EXPORT int cquantize_blockwise_fp32_fp4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::quantize4_entry<float>); }
BNB_MS_EXPORT int cquantize_blockwise_fp16_fp4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::quantize4_entry<fp16_t>); }
BNB_MS_EXPORT int cquantize_blockwise_bf16_fp4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::quantize4_entry<bf16_t>); }
BNB_MS_EXPORT int cquantize_blockwise_fp32_nf4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::quantize4_entry<float>); }
BNB_MS_EXPORT int cquantize_blockwise_fp16_nf4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::quantize4_entry<fp16_t>); }
BNB_MS_EXPORT int cquantize_blockwise_bf16_nf4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::quantize4_entry<bf16_t>); }
BNB_MS_EXPORT int cdequantize_blockwise_fp32_fp4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::dequantize4_entry<float, true>); }
BNB_MS_EXPORT int cdequantize_blockwise_fp16_fp4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::dequantize4_entry<fp16_t, true>); }
BNB_MS_EXPORT int cdequantize_blockwise_bf16_fp4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::dequantize4_entry<bf16_t, true>); }
BNB_MS_EXPORT int cdequantize_blockwise_fp32_nf4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::dequantize4_entry<float, false>); }
BNB_MS_EXPORT int cdequantize_blockwise_fp16_nf4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::dequantize4_entry<fp16_t, false>); }
BNB_MS_EXPORT int cdequantize_blockwise_bf16_nf4(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::dequantize4_entry<bf16_t, false>); }
BNB_MS_EXPORT int cgemm_4bit_inference_naive_fp32(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::gemv4_entry<float>); }
BNB_MS_EXPORT int cgemm_4bit_inference_naive_fp16(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::gemv4_entry<fp16_t>); }
BNB_MS_EXPORT int cgemm_4bit_inference_naive_bf16(BNB_MS_AOT_ARGS) { BNB_MS_FWD(bnb_ms::gemv4_entry<bf16_t>); }
