// optim.cpp -- fused optimizer updates with 32-bit or blockwise 8-bit state (bitsandbytes'
// optimizer_update_32bit / optimizer_update_8bit_blockwise; Dettmers et al., "8-bit Optimizers via
// Block-wise Quantization", arXiv 2110.02861).
//
// Numerics follow upstream bitsandbytes 0.50's CPU implementation (backends/cpu/ops.py,
// _optimizer_update_{32bit,8bit_blockwise}_cpu), including its differences from the CUDA kernels:
// all arithmetic in float32; hyper-parameter expressions (1 - beta1, -lr / correction1, ...) are
// evaluated in double and rounded to float once (as a Python scalar meeting a float32 tensor);
// Adam's 8-bit denominator is sqrt(v) / sqrt(1 - beta2^t) + eps while the 32-bit one is
// sqrt(v) + eps * sqrt(1 - beta2^t); 8-bit momentum / rmsprop / adagrad always add p * weight_decay
// to the gradient; Lion, Adam(W), AdEMAMix apply decoupled decay p *= 1 - lr * wd before the update.
// No operation is fused (the library is built with -ffp-contract=off), so the portable, AVX2 and
// AVX-512 builds of the same loop give identical bits, and so does the numpy twin in
// bitsandbytes_ms/_reference.py.
//
// 8-bit state: one pass per 256-element block -- dequantize (code[q] * absmax), update the
// parameter and the state in float32, then requantize the block with the same 65536-bin lookup
// table as quantize_blockwise (blockwise.cpp / upstream's CPU kernel), so the state bytes equal
// upstream's.  The SIMD paths compute the grid indices in vectors and look codes up as blockwise.cpp does
// (AVX2: scalar loads, dequantization through a per-block table of code * absmax, or on Intel CPUs 8-lane gathers;
// AVX-512: gathers), except that with AVX-512 VBMI both lookups stay in registers: Code256Vbmi decodes 64 states at
// a time inside the update loop, Grid256Vbmi (cpu/code256.h: the grid table as per-bucket tables of 256 bytes, the
// same bytes) requantizes.
// The vector loops divide by the call's bias corrections without the divider (optim_simd.inc, vdiv_by: exact).
//
// Non-finite gradients. 8-bit state: an element whose gradient is inf or NaN updates its parameter as
// upstream 0.50.2's CPU path does (a NaN gradient gives a NaN parameter), and its states are reset to 0,
// so they do not enter the block's absmax: one bad element cannot turn its 255 neighbours' states into
// NaN (upstream's CPU path lets absmax become inf/NaN and code * absmax = NaN on the next step).
// 32-bit state: the float32 rules run unguarded, as upstream's and torch's, and NaN propagates to
// that element's parameter (Lion's sign(NaN) is NaN, as torch.sign).
//
// In place: p, state1, state2, absmax1, absmax2 (and unorm_vec) are updated in the caller's input
// buffers, as the bitsandbytes C functions do. MindSpore hands an AOT kernel the input tensors'
// real device (host) buffers, so the only declared output is a 1-element int32 status.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "aot.h"
#include "checks/optim.h"
#include "optim_rule.h"
#include "cpu/code256.h"
#include "cpu/cpu_features.h"
#include "cpu/parallel.h"
#include "cpu/quant_lut.h"
#include "cpu/simd_convert.h"

namespace bnb_ms {
namespace {

constexpr int64_t kBlock = checks::kOptBlock;

// ---- quantization table: shared with blockwise.cpp (cpu/quant_lut.h) ------------------------
using OptLut = QuantLut;
inline const OptLut *opt_lut(const float *code) { return get_quant_lut(code); }
BNB_MS_INLINE uint8_t lut_quant(const OptLut *lut, float v) { return quant_lookup(lut, v); }

// The VBMI form of a table (cpu/code256.h, Grid256Vbmi), built once per code (keyed by its contents) and kept:
// entries are never evicted (a caller may still hold one), so past kGrids codes the gathers serve (null).
const Grid256Vbmi *opt_grid(const OptLut *lut) {
  constexpr int kGrids = 8;
  static std::mutex mu;
  static std::unique_ptr<Grid256Vbmi> grids[kGrids];
  static float codes[kGrids][kQuantCode];
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < kGrids; ++i) {
    if (!grids[i]) {
      std::unique_ptr<Grid256Vbmi> g(new Grid256Vbmi);
      g->init(lut->table);
      std::memcpy(codes[i], lut->code, sizeof(codes[i]));
      grids[i] = std::move(g);
    }
    if (std::memcmp(codes[i], lut->code, sizeof(codes[i])) == 0) return grids[i]->ok ? grids[i].get() : nullptr;
  }
  return nullptr;
}

// ---- the update rule: optim_rule.h (shared with csrc/cuda/optim.cu) ---------------------------
// K: the constants of one update (OptConsts); update_elem / update_elem8: one element, scalar.  The SIMD
// loops (optim_simd.inc) are their vector form.
using K = OptConsts;

// ---- 32-bit state -------------------------------------------------------------------------------
template <class T, Opt O, bool UNORM>
BNB_MS_INLINE void optimizer_update_32bit_portable(const K &k, const T *g, T *p, float *s1, float *s2, float *upd,
                                                   int64_t n, int64_t b0, int64_t b1) {
  float dummy = 0.0f;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * kBlock, e = std::min(s + kBlock, n);
    for (int64_t i = s; i < e; ++i) {
      float pv = to_f32(p[i]);
      float &v = two_state(O) ? s2[i] : dummy;
      float &mb = O == ADEMAMIX ? s1[n + i] : dummy;
      update_elem<O, false, UNORM>(k, to_f32(g[i]), pv, s1[i], mb, v, upd ? upd + i : nullptr);
      if (!UNORM) p[i] = from_f32<T>(pv);
    }
  }
}
template <class T, Opt O, bool UNORM>
BNB_MS_TARGET_AVX2 void optimizer_update_32bit_avx2(const K &k, const T *g, T *p, float *s1, float *s2, float *upd,
                                                    int64_t n, int64_t b0, int64_t b1) {
  optimizer_update_32bit_portable<T, O, UNORM>(k, g, p, s1, s2, upd, n, b0, b1);
}
template <class T, Opt O, bool UNORM>
BNB_MS_TARGET_AVX512 void optimizer_update_32bit_avx512(const K &k, const T *g, T *p, float *s1, float *s2, float *upd,
                                                        int64_t n, int64_t b0, int64_t b1) {
  optimizer_update_32bit_portable<T, O, UNORM>(k, g, p, s1, s2, upd, n, b0, b1);
}

template <class T, Opt O, bool UNORM>
void run32(const K &k, const T *g, T *p, float *s1, float *s2, float *upd, int64_t n) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
  const SimdLevel lvl = simd_level();
  parallel_for(nb, 64, [&](int64_t b0, int64_t b1) {
    if (lvl >= SimdLevel::avx512) optimizer_update_32bit_avx512<T, O, UNORM>(k, g, p, s1, s2, upd, n, b0, b1);
    else if (lvl >= SimdLevel::avx2) optimizer_update_32bit_avx2<T, O, UNORM>(k, g, p, s1, s2, upd, n, b0, b1);
    else optimizer_update_32bit_portable<T, O, UNORM>(k, g, p, s1, s2, upd, n, b0, b1);
  });
}

template <class T>
double norm_of(const T *x, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) { const double v = to_f32(x[i]); acc += v * v; }
  return std::sqrt(acc);
}

// LAMB / LARS (max_unorm > 0; Adam, Momentum, RMSprop): the norm of the whole update scales the step.
template <class T, Opt O>
void optimizer_update_32bit_unorm(const K &k, const Hyper &h, const T *g, T *p, float *s1, float *s2, float *unorm_vec,
                                  double max_unorm, double param_norm, int64_t n) {
  if (param_norm <= 0.0) param_norm = norm_of(p, n);
  std::vector<float> upd((size_t)n);
  run32<T, O, true>(k, g, p, s1, s2, upd.data(), n);
  const double unorm = norm_of(upd.data(), n);
  if (unorm_vec) *unorm_vec = (float)unorm;
  const float coef = unorm_coef(unorm_factor<O>(h), unorm, max_unorm, param_norm);
  parallel_for(n, 16384, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) p[i] = from_f32<T>(unorm_step<O>(k, coef, upd[i], to_f32(p[i])));
  });
}

template <class T, Opt O>
void optimizer_update_32bit(const Hyper &h, const T *g, T *p, float *s1, float *s2, float *unorm_vec, double max_unorm,
                            double param_norm, int64_t n) {
  const K k = opt_consts(h);
  if constexpr (has_unorm_path<O>()) {
    if (max_unorm > 0.0)
      return optimizer_update_32bit_unorm<T, O>(k, h, g, p, s1, s2, unorm_vec, max_unorm, param_norm, n);
  }
  run32<T, O, false>(k, g, p, s1, s2, nullptr, n);
}

// ---- 8-bit blockwise state ---------------------------------------------------------------------
BNB_MS_INLINE void requant_block(const OptLut *lut, const float *v, int64_t len, uint8_t *q, float *absmax) {
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(v[i]));
  *absmax = amax;
  if (amax == 0.0f) { std::memset(q, 0, (size_t)len); return; }
  const QuantScale k = quant_block_scale(amax);
  for (int64_t i = 0; i < len; ++i) q[i] = lut_quant(lut, v[i] * k.pre * k.inv);
}

struct State8 {
  uint8_t *s1, *s2;
  float *a1, *a2;
  const float *q1, *q2;
  const OptLut *l1, *l2;
};

template <class T, Opt O>
BNB_MS_INLINE void optimizer_update_8bit_blockwise_portable(const K &k, const T *g, T *p, const State8 &st, int64_t n,
                                                            int64_t b0, int64_t b1) {
  const int64_t nb = (n + kBlock - 1) / kBlock;
  float m[kBlock], mb[kBlock], v[kBlock];
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * kBlock, len = std::min(kBlock, n - s);
    const float sc1 = st.a1[b];
    for (int64_t i = 0; i < len; ++i) m[i] = st.q1[st.s1[s + i]] * sc1;
    if (O == ADEMAMIX) {
      const float scb = st.a1[nb + b];
      for (int64_t i = 0; i < len; ++i) mb[i] = st.q1[st.s1[n + s + i]] * scb;
    }
    if (two_state(O)) {
      const float sc2 = st.a2[b];
      for (int64_t i = 0; i < len; ++i) v[i] = st.q2[st.s2[s + i]] * sc2;
    }
    for (int64_t i = 0; i < len; ++i) {
      float pv = to_f32(p[s + i]);
      update_elem8<O>(k, to_f32(g[s + i]), pv, m[i], mb[i], v[i]);
      p[s + i] = from_f32<T>(pv);
    }
    requant_block(st.l1, m, len, st.s1 + s, st.a1 + b);
    if (O == ADEMAMIX) requant_block(st.l1, mb, len, st.s1 + n + s, st.a1 + nb + b);
    if (two_state(O)) requant_block(st.l2, v, len, st.s2 + s, st.a2 + b);
  }
}
// One block's codes as the AVX-512 state sources read them without a buffer: code[q[i]] * absmax.
struct BlockCodes {
  const float *code = nullptr;
  const uint8_t *q = nullptr;
  float absmax = 0.0f;
  BNB_MS_INLINE float at1(int64_t i) const { return code[q[i]] * absmax; }
};

// The compile-time flags of the vector loops (optim_simd.inc, blocks8_fl): kFlLean: gnorm 1, no weight decay, both
// bias corrections divided without the divider; kFlLeanWd: the same with weight decay; kFlAny: read at run time.
enum : int { kFlLean = 0, kFlLeanWd = 1, kFlAny = 2 };

// The per-call state tables of a SIMD level that has none (AVX2, AVX-512 without VBMI: the lookups read the codes).
struct NoStateCodes {
  const void *c1 = nullptr, *c2 = nullptr;
  const void *r1 = nullptr, *r2 = nullptr;
  explicit NoStateCodes(const State8 &) {}
};

// ---- AVX2 (8 lanes; F16C for fp16, shifts for bf16) ----------------------------------------------
namespace avx2 {
#define SIMD_TARGET BNB_MS_TARGET_AVX2
using F = __m256;
constexpr int W = 8;
constexpr int64_t kChunk = 4 * W;
SIMD_TARGET BNB_MS_INLINE F set1(float x) { return _mm256_set1_ps(x); }
SIMD_TARGET BNB_MS_INLINE F vadd(F a, F b) { return _mm256_add_ps(a, b); }
SIMD_TARGET BNB_MS_INLINE F vmul(F a, F b) { return _mm256_mul_ps(a, b); }
SIMD_TARGET BNB_MS_INLINE F vdiv(F a, F b) { return _mm256_div_ps(a, b); }
SIMD_TARGET BNB_MS_INLINE F vsqrt(F a) { return _mm256_sqrt_ps(a); }
SIMD_TARGET BNB_MS_INLINE F vabs(F a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
// max(a, b) returns b when a is NaN, as std::max(b, a) does in the scalar absmax loop
SIMD_TARGET BNB_MS_INLINE F vmax(F a, F b) { return _mm256_max_ps(a, b); }
SIMD_TARGET BNB_MS_INLINE F vsign(F u) {  // 1, -1, 0 for +-0, NaN for NaN (as the scalar rule)
  const F z = _mm256_setzero_ps();
  const F s = _mm256_add_ps(_mm256_and_ps(_mm256_cmp_ps(u, z, _CMP_GT_OQ), _mm256_set1_ps(1.0f)),
                            _mm256_and_ps(_mm256_cmp_ps(u, z, _CMP_LT_OQ), _mm256_set1_ps(-1.0f)));
  return _mm256_or_ps(s, _mm256_and_ps(_mm256_cmp_ps(u, u, _CMP_UNORD_Q), u));
}
// lane mask of finite values (false for inf and NaN) and a per-lane select m ? a : b
using Mk = __m256;
SIMD_TARGET BNB_MS_INLINE Mk vfinite(F x) {
  return _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
}
SIMD_TARGET BNB_MS_INLINE F vsel(Mk m, F a, F b) { return _mm256_blendv_ps(b, a, m); }
SIMD_TARGET BNB_MS_INLINE bool vall(Mk m) { return _mm256_movemask_ps(m) == 0xff; }
SIMD_TARGET BNB_MS_INLINE F vfma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
SIMD_TARGET BNB_MS_INLINE F vfnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
SIMD_TARGET BNB_MS_INLINE Mk vnonneg_finite(F x) {
  const __m256i u = _mm256_castps_si256(x);  // 0 <= u < 0x7f800000 as signed integers
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f800000), u),
                                              _mm256_cmpgt_epi32(u, _mm256_set1_epi32(-1))));
}
SIMD_TARGET BNB_MS_INLINE Mk vdiv_exact_lanes(F x) {  // +0, or |x| in [2^-80, 2^100] (bits 0x17800000 .. 0x71800000)
  const __m256i u = _mm256_castps_si256(x), a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i in = _mm256_andnot_si256(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x71800000)),
                                         _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x177fffff)));
  return _mm256_castsi256_ps(_mm256_or_si256(in, _mm256_cmpeq_epi32(u, _mm256_setzero_si256())));
}
// element loads/stores: cpu/simd_convert.h (to_f32 / from_f32's bytes, NaNs included)
template <class T> SIMD_TARGET BNB_MS_INLINE F load(const T *p) { return load8<T>(p); }
template <class T> SIMD_TARGET BNB_MS_INLINE void store(T *p, F v) { store8<T>(p, v); }
// The state lookups (cpu/quant_lut.h says why AVX2 uses scalar loads).  StateSrc: one block's dequantized
// state, code[q[i]] * absmax, here written into the block buffer through a table of the 256 products
// (prepare), then read by lane groups (at) or elements (at1); requant32: the 32 codes of v[0..32) * pre * inv.
// kAhead: software prefetch distance in blocks (the scalar lookups leave the hardware prefetchers idle for
// long stretches; Adam8bit on Zen 3: 3-5% less thread time).
constexpr int64_t kAhead = 4, kAheadChunk = 0;
constexpr bool kDecodeAhead = false;
using StateCodes = NoStateCodes;
struct StateSrc {
  float *buf;
  const void *codes;
  SIMD_TARGET BNB_MS_INLINE void prepare(const float *code, float absmax, const uint8_t *q, int64_t len) {
    alignas(32) float tab[kQuantCode];
    for (int c = 0; c < kQuantCode; c += W) store<float>(tab + c, vmul(load<float>(code + c), set1(absmax)));
    table_lookup(tab, q, buf, len);
  }
  SIMD_TARGET BNB_MS_INLINE F at(int64_t i) const { return load<float>(buf + i); }
  SIMD_TARGET BNB_MS_INLINE void at4(int64_t i, F v[4]) const {
    for (int j = 0; j < 4; ++j) v[j] = at(i + j * W);
  }
  BNB_MS_INLINE float at1(int64_t i) const { return buf[i]; }
};
SIMD_TARGET BNB_MS_INLINE void requant32(const OptLut *lut, const float *v, F pre, F inv, uint8_t *q) {
  alignas(32) uint32_t idx[32];
  for (int j = 0; j < 32; j += W)
    _mm256_store_si256((__m256i *)(idx + j), quant_grid_index8(vmul(vmul(load<float>(v + j), pre), inv)));
  lut_codes<32>(lut->table, idx, q);
}
SIMD_TARGET BNB_MS_INLINE int64_t requant_vec(const OptLut *lut, const void *, const float *v, int64_t len, float pre,
                                              float inv, uint8_t *q) {
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) requant32(lut, v + i, set1(pre), set1(inv), q + i);
  return i;
}
SIMD_TARGET BNB_MS_INLINE float hmax(F v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
#include "cpu/optim_simd.inc"

// The same loop with the lookups as 8-lane gathers (vpgatherdd) instead of scalar loads: the states decoded in the
// update loop (no block buffer), the codes gathered from the grid table (4-byte reads at byte offsets: the table is
// padded).  Where gathers are fast (avx2_gathers below).
namespace gather {
// Software prefetch 384 elements ahead, 32 at a time (2-core Xeon, 20M parameters, 2 threads, loaded: 17.7 ms without
// prefetch, 16.0-16.3 ms 256-512 elements ahead; whole blocks 2-8 ahead at a block's start lost to none, 4M
// parameters, 1 thread: 6.3-7.2 against 6.0 ms)
constexpr int64_t kAhead = 0, kAheadChunk = 384;
constexpr bool kDecodeAhead = false;
using StateCodes = NoStateCodes;
SIMD_TARGET BNB_MS_INLINE F gather_codes(const BlockCodes &b, int64_t i) {
  const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b.q + i)));
  return vmul(_mm256_i32gather_ps(b.code, q, 4), set1(b.absmax));
}
#include "cpu/optim_gather_src.inc"
// The grid index as quant_grid_index8 without its clamps of v + 1 to [0, 2]: v = x * pre * inv is NaN or within
// 1 + 2^-22 of [-1, 1] (|x| <= the block's absmax; an inf absmax gives inv 0), so the index is in [0, 65535] but
// for a NaN (cvtt's INT_MIN), which the signed max takes to 0, as the clamps do.  One operation instead of two.
template <bool PRE>
SIMD_TARGET BNB_MS_INLINE __m256i grid_index8(F x, F pre, F inv) {
  if (PRE) x = vmul(x, pre);
  const F w = vadd(vmul(x, inv), set1(1.0f));
  const __m256i i = _mm256_cvttps_epi32(_mm256_fmadd_ps(w, set1(0.5f * (kQuantLut - 1)), set1(0.5f)));
  return _mm256_max_epi32(i, _mm256_setzero_si256());
}
template <bool PRE>
SIMD_TARGET BNB_MS_INLINE void requant32g(const OptLut *lut, const float *v, F pre, F inv, uint8_t *q) {
  __m256i c[4];
  const __m256i lo = _mm256_set1_epi32(0xff);
  for (int j = 0; j < 4; ++j)
    c[j] = _mm256_and_si256(
        _mm256_i32gather_epi32((const int *)lut->table, grid_index8<PRE>(load<float>(v + 8 * j), pre, inv), 1), lo);
  // packs work within 128-bit lanes: bytes come out as (c0 lo, c1 lo, c2 lo, c3 lo | c0 hi, ...) by 4-byte groups
  const __m256i w = _mm256_packus_epi16(_mm256_packus_epi32(c[0], c[1]), _mm256_packus_epi32(c[2], c[3]));
  _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
// pre == 1 (every block but one of subnormals) skips that multiply: x * 1 is x, a NaN included as far as the grid
// index goes
SIMD_TARGET BNB_MS_INLINE int64_t requant_vec(const OptLut *lut, const void *, const float *v, int64_t len, float pre,
                                              float inv, uint8_t *q) {
  int64_t i = 0;
  if (pre == 1.0f)
    for (; i + 32 <= len; i += 32) requant32g<false>(lut, v + i, set1(pre), set1(inv), q + i);
  else
    for (; i + 32 <= len; i += 32) requant32g<true>(lut, v + i, set1(pre), set1(inv), q + i);
  return i;
}
#include "cpu/optim_simd.inc"
}  // namespace gather
#undef SIMD_TARGET
}  // namespace avx2

// ---- AVX-512 (16 lanes): a mirror of the AVX2 primitives; the states through gathers, or with VBMI (avx512::vbmi
// below) in registers --------------------------------------------------------------------------------------------------
namespace avx512 {
#define SIMD_TARGET BNB_MS_TARGET_AVX512
using F = __m512;
constexpr int W = 16;
constexpr int64_t kChunk = 4 * W;
SIMD_TARGET BNB_MS_INLINE F set1(float x) { return _mm512_set1_ps(x); }
SIMD_TARGET BNB_MS_INLINE F vadd(F a, F b) { return _mm512_add_ps(a, b); }
SIMD_TARGET BNB_MS_INLINE F vmul(F a, F b) { return _mm512_mul_ps(a, b); }
SIMD_TARGET BNB_MS_INLINE F vdiv(F a, F b) { return _mm512_div_ps(a, b); }
SIMD_TARGET BNB_MS_INLINE F vsqrt(F a) { return _mm512_sqrt_ps(a); }
SIMD_TARGET BNB_MS_INLINE F vabs(F a) { return _mm512_andnot_ps(_mm512_set1_ps(-0.0f), a); }
// _mm512_max_ps also returns the second operand when either is NaN
SIMD_TARGET BNB_MS_INLINE F vmax(F a, F b) { return _mm512_max_ps(a, b); }
SIMD_TARGET BNB_MS_INLINE F vsign(F u) {
  const F z = _mm512_setzero_ps();
  const F s = _mm512_add_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, z, _CMP_GT_OQ), _mm512_set1_ps(1.0f)),
                            _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(u, z, _CMP_LT_OQ), _mm512_set1_ps(-1.0f)));
  return _mm512_mask_mov_ps(s, _mm512_cmp_ps_mask(u, u, _CMP_UNORD_Q), u);
}
using Mk = __mmask16;
SIMD_TARGET BNB_MS_INLINE Mk vfinite(F x) { return (Mk)~_mm512_fpclass_ps_mask(x, 0x99); }  // not NaN or +-inf
SIMD_TARGET BNB_MS_INLINE F vsel(Mk m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }
SIMD_TARGET BNB_MS_INLINE bool vall(Mk m) { return m == (Mk)0xffff; }
SIMD_TARGET BNB_MS_INLINE F vfma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
SIMD_TARGET BNB_MS_INLINE F vfnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
SIMD_TARGET BNB_MS_INLINE Mk vnonneg_finite(F x) {
  return _mm512_cmplt_epu32_mask(_mm512_castps_si512(x), _mm512_set1_epi32(0x7f800000));  // unsigned: -0 fails
}
SIMD_TARGET BNB_MS_INLINE Mk vdiv_exact_lanes(F x) {  // +0, or |x| in [2^-80, 2^100]
  const __m512i u = _mm512_castps_si512(x), a = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
  const __m512i off = _mm512_sub_epi32(a, _mm512_set1_epi32(0x17800000));
  return _mm512_cmple_epu32_mask(off, _mm512_set1_epi32(0x71800000 - 0x17800000)) |
         _mm512_cmpeq_epi32_mask(u, _mm512_setzero_si512());
}
template <class T> SIMD_TARGET BNB_MS_INLINE F load(const T *p) { return load16<T>(p); }
template <class T> SIMD_TARGET BNB_MS_INLINE void store(T *p, F v) { store16<T>(p, v); }
SIMD_TARGET BNB_MS_INLINE float hmax(F v) { return _mm512_reduce_max_ps(v); }
SIMD_TARGET BNB_MS_INLINE void requant32(const OptLut *lut, const float *v, F pre, F inv, uint8_t *q) {
  for (int j = 0; j < 32; j += W)
    _mm_storeu_si128((__m128i *)(q + j), lut_gather16(lut, quant_grid_index16(vmul(vmul(load<float>(v + j), pre), inv))));
}

// Without VBMI the state lookups are gathers in the update loop itself (cpu/quant_lut.h says why AVX-512 gathers;
// no block buffer, no prefetch: measured faster on the Sapphire Rapids host).
constexpr int64_t kAhead = 0, kAheadChunk = 0;
constexpr bool kDecodeAhead = false;
using StateCodes = NoStateCodes;
SIMD_TARGET BNB_MS_INLINE F gather_codes(const BlockCodes &b, int64_t i) {
  __m512 v;
  Code256Gather{b.code}.lookup(b.q + i, &v);
  return vmul(v, set1(b.absmax));
}
#include "cpu/optim_gather_src.inc"
SIMD_TARGET BNB_MS_INLINE int64_t requant_vec(const OptLut *lut, const void *, const float *v, int64_t len, float pre,
                                              float inv, uint8_t *q) {
  int64_t i = 0;
  for (; i + 32 <= len; i += 32) requant32(lut, v + i, set1(pre), set1(inv), q + i);
  return i;
}
#include "cpu/optim_simd.inc"
#undef SIMD_TARGET

// With AVX-512 VBMI both lookups stay in registers (cpu/code256.h): Code256Vbmi decodes a whole block's states 64
// at a time inside the update loop (StateSrc::at4; a partial last block through its buffer), Grid256Vbmi
// requantizes.  The loop is the same source (optim_simd.inc) compiled for the VBMI target, so the lookups inline.
// Adam8bit step, 20M parameters: on the AVX-512 EPYC (Zen 4) the in-register decode took it from 2.04x to 1.78x
// the 32-bit step; on the 2-core Xeon (2026-12-06), decoding in the update loop instead of into block buffers, the
// divider-free bias correction, prefetch 4 blocks ahead and the leaner grid index took it from 1.52x to ~0.95x, and
// then Adam's lean loop, the symmetric-map decode and the prefetch below from 1.10-1.15x to 0.89-0.95x (kernel
// alone, 2 threads; benchmarks/cpu.md).  The loop is bound by the vector ports (one thread, data in L2:
// requantization ~38%, decode ~17%, the divider ~12% of the time).
namespace vbmi {
#define SIMD_TARGET BNB_MS_TARGET_AVX512VBMI
// Software prefetch 384 elements ahead, 64 at a time in the update loop (2-core Xeon, 20M parameters, 2 threads, in
// the same minutes: 13.2-13.4 ms with 2 or 4 whole blocks ahead at each block's start, 11.8-12.4 ms with the next
// block spread over the update loop, 11.1-12.1 ms 384 elements ahead; 128-768 measured, none 13.9 ms)
constexpr int64_t kAhead = 0, kAheadChunk = 384;
constexpr bool kDecodeAhead = true;
struct StateCodes {
  Code256Vbmi t1, t2;
  const Code256Vbmi *c1 = nullptr, *c2 = nullptr;
  const Grid256Vbmi *r1 = nullptr, *r2 = nullptr;  // requantization without gathers (null: gathers)
  SIMD_TARGET explicit StateCodes(const State8 &st) {
    t1.init(st.q1);
    c1 = &t1;
    r1 = opt_grid(st.l1);
    if (st.q2) {
      t2.init(st.q2);
      c2 = &t2;
      r2 = opt_grid(st.l2);
    }
  }
};
struct StateSrc {
  float *buf;
  const Code256Vbmi *vb;
  BlockCodes blk;
  SIMD_TARGET BNB_MS_INLINE void prepare(const float *c, float a, const uint8_t *qq, int64_t len) {
    blk = BlockCodes{c, qq, a};
    if (len < kBlock) code256_scaled(*vb, c, qq, a, len, buf);  // the partial last block goes through at(i)
  }
  SIMD_TARGET BNB_MS_INLINE F at(int64_t i) const { return load<float>(buf + i); }
  SIMD_TARGET BNB_MS_INLINE void at4(int64_t i, F v[4]) const {
    vb->lookup(blk.q + i, v);
    for (int j = 0; j < 4; ++j) v[j] = vmul(v[j], set1(blk.absmax));
  }
  BNB_MS_INLINE float at1(int64_t i) const { return blk.at1(i); }
};
// The codes of v[i] * pre * inv, 64 at a time, for i < len rounded down to 64 (returned).  pre == 1 (every block
// but one of subnormals) skips that multiply: v * 1 is v, a NaN included as far as the grid index goes (NaN -> 0
// either way).
template <bool PRE>
SIMD_TARGET BNB_MS_INLINE int64_t requant_grid_loop(const Grid256Vbmi &gr, const float *v, int64_t len, float pre,
                                                    float inv, uint8_t *q) {
  const __m512 vp = _mm512_set1_ps(pre), vi = _mm512_set1_ps(inv);
  int64_t i = 0;
  const __m512 one = _mm512_set1_ps(1.0f), scale = _mm512_set1_ps(0.5f * (kQuantLut - 1)), half = _mm512_set1_ps(0.5f);
  for (; i + 64 <= len; i += 64) {
    __m512i idx[4];
    for (int j = 0; j < 4; ++j) {
      __m512 x = _mm512_loadu_ps(v + i + 16 * j);
      if (PRE) x = _mm512_mul_ps(x, vp);
      // quant_grid_index16 without its clamps of v + 1 to [0, 2]: here v = x * pre * inv is NaN or within
      // 1 + 2^-22 of [-1, 1] (|x| <= the block's absmax; an inf absmax gives inv 0), and codes() packs the
      // indices with signed saturation, which gives what the clamps would: NaN -> cvtt's INT_MIN -> 0, v + 1 a
      // hair below 0 -> index 0, a hair above 2 -> 65535.  Two operations fewer per 16 codes, the same bytes.
      idx[j] = _mm512_cvttps_epi32(_mm512_fmadd_ps(_mm512_add_ps(_mm512_mul_ps(x, vi), one), scale, half));
    }
    _mm512_storeu_si512(q + i, gr.codes(idx));
  }
  return i;
}
SIMD_TARGET BNB_MS_INLINE int64_t requant_vec(const OptLut *lut, const Grid256Vbmi *gr, const float *v, int64_t len,
                                              float pre, float inv, uint8_t *q) {
  int64_t i = !gr ? 0
              : pre == 1.0f ? requant_grid_loop<false>(*gr, v, len, pre, inv, q)
                            : requant_grid_loop<true>(*gr, v, len, pre, inv, q);
  for (; i + 32 <= len; i += 32) requant32(lut, v + i, set1(pre), set1(inv), q + i);
  return i;
}
#include "cpu/optim_simd.inc"
#undef SIMD_TARGET
}  // namespace vbmi
}  // namespace avx512

template <class T, Opt O>
BNB_MS_TARGET_AVX2 void optimizer_update_8bit_blockwise_avx2(const K &k, const T *g, T *p, const State8 &st, int64_t n,
                                                             int64_t b0, int64_t b1) {
  avx2::blocks8<T, O>(k, g, p, st, n, b0, b1);
}
template <class T, Opt O>
BNB_MS_TARGET_AVX2 void optimizer_update_8bit_blockwise_gather_avx2(const K &k, const T *g, T *p, const State8 &st,
                                                                 int64_t n, int64_t b0, int64_t b1) {
  avx2::gather::blocks8<T, O>(k, g, p, st, n, b0, b1);
}
template <class T, Opt O>
BNB_MS_TARGET_AVX512 void optimizer_update_8bit_blockwise_avx512(const K &k, const T *g, T *p, const State8 &st,
                                                                 int64_t n, int64_t b0, int64_t b1) {
  avx512::blocks8<T, O>(k, g, p, st, n, b0, b1);
}

template <class T, Opt O>
BNB_MS_TARGET_AVX512VBMI void optimizer_update_8bit_blockwise_avx512vbmi(const K &k, const T *g, T *p, const State8 &st,
                                                                         int64_t n, int64_t b0, int64_t b1) {
  avx512::vbmi::blocks8<T, O>(k, g, p, st, n, b0, b1);
}

// The AVX2 loop's lookups: gathers (avx2::gather) on Intel CPUs (the 2-core Xeon, 2026-12-06: Adam8bit step 1.4x
// faster than with scalar loads), scalar loads elsewhere (on Zen 3 they beat the gathers, cpu/quant_lut.h).
// BNB_MS_AVX2_GATHER=0 / 1 overrides the choice (the tests check both forms on one machine).
bool avx2_gathers() {
  static const bool g = [] {
    if (const char *e = std::getenv("BNB_MS_AVX2_GATHER")) return std::strcmp(e, "0") != 0;
    return cpu_is_intel();
  }();
  return g;
}

template <class T, Opt O>
void optimizer_update_8bit_blockwise(const Hyper &h, const T *g, T *p, const State8 &st, int64_t n) {
  const K k = opt_consts(h);
  const int64_t nb = (n + kBlock - 1) / kBlock;
  const SimdLevel lvl = simd_level();
  const bool vbmi = has_avx512vbmi();
  const bool gathers = avx2_gathers();
  parallel_for(nb, 32, [&](int64_t b0, int64_t b1) {
    if (vbmi) optimizer_update_8bit_blockwise_avx512vbmi<T, O>(k, g, p, st, n, b0, b1);
    else if (lvl >= SimdLevel::avx512) optimizer_update_8bit_blockwise_avx512<T, O>(k, g, p, st, n, b0, b1);
    else if (lvl >= SimdLevel::avx2 && gathers) optimizer_update_8bit_blockwise_gather_avx2<T, O>(k, g, p, st, n, b0, b1);
    else if (lvl >= SimdLevel::avx2) optimizer_update_8bit_blockwise_avx2<T, O>(k, g, p, st, n, b0, b1);
    else optimizer_update_8bit_blockwise_portable<T, O>(k, g, p, st, n, b0, b1);
  });
}

// ---- entry points: checks in checks/optim.h (shared with the CUDA library) ----------------------
// The status output is the optimizers' has_error (aot.h): a failure on well-formed input is written there.
inline int report_status(int32_t *status, int code) {
  if (!status) return code;
  *status = code;
  return OK;
}

template <class T, Opt O>
int entry32(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Optimizer32<T> a;
  const auto zero_status = [&a] {
    if (a.status) *a.status = 0;
    return OK;
  };
  if (int s = checks::optimizer_32bit<T, O>(c, &a, zero_status)) return s;
  if (int f = forced_error("optim")) return report_status(a.status, f);
  if (a.empty) return OK;
  try {
    optimizer_update_32bit<T, O>(a.h, a.g, a.p, a.s1, a.s2, a.unorm, a.max_unorm, a.param_norm, a.n);
  } catch (const std::bad_alloc &) {  // the max_unorm path's buffer of raw updates
    return report_status(a.status, E_NOMEM);
  }
  return OK;
}

template <class T, Opt O>
int entry8(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Optimizer8<T> a;
  const auto zero_status = [&a] {
    if (a.status) *a.status = 0;
    return OK;
  };
  if (int s = checks::optimizer_8bit_blockwise<T, O>(c, &a, zero_status)) return s;
  if (int f = forced_error("optim")) return report_status(a.status, f);
  if (a.empty) return OK;
  State8 st{a.s1, nullptr, a.a1, nullptr, a.q1, nullptr, opt_lut(a.q1), nullptr};
  if (two_state(O)) {
    st.s2 = a.s2; st.a2 = a.a2; st.q2 = a.q2;
    st.l2 = opt_lut(st.q2);
  }
  optimizer_update_8bit_blockwise<T, O>(a.h, a.g, a.p, st, a.n);
  return OK;
}

}  // namespace
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;

// 32-bit state. Names as upstream's C library (momentum/rmsprop/adagrad use the _32/_16 suffixes
// there; the _bf16 variants of those three are ours).
BNB_MS_ENTRY(cadam32bit_grad_fp32, bnb_ms::entry32<float, bnb_ms::ADAM>)
BNB_MS_ENTRY(cadam32bit_grad_fp16, bnb_ms::entry32<fp16_t, bnb_ms::ADAM>)
BNB_MS_ENTRY(cadam32bit_grad_bf16, bnb_ms::entry32<bf16_t, bnb_ms::ADAM>)
BNB_MS_ENTRY(cademamix32bit_grad_fp32, bnb_ms::entry32<float, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cademamix32bit_grad_fp16, bnb_ms::entry32<fp16_t, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cademamix32bit_grad_bf16, bnb_ms::entry32<bf16_t, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(clion32bit_grad_fp32, bnb_ms::entry32<float, bnb_ms::LION>)
BNB_MS_ENTRY(clion32bit_grad_fp16, bnb_ms::entry32<fp16_t, bnb_ms::LION>)
BNB_MS_ENTRY(clion32bit_grad_bf16, bnb_ms::entry32<bf16_t, bnb_ms::LION>)
BNB_MS_ENTRY(cmomentum32bit_grad_32, bnb_ms::entry32<float, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(cmomentum32bit_grad_16, bnb_ms::entry32<fp16_t, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(cmomentum32bit_grad_bf16, bnb_ms::entry32<bf16_t, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(crmsprop32bit_grad_32, bnb_ms::entry32<float, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(crmsprop32bit_grad_16, bnb_ms::entry32<fp16_t, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(crmsprop32bit_grad_bf16, bnb_ms::entry32<bf16_t, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(cadagrad32bit_grad_32, bnb_ms::entry32<float, bnb_ms::ADAGRAD>)
BNB_MS_ENTRY(cadagrad32bit_grad_16, bnb_ms::entry32<fp16_t, bnb_ms::ADAGRAD>)
BNB_MS_ENTRY(cadagrad32bit_grad_bf16, bnb_ms::entry32<bf16_t, bnb_ms::ADAGRAD>)

// 8-bit blockwise state (blocksize 256).
BNB_MS_ENTRY(cadam_8bit_blockwise_grad_fp32, bnb_ms::entry8<float, bnb_ms::ADAM>)
BNB_MS_ENTRY(cadam_8bit_blockwise_grad_fp16, bnb_ms::entry8<fp16_t, bnb_ms::ADAM>)
BNB_MS_ENTRY(cadam_8bit_blockwise_grad_bf16, bnb_ms::entry8<bf16_t, bnb_ms::ADAM>)
BNB_MS_ENTRY(cademamix_8bit_blockwise_grad_fp32, bnb_ms::entry8<float, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cademamix_8bit_blockwise_grad_fp16, bnb_ms::entry8<fp16_t, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cademamix_8bit_blockwise_grad_bf16, bnb_ms::entry8<bf16_t, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cmomentum_8bit_blockwise_grad_fp32, bnb_ms::entry8<float, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(cmomentum_8bit_blockwise_grad_fp16, bnb_ms::entry8<fp16_t, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(cmomentum_8bit_blockwise_grad_bf16, bnb_ms::entry8<bf16_t, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(crmsprop_8bit_blockwise_grad_fp32, bnb_ms::entry8<float, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(crmsprop_8bit_blockwise_grad_fp16, bnb_ms::entry8<fp16_t, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(crmsprop_8bit_blockwise_grad_bf16, bnb_ms::entry8<bf16_t, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(clion_8bit_blockwise_grad_fp32, bnb_ms::entry8<float, bnb_ms::LION>)
BNB_MS_ENTRY(clion_8bit_blockwise_grad_fp16, bnb_ms::entry8<fp16_t, bnb_ms::LION>)
BNB_MS_ENTRY(clion_8bit_blockwise_grad_bf16, bnb_ms::entry8<bf16_t, bnb_ms::LION>)
BNB_MS_ENTRY(cadagrad_8bit_blockwise_grad_fp32, bnb_ms::entry8<float, bnb_ms::ADAGRAD>)
BNB_MS_ENTRY(cadagrad_8bit_blockwise_grad_fp16, bnb_ms::entry8<fp16_t, bnb_ms::ADAGRAD>)
BNB_MS_ENTRY(cadagrad_8bit_blockwise_grad_bf16, bnb_ms::entry8<bf16_t, bnb_ms::ADAGRAD>)
