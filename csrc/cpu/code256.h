// code256.h -- code[q] of a 256-entry fp32 code for AVX-512 loops, two ways with one interface (kN indices per
// lookup, kN / 16 vectors out): Code256Gather (16-lane gathers) and Code256Vbmi.
//
// Code256Vbmi: 64 bytes q at a time with AVX-512 VBMI, without a gather: a 256-entry fp32
// code is held as four 256-byte planes (plane k: byte k of every entry), each looked up with two vpermi2b
// (128 entries each) and a blend on the top bit of q; unpacking the four planes (which works inside 128-bit
// lanes) rebuilds the floats.  The 64 indices are first permuted (vpermb) so that the floats come out in index
// order.  The same fp32 values as code[q[i]], bit for bit (measured on the AVX-512 EPYC: ~8x a 16-lane gather
// loop).  Used where 8-bit codes are decoded: the double-quant absmax of 4-bit weights, dequantize_blockwise,
// the 8-bit optimizers' states.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/cpu_features.h"

namespace bnb_ms {

struct Code256Gather {
  static constexpr int kN = 16;
  const float *code = nullptr;
  void init(const float *c) { code = c; }
  BNB_MS_TARGET_AVX512 BNB_MS_INLINE void lookup(const uint8_t *q, __m512 v[1]) const {
    v[0] = _mm512_i32gather_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q)), code, 4);
  }
};

struct Code256Vbmi {
  static constexpr int kN = 64;
  __m512i plane[4][4];  // plane[k][j]: byte k of code[64 j .. 64 j + 63]
  __m512i perm;

  BNB_MS_TARGET_AVX512VBMI void init(const float *code) {
    alignas(64) uint8_t b[4][256];
    for (int i = 0; i < 256; ++i) {
      uint32_t u;
      std::memcpy(&u, code + i, 4);
      for (int k = 0; k < 4; ++k) b[k][i] = (uint8_t)(u >> (8 * k));
    }
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 4; ++j) plane[k][j] = _mm512_load_si512(b[k] + 64 * j);
    // after the unpacks, register r, 128-bit lane L, dword t holds index position 16 L + 4 r + t; it must hold
    // position 16 r + 4 L + t
    alignas(64) uint8_t p[64];
    for (int L = 0; L < 4; ++L)
      for (int r = 0; r < 4; ++r)
        for (int t = 0; t < 4; ++t) p[16 * L + 4 * r + t] = (uint8_t)(16 * r + 4 * L + t);
    perm = _mm512_load_si512(p);
  }

  // v[r] lane t = code[q[16 r + t]], r = 0..3
  BNB_MS_TARGET_AVX512VBMI BNB_MS_INLINE void lookup(const uint8_t *q, __m512 v[4]) const {
    const __m512i idx = _mm512_permutexvar_epi8(perm, _mm512_loadu_si512(q));
    const __mmask64 upper = _mm512_movepi8_mask(idx);  // q >= 128
    __m512i p[4];
    for (int k = 0; k < 4; ++k)
      p[k] = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(plane[k][0], idx, plane[k][1]),
                                    _mm512_permutex2var_epi8(plane[k][2], idx, plane[k][3]));
    const __m512i w01l = _mm512_unpacklo_epi8(p[0], p[1]), w01h = _mm512_unpackhi_epi8(p[0], p[1]);
    const __m512i w23l = _mm512_unpacklo_epi8(p[2], p[3]), w23h = _mm512_unpackhi_epi8(p[2], p[3]);
    v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01l, w23l));
    v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01l, w23l));
    v[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01h, w23h));
    v[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01h, w23h));
  }
};

// dst[i] = code[q[i]] * scale (one fp32 multiply), i < n.
inline BNB_MS_TARGET_AVX512VBMI void code256_scaled(const Code256Vbmi &lut, const float *code, const uint8_t *q,
                                                    float scale, int64_t n, float *dst) {
  const __m512 vs = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m512 v[4];
    lut.lookup(q + i, v);
    for (int k = 0; k < 4; ++k) _mm512_storeu_ps(dst + i + 16 * k, _mm512_mul_ps(v[k], vs));
  }
  for (; i < n; ++i) dst[i] = code[q[i]] * scale;
}

}  // namespace bnb_ms
