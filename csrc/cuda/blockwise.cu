// blockwise.cu -- blockwise 8-bit quantization with a 256-entry code on CUDA: the same entry points,
// checks and bytes as csrc/cpu/blockwise.cpp (read its header comment for the algorithm).
//
// Quantize, one pass over A:
//   * each thread block first builds the 65536-entry grid->code table in shared memory (64 KiB)
//     from the code it is given, so there is no cache, no scratch allocation and no extra launch:
//       mid[c] = 0.5 * (code[c] + code[c+1])   (NaN counts as +inf: the CPU scan stops there)
//       pm     = running max of mid             (non-decreasing)
//       T[c]   = first grid bin i with v(i) > pm[c], v(i) = -1 + 2i/65535 (monotone in i)
//       lut[i] = #{c : T[c] <= i}               (= the CPU's "first c with mid[c] >= v(i)")
//     which reproduces the CPU's sequential scan bit for bit for any code, sorted or not;
//   * a team of lanes (4..32 lanes of a warp, or the whole 512-thread block for blocksizes of
//     2048+ elements) owns one quantization block: 16-byte vector loads kept in registers, absmax by
//     warp shuffles (+ shared memory across warps), then indices from the table, written as 4/8
//     byte vectors.  The grid is persistent (blocks = SMs x occupancy), so the table is built a few
//     hundred times per call, not once per quantization block.
//   * other blocksizes (not a power of two, or misaligned pointers) take a scalar path with one warp
//     per quantization block (correct for any blocksize > 0, not tuned).
// Dequantize: out = code[q] * absmax[block]; 4 codes per thread and step (coalesced 4-byte loads and
// 16/8-byte stores), 4 steps in flight, code table in shared memory.
//
// Arithmetic uses explicit round-to-nearest intrinsics so no multiply-add is contracted where the
// CPU rounds twice, and this file must not be compiled with --use_fast_math (denormals, 1/x).
#include <atomic>
#include <mutex>
#include <type_traits>
#include <cstdint>

#include "checks/blockwise.h"
#include "cuda/aot_cuda.cuh"

namespace bnb_ms {
namespace cuda {
namespace {

constexpr int kCode = 256;
constexpr int kLut = 65536;
constexpr int kThreads = 512;  // quantize block size (the table is built with all of them)
constexpr int kWarps = kThreads / 32;

// ---- the table ----------------------------------------------------------------------------------
__device__ __forceinline__ float grid_value(int i) {  // -1 + (2i)/65535, as the CPU computes it
  return __fadd_rn(-1.0f, __fdiv_rn(2.0f * (float)i, (float)(kLut - 1)));
}

__device__ __forceinline__ uint32_t grid_index(float v) {
  v = fminf(1.0f, fmaxf(-1.0f, v));  // NaN -> -1, as std::min(1, std::max(-1, v))
  const float t = __fmul_rn(__fadd_rn(v, 1.0f), 0.5f);
  return __float2uint_rz(__fmaf_rn(t, (float)(kLut - 1), 0.5f));
}

// Builds lut[65536] in shared memory.  Needs blockDim.x >= 256 and a __syncthreads() after.
__device__ void build_lut(const float *__restrict__ code, uint8_t *lut) {
  __shared__ float pm[kCode];
  __shared__ int thr[kCode];
  const int t = threadIdx.x;
  if (t < kCode - 1) {
    float m = __fmul_rn(0.5f, __fadd_rn(code[t], code[t + 1]));
    pm[t] = (m != m) ? __int_as_float(0x7f800000) : m;
  } else if (t == kCode - 1) {
    pm[t] = __int_as_float(0x7f800000);  // sentinel
  }
  __syncthreads();
  for (int off = 1; off < kCode; off <<= 1) {  // inclusive running max (Hillis-Steele)
    float v = 0.0f;
    if (t < kCode) v = (t >= off) ? fmaxf(pm[t], pm[t - off]) : pm[t];
    __syncthreads();
    if (t < kCode) pm[t] = v;
    __syncthreads();
  }
  if (t < kCode - 1) {  // T[c] = first i with v(i) > pm[c]
    const float p = pm[t];
    int lo = 0, hi = kLut;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (grid_value(mid) > p) hi = mid; else lo = mid + 1;
    }
    thr[t] = lo;
  } else if (t == kCode - 1) {
    thr[t] = kLut + 1;  // never counted
  }
  __syncthreads();
  uint32_t *lut32 = reinterpret_cast<uint32_t *>(lut);
  for (int w = t; w < kLut / 4; w += blockDim.x) {
    const int i0 = 4 * w;
    int lo = 0, hi = kCode - 1;  // count of T[c] <= i0, c in [0, 255)
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (thr[mid] <= i0) lo = mid + 1; else hi = mid;
    }
    int c = lo;
    uint32_t word = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      while (c < kCode - 1 && thr[c] <= i0 + k) ++c;
      word |= (uint32_t)c << (8 * k);
    }
    lut32[w] = word;
  }
}

// ---- vector I/O ---------------------------------------------------------------------------------
template <class T> struct Vec;  // 16 bytes of T
template <> struct Vec<float> {
  static constexpr int N = 4;
  using Out = uint32_t;  // 4 codes
};
template <> struct Vec<__half> {
  static constexpr int N = 8;
  using Out = uint2;  // 8 codes
};
template <> struct Vec<__nv_bfloat16> {
  static constexpr int N = 8;
  using Out = uint2;
};

// Elements stay in registers as raw 16-byte vectors (half the registers of floats for fp16/bf16)
// and are widened when used.
template <class T>
__device__ __forceinline__ float elem(const uint4 &raw, int e) {
  if constexpr (Vec<T>::N == 4) {
    return __uint_as_float(e == 0 ? raw.x : e == 1 ? raw.y : e == 2 ? raw.z : raw.w);
  } else {
    const uint32_t word = (e >> 1) == 0 ? raw.x : (e >> 1) == 1 ? raw.y : (e >> 1) == 2 ? raw.z : raw.w;
    const unsigned short bits = (unsigned short)((e & 1) ? (word >> 16) : (word & 0xffffu));
    if constexpr (sizeof(T) == 2 && Vec<T>::N == 8 && std::is_same<T, __half>::value)
      return __half2float(__ushort_as_half(bits));
    else
      return __uint_as_float((uint32_t)bits << 16);
  }
}

template <class T>
__device__ __forceinline__ void store_codes(uint8_t *p, const uint8_t (&c)[Vec<T>::N]) {
  if constexpr (Vec<T>::N == 4) {
    *reinterpret_cast<uint32_t *>(p) = (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) |
                                       ((uint32_t)c[3] << 24);
  } else {
    uint2 w;
    w.x = (uint32_t)c[0] | ((uint32_t)c[1] << 8) | ((uint32_t)c[2] << 16) | ((uint32_t)c[3] << 24);
    w.y = (uint32_t)c[4] | ((uint32_t)c[5] << 8) | ((uint32_t)c[6] << 16) | ((uint32_t)c[7] << 24);
    *reinterpret_cast<uint2 *>(p) = w;
  }
}

__device__ __forceinline__ uint8_t quant_one(const uint8_t *lut, float x, QuantScale k) {
  return lut[grid_index(quant_block_scaled(x, k))];
}

// ---- quantize: fast path ------------------------------------------------------------------------
// TEAM lanes (power of two <= 32) or TEAM == 0 (the whole block) own one quantization block of
// bs = TEAM_SIZE * ITEMS * VEC elements.
template <class T, int TEAM, int ITEMS>
__global__ void __launch_bounds__(kThreads)
quantize_fast(const float *__restrict__ code, const T *__restrict__ A, float *__restrict__ absmax,
              uint8_t *__restrict__ out, int64_t bs, int64_t n, int64_t nblocks) {
  extern __shared__ __align__(16) uint8_t lut[];
  __shared__ float red[kWarps];
  constexpr int V = Vec<T>::N;
  constexpr int TS = TEAM == 0 ? kThreads : TEAM;
  build_lut(code, lut);
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t first, stride;
  if constexpr (TEAM == 0) {
    first = blockIdx.x;
    stride = gridDim.x;
  } else {
    constexpr int per_warp = 32 / TEAM;
    first = ((int64_t)blockIdx.x * kWarps + warp) * per_warp;
    stride = (int64_t)gridDim.x * kWarps * per_warp;
  }
  const int t = TEAM == 0 ? threadIdx.x : (lane & (TS - 1));
  const int sub = TEAM == 0 ? 0 : lane / TS;

  for (int64_t b0 = first; b0 < nblocks; b0 += stride) {  // uniform per warp (per block if TEAM==0)
    const int64_t b = b0 + sub;
    const bool valid = b < nblocks;
    const int64_t base = b * bs;
    uint4 x[ITEMS];
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int64_t off = base + (int64_t)(t + k * TS) * V;
      if (valid && off + V <= n) {
        x[k] = __ldg(reinterpret_cast<const uint4 *>(A + off));
      } else {  // the last, partial vector: missing elements read as 0 (no effect on absmax)
        T h[V];
#pragma unroll
        for (int e = 0; e < V; ++e) h[e] = (valid && off + e < n) ? A[off + e] : from_float<T>(0.0f);
        memcpy(&x[k], h, sizeof(x[k]));
      }
#pragma unroll
      for (int e = 0; e < V; ++e) amax = fmaxf(amax, fabsf(elem<T>(x[k], e)));  // NaN ignored, as on the CPU
    }
    if constexpr (TEAM == 0) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      if (lane == 0) red[warp] = amax;
      __syncthreads();
      amax = red[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) amax = fmaxf(amax, red[w]);
      __syncthreads();  // red is reused by the next iteration
    } else {
#pragma unroll
      for (int o = TS / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    }
    if (!valid) continue;
    if (t == 0) absmax[b] = amax;
    const QuantScale inv = amax == 0.0f ? QuantScale{1.0f, 0.0f} : quant_block_scale(amax);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int64_t off = base + (int64_t)(t + k * TS) * V;
      uint8_t c[V];
#pragma unroll
      for (int e = 0; e < V; ++e) c[e] = amax == 0.0f ? (uint8_t)0 : quant_one(lut, elem<T>(x[k], e), inv);
      if (off + V <= n) {
        store_codes<T>(out + off, c);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e)
          if (off + e < n) out[off + e] = c[e];
      }
    }
  }
}

// ---- quantize: any blocksize, scalar, one warp per quantization block ---------------------------
template <class T>
__global__ void __launch_bounds__(kThreads)
quantize_generic(const float *__restrict__ code, const T *__restrict__ A, float *__restrict__ absmax,
                 uint8_t *__restrict__ out, int64_t bs, int64_t n, int64_t nblocks) {
  extern __shared__ __align__(16) uint8_t lut[];
  build_lut(code, lut);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t first = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int64_t stride = (int64_t)gridDim.x * kWarps;
  for (int64_t b = first; b < nblocks; b += stride) {  // uniform per warp
    const int64_t s = b * bs, e = (s + bs < n) ? s + bs : n;
    float amax = 0.0f;
    for (int64_t i = s + lane; i < e; i += 32) amax = fmaxf(amax, fabsf(to_float(A[i])));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) absmax[b] = amax;
    const QuantScale inv = amax == 0.0f ? QuantScale{1.0f, 0.0f} : quant_block_scale(amax);
    for (int64_t i = s + lane; i < e; i += 32)
      out[i] = amax == 0.0f ? (uint8_t)0 : quant_one(lut, to_float(A[i]), inv);
  }
}

// ---- dequantize ---------------------------------------------------------------------------------
constexpr int kDqThreads = 256;

// 4 codes per thread and step (one 4-byte load, one 16/8-byte store: every warp access is
// contiguous), 4 independent steps in flight; bs is a power of two >= 4, so the 4 share one absmax.
constexpr int kDqUnroll = 4;

template <class T>
__device__ __forceinline__ void store4(T *p, float a, float b, float c, float d) {
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<float4 *>(p) = make_float4(a, b, c, d);
  } else {
    const T h0 = from_float<T>(a), h1 = from_float<T>(b), h2 = from_float<T>(c), h3 = from_float<T>(d);
    const auto u = [](const T &h) { return (uint32_t)reinterpret_cast<const unsigned short &>(h); };
    *reinterpret_cast<uint2 *>(p) = make_uint2(u(h0) | (u(h1) << 16), u(h2) | (u(h3) << 16));
  }
}

template <class T>
__global__ void __launch_bounds__(kDqThreads)
dequantize_fast(const float *__restrict__ code, const uint8_t *__restrict__ A, const float *__restrict__ absmax,
                T *__restrict__ out, int bs_shift, int64_t n) {
  __shared__ float s_code[kCode];
  for (int i = threadIdx.x; i < kCode; i += blockDim.x) s_code[i] = code[i];
  __syncthreads();
  const int64_t chunks = n >> 2;
  const int64_t tile = (int64_t)blockDim.x * kDqUnroll;
  const uint32_t *A32 = reinterpret_cast<const uint32_t *>(A);
  for (int64_t base = (int64_t)blockIdx.x * tile; base < chunks; base += (int64_t)gridDim.x * tile) {
    uint32_t raw[kDqUnroll];
    float sc[kDqUnroll];
#pragma unroll
    for (int u = 0; u < kDqUnroll; ++u) {
      const int64_t ch = base + u * blockDim.x + threadIdx.x;
      if (ch < chunks) {
        raw[u] = __ldg(A32 + ch);
        sc[u] = __ldg(absmax + ((ch << 2) >> bs_shift));
      }
    }
#pragma unroll
    for (int u = 0; u < kDqUnroll; ++u) {
      const int64_t ch = base + u * blockDim.x + threadIdx.x;
      if (ch < chunks) {
        const uint32_t r = raw[u];
        store4<T>(out + (ch << 2), __fmul_rn(s_code[r & 0xffu], sc[u]), __fmul_rn(s_code[(r >> 8) & 0xffu], sc[u]),
                  __fmul_rn(s_code[(r >> 16) & 0xffu], sc[u]), __fmul_rn(s_code[r >> 24], sc[u]));
      }
    }
  }
  // tail (n % 4 elements), by the first threads of the grid
  const int64_t rest = n - (chunks << 2);
  const int64_t gt = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (gt < rest) {
    const int64_t i = (chunks << 2) + gt;
    out[i] = from_float<T>(__fmul_rn(s_code[A[i]], absmax[i >> bs_shift]));
  }
}

template <class T>
__global__ void __launch_bounds__(kDqThreads)
dequantize_generic(const float *__restrict__ code, const uint8_t *__restrict__ A, const float *__restrict__ absmax,
                   T *__restrict__ out, int64_t bs, int64_t n) {
  __shared__ float s_code[kCode];
  for (int i = threadIdx.x; i < kCode; i += blockDim.x) s_code[i] = code[i];
  __syncthreads();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = from_float<T>(__fmul_rn(s_code[A[i]], absmax[i / bs]));
}

// ---- launch -------------------------------------------------------------------------------------
constexpr size_t kLutSmem = kLut;

// Per kernel and device: raise the dynamic shared memory limit once, and remember the occupancy.
template <class K>
int prepare(K kernel, int *blocks_per_sm) {
  struct Entry { const void *fn; int dev; int occ; };
  static std::mutex mu;
  static Entry cache[256];
  static int used = 0;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return E_DEVICE;
  std::lock_guard<std::mutex> lock(mu);
  for (int i = 0; i < used; ++i)
    if (cache[i].fn == (const void *)kernel && cache[i].dev == dev) {
      *blocks_per_sm = cache[i].occ;
      return OK;
    }
  int o = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kLutSmem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel, kThreads, kLutSmem) != cudaSuccess || o <= 0) {
    (void)cudaGetLastError();
    return E_DEVICE;
  }
  if (used < 256) cache[used++] = {(const void *)kernel, dev, o};
  *blocks_per_sm = o;
  return OK;
}

template <class T, class K>
int launch_quantize(K kernel, int64_t units, int64_t units_per_block, cudaStream_t st, const float *code,
                    const T *A, float *absmax, uint8_t *out, int64_t bs, int64_t n, int64_t nblocks) {
  int per_sm = 0;
  if (int s = prepare(kernel, &per_sm)) return s;
  const int64_t want = (units + units_per_block - 1) / units_per_block;
  const int64_t cap = (int64_t)sm_count() * per_sm;
  const int grid = (int)(want < cap ? want : cap);
  kernel<<<grid, kThreads, kLutSmem, st>>>(code, A, absmax, out, bs, n, nblocks);
  return launch_status();
}

template <class T>
int quantize_blockwise(cudaStream_t st, const float *code, const T *A, float *absmax, uint8_t *out, int64_t bs,
                       int64_t n) {
  constexpr int V = Vec<T>::N;
  const int64_t nblocks = (n + bs - 1) / bs;
  const bool pow2 = (bs & (bs - 1)) == 0;
  const int64_t nvec = bs / V;
  if (pow2 && bs >= V && nvec <= kThreads * 8 && aligned16(A) && (reinterpret_cast<uintptr_t>(out) % V) == 0) {
    // team size x items per lane = nvec
#define BNB_Q(TEAM, ITEMS, PER_BLOCK) \
  return launch_quantize<T>(quantize_fast<T, TEAM, ITEMS>, nblocks, PER_BLOCK, st, code, A, absmax, out, bs, n, nblocks)
    switch (nvec) {
      case 4: BNB_Q(4, 1, kWarps * 8);
      case 8: BNB_Q(8, 1, kWarps * 4);
      case 16: BNB_Q(16, 1, kWarps * 2);
      case 32: BNB_Q(32, 1, kWarps);
      case 64: BNB_Q(32, 2, kWarps);
      case 128: BNB_Q(32, 4, kWarps);
      case 256: BNB_Q(32, 8, kWarps);
      case 512: BNB_Q(0, 1, 1);
      case 1024: BNB_Q(0, 2, 1);
      case 2048: BNB_Q(0, 4, 1);
      case 4096: BNB_Q(0, 8, 1);
      default: break;
    }
#undef BNB_Q
  }
  return launch_quantize<T>(quantize_generic<T>, nblocks, kWarps, st, code, A, absmax, out, bs, n, nblocks);
}

template <class T>
int dequantize_blockwise(cudaStream_t st, const float *code, const uint8_t *A, const float *absmax, T *out,
                         int64_t bs, int64_t n) {
  const int64_t cap = (int64_t)sm_count() * 16;
  if ((bs & (bs - 1)) == 0 && bs >= 4 && (reinterpret_cast<uintptr_t>(A) & 3u) == 0 && aligned16(out)) {
    int shift = 0;
    while ((int64_t(1) << shift) < bs) ++shift;
    const int64_t chunks = n >> 2;
    int64_t want = (chunks + kDqThreads * kDqUnroll - 1) / (kDqThreads * kDqUnroll);
    if (want < 1) want = 1;
    const int grid = (int)(want < cap ? want : cap);
    dequantize_fast<T><<<grid, kDqThreads, 0, st>>>(code, A, absmax, out, shift, n);
  } else {
    int64_t want = (n + kDqThreads - 1) / kDqThreads;
    const int grid = (int)(want < cap ? want : cap);
    dequantize_generic<T><<<grid, kDqThreads, 0, st>>>(code, A, absmax, out, bs, n);
  }
  return launch_status();
}

// ---- entry points: checks in checks/blockwise.h (shared with the CPU library) -------------------
template <class H>
int quantize_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::QuantizeBlockwise<T> a;
  if (int s = checks::quantize_blockwise(c, &a)) return s;
  if (a.empty) return OK;
  return quantize_blockwise<T>(c.cu_stream(), a.code, a.A, a.absmax, a.out, a.blocksize, a.n);
}

template <class H>
int dequantize_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::DequantizeBlockwise<T> a;
  if (int s = checks::dequantize_blockwise(c, &a)) return s;
  if (a.empty) return OK;
  return dequantize_blockwise<T>(c.cu_stream(), a.code, a.A, a.absmax, a.out, a.blocksize, a.n);
}

}  // namespace
}  // namespace cuda
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cquantize_blockwise_fp32, bnb_ms::cuda::quantize_entry<float>)
BNB_MS_ENTRY(cquantize_blockwise_fp16, bnb_ms::cuda::quantize_entry<fp16_t>)
BNB_MS_ENTRY(cquantize_blockwise_bf16, bnb_ms::cuda::quantize_entry<bf16_t>)
BNB_MS_ENTRY(cdequantize_blockwise_fp32, bnb_ms::cuda::dequantize_entry<float>)
BNB_MS_ENTRY(cdequantize_blockwise_fp16, bnb_ms::cuda::dequantize_entry<fp16_t>)
BNB_MS_ENTRY(cdequantize_blockwise_bf16, bnb_ms::cuda::dequantize_entry<bf16_t>)
