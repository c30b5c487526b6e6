// decoder.cpp -- fused decoder-layer forwards for Llama / Qwen2 / Mistral-style causal LMs (inference).
//
// One native call per half of a decoder layer instead of ~80 framework ops (issue 13):
//   cdecoder_attention_fp32:  out = x + O(attn(RoPE(Q(rms(x))), RoPE(K(rms(x))) -> cache, V(rms(x)) -> cache))
//   cdecoder_mlp_fp32:        out = x + Down(silu(Gate(rms(x))) * Up(rms(x)))
// plus two helpers for the model's ends: cdecoder_linear_fp32 (one linear, e.g. lm_head) and
// crms_norm_fp32 (the final norm).  Activation buffers (the hidden states x / out, the residual stream) are fp32
// for every model; an fp16 model's hold fp16 values (the *_r16 entries below), a bf16 model computes in fp32
// (integrations/fused.py says why); norm weights and dense weights may be fp16 / bf16 (widened exactly).  A linear layer's weight is one of
//   * fp32 [N, K] (a layer left unquantized): the GEMV of this file (fp32 accumulation);
//   * fp16 / bf16 [N, K] (a layer left unquantized in a 16-bit model): the same GEMV, the weight widened to fp32
//     in registers (exact); many rows widen the weight rows into the GEMM's panels;
//   * NF4/FP4 packed + absmax fp32 or double quant: the 4-bit GEMV of fourbit.cpp (linear_kernels.h), the
//     same kernel (and bits) as the unfused Linear4bit forward at <= 8 rows;
//   * int8 (LLM.int8(), Linear8bitLt's inference state): CB int8 [N, K] + SCB f32 [N] + threshold: the fused
//     int8 kernel of int8.cpp (int8_linear_f32, linear_kernels.h) at every row count, i.e. the bytes of the
//     unfused Linear8bitLt forward on the same fp32 input (cint8_linear_fp32: the input rounded to fp16 before
//     the vector-wise quantization, as upstream; threshold > 0 multiplies the outlier columns in fp32).
// Up to 8 rows (decode) the fp32/16-bit/4-bit linears run those GEMV kernels; more rows (prefill) run the
// packed-panel fp32 GEMM of gemm_panel.h (4-bit weights dequantized into the panels first: the values of
// dequantize_4bit; 16-bit ones widened), and from 6 query rows per sequence on the attention runs blocked on
// packed K/V panels (attend_prefill).  The *_bf16dot entries (same params) run a 4-bit weight's rows
// through fourbit.cpp's one-row bf16 GEMV up to 16 rows (linear4_bf16_gemv_f32, where its shape applies; each row
// as if alone) and more through gemm_panel.h's bf16 variant (gemm_rows_bf16); everything else as in the exact entries.
// Every linear is given as 9 consecutive params ("linear spec"), by weight kind:
//   slot        fp32 / fp16 / bf16       4-bit                         int8
//   W           f|h|bf [N, K]            u8 packed >= (N*K+1)/2        i8 CB [N, K] (K <= 131071)
//   absmax      none                     f32 [nb] | u8 [nb] (dq)       f32 SCB [N]
//   code        none                     f32 [16]                      none
//   absmax2     none                     f32 [>= nb/bs2] (dq) | none   none
//   code2       none                     f32 [256] (dq) | none         none
//   offset      none                     f32 0-d (dq) | none           f32 0-d threshold (>= 0) | none (0)
//   bias        f32|f16|bf16 [N] | none (added in fp32, any kind)
//   blocksize   i64 (4-bit: > 0, even; others: unused)
//   blocksize2  i64 (4-bit: > 0; others: unused)
// Numerics: HF transformers' eager forward in fp32 with the unfused model's rounding on MindSpore 2.7's CPU
// kernels (simd_math.h gives the measured rules), so that a prefill gives the unfused model's bits (an int8
// model amplifies any 1-ulp difference between layers):
//   RMSNorm   var = float(sum of square(x) in double, in order) / H (square: glibc powf(x, 2)), r = 1 / sqrt(var +
//             eps), y = w * (x * r); QK-norm (Qwen3) the same over each head's D values of q and k, before RoPE
//   RoPE      default rope type: f = float(pos) * inv_freq[i], c = float(cos(double(f))) * rs, s likewise with
//             sin (rs: attention scaling), rotate_half: y[i] = x[i] c - x[i+D/2] s, y[i+D/2] = x[i+D/2] c + x[i] s
//   attention query row t of sequence b sits at cache index past + t; key j is visible iff j <= past + t,
//             key_mask[b, j] != 0 and (window == 0 or past + t - j < window).  Scores: one fma chain over d from
//             0, times scaling (prefill; from 6 rows: the unfused bits); decode rows (fewer than 6) sum each score
//             in four partial chains (dot: faster, within the reference's bound).  Softmax over the row of
//             L = past + T keys: e = exp(s - max), p = e * (1 / sum) (the sum in Softmax's order, simd_math::
//             softmax_sum); a row with no visible key gives 0.  P V: one fma chain per chunk of keys (pv_chunk_end),
//             the chunks added in order.  GQA: head h reads kv head h / (Hq / KVH).
//   SiLU      (g * (1 / (1 + exp(-g)))) * up
//   exp       simd_math.h's exp (MindSpore's: same bits at every SIMD level, ~1e-7..1e-5 relative error)
// The *_r16 entries (same params; an fp16 model, whose unfused ops each round their fp32 result to fp16) keep
// the same fp32 buffers holding fp16 values and round where that model does (simd_math.h's fp16 rules): the norm's
// x * r and w * that, every linear's output, RoPE's cos / sin and each of its products and sums, scores after the
// product and after the scaling, the softmax output, P V, the residual adds, SiLU's steps (silu_mul_r16).
// The KV cache is the caller's preallocated k_cache/v_cache [B, KVH, S_max, D] (fp32), written IN PLACE at
// [past, past + T) before attending over [0, past + T).  `out` may be the same memory as `x`.
// Threads: parallel_for / parallel_for_dynamic (parallel.h) for this file's loops; the 4-bit GEMV and the int8
// kernel thread themselves.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "aot.h"
#include "checks/int8.h"
#include "cpu/cpu_features.h"
#include "cpu/gemm_panel.h"
#include "cpu/linear_kernels.h"
#include "cpu/parallel.h"
#include "cpu/simd_convert.h"
#include "cpu/simd_math.h"

namespace bnb_ms {
namespace {

// ---- small fp32 vector helpers ----------------------------------------------------------------------
// dot(a, b) (attention scores): a fp32, b fp32 | fp16 | bf16 (widened exactly in registers); fp32 accumulation, the same order
// for every element type of b.
template <class T>
float dot_portable(const float *a, const T *b, int64_t n) {
  // dot_avx2's operations in its order (so every SIMD level gives the same bits): four 8-lane fma accumulators
  // over 32-element steps, then 8-element steps into the first, (s0 + s1) + (s2 + s3), the lanes reduced as
  // ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)), then the tail fmas
  float s[4][8] = {};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int r = 0; r < 4; ++r)
      for (int l = 0; l < 8; ++l) s[r][l] = std::fma(a[i + 8 * r + l], to_f32<T>(b[i + 8 * r + l]), s[r][l]);
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) s[0][l] = std::fma(a[i + l], to_f32<T>(b[i + l]), s[0][l]);
  float v[8];
  for (int l = 0; l < 8; ++l) v[l] = (s[0][l] + s[1][l]) + (s[2][l] + s[3][l]);
  float r = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  for (; i < n; ++i) r = std::fma(a[i], to_f32<T>(b[i]), r);
  return r;
}

template <class T>
BNB_MS_TARGET_AVX2 float dot_avx2(const float *a, const T *b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8<T>(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load8<T>(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), load8<T>(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), load8<T>(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8<T>(b + i), s0);
  const __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));
  float r = _mm_cvtss_f32(_mm_add_ss(w, _mm_shuffle_ps(w, w, 1)));
  for (; i < n; ++i) r = std::fma(a[i], to_f32<T>(b[i]), r);
  return r;
}

// y += p * x
void axpy_portable(float *y, float p, const float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::fma(p, x[i], y[i]);
}
BNB_MS_TARGET_AVX2 void axpy_avx2(float *y, float p, const float *x, int64_t n) {
  const __m256 vp = _mm256_set1_ps(p);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vp, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(p, x[i], y[i]);
}

template <class T>
BNB_MS_INLINE float dot(const float *a, const T *b, int64_t n) {
  return has_avx2() ? dot_avx2<T>(a, b, n) : dot_portable<T>(a, b, n);
}
BNB_MS_INLINE void axpy(float *y, float p, const float *x, int64_t n) {
  if (has_avx2()) axpy_avx2(y, p, x, n);
  else axpy_portable(y, p, x, n);
}

// ---- linear layers --------------------------------------------------------------------------------
struct Lin {
  bool dense = false;           // fp32 weight W (read in place by gemm_rows)
  const float *W = nullptr;     // dense fp32 [N, K]
  const void *W16 = nullptr;    // dense fp16 / bf16 [N, K] (wdt)
  DType wdt = DType::f32;
  bool int8 = false;            // LLM.int8(): q8
  Int8Weight q8;
  Linear4Weight q4;             // 4-bit otherwise
  bool bf16dot = false;         // 4-bit in bf16 (the *_bf16dot entries): prefill GEMM, one-row decode GEMV
  const float *bias = nullptr;  // fp32 [N]: in place, or bias_f32 (widened from fp16 / bf16)
  std::vector<float> bias_f32;
  int64_t N = 0, K = 0;
};

constexpr int kSpec = 9;
enum { L_W, L_ABSMAX, L_CODE, L_ABSMAX2, L_CODE2, L_OFFSET, L_BIAS, L_BS, L_BS2 };

// dst[i] = float(src[i]) for the n values of an fp32 / fp16 / bf16 buffer (parallel for long spans).
void widen(const void *src, DType dt, float *dst, int64_t n) {
  parallel_for(n, 65536, [&](int64_t i0, int64_t i1) {
    if (dt == DType::f16) convert_span<fp16_t, float>(static_cast<const fp16_t *>(src) + i0, dst + i0, i1 - i0);
    else if (dt == DType::bf16) convert_span<bf16_t, float>(static_cast<const bf16_t *>(src) + i0, dst + i0, i1 - i0);
    else std::memcpy(dst + i0, static_cast<const float *>(src) + i0, (size_t)(i1 - i0) * sizeof(float));
  });
}

// Param i (f32 | f16 | bf16, n values) as fp32: its own memory when f32, else widened into buf.
const float *f32_of(const Call<> &c, int i, std::vector<float> &buf) {
  if (c.dtype(i) == DType::f32) return c.ptr<float>(i);
  buf.resize((size_t)c.numel(i));
  widen(c.params[i], c.dtype(i), buf.data(), c.numel(i));
  return buf.data();
}

// Checks the linear spec at params [i0, i0 + 9) for an [N, K] weight; fills `l` (bf16dot: a 4-bit weight's
// prefill computes in bf16).
int parse_lin(const Call<> &c, int i0, int64_t N, int64_t K, Lin *l, bool bf16dot) {
  l->N = N;
  l->K = K;
  const int b = i0 + L_BIAS;
  if (!c.is_none(b)) {
    if (!checks::is_float_dtype(c.dtype(b))) return E_DTYPE;
    if (c.numel(b) != N) return E_SHAPE;
    if (c.dtype(b) == DType::f32) {
      l->bias = c.ptr<float>(b);
    } else {
      l->bias_f32.resize((size_t)N);
      widen(c.params[b], c.dtype(b), l->bias_f32.data(), N);
      l->bias = l->bias_f32.data();
    }
  }
  const int w = i0 + L_W;
  if (c.is_none(w)) return E_NULL;
  const DType wdt = c.dtype(w);
  if (checks::is_float_dtype(wdt) || wdt == DType::i8) {
    if (c.rank(w) != 2 || c.dim(w, 0) != N || c.dim(w, 1) != K) return E_SHAPE;
  }
  if (wdt == DType::f32) {
    l->dense = true;
    l->W = c.ptr<float>(w);
    return OK;
  }
  if (wdt == DType::f16 || wdt == DType::bf16) {
    l->W16 = c.params[w];
    l->wdt = wdt;
    return OK;
  }
  if (wdt == DType::i8) {
    const int scb = i0 + L_ABSMAX, thr = i0 + L_OFFSET;
    if (c.is_none(scb)) return E_NULL;
    if (c.dtype(scb) != DType::f32) return E_DTYPE;
    if (c.numel(scb) != N || K > checks::kIgemmMaxK) return E_SHAPE;  // exact int32 sums
    float t = 0.0f;
    if (!c.is_none(thr) && (!c.scalar_f32(thr, &t) || !(t >= 0.0f))) return E_VALUE;
    l->int8 = true;
    l->q8.CB = c.ptr<int8_t>(w);
    l->q8.SCB = c.ptr<float>(scb);
    l->q8.threshold = t;
    return OK;
  }
  if (wdt != DType::u8) return E_DTYPE;
  int64_t bs, bs2;
  if (!c.scalar_i64(i0 + L_BS, &bs) || bs <= 0 || bs % 2 || !c.scalar_i64(i0 + L_BS2, &bs2) || bs2 <= 0) return E_VALUE;
  const int64_t nb = (N * K + bs - 1) / bs;
  if (c.numel(w) < (N * K + 1) / 2) return E_SHAPE;
  const int am = i0 + L_ABSMAX, cd = i0 + L_CODE;
  if (c.is_none(am) || c.is_none(cd)) return E_NULL;
  if (c.dtype(cd) != DType::f32) return E_DTYPE;
  if (c.numel(cd) != 16 || c.numel(am) < nb) return E_SHAPE;
  l->bf16dot = bf16dot;
  Linear4Weight &q = l->q4;
  q.packed = c.ptr<uint8_t>(w);
  q.code = c.ptr<float>(cd);
  q.blocksize = bs;
  q.blocksize2 = bs2;
  if (c.dtype(am) == DType::u8) {
    const int a2 = i0 + L_ABSMAX2, c2 = i0 + L_CODE2, of = i0 + L_OFFSET;
    if (c.is_none(a2) || c.is_none(c2) || c.is_none(of)) return E_NULL;
    if (c.dtype(a2) != DType::f32 || c.dtype(c2) != DType::f32 || c.dtype(of) != DType::f32) return E_DTYPE;
    if (c.numel(c2) != 256 || c.numel(a2) < (nb + bs2 - 1) / bs2 || c.rank(of) != 0) return E_SHAPE;
    q.absmax_q = c.ptr<uint8_t>(am);
    q.code2 = c.ptr<float>(c2);
    q.absmax2 = c.ptr<float>(a2);
    q.offset = *c.ptr<float>(of);
  } else if (c.dtype(am) == DType::f32) {
    q.absmax_f32 = c.ptr<float>(am);
  } else {
    return E_DTYPE;
  }
  return OK;
}

// ---- many rows (prefill): the packed-panel GEMM of gemm_panel.h.  Threads take chunks of output columns;
// a chunk's weight rows are packed into panels (4-bit: dequantized first, the values of dequantize_4bit)
// sized to stay in L2 while every row of x runs against them.
constexpr int64_t kPanelChunkBytes = 128 << 10;

// rows [n0, n1) of a weight that is not fp32 (4-bit or fp16 / bf16) in fp32 ((n1 - n0) x K), for gemm_rows.
void linear_spec_weight(const Lin &l, int64_t n0, int64_t n1, float *dst) {
  if (l.W16) widen(static_cast<const uint16_t *>(l.W16) + n0 * l.K, l.wdt, dst, (n1 - n0) * l.K);
  else decode4_rows_f32(l.q4, n0, n1, l.K, dst);
}

// Threads take chunks of output columns (whole panels sized to kPanelChunkBytes, at least 3: one 48-column
// tile); pack(n, w, P) fills the panel of weight rows [n, n + w) (Kp elements E per panel row), run(n0, nc, P)
// multiplies the chunk's nc columns from n0.
template <class E, class Pack, class Run>
void panel_chunks(int64_t N, int64_t Kp, Pack &&pack, Run &&run, int64_t chunk_bytes = kPanelChunkBytes) {
  const int64_t cols = std::max<int64_t>(3, chunk_bytes / (int64_t)sizeof(E) / (Kp * kPanel)) * kPanel;
  const int64_t ntasks = (N + cols - 1) / cols;
  parallel_for_dynamic(ntasks, 1, [&](int64_t t0, int64_t t1) {
    static thread_local std::vector<E> panels;
    panels.resize((size_t)(cols * Kp));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * cols, nc = std::min(cols, N - n0);
      for (int64_t p = 0; p < nc; p += kPanel) pack(n0 + p, (int)std::min<int64_t>(kPanel, nc - p), panels.data() + p * Kp);
      run(n0, nc, panels.data());
    }
  });
}

void gemm_rows(const Lin &l, const float *x, float *out, int64_t M) {
  const int64_t N = l.N, K = l.K;
  panel_chunks<float>(
      N, K,
      [&](int64_t n, int w, float *P) {
        if (l.dense) return pack_panel_rows(l.W + n * K, K, K, w, P);
        static thread_local std::vector<float> rows;
        rows.resize((size_t)(kPanel * K));
        linear_spec_weight(l, n, n + w, rows.data());
        pack_panel_rows(rows.data(), K, K, w, P);
      },
      [&](int64_t n0, int64_t nc, const float *P) {
        gemm_panel_f32(x, K, M, P, K * kPanel, K, nc, l.bias ? l.bias + n0 : nullptr, out + n0, N);
      });
}

// The bf16 form of gemm_rows for a 4-bit weight (gemm_panel.h's bf16 variant: its order and its bound vs
// gemm_rows): x rounded to bf16 pairs once per call, each chunk's weight rows dequantized (the values of
// dequantize_4bit) and rounded into bf16 panels.
void gemm_rows_bf16(const Lin &l, const float *x, float *out, int64_t M) {
  const int64_t N = l.N, K = l.K, K2 = (K + 1) / 2;
  // AMX-BF16 (gemm_panel.h): operands padded to whole tiles, and 4x larger chunks of panels (the tile unit
  // multiplies ~8x faster than vdpbf16ps, so re-reading x for every chunk would otherwise set the pace)
  const bool amx = gemm_bf16_amx_applies(M);
  const int64_t Kp = amx ? (K2 + 15) / 16 * 16 : K2, Mp = amx ? (M + 15) / 16 * 16 : M;
  static thread_local std::vector<uint32_t> xa;
  xa.resize((size_t)(Mp * Kp));
  uint32_t *xp = xa.data();  // (a thread_local named inside the lambdas would be each worker's own)
  parallel_for(Mp, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)), [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      if (m < M) pack_rows_bf16(x + m * K, K, 1, K, xp + m * Kp);
      std::fill(xp + m * Kp + (m < M ? K2 : 0), xp + (m + 1) * Kp, 0u);
    }
  });
  panel_chunks<uint32_t>(
      N, Kp,
      [&](int64_t n, int w, uint32_t *P) {
        // the weight rows decoded straight to bf16 pairs (their fp32 dequantized values rounded, without writing
        // them in fp32 first: a 7B-shaped prefill spent ~25% of its time dequantizing to fp32 and rounding)
        static thread_local std::vector<uint32_t> rows;
        rows.resize((size_t)(kPanel * K2));
        decode4_rows_bf16(l.q4, n, n + w, K, 2 * K2, reinterpret_cast<uint16_t *>(rows.data()));
        pack_panel_pairs(rows.data(), K2, w, P);
        std::fill(P + K2 * kPanel, P + Kp * kPanel, 0u);
      },
      [&](int64_t n0, int64_t nc, const uint32_t *P) {
        const float *b = l.bias ? l.bias + n0 : nullptr;
        if (amx) gemm_panel_bf16_amx_bf16(xp, M, P, Kp * kPanel, Kp, nc, b, out + n0, N);
        else gemm_panel_bf16(xp, Kp, M, P, Kp * kPanel, K2, nc, b, out + n0, N);
      },
      amx ? 4 * kPanelChunkBytes : kPanelChunkBytes);
}

// up to this many rows a linear runs the GEMV kernels (4-bit: the unfused Linear4bit's kernel, same bits);
// more rows (prefill) run gemm_rows (as the unfused Linear4bit dequantizes and multiplies above 8 rows).
// int8 layers run the unfused layer's fused kernel at every row count (its own GEMV/GEMM choice inside).
constexpr int64_t kGemvMaxRows = 8;
// A 4-bit layer in bf16 (bf16dot) runs up to this many rows through the one-row bf16 kernel, the weights read once
// for all rows (fourbit.cpp, linear4_bf16_gemv_f32: each row's result is that kernel's on the row alone, so a
// short prompt's rows and the decode steps share one arithmetic and one bound); the bf16 panel GEMM above it.  Why
// 16: the panel GEMM first decodes every weight, the row kernel's time grows with the rows.  A forward of the
// 7B-shaped model on the 2-core AVX-512 EPYC (Zen 4): GEMM 1.37 s at 9 rows, 1.30 at 16, 1.58 at 20, 1.56 at 24;
// row kernel 0.18 s at 2 rows, 0.76 at 9, 1.23 at 16, 1.60 at 20, 1.88 at 24.
constexpr int64_t kBf16GemvMaxRows = 16;

void linear_spec(const Lin &l, const float *x, float *out, int64_t M) {
  if (l.int8) int8_linear_f32(l.q8, x, l.bias, out, M, l.N, l.K);
  else if (l.bf16dot && M <= kBf16GemvMaxRows && linear4_bf16_gemv_f32(l.q4, x, l.bias, out, M, l.N, l.K)) return;
  else if (M > kGemvMaxRows && l.bf16dot) gemm_rows_bf16(l, x, out, M);
  else if (M > kGemvMaxRows) gemm_rows(l, x, out, M);
  else if (l.dense) dense_linear_f32(x, l.W, DType::f32, l.bias, out, M, l.N, l.K);
  else if (l.W16) dense_linear_f32(x, l.W16, l.wdt, l.bias, out, M, l.N, l.K);
  else linear4_f32(l.q4, x, l.bias, out, M, l.N, l.K);
}

// linear_spec, the output rounded to fp16 for an fp16 model (r16): the unfused layer returns fp16.
void linear_out(const Lin &l, const float *x, float *out, int64_t M, bool r16) {
  linear_spec(l, x, out, M);
  if (r16) parallel_for(M * l.N, 65536, [&](int64_t i0, int64_t i1) { simd_math::round16(out + i0, i1 - i0); });
}

// out[i] = x[i] + d[i] (r16: rounded to fp16), the residual add.
void residual_add(const float *x, const float *d, float *out, int64_t n, bool r16) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] + d[i];
  if (r16) simd_math::round16(out, n);
}

// ---- norms, RoPE, attention ---------------------------------------------------------------------------
// ReduceMean of a rank >= 3 tensor sums in double, in order: one chain per row, four rows interleaved (their
// chains are independent), rows split between threads.
// r16 (an fp16 model): x * r is cast to fp16 (`.to(input_dtype)`), then w * that is an fp16 Mul.
void rms_norm(const float *x, const float *w, float eps, float *y, int64_t R, int64_t H, bool r16) {
  parallel_for(R, std::max<int64_t>(4, 65536 / std::max<int64_t>(H, 1)), [&](int64_t r0, int64_t r1) {
    static thread_local std::vector<float> sq;
    sq.resize((size_t)(4 * H));
    for (int64_t r = r0; r < r1; r += 4) {
      const int64_t nr = std::min<int64_t>(4, r1 - r);
      simd_math::squares_powf(x + r * H, sq.data(), nr * H);
      double ss[4] = {0.0, 0.0, 0.0, 0.0};
      if (nr == 4) {
        const float *s0 = sq.data(), *s1 = s0 + H, *s2 = s1 + H, *s3 = s2 + H;
        for (int64_t i = 0; i < H; ++i) {
          ss[0] += (double)s0[i];
          ss[1] += (double)s1[i];
          ss[2] += (double)s2[i];
          ss[3] += (double)s3[i];
        }
      } else {
        for (int64_t k = 0; k < nr; ++k)
          for (int64_t i = 0; i < H; ++i) ss[k] += (double)sq[k * H + i];
      }
      for (int64_t k = 0; k < nr; ++k) {
        const float *xr = x + (r + k) * H;
        float *yr = y + (r + k) * H;
        const float inv = 1.0f / std::sqrt((float)ss[k] / (float)H + eps);
        if (!r16) {
          for (int64_t i = 0; i < H; ++i) yr[i] = w[i] * (xr[i] * inv);
          continue;
        }
        for (int64_t i = 0; i < H; ++i) yr[i] = xr[i] * inv;
        simd_math::round16(yr, H);
        for (int64_t i = 0; i < H; ++i) yr[i] = w[i] * yr[i];
        simd_math::round16(yr, H);
      }
    }
  });
}

// In place on `nh` heads of D values each (row layout [nh, D]); r16: q * cos + rotate_half(q) * sin in fp16 ops
// (each product and the sum rounded; rotate_half's -x is exact).
void rope_row(float *v, int64_t nh, int64_t D, const float *cs, const float *sn, bool r16) {
  const int64_t h2 = D / 2;
  for (int64_t h = 0; h < nh; ++h) {
    float *p = v + h * D;
    if (r16) {
      simd_math::rope_r16(p, cs, sn, h2);
      continue;
    }
    for (int64_t i = 0; i < h2; ++i) {
      const float a = p[i], b = p[i + h2];
      p[i] = a * cs[i] - b * sn[i];
      p[i + h2] = b * cs[i] + a * sn[i];
    }
  }
}

// The softmax of one attention row in the unfused model's rounding: p[0, n) holds the scores of keys [j0, n)
// (masked ones -inf) and zeros before j0, L is the row's length in the unfused model (past + T: the keys after
// n are masked there).  p[j] = exp(p[j] - mx) * (1 / sum), the sum as simd_math::softmax_sum (Softmax's order).
void softmax_row(float *p, int64_t j0, int64_t n, int64_t L, float mx) {
  simd_math::exp_shifted(p + j0, mx, p + j0, n - j0);
  const float inv = 1.0f / simd_math::softmax_sum(p, n, L);
  for (int64_t j = j0; j < n; ++j) p[j] *= inv;
}

// The unfused model's P V (MindSpore's BatchMatMul over L keys) sums in chunks of keys, each one fma chain
// from 0, the chunk sums added in order: 384 keys while more than 768 remain, then the rest in two halves
// (the first ceil(rest / 2)) or, at most 384 left, in one.  The end of the chunk that starts at c0:
int64_t pv_chunk_end(int64_t c0, int64_t L) {
  const int64_t rest = L - c0;
  return rest > 768 ? c0 + 384 : rest > 384 ? c0 + (rest + 1) / 2 : L;
}

// cos / sin of RoPE for every row: [R][cos h2 | sin h2] with c = cos(float(pos) * inv_freq[i]) * rs.  Every
// layer of one forward gets the same positions, so the table of the last call on this thread is reused when
// positions, inv_freq and rs are the same (the values are those a fresh computation gives).
// r16: the table cast to fp16 (an fp16 model's cos / sin).
const float *rope_table(const int64_t *pos, int64_t R, const float *invf, int64_t h2, float rs, bool r16) {
  static thread_local std::vector<int64_t> key_pos;
  static thread_local std::vector<float> key_invf, tab;
  static thread_local float key_rs = 0.0f;
  static thread_local bool key_r16 = false;
  if ((int64_t)key_pos.size() == R && (int64_t)key_invf.size() == h2 && key_rs == rs && key_r16 == r16 &&
      std::memcmp(key_pos.data(), pos, sizeof(int64_t) * (size_t)R) == 0 &&
      std::memcmp(key_invf.data(), invf, sizeof(float) * (size_t)h2) == 0)
    return tab.data();
  key_pos.assign(pos, pos + R);
  key_invf.assign(invf, invf + h2);
  key_rs = rs;
  key_r16 = r16;
  tab.resize((size_t)(R * 2 * h2));
  for (int64_t r = 0; r < R; ++r) {
    const float fp = (float)pos[r];
    float *c = tab.data() + r * 2 * h2, *s = c + h2;
    for (int64_t i = 0; i < h2; ++i) {
      const float f = fp * invf[i];
      c[i] = (float)std::cos((double)f) * rs;  // MindSpore's Cos / Sin: the double function rounded
      s[i] = (float)std::sin((double)f) * rs;
    }
  }
  if (r16) simd_math::round16(tab.data(), R * 2 * h2);
  return tab.data();
}

struct AttnShape {
  int64_t B, T, H, Hq, KVH, D, Smax, past, window;
  float scaling;
  bool r16;  // an fp16 model: scores rounded after the product and the scaling, the fp16 softmax, P V rounded
};

// attn[r, h*D:(h+1)*D] for every row r = b*T + t and head h, from q [R, Hq*D] and the caches.
void attend(const AttnShape &s, const float *q, const float *kc, const float *vc, const uint8_t *mask,
            int64_t mask_stride, float *attn) {
  const int64_t L = s.past + s.T, rep = s.Hq / s.KVH, tasks = s.B * s.Hq * s.T;
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(L * s.D, 1));
  parallel_for(tasks, grain, [&](int64_t t0, int64_t t1) {
    std::vector<float> p((size_t)L), acc((size_t)s.D);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t t = task % s.T, h = (task / s.T) % s.Hq, b = task / (s.T * s.Hq);
      const int64_t g = h / rep, qi = s.past + t;
      const float *qv = q + (b * s.T + t) * s.Hq * s.D + h * s.D;
      const float *kb = kc + (b * s.KVH + g) * s.Smax * s.D, *vb = vc + (b * s.KVH + g) * s.Smax * s.D;
      const uint8_t *mrow = mask ? mask + b * mask_stride : nullptr;
      float *o = attn + (b * s.T + t) * s.Hq * s.D + h * s.D;
      const int64_t j0 = s.window > 0 ? std::max<int64_t>(0, qi - s.window + 1) : 0;
      float mx = -INFINITY;
      if (s.r16) {  // the fp16 product rounded, then an fp16 Mul by the scaling
        for (int64_t j = j0; j <= qi; ++j) p[j] = dot(qv, kb + j * s.D, s.D);
        simd_math::round16_scale(p.data() + j0, s.scaling, qi + 1 - j0);
      }
      for (int64_t j = j0; j <= qi; ++j) {
        if (mrow && !mrow[j]) {
          p[j] = -INFINITY;
          continue;
        }
        if (!s.r16) p[j] = dot(qv, kb + j * s.D, s.D) * s.scaling;
        mx = std::max(mx, p[j]);
      }
      std::fill(o, o + s.D, 0.0f);
      if (mx == -INFINITY) continue;  // no visible key
      std::fill(p.begin(), p.begin() + j0, 0.0f);
      if (s.r16) simd_math::softmax_row_r16(p.data(), j0, qi + 1, mx);
      else softmax_row(p.data(), j0, qi + 1, L, mx);
      std::vector<float> &part = acc;
      for (int64_t c0 = 0; c0 <= qi; c0 = pv_chunk_end(c0, L)) {  // the unfused P V's chunks (one chain each)
        float *dst = c0 == 0 ? o : part.data();
        if (c0) std::fill(part.begin(), part.end(), 0.0f);
        const int64_t c1 = std::min(pv_chunk_end(c0, L), qi + 1);
        for (int64_t j = std::max(c0, j0); j < c1; ++j)
          if (p[j] != 0.0f) axpy(dst, p[j], vb + j * s.D, s.D);
        if (c0)
          for (int64_t d = 0; d < s.D; ++d) o[d] += part[d];
      }
      if (s.r16) simd_math::round16(o, s.D);
    }
  });
}

// Many query rows (prefill): per sequence b and kv head g the visible keys and values are packed once into
// panels (gemm_panel.h), then each task (b, head h, block of kQBlock query rows) computes its scores
// S = Q K^T with the panel GEMM (one fma chain over d per score), applies scaling, the causal / key / window
// mask and the softmax exactly as attend() does (max-subtracted, sum in double, p = e * (1 / sum)), and
// O = P V with the panel GEMM (one fma chain over the keys in order).  A row with no visible key gives 0.
constexpr int64_t kQBlock = 48;
constexpr int64_t kPrefillAttnRows = 6;  // from this many query rows per sequence on (a full 6-row tile)

void attend_prefill(const AttnShape &s, const float *q, const float *kc, const float *vc, const uint8_t *mask,
                    int64_t mask_stride, float *attn) {
  const int64_t L = s.past + s.T, rep = s.Hq / s.KVH, D = s.D;
  const int64_t Lp = (L + kPanel - 1) / kPanel * kPanel, Dp = (D + kPanel - 1) / kPanel * kPanel;
  const int64_t kv_floats = Lp * D + Dp * L;  // key panels (D rows each) + value panels (L rows each)
  static thread_local std::vector<float> packed;
  packed.resize((size_t)(s.B * s.KVH * kv_floats));
  float *const pk = packed.data();  // (a thread_local named inside the lambdas would be each worker's own)
  parallel_for(s.B * s.KVH, 0, [&](int64_t g0, int64_t g1) {
    for (int64_t bg = g0; bg < g1; ++bg) {
      const float *kb = kc + bg * s.Smax * D, *vb = vc + bg * s.Smax * D;
      float *kp = pk + bg * kv_floats, *vp = kp + Lp * D;
      for (int64_t j = 0; j < L; j += kPanel)
        pack_panel_rows(kb + j * D, D, D, (int)std::min<int64_t>(kPanel, L - j), kp + j * D);
      for (int64_t d = 0; d < D; d += kPanel)
        pack_panel_cols(vb + d, D, L, (int)std::min<int64_t>(kPanel, D - d), vp + d / kPanel * (L * kPanel));
    }
  });
  const int64_t nqb = (s.T + kQBlock - 1) / kQBlock, tasks = s.B * s.Hq * nqb, ldq = s.Hq * D;
  parallel_for_dynamic(tasks, 1, [&](int64_t t0, int64_t t1) {
    static thread_local std::vector<float> S, part;
    S.resize((size_t)(kQBlock * Lp));
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t qb = task % nqb, h = (task / nqb) % s.Hq, b = task / (nqb * s.Hq), g = h / rep;
      const int64_t r0 = qb * kQBlock, rows = std::min(kQBlock, s.T - r0);
      const int64_t Lt = s.past + r0 + rows;  // keys visible to the block's last row
      const float *kp = pk + (b * s.KVH + g) * kv_floats, *vp = kp + Lp * D;
      const float *qrows = q + (b * s.T + r0) * ldq + h * D;
      gemm_panel_f32(qrows, ldq, rows, kp, D * kPanel, D, Lt, nullptr, S.data(), Lp);
      const uint8_t *mrow = mask ? mask + b * mask_stride : nullptr;
      for (int64_t i = 0; i < rows; ++i) {
        float *p = S.data() + i * Lp;
        const int64_t qi = s.past + r0 + i, j0 = s.window > 0 ? std::max<int64_t>(0, qi - s.window + 1) : 0;
        std::fill(p, p + j0, 0.0f);  // keys outside [j0, qi] get probability 0
        std::fill(p + qi + 1, p + Lt, 0.0f);
        float mx = -INFINITY;
        if (s.r16) simd_math::round16_scale(p + j0, s.scaling, qi + 1 - j0);  // as in attend()
        for (int64_t j = j0; j <= qi; ++j) {
          p[j] = mrow && !mrow[j] ? -INFINITY : s.r16 ? p[j] : p[j] * s.scaling;
          mx = std::max(mx, p[j]);
        }
        if (mx == -INFINITY) {  // no visible key: the row's output is 0
          std::fill(p + j0, p + qi + 1, 0.0f);
          continue;
        }
        if (s.r16) simd_math::softmax_row_r16(p, j0, qi + 1, mx);
        else softmax_row(p, j0, qi + 1, L, mx);
      }
      // O = P V in the unfused model's chunks of keys (pv_chunk_end): the first into O, the others added
      float *O = attn + (b * s.T + r0) * ldq + h * D;
      for (int64_t c0 = 0; c0 < Lt; c0 = pv_chunk_end(c0, L)) {
        const int64_t c1 = std::min(pv_chunk_end(c0, L), Lt);
        if (c0 == 0) {
          gemm_panel_f32(S.data(), Lp, rows, vp, L * kPanel, c1, D, nullptr, O, ldq);
          continue;
        }
        part.resize((size_t)(rows * D));
        gemm_panel_f32(S.data() + c0, Lp, rows, vp + c0 * kPanel, L * kPanel, c1 - c0, D, nullptr, part.data(), D);
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t d = 0; d < D; ++d) O[i * ldq + d] += part[i * D + d];
      }
      if (s.r16)
        for (int64_t i = 0; i < rows; ++i) simd_math::round16(O + i * ldq, D);
    }
  });
}

// ---- entry points -------------------------------------------------------------------------------------
// params: x f32 [B, T, H], positions i64 [B, T], key_mask u8|bool [B, >= past+T] (columns past+T.. unused) | none,
//   k_cache f32 [B, KVH, Smax, D], v_cache (same), norm_w (f32|f16|bf16) [H], inv_freq f32 [D/2],
//   q_norm_w (f32|f16|bf16) [D] | none, k_norm_w (same) [D] | none (QK-norm: RMSNorm of every head's q / k with
//   eps, before RoPE), q spec (9), k spec (9), v spec (9), o spec (9), past i64, n_heads i64, eps f32,
//   scaling f32, rope_scale f32, window i64 -> out f32 [B, T, H] (may alias x)
template <bool BF16, bool R16>
int attention_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  enum { X, POS, MASK, KC, VC, NORM, INVF, QNORM, KNORM, QS, KS = QS + kSpec, VS = KS + kSpec, OS = VS + kSpec,
         PAST = OS + kSpec, NH, EPS, SCALING, RSCALE, WINDOW, OUT, NPARAM };
  if (nparam != NPARAM) return E_NPARAM;
  if (c.dtype(X) != DType::f32 || c.dtype(POS) != DType::i64 || c.dtype(KC) != DType::f32 ||
      c.dtype(VC) != DType::f32 || !checks::is_float_dtype(c.dtype(NORM)) || c.dtype(INVF) != DType::f32 ||
      c.dtype(OUT) != DType::f32)
    return E_DTYPE;
  if (!c.is_none(MASK) && c.dtype(MASK) != DType::u8 && c.dtype(MASK) != DType::boolean) return E_DTYPE;
  if ((!c.is_none(QNORM) && !checks::is_float_dtype(c.dtype(QNORM))) ||
      (!c.is_none(KNORM) && !checks::is_float_dtype(c.dtype(KNORM))))
    return E_DTYPE;
  AttnShape s;
  s.r16 = R16;
  float eps, rscale;
  if (!c.scalar_i64(PAST, &s.past) || s.past < 0 || !c.scalar_i64(NH, &s.Hq) || s.Hq <= 0 ||
      !c.scalar_f32(EPS, &eps) || !c.scalar_f32(SCALING, &s.scaling) || !c.scalar_f32(RSCALE, &rscale) ||
      !c.scalar_i64(WINDOW, &s.window) || s.window < 0)
    return E_VALUE;
  if (c.rank(X) != 3 || c.rank(KC) != 4 || c.rank(VC) != 4) return E_SHAPE;
  s.B = c.dim(X, 0);
  s.T = c.dim(X, 1);
  s.H = c.dim(X, 2);
  s.KVH = c.dim(KC, 1);
  s.Smax = c.dim(KC, 2);
  s.D = c.dim(KC, 3);
  for (int d = 0; d < 4; ++d)
    if (c.dim(VC, d) != c.dim(KC, d)) return E_SHAPE;
  const int64_t L = s.past + s.T, R = s.B * s.T;
  if (c.dim(KC, 0) != s.B || s.KVH <= 0 || s.Hq % s.KVH || s.D <= 0 || s.D % 2 || s.Smax < L) return E_SHAPE;
  if (c.numel(POS) != R || c.numel(NORM) != s.H || c.numel(INVF) != s.D / 2 || c.numel(OUT) != R * s.H) return E_SHAPE;
  if ((!c.is_none(QNORM) && c.numel(QNORM) != s.D) || (!c.is_none(KNORM) && c.numel(KNORM) != s.D)) return E_SHAPE;
  if (!c.is_none(MASK) && (c.rank(MASK) != 2 || c.dim(MASK, 0) != s.B || c.dim(MASK, 1) < L)) return E_SHAPE;
  const int64_t QD = s.Hq * s.D, KD = s.KVH * s.D;
  Lin lq, lk, lv, lo;
  int st;
  if ((st = parse_lin(c, QS, QD, s.H, &lq, BF16)) || (st = parse_lin(c, KS, KD, s.H, &lk, BF16)) ||
      (st = parse_lin(c, VS, KD, s.H, &lv, BF16)) || (st = parse_lin(c, OS, s.H, QD, &lo, BF16)))
    return st;
  if (R == 0 || s.H == 0) return OK;
  if (!c.params[X] || !c.params[POS] || !c.params[KC] || !c.params[VC] || !c.params[NORM] || !c.params[INVF] ||
      !c.params[OUT])
    return E_NULL;
  const float *x = c.ptr<float>(X);
  const int64_t *pos = c.ptr<int64_t>(POS);
  const uint8_t *mask = c.is_none(MASK) ? nullptr : c.ptr<uint8_t>(MASK);
  float *kc = c.ptr<float>(KC), *vc = c.ptr<float>(VC), *out = c.ptr<float>(OUT);
  const float *invf = c.ptr<float>(INVF);

  static thread_local std::vector<float> nw, qnw, knw, xn, q, k, v, at, o;  // (16-bit norm weights widened)
  const float *norm_w = f32_of(c, NORM, nw);
  const float *qn_w = c.is_none(QNORM) ? nullptr : f32_of(c, QNORM, qnw);
  const float *kn_w = c.is_none(KNORM) ? nullptr : f32_of(c, KNORM, knw);
  xn.resize((size_t)(R * s.H));
  q.resize((size_t)(R * QD));
  k.resize((size_t)(R * KD));
  v.resize((size_t)(R * KD));
  at.resize((size_t)(R * QD));
  o.resize((size_t)(R * s.H));
  rms_norm(x, norm_w, eps, xn.data(), R, s.H, R16);
  linear_out(lq, xn.data(), q.data(), R, R16);
  linear_out(lk, xn.data(), k.data(), R, R16);
  linear_out(lv, xn.data(), v.data(), R, R16);
  if (qn_w) rms_norm(q.data(), qn_w, eps, q.data(), R * s.Hq, s.D, R16);  // QK-norm (Qwen3)
  if (kn_w) rms_norm(k.data(), kn_w, eps, k.data(), R * s.KVH, s.D, R16);
  const float *rope = rope_table(pos, R, invf, s.D / 2, rscale, R16);
  for (int64_t r = 0; r < R; ++r) {
    const float *cr = rope + r * s.D, *sr = cr + s.D / 2;
    rope_row(q.data() + r * QD, s.Hq, s.D, cr, sr, R16);
    rope_row(k.data() + r * KD, s.KVH, s.D, cr, sr, R16);
    const int64_t b = r / s.T, t = r % s.T;
    for (int64_t g = 0; g < s.KVH; ++g) {
      const size_t dst = (size_t)(((b * s.KVH + g) * s.Smax + s.past + t) * s.D);
      std::memcpy(kc + dst, k.data() + r * KD + g * s.D, (size_t)s.D * sizeof(float));
      std::memcpy(vc + dst, v.data() + r * KD + g * s.D, (size_t)s.D * sizeof(float));
    }
  }
  const int64_t mstride = c.is_none(MASK) ? 0 : c.dim(MASK, 1);
  if (s.T >= kPrefillAttnRows) attend_prefill(s, q.data(), kc, vc, mask, mstride, at.data());
  else attend(s, q.data(), kc, vc, mask, mstride, at.data());
  linear_out(lo, at.data(), o.data(), R, R16);
  residual_add(x, o.data(), out, R * s.H, R16);
  return OK;
}

// params: x f32 [..., H], norm_w (f32|f16|bf16) [H], gate spec (9), up spec (9), down spec (9), intermediate i64,
//   eps f32 -> out f32 [..., H] (may alias x)
template <bool BF16, bool R16>
int mlp_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  enum { X, NORM, GS, US = GS + kSpec, DS = US + kSpec, INTER = DS + kSpec, EPS, OUT, NPARAM };
  if (nparam != NPARAM) return E_NPARAM;
  if (c.dtype(X) != DType::f32 || !checks::is_float_dtype(c.dtype(NORM)) || c.dtype(OUT) != DType::f32) return E_DTYPE;
  int64_t I;
  float eps;
  if (!c.scalar_i64(INTER, &I) || I <= 0 || !c.scalar_f32(EPS, &eps)) return E_VALUE;
  if (c.rank(X) < 1) return E_SHAPE;
  const int64_t H = c.cols(X), R = c.rows(X);
  if (c.numel(NORM) != H || c.numel(OUT) != R * H) return E_SHAPE;
  Lin lg, lu, ld;
  int st;
  if ((st = parse_lin(c, GS, I, H, &lg, BF16)) || (st = parse_lin(c, US, I, H, &lu, BF16)) || (st = parse_lin(c, DS, H, I, &ld, BF16)))
    return st;
  if (R == 0 || H == 0) return OK;
  if (!c.params[X] || !c.params[NORM] || !c.params[OUT]) return E_NULL;
  const float *x = c.ptr<float>(X);
  float *out = c.ptr<float>(OUT);
  static thread_local std::vector<float> nw, xn, g, u, d;
  xn.resize((size_t)(R * H));
  g.resize((size_t)(R * I));
  u.resize((size_t)(R * I));
  d.resize((size_t)(R * H));
  rms_norm(x, f32_of(c, NORM, nw), eps, xn.data(), R, H, R16);
  linear_out(lg, xn.data(), g.data(), R, R16);
  linear_out(lu, xn.data(), u.data(), R, R16);
  float *gp = g.data();
  const float *up = u.data();
  parallel_for(R, std::max<int64_t>(1, 16384 / I), [&](int64_t r0, int64_t r1) {
    if (R16) simd_math::silu_mul_r16(gp + r0 * I, up + r0 * I, (r1 - r0) * I);
    else simd_math::silu_mul(gp + r0 * I, up + r0 * I, (r1 - r0) * I);
  });
  linear_out(ld, g.data(), d.data(), R, R16);
  residual_add(x, d.data(), out, R * H, R16);
  return OK;
}

// params: x f32 [..., K], spec (9), n_out i64 -> out f32 [..., N]
template <bool BF16, bool R16>
int linear_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  enum { X, S, NOUT = S + kSpec, OUT, NPARAM };
  if (nparam != NPARAM) return E_NPARAM;
  if (c.dtype(X) != DType::f32 || c.dtype(OUT) != DType::f32) return E_DTYPE;
  int64_t N;
  if (!c.scalar_i64(NOUT, &N) || N < 0) return E_VALUE;
  if (c.rank(X) < 1) return E_SHAPE;
  const int64_t K = c.cols(X), M = c.rows(X);
  if (c.numel(OUT) != M * N) return E_SHAPE;
  Lin l;
  if (int st = parse_lin(c, S, N, K, &l, BF16)) return st;
  if (M * N == 0) return OK;
  if (!c.params[X] || !c.params[OUT]) return E_NULL;
  linear_out(l, c.ptr<float>(X), c.ptr<float>(OUT), M, R16);
  return OK;
}

// params: x f32 [..., H], w (f32|f16|bf16) [H], eps f32 -> out f32 [..., H] (may alias x)
template <bool R16>
int rms_norm_entry(BNB_MS_AOT_ARGS) {
  Call<> c(nparam, params, ndims, shapes, dtypes, stream);
  if (nparam != 4) return E_NPARAM;
  if (c.dtype(0) != DType::f32 || !checks::is_float_dtype(c.dtype(1)) || c.dtype(3) != DType::f32) return E_DTYPE;
  float eps;
  if (!c.scalar_f32(2, &eps)) return E_VALUE;
  if (c.rank(0) < 1) return E_SHAPE;
  const int64_t H = c.cols(0), R = c.rows(0);
  if (c.numel(1) != H || c.numel(3) != R * H) return E_SHAPE;
  if (R * H == 0) return OK;
  if (!c.params[0] || !c.params[1] || !c.params[3]) return E_NULL;
  static thread_local std::vector<float> ww;
  rms_norm(c.ptr<float>(0), f32_of(c, 1, ww), eps, c.ptr<float>(3), R, H, R16);
  return OK;
}

}  // namespace
}  // namespace bnb_ms

BNB_MS_ENTRY(cdecoder_attention_fp32, bnb_ms::attention_entry<false, false>)
BNB_MS_ENTRY(cdecoder_mlp_fp32, bnb_ms::mlp_entry<false, false>)
BNB_MS_ENTRY(cdecoder_linear_fp32, bnb_ms::linear_entry<false, false>)
BNB_MS_ENTRY(crms_norm_fp32, bnb_ms::rms_norm_entry<false>)
// The same three with a 4-bit weight's prefill (more than 8 rows) computed in bf16 (gemm_rows_bf16).
BNB_MS_ENTRY(cdecoder_attention_fp32_bf16dot, bnb_ms::attention_entry<true, false>)
BNB_MS_ENTRY(cdecoder_mlp_fp32_bf16dot, bnb_ms::mlp_entry<true, false>)
BNB_MS_ENTRY(cdecoder_linear_fp32_bf16dot, bnb_ms::linear_entry<true, false>)
// All of them in an fp16 model's rounding (the header's *_r16).
BNB_MS_ENTRY(cdecoder_attention_fp32_r16, bnb_ms::attention_entry<false, true>)
BNB_MS_ENTRY(cdecoder_mlp_fp32_r16, bnb_ms::mlp_entry<false, true>)
BNB_MS_ENTRY(cdecoder_linear_fp32_r16, bnb_ms::linear_entry<false, true>)
BNB_MS_ENTRY(crms_norm_fp32_r16, bnb_ms::rms_norm_entry<true>)
BNB_MS_ENTRY(cdecoder_attention_fp32_bf16dot_r16, bnb_ms::attention_entry<true, true>)
BNB_MS_ENTRY(cdecoder_mlp_fp32_bf16dot_r16, bnb_ms::mlp_entry<true, true>)
BNB_MS_ENTRY(cdecoder_linear_fp32_bf16dot_r16, bnb_ms::linear_entry<true, true>)
