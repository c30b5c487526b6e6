// code256.h -- code[q] of a 256-entry fp32 code for AVX-512 loops, two ways with one interface (kN indices per
// lookup, kN / 16 vectors out): Code256Gather (16-lane gathers) and Code256Vbmi.
//
// Code256Vbmi: 64 bytes q at a time with AVX-512 VBMI, without a gather: a 256-entry fp32
// code is held as four 256-byte planes (plane k: byte k of every entry), each looked up with two vpermi2b
// (128 entries each) and a blend on the top bit of q; unpacking the four planes (which works inside 128-bit
// lanes) rebuilds the floats.  The 64 indices are first permuted (vpermb) so that the floats come out in index
// order.  The same fp32 values as code[q[i]], bit for bit (measured on the AVX-512 EPYC: ~8x a 16-lane gather
// loop).  Used where 8-bit codes are decoded: the double-quant absmax of 4-bit weights, dequantize_blockwise,
// the 8-bit optimizers' states.  Grid256Vbmi (below): the other direction, the 65536-bin grid table of
// quantization (cpu/quant_lut.h) for 64 grid indices in registers (the 8-bit optimizers' state requantization).
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

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
  // sym: code[127] is +0 and code[127 - j] = -code[127 + j] for j = 1..127 (the signed dynamic map); then
  // code[q] = -code[254 - q] for q < 127 and one 128-entry table of code[128..255] per plane serves every q (one
  // vpermi2b per plane instead of two and a blend): plane[k][2..3] as always, q < 127 looked up at 126 - q with the
  // sign bit set, q = 127 zeroed.
  bool sym = false;

  BNB_MS_TARGET_AVX512VBMI void init(const float *code) {
    alignas(64) uint8_t b[4][256];
    uint32_t u[256];
    for (int i = 0; i < 256; ++i) {
      std::memcpy(&u[i], code + i, 4);
      for (int k = 0; k < 4; ++k) b[k][i] = (uint8_t)(u[i] >> (8 * k));
    }
    sym = u[127] == 0;
    for (int j = 1; j < 128 && sym; ++j) sym = u[127 - j] == (u[127 + j] ^ 0x80000000u);
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
    if (sym) {
      const __mmask64 nz = _mm512_cmpneq_epi8_mask(idx, _mm512_set1_epi8(127)), neg = ~upper & nz;
      const __m512i m = _mm512_mask_sub_epi8(idx, ~upper, _mm512_set1_epi8(126), idx);  // vpermi2b reads 7 bits
      for (int k = 0; k < 4; ++k) p[k] = _mm512_maskz_permutex2var_epi8(nz, plane[k][2], m, plane[k][3]);
      p[3] = _mm512_mask_add_epi8(p[3], neg, p[3], _mm512_set1_epi8((char)0x80));  // the sign bit
    } else {
      for (int k = 0; k < 4; ++k)
        p[k] = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(plane[k][0], idx, plane[k][1]),
                                      _mm512_permutex2var_epi8(plane[k][2], idx, plane[k][3]));
    }
    const __m512i w01l = _mm512_unpacklo_epi8(p[0], p[1]), w01h = _mm512_unpackhi_epi8(p[0], p[1]);
    const __m512i w23l = _mm512_unpacklo_epi8(p[2], p[3]), w23h = _mm512_unpackhi_epi8(p[2], p[3]);
    v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01l, w23l));
    v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01l, w23l));
    v[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01h, w23h));
    v[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01h, w23h));
  }
};

// A 256-entry byte table looked up for 64 byte indices at once (two vpermi2b and a blend on the top bit).
struct ByteTab256 {
  __m512i t[4];
  BNB_MS_TARGET_AVX512VBMI void init(const uint8_t *b) {
    for (int j = 0; j < 4; ++j) t[j] = _mm512_loadu_si512(b + 64 * j);
  }
  BNB_MS_TARGET_AVX512VBMI BNB_MS_INLINE __m512i at(__m512i x, __mmask64 upper) const {
    return _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(t[0], x, t[1]), _mm512_permutex2var_epi8(t[2], x, t[3]));
  }
  // at(x, upper) when every x >= 128 (upper all ones): one vpermi2b
  BNB_MS_TARGET_AVX512VBMI BNB_MS_INLINE __m512i at_hi(__m512i x) const { return _mm512_permutex2var_epi8(t[2], x, t[3]); }
};

// Grid256Vbmi: table[idx] of a 65536-entry grid table (cpu/quant_lut.h: idx -> code) for 64 indices without a
// gather, the same bytes.  idx = 256 h + l.  In a sparse bucket h (at most K changes, each by +1) the code is
// base[h] plus one for each change at or below l: K levels of per-bucket positions (l >= pos_j[h]; a bucket with
// fewer changes takes pos 0, always true, and a base one lower: byte arithmetic wraps).  Each of the D other
// (dense) buckets (near idx 32768, where the dynamic code is dense) has a 256-entry table of code - base on l,
// added where h matches.  K + D <= kMaxLevels (else ok = false), K chosen to minimize it (signed dynamic map,
// folded (below): K 3, D 2; unsigned: K 6, D 2).  All lookups are ByteTab256 (measured on the AVX-512 EPYC, Zen 4,
// one thread, values in L1: 20M codes in 5-6 ms, 16-lane gathers from the 64 KiB table 14-17 ms).  Lookups by h
// take one vpermi2b when every h of the 64 is >= 128 (values >= 0, or a folded table); vpermi2b is what the
// requantization spends its time on (Adam8bit step, 20M parameters, one thread on that EPYC: 26 -> 23 ms).
struct Grid256Vbmi {
  static constexpr int kMaxLevels = 8;
  bool ok = false;
  int K = 0, D = 0;
  ByteTab256 base, pos[kMaxLevels], sub[kMaxLevels];
  __m512i dh[kMaxLevels];
  __m512i sel_lo, sel_hi;
  // Folding (fold): the table is point-symmetric about the grid's middle, table[i] = fc - table[65535 - i]
  // + (i <= fe) for every i < 32768 (the signed dynamic map: fc 254, fe 115); then a lower-half index i
  // (h < 128) is looked up as 65535 - i = ~i (h and l bytes complemented) in the upper half, and only the
  // upper half's buckets are built: every bucket table takes one vpermi2b instead of two and a blend, and the
  // dense buckets around the middle pair up (signed map: D 4 -> 2).
  bool fold = false;
  int fc = 0, fe = -1;
  // sat: every i <= fe has table[65535 - i] = fc + 1 (and table[i] = 0), fc <= 254: the lower lanes' fc - code
  // (+ 1 for i <= fe) is then the saturating byte difference max(fc - code, 0) (signed dynamic map: yes)
  bool sat = false;

  BNB_MS_TARGET_AVX512VBMI bool init(const uint8_t *table) {
    fold = sat = false;
    fc = table[32767] + table[32768];
    int i = 32767;
    for (; i >= 0 && table[i] + table[65535 - i] == fc; --i) {}
    fe = i;
    for (; i >= 0 && table[i] + table[65535 - i] == fc + 1; --i) {}
    if (i >= 0) {  // not point-symmetric
      fc = 0;
      fe = -1;
      return build(table);
    }
    fold = true;
    sat = fc <= 254;
    for (int j = 0; j <= fe && sat; ++j) sat = table[65535 - j] == fc + 1;
    std::vector<uint8_t> upper(table, table + 65536);
    std::memset(upper.data(), 0, 32768);  // the lower half is never looked up
    return build(upper.data());
  }

  BNB_MS_TARGET_AVX512VBMI bool build(const uint8_t *table) {
    int cnt[256];
    bool unit[256];  // every change in the bucket is +1
    for (int h = 0; h < 256; ++h) {
      const uint8_t *t = table + 256 * h;
      cnt[h] = 0;
      unit[h] = true;
      for (int l = 1; l < 256; ++l)
        if (t[l] != t[l - 1]) {
          ++cnt[h];
          unit[h] = unit[h] && t[l] == t[l - 1] + 1;
        }
    }
    int best_k = -1, best = kMaxLevels + 1;
    for (int k = 0; k <= kMaxLevels; ++k) {
      int d = 0;
      for (int h = 0; h < 256; ++h) d += !(unit[h] && cnt[h] <= k);
      if (k + d < best) { best = k + d; best_k = k; }
    }
    if (best_k < 0) return ok = false;
    K = best_k;
    D = 0;
    uint8_t b[256], p[kMaxLevels][256], s[kMaxLevels][256];
    for (int h = 0; h < 256; ++h) {
      const uint8_t *t = table + 256 * h;
      int bb = t[0], j = 0;
      if (!(unit[h] && cnt[h] <= K)) {  // dense bucket: its own table
        for (int l = 0; l < 256; ++l) s[D][l] = (uint8_t)(t[l] - t[0]);
        dh[D++] = _mm512_set1_epi8((char)h);
      } else {
        for (int l = 1; l < 256; ++l)
          if (t[l] != t[l - 1]) p[j++][h] = (uint8_t)l;
      }
      for (; j < K; ++j, --bb) p[j][h] = 0;
      b[h] = (uint8_t)bb;
    }
    base.init(b);
    for (int j = 0; j < K; ++j) pos[j].init(p[j]);
    for (int d = 0; d < D; ++d) sub[d].init(s[d]);
    // packus(i0, i1) holds, in 128-bit lane L, words 8 L + u = i0[4 L + u] and 8 L + 4 + u = i1[4 L + u] (u < 4);
    // packus(i2, i3) likewise, 64 bytes further in vpermt2b's index space
    alignas(64) uint8_t lo[64], hi[64];
    for (int e = 0; e < 64; ++e) {
      const int j = e / 16, t = e % 16, w = 8 * (t / 4) + 4 * (j & 1) + t % 4 + 32 * (j >> 1);
      lo[e] = (uint8_t)(2 * w);
      hi[e] = (uint8_t)(2 * w + 1);
    }
    sel_lo = _mm512_load_si512(lo);
    sel_hi = _mm512_load_si512(hi);
    return ok = true;
  }

  // The 64 codes of grid indices i[j] (in [0, 65535]; lane t: element 16 j + t), in element order.
  BNB_MS_TARGET_AVX512VBMI BNB_MS_INLINE __m512i codes(const __m512i i[4]) const {
    const __m512i w01 = _mm512_packus_epi32(i[0], i[1]), w23 = _mm512_packus_epi32(i[2], i[3]);
    const __m512i h = _mm512_permutex2var_epi8(w01, sel_hi, w23), l = _mm512_permutex2var_epi8(w01, sel_lo, w23);
    const __mmask64 hu = _mm512_movepi8_mask(h);
    if (fold) {
      const __m512i ones = _mm512_set1_epi8(-1);
      const __mmask64 lo = ~hu;  // lanes of the lower half: looked up at ~i, then fc - code (+ 1 for i <= fe)
      const __m512i hf = _mm512_mask_blend_epi8(lo, h, _mm512_xor_si512(h, ones));
      const __m512i lf = _mm512_mask_blend_epi8(lo, l, _mm512_xor_si512(l, ones));
      __m512i r = codes_hl<true>(hf, lf, ~(__mmask64)0);
      if (sat) return _mm512_mask_subs_epu8(r, lo, _mm512_set1_epi8((char)fc), r);
      const __mmask64 exc = fe < 0 ? 0
                                   : _mm512_mask_cmplt_epu8_mask(lo, h, _mm512_set1_epi8((char)(fe >> 8))) |
                                         (_mm512_mask_cmpeq_epi8_mask(lo, h, _mm512_set1_epi8((char)(fe >> 8))) &
                                          _mm512_cmple_epu8_mask(l, _mm512_set1_epi8((char)(fe & 255))));
      r = _mm512_mask_sub_epi8(r, lo, _mm512_set1_epi8((char)fc), r);
      return _mm512_mask_add_epi8(r, exc, r, _mm512_set1_epi8(1));
    }
    // every h >= 128 (the upper half of the grid: all values >= 0, as the unsigned map's states): one vpermi2b
    // per bucket table instead of two and a blend (Adam8bit's second state; the same bytes)
    return hu == ~(__mmask64)0 ? codes_hl<true>(h, l, hu) : codes_hl<false>(h, l, hu);
  }
  template <bool HI>
  BNB_MS_TARGET_AVX512VBMI BNB_MS_INLINE __m512i codes_hl(__m512i h, __m512i l, __mmask64 hu) const {
    const __mmask64 lu = _mm512_movepi8_mask(l);
    const __m512i one = _mm512_set1_epi8(1);
    __m512i r = HI ? base.at_hi(h) : base.at(h, hu);
    for (int j = 0; j < K; ++j)
      r = _mm512_mask_add_epi8(r, _mm512_cmpge_epu8_mask(l, HI ? pos[j].at_hi(h) : pos[j].at(h, hu)), r, one);
    for (int d = 0; d < D; ++d) r = _mm512_mask_add_epi8(r, _mm512_cmpeq_epi8_mask(h, dh[d]), r, sub[d].at(l, lu));
    return r;
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
