// quant_lut.h -- the 65536-bin grid that maps a normalized value in [-1, 1] to the nearest entry of a
// 256-entry code, as upstream bitsandbytes' CPU kernels do (csrc/cpu_ops.cpp, quantize_cpu_impl):
// idx = trunc(fma((clamp(v) + 1) * 0.5, 65535, 0.5)); table[idx] = first code index whose midpoint with
// its successor is >= the bin value -1 + 2*idx/65535 (ties go to the lower index).  Shared by blockwise
// quantization and the 8-bit optimizers' state requantization (same bytes in both).
//
// The SIMD paths compute the grid index in vectors (quant_grid_index8/16).  The AVX2 paths look the codes
// up with scalar loads (lut_codes): on the AVX2 CPU measured (AMD Zen 3) eight scalar byte loads take ~0.6x
// the time of one 8-lane vpgatherdd, and a code table does not fit in registers; their dequantization looks
// code[q] * absmax up in a per-block table of the output type (table_lookup) for the same reason.  The
// AVX-512 paths gather (lut_gather16): on the AVX-512 CPU measured (Intel Xeon, Sapphire Rapids class) a
// 16-lane gather is 1.2-1.5x faster than the scalar loads.
#pragma once
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cpu/cpu_features.h"

namespace bnb_ms {

constexpr int kQuantCode = 256;
constexpr int kQuantLut = 65536;

// Padded by 4 bytes so a 32-bit gather at the last index stays inside the allocation.
struct QuantLut {
  float code[kQuantCode];
  alignas(64) uint8_t table[kQuantLut + 4];
  uint8_t zero;  // the entry nearest 0 (lowest index on ties): an exact 0 in a block of subnormals
};

// The table for `code` (256 floats), built on first use and cached by the code's contents
// (thread-safe; a few slots, since codes are reused call after call).
const QuantLut *get_quant_lut(const float *code);

BNB_MS_INLINE uint32_t quant_grid_index(float v) {
  v = std::min(1.0f, std::max(-1.0f, v));
  // Same operation order as upstream; the multiply-add is fused, as GCC contracts it there.
  return (uint32_t)std::fma((v + 1.0f) * 0.5f, (float)(kQuantLut - 1), 0.5f);
}

BNB_MS_INLINE uint8_t quant_lookup(const QuantLut *lut, float v) { return lut->table[quant_grid_index(v)]; }

// The factors a block's values are multiplied by before the lookup: v = (x * pre) * inv. Normally pre = 1 and
// inv = 1 / absmax, upstream's computation (x * 1 is exact, so these are upstream's bytes). When 1 / absmax
// overflows (absmax < 2^-128: a block of subnormals) upstream multiplies by inf, so 0 becomes NaN and takes
// code 0 (-absmax once dequantized) and every other value +-1. Such a block is scaled by 2^64 first (exact:
// its values are below 2^-126), so it maps as the same block at a normal magnitude does. absmax > 0.
struct QuantScale {
  float pre, inv;
};
BNB_MS_INLINE QuantScale quant_block_scale(float absmax) {
  const float inv = 1.0f / absmax;
  if (inv <= FLT_MAX) return {1.0f, inv};
  return {0x1p64f, 1.0f / (absmax * 0x1p64f)};
}

// quant_grid_index of 8 / 16 lanes.  One multiply fewer, the same integers: (v + 1) * 0.5 is exact, so
// fma((v + 1) * 0.5, 65535, 0.5) == fma(v + 1, 32767.5, 0.5), and clamping v + 1 to [0, 2] instead of v to
// [-1, 1] gives the same v + 1 (NaN -> 0, i.e. v = -1 as the scalar clamp: MAXPS returns its 2nd operand).
BNB_MS_TARGET_AVX2 BNB_MS_INLINE __m256i quant_grid_index8(__m256 v) {
  __m256 w = _mm256_max_ps(_mm256_add_ps(v, _mm256_set1_ps(1.0f)), _mm256_setzero_ps());
  w = _mm256_min_ps(w, _mm256_set1_ps(2.0f));
  return _mm256_cvttps_epi32(_mm256_fmadd_ps(w, _mm256_set1_ps(0.5f * (kQuantLut - 1)), _mm256_set1_ps(0.5f)));
}
BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m512i quant_grid_index16(__m512 v) {
  __m512 w = _mm512_max_ps(_mm512_add_ps(v, _mm512_set1_ps(1.0f)), _mm512_setzero_ps());
  w = _mm512_min_ps(w, _mm512_set1_ps(2.0f));
  return _mm512_cvttps_epi32(_mm512_fmadd_ps(w, _mm512_set1_ps(0.5f * (kQuantLut - 1)), _mm512_set1_ps(0.5f)));
}

// The codes of 16 grid indices, one gather (the table is padded so a 4-byte read at the last index stays inside).
BNB_MS_TARGET_AVX512 BNB_MS_INLINE __m128i lut_gather16(const QuantLut *lut, __m512i idx) {
  return _mm512_cvtepi32_epi8(_mm512_and_si512(_mm512_i32gather_epi32(idx, lut->table, 1), _mm512_set1_epi32(0xff)));
}

// out[k] = table[idx[k]] for k < N (N a multiple of 8), eight codes per 8-byte store.
template <int N>
BNB_MS_INLINE void lut_codes(const uint8_t *table, const uint32_t *idx, uint8_t *out) {
  for (int k = 0; k < N; k += 8) {
    uint64_t w = 0;
    for (int j = 0; j < 8; ++j) w |= (uint64_t)table[idx[k + j]] << (8 * j);
    std::memcpy(out + k, &w, 8);
  }
}

// out[i] = tab[q[i]] for i < len: dequantization through a per-block table of 256 results.
template <class T>
BNB_MS_INLINE void table_lookup(const T *tab, const uint8_t *q, T *out, int64_t len) {
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    std::memcpy(&w, q + i, 8);
    for (int j = 0; j < 8; ++j) out[i + j] = tab[(w >> (8 * j)) & 255];
  }
  for (; i < len; ++i) out[i] = tab[q[i]];
}

}  // namespace bnb_ms
