// weightonly.cu -- CUDA twin of csrc/cpu/weightonly.cpp: weight-only per-output-channel int8 / int4
// (W8A16 / W4A16).  Same entry points, params, checks, status codes and bytes as the CPU library:
//   scale[n] = max_k |W[n, k]| / qmax   (qmax 127 | 7; the quiet NaN 0x7fc00000 for a row holding NaN)
//   q[n, k]  = clamp(rint(W[n, k] / scale[n]), -qmax, qmax)  (0 where scale == 0 or NaN, and for inf / inf)
//   int4: two's-complement nibbles, byte j of row n holds k = 2j (high nibble) and 2j+1 (low),
//         row stride (K+1)/2.
//   dequantize: out = from_f32(q * scale[n]).
//   gemm: out[m, n] = from_f32(reduce16(acc) * scale[n]), where acc[l] (l = k mod 16) is the
//         sequential fused multiply-add over k = l, l+16, ... of fp32(A[m, k]) * q[n, k] and
//         reduce16 is the CPU's fixed tree ((a0+a8)+(a4+a12)) + ... -- the CPU library's exact
//         arithmetic, so the GPU result is bit-identical to it (not merely within a tolerance).
//
// GEMM kernel layout (the batch-1..16 case it is built for): a row n of the weight is served by
// 16/L threads, each owning L consecutive lanes of every 16-k chunk (L = 4 for int8, 8 for int4:
// one 32-bit load per chunk per thread, 4 / 2 threads per row).  A thread keeps L x MT fp32
// accumulators (MT = batch rows of the tile, up to 16), decodes its int8/int4 word in registers
// (never materialised in floating point memory) and uses each decoded weight for all MT rows of A,
// so the weight is streamed from memory once per call for M <= 16 (once per 16-row tile above).
// A batch of UNR chunk-words is loaded before it is used (memory-level parallelism).  The 16 lanes
// of a row are combined with warp shuffles in the CPU's reduction order.  Rows that are not
// 4-byte aligned (int8 K % 4, int4 (K+1)/2 % 4) or activations that are not 16-byte aligned take a
// generic kernel (16 threads per row, byte loads) with the same arithmetic.
#include "checks/weightonly.h"
#include "cuda/aot_cuda.cuh"
#include "cuda/x86_float.cuh"

namespace bnb_ms {
namespace cuda {
namespace {

// std::max / std::min semantics (the first argument wins unless the comparison says otherwise).
__device__ __forceinline__ float std_max(float a, float b) { return (a < b) ? b : a; }
__device__ __forceinline__ float std_min(float a, float b) { return (b < a) ? b : a; }

template <int BITS>
__device__ __forceinline__ float wq(const uint8_t *row, int64_t k) {
  if (BITS == 8) return (float)(int8_t)row[k];
  const int b = (int)(int8_t)row[k >> 1];
  return (float)((k & 1) ? ((int)((unsigned)b << 28) >> 28) : (b >> 4));
}

// Value of element e (0..7) of a little-endian 32-bit word of int4 nibbles (e even: high nibble).
__device__ __forceinline__ float nib(uint32_t w, int e) {
  const uint32_t v = (w >> (8 * (e >> 1) + ((e & 1) ? 0 : 4))) & 0xFu;
  return (float)((int)(v ^ 8u) - 8);
}
// Element e (0..3) of a little-endian 32-bit word of int8.
__device__ __forceinline__ float byte_s8(uint32_t w, int e) { return (float)(int8_t)(w >> (8 * e)); }

inline int grid_for(int64_t work, int per_block, int per_sm) {
  const int64_t want = (work + per_block - 1) / per_block;
  const int64_t cap = (int64_t)sm_count() * per_sm;
  return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

// ---- quantize: one warp per weight row ----------------------------------------------------------
constexpr int kQThreads = 256;

template <class T, int BITS>
__global__ void __launch_bounds__(kQThreads) wo_quantize(const T *__restrict__ W, uint8_t *__restrict__ q,
                                                          float *__restrict__ sc, int64_t N, int64_t K, int64_t rb) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (kQThreads / 32);
  const float qmax = BITS == 8 ? 127.0f : 7.0f;
  for (int64_t n = (int64_t)blockIdx.x * (kQThreads / 32) + (threadIdx.x >> 5); n < N; n += warps) {
    const T *r = W + n * K;
    float am = 0.0f;
    bool nan = false;
    for (int64_t k = lane; k < K; k += 32) {
      const float x = to_float(r[k]);
      nan |= isnan(x);
      am = std_max(am, fabsf(x));
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) am = std_max(am, __shfl_xor_sync(0xffffffffu, am, o));
    nan = __any_sync(0xffffffffu, nan);
    const float s = nan ? __int_as_float(0x7fc00000) : __fdiv_rn(am, qmax);
    if (lane == 0) sc[n] = s;
    uint8_t *dst = q + n * rb;
    auto code = [&](float x) -> int {
      float v = s > 0.0f ? rintf(__fdiv_rn(x, s)) : 0.0f;
      if (isnan(v)) v = 0.0f;  // inf / inf in a row holding inf
      v = std_min(qmax, std_max(-qmax, v));
      return (int)v;
    };
    if (BITS == 8) {
      for (int64_t k = lane; k < K; k += 32) dst[k] = (uint8_t)(int8_t)code(to_float(r[k]));
    } else {
      for (int64_t j = lane; j < rb; j += 32) {
        const int64_t k0 = 2 * j, k1 = 2 * j + 1;
        const int hi = code(to_float(r[k0]));
        const int lo = k1 < K ? code(to_float(r[k1])) : 0;
        dst[j] = (uint8_t)(((hi & 0xF) << 4) | (lo & 0xF));
      }
    }
  }
}

// ---- dequantize ---------------------------------------------------------------------------------
constexpr int kDThreads = 256;

// q * scale: mul_x86 (cuda/x86_float.cuh), the x86 NaN for 0 * inf and NaN inputs.

template <class T>
__device__ __forceinline__ void store8(T *dst, const float *v) {  // dst 16-byte aligned
  if (sizeof(T) == 4) {
    float4 *d = reinterpret_cast<float4 *>(dst);
    d[0] = make_float4(v[0], v[1], v[2], v[3]);
    d[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    union { uint4 u; T h[8]; } pk;
#pragma unroll
    for (int i = 0; i < 8; ++i) pk.h[i] = from_float<T>(v[i]);
    *reinterpret_cast<uint4 *>(dst) = pk.u;
  }
}

// 8 outputs per thread: K % 8 == 0, q 8-byte (int8) / 4-byte (int4) aligned, out 16-byte aligned.
template <class T, int BITS>
__global__ void __launch_bounds__(kDThreads) wo_dequant_fast(const uint8_t *__restrict__ q, const float *__restrict__ sc,
                                                             T *__restrict__ out, int64_t N, int64_t K) {
  const int64_t gpr = K / 8, total = N * gpr;
  for (int64_t g = (int64_t)blockIdx.x * kDThreads + threadIdx.x; g < total; g += (int64_t)gridDim.x * kDThreads) {
    const int64_t n = g / gpr;
    const float s = sc[n];
    float v[8];
    if (BITS == 8) {
      const uint2 w = __ldcs(reinterpret_cast<const uint2 *>(q) + g);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[e] = mul_x86(byte_s8(w.x, e), s);
        v[4 + e] = mul_x86(byte_s8(w.y, e), s);
      }
    } else {
      const uint32_t w = __ldcs(reinterpret_cast<const unsigned int *>(q) + g);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = mul_x86(nib(w, e), s);
    }
    store8<T>(out + g * 8, v);
  }
}

template <class T, int BITS>
__global__ void __launch_bounds__(kDThreads) wo_dequant_generic(const uint8_t *__restrict__ q, const float *__restrict__ sc,
                                                                T *__restrict__ out, int64_t N, int64_t K, int64_t rb) {
  const int64_t total = N * K;
  for (int64_t i = (int64_t)blockIdx.x * kDThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kDThreads) {
    const int64_t n = i / K, k = i - n * K;
    out[i] = from_float<T>(mul_x86(wq<BITS>(q + n * rb, k), sc[n]));
  }
}

// ---- GEMM ---------------------------------------------------------------------------------------
constexpr int kGThreads = 128;

// L consecutive activations (16-byte aligned group start) widened to fp32.
template <class T, int L>
__device__ __forceinline__ void load_a(const T *p, float *f) {
  if (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < L; i += 4) {
      const float4 v = __ldg(reinterpret_cast<const float4 *>(p + i));
      f[i] = v.x; f[i + 1] = v.y; f[i + 2] = v.z; f[i + 3] = v.w;
    }
  } else if (L == 8) {
    union { uint4 u; T h[8]; } pk;
    pk.u = __ldg(reinterpret_cast<const uint4 *>(p));
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = to_float(pk.h[i]);
  } else {
    union { uint2 u; T h[4]; } pk;
    pk.u = __ldg(reinterpret_cast<const uint2 *>(p));
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = to_float(pk.h[i]);
  }
}

template <int BITS, int L>
__device__ __forceinline__ void decode_word(uint32_t w, float *f) {
#pragma unroll
  for (int e = 0; e < L; ++e) f[e] = BITS == 8 ? byte_s8(w, e) : nib(w, e);
}

template <int MT>
struct Unroll { static constexpr int value = MT == 1 ? 32 : MT == 2 ? 16 : MT <= 4 ? 8 : 4; };

// Fast path: rows 4-byte aligned (rb % 4 == 0, q aligned), A 16-byte aligned with K * sizeof(T) % 16 == 0.
template <class T, int BITS, int MT>
__global__ void __launch_bounds__(kGThreads) wo_gemm_fast(const T *__restrict__ A, const uint8_t *__restrict__ q,
                                                          const float *__restrict__ sc, T *__restrict__ out, int64_t M,
                                                          int64_t N, int64_t K, int64_t rb) {
  constexpr int L = BITS == 8 ? 4 : 8;      // lanes (k mod 16) per thread
  constexpr int TPR = 16 / L;               // threads per weight row
  constexpr int RPB = kGThreads / TPR;      // rows per block
  constexpr int UNR = Unroll<MT>::value;
  const int g = threadIdx.x % TPR;
  const int64_t n_raw = (int64_t)blockIdx.x * RPB + threadIdx.x / TPR;
  const int64_t n = n_raw < N ? n_raw : N - 1;  // clamped: every thread takes part in the shuffles
  const uint32_t *rw = reinterpret_cast<const uint32_t *>(q + n * rb);
  const int64_t nc = K / 16;
  const float s = sc[n];
  for (int64_t m0 = (int64_t)blockIdx.y * MT; m0 < M; m0 += (int64_t)gridDim.y * MT) {
    const T *ap[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) ap[m] = A + (m0 + m < M ? m0 + m : M - 1) * K + L * g;
    float acc[MT][L];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int i = 0; i < L; ++i) acc[m][i] = 0.0f;
    int64_t j = 0;
    for (; j + UNR <= nc; j += UNR) {
      uint32_t w[UNR];
#pragma unroll
      for (int u = 0; u < UNR; ++u) w[u] = __ldcs(reinterpret_cast<const unsigned int *>(rw) + (j + u) * TPR + g);
#pragma unroll
      for (int u = 0; u < UNR; ++u) {
        float wf[L];
        decode_word<BITS, L>(w[u], wf);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          float a[L];
          load_a<T, L>(ap[m] + (j + u) * 16, a);
#pragma unroll
          for (int i = 0; i < L; ++i) acc[m][i] = __fmaf_rn(a[i], wf[i], acc[m][i]);
        }
      }
    }
    for (; j < nc; ++j) {
      float wf[L];
      decode_word<BITS, L>(__ldcs(reinterpret_cast<const unsigned int *>(rw) + j * TPR + g), wf);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        float a[L];
        load_a<T, L>(ap[m] + j * 16, a);
#pragma unroll
        for (int i = 0; i < L; ++i) acc[m][i] = __fmaf_rn(a[i], wf[i], acc[m][i]);
      }
    }
    // tail k in [16 nc, K): lane l = k & 15 belongs to thread l / L, slot l % L
    const uint8_t *row = q + n * rb;
    for (int64_t k = nc * 16; k < K; ++k) {
      const int l = (int)(k & 15);
      if (l / L != g) continue;
      const float wv = wq<BITS>(row, k);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float a = to_float(ap[m][k - L * g]);
#pragma unroll
        for (int i = 0; i < L; ++i)
          if (i == l % L) acc[m][i] = __fmaf_rn(a, wv, acc[m][i]);
      }
    }
    // the CPU's reduce16: t[l] = a[l] + a[l+8]; u[l] = t[l] + t[l+4]; (u0 + u2) + (u1 + u3)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float r;
      if (L == 4) {  // thread g holds lanes 4g..4g+3
        float t[4], u[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) t[i] = __fadd_rn(acc[m][i], __shfl_xor_sync(0xffffffffu, acc[m][i], 2));
#pragma unroll
        for (int i = 0; i < 4; ++i) u[i] = __fadd_rn(t[i], __shfl_xor_sync(0xffffffffu, t[i], 1));
        r = __fadd_rn(__fadd_rn(u[0], u[2]), __fadd_rn(u[1], u[3]));
      } else {  // thread g holds lanes 8g..8g+7
        float t[8], u[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) t[i] = __fadd_rn(acc[m][i], __shfl_xor_sync(0xffffffffu, acc[m][i], 1));
#pragma unroll
        for (int i = 0; i < 4; ++i) u[i] = __fadd_rn(t[i], t[i + 4]);
        r = __fadd_rn(__fadd_rn(u[0], u[2]), __fadd_rn(u[1], u[3]));
      }
      if (g == 0 && n_raw < N && m0 + m < M) out[(m0 + m) * N + n] = from_float<T>(__fmul_rn(r, s));
    }
  }
}

// Generic path: 16 threads per row (thread = lane l), byte loads, every row of A in turn.
template <class T, int BITS>
__global__ void __launch_bounds__(kGThreads) wo_gemm_generic(const T *__restrict__ A, const uint8_t *__restrict__ q,
                                                             const float *__restrict__ sc, T *__restrict__ out,
                                                             int64_t M, int64_t N, int64_t K, int64_t rb) {
  const int l = threadIdx.x & 15;
  const int64_t n_raw = (int64_t)blockIdx.x * (kGThreads / 16) + threadIdx.x / 16;
  const int64_t n = n_raw < N ? n_raw : N - 1;
  const uint8_t *row = q + n * rb;
  const float s = sc[n];
  for (int64_t m = blockIdx.y; m < M; m += gridDim.y) {
    const T *a = A + m * K;
    float acc = 0.0f;
    for (int64_t k = l; k < K; k += 16) acc = __fmaf_rn(to_float(a[k]), wq<BITS>(row, k), acc);
    float t = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 8));
    float u = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 4));
    float v = __fadd_rn(u, __shfl_xor_sync(0xffffffffu, u, 2));  // lane 0: u0 + u2, lane 1: u1 + u3
    float r = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
    if (l == 0 && n_raw < N) out[m * N + n] = from_float<T>(__fmul_rn(r, s));
  }
}

template <class T, int BITS, int MT>
void launch_fast(const T *A, const uint8_t *q, const float *sc, T *o, int64_t M, int64_t N, int64_t K, int64_t rb,
                 cudaStream_t st) {
  constexpr int RPB = kGThreads / (BITS == 8 ? 4 : 2);
  const int64_t tiles = (M + MT - 1) / MT;
  dim3 grid((unsigned)((N + RPB - 1) / RPB), (unsigned)(tiles < 65535 ? tiles : 65535));
  wo_gemm_fast<T, BITS, MT><<<grid, kGThreads, 0, st>>>(A, q, sc, o, M, N, K, rb);
}

// ---- entry points: checks in checks/weightonly.h (shared with the CPU library) ------------------
template <class H, int BITS>
int quantize_wo_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::QuantizeWeightOnly<T> a;
  if (int s = checks::quantize_weight_only<T, BITS>(c, &a)) return s;
  if (a.empty) {
    if (a.N && a.scale) {
      if (cudaMemsetAsync(a.scale, 0, sizeof(float) * (size_t)a.N, c.cu_stream()) != cudaSuccess) {
        (void)cudaGetLastError();
        return E_DEVICE;
      }
    }
    return OK;
  }
  const int grid = grid_for(a.N, kQThreads / 32, 16);
  wo_quantize<T, BITS><<<grid, kQThreads, 0, c.cu_stream()>>>(a.W, a.q, a.scale, a.N, a.K, a.rb);
  return launch_status();
}

template <class H, int BITS>
int dequantize_wo_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::DequantizeWeightOnly<T> a;
  if (int s = checks::dequantize_weight_only<T, BITS>(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t N = a.N, K = a.K;
  if (K % 8 == 0 && reinterpret_cast<uintptr_t>(a.q) % (BITS == 8 ? 8 : 4) == 0 && aligned16(a.out)) {
    const int grid = grid_for(N * K / 8, kDThreads * 2, 16);
    wo_dequant_fast<T, BITS><<<grid, kDThreads, 0, c.cu_stream()>>>(a.q, a.scale, a.out, N, K);
  } else {
    const int grid = grid_for(N * K, kDThreads * 4, 16);
    wo_dequant_generic<T, BITS><<<grid, kDThreads, 0, c.cu_stream()>>>(a.q, a.scale, a.out, N, K, a.rb);
  }
  return launch_status();
}

template <class H, int BITS>
int gemm_wo_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::GemmWeightOnly<T> a;
  if (int s = checks::gemm_weight_only<T, BITS>(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t M = a.M, N = a.N, K = a.K, rb = a.rb;
  const T *A = a.A;
  const uint8_t *q = a.q;
  const float *sc = a.scale;
  T *o = a.out;
  const cudaStream_t st = c.cu_stream();
  const bool fast = rb % 4 == 0 && reinterpret_cast<uintptr_t>(q) % 4 == 0 && aligned16(A) &&
                    (K * (int64_t)sizeof(T)) % 16 == 0 && N < (int64_t)0x7fffffff;
  if (!fast) {
    dim3 grid((unsigned)((N + kGThreads / 16 - 1) / (kGThreads / 16)), (unsigned)(M < 65535 ? M : 65535));
    wo_gemm_generic<T, BITS><<<grid, kGThreads, 0, st>>>(A, q, sc, o, M, N, K, rb);
  } else if (M <= 1) {
    launch_fast<T, BITS, 1>(A, q, sc, o, M, N, K, rb, st);
  } else if (M <= 2) {
    launch_fast<T, BITS, 2>(A, q, sc, o, M, N, K, rb, st);
  } else if (M <= 4) {
    launch_fast<T, BITS, 4>(A, q, sc, o, M, N, K, rb, st);
  } else if (M <= 8) {
    launch_fast<T, BITS, 8>(A, q, sc, o, M, N, K, rb, st);
  } else {
    launch_fast<T, BITS, 16>(A, q, sc, o, M, N, K, rb, st);
  }
  return launch_status();
}

}  // namespace
}  // namespace cuda
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cquantize_weight_only_int8_fp32, bnb_ms::cuda::quantize_wo_entry<float, 8>)
BNB_MS_ENTRY(cquantize_weight_only_int4_fp32, bnb_ms::cuda::quantize_wo_entry<float, 4>)
BNB_MS_ENTRY(cdequantize_weight_only_int8_fp32, bnb_ms::cuda::dequantize_wo_entry<float, 8>)
BNB_MS_ENTRY(cdequantize_weight_only_int4_fp32, bnb_ms::cuda::dequantize_wo_entry<float, 4>)
BNB_MS_ENTRY(cgemm_weight_only_int8_fp32, bnb_ms::cuda::gemm_wo_entry<float, 8>)
BNB_MS_ENTRY(cgemm_weight_only_int4_fp32, bnb_ms::cuda::gemm_wo_entry<float, 4>)
BNB_MS_ENTRY(cquantize_weight_only_int8_fp16, bnb_ms::cuda::quantize_wo_entry<fp16_t, 8>)
BNB_MS_ENTRY(cquantize_weight_only_int4_fp16, bnb_ms::cuda::quantize_wo_entry<fp16_t, 4>)
BNB_MS_ENTRY(cdequantize_weight_only_int8_fp16, bnb_ms::cuda::dequantize_wo_entry<fp16_t, 8>)
BNB_MS_ENTRY(cdequantize_weight_only_int4_fp16, bnb_ms::cuda::dequantize_wo_entry<fp16_t, 4>)
BNB_MS_ENTRY(cgemm_weight_only_int8_fp16, bnb_ms::cuda::gemm_wo_entry<fp16_t, 8>)
BNB_MS_ENTRY(cgemm_weight_only_int4_fp16, bnb_ms::cuda::gemm_wo_entry<fp16_t, 4>)
BNB_MS_ENTRY(cquantize_weight_only_int8_bf16, bnb_ms::cuda::quantize_wo_entry<bf16_t, 8>)
BNB_MS_ENTRY(cquantize_weight_only_int4_bf16, bnb_ms::cuda::quantize_wo_entry<bf16_t, 4>)
BNB_MS_ENTRY(cdequantize_weight_only_int8_bf16, bnb_ms::cuda::dequantize_wo_entry<bf16_t, 8>)
BNB_MS_ENTRY(cdequantize_weight_only_int4_bf16, bnb_ms::cuda::dequantize_wo_entry<bf16_t, 4>)
BNB_MS_ENTRY(cgemm_weight_only_int8_bf16, bnb_ms::cuda::gemm_wo_entry<bf16_t, 8>)
BNB_MS_ENTRY(cgemm_weight_only_int4_bf16, bnb_ms::cuda::gemm_wo_entry<bf16_t, 4>)
