// bf16_round.h -- the library's rounding of fp32 to bf16 for its bf16 dot-product kernels (the 4-bit
// bf16-compute linear of fourbit.cpp, the bf16 panel GEMM of gemm_panel.cpp): round to nearest even, NaN
// kept (quiet), then a bf16 denormal (exponent field 0) flushed to a zero of the same sign -- what
// vdpbf16ps' "DAZ in" would do to it anyway, so the hardware and the portable kernels see the same
// normal/zero/inf/NaN inputs.  ftz32 is vdpbf16ps' "FTZ out" on an fp32 accumulator.
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "aot.h"
#include "cpu/cpu_features.h"

#define BNB_MS_TARGET_AVX512BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

namespace bnb_ms {

BNB_MS_INLINE uint16_t bf16_flush(uint16_t h) { return (h & 0x7f80u) == 0 ? (uint16_t)(h & 0x8000u) : h; }
BNB_MS_INLINE uint16_t to_bf16_flushed(float f) { return bf16_flush(f32_to_bf16(f)); }
BNB_MS_INLINE float ftz32(float r) { return std::fabs(r) < 1.17549435e-38f ? std::copysign(0.0f, r) : r; }

// Whether the bf16 dot-product kernels run vdpbf16ps (the CPU has AVX512-BF16 and the SIMD level is avx512);
// their portable twins give the same bits otherwise.
inline bool bf16dot_native() { return (cpu_features() & CPU_AVX512BF16) && simd_level() >= SimdLevel::avx512; }

// 16 fp32 -> 16 flushed bf16 (the integer form of to_bf16_flushed), dword i = t[i] | t[i] << 16 (either
// word holds the value: a vpermw table, or masked to 16 bits for a pair).
BNB_MS_TARGET_AVX512BF16 BNB_MS_INLINE __m512i bf16_flushed16(__m512 v) {
  const __m512i b = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40));
  const __mmask16 den = _mm512_testn_epi32_mask(r, _mm512_set1_epi32(0x7f80));
  r = _mm512_mask_and_epi32(r, den, r, _mm512_set1_epi32(0x8000));
  return _mm512_or_si512(r, _mm512_slli_epi32(r, 16));
}

// Pairs (lo[i], hi[i]) of 16 + 16 fp32 as 16 dwords of flushed bf16: lo in bits 0..15, hi in 16..31 (the
// element order of a bf16 pair in memory, as vdpbf16ps reads it).
BNB_MS_TARGET_AVX512BF16 BNB_MS_INLINE __m512i bf16_pairs16(__m512 lo, __m512 hi) {
  const __m512i l = _mm512_and_si512(bf16_flushed16(lo), _mm512_set1_epi32(0xffff));
  return _mm512_or_si512(l, _mm512_slli_epi32(bf16_flushed16(hi), 16));
}

}  // namespace bnb_ms
