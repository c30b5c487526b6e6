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
// GEMV: out[n] = sum_k A[k] * code[q(n, k)] * absmax[block(n*K + k)], fp32 accumulation in fixed
// slots, scaled by absmax once per block (see the GEMV section), so the portable, AVX2 and AVX-512 paths
// give identical bits; the packed weight is read once and decoded in registers.
// bf16 compute (clinear_4bit_bf16dot_bf16, beside the exact path above, which it does not change): x and
// bf16(code * absmax) per block (RNE, bf16 denormals flushed), pairs accumulated in 16 fp32 lanes as vdpbf16ps
// does; the AVX512-BF16 kernel and the portable one give the same bits.  Bound vs the exact path per output:
// |dot - exact| <= 2^-6 (S + |bias|) + K 2^-22 S, S = sum_k |x_k w_k| (see the "bf16 compute" section).  One row
// (K % 128 == 0, power-of-two blocksize >= 64) has its own bf16 kernel: bf16(code) decoded in registers, scaled by
// absmax per 64-element half unit (the "one activation row" section), same bound.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "aot.h"
#include "checks/fourbit.h"
#include "cpu/amx_tiles.h"
#include "cpu/bf16_round.h"
#include "cpu/code256.h"
#include "cpu/cpu_features.h"
#include "cpu/linear_kernels.h"
#include "cpu/parallel.h"
#include "cpu/scratch.h"
#include "cpu/simd_convert.h"

namespace bnb_ms {
namespace {

constexpr int kCode4 = 16;

struct Bounds4 {
  float mid[kCode4 - 1];
  uint8_t order[kCode4];
  uint8_t zero_code;  // code of 0.0 (padding of an odd element count)
  bool sorted;        // mid non-decreasing and NaN-free: the SIMD binary search equals the count below
};

void fourbit_bounds(const float *code, Bounds4 *b) {
  int idx[kCode4];
  for (int i = 0; i < kCode4; ++i) idx[i] = i;
  std::stable_sort(idx, idx + kCode4, [&](int x, int y) { return code[x] < code[y]; });
  for (int i = 0; i < kCode4; ++i) b->order[i] = (uint8_t)idx[i];
  for (int i = 0; i < kCode4 - 1; ++i) b->mid[i] = (code[idx[i]] + code[idx[i + 1]]) / 2.0f;
  int z = 0;
  for (int i = 0; i < kCode4 - 1; ++i) z += !(0.0f <= b->mid[i]);
  b->zero_code = b->order[z];
  b->sorted = true;
  for (int i = 0; i < kCode4 - 1; ++i)
    if (b->mid[i] != b->mid[i] || (i > 0 && !(b->mid[i - 1] <= b->mid[i]))) b->sorted = false;
}

// The reference rule: the code of the bucket of v, bucket = #{i : !(v <= mid[i])}.
BNB_MS_INLINE uint8_t bucket(const Bounds4 &b, float v) {
  int c = 0;
  for (int i = 0; i < kCode4 - 1; ++i) c += !(v <= b.mid[i]);
  return b.order[c];
}

BNB_MS_INLINE float clamp1(float v) { return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v); }  // keeps NaN

// One block's scale.  amax: max|x| (NaN if the block has a NaN).  Full blocks multiply by 1 / max(amax, 1e-38)
// and store amax; the trailing partial block divides by am = max(amax, 1e-38) and stores am.
struct Scale4 {
  bool partial;
  float am, inv;
  Scale4(float amax, bool part, float *stored) : partial(part) {
    am = amax > 1e-38f || amax != amax ? amax : 1e-38f;
    *stored = partial ? am : amax;
    inv = 1.0f / am;
  }
  BNB_MS_INLINE float operator()(float x) const { return clamp1(partial ? x / am : x * inv); }
};

// Elements [i, e) of a block (i even): two codes per byte, an odd count padded with the code of 0.
template <class T>
BNB_MS_INLINE void quantize4_span(const Bounds4 &bd, const Scale4 &sc, const T *A, int64_t i, int64_t e, uint8_t *out) {
  for (; i < e; i += 2) {
    const uint8_t hi = bucket(bd, sc(to_f32(A[i])));
    const uint8_t lo = i + 1 < e ? bucket(bd, sc(to_f32(A[i + 1]))) : bd.zero_code;
    out[i >> 1] = (uint8_t)((hi << 4) | lo);
  }
}

// max|x| over [i, e) (NaN if any element is NaN), folded into amax / nan.
template <class T>
BNB_MS_INLINE void absmax4_span(const T *A, int64_t i, int64_t e, float *amax, bool *nan) {
  for (; i < e; ++i) {
    const float a = std::fabs(to_f32(A[i]));
    if (a != a) *nan = true;
    *amax = a > *amax ? a : *amax;
  }
}

// The scale of a block from the SIMD absmax: `top` is the integer max of |x|'s bits over [s, i) (every NaN is
// above +inf there), the rest [i, e) goes through absmax4_span.
template <class T>
BNB_MS_INLINE Scale4 scale4_from_bits(uint32_t top, const T *A, int64_t i, int64_t e, bool partial, float *stored) {
  float amax;
  std::memcpy(&amax, &top, 4);
  bool nan = top > 0x7f800000u;
  absmax4_span(A, i, e, &amax, &nan);
  return Scale4(nan ? NAN : amax, partial, stored);
}

// ---- portable path: the reference --------------------------------------------------------------
template <class T>
void quantize_4bit_portable(const Bounds4 &bd, const T *A, float *absmax, uint8_t *out, int64_t bs, int64_t n,
                            int64_t b0, int64_t b1) {
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t s = blk * bs, e = std::min(s + bs, n);
    float amax = 0.0f;
    bool nan = false;
    absmax4_span(A, s, e, &amax, &nan);
    const Scale4 sc(nan ? NAN : amax, e - s < bs, absmax + blk);
    quantize4_span(bd, sc, A, s, e, out);  // s is even (bs is even): the block starts on a byte boundary
  }
}

// ---- SIMD paths: absmax as an integer max of |x|'s bits (every NaN is above +inf), the bucket by a
// branchless binary search over the sorted midpoints (compare "not <=", true for NaN, as the count), the
// codes mapped through `order` with one byte shuffle and paired into nibbles; 32 elements per step, the
// rest of a block by quantize4_span.  Needs bd.sorted (else the portable path runs).
constexpr int kQ4Group = 32;

// AVX2: the bucket of 8 values.  Levels 3 and 4 look their midpoint up with 8-lane permutes.
struct Search4Avx2 {
  __m256 m7, m3, m11, l3, l4;
  BNB_MS_TARGET_AVX2 explicit Search4Avx2(const Bounds4 &b) {
    m7 = _mm256_set1_ps(b.mid[7]); m3 = _mm256_set1_ps(b.mid[3]); m11 = _mm256_set1_ps(b.mid[11]);
    l3 = _mm256_setr_ps(b.mid[1], b.mid[5], b.mid[9], b.mid[13], 0.0f, 0.0f, 0.0f, 0.0f);
    l4 = _mm256_setr_ps(b.mid[0], b.mid[2], b.mid[4], b.mid[6], b.mid[8], b.mid[10], b.mid[12], b.mid[14]);
  }
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256i operator()(__m256 v) const {
    const __m256 p3 = _mm256_cmp_ps(v, m7, _CMP_NLE_UQ);
    const __m256 p2 = _mm256_cmp_ps(v, _mm256_blendv_ps(m3, m11, p3), _CMP_NLE_UQ);
    // k = 2 b3 + b2 (a true compare is -1)
    const __m256i k = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(p3), _mm256_set1_epi32(2)),
                                       _mm256_castps_si256(p2));
    const __m256 p1 = _mm256_cmp_ps(v, _mm256_permutevar8x32_ps(l3, k), _CMP_NLE_UQ);
    const __m256i k2 = _mm256_sub_epi32(_mm256_slli_epi32(k, 1), _mm256_castps_si256(p1));
    const __m256 p0 = _mm256_cmp_ps(v, _mm256_permutevar8x32_ps(l4, k2), _CMP_NLE_UQ);
    return _mm256_sub_epi32(_mm256_slli_epi32(k2, 1), _mm256_castps_si256(p0));
  }
};

template <class T>
BNB_MS_TARGET_AVX2 void quantize_4bit_avx2(const Bounds4 &bd, const T *A, float *absmax, uint8_t *out, int64_t bs,
                                           int64_t n, int64_t b0, int64_t b1) {
  const Search4Avx2 search(bd);
  const __m256i order = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bd.order));
  const __m256i pair = _mm256_set1_epi16(0x0110);  // byte 2j * 16 + byte 2j+1
  const __m256i fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i absbits = _mm256_set1_epi32(0x7fffffff);
  const __m256 one = _mm256_set1_ps(1.0f), neg_one = _mm256_set1_ps(-1.0f);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t s = blk * bs, e = std::min(s + bs, n), g_end = s + (e - s) / kQ4Group * kQ4Group;
    __m256i mx0 = _mm256_setzero_si256(), mx1 = mx0;
    int64_t i = s;
    for (; i + 16 <= e; i += 16) {
      mx0 = _mm256_max_epu32(mx0, _mm256_and_si256(_mm256_castps_si256(load8<T>(A + i)), absbits));
      mx1 = _mm256_max_epu32(mx1, _mm256_and_si256(_mm256_castps_si256(load8<T>(A + i + 8)), absbits));
    }
    alignas(32) uint32_t mb[8];
    _mm256_store_si256((__m256i *)mb, _mm256_max_epu32(mx0, mx1));
    uint32_t top = 0;
    for (int k = 0; k < 8; ++k) top = std::max(top, mb[k]);
    const Scale4 sc = scale4_from_bits(top, A, i, e, e - s < bs, absmax + blk);
    const __m256 vinv = _mm256_set1_ps(sc.inv), vam = _mm256_set1_ps(sc.am);
    for (i = s; i < g_end; i += kQ4Group) {
      __m256i c[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 x = load8<T>(A + i + 8 * k);
        const __m256 v = sc.partial ? _mm256_div_ps(x, vam) : _mm256_mul_ps(x, vinv);
        c[k] = search(_mm256_min_ps(one, _mm256_max_ps(neg_one, v)));  // NaN stays NaN (2nd operand)
      }
      const __m256i b = _mm256_permutevar8x32_epi32(
          _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3])), fix);
      const __m256i w = _mm256_maddubs_epi16(_mm256_shuffle_epi8(order, b), pair);
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi16(w, w), 0x08);
      _mm_storeu_si128((__m128i *)(out + (i >> 1)), _mm256_castsi256_si128(packed));
    }
    quantize4_span(bd, sc, A, g_end, e, out);
  }
}

// AVX-512: 16-lane compares into masks; every level looks its midpoint up in a 16-entry permute table
// indexed by the prefix found so far (tab[l][k] = mid[k + 2^(3-l) - 1]).
struct Search4Avx512 {
  __m512 tab[4];
  BNB_MS_TARGET_AVX512 explicit Search4Avx512(const Bounds4 &b) {
    for (int l = 0; l < 4; ++l) {
      alignas(64) float t[16];
      const int off = (8 >> l) - 1;
      for (int k = 0; k < 16; ++k) t[k] = b.mid[std::min(k + off, kCode4 - 2)];
      tab[l] = _mm512_load_ps(t);
    }
  }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512i operator()(__m512 v) const {
    __m512i k = _mm512_setzero_si512();
    for (int l = 0; l < 4; ++l) {
      const __mmask16 p = _mm512_cmp_ps_mask(v, _mm512_permutexvar_ps(k, tab[l]), _CMP_NLE_UQ);
      k = _mm512_mask_add_epi32(k, p, k, _mm512_set1_epi32(8 >> l));
    }
    return k;
  }
};

template <class T>
BNB_MS_TARGET_AVX512 void quantize_4bit_avx512(const Bounds4 &bd, const T *A, float *absmax, uint8_t *out, int64_t bs,
                                               int64_t n, int64_t b0, int64_t b1) {
  const Search4Avx512 search(bd);
  const __m256i order = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bd.order));
  const __m256i pair = _mm256_set1_epi16(0x0110);
  const __m512i absbits = _mm512_set1_epi32(0x7fffffff);
  const __m512 one = _mm512_set1_ps(1.0f), neg_one = _mm512_set1_ps(-1.0f);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t s = blk * bs, e = std::min(s + bs, n), g_end = s + (e - s) / kQ4Group * kQ4Group;
    __m512i mx = _mm512_setzero_si512();
    int64_t i = s;
    for (; i + 16 <= e; i += 16)
      mx = _mm512_max_epu32(mx, _mm512_and_si512(_mm512_castps_si512(load16<T>(A + i)), absbits));
    const Scale4 sc = scale4_from_bits((uint32_t)_mm512_reduce_max_epu32(mx), A, i, e, e - s < bs, absmax + blk);
    const __m512 vinv = _mm512_set1_ps(sc.inv), vam = _mm512_set1_ps(sc.am);
    for (i = s; i < g_end; i += kQ4Group) {
      __m128i c[2];
      for (int k = 0; k < 2; ++k) {
        const __m512 x = load16<T>(A + i + 16 * k);
        const __m512 v = sc.partial ? _mm512_div_ps(x, vam) : _mm512_mul_ps(x, vinv);
        c[k] = _mm512_cvtepi32_epi8(search(_mm512_min_ps(one, _mm512_max_ps(neg_one, v))));
      }
      const __m256i b = _mm256_inserti128_si256(_mm256_castsi128_si256(c[0]), c[1], 1);
      const __m256i w = _mm256_maddubs_epi16(_mm256_shuffle_epi8(order, b), pair);
      _mm_storeu_si128((__m128i *)(out + (i >> 1)), _mm256_cvtepi16_epi8(w));
    }
    quantize4_span(bd, sc, A, g_end, e, out);
  }
}

// ---- dequantize --------------------------------------------------------------------------------
BNB_MS_INLINE float nib(const uint8_t *q, int64_t i) { return (float)((q[i >> 1] >> ((i & 1) ? 0 : 4)) & 15); }

template <class T>
void dequantize_4bit_portable(const float *code, const uint8_t *q, const float *absmax, T *out, int64_t bs, int64_t n,
                              int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n);
    const float sc = absmax[b];
    for (int64_t i = s; i < e; ++i) out[i] = from_f32<T>(code[(int)nib(q, i)] * sc);
  }
}

// AVX2 helpers: 16 nibbles (8 bytes) to two index vectors (8 floats to T: store8, cpu/simd_convert.h).
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
BNB_MS_TARGET_AVX2 void dequantize_4bit_avx2(const float *code, const uint8_t *q, const float *absmax, T *out,
                                             int64_t bs, int64_t n, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n);
    const float sc = absmax[b];
    const __m256 vs = _mm256_set1_ps(sc);
    const __m256 tlo = _mm256_mul_ps(_mm256_loadu_ps(code), vs), thi = _mm256_mul_ps(_mm256_loadu_ps(code + 8), vs);
    int64_t i = s;
    for (; i + 16 <= e; i += 16) {
      __m256i i0, i1;
      nibbles16_avx2(q + (i >> 1), &i0, &i1);
      store8<T>(out + i, lut16_avx2(tlo, thi, i0));
      store8<T>(out + i + 8, lut16_avx2(tlo, thi, i1));
    }
    for (; i < e; ++i) out[i] = from_f32<T>(code[(int)nib(q, i)] * sc);
  }
}

BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512i nibbles16_avx512(const uint8_t *p) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
  const __m256i hi = _mm256_srli_epi32(b, 4), lo = _mm256_and_si256(b, _mm256_set1_epi32(15));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(hi), lo, 1);
  const __m512i perm = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  return _mm512_permutexvar_epi32(perm, both);
}

// The 32 nibbles of p[0..15] in element order as two vectors of vpermps indices (only an index's low 4 bits
// count, so byte j itself indexes its low nibble, element 2j+1): 2.5 shuffle-port ops per 16 (nibbles16: 4).
BNB_MS_TARGET_AVX512 BNB_MS_INLINE void nibbles32_avx512(const uint8_t *p, __m512i *i0, __m512i *i1) {
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
  const __m512i h = _mm512_srli_epi32(d, 4);
  *i0 = _mm512_permutex2var_epi32(h, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), d);
  *i1 = _mm512_permutex2var_epi32(h, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), d);
}

template <class T>
BNB_MS_TARGET_AVX512 void dequantize_4bit_avx512(const float *code, const uint8_t *q, const float *absmax, T *out,
                                                 int64_t bs, int64_t n, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n);
    const float sc = absmax[b];
    const __m512 tab = _mm512_mul_ps(_mm512_loadu_ps(code), _mm512_set1_ps(sc));
    int64_t i = s;
    for (; i + 16 <= e; i += 16) {
      const __m512 w = _mm512_permutexvar_ps(nibbles16_avx512(q + (i >> 1)), tab);
      store8<T>(out + i, _mm512_castps512_ps256(w));
      store8<T>(out + i + 8, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(w), 1)));
    }
    for (; i < e; ++i) out[i] = from_f32<T>(code[(int)nib(q, i)] * sc);
  }
}

// ---- GEMV -------------------------------------------------------------------------------------
// out[n] = sum over the absmax blocks b of row n: absmax[b] * sum_{k in b} code[q(n, k)] * x[k].
//
// Numerics (identical at every SIMD level; the portable kernel is the reference).  A row is cut into
// segments (the parts of the row inside one absmax block), a segment into 32-element groups; element j
// of a group goes to accumulator slot s(j) = j / 2 (j even) or 16 + j / 2 (j odd):
//   bacc[s] = fma(code[q], x, bacc[s])                     32 slots, zeroed at every segment start
//   at the segment end:  z[i] = bacc[i] + bacc[16 + i]                       (i < 16)
//                        v[l] = z[l] + z[l + 4],  v[4 + l] = z[8 + l] + z[12 + l]   (l < 4)
//                        acc[l] = fma(v[l], absmax, acc[l])                  (8 row accumulators)
//   row result:          u[l] = acc[l] + acc[l + 4];  (u[0] + u[2]) + (u[1] + u[3])
// Scaling once per block instead of per weight means the weight is decoded with the raw 16-entry
// code, so the AVX2 kernel can decode with byte shuffles: vpshufb looks up each of the 4 bytes of
// code[q] in a 16-byte table ("byte planes") and two unpack levels re-assemble the floats, in an
// element order fixed by the unpacks; x is permuted into the same order once per call (every row
// reuses it), so the loop has no cross-lane shuffle.  AVX-512 decodes with a 16-entry vpermps.
// A group cut short by the end of its segment, or not starting on a 32-element boundary of the row
// (only when K is not a multiple of 32), is first copied into a zero-padded group (nibble 0, x = 0).
constexpr int kGroup = 32;

BNB_MS_INLINE int nib_at(const uint8_t *q, int64_t i) { return (q[i >> 1] >> ((i & 1) ? 0 : 4)) & 15; }

// The zero-padded copy of a short / unaligned group: packed nibbles (element 2j high, 2j+1 low) and x
// in natural order.
void pad_group(const uint8_t *q, const float *xrow, int64_t g, int64_t e, int64_t r0, uint8_t *pt, float *xt) {
  std::memset(pt, 0, kGroup / 2);
  for (int j = 0; j < kGroup; ++j) {
    const int64_t i = g + j;
    if (i < e) {
      pt[j >> 1] |= (uint8_t)(nib_at(q, i) << ((j & 1) ? 0 : 4));
      xt[j] = xrow[i - r0];
    } else {
      xt[j] = 0.0f;
    }
  }
}

// Each kernel reads x in its own order: position p of a permuted group holds element xelem(p).
// Portable and AVX-512: p = slot.
struct Gemv4bitPortable {
  float code[kCode4];
  float bacc[kGroup], acc[8];
  static int xelem(int p) { return p < 16 ? 2 * p : 2 * (p - 16) + 1; }
  void init(const float *c) { std::memcpy(code, c, sizeof(code)); }
  void row_begin() { std::fill(acc, acc + 8, 0.0f); }
  void seg_begin() { std::fill(bacc, bacc + kGroup, 0.0f); }
  static constexpr int kRows = 4;  // activation rows per pass over a weight row (gemv_4bit's M > 1)
  struct Dec {
    float w[kGroup];
  };
  Dec decode(const uint8_t *p) const {
    Dec d;
    for (int s = 0; s < kGroup; ++s) {
      const int j = xelem(s);
      d.w[s] = code[(p[j >> 1] >> ((j & 1) ? 0 : 4)) & 15];
    }
    return d;
  }
  void accum(const Dec &d, const float *xp) {
    for (int s = 0; s < kGroup; ++s) bacc[s] = std::fma(d.w[s], xp[s], bacc[s]);
  }
  void group(const uint8_t *p, const float *xp) { accum(decode(p), xp); }
  void seg_end(float sc) {
    float z[16];
    for (int i = 0; i < 16; ++i) z[i] = bacc[i] + bacc[16 + i];
    for (int l = 0; l < 4; ++l) {
      acc[l] = std::fma(z[l] + z[l + 4], sc, acc[l]);
      acc[4 + l] = std::fma(z[8 + l] + z[12 + l], sc, acc[4 + l]);
    }
  }
  float row_end() const {
    float u[4];
    for (int l = 0; l < 4; ++l) u[l] = acc[l] + acc[l + 4];
    return (u[0] + u[2]) + (u[1] + u[3]);
  }
};

// AVX2: registers f0..f3 hold the slots [0-3 8-11], [4-7 12-15], [16-19 24-27], [20-23 28-31], i.e. the
// elements [0 2 4 6 16 18 20 22], [8 10 12 14 24 26 28 30], [1 3 5 7 17 19 21 23], [9 .. 15 25 .. 31].
struct Gemv4bitAvx2 {
  __m256i plane[4];  // byte k of code[0..15], in both 128-bit lanes
  __m256 b0, b1, b2, b3, acc;
  static int xelem(int p) {
    const int c = p >> 3, l = p & 7;  // register c, lane l
    return 16 * (l >> 2) + 8 * (c & 1) + 2 * (l & 3) + (c >> 1);
  }
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE void init(const float *code) {
    alignas(16) uint8_t pl[4][16];
    for (int i = 0; i < kCode4; ++i) {
      uint32_t u;
      std::memcpy(&u, code + i, 4);
      for (int k = 0; k < 4; ++k) pl[k][i] = (uint8_t)(u >> (8 * k));
    }
    for (int k = 0; k < 4; ++k) plane[k] = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)pl[k]));
  }
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE void row_begin() { acc = _mm256_setzero_ps(); }
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE void seg_begin() { b0 = b1 = b2 = b3 = _mm256_setzero_ps(); }
  static constexpr int kRows = 2;  // 16 ymm registers: 2 rows' 5 accumulators beside the tables and one group
  struct Dec {
    __m256 f[4];
  };
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE Dec decode(const uint8_t *p) const {
    // lane 0: bytes 0-7 twice, lane 1: bytes 8-15 twice; then high nibbles in the first 8 bytes of a
    // lane (even elements), low nibbles in the last 8 (odd elements)
    const __m256i v = _mm256_blend_epi32(_mm256_castpd_si256(_mm256_broadcast_sd((const double *)p)),
                                         _mm256_castpd_si256(_mm256_broadcast_sd((const double *)(p + 8))), 0xF0);
    const __m256i idx = _mm256_and_si256(_mm256_blend_epi32(_mm256_srli_epi16(v, 4), v, 0xCC), _mm256_set1_epi8(15));
    const __m256i y0 = _mm256_shuffle_epi8(plane[0], idx), y1 = _mm256_shuffle_epi8(plane[1], idx);
    const __m256i y2 = _mm256_shuffle_epi8(plane[2], idx), y3 = _mm256_shuffle_epi8(plane[3], idx);
    const __m256i u0 = _mm256_unpacklo_epi8(y0, y1), u1 = _mm256_unpackhi_epi8(y0, y1);
    const __m256i u2 = _mm256_unpacklo_epi8(y2, y3), u3 = _mm256_unpackhi_epi8(y2, y3);
    return Dec{{_mm256_castsi256_ps(_mm256_unpacklo_epi16(u0, u2)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(u0, u2)),
                _mm256_castsi256_ps(_mm256_unpacklo_epi16(u1, u3)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(u1, u3))}};
  }
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE void accum(const Dec &d, const float *xp) {
    b0 = _mm256_fmadd_ps(d.f[0], _mm256_loadu_ps(xp), b0);
    b1 = _mm256_fmadd_ps(d.f[1], _mm256_loadu_ps(xp + 8), b1);
    b2 = _mm256_fmadd_ps(d.f[2], _mm256_loadu_ps(xp + 16), b2);
    b3 = _mm256_fmadd_ps(d.f[3], _mm256_loadu_ps(xp + 24), b3);
  }
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE void group(const uint8_t *p, const float *xp) { accum(decode(p), xp); }
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE void seg_end(float sc) {
    // b0 + b2 = z[0-3 8-11], b1 + b3 = z[4-7 12-15]
    const __m256 v = _mm256_add_ps(_mm256_add_ps(b0, b2), _mm256_add_ps(b1, b3));
    acc = _mm256_fmadd_ps(v, _mm256_set1_ps(sc), acc);
  }
  BNB_MS_TARGET_AVX2 BNB_MS_INLINE float row_end() const {
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));  // u0+u2, u1+u3
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
  }
};

// AVX-512: 16-entry vpermps decode.  bh lane i = element 2i (slot i), bl lane i = element 2i+1 (slot
// 16+i).  acc lanes 0-3 and 8-11 are the 8 row accumulators (lanes 4-7, 12-15 duplicate them).
struct Gemv4bitAvx512 {
  __m512 tab, bh, bl, acc;
  static int xelem(int p) { return p < 16 ? 2 * p : 2 * (p - 16) + 1; }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE void init(const float *code) { tab = _mm512_loadu_ps(code); }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE void row_begin() { acc = _mm512_setzero_ps(); }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE void seg_begin() { bh = bl = _mm512_setzero_ps(); }
  static constexpr int kRows = 4;
  struct Dec {
    __m512 h, l;
  };
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE Dec decode(const uint8_t *p) const {
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    // vpermps reads only the low 4 bits of an index: the byte itself indexes its low nibble
    return Dec{_mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tab), _mm512_permutexvar_ps(d, tab)};
  }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE void accum(const Dec &w, const float *xp) {
    bh = _mm512_fmadd_ps(w.h, _mm512_loadu_ps(xp), bh);
    bl = _mm512_fmadd_ps(w.l, _mm512_loadu_ps(xp + 16), bl);
  }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE void group(const uint8_t *p, const float *xp) { accum(decode(p), xp); }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE void seg_end(float sc) {
    const __m512 z = _mm512_add_ps(bh, bl);
    const __m512 v = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(2, 3, 0, 1)));  // z[l] + z[l^4]
    acc = _mm512_fmadd_ps(v, _mm512_set1_ps(sc), acc);
  }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE float row_end() const {
    alignas(64) float a[16];
    _mm512_store_ps(a, acc);
    const __m128 u = _mm_add_ps(_mm_load_ps(a), _mm_load_ps(a + 8));
    const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
  }
};

template <class Kern>
void gemv4_permute32(const float *x, float *xp) {
  for (int p = 0; p < kGroup; ++p) xp[p] = x[Kern::xelem(p)];
}

// The bias is added as the unfused layer adds it: to the result already rounded to T, in fp32, rounded again.
template <class T>
BNB_MS_INLINE T with_bias(T r, const T *bias, int64_t n) {
  return bias ? from_f32<T>(to_f32(r) + to_f32(bias[n])) : r;
}

// Output rows [n0, n1) for every A row.  absmax[b - blk_off] is block b's scale (blk_off: the first block
// the caller decoded, 0 when absmax is the whole array); bias (may be null) is added per output.  xn: A in fp32 (M x K); xp: each A row's whole 32-element groups
// in the kernel's order (M x K32).  Stamped out per SIMD level so that everything inlines.
#define BNB_MS_GEMV_4BIT(NAME, TARGET, KERN)                                                                  \
  /* Activation rows [m, m + R) against weight row n (whole blocks, G groups each): the row's groups decoded   \
     once (dec: the call's tables) and accumulated into R rows' own accumulators, each (row, n) by the same    \
     operations in the same order as the one-row loop below, so the same bits. */                             \
  template <int R, class T>                                                                                   \
  TARGET BNB_MS_INLINE void NAME##_rows(const KERN &dec, const uint8_t *q, const float *xp, const float *am,   \
                                        const T *bias, T *out, int64_t N, int64_t K, int64_t nb, int64_t G,   \
                                        int64_t n, int64_t m) {                                               \
    KERN a[R];                                                                                                \
    for (int r = 0; r < R; ++r) a[r].row_begin();                                                             \
    const uint8_t *qg = q + n * K / 2;                                                                        \
    const float *xg = xp + m * K;                                                                             \
    for (int64_t b = 0; b < nb; ++b) {                                                                        \
      for (int r = 0; r < R; ++r) a[r].seg_begin();                                                           \
      for (int64_t j = 0; j < G; ++j, qg += kGroup / 2, xg += kGroup) {                                       \
        const typename KERN::Dec d = dec.decode(qg);                                                          \
        for (int r = 0; r < R; ++r) a[r].accum(d, xg + r * K);                                                \
      }                                                                                                       \
      for (int r = 0; r < R; ++r) a[r].seg_end(am[b]);                                                        \
    }                                                                                                         \
    for (int r = 0; r < R; ++r) out[(m + r) * N + n] = with_bias(from_f32<T>(a[r].row_end()), bias, n);       \
  }                                                                                                           \
  template <class T>                                                                                          \
  TARGET void NAME(const float *code, const uint8_t *q, const float *absmax, int64_t blk_off, const float *xn,  \
                   const float *xp, const T *bias, T *out, int64_t M, int64_t N, int64_t K, int64_t bs,        \
                   int64_t n0, int64_t n1) {                                                                  \
    const int64_t K32 = K / kGroup * kGroup;                                                                  \
    KERN k;                                                                                                   \
    k.init(code); /* the code's tables once per call; row_begin() per output */                              \
    if (K % bs == 0 && bs % kGroup == 0) { /* common case: whole blocks per row, every group full */          \
      const int64_t G = bs / kGroup, nb = K / bs;                                                             \
      if (M > 1) { /* every weight row read once from memory for all M rows (KERN::kRows at a time) */        \
        for (int64_t n = n0; n < n1; ++n)                                                                     \
          for (int64_t m = 0; m < M;) {                                                                       \
            const int64_t r = std::min<int64_t>(M - m, KERN::kRows);                                          \
            const float *amn = absmax + (n * nb - blk_off);                                                   \
            if constexpr (KERN::kRows >= 4)                                                                   \
              if (r == 4) NAME##_rows<4>(k, q, xp, amn, bias, out, N, K, nb, G, n, m);                        \
            if constexpr (KERN::kRows >= 3)                                                                   \
              if (r == 3) NAME##_rows<3>(k, q, xp, amn, bias, out, N, K, nb, G, n, m);                        \
            if (r == 2) NAME##_rows<2>(k, q, xp, amn, bias, out, N, K, nb, G, n, m);                          \
            if (r == 1) NAME##_rows<1>(k, q, xp, amn, bias, out, N, K, nb, G, n, m);                          \
            m += r;                                                                                           \
          }                                                                                                   \
        return;                                                                                               \
      }                                                                                                       \
      for (int64_t m = 0; m < M; ++m)                                                                         \
        for (int64_t n = n0; n < n1; ++n) {                                                                   \
          k.row_begin();                                                                                      \
          const uint8_t *qg = q + n * K / 2;                                                                  \
          const float *xg = xp + m * K, *am = absmax + (n * nb - blk_off);                                    \
          for (int64_t b = 0; b < nb; ++b) {                                                                  \
            k.seg_begin();                                                                                    \
            if (G == 2) {                                                                                     \
              k.group(qg, xg);                                                                                \
              k.group(qg + kGroup / 2, xg + kGroup);                                                          \
              qg += kGroup;                                                                                   \
              xg += 2 * kGroup;                                                                               \
            } else {                                                                                          \
              for (int64_t j = 0; j < G; ++j, qg += kGroup / 2, xg += kGroup) k.group(qg, xg);               \
            }                                                                                                 \
            k.seg_end(am[b]);                                                                                 \
          }                                                                                                   \
          out[m * N + n] = with_bias(from_f32<T>(k.row_end()), bias, n);                                      \
        }                                                                                                     \
      return;                                                                                                 \
    }                                                                                                         \
    for (int64_t m = 0; m < M; ++m) {                                                                         \
      const float *xrow = xn + m * K, *xprow = xp + m * K32;                                                  \
      for (int64_t n = n0; n < n1; ++n) {                                                                     \
        const int64_t r0 = n * K;                                                                             \
        k.row_begin();                                                                                        \
        int64_t blk = r0 / bs;                                                                                \
        for (int64_t s = r0, e; s < r0 + K; s = e, ++blk) {                                                  \
          e = std::min((blk + 1) * bs, r0 + K);                                                               \
          k.seg_begin();                                                                                      \
          int64_t g = s;                                                                                      \
          if (((s - r0) & (kGroup - 1)) == 0 && !(s & 1)) {                                                   \
            const uint8_t *qg = q + (s >> 1);                                                                 \
            const float *xg = xprow + (s - r0);                                                               \
            for (; g + kGroup <= e; g += kGroup, qg += kGroup / 2, xg += kGroup) k.group(qg, xg);            \
          }                                                                                                   \
          for (; g < e; g += kGroup) {                                                                        \
            alignas(64) uint8_t pt[kGroup / 2];                                                               \
            alignas(64) float xt[kGroup], xpt[kGroup];                                                        \
            pad_group(q, xrow, g, e, r0, pt, xt);                                                             \
            gemv4_permute32<KERN>(xt, xpt);                                                                   \
            k.group(pt, xpt);                                                                                 \
          }                                                                                                   \
          k.seg_end(absmax[blk - blk_off]);                                                                   \
        }                                                                                                     \
        out[m * N + n] = with_bias(from_f32<T>(k.row_end()), bias, n);                                        \
      }                                                                                                       \
    }                                                                                                         \
  }
BNB_MS_GEMV_4BIT(gemv_4bit_portable, , Gemv4bitPortable)
BNB_MS_GEMV_4BIT(gemv_4bit_avx2, BNB_MS_TARGET_AVX2, Gemv4bitAvx2)
BNB_MS_GEMV_4BIT(gemv_4bit_avx512, BNB_MS_TARGET_AVX512, Gemv4bitAvx512)
#undef BNB_MS_GEMV_4BIT

template <class Kern>
void gemv4_prep(const float *xn, float *xp, int64_t M, int64_t K) {
  const int64_t K32 = K / kGroup * kGroup;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < K32; c += kGroup) gemv4_permute32<Kern>(xn + m * K + c, xp + m * K32 + c);
}

// Output rows in chunks handed out dynamically: on a machine whose cores are shared, a thread that is
// descheduled for a while does not hold up the whole call (each row's result does not depend on the
// split).  About 16 chunks per thread, each at least ~32K weights; serial below 512K weights (~40 us
// on one AVX2 core), where waking a worker costs about what it saves.
// align: chunks are a multiple of this many rows (a kernel that handles rows in groups leaves no short group
// inside the range).
template <class F>
void gemv4_parallel_rows(int64_t N, int64_t K, F &&f, int64_t align = 1) {
  if (N * K < (int64_t)1 << 19) {
    if (N > 0) f(0, N);
    return;
  }
  const int64_t nt = max_parallel_threads();
  int64_t chunk = std::max<int64_t>({1, 32768 / std::max<int64_t>(K, 1), N / (16 * nt)});
  chunk = (chunk + align - 1) / align * align;
  parallel_for_dynamic(N, chunk, f);
}

// Double-quant absmax of blocks [b0, b1): dst[b - b0] = code2[q[b]] * absmax2[b / bs2] + offset (an fp32
// multiply, then an fp32 add: the library is built with -ffp-contract=off, so every level rounds twice,
// exactly as dequantize_blockwise + "+ offset" does).  Runs of one absmax2 block at a time (no division per
// block); AVX-512 / AVX2 gather 16 / 8 code2 entries at once, AVX-512 VBMI looks 64 up in registers (cpu/code256.h).
#define BNB_MS_NESTED_ABSMAX(NAME, TARGET, LUT)                                                                \
  TARGET void NAME(const uint8_t *q, const float *code2, const float *absmax2, float offset, int64_t bs2, int64_t b0, \
                   int64_t b1, float *dst) {                                                                  \
    LUT lut;                                                                                                  \
    lut.init(code2);                                                                                          \
    const __m512 off = _mm512_set1_ps(offset);                                                                \
    for (int64_t b = b0; b < b1;) {                                                                           \
      const int64_t j = b / bs2, e = std::min(b1, (j + 1) * bs2);                                             \
      const float s = absmax2[j];                                                                             \
      const __m512 vs = _mm512_set1_ps(s);                                                                    \
      for (; b + LUT::kN <= e; b += LUT::kN) {                                                                \
        __m512 v[LUT::kN / 16];                                                                               \
        lut.lookup(q + b, v);                                                                                 \
        for (int k = 0; k < LUT::kN / 16; ++k)                                                                \
          _mm512_storeu_ps(dst + (b - b0) + 16 * k, _mm512_add_ps(_mm512_mul_ps(v[k], vs), off));             \
      }                                                                                                       \
      for (; b < e; ++b) dst[b - b0] = code2[q[b]] * s + offset;                                              \
    }                                                                                                         \
  }
BNB_MS_NESTED_ABSMAX(nested_absmax_avx512, BNB_MS_TARGET_AVX512, Code256Gather)
// AVX-512 VBMI: code2[q] in registers, 64 blocks at a time (about 8x the gather loop on the EPYC measured)
BNB_MS_NESTED_ABSMAX(nested_absmax_avx512vbmi, BNB_MS_TARGET_AVX512VBMI, Code256Vbmi)
#undef BNB_MS_NESTED_ABSMAX

BNB_MS_TARGET_AVX2 void nested_absmax_avx2(const uint8_t *q, const float *code2, const float *absmax2, float offset,
                                           int64_t bs2, int64_t b0, int64_t b1, float *dst) {
  const __m256 off = _mm256_set1_ps(offset);
  for (int64_t b = b0; b < b1;) {
    const int64_t j = b / bs2, e = std::min(b1, (j + 1) * bs2);
    const float s = absmax2[j];
    const __m256 vs = _mm256_set1_ps(s);
    for (; b + 8 <= e; b += 8) {
      const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + b)));
      _mm256_storeu_ps(dst + (b - b0), _mm256_add_ps(_mm256_mul_ps(_mm256_i32gather_ps(code2, idx, 4), vs), off));
    }
    for (; b < e; ++b) dst[b - b0] = code2[q[b]] * s + offset;
  }
}

void nested_absmax_portable(const uint8_t *q, const float *code2, const float *absmax2, float offset, int64_t bs2,
                            int64_t b0, int64_t b1, float *dst) {
  for (int64_t b = b0; b < b1;) {
    const int64_t j = b / bs2, e = std::min(b1, (j + 1) * bs2);
    const float s = absmax2[j];
    for (; b < e; ++b) dst[b - b0] = code2[q[b]] * s + offset;
  }
}

// absmax of a 4-bit weight: fp32 per block, or (double quant, QLoRA's nested statistics) uint8 codes
// of a 256-entry code with fp32 absmax2 per bs2 blocks and an fp32 offset: the value of block b is
// code2[q[b]] * absmax2[b / bs2] + offset, in fp32, which is exactly what dequantize_blockwise followed by
// "+ offset" computes for the unfused path.
struct Absmax4 {
  const float *f32 = nullptr;
  const uint8_t *q = nullptr;
  const float *code2 = nullptr, *absmax2 = nullptr;
  float offset = 0.0f;
  int64_t bs2 = 1;
  bool nested() const { return f32 == nullptr; }
  // fp32 absmax per block when absmax_q is null, else the double-quant form (codes, code2, absmax2, offset, bs2)
  static Absmax4 of(const float *absmax_f32, const uint8_t *absmax_q, const float *code2, const float *absmax2,
                    float offset, int64_t bs2) {
    Absmax4 a;
    if (absmax_q) {
      a.q = absmax_q;
      a.code2 = code2;
      a.absmax2 = absmax2;
      a.offset = offset;
      a.bs2 = bs2;
    } else {
      a.f32 = absmax_f32;
    }
    return a;
  }
  void decode(int64_t b0, int64_t b1, float *dst) const {
    if (has_avx512vbmi()) nested_absmax_avx512vbmi(q, code2, absmax2, offset, bs2, b0, b1, dst);
    else if (has_avx512()) nested_absmax_avx512(q, code2, absmax2, offset, bs2, b0, b1, dst);
    else if (has_avx2()) nested_absmax_avx2(q, code2, absmax2, offset, bs2, b0, b1, dst);
    else nested_absmax_portable(q, code2, absmax2, offset, bs2, b0, b1, dst);
  }
  // The fp32 scales of the blocks that weight rows [n0, n1) touch: the array itself, or (nested) those blocks
  // decoded into this thread's buffer.  *off is the first block the returned pointer holds.
  const float *rows(int64_t n0, int64_t n1, int64_t K, int64_t bs, int64_t *off) const {
    *off = 0;
    if (!nested()) return f32;
    static thread_local std::vector<float> dq;
    *off = n0 * K / bs;
    const int64_t end = (n1 * K + bs - 1) / bs;
    dq.resize((size_t)(end - *off));
    decode(*off, end, dq.data());
    return dq.data();
  }
};

// A range kernel f(n0, n1, am, off) (am[b - off]: the fp32 scale of block b) made into f(n0, n1) for
// gemv4_parallel_rows: the fp32 array is passed as it is; the double-quant codes are decoded for runs of rows of
// about kAbsmaxRun blocks (8 KB, a multiple of `align` rows) just before the kernel reads them, so the scales come
// from L1 (decoding a thread's whole range at once wrote and re-read them through L2: 0.1-0.4 ms of a 1.5 ms
// 11008 x 4096 gemv on the Xeon measured).
constexpr int64_t kAbsmaxRun = 2048;

template <class F>
auto absmax_runs(const Absmax4 &amx, int64_t K, int64_t bs, int64_t align, F &&f) {
  return [&amx, K, bs, align, &f](int64_t n0, int64_t n1) {
    if (!amx.nested()) return f(n0, n1, amx.f32, (int64_t)0);
    int64_t step = std::max<int64_t>(1, kAbsmaxRun * bs / std::max<int64_t>(K, 1));
    step = (step + align - 1) / align * align;
    for (int64_t s = n0; s < n1; s += step) {
      const int64_t e = std::min(n1, s + step);
      int64_t off;
      const float *am = amx.rows(s, e, K, bs, &off);
      f(s, e, am, off);
    }
  };
}

template <class T>
void gemv_4bit(const float *code, const uint8_t *q, const Absmax4 &amx, const T *A, const T *bias, T *out, int64_t M,
               int64_t N, int64_t K, int64_t bs) {
  const SimdLevel lvl = simd_level();
  // x in fp32, natural order and in the kernel's group order: converted once, reused by every row.  The
  // buffers are kept per calling thread (a call allocates nothing once they have grown), cache-line aligned.
  static thread_local Scratch<float> xn, xp;
  float *xnp = xn.get((size_t)(M * K)), *xpp = xp.get((size_t)(M * (K / kGroup * kGroup)) + 1);
  for (int64_t i = 0; i < M * K; ++i) xnp[i] = to_f32(A[i]);
  if (lvl >= SimdLevel::avx512) gemv4_prep<Gemv4bitAvx512>(xnp, xpp, M, K);
  else if (lvl >= SimdLevel::avx2) gemv4_prep<Gemv4bitAvx2>(xnp, xpp, M, K);
  else gemv4_prep<Gemv4bitPortable>(xnp, xpp, M, K);
  gemv4_parallel_rows(N, K, absmax_runs(amx, K, bs, 1, [&](int64_t n0, int64_t n1, const float *am, int64_t off) {
    if (lvl >= SimdLevel::avx512) gemv_4bit_avx512<T>(code, q, am, off, xnp, xpp, bias, out, M, N, K, bs, n0, n1);
    else if (lvl >= SimdLevel::avx2) gemv_4bit_avx2<T>(code, q, am, off, xnp, xpp, bias, out, M, N, K, bs, n0, n1);
    else gemv_4bit_portable<T>(code, q, am, off, xnp, xpp, bias, out, M, N, K, bs, n0, n1);
  }));
}

// ---- entry points: checks in checks/fourbit.h (shared with the CUDA library) -----------------------
template <class T>
int quantize4_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Quantize4<T> q4;
  if (int s = checks::quantize4(c, &q4)) return s;
  if (q4.empty) return OK;
  const int64_t n = q4.n, nb = q4.nb, bs = q4.bs;
  Bounds4 bd;
  fourbit_bounds(q4.code, &bd);
  const T *a = q4.A;
  float *amax = q4.absmax;
  uint8_t *o = q4.out;
  const SimdLevel lvl = bd.sorted ? simd_level() : SimdLevel::scalar;
  parallel_for(nb, std::max<int64_t>(1, 32768 / bs), [&](int64_t b0, int64_t b1) {
    if (lvl >= SimdLevel::avx512) quantize_4bit_avx512<T>(bd, a, amax, o, bs, n, b0, b1);
    else if (lvl >= SimdLevel::avx2) quantize_4bit_avx2<T>(bd, a, amax, o, bs, n, b0, b1);
    else quantize_4bit_portable<T>(bd, a, amax, o, bs, n, b0, b1);
  });
  return OK;
}

// FP4: bit 3 of a code is its sign, so code 8 (+0 in upstream's table) decodes to -0.0, as upstream's
// native CPU kernel does (its torch fallback for an odd last dimension gives +0.0; same value).
template <class T, bool FP4>
int dequantize4_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Dequantize4<T> a;
  if (int s = checks::dequantize4(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t n = a.n, bs = a.bs;
  alignas(64) float code[kCode4];
  std::memcpy(code, a.code, sizeof(code));
  if (FP4 && code[8] == 0.0f) code[8] = -0.0f;
  const float *amax = a.absmax;
  const uint8_t *q = a.A;
  T *o = a.out;
  const SimdLevel lvl = simd_level();
  parallel_for((n + bs - 1) / bs, std::max<int64_t>(1, 65536 / bs), [&](int64_t b0, int64_t b1) {
    if (lvl >= SimdLevel::avx512) dequantize_4bit_avx512<T>(code, q, amax, o, bs, n, b0, b1);
    else if (lvl >= SimdLevel::avx2) dequantize_4bit_avx2<T>(code, q, amax, o, bs, n, b0, b1);
    else dequantize_4bit_portable<T>(code, q, amax, o, bs, n, b0, b1);
  });
  return OK;
}

template <class T>
int gemv4_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Gemv4<T> a;
  if (int s = checks::gemv4(c, &a)) return s;
  if (a.empty) return OK;
  if (a.K == 0) {
    for (int64_t i = 0; i < a.M * a.N; ++i) a.out[i] = from_f32<T>(0.0f);
    return OK;
  }
  Absmax4 amx;
  amx.f32 = a.absmax;
  gemv_4bit<T>(a.code, a.B, amx, a.A, nullptr, a.out, a.M, a.N, a.K, a.bs);
  return OK;
}

// ---- GEMM: 2+ rows of A ---------------------------------------------------------------------------
// out[m, n] = sum_k x[m, k] * w[n, k] with w = code[q(n, k)] * absmax[block] in fp32 (the bytes
// dequantize_4bit gives), decoded once per weight row into a row buffer that every A row then reads, so
// the packed weight is streamed once per call and never materialised as a matrix.  Numerics (identical
// at every SIMD level): the row is zero-padded to a multiple of 16; lane l (0..15) accumulates
// a[l] = fma(w[k], x[k], a[l]) over k = 16j + l in increasing j; then v[l] = a[l] + a[l + 8],
// u[l] = v[l] + v[l + 4] (l < 4), result (u[0] + u[2]) + (u[1] + u[3]).
constexpr int kLanes = 16;

BNB_MS_INLINE float lanes_reduce(const float *a) {
  float v[8], u[4];
  for (int l = 0; l < 8; ++l) v[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) u[l] = v[l] + v[l + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

// Decode the dequantized weight row n (K values, zero-padded to K16) into w.
BNB_MS_INLINE void dequantize_4bit_row_portable(const float *code, const uint8_t *q, const float *am, int64_t blk_off,
                                                int64_t n, int64_t K, int64_t K16, int64_t bs, float *w) {
  const int64_t r0 = n * K;
  for (int64_t k = 0; k < K; ++k) w[k] = code[nib_at(q, r0 + k)] * am[(r0 + k) / bs - blk_off];
  for (int64_t k = K; k < K16; ++k) w[k] = 0.0f;
}

BNB_MS_TARGET_AVX2 void dequantize_4bit_row_avx2(const float *code, const uint8_t *q, const float *am, int64_t blk_off,
                                                 int64_t n, int64_t K, int64_t K16, int64_t bs, float *w) {
  const int64_t r0 = n * K;
  for (int64_t b = r0 / bs, s = r0; s < r0 + K; ++b) {
    const int64_t e = std::min((b + 1) * bs, r0 + K);
    const float sc = am[b - blk_off];
    const __m256 vs = _mm256_set1_ps(sc);
    const __m256 tlo = _mm256_mul_ps(_mm256_loadu_ps(code), vs), thi = _mm256_mul_ps(_mm256_loadu_ps(code + 8), vs);
    int64_t i = s;
    if (i & 1) { w[i - r0] = code[nib_at(q, i)] * sc; ++i; }
    for (; i + 16 <= e; i += 16) {
      __m256i i0, i1;
      nibbles16_avx2(q + (i >> 1), &i0, &i1);
      _mm256_storeu_ps(w + (i - r0), lut16_avx2(tlo, thi, i0));
      _mm256_storeu_ps(w + (i - r0) + 8, lut16_avx2(tlo, thi, i1));
    }
    for (; i < e; ++i) w[i - r0] = code[nib_at(q, i)] * sc;
    s = e;
  }
  for (int64_t k = K; k < K16; ++k) w[k] = 0.0f;
}

// Elements [s0, s0 + len) of the flat weight (any start: a row or a K slice of one) dequantized into w.
BNB_MS_TARGET_AVX512 void dequantize_4bit_span_avx512(const float *code, const uint8_t *q, const float *am,
                                                      int64_t blk_off, int64_t s0, int64_t len, int64_t bs, float *w) {
  const int64_t end = s0 + len;
  for (int64_t b = s0 / bs, s = s0; s < end; ++b) {
    const int64_t e = std::min((b + 1) * bs, end);
    const float sc = am[b - blk_off];
    const __m512 tab = _mm512_mul_ps(_mm512_loadu_ps(code), _mm512_set1_ps(sc));
    int64_t i = s;
    if (i & 1) { w[i - s0] = code[nib_at(q, i)] * sc; ++i; }
    for (; i + 32 <= e; i += 32) {
      __m512i i0, i1;
      nibbles32_avx512(q + (i >> 1), &i0, &i1);
      _mm512_storeu_ps(w + (i - s0), _mm512_permutexvar_ps(i0, tab));
      _mm512_storeu_ps(w + (i - s0) + 16, _mm512_permutexvar_ps(i1, tab));
    }
    if (i + 16 <= e) {
      _mm512_storeu_ps(w + (i - s0), _mm512_permutexvar_ps(nibbles16_avx512(q + (i >> 1)), tab));
      i += 16;
    }
    for (; i < e; ++i) w[i - s0] = code[nib_at(q, i)] * sc;
    s = e;
  }
}

BNB_MS_TARGET_AVX512 void dequantize_4bit_row_avx512(const float *code, const uint8_t *q, const float *am,
                                                     int64_t blk_off, int64_t n, int64_t K, int64_t K16, int64_t bs,
                                                     float *w) {
  dequantize_4bit_span_avx512(code, q, am, blk_off, n * K, K, bs, w);
  for (int64_t k = K; k < K16; ++k) w[k] = 0.0f;
}

// One weight row against every padded A row (x: M x K16).
BNB_MS_INLINE void dot_rows_portable(const float *w, const float *x, int64_t M, int64_t K16, float *r) {
  for (int64_t m = 0; m < M; ++m) {
    float a[kLanes] = {0};
    const float *xm = x + m * K16;
    for (int64_t k = 0; k < K16; k += kLanes)
      for (int l = 0; l < kLanes; ++l) a[l] = std::fma(w[k + l], xm[k + l], a[l]);
    r[m] = lanes_reduce(a);
  }
}

BNB_MS_TARGET_AVX2 BNB_MS_INLINE float reduce16_avx2(__m256 lo, __m256 hi) {
  const __m256 v = _mm256_add_ps(lo, hi);
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(u, _mm_movehl_ps(u, u));  // u0+u2, u1+u3
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

BNB_MS_TARGET_AVX2 void dot_rows_avx2(const float *w, const float *x, int64_t M, int64_t K16, float *r) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) {  // 4 A rows share each weight load
    const float *x0 = x + m * K16, *x1 = x0 + K16, *x2 = x1 + K16, *x3 = x2 + K16;
    __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0, b3 = a0;
    for (int64_t k = 0; k < K16; k += kLanes) {
      const __m256 wl = _mm256_loadu_ps(w + k), wh = _mm256_loadu_ps(w + k + 8);
      a0 = _mm256_fmadd_ps(wl, _mm256_loadu_ps(x0 + k), a0); b0 = _mm256_fmadd_ps(wh, _mm256_loadu_ps(x0 + k + 8), b0);
      a1 = _mm256_fmadd_ps(wl, _mm256_loadu_ps(x1 + k), a1); b1 = _mm256_fmadd_ps(wh, _mm256_loadu_ps(x1 + k + 8), b1);
      a2 = _mm256_fmadd_ps(wl, _mm256_loadu_ps(x2 + k), a2); b2 = _mm256_fmadd_ps(wh, _mm256_loadu_ps(x2 + k + 8), b2);
      a3 = _mm256_fmadd_ps(wl, _mm256_loadu_ps(x3 + k), a3); b3 = _mm256_fmadd_ps(wh, _mm256_loadu_ps(x3 + k + 8), b3);
    }
    r[m] = reduce16_avx2(a0, b0); r[m + 1] = reduce16_avx2(a1, b1);
    r[m + 2] = reduce16_avx2(a2, b2); r[m + 3] = reduce16_avx2(a3, b3);
  }
  for (; m < M; ++m) {
    const float *x0 = x + m * K16;
    __m256 a0 = _mm256_setzero_ps(), b0 = a0;
    for (int64_t k = 0; k < K16; k += kLanes) {
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x0 + k), a0);
      b0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(x0 + k + 8), b0);
    }
    r[m] = reduce16_avx2(a0, b0);
  }
}

BNB_MS_TARGET_AVX512 BNB_MS_INLINE float reduce16_avx512(__m512 a) {
  return reduce16_avx2(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

// AVX-512, more than one A row: the weight is decoded and multiplied in K slices of kKc values, so that a
// slice of A (kMc rows) and of the weight panel stay in L1 while every pair of them is multiplied; without the
// slicing each 4 x 6 tile streamed whole rows of both from L2 and ran at L2 speed.  Tiles of kW weight rows x 6 A
// rows (24 zmm accumulators, 4 + 6 loads per 24 fmas); a tile's 16-lane chains are kept in a buffer between
// slices (an exact fp32 store and reload), so each (row, m) is the same chain, in the same order, as dot_rows_*,
// and the bits do not change.
constexpr int kW = 4;
constexpr int64_t kKc = 512;  // K slice (floats): 2 KB per row
constexpr int64_t kMc = 12;   // A rows per L1 block (24 KB at kKc)
constexpr int64_t kPanel = 8;  // weight rows decoded per slice (16 KB at kKc)

// acc: the tile's chains, acc[(i * kW + j) * 16 + lane]; first: start from zero; last: reduce into r[i * ldr + j].
template <int MR>
BNB_MS_TARGET_AVX512 BNB_MS_INLINE void dot_tile4_avx512(const float *w, const float *x, int64_t kc, float *acc,
                                                         bool first, bool last, float *r, int64_t ldr) {
  __m512 a[kW][MR];
#pragma GCC unroll 4
  for (int j = 0; j < kW; ++j)
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) a[j][i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(acc + (i * kW + j) * kLanes);
  for (int64_t k = 0; k < kc; k += kLanes) {
    __m512 wv[kW];
#pragma GCC unroll 4
    for (int j = 0; j < kW; ++j) wv[j] = _mm512_loadu_ps(w + j * kc + k);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * kc + k);
#pragma GCC unroll 4
      for (int j = 0; j < kW; ++j) a[j][i] = _mm512_fmadd_ps(wv[j], xv, a[j][i]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kW; ++j) {
      if (last) r[i * ldr + j] = reduce16_avx512(a[j][i]);
      else _mm512_storeu_ps(acc + (i * kW + j) * kLanes, a[j][i]);
    }
}

BNB_MS_TARGET_AVX512 void dot_tiles4_avx512(const float *w, const float *x, int64_t rows, int64_t kc, float *acc,
                                            bool first, bool last, float *r, int64_t ldr) {
  int64_t m = 0;
  for (; m + 6 <= rows; m += 6)
    dot_tile4_avx512<6>(w, x + m * kc, kc, acc + m * kW * kLanes, first, last, r + m * ldr, ldr);
  x += m * kc, acc += m * kW * kLanes, r += m * ldr;
  switch (rows - m) {
    case 5: dot_tile4_avx512<5>(w, x, kc, acc, first, last, r, ldr); break;
    case 4: dot_tile4_avx512<4>(w, x, kc, acc, first, last, r, ldr); break;
    case 3: dot_tile4_avx512<3>(w, x, kc, acc, first, last, r, ldr); break;
    case 2: dot_tile4_avx512<2>(w, x, kc, acc, first, last, r, ldr); break;
    case 1: dot_tile4_avx512<1>(w, x, kc, acc, first, last, r, ldr); break;
    default: break;
  }
}

// A (M x K, any T) in fp32, zero-padded to K16 and laid out by K slice: slice s (width kc_s) holds M rows of kc_s
// values at xs + s * kKc * M, so a slice of kMc rows is one contiguous block.
template <class T>
void pack_slices(const T *A, int64_t M, int64_t K, int64_t K16, float *xs) {
  for (int64_t k0 = 0; k0 < K16; k0 += kKc) {
    const int64_t kc = std::min(kKc, K16 - k0);
    float *dst = xs + k0 * M;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < kc; ++k) dst[m * kc + k] = k0 + k < K ? to_f32(A[m * K + k0 + k]) : 0.0f;
  }
}

// Weight rows [n0, n1) against the sliced A: res[m * kPanel + (n - n0)] for n1 - n0 <= kPanel.
BNB_MS_TARGET_AVX512 void gemm_4bit_panel_avx512(const float *code, const uint8_t *q, const float *am, int64_t off,
                                                 const float *xs, int64_t M, int64_t K, int64_t K16, int64_t bs,
                                                 int64_t n0, int64_t n1, float *wpan, float *acc, float *res) {
  const int64_t R = n1 - n0, G = (R + kW - 1) / kW;
  for (int64_t k0 = 0; k0 < K16; k0 += kKc) {
    const int64_t kc = std::min(kKc, K16 - k0), kv = std::max<int64_t>(0, std::min(kc, K - k0));
    const bool first = k0 == 0, last = k0 + kc >= K16;
    for (int64_t r = 0; r < G * kW; ++r) {  // rows past n1 (a short last group) are zeros; their results are dropped
      float *w = wpan + r * kc;
      int64_t done = 0;
      if (r < R) dequantize_4bit_span_avx512(code, q, am, off, (n0 + r) * K + k0, done = kv, bs, w);
      for (int64_t k = done; k < kc; ++k) w[k] = 0.0f;
    }
    const float *xk = xs + k0 * M;
    for (int64_t m0 = 0; m0 < M; m0 += kMc) {
      const int64_t rows = std::min(kMc, M - m0);
      for (int64_t g = 0; g < G; ++g)
        dot_tiles4_avx512(wpan + g * kW * kc, xk + m0 * kc, rows, kc, acc + (g * M + m0) * kW * kLanes, first, last,
                          res + m0 * kPanel + g * kW, kPanel);
    }
  }
}

// AVX2: kW2 decoded weight rows against every padded A row, r[m * kW2 + j], in tiles of 3 weight rows x 2 A rows:
// the low and high 8 lanes of a k-step run one after the other (3 weight registers, 1 A register, 12
// accumulators), so each A value is loaded once per 3 weight rows and each weight value once per 2 A rows (10
// loads per 12 fmas; dot_rows_avx2: 10 per 8), and A is streamed from L2 once per 3 weight rows.  Measured on Zen 3,
// one thread, 16 x 4096 x 4096: 17.1 -> 12.6 ms (2 x 3: 14.3, 4 x 1: 16.6, 2 x 2: 16.5).  Each (row, m) is the
// same 16-lane chain as dot_rows_*, so the bits do not change.
constexpr int kW2 = 3;

template <int MR>
BNB_MS_TARGET_AVX2 BNB_MS_INLINE void dot_tile2_avx2(const float *w, const float *x, int64_t m, int64_t K16,
                                                     float *r) {
  __m256 lo[kW2][MR], hi[kW2][MR];
#pragma GCC unroll 4
  for (int j = 0; j < kW2; ++j)
#pragma GCC unroll 4
    for (int i = 0; i < MR; ++i) lo[j][i] = hi[j][i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K16; k += kLanes) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256 wv[kW2];
#pragma GCC unroll 4
      for (int j = 0; j < kW2; ++j) wv[j] = _mm256_loadu_ps(w + j * K16 + k + 8 * h);
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + (m + i) * K16 + k + 8 * h);
#pragma GCC unroll 4
        for (int j = 0; j < kW2; ++j) {
          if (h == 0) lo[j][i] = _mm256_fmadd_ps(wv[j], xv, lo[j][i]);
          else hi[j][i] = _mm256_fmadd_ps(wv[j], xv, hi[j][i]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < kW2; ++j) r[(m + i) * kW2 + j] = reduce16_avx2(lo[j][i], hi[j][i]);
}

BNB_MS_TARGET_AVX2 void dot_rows2_avx2(const float *w, const float *x, int64_t M, int64_t K16, float *r) {
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) dot_tile2_avx2<2>(w, x, m, K16, r);
  if (m < M) dot_tile2_avx2<1>(w, x, m, K16, r);
}

template <class T>
void gemm_4bit_avx512(const float *code, const uint8_t *q, const Absmax4 &amx, const T *A, const T *bias, T *out,
                      int64_t M, int64_t N, int64_t K, int64_t bs) {
  const int64_t K16 = (K + kLanes - 1) / kLanes * kLanes;
  static thread_local Scratch<float> xsl;
  float *xs = xsl.get((size_t)(M * K16));
  pack_slices(A, M, K, K16, xs);
  gemv4_parallel_rows(N, K * std::max<int64_t>(1, M / 4), absmax_runs(amx, K, bs, kPanel, [&](int64_t n0, int64_t n1, const float *am, int64_t off) {
    static thread_local Scratch<float> wpan, acc, res;
    float *wp = wpan.get((size_t)(kPanel * kKc)), *ap = acc.get((size_t)(kPanel * M * kLanes));
    float *rp = res.get((size_t)(kPanel * M));
    for (int64_t n = n0; n < n1; n += kPanel) {
      const int64_t e = std::min(n1, n + kPanel);
      gemm_4bit_panel_avx512(code, q, am, off, xs, M, K, K16, bs, n, e, wp, ap, rp);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = n; j < e; ++j) out[m * N + j] = with_bias(from_f32<T>(rp[m * kPanel + (j - n)]), bias, j);
    }
  }), kW);
}

template <class T>
void gemm_4bit(const float *code, const uint8_t *q, const Absmax4 &amx, const T *A, const T *bias, T *out, int64_t M,
               int64_t N, int64_t K, int64_t bs) {
  const SimdLevel lvl = simd_level();
  if (lvl >= SimdLevel::avx512) return gemm_4bit_avx512<T>(code, q, amx, A, bias, out, M, N, K, bs);
  const int64_t K16 = (K + kLanes - 1) / kLanes * kLanes;
  static thread_local std::vector<float> xpad;  // A in fp32, rows zero-padded to K16
  xpad.assign((size_t)(M * K16), 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) xpad[m * K16 + k] = to_f32(A[m * K + k]);
  const float *xp = xpad.data();
  gemv4_parallel_rows(N, K * std::max<int64_t>(1, M / 4), absmax_runs(amx, K, bs, kW2, [&](int64_t n0, int64_t n1, const float *am, int64_t off) {
    static thread_local std::vector<float> wrow, res;
    wrow.resize((size_t)(kW2 * K16));
    res.resize((size_t)(kW2 * M));
    int64_t n = n0;
    if (lvl >= SimdLevel::avx2) {
      for (; n + kW2 <= n1; n += kW2) {
        for (int j = 0; j < kW2; ++j)
          dequantize_4bit_row_avx2(code, q, am, off, n + j, K, K16, bs, wrow.data() + j * K16);
        dot_rows2_avx2(wrow.data(), xp, M, K16, res.data());
        for (int64_t m = 0; m < M; ++m)
          for (int j = 0; j < kW2; ++j) out[m * N + n + j] = with_bias(from_f32<T>(res[m * kW2 + j]), bias, n + j);
      }
    }
    for (; n < n1; ++n) {
      if (lvl >= SimdLevel::avx2) {
        dequantize_4bit_row_avx2(code, q, am, off, n, K, K16, bs, wrow.data());
        dot_rows_avx2(wrow.data(), xp, M, K16, res.data());
      } else {
        dequantize_4bit_row_portable(code, q, am, off, n, K, K16, bs, wrow.data());
        dot_rows_portable(wrow.data(), xp, M, K16, res.data());
      }
      for (int64_t m = 0; m < M; ++m) out[m * N + n] = with_bias(from_f32<T>(res[m]), bias, n);
    }
  }));
}

// ---- bf16 compute (clinear_4bit_bf16dot_bf16) -------------------------------------------------------
// The 4-bit linear forward for bf16 compute as a bf16 dot product (what upstream runs on AVX512-BF16 CPUs),
// beside the exact fp32-accumulation kernels above, which it leaves untouched.  Arithmetic (identical bits
// on the AVX512-BF16 kernel and the portable one; the portable kernel is the reference):
//   * rounding to bf16 is the library's own: round to nearest even, NaN kept (quiet), and then a bf16
//     denormal (exponent field 0) flushed to a zero of the same sign -- what vdpbf16ps' "DAZ in" would do
//     to it anyway, so both kernels see only normal/zero/inf/NaN inputs.
//   * x: the bf16 activation, flushed.  Weight: per absmax block a 16-entry table t[i] = bf16(code[i] *
//     absmax) (the fp32 product of dequantize_4bit, rounded once, flushed); w[k] = t[nibble k].
//   * a row (zero-padded to a multiple of 32) is cut into 32-element chunks; lane l (0..15) of chunk c
//     takes the pair (2l, 2l+1) and, as Intel documents VDPBF16PS (two fp32 FMAs per lane, odd element
//     first, DAZ in, FTZ out, round to nearest even, MXCSR not used):
//        acc[l] = ftz(fma(w[2l+1], x[2l+1], acc[l]));  acc[l] = ftz(fma(w[2l], x[2l], acc[l]))
//     with ftz(r) = r if |r| >= FLT_MIN (or inf/NaN), else a zero of r's sign.  bf16 x bf16 is exact in
//     fp32, so each step is one rounding.  The portable kernel does these fmas in fp32 (std::fma, default
//     rounding) and flushes the rounded result.  Known difference: the hardware decides "tiny" on its own
//     terms, which can differ for an accumulator within 2^-150 of FLT_MIN (unreachable for activations and
//     weights of normal size; documented, not emulated).  NaN payloads may differ (NaN stays NaN).
//   * row result: the 16 lanes reduced as the GEMM does (v = a[l] + a[l+8], u = v[l] + v[l+4],
//     (u0 + u2) + (u1 + u3); plain fp32 adds), rounded to bf16 (RNE, not flushed), bias added as the exact
//     path adds it (with_bias).
// Bound vs the exact fp32 path (clinear_4bit_bf16 on the same bf16 x), per output, K = in_features:
//   |out_bf16dot - out_exact| <= 2^-6 * (S + |bias|) + K * 2^-22 * S,   S = sum_k |x_k * w_k|
// (w the fp32 dequantized weight; terms: the weight rounding 2^-9 S, both fp32 accumulations <= 2 gamma_K S,
// the two bf16 output roundings and the bias add; tests/test_linear4bit_bf16.py checks it).
// The path is chosen on the CPU feature: AVX512-BF16 kernel where the CPU has it and the SIMD level is
// avx512, the portable one otherwise (BNB_MS_SIMD=scalar|avx2 therefore changes the kernel, not the bits).
constexpr int kChunk = 32;  // bf16 elements per vdpbf16ps (16 lanes x 2)
constexpr int kRowGroup = 12;  // weight rows decoded together (their chains interleave)

// The 16-entry table of one block.
BNB_MS_INLINE void bf16_table(const float *code, float sc, uint16_t *t) {
  for (int i = 0; i < kCode4; ++i) t[i] = to_bf16_flushed(code[i] * sc);
}

// Weight row n as bf16 (K values, zero-padded to K32).
void decode_row_bf16_portable(const float *code, const uint8_t *q, const float *am, int64_t blk_off, int64_t n,
                              int64_t K, int64_t K32, int64_t bs, uint16_t *w) {
  const int64_t r0 = n * K;
  uint16_t t[kCode4];
  for (int64_t b = r0 / bs, s = r0; s < r0 + K; ++b) {
    const int64_t e = std::min((b + 1) * bs, r0 + K);
    bf16_table(code, am[b - blk_off], t);
    for (int64_t i = s; i < e; ++i) w[i - r0] = t[nib_at(q, i)];
    s = e;
  }
  for (int64_t k = K; k < K32; ++k) w[k] = 0;
}

BNB_MS_INLINE float bf16f(uint16_t h) { return bf16_to_f32(h); }

void dot_rows_bf16_portable(const uint16_t *const *w, int R, const uint16_t *x, int64_t M, int64_t K32, float *r) {
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t *xm = x + m * K32;
    for (int j = 0; j < R; ++j) {
      float a[kLanes] = {0};
      for (int64_t c = 0; c < K32; c += kChunk)
        for (int l = 0; l < kLanes; ++l) {
          const int64_t k = c + 2 * l;
          a[l] = ftz32(std::fma(bf16f(w[j][k + 1]), bf16f(xm[k + 1]), a[l]));
          a[l] = ftz32(std::fma(bf16f(w[j][k]), bf16f(xm[k]), a[l]));
        }
      r[m * kRowGroup + j] = lanes_reduce(a);
    }
  }
}

// Columns [k0, k1) of weight row n as bf16 into w[0, k1 - k0) (columns >= K are zero padding).
BNB_MS_TARGET_AVX512BF16 void decode_row_bf16_avx512bf16(const float *code, const uint8_t *q, const float *am,
                                                         int64_t blk_off, int64_t n, int64_t K, int64_t k0, int64_t k1,
                                                         int64_t bs, uint16_t *w) {
  const int64_t r0 = n * K, rs = r0 + k0, re = r0 + std::min(k1, K);
  const __m512 c = _mm512_loadu_ps(code);
  alignas(64) uint16_t t[2 * kCode4];
  for (int64_t b = rs / bs, s = rs; s < re; ++b) {
    const int64_t e = std::min((b + 1) * bs, re);
    const __m512i tab = bf16_flushed16(_mm512_mul_ps(c, _mm512_set1_ps(am[b - blk_off])));
    int64_t i = s;
    if (i & 1) {
      _mm512_store_si512(t, tab);
      w[i - rs] = t[2 * nib_at(q, i)];
      ++i;
    }
    for (; i + kChunk <= e; i += kChunk) {
      // 16 bytes -> 32 word indices in element order: word 2j = byte j >> 3 (2 * high nibble, + bit 3),
      // word 2j+1 = byte j << 1 (2 * low nibble, + higher bits); vpermw reads the low 5 bits
      const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + (i >> 1))));
      const __m512i idx = _mm512_or_si512(_mm512_srli_epi32(d, 3), _mm512_slli_epi32(d, 17));
      _mm512_storeu_si512(w + (i - rs), _mm512_permutexvar_epi16(idx, tab));
    }
    if (i < e) {
      _mm512_store_si512(t, tab);
      for (; i < e; ++i) w[i - rs] = t[2 * nib_at(q, i)];
    }
    s = e;
  }
  for (int64_t k = std::max(k0, K); k < k1; ++k) w[k - k0] = 0;
}

BNB_MS_TARGET_AVX512BF16 BNB_MS_INLINE __m512bh bh(const uint16_t *p) {
  return (__m512bh)_mm512_loadu_si512(p);
}

// The native kernel runs K in slices of kSliceK columns so that the decoded weight slice (kRowGroup rows)
// and the x slice stay in L1 while every x row reads them; each (row, m) vdpbf16ps chain is carried across
// the slices in acc (16 fp32 per chain), so it runs over the chunks in order, as the portable kernel's does.
constexpr int64_t kSliceK = 512;

// Chains for weight rows j0..j0+RR-1 (slice pointers w[j]) and x rows m..m+MM-1 over the slice's chunks
// [c0, c1) (c0: the slice's first column); acc[(m * kRowGroup + j) * 16 + lane] holds each chain between slices.
template <int RR, int MM>
BNB_MS_TARGET_AVX512BF16 BNB_MS_INLINE void dot_tile_bf16(const uint16_t *const *w, const uint16_t *x, int64_t m,
                                                          int64_t K32, int64_t c0, int64_t c1, int j0, float *acc) {
  __m512 a[RR][MM];
  for (int j = 0; j < RR; ++j)
    for (int i = 0; i < MM; ++i) a[j][i] = _mm512_load_ps(acc + ((m + i) * kRowGroup + j0 + j) * kLanes);
  for (int64_t c = c0; c < c1; c += kChunk) {
    __m512bh xv[MM];
    for (int i = 0; i < MM; ++i) xv[i] = bh(x + (m + i) * K32 + c);
    for (int j = 0; j < RR; ++j) {
      const __m512bh wv = bh(w[j0 + j] + (c - c0));
      for (int i = 0; i < MM; ++i) a[j][i] = _mm512_dpbf16_ps(a[j][i], wv, xv[i]);
    }
  }
  for (int j = 0; j < RR; ++j)
    for (int i = 0; i < MM; ++i) _mm512_store_ps(acc + ((m + i) * kRowGroup + j0 + j) * kLanes, a[j][i]);
}

// R (<= kRowGroup) weight rows n..n+R-1 against every x row: r[m * kRowGroup + j].
BNB_MS_TARGET_AVX512BF16 void dot_rows_bf16_avx512bf16(const float *code, const uint8_t *q, const float *am,
                                                       int64_t blk_off, int64_t n, int R, int64_t K, int64_t bs,
                                                       const uint16_t *x, int64_t M, int64_t K32, uint16_t *wbuf,
                                                       float *acc, float *r) {
  std::memset(acc, 0, sizeof(float) * (size_t)(M * kRowGroup * kLanes));
  const uint16_t *w[kRowGroup];
  for (int64_t c0 = 0; c0 < K32; c0 += kSliceK) {
    const int64_t c1 = std::min(c0 + kSliceK, K32);
    for (int j = 0; j < R; ++j) {
      // the next slice's packed bytes of this row (R short strided streams: the hardware prefetcher alone
      // leaves them to DRAM latency)
      if (c1 < K) {
        const uint8_t *nx = q + ((n + j) * K + c1) / 2;
        for (int64_t b = 0; b < kSliceK / 2; b += 64) _mm_prefetch((const char *)(nx + b), _MM_HINT_T0);
      }
      decode_row_bf16_avx512bf16(code, q, am, blk_off, n + j, K, c0, c1, bs, wbuf + j * kSliceK);
      w[j] = wbuf + j * kSliceK;
    }
    int64_t m = 0;
    if (R == kRowGroup) {
      // 6 weight rows x 4 x rows: 24 chains in flight (vdpbf16ps is latency-bound below ~24 chains on the
      // AVX512-BF16 EPYC measured), 10 loads per 24 vdpbf16ps
      for (; m + 4 <= M; m += 4) {
        dot_tile_bf16<6, 4>(w, x, m, K32, c0, c1, 0, acc);
        dot_tile_bf16<6, 4>(w, x, m, K32, c0, c1, 6, acc);
      }
      if (M - m == 3) {
        dot_tile_bf16<6, 3>(w, x, m, K32, c0, c1, 0, acc);
        dot_tile_bf16<6, 3>(w, x, m, K32, c0, c1, 6, acc);
      } else if (M - m == 2) {
        dot_tile_bf16<12, 2>(w, x, m, K32, c0, c1, 0, acc);
      } else if (M - m == 1) {
        dot_tile_bf16<12, 1>(w, x, m, K32, c0, c1, 0, acc);
      }
    } else {
      for (; m < M; ++m)
        for (int j = 0; j < R; ++j) dot_tile_bf16<1, 1>(w, x, m, K32, c0, c1, j, acc);
    }
  }
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < R; ++j) r[m * kRowGroup + j] = reduce16_avx512(_mm512_load_ps(acc + (m * kRowGroup + j) * kLanes));
}

// ---- bf16 compute on AMX-BF16 (prefill) -------------------------------------------------------------
// Where the CPU and OS allow AMX-BF16, from kAmx4MinRows rows of x the products of the bf16 GEMM run on the tile
// unit (TDPBF16PS: 16 x 16 fp32 outputs per instruction) instead of vdpbf16ps.  Why: the 7B-shaped model's
// 512-token prefill ran at 12.8 tok/s on the 2-core Xeon (AMX) measured, its 4-bit GEMMs near vdpbf16ps' peak.
// Same inputs as the kernel above (x flushed bf16, per block bf16(code * absmax), flushed); the products are exact
// in fp32 and the tile unit sums them in its own order (measured: not a sequential fp32 chain, within 2e-7 S of
// the exact sum for K = 32..1024), so the bits differ from the vdpbf16ps kernel's and the bound vs the exact path
// above holds (tests/test_linear4bit_bf16.py checks it).  BNB_MS_4BIT_AMX=0 keeps the vdpbf16ps kernel.
// Layout: weight rows as the first operand (a group of 32 rows: 2 tiles of 16 rows x 32 k, decoded kAmxSlice
// columns at a time into wbuf), x packed once per call as the second (per 16-row m-tile and 32-column k-step: 16
// rows of the pairs (x[m][2p], x[m][2p + 1]) for the tile's 16 m), so a result tile is C^T (16 n x 16 m).  Each
// group's results stay in acc (per m-tile: 2 tiles of 16 n x 16 m) between slices.
#define BNB_MS_TARGET_AMX_BF16 \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))
constexpr int64_t kAmx4MinRows = 16;
constexpr int kAmxGroup = 32;       // weight rows per group (2 tiles)
constexpr int64_t kAmxSlice = 512;  // columns decoded at a time (16 k-steps)

inline bool amx4_applies(int64_t M) {
  if (M < kAmx4MinRows || !(cpu_features() & CPU_AMX_BF16) || !bf16dot_native()) return false;
  const char *e = std::getenv("BNB_MS_4BIT_AMX");  // read per call: a test or user may switch it at run time
  return !(e && std::strcmp(e, "0") == 0);
}

// x (M rows of K32 bf16) as the second operand, m-tiles of 16 rows zero-padded: xp[((mt * KS + ks) * 16 + p) * 32 +
// 2 mi + e] = x[16 mt + mi][32 ks + 2 p + e].
void pack_x_amx(const uint16_t *x, int64_t M, int64_t K32, uint16_t *xp) {
  const int64_t Mt = (M + 15) / 16, KS = K32 / kChunk;
  parallel_for(Mt, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t mt = t0; mt < t1; ++mt)
      for (int64_t ks = 0; ks < KS; ++ks) {
        uint16_t *t = xp + (mt * KS + ks) * 512;
        for (int mi = 0; mi < 16; ++mi) {
          const int64_t m = 16 * mt + mi;
          const uint16_t *xr = x + m * K32 + ks * kChunk;
          for (int p = 0; p < 16; ++p) {
            t[p * 32 + 2 * mi] = m < M ? xr[2 * p] : 0;
            t[p * 32 + 2 * mi + 1] = m < M ? xr[2 * p + 1] : 0;
          }
        }
      }
  });
}

// Weight rows n..n+R-1 (R <= kAmxGroup) against every x row: r[m * kAmxGroup + j].  Tiles: C^T in tmm0 (rows 0-15
// of the group, m-tile mt), tmm1 (rows 16-31, mt), tmm2 / tmm3 (the same for mt + 1); weights tmm4 / tmm5; x tmm6 / tmm7.
BNB_MS_TARGET_AMX_BF16 void dot_rows_bf16_amx_bf16(const float *code, const uint8_t *q, const float *am,
                                                   int64_t blk_off, int64_t n, int R, int64_t K, int64_t bs,
                                                   const uint16_t *xp, int64_t M, int64_t K32, uint16_t *wbuf,
                                                   float *acc, float *r) {
  const int64_t Mt = (M + 15) / 16, KS = K32 / kChunk;
  constexpr int64_t ws = kAmxSlice * 2;  // bytes between decoded rows
  if (R < kAmxGroup) std::memset(wbuf + R * kAmxSlice, 0, sizeof(uint16_t) * (size_t)((kAmxGroup - R) * kAmxSlice));
  for (int64_t c0 = 0; c0 < K32; c0 += kAmxSlice) {
    const int64_t c1 = std::min(c0 + kAmxSlice, K32), ns = (c1 - c0) / kChunk, k0 = c0 / kChunk;
    for (int j = 0; j < R; ++j) {
      if (c1 < K) {  // the next slice's packed bytes of this row (as the vdpbf16ps kernel)
        const uint8_t *nx = q + ((n + j) * K + c1) / 2;
        for (int64_t b = 0; b < kAmxSlice / 2; b += 64) _mm_prefetch((const char *)(nx + b), _MM_HINT_T0);
      }
      decode_row_bf16_avx512bf16(code, q, am, blk_off, n + j, K, c0, c1, bs, wbuf + j * kAmxSlice);
      if (c1 - c0 < kAmxSlice) std::memset(wbuf + j * kAmxSlice + (c1 - c0), 0, sizeof(uint16_t) * (size_t)(kAmxSlice - (c1 - c0)));
    }
    for (int64_t mt = 0; mt < Mt; mt += 2) {
      const bool two = mt + 1 < Mt;
      float *a0 = acc + mt * 512, *a1 = a0 + 512;
      if (c0 == 0) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      } else {
        _tile_loadd(0, a0, 64);
        _tile_loadd(1, a0 + 256, 64);
        if (two) {
          _tile_loadd(2, a1, 64);
          _tile_loadd(3, a1 + 256, 64);
        }
      }
      const uint16_t *x0 = xp + (mt * KS + k0) * 512, *x1 = x0 + KS * 512;
      for (int64_t ks = 0; ks < ns; ++ks) {
        _tile_loadd(4, wbuf + ks * kChunk, ws);
        _tile_loadd(5, wbuf + 16 * kAmxSlice + ks * kChunk, ws);
        _tile_loadd(6, x0 + ks * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 5, 6);
        if (two) {
          _tile_loadd(7, x1 + ks * 512, 64);
          _tile_dpbf16ps(2, 4, 7);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, a0, 64);
      _tile_stored(1, a0 + 256, 64);
      if (two) {
        _tile_stored(2, a1, 64);
        _tile_stored(3, a1 + 256, 64);
      }
    }
  }
  for (int64_t m = 0; m < M; ++m)
    for (int j = 0; j < R; ++j) r[m * kAmxGroup + j] = acc[(m / 16) * 512 + (j / 16) * 256 + (j % 16) * 16 + m % 16];
}

// ---- bf16 compute, one activation row (decode) ------------------------------------------------------
// K a multiple of 64 and of the blocksize, the blocksize a power of two >= 64: a kernel that decodes in registers
// and scales per 64-element half unit, as upstream's AVX512-BF16 gemv scales per block (the table kernel above
// rounds code * absmax per block, which costs as much as the dot products at one row).  Decode: each packed byte
// zero-extended to a word (vpmovzxbw) is its own vpermw index (vpermw reads 5 bits: the table holds bf16(code)
// twice, so the high nibble's low bit in bit 4 does not matter), and shifted right by 4 the high nibble's; 8 vector
// ops per 128 weights where vpshufb on the code's two bytes and unpacking them took 11 (Zen 4 issues two 512-bit
// ops a cycle: the loop is op-bound; ~1.17x in L1 on the EPYC measured).  Arithmetic (the portable kernel and
// _reference.gemv_bf16_rows are its twins, bit for bit):
//   * w = bf16(code[nibble]) (code rounded once, flushed), x flushed bf16.
//   * row cut into 128-element units (64 packed bytes), each into halves h = 0, 1 (elements 64 h .. 64 h + 63,
//     bytes 32 h ..); a K of an odd number of 64s (SmolLM2's 576) ends in a unit of half 0 alone.  Per half two word vectors: E (word j = element 64 h + 2 j, the high nibble of byte j) and
//     O (word j = element 64 h + 2 j + 1, the low nibble).  fp32 lane l takes words 2l + 1 then 2l (vdpbf16ps: odd
//     word first, ftz after each fma): chain s_h = E then O, from 0 in each unit, i.e. elements 4l + 2, 4l,
//     4l + 3, 4l + 1 of the half.
//   * acc_h[l] = fma(s_h[l], sc_h, acc_h[l]) with sc_h the absmax of the half's block; t = acc_0 + acc_1 reduced
//     over lanes as the table kernel's rows, rounded and the bias added as there.  The bound above holds (the
//     code's rounding, 2^-9 S, replaces the products'), and tests check it.
constexpr int64_t kUnit1 = 128;

// Rows up to kBf16RowKernelMaxRows run it too, each as if alone, the weights read once for all of them: the table
// kernel below decodes every weight into bf16 first, which at few rows costs more than the rows' products.  One
// 11008 x 4096 layer (clinear_4bit_bf16dot_bf16, 2-core Zen 4 EPYC): table kernel 2.90 / 3.40 / 4.49 / 6.38 ms at
// 2 / 4 / 8 / 16 rows, this kernel 1.07 / 1.88 / 4.36 / 8.40 (one row 0.95): the crossover near 8.  (The fused
// decoder's own limit, decoder.cpp kBf16GemvMaxRows, is 16: its many-row kernel is another, the panel GEMM.)
constexpr int64_t kBf16RowKernelMaxRows = 8;

BNB_MS_INLINE bool bf16_gemv_applies(int64_t M, int64_t K, int64_t bs) {
  return M >= 1 && M <= kBf16RowKernelMaxRows && bs >= 64 && (bs & (bs - 1)) == 0 && K % bs == 0 && K % (kUnit1 / 2) == 0;
}

// Halves of the unit starting at element u (the last unit of a K = 64 (2 j + 1) has one).
BNB_MS_INLINE int unit_halves(int64_t u, int64_t K) { return K - u >= kUnit1 ? 2 : 1; }

// Element (0..127) of a unit that word w (0..31) of vector R (0 = E, 1 = O of half 0; 2 = E, 3 = O of half 1) holds.
BNB_MS_INLINE int unit_elem(int R, int w) { return 64 * (R >> 1) + 2 * w + (R & 1); }

void gemv_bf16_rows_portable(const float *code, const uint8_t *q, const float *am, int64_t blk_off, const uint16_t *x,
                             int64_t K, int64_t bs, int64_t n0, int64_t n1, float *r) {
  float wc[kCode4];
  for (int i = 0; i < kCode4; ++i) wc[i] = bf16f(to_bf16_flushed(code[i]));
  for (int64_t n = n0; n < n1; ++n) {
    float acc[2][kLanes] = {};
    const int64_t r0 = n * K;
    for (int64_t u = 0; u < K; u += kUnit1) {
      for (int h = 0; h < unit_halves(u, K); ++h) {
        float sv[kLanes] = {};
        for (int l = 0; l < kLanes; ++l)
          for (int R : {2 * h, 2 * h + 1})  // E then O
            for (int w : {2 * l + 1, 2 * l}) {
              const int64_t e = u + unit_elem(R, w);
              sv[l] = ftz32(std::fma(wc[nib_at(q, r0 + e)], bf16f(x[e]), sv[l]));
            }
        const float sc = am[(r0 + u + 64 * h) / bs - blk_off];
        for (int l = 0; l < kLanes; ++l) acc[h][l] = std::fma(sv[l], sc, acc[h][l]);
      }
    }
    float t[kLanes];
    for (int l = 0; l < kLanes; ++l) t[l] = acc[0][l] + acc[1][l];
    r[n - n0] = lanes_reduce(t);
  }
}

// The scale of block b for the one-row kernel: the fp32 absmax array (from block `off` on), or the double-quant
// codes decoded where they are read (code2[q[b]] * absmax2[b / bs2] + offset: an fp32 multiply, then an add, as
// nested_absmax's; decoding runs of them ahead into a buffer cost the kernel 9-16% on the EPYC measured).
struct ScaleF32 {
  const float *am;
  int64_t off;
  BNB_MS_INLINE float at(int64_t b) const { return am[b - off]; }
};
// SH2: log2(bs2) known at compile time (8: upstream's nested blocksize 256), or 0 (read at run time: a
// variable shift is 3 uops on Intel and a division more; the one-row kernel reads two scales per 128 weights).
template <int SH2 = 0>
struct ScaleNested {
  const uint8_t *q;
  const float *code2, *absmax2;
  float offset;
  int64_t bs2;
  int sh2;  // log2(bs2) when bs2 is a power of two, else -1
  explicit ScaleNested(const Absmax4 &a)
      : q(a.q), code2(a.code2), absmax2(a.absmax2), offset(a.offset), bs2(a.bs2),
        sh2((a.bs2 & (a.bs2 - 1)) == 0 ? __builtin_ctzll((unsigned long long)a.bs2) : -1) {}
  BNB_MS_INLINE float at(int64_t b) const {
    const float s = code2[q[b]] * absmax2[SH2 ? b >> SH2 : sh2 >= 0 ? b >> sh2 : b / bs2];
    return s + offset;
  }
};

// Software prefetch of the weight stream, this many bytes ahead (T0: into every level).  Why: a decode step's
// 4-bit weights come from L3 or memory, and the hardware prefetchers alone kept too few lines in flight (one
// thread read ~3 GB/s of a SmolLM2 layer's weights where numpy streams 16): on the 2-core Xeon (AMX) measured,
// SmolLM2 NF4 decode 14.2 -> 12.2 ms/token at 2 KiB (1 KiB 12.0-12.7, 4 KiB 11.5 but 2x slower on 22 MB
// matrices: 4 KiB apart lines alias in L1), 4096 x 11008 from L3 1.25 -> 1.14 ms, 40 such matrices from memory
// 3.1 -> 1.7 ms each (3, 8 and 16 KiB, or a T1 hint: the same).  (A non-temporal hint, which helped on a Zen 4
// EPYC, halved the speed here.)  A prefetch past the matrix's end is harmless: prefetches do not fault.
constexpr int64_t kPF = 2048;
// xs: x in the kernel's order, per unit the words of E, O of half 0, then of half 1 (32 each).
// SH: log2(bs) known at compile time (6: blocksize 64, the 4-bit default) or 0 (read at run time; see ScaleNested).
// One weight row (packed bytes from qr, first block b0) against MR activation rows (xs: MR rows of K words in the
// kernel's order, one after another): each unit decoded once, then every row's chains exactly as one row's (the
// same operations in the same order, so row m's result is the one-row kernel's bits on that row alone).
template <int SH, int MR, class Scale>
BNB_MS_TARGET_AVX512BF16 BNB_MS_INLINE void bf16_row_dots(__m512i t, const uint8_t *qr, int64_t b0, const uint16_t *xs,
                                                          int64_t K, int sh, const Scale &scale, float *res,
                                                          int64_t ldr) {
  __m512 acc0[MR], acc1[MR];
  for (int m = 0; m < MR; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  const int64_t K2 = K - K % kUnit1;  // whole units; then a half unit where K is an odd number of 64s
  for (int64_t u = 0; u < K2; u += kUnit1, qr += kUnit1 / 2) {
    _mm_prefetch((const char *)(qr + kPF), _MM_HINT_T0);  // see kPF
    const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)qr));
    const __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qr + 32)));
    const __m512bh ea = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(a, 4), t);
    const __m512bh eb = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(b, 4), t);
    const __m512bh oa = (__m512bh)_mm512_permutexvar_epi16(a, t), ob = (__m512bh)_mm512_permutexvar_epi16(b, t);
    const __m512 sc0 = _mm512_set1_ps(scale.at(b0 + (u >> sh))), sc1 = _mm512_set1_ps(scale.at(b0 + ((u + 64) >> sh)));
    for (int m = 0; m < MR; ++m) {
      const uint16_t *xu = xs + m * K + u;
      __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), ea, bh(xu));
      __m512 s2 = _mm512_dpbf16_ps(_mm512_setzero_ps(), eb, bh(xu + 64));
      s = _mm512_dpbf16_ps(s, oa, bh(xu + 32));
      s2 = _mm512_dpbf16_ps(s2, ob, bh(xu + 96));
      acc0[m] = _mm512_fmadd_ps(s, sc0, acc0[m]);
      acc1[m] = _mm512_fmadd_ps(s2, sc1, acc1[m]);
    }
  }
  if (K2 < K) {  // half 0 of the last unit: its E then O words, into acc0 as every half 0
    const __m512i a = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)qr));
    const __m512bh ea = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(a, 4), t);
    const __m512bh oa = (__m512bh)_mm512_permutexvar_epi16(a, t);
    const __m512 sc0 = _mm512_set1_ps(scale.at(b0 + (K2 >> sh)));
    for (int m = 0; m < MR; ++m) {
      const uint16_t *xu = xs + m * K + K2;
      __m512 s = _mm512_dpbf16_ps(_mm512_setzero_ps(), ea, bh(xu));
      s = _mm512_dpbf16_ps(s, oa, bh(xu + 32));
      acc0[m] = _mm512_fmadd_ps(s, sc0, acc0[m]);
    }
  }
  for (int m = 0; m < MR; ++m) res[m * ldr] = reduce16_avx512(_mm512_add_ps(acc0[m], acc1[m]));
}

// Weight rows [n0, n1) against M activation rows (xs: M x K words, the kernel's order): r[m * (n1 - n0) + n - n0].
// Rows go 4 at a time through each weight row (the row is read from memory once; a second group of 4 finds it in L1).
// SH: log2(bs) known at compile time (6: blocksize 64, the 4-bit default) or 0 (read at run time; see ScaleNested).
template <int SH, class Scale>
BNB_MS_TARGET_AVX512BF16 void gemv_bf16_rows_avx512bf16(const float *code, const uint8_t *q, const Scale &scale,
                                                        const uint16_t *xs, int64_t M, int64_t K, int64_t bs,
                                                        int64_t n0, int64_t n1, float *r) {
  alignas(64) uint16_t tab[32];  // bf16(code[i & 15]): vpermw's 5-bit index
  for (int i = 0; i < 32; ++i) tab[i] = to_bf16_flushed(code[i % kCode4]);
  const __m512i t = _mm512_load_si512(tab);
  const int sh = SH ? SH : __builtin_ctzll((unsigned long long)bs);  // bs a power of two (bf16_gemv_applies)
  const int64_t ldr = n1 - n0;
  for (int64_t n = n0; n < n1; ++n) {
    const int64_t r0 = n * K, b0 = r0 >> sh;  // the row's first block (K is a multiple of bs)
    const uint8_t *qr = q + r0 / 2;
    for (int64_t m = 0; m < M; m += 4) {
      const uint16_t *xm = xs + m * K;
      float *rm = r + m * ldr + (n - n0);
      switch (std::min<int64_t>(4, M - m)) {
        case 1: bf16_row_dots<SH, 1>(t, qr, b0, xm, K, sh, scale, rm, ldr); break;
        case 2: bf16_row_dots<SH, 2>(t, qr, b0, xm, K, sh, scale, rm, ldr); break;
        case 3: bf16_row_dots<SH, 3>(t, qr, b0, xm, K, sh, scale, rm, ldr); break;
        default: bf16_row_dots<SH, 4>(t, qr, b0, xm, K, sh, scale, rm, ldr); break;
      }
    }
  }
}

// Double quant in the one-row kernel: where its per-block scales come from (the same two roundings, the same bytes,
// either way).  Decoded in the kernel (ScaleNested, below) measured best on the AVX-512 EPYC (Zen 4): 11008 x 4096
// on 2 threads 1.11 -> 0.82 ms against the runs.  Decoded ahead into L1 runs (absmax_runs: 64 at a time with VBMI,
// then ScaleF32) measured best on the Intel Xeon (AMX) of 2026-12-06: 88 distinct 4096 x 11008 matrices from
// memory, 2 threads, 12.8-14.6 -> 15.3-16.5 GB/s (a plain fp32 absmax: 14.6-17.7), the same from cache.  So: runs on
// Intel CPUs with VBMI, in the kernel elsewhere (BNB_MS_SIMD=avx512-novbmi makes an Intel machine test both).
inline bool nested_scales_in_kernel() {
  static const bool k = !(cpu_is_intel() && has_avx512vbmi());
  return k;
}

// M activation rows (xb: M x K flushed bf16; M > 1 is the fused decoder's few-row steps): each row's results are
// the one-row kernel's on that row alone, the weights read once for all of them.
template <class T>
void gemv4_bf16dot(const float *code, const uint8_t *q, const Absmax4 &amx, const uint16_t *xb, const T *bias, T *out,
                   int64_t M, int64_t N, int64_t K, int64_t bs) {
  const bool native = bf16dot_native();
  static thread_local std::vector<uint16_t> xs;  // the native kernel's order, M rows of K
  if (native) {
    xs.resize((size_t)(M * K));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t u = 0; u < K; u += kUnit1)
        for (int R = 0; R < 2 * unit_halves(u, K); ++R)
          for (int w = 0; w < 32; ++w) xs[m * K + u + 32 * R + w] = xb[m * K + u + unit_elem(R, w)];
  }
  const uint16_t *xsp = xs.data();
  // res: M rows of (n1 - n0) results
  auto finish = [&](int64_t n0, int64_t n1, const float *res) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = n0; n < n1; ++n) out[m * N + n] = with_bias(from_f32<T>(res[m * (n1 - n0) + n - n0]), bias, n);
  };
  if (native && amx.nested() && nested_scales_in_kernel()) {  // double quant: its codes decoded inside the kernel
    const bool common = bs == 64 && amx.bs2 == 256;  // the defaults: shifts by constants
    gemv4_parallel_rows(N, K * M, [&](int64_t n0, int64_t n1) {
      static thread_local std::vector<float> res;
      res.resize((size_t)(M * (n1 - n0)));
      if (common) gemv_bf16_rows_avx512bf16<6>(code, q, ScaleNested<8>(amx), xsp, M, K, bs, n0, n1, res.data());
      else gemv_bf16_rows_avx512bf16<0>(code, q, ScaleNested<>(amx), xsp, M, K, bs, n0, n1, res.data());
      finish(n0, n1, res.data());
    });
    return;
  }
  gemv4_parallel_rows(N, K * M, absmax_runs(amx, K, bs, 1, [&](int64_t n0, int64_t n1, const float *am, int64_t off) {
    static thread_local std::vector<float> res;
    res.resize((size_t)(M * (n1 - n0)));
    if (native && bs == 64) gemv_bf16_rows_avx512bf16<6>(code, q, ScaleF32{am, off}, xsp, M, K, bs, n0, n1, res.data());
    else if (native) gemv_bf16_rows_avx512bf16<0>(code, q, ScaleF32{am, off}, xsp, M, K, bs, n0, n1, res.data());
    else
      for (int64_t m = 0; m < M; ++m)
        gemv_bf16_rows_portable(code, q, am, off, xb + m * K, K, bs, n0, n1, res.data() + m * (n1 - n0));
    finish(n0, n1, res.data());
  }));
}

template <class T>
void linear_4bit_bf16dot(const float *code, const uint8_t *q, const Absmax4 &amx, const T *A, const T *bias, T *out,
                         int64_t M, int64_t N, int64_t K, int64_t bs) {
  const bool native = bf16dot_native();
  const int64_t K32 = (K + kChunk - 1) / kChunk * kChunk;
  static thread_local Scratch<uint16_t> xb;  // x as flushed bf16, rows zero-padded to K32
  uint16_t *xbp = xb.get((size_t)(M * K32));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xbp[m * K32 + k] = to_bf16_flushed(to_f32(A[m * K + k]));
    for (int64_t k = K; k < K32; ++k) xbp[m * K32 + k] = 0;
  }
  const uint16_t *xp = xbp;
  if (bf16_gemv_applies(M, K, bs)) {  // up to 8 rows: the one-row kernel above for each (its own arithmetic, see there)
    gemv4_bf16dot<T>(code, q, amx, xp, bias, out, M, N, K, bs);
    return;
  }
  if (amx4_applies(M)) {  // AMX-BF16 (see there)
    static thread_local Scratch<uint16_t> xpk;
    const int64_t Mt = (M + 15) / 16;
    uint16_t *xk = xpk.get((size_t)(Mt * K32 * 16));
    pack_x_amx(xp, M, K32, xk);
    gemv4_parallel_rows(N, K * std::max<int64_t>(1, M / 4), absmax_runs(amx, K, bs, kRowGroup, [&](int64_t n0, int64_t n1, const float *am, int64_t off) {
      static thread_local Scratch<uint16_t> wb;
      static thread_local Scratch<float> acc, res;
      uint16_t *w = wb.get((size_t)(kAmxGroup * kAmxSlice));
      float *a = acc.get((size_t)(Mt * 512)), *rs = res.get((size_t)(M * kAmxGroup));
      amx_configure();
      for (int64_t n = n0; n < n1; n += kAmxGroup) {
        const int R = (int)std::min<int64_t>(kAmxGroup, n1 - n);
        dot_rows_bf16_amx_bf16(code, q, am, off, n, R, K, bs, xk, M, K32, w, a, rs);
        for (int64_t m = 0; m < M; ++m)
          for (int j = 0; j < R; ++j) out[m * N + n + j] = with_bias(from_f32<T>(rs[m * kAmxGroup + j]), bias, n + j);
      }
      amx_release();
    }), kRowGroup);
    return;
  }
  gemv4_parallel_rows(N, K * std::max<int64_t>(1, M / 4), absmax_runs(amx, K, bs, kRowGroup, [&](int64_t n0, int64_t n1, const float *am, int64_t off) {
    static thread_local Scratch<uint16_t> wrows;  // kRowGroup decoded weight rows (native: K slices)
    static thread_local std::vector<float> res;
    static thread_local Scratch<float> acc;  // the native kernel's chains
    uint16_t *wr = wrows.get((size_t)(kRowGroup * (native ? kSliceK : K32) + kChunk));
    res.resize((size_t)(M * kRowGroup));
    float *accp = native ? acc.get((size_t)(M * kRowGroup * kLanes)) : nullptr;
    for (int64_t n = n0; n < n1; n += kRowGroup) {
      const int R = (int)std::min<int64_t>(kRowGroup, n1 - n);
      if (native) {
        dot_rows_bf16_avx512bf16(code, q, am, off, n, R, K, bs, xp, M, K32, wr, accp, res.data());
      } else {
        const uint16_t *wp[kRowGroup];
        for (int j = 0; j < R; ++j) {
          uint16_t *wj = wr + j * K32;
          decode_row_bf16_portable(code, q, am, off, n + j, K, K32, bs, wj);
          wp[j] = wj;
        }
        dot_rows_bf16_portable(wp, R, xp, M, K32, res.data());
      }
      for (int64_t m = 0; m < M; ++m)
        for (int j = 0; j < R; ++j) out[m * N + n + j] = with_bias(from_f32<T>(res[m * kRowGroup + j]), bias, n + j);
    }
  }), kRowGroup);
}

// The fused inference forward of a 4-bit linear layer: one row runs gemv_4bit (the gemv_4bit op's bits), more rows
// gemm_4bit; the double-quant absmax is decoded in the kernel and the bias added, one call per layer (see
// bitsandbytes_ms/_native_table.py, clinear_4bit_*).
// params: A T[..., K], B u8[>= (N*K+1)/2], absmax f32[nb] | u8[nb] (nested), code f32[16],
//   absmax2 f32[>= ceil(nb/bs2)] | none, code2 f32[256] | none, offset f32 0-d | none, bias T[N] | none,
//   blocksize i64, blocksize2 i64, n_out i64 -> out T[..., N]        (nb = ceil(N*K/blocksize))
template <class T, bool BF16DOT = false>
int linear4_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Linear4<T> a;
  if (int st = checks::linear4(c, &a)) return st;
  if (a.empty) return OK;
  const int64_t M = a.M, N = a.N, K = a.K;
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) a.out[m * N + n] = with_bias(from_f32<T>(0.0f), a.bias, n);
    return OK;
  }
  const Absmax4 amx = Absmax4::of(a.absmax, a.nested ? a.absmax_q : nullptr, a.code2, a.absmax2, a.offset, a.bs2);
  if (BF16DOT) linear_4bit_bf16dot<T>(a.code, a.B, amx, a.A, a.bias, a.out, M, N, K, a.bs);
  else if (M == 1) gemv_4bit<T>(a.code, a.B, amx, a.A, a.bias, a.out, M, N, K, a.bs);
  else gemm_4bit<T>(a.code, a.B, amx, a.A, a.bias, a.out, M, N, K, a.bs);
  return OK;
}

}  // namespace

static Absmax4 absmax_of(const Linear4Weight &w) {
  return Absmax4::of(w.absmax_f32, w.absmax_q, w.code2, w.absmax2, w.offset, w.blocksize2);
}

// Internal wrappers for other feature files (linear_kernels.h).
void linear4_f32(const Linear4Weight &w, const float *A, const float *bias, float *out, int64_t M, int64_t N,
                 int64_t K) {
  if (linear_without_products(bias, out, M, N, K)) return;
  gemv_4bit<float>(w.code, w.packed, absmax_of(w), A, bias, out, M, N, K, w.blocksize);
}

// fp32 activation rows through the one-row bf16 kernel ("bf16 compute, one activation row": x rounded to bf16, each
// row's results the bits of clinear_4bit_bf16dot_bf16 on that one bf16 row, kept in fp32; the weights read once for
// all M rows).  False where the kernel does not apply to the shape (bf16_gemv_applies); the caller then runs
// linear4_f32.
bool linear4_bf16_gemv_f32(const Linear4Weight &w, const float *A, const float *bias, float *out, int64_t M, int64_t N,
                           int64_t K) {
  if (!bf16_gemv_applies(1, K, w.blocksize)) return false;
  if (linear_without_products(bias, out, M, N, K)) return true;
  static thread_local Scratch<uint16_t> xb;  // A as flushed bf16 (as linear_4bit_bf16dot rounds it)
  uint16_t *x = xb.get((size_t)(M * K));
  for (int64_t i = 0; i < M * K; ++i) x[i] = to_bf16_flushed(A[i]);
  gemv4_bf16dot<float>(w.code, w.packed, absmax_of(w), x, bias, out, M, N, K, w.blocksize);
  return true;
}

// Weight rows [n0, n1) as flushed bf16 words (row-major, Kw >= K words each, zeros past K): bf16(code[nibble] *
// absmax), the fp32 product of dequantize_4bit rounded once -- the words the bf16 panel GEMM packs (what rounding
// decode4_rows_f32's values gives, without writing and re-reading them in fp32).
void decode4_rows_bf16(const Linear4Weight &w, int64_t n0, int64_t n1, int64_t K, int64_t Kw, uint16_t *dst) {
  if (n1 <= n0) return;
  int64_t off;
  const float *am = absmax_of(w).rows(n0, n1, K, w.blocksize, &off);
  const bool native = bf16dot_native();
  for (int64_t n = n0; n < n1; ++n) {
    uint16_t *row = dst + (n - n0) * Kw;
    if (native) decode_row_bf16_avx512bf16(w.code, w.packed, am, off, n, K, 0, Kw, w.blocksize, row);
    else decode_row_bf16_portable(w.code, w.packed, am, off, n, K, Kw, w.blocksize, row);
  }
}

// Weight rows [n0, n1) dequantized to fp32 (row-major, K values each): code[nibble] * absmax of the block,
// the bytes of dequantize_4bit.
void decode4_rows_f32(const Linear4Weight &w, int64_t n0, int64_t n1, int64_t K, float *dst) {
  if (n1 <= n0 || K == 0) return;
  const SimdLevel lvl = simd_level();
  int64_t off;
  const float *am = absmax_of(w).rows(n0, n1, K, w.blocksize, &off);
  for (int64_t n = n0; n < n1; ++n) {
    float *row = dst + (n - n0) * K;
    if (lvl >= SimdLevel::avx512) dequantize_4bit_row_avx512(w.code, w.packed, am, off, n, K, K, w.blocksize, row);
    else if (lvl >= SimdLevel::avx2) dequantize_4bit_row_avx2(w.code, w.packed, am, off, n, K, K, w.blocksize, row);
    else dequantize_4bit_row_portable(w.code, w.packed, am, off, n, K, K, w.blocksize, row);
  }
}

}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cquantize_blockwise_fp32_fp4, bnb_ms::quantize4_entry<float>)
BNB_MS_ENTRY(cquantize_blockwise_fp16_fp4, bnb_ms::quantize4_entry<fp16_t>)
BNB_MS_ENTRY(cquantize_blockwise_bf16_fp4, bnb_ms::quantize4_entry<bf16_t>)
BNB_MS_ENTRY(cquantize_blockwise_fp32_nf4, bnb_ms::quantize4_entry<float>)
BNB_MS_ENTRY(cquantize_blockwise_fp16_nf4, bnb_ms::quantize4_entry<fp16_t>)
BNB_MS_ENTRY(cquantize_blockwise_bf16_nf4, bnb_ms::quantize4_entry<bf16_t>)
BNB_MS_ENTRY(cdequantize_blockwise_fp32_fp4, bnb_ms::dequantize4_entry<float, true>)
BNB_MS_ENTRY(cdequantize_blockwise_fp16_fp4, bnb_ms::dequantize4_entry<fp16_t, true>)
BNB_MS_ENTRY(cdequantize_blockwise_bf16_fp4, bnb_ms::dequantize4_entry<bf16_t, true>)
BNB_MS_ENTRY(cdequantize_blockwise_fp32_nf4, bnb_ms::dequantize4_entry<float, false>)
BNB_MS_ENTRY(cdequantize_blockwise_fp16_nf4, bnb_ms::dequantize4_entry<fp16_t, false>)
BNB_MS_ENTRY(cdequantize_blockwise_bf16_nf4, bnb_ms::dequantize4_entry<bf16_t, false>)
BNB_MS_ENTRY(cgemm_4bit_inference_naive_fp32, bnb_ms::gemv4_entry<float>)
BNB_MS_ENTRY(cgemm_4bit_inference_naive_fp16, bnb_ms::gemv4_entry<fp16_t>)
BNB_MS_ENTRY(cgemm_4bit_inference_naive_bf16, bnb_ms::gemv4_entry<bf16_t>)
BNB_MS_ENTRY(clinear_4bit_fp32, bnb_ms::linear4_entry<float>)
BNB_MS_ENTRY(clinear_4bit_fp16, bnb_ms::linear4_entry<fp16_t>)
BNB_MS_ENTRY(clinear_4bit_bf16, bnb_ms::linear4_entry<bf16_t>)
// The bf16-compute forward (bf16 dot product; see "bf16 compute" above), same arguments as clinear_4bit_bf16.
BNB_MS_ENTRY(clinear_4bit_bf16dot_bf16, bnb_ms::linear4_entry<bf16_t, true>)
// Which kernel clinear_4bit_bf16dot_bf16 runs: "avx512bf16" or "portable" (diagnostics; same bits either way).
BNB_MS_EXPORT const char *bnb_ms_linear4_bf16dot_path() { return bnb_ms::bf16dot_native() ? "avx512bf16" : "portable"; }
// The kernel of clinear_4bit_bf16dot_bf16 for `rows` rows of x: "amx" (AMX-BF16 from 16 rows: the tile unit's sum
// order, within the same bound), "avx512bf16" or "portable" (these two: the same bits).
BNB_MS_EXPORT const char *bnb_ms_linear4_bf16dot_path_for_rows(int64_t rows) {
  return bnb_ms::amx4_applies(rows) ? "amx" : bnb_ms_linear4_bf16dot_path();
}
