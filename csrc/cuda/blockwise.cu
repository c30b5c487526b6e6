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
//     byte vectors.  Small blocks are served G at a time per team, all G loads issued before the first
//     use (enough bytes in flight per warp to cover the memory latency).  The grid is persistent (blocks = SMs x occupancy), so the table is built a few
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
#include "cuda/code_lut.cuh"
#include "cuda/vec_io.cuh"

namespace bnb_ms {
namespace cuda {
namespace {

constexpr int kThreads = 512;  // quantize block size (the table is built with all of them)
constexpr int kWarps = kThreads / 32;

// ---- the table: cuda/code_lut.cuh (grid_index, build_lut) ---------------------------------------

// ---- vector I/O: cuda/vec_io.cuh (Vec, elem, load_vec) -----------------------------------------
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

// The code entry nearest 0 (lowest index on ties; cpu/quant_lut.h's QuantLut::zero): an exact 0 in a block of
// subnormals (absmax < 2^-126) takes it, so it dequantizes to 0 (other blocks keep upstream's grid bytes).
constexpr float kFltMin = 1.17549435e-38f;
__device__ inline uint8_t code_zero(const float *__restrict__ code) {
  int z = 0;
  for (int i = 1; i < kCode; ++i)
    if (fabsf(code[i]) < fabsf(code[z])) z = i;
  return (uint8_t)z;
}
__device__ __forceinline__ uint8_t quant_tiny(const uint8_t *lut, float x, QuantScale k, uint8_t zero) {
  return x == 0.0f ? zero : quant_one(lut, x, k);
}

// ---- quantize: fast path ------------------------------------------------------------------------
// TEAM lanes (power of two <= 32) or TEAM == 0 (the whole block) own one quantization block of
// bs = TEAM_SIZE * ITEMS * VEC elements.
template <class T, int TEAM, int ITEMS, int G>
__global__ void __launch_bounds__(kThreads, TEAM == 0 && G > 1 ? 2 : 1)  // 2 blocks/SM (measured: no faster than 1)
quantize_fast(const float *__restrict__ code, const T *__restrict__ A, float *__restrict__ absmax,
              uint8_t *__restrict__ out, int64_t bs, int64_t n, int64_t nblocks) {
  extern __shared__ __align__(16) uint8_t lut[];
  __shared__ float red[G][kWarps];
  constexpr int V = Vec<T>::N;
  constexpr int TS = TEAM == 0 ? kThreads : TEAM;
  build_lut(code, lut);
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int PER_WARP = TEAM == 0 ? 1 : 32 / (TEAM == 0 ? 1 : TEAM);
  int64_t first, stride;
  if constexpr (TEAM == 0) {  // G consecutive quantization blocks per step
    first = (int64_t)blockIdx.x * G;
    stride = (int64_t)gridDim.x * G;
  } else {
    first = ((int64_t)blockIdx.x * kWarps + warp) * PER_WARP * G;
    stride = (int64_t)gridDim.x * kWarps * PER_WARP * G;
  }
  const int t = TEAM == 0 ? threadIdx.x : (lane & (TS - 1));
  const int sub = TEAM == 0 ? 0 : lane / TS;

  for (int64_t b0 = first; b0 < nblocks; b0 += stride) {  // uniform per warp (per block if TEAM==0)
    // all G x ITEMS loads of the step in flight before the first use
    uint4 x[G][ITEMS];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int64_t b = b0 + g * PER_WARP + sub;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) x[g][k] = load_vec<T>(A, b * bs + (int64_t)(t + k * TS) * V, n, b < nblocks);
    }
    // absmax of each of the G blocks (a whole-block team: one barrier pair for all G)
    float amx[G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) amax = fmaxf(amax, fabsf(elem<T>(x[g][k], e)));  // NaN ignored, as on the CPU
#pragma unroll
      for (int o = (TEAM == 0 ? 16 : TS / 2); o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      amx[g] = amax;
    }
    if constexpr (TEAM == 0) {
      if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) red[g][warp] = amx[g];
      }
      __syncthreads();
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float a = red[g][0];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) a = fmaxf(a, red[g][w]);
        amx[g] = a;
      }
      __syncthreads();  // red is reused by the next step
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int64_t b = b0 + g * PER_WARP + sub;
      const bool valid = b < nblocks;
      const int64_t base = b * bs;
      const float amax = amx[g];
      if (!valid) continue;
      if (t == 0) absmax[b] = amax;
      const QuantScale inv = amax == 0.0f ? QuantScale{1.0f, 0.0f} : quant_block_scale(amax);
      // uniform per team: an all-zero block codes 0; the 2^64 pre-scale only where 1/absmax overflows
      const int how = amax == 0.0f ? 0 : (amax >= kFltMin ? 1 : 2);  // 2: a block of subnormals
      const uint8_t zero = how == 2 ? code_zero(code) : (uint8_t)0;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int64_t off = base + (int64_t)(t + k * TS) * V;
        uint8_t c[V];
        if (how == 1) {
#pragma unroll
          for (int e = 0; e < V; ++e) c[e] = lut[grid_index(__fmul_rn(elem<T>(x[g][k], e), inv.inv))];
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e) c[e] = how == 0 ? (uint8_t)0 : quant_tiny(lut, elem<T>(x[g][k], e), inv, zero);
        }
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
    const bool tiny = amax != 0.0f && amax < kFltMin;  // a block of subnormals: its exact 0 keeps a zero code
    const uint8_t zero = tiny ? code_zero(code) : (uint8_t)0;
    for (int64_t i = s + lane; i < e; i += 32)
      out[i] = amax == 0.0f ? (uint8_t)0 : tiny ? quant_tiny(lut, to_float(A[i]), inv, zero) : quant_one(lut, to_float(A[i]), inv);
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

template <class T, class K>
int launch_quantize(K kernel, int64_t units, int64_t units_per_block, cudaStream_t st, const float *code,
                    const T *A, float *absmax, uint8_t *out, int64_t bs, int64_t n, int64_t nblocks) {
  int per_sm = 0;
  if (int s = blocks_per_sm_with_smem(kernel, kThreads, kLutSmem, &per_sm)) return s;
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
#define BNB_Q(TEAM, ITEMS, G, PER_BLOCK) \
  return launch_quantize<T>(quantize_fast<T, TEAM, ITEMS, G>, nblocks, PER_BLOCK, st, code, A, absmax, out, bs, n, nblocks)
    switch (nvec) {
      case 4: BNB_Q(4, 1, 4, kWarps * 8 * 4);
      case 8: BNB_Q(8, 1, 4, kWarps * 4 * 4);
      case 16: BNB_Q(16, 1, 4, kWarps * 2 * 4);
      case 32: BNB_Q(32, 1, 4, kWarps * 4);
      case 64: BNB_Q(32, 2, 2, kWarps * 2);
      case 128: BNB_Q(32, 4, 1, kWarps);
      case 256: BNB_Q(32, 8, 1, kWarps);
      case 512: BNB_Q(0, 1, 4, 4);
      case 1024: BNB_Q(0, 2, 2, 2);
      case 2048: BNB_Q(0, 4, 1, 1);
      case 4096: BNB_Q(0, 8, 1, 1);
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
