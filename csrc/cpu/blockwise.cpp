// blockwise.cpp -- blockwise 8-bit quantization with a 256-entry code (bitsandbytes'
// quantize_blockwise / dequantize_blockwise; Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization", arXiv 2110.02861).
//
// Numerics follow upstream bitsandbytes' CPU kernel (csrc/cpu_ops.cpp, quantize_cpu_impl) so the
// bytes match: per block absmax = max|x|; x * (1/absmax) is clamped to [-1, 1] and mapped onto a
// 65536-bin grid, idx = (v + 1) * 0.5 * 65535 + 0.5 (truncated), and a precomputed 65536-entry
// table gives the nearest code entry for each bin (ties between codes go to the lower index).
// An all-zero block stores absmax 0 and codes 0; a block whose 1/absmax overflows (absmax < 2^-128) is
// scaled by 2^64 first (quant_block_scale in quant_lut.h; upstream maps it to +-1 and 0 to code 0).
// Dequantize: out = code[q] * absmax[block], rounded to the output dtype.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "aot.h"
#include "checks/blockwise.h"
#include "cpu/code256.h"
#include "cpu/cpu_features.h"
#include "cpu/parallel.h"
#include "cpu/quant_lut.h"
#include "cpu/simd_convert.h"

namespace bnb_ms {

const QuantLut *get_quant_lut(const float *code) {
  static std::mutex mu;
  static std::unique_ptr<QuantLut> slots[4];
  static int next = 0;
  std::lock_guard<std::mutex> lock(mu);
  for (auto &s : slots)
    if (s && std::memcmp(s->code, code, sizeof(s->code)) == 0) return s.get();
  auto &slot = slots[next];
  next = (next + 1) % 4;
  if (!slot) slot.reset(new QuantLut);
  std::memcpy(slot->code, code, sizeof(slot->code));
  float mid[kQuantCode - 1];
  for (int i = 0; i < kQuantCode - 1; ++i) mid[i] = 0.5f * (code[i] + code[i + 1]);
  int c = 0;
  for (int i = 0; i < kQuantLut; ++i) {
    const float v = -1.0f + (2.0f * (float)i) / (float)(kQuantLut - 1);
    while (c < kQuantCode - 1 && mid[c] < v) ++c;
    slot->table[i] = (uint8_t)c;
  }
  std::memset(slot->table + kQuantLut, 0, 4);
  int z = 0;
  for (int i = 1; i < kQuantCode; ++i)
    if (std::fabs(code[i]) < std::fabs(code[z])) z = i;
  slot->zero = (uint8_t)z;
  return slot.get();
}

namespace {

const QuantLut *get_lut(const float *code) { return get_quant_lut(code); }

// In a block of subnormals (absmax < 2^-126) an exact 0 takes the code entry nearest 0, so it dequantizes to 0:
// its grid bin (2^-16 above 0) gives code 2.1e-5 of the dynamic map, which times a subnormal absmax rounds to a
// nonzero subnormal (upstream: 0 * inf = NaN -> code 0 = -absmax where 1/absmax overflows). Other blocks keep
// upstream's bytes.
template <class T>
BNB_MS_INLINE void zeros_of_tiny_block(const QuantLut *lut, float amax, const T *a, uint8_t *o, int64_t len) {
  if (!(amax < FLT_MIN)) return;
  for (int64_t i = 0; i < len; ++i)
    if (to_f32(a[i]) == 0.0f) o[i] = lut->zero;
}

// ---- portable path ------------------------------------------------------------------------------
template <class T>
BNB_MS_INLINE void quantize_blockwise_portable(const QuantLut *lut, const T *A, float *absmax, uint8_t *out, int64_t bs,
                                               int64_t n, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n);
    float amax = 0.0f;
    for (int64_t i = s; i < e; ++i) amax = std::max(amax, std::fabs(to_f32(A[i])));
    absmax[b] = amax;
    if (amax == 0.0f) {
      std::memset(out + s, 0, (size_t)(e - s));
      continue;
    }
    const QuantScale k = quant_block_scale(amax);
    for (int64_t i = s; i < e; ++i) out[i] = lut->table[quant_grid_index(to_f32(A[i]) * k.pre * k.inv)];
    zeros_of_tiny_block(lut, amax, A + s, out + s, e - s);
  }
}

template <class T>
BNB_MS_INLINE void dequantize_blockwise_portable(const float *code, const uint8_t *A, const float *absmax, T *out,
                                                 int64_t bs, int64_t n, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n);
    const float scale = absmax[b];
    for (int64_t i = s; i < e; ++i) out[i] = from_f32<T>(code[A[i]] * scale);
  }
}

// ---- SIMD paths -------------------------------------------------------------------------------
// Quantize: absmax over the block in vector accumulators (the max of the non-NaN |x| in any order: MAXPS
// returns its 2nd operand, the accumulator, for a NaN lane, as std::max(amax, |x|) keeps amax), then grid
// indices in vectors (quant_grid_index8/16) and the codes by scalar loads, 32 at a time (AVX2, lut_codes)
// or by a gather (AVX-512, lut_gather16): see cpu/quant_lut.h for why each.
// Dequantize (AVX2): blocks of kTableMin+ elements through a per-block table of the 256 results
// from_f32<T>(code[c] * absmax) (table_lookup), smaller blocks gather code[q] and multiply; AVX-512 gathers, or
// with VBMI looks code[q] up in registers (cpu/code256.h).
constexpr int kGroup8 = 32;
constexpr int64_t kTableMin = 256;

template <class T>
BNB_MS_TARGET_AVX2 void quantize_blockwise_avx2(const QuantLut *lut, const T *A, float *absmax, uint8_t *out,
                                                int64_t bs, int64_t n, int64_t b0, int64_t b1) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  alignas(32) uint32_t idx[kGroup8];
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, len = std::min(s + bs, n) - s, len32 = len / kGroup8 * kGroup8;
    const T *a = A + s;
    __m256 m[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i < len32; i += kGroup8)
      for (int k = 0; k < 4; ++k) m[k] = _mm256_max_ps(_mm256_andnot_ps(sign, load8<T>(a + i + 8 * k)), m[k]);
    for (; i + 8 <= len; i += 8) m[0] = _mm256_max_ps(_mm256_andnot_ps(sign, load8<T>(a + i)), m[0]);
    const __m256 vmax = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    float amax = _mm_cvtss_f32(m4);
    for (; i < len; ++i) amax = std::max(amax, std::fabs(to_f32(a[i])));
    absmax[b] = amax;
    uint8_t *o = out + s;
    if (amax == 0.0f) {
      std::memset(o, 0, (size_t)len);
      continue;
    }
    const QuantScale k = quant_block_scale(amax);
    const __m256 vpre = _mm256_set1_ps(k.pre), vinv = _mm256_set1_ps(k.inv);
    for (i = 0; i < len32; i += kGroup8) {
      for (int j = 0; j < 4; ++j)
        _mm256_store_si256((__m256i *)(idx + 8 * j),
                           quant_grid_index8(_mm256_mul_ps(_mm256_mul_ps(load8<T>(a + i + 8 * j), vpre), vinv)));
      lut_codes<kGroup8>(lut->table, idx, o + i);
    }
    for (; i < len; ++i) o[i] = lut->table[quant_grid_index(to_f32(a[i]) * k.pre * k.inv)];
    zeros_of_tiny_block(lut, amax, a, o, len);
  }
}

template <class T>
BNB_MS_TARGET_AVX2 void dequantize_blockwise_avx2(const float *code, const uint8_t *A, const float *absmax, T *out,
                                                  int64_t bs, int64_t n, int64_t b0, int64_t b1) {
  alignas(32) T tab[kQuantCode];
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, e = std::min(s + bs, n), len = e - s;
    const float scale = absmax[b];
    const __m256 vs = _mm256_set1_ps(scale);
    const uint8_t *q = A + s;
    T *o = out + s;
    if (bs >= kTableMin) {
      for (int k = 0; k < kQuantCode; k += 8) store8<T>(tab + k, _mm256_mul_ps(_mm256_loadu_ps(code + k), vs));
      table_lookup(tab, q, o, len);
      continue;
    }
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
      __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
      store8<T>(o + i, _mm256_mul_ps(_mm256_i32gather_ps(code, idx, 4), vs));
    }
    for (; i < len; ++i) o[i] = from_f32<T>(code[q[i]] * scale);
  }
}

template <class T>
BNB_MS_TARGET_AVX512 void quantize_blockwise_avx512(const QuantLut *lut, const T *A, float *absmax, uint8_t *out,
                                                    int64_t bs, int64_t n, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = b * bs, len = std::min(s + bs, n) - s;
    const T *a = A + s;
    __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= len; i += 32) {
      m0 = _mm512_max_ps(_mm512_abs_ps(load16<T>(a + i)), m0);
      m1 = _mm512_max_ps(_mm512_abs_ps(load16<T>(a + i + 16)), m1);
    }
    for (; i + 16 <= len; i += 16) m0 = _mm512_max_ps(_mm512_abs_ps(load16<T>(a + i)), m0);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
    for (; i < len; ++i) amax = std::max(amax, std::fabs(to_f32(a[i])));
    absmax[b] = amax;
    uint8_t *o = out + s;
    if (amax == 0.0f) {
      std::memset(o, 0, (size_t)len);
      continue;
    }
    const QuantScale k = quant_block_scale(amax);
    const __m512 vpre = _mm512_set1_ps(k.pre), vinv = _mm512_set1_ps(k.inv);
    for (i = 0; i + 16 <= len; i += 16)
      _mm_storeu_si128((__m128i *)(o + i),
                       lut_gather16(lut, quant_grid_index16(_mm512_mul_ps(_mm512_mul_ps(load16<T>(a + i), vpre), vinv))));
    for (; i < len; ++i) o[i] = lut->table[quant_grid_index(to_f32(a[i]) * k.pre * k.inv)];
    zeros_of_tiny_block(lut, amax, a, o, len);
  }
}

// code[q] * absmax with the lookups of LUT (cpu/code256.h): gathers, or with VBMI in registers (the same values).
#define BNB_MS_DEQUANT_BLOCKS(NAME, TARGET, LUT)                                                               \
  template <class T>                                                                                          \
  TARGET void NAME(const float *code, const uint8_t *A, const float *absmax, T *out, int64_t bs, int64_t n,     \
                   int64_t b0, int64_t b1) {                                                                  \
    LUT lut;                                                                                                  \
    lut.init(code);                                                                                           \
    for (int64_t b = b0; b < b1; ++b) {                                                                       \
      const int64_t s = b * bs, e = std::min(s + bs, n), len = e - s;                                         \
      const float scale = absmax[b];                                                                          \
      const __m512 vs = _mm512_set1_ps(scale);                                                                \
      const uint8_t *q = A + s;                                                                               \
      T *o = out + s;                                                                                         \
      int64_t i = 0;                                                                                          \
      for (; i + LUT::kN <= len; i += LUT::kN) {                                                              \
        __m512 v[LUT::kN / 16];                                                                               \
        lut.lookup(q + i, v);                                                                                 \
        for (int k = 0; k < LUT::kN / 16; ++k) store16<T>(o + i + 16 * k, _mm512_mul_ps(v[k], vs));           \
      }                                                                                                       \
      for (; i < len; ++i) o[i] = from_f32<T>(code[q[i]] * scale);                                            \
    }                                                                                                         \
  }
BNB_MS_DEQUANT_BLOCKS(dequantize_blockwise_avx512, BNB_MS_TARGET_AVX512, Code256Gather)
BNB_MS_DEQUANT_BLOCKS(dequantize_blockwise_avx512vbmi, BNB_MS_TARGET_AVX512VBMI, Code256Vbmi)
#undef BNB_MS_DEQUANT_BLOCKS

template <class T>
void quantize_blockwise(const float *code, const T *A, float *absmax, uint8_t *out, int64_t bs, int64_t n) {
  const QuantLut *lut = get_lut(code);
  const int64_t nblocks = (n + bs - 1) / bs;
  const SimdLevel lvl = simd_level();
  parallel_for(nblocks, std::max<int64_t>(1, 65536 / bs), [&](int64_t b0, int64_t b1) {  // (2 chunks: >= ~80 us)
    if (lvl >= SimdLevel::avx512) quantize_blockwise_avx512<T>(lut, A, absmax, out, bs, n, b0, b1);
    else if (lvl >= SimdLevel::avx2) quantize_blockwise_avx2<T>(lut, A, absmax, out, bs, n, b0, b1);
    else quantize_blockwise_portable<T>(lut, A, absmax, out, bs, n, b0, b1);
  });
}

template <class T>
void dequantize_blockwise(const float *code, const uint8_t *A, const float *absmax, T *out, int64_t bs, int64_t n) {
  const int64_t nblocks = (n + bs - 1) / bs;
  const SimdLevel lvl = simd_level();
  const bool vbmi = has_avx512vbmi() && bs >= 64;  // (smaller blocks: the table costs more than it saves)
  parallel_for(nblocks, std::max<int64_t>(1, 131072 / bs), [&](int64_t b0, int64_t b1) {  // (2 chunks: >= ~70 us)
    if (vbmi) dequantize_blockwise_avx512vbmi<T>(code, A, absmax, out, bs, n, b0, b1);
    else if (lvl >= SimdLevel::avx512) dequantize_blockwise_avx512<T>(code, A, absmax, out, bs, n, b0, b1);
    else if (lvl >= SimdLevel::avx2) dequantize_blockwise_avx2<T>(code, A, absmax, out, bs, n, b0, b1);
    else dequantize_blockwise_portable<T>(code, A, absmax, out, bs, n, b0, b1);
  });
}

// ---- entry points: checks in checks/blockwise.h (shared with the CUDA library) ------------------
template <class T>
int quantize_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::QuantizeBlockwise<T> a;
  if (int s = checks::quantize_blockwise(c, &a)) return s;
  if (a.empty) return OK;
  quantize_blockwise<T>(a.code, a.A, a.absmax, a.out, a.blocksize, a.n);
  return OK;
}

template <class T>
int dequantize_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  checks::DequantizeBlockwise<T> a;
  if (int s = checks::dequantize_blockwise(c, &a)) return s;
  if (a.empty) return OK;
  dequantize_blockwise<T>(a.code, a.A, a.absmax, a.out, a.blocksize, a.n);
  return OK;
}

}  // namespace
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cquantize_blockwise_fp32, bnb_ms::quantize_entry<float>)
BNB_MS_ENTRY(cquantize_blockwise_fp16, bnb_ms::quantize_entry<fp16_t>)
BNB_MS_ENTRY(cquantize_blockwise_bf16, bnb_ms::quantize_entry<bf16_t>)
BNB_MS_ENTRY(cdequantize_blockwise_fp32, bnb_ms::dequantize_entry<float>)
BNB_MS_ENTRY(cdequantize_blockwise_fp16, bnb_ms::dequantize_entry<fp16_t>)
BNB_MS_ENTRY(cdequantize_blockwise_bf16, bnb_ms::dequantize_entry<bf16_t>)
