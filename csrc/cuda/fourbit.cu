// fourbit.cu -- 4-bit (NF4/FP4) blockwise quantization, dequantization and the batch-1 GEMV on CUDA:
// the same entry points, checks and results as csrc/cpu/fourbit.cpp (read its comments for the
// algorithm).  Quantize/dequantize are bit-exact with the CPU library; the GEMV accumulates in fp32
// in a different order (per-lane fmaf, then a warp tree), so it agrees within fp32 rounding.
//
// Quantize: one warp per quantization block (persistent grid-stride over blocks).  Each lane owns
// pairs of elements (one output byte); pass 1 = absmax (warp shuffles; NaN tracked apart, as the
// CPU does), pass 2 = bucket among the midpoints of the sorted code (ties go to the lower code:
// c = #{i : !(v <= mid[i])}, NaN -> the largest code), full blocks multiply by 1/absmax, the
// partial last block divides by the clamped absmax (max(absmax, 1e-38), stored clamped).  The
// 16-entry code is sorted (stable insertion sort) per thread block in shared memory.
// Dequantize: 16 bytes of output per thread and step (4 fp32 / 8 fp16|bf16 values from 2 / 4 packed
// bytes) when blocksize allows and pointers are aligned, else one element per thread.  NaN products
// are given the bits x86 gives them (the CPU library's), see mul_x86.  FP4's code[8] == 0 becomes -0.0 as on the CPU.
// GEMV: one warp per output row; a lane reads 16 packed bytes (32 weights) per step, decodes them
// in registers against a shared 16-entry table, w = code[q] * absmax (rounded fp32 product, as the
// CPU), acc = fmaf(w, x, acc); 4 steps in flight.  A generic path (one byte per lane per step)
// handles K % 32 != 0, blocksize % 32 != 0 or misaligned pointers.
//
// Compiled with -fmad=false (CMake) and explicit __f*_rn where it matters: no contraction the CPU
// does not do.
#include <cstdint>

#include "checks/fourbit.h"
#include "cuda/aot_cuda.cuh"

namespace bnb_ms {
namespace cuda {
namespace {

constexpr int kCode4 = 16;

// ---- the sorted code (make_bounds of fourbit.cpp) ----------------------------------------------
struct Bounds4 {
  float mid[kCode4 - 1];
  uint8_t order[kCode4];
  uint8_t zero_code;
};

// Thread 0 fills *b (stable insertion sort: equal codes keep their order); caller syncs.
__device__ void make_bounds(const float *__restrict__ code, Bounds4 *b) {
  if (threadIdx.x != 0) return;
  float v[kCode4];
  int idx[kCode4];
  for (int i = 0; i < kCode4; ++i) {
    v[i] = code[i];
    idx[i] = i;
  }
  for (int i = 1; i < kCode4; ++i) {
    const float x = v[i];
    const int xi = idx[i];
    int j = i - 1;
    while (j >= 0 && x < v[j]) {  // strict: stable
      v[j + 1] = v[j];
      idx[j + 1] = idx[j];
      --j;
    }
    v[j + 1] = x;
    idx[j + 1] = xi;
  }
  for (int i = 0; i < kCode4; ++i) b->order[i] = (uint8_t)idx[i];
  for (int i = 0; i < kCode4 - 1; ++i) b->mid[i] = __fdiv_rn(__fadd_rn(v[i], v[i + 1]), 2.0f);
  int z = 0;
  for (int i = 0; i < kCode4 - 1; ++i) z += !(0.0f <= b->mid[i]);
  b->zero_code = b->order[z];
}

__device__ __forceinline__ uint8_t bucket(const Bounds4 &b, const float (&mid)[kCode4 - 1], float v) {
  int c = 0;
#pragma unroll
  for (int i = 0; i < kCode4 - 1; ++i) c += !(v <= mid[i]);
  return b.order[c];
}

__device__ __forceinline__ float clamp1(float v) { return v < -1.0f ? -1.0f : (v > 1.0f ? 1.0f : v); }

template <class T>
__device__ __forceinline__ void load2(const T *p, int64_t i, int64_t e, float *x0, float *x1) {
  *x0 = to_float(p[i]);
  *x1 = i + 1 < e ? to_float(p[i + 1]) : 0.0f;
}

// ---- quantize -----------------------------------------------------------------------------------
constexpr int kQThreads = 256;

template <class T>
__global__ void __launch_bounds__(kQThreads)
quantize4(const float *__restrict__ code, const T *__restrict__ A, float *__restrict__ absmax,
          uint8_t *__restrict__ out, int64_t bs, int64_t n, int64_t nblocks) {
  __shared__ Bounds4 sb;
  make_bounds(code, &sb);
  __syncthreads();
  const Bounds4 &bd = sb;  // order[] stays in shared memory (indexed dynamically)
  float mid[kCode4 - 1];
#pragma unroll
  for (int i = 0; i < kCode4 - 1; ++i) mid[i] = sb.mid[i];
  const int lane = threadIdx.x & 31;
  const int64_t full_blocks = n / bs;
  const int64_t first = (int64_t)blockIdx.x * (kQThreads / 32) + (threadIdx.x >> 5);
  const int64_t stride = (int64_t)gridDim.x * (kQThreads / 32);
  for (int64_t blk = first; blk < nblocks; blk += stride) {
    const int64_t s = blk * bs, e = min(s + bs, n);
    float amax = 0.0f;
    bool nan = false;
    for (int64_t i = s + 2 * lane; i < e; i += 64) {
      float x0, x1;
      load2(A, i, e, &x0, &x1);  // x1 = 0 past the end
      const float a0 = fabsf(x0), a1 = fabsf(x1);
      nan |= (a0 != a0) | (a1 != a1);
      amax = fmaxf(amax, fmaxf(a0, a1));
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    nan = __any_sync(0xffffffffu, nan);
    if (nan) amax = __int_as_float(0x7fc00000);
    const bool partial = blk >= full_blocks;
    const float am = (amax > 1e-38f || amax != amax) ? amax : 1e-38f;
    if (lane == 0) absmax[blk] = partial ? am : amax;
    const float inv = __fdiv_rn(1.0f, am);
    for (int64_t i = s + 2 * lane; i < e; i += 64) {
      float x0, x1;
      load2(A, i, e, &x0, &x1);
      const float v0 = clamp1(partial ? __fdiv_rn(x0, am) : __fmul_rn(x0, inv));
      const float v1 = clamp1(partial ? __fdiv_rn(x1, am) : __fmul_rn(x1, inv));
      const uint8_t hi = bucket(bd, mid, v0);
      const uint8_t lo = i + 1 < e ? bucket(bd, mid, v1) : bd.zero_code;
      out[i >> 1] = (uint8_t)((hi << 4) | lo);
    }
  }
}

// ---- dequantize ---------------------------------------------------------------------------------
constexpr int kDThreads = 256;

// a * b with the NaN the CPU library's x86 multiply produces: the first NaN operand, made quiet, or
// the x86 default NaN (0xffc00000) for inf * 0 (CUDA would give 0x7fffffff).
__device__ __forceinline__ float mul_x86(float a, float b) {
  const float r = __fmul_rn(a, b);
  if (r == r) return r;
  if (a != a) return __uint_as_float(__float_as_uint(a) | 0x400000u);
  if (b != b) return __uint_as_float(__float_as_uint(b) | 0x400000u);
  return __uint_as_float(0xffc00000u);
}

template <class T>
__device__ __forceinline__ void store8(T *p, const float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    float4 a = make_float4(v[0], v[1], v[2], v[3]), b = make_float4(v[4], v[5], v[6], v[7]);
    reinterpret_cast<float4 *>(p)[0] = a;
    reinterpret_cast<float4 *>(p)[1] = b;
  } else {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const T lo = from_float<T>(v[2 * k]), hi = from_float<T>(v[2 * k + 1]);
      unsigned short l, h;
      memcpy(&l, &lo, 2);
      memcpy(&h, &hi, 2);
      w[k] = (uint32_t)l | ((uint32_t)h << 16);
    }
    *reinterpret_cast<uint4 *>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// G = 16 / sizeof(T) outputs per thread and step (one 16-byte store; G/2 packed bytes loaded);
// blocksize % G == 0 so a step stays in one quantization block; the tail (< G elements) is scalar.
template <class T>
__global__ void __launch_bounds__(kDThreads)
dequantize4_fast(const float *__restrict__ code, const uint8_t *__restrict__ q, const float *__restrict__ absmax,
                 T *__restrict__ out, int64_t bs, int shift, int64_t n, bool fp4) {
  constexpr int G = 16 / sizeof(T);
  __shared__ float c[kCode4];
  if (threadIdx.x < kCode4) {
    float v = code[threadIdx.x];
    if (fp4 && threadIdx.x == 8 && v == 0.0f) v = -0.0f;
    c[threadIdx.x] = v;
  }
  __syncthreads();
  const int64_t groups = n / G;
  for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += (int64_t)gridDim.x * blockDim.x) {
    uint32_t w;
    if constexpr (G == 8) w = __ldg(reinterpret_cast<const uint32_t *>(q) + g);
    else w = __ldg(reinterpret_cast<const unsigned short *>(q) + g);
    const int64_t i0 = g * G;
    const float sc = __ldg(absmax + (shift >= 0 ? (i0 >> shift) : i0 / bs));
    float v[8];
#pragma unroll
    for (int k = 0; k < G / 2; ++k) {
      const uint32_t byte = (w >> (8 * k)) & 0xffu;
      v[2 * k] = mul_x86(c[byte >> 4], sc);
      v[2 * k + 1] = mul_x86(c[byte & 15u], sc);
    }
    if constexpr (G == 4) {
      *reinterpret_cast<float4 *>(out + i0) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      store8<T>(out + i0, v);
    }
  }
  if (blockIdx.x == 0) {
    for (int64_t i = groups * G + threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t byte = q[i >> 1];
      const float cv = c[(i & 1) ? (byte & 15u) : (byte >> 4)];
      out[i] = from_float<T>(mul_x86(cv, absmax[i / bs]));
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kDThreads)
dequantize4_generic(const float *__restrict__ code, const uint8_t *__restrict__ q, const float *__restrict__ absmax,
                    T *__restrict__ out, int64_t bs, int64_t n, bool fp4) {
  __shared__ float c[kCode4];
  if (threadIdx.x < kCode4) {
    float v = code[threadIdx.x];
    if (fp4 && threadIdx.x == 8 && v == 0.0f) v = -0.0f;
    c[threadIdx.x] = v;
  }
  __syncthreads();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const uint32_t byte = q[i >> 1];
    const float cv = c[(i & 1) ? (byte & 15u) : (byte >> 4)];
    out[i] = from_float<T>(mul_x86(cv, absmax[i / bs]));
  }
}

// ---- GEMV ---------------------------------------------------------------------------------------
constexpr int kGWarps = 4;  // rows per thread block
constexpr int kGUnroll = 4;

template <class T>
__device__ __forceinline__ void load_a32(const T *__restrict__ a, float (&x)[32]) {
  // 32 consecutive elements, 16-byte aligned
  if constexpr (sizeof(T) == 4) {
    const float4 *p = reinterpret_cast<const float4 *>(a);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 v = __ldg(p + k);
      x[4 * k] = v.x; x[4 * k + 1] = v.y; x[4 * k + 2] = v.z; x[4 * k + 3] = v.w;
    }
  } else {
    const uint4 *p = reinterpret_cast<const uint4 *>(a);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 v = __ldg(p + k);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        T lo, hi;
        const unsigned short l = (unsigned short)(w[j] & 0xffffu), h = (unsigned short)(w[j] >> 16);
        memcpy(&lo, &l, 2);
        memcpy(&hi, &h, 2);
        x[8 * k + 2 * j] = to_float(lo);
        x[8 * k + 2 * j + 1] = to_float(hi);
      }
    }
  }
}

// Fast path: K % 32 == 0, bs % 32 == 0, A/B 16-byte aligned.  Each lane: 16 bytes of B = 32 weights
// per step, all in one quantization block.
template <class T>
__global__ void __launch_bounds__(kGWarps * 32)
gemv4_fast(const float *__restrict__ code, const uint8_t *__restrict__ B, const float *__restrict__ absmax,
           const T *__restrict__ A, T *__restrict__ out, int64_t M, int64_t N, int64_t K, int64_t bs, int shift) {
  __shared__ float c[kCode4];
  if (threadIdx.x < kCode4) c[threadIdx.x] = code[threadIdx.x];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * kGWarps + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t base = row * K;  // element index of the row's first weight
  const uint4 *Bv = reinterpret_cast<const uint4 *>(B + (base >> 1));
  const int64_t steps = K >> 5;  // 32-weight chunks in the row
  for (int64_t m = blockIdx.y; m < M; m += gridDim.y) {
    const T *a = A + m * K;
    float acc = 0.0f;
    int64_t j = lane;
    for (; j + 32 * (kGUnroll - 1) < steps; j += 32 * kGUnroll) {
      uint4 wv[kGUnroll];
      float sc[kGUnroll];
#pragma unroll
      for (int u = 0; u < kGUnroll; ++u) {
        wv[u] = __ldg(Bv + j + 32 * u);
        const int64_t e = base + ((j + 32 * u) << 5);
        sc[u] = __ldg(absmax + (shift >= 0 ? (e >> shift) : e / bs));
      }
#pragma unroll
      for (int u = 0; u < kGUnroll; ++u) {
        float x[32];
        load_a32<T>(a + ((j + 32 * u) << 5), x);
        const uint32_t w[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
        for (int b = 0; b < 16; ++b) {
          const uint32_t byte = (w[b >> 2] >> (8 * (b & 3))) & 0xffu;
          acc = fmaf(__fmul_rn(c[byte >> 4], sc[u]), x[2 * b], acc);
          acc = fmaf(__fmul_rn(c[byte & 15u], sc[u]), x[2 * b + 1], acc);
        }
      }
    }
    for (; j < steps; j += 32) {
      const uint4 wv = __ldg(Bv + j);
      const int64_t e = base + (j << 5);
      const float sc = __ldg(absmax + (shift >= 0 ? (e >> shift) : e / bs));
      float x[32];
      load_a32<T>(a + (j << 5), x);
      const uint32_t w[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
      for (int b = 0; b < 16; ++b) {
        const uint32_t byte = (w[b >> 2] >> (8 * (b & 3))) & 0xffu;
        acc = fmaf(__fmul_rn(c[byte >> 4], sc), x[2 * b], acc);
        acc = fmaf(__fmul_rn(c[byte & 15u], sc), x[2 * b + 1], acc);
      }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    if (lane == 0) out[m * N + row] = from_float<T>(acc);
  }
}

// Any K, blocksize, alignment: one element per lane per step.
template <class T>
__global__ void __launch_bounds__(kGWarps * 32)
gemv4_generic(const float *__restrict__ code, const uint8_t *__restrict__ B, const float *__restrict__ absmax,
              const T *__restrict__ A, T *__restrict__ out, int64_t M, int64_t N, int64_t K, int64_t bs) {
  __shared__ float c[kCode4];
  if (threadIdx.x < kCode4) c[threadIdx.x] = code[threadIdx.x];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t row = (int64_t)blockIdx.x * kGWarps + (threadIdx.x >> 5);
  if (row >= N) return;
  for (int64_t m = blockIdx.y; m < M; m += gridDim.y) {
    const T *a = A + m * K;
    float acc = 0.0f;
    for (int64_t k = lane; k < K; k += 32) {
      const int64_t i = row * K + k;
      const uint32_t byte = B[i >> 1];
      const float w = __fmul_rn(c[(i & 1) ? (byte & 15u) : (byte >> 4)], absmax[i / bs]);
      acc = fmaf(w, to_float(a[k]), acc);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) acc = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
    if (lane == 0) out[m * N + row] = from_float<T>(acc);
  }
}

template <class T>
__global__ void fill_zero(T *out, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = from_float<T>(0.0f);
}

inline int log2_exact(int64_t v) {  // log2(v) if v is a power of two, else -1
  if (v <= 0 || (v & (v - 1))) return -1;
  int s = 0;
  while ((int64_t(1) << s) < v) ++s;
  return s;
}

inline int grid_for(int64_t work, int threads, int per_sm) {
  const int64_t want = (work + threads - 1) / threads;
  const int64_t cap = (int64_t)sm_count() * per_sm;
  return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

// ---- entry points: checks in checks/fourbit.h (shared with the CPU library) ------------------------
template <class H>
int quantize4_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Quantize4<T> a;
  if (int s = checks::quantize4(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t n = a.n, nb = a.nb, bs = a.bs;
  const int grid = grid_for(nb, kQThreads / 32, 8);
  quantize4<T><<<grid, kQThreads, 0, c.cu_stream()>>>(a.code, a.A, a.absmax, a.out, bs, n, nb);
  return launch_status();
}

template <class H, bool FP4>
int dequantize4_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Dequantize4<T> a;
  if (int s = checks::dequantize4(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t n = a.n, bs = a.bs;
  const float *code = a.code, *am = a.absmax;
  const uint8_t *q = a.A;
  T *o = a.out;
  constexpr int G = 16 / sizeof(T);
  if (bs % G == 0 && (reinterpret_cast<uintptr_t>(q) % (G / 2)) == 0 && aligned16(o)) {
    const int grid = grid_for(n / G, kDThreads * 4, 16);
    dequantize4_fast<T><<<grid, kDThreads, 0, c.cu_stream()>>>(code, q, am, o, bs, log2_exact(bs), n, FP4);
  } else {
    const int grid = grid_for(n, kDThreads * 4, 16);
    dequantize4_generic<T><<<grid, kDThreads, 0, c.cu_stream()>>>(code, q, am, o, bs, n, FP4);
  }
  return launch_status();
}

template <class H>
int gemv4_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Gemv4<T> ga;
  if (int s = checks::gemv4(c, &ga)) return s;
  if (ga.empty) return OK;
  const int64_t M = ga.M, N = ga.N, K = ga.K, bs = ga.bs;
  T *o = ga.out;
  const cudaStream_t st = c.cu_stream();
  if (K == 0) {
    fill_zero<T><<<grid_for(M * N, 256, 8), 256, 0, st>>>(o, M * N);
    return launch_status();
  }
  const int64_t row_blocks = (N + kGWarps - 1) / kGWarps;
  if (row_blocks > 0x7fffffff) return E_SHAPE;
  dim3 grid((unsigned)row_blocks, (unsigned)(M < 65535 ? M : 65535));
  const T *a = ga.A;
  const uint8_t *b = ga.B;
  if (K % 32 == 0 && bs % 32 == 0 && aligned16(a) && aligned16(b))
    gemv4_fast<T><<<grid, kGWarps * 32, 0, st>>>(ga.code, b, ga.absmax, a, o, M, N, K, bs, log2_exact(bs));
  else
    gemv4_generic<T><<<grid, kGWarps * 32, 0, st>>>(ga.code, b, ga.absmax, a, o, M, N, K, bs);
  return launch_status();
}

// ---- fused 4-bit linear forward (clinear_4bit_*; the CPU library's linear4_entry) ------------------
// Double-quant absmax decoded into a stream-ordered scratch buffer (code2[q] * absmax2[b / bs2] + offset),
// the gemv kernels above, then the bias added to the rounded result in fp32.
__global__ void decode_nested_absmax(const uint8_t *__restrict__ q, const float *__restrict__ code2,
                                     const float *__restrict__ absmax2, float offset, int64_t bs2,
                                     int64_t nb, float *__restrict__ dst) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nb; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __fadd_rn(__fmul_rn(code2[q[i]], absmax2[i / bs2]), offset);
}

template <class T>
__global__ void add_bias_rows(T *__restrict__ out, const T *__restrict__ bias, int64_t M, int64_t N) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < M * N; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = from_float<T>(__fadd_rn(to_float(out[i]), to_float(bias[i % N])));
}

template <class H>
int linear4_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Linear4<T> a;
  if (int s = checks::linear4(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t M = a.M, N = a.N, K = a.K, bs = a.bs, nb = (N * K + bs - 1) / bs;
  const cudaStream_t st = c.cu_stream();
  const int64_t row_blocks = (N + kGWarps - 1) / kGWarps;
  if (row_blocks > 0x7fffffff) return E_SHAPE;
  if (K == 0) {
    fill_zero<T><<<grid_for(M * N, 256, 8), 256, 0, st>>>(a.out, M * N);
  } else {
    const float *am = a.absmax;
    float *dq = nullptr;
    if (a.nested) {
      if (cudaMallocAsync(reinterpret_cast<void **>(&dq), (size_t)nb * sizeof(float), st) != cudaSuccess) return E_DEVICE;
      decode_nested_absmax<<<grid_for(nb, 256, 8), 256, 0, st>>>(a.absmax_q, a.code2, a.absmax2, a.offset, a.bs2, nb, dq);
      am = dq;
    }
    dim3 grid((unsigned)row_blocks, (unsigned)(M < 65535 ? M : 65535));
    if (K % 32 == 0 && bs % 32 == 0 && aligned16(a.A) && aligned16(a.B))
      gemv4_fast<T><<<grid, kGWarps * 32, 0, st>>>(a.code, a.B, am, a.A, a.out, M, N, K, bs, log2_exact(bs));
    else
      gemv4_generic<T><<<grid, kGWarps * 32, 0, st>>>(a.code, a.B, am, a.A, a.out, M, N, K, bs);
    if (dq && cudaFreeAsync(dq, st) != cudaSuccess) return E_DEVICE;
  }
  if (a.bias) add_bias_rows<T><<<grid_for(M * N, 256, 8), 256, 0, st>>>(a.out, a.bias, M, N);
  return launch_status();
}

}  // namespace
}  // namespace cuda
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cquantize_blockwise_fp32_fp4, bnb_ms::cuda::quantize4_entry<float>)
BNB_MS_ENTRY(cquantize_blockwise_fp16_fp4, bnb_ms::cuda::quantize4_entry<fp16_t>)
BNB_MS_ENTRY(cquantize_blockwise_bf16_fp4, bnb_ms::cuda::quantize4_entry<bf16_t>)
BNB_MS_ENTRY(cquantize_blockwise_fp32_nf4, bnb_ms::cuda::quantize4_entry<float>)
BNB_MS_ENTRY(cquantize_blockwise_fp16_nf4, bnb_ms::cuda::quantize4_entry<fp16_t>)
BNB_MS_ENTRY(cquantize_blockwise_bf16_nf4, bnb_ms::cuda::quantize4_entry<bf16_t>)
BNB_MS_ENTRY(cdequantize_blockwise_fp32_fp4, bnb_ms::cuda::dequantize4_entry<float, true>)
BNB_MS_ENTRY(cdequantize_blockwise_fp16_fp4, bnb_ms::cuda::dequantize4_entry<fp16_t, true>)
BNB_MS_ENTRY(cdequantize_blockwise_bf16_fp4, bnb_ms::cuda::dequantize4_entry<bf16_t, true>)
BNB_MS_ENTRY(cdequantize_blockwise_fp32_nf4, bnb_ms::cuda::dequantize4_entry<float, false>)
BNB_MS_ENTRY(cdequantize_blockwise_fp16_nf4, bnb_ms::cuda::dequantize4_entry<fp16_t, false>)
BNB_MS_ENTRY(cdequantize_blockwise_bf16_nf4, bnb_ms::cuda::dequantize4_entry<bf16_t, false>)
BNB_MS_ENTRY(cgemm_4bit_inference_naive_fp32, bnb_ms::cuda::gemv4_entry<float>)
BNB_MS_ENTRY(cgemm_4bit_inference_naive_fp16, bnb_ms::cuda::gemv4_entry<fp16_t>)
BNB_MS_ENTRY(cgemm_4bit_inference_naive_bf16, bnb_ms::cuda::gemv4_entry<bf16_t>)
BNB_MS_ENTRY(clinear_4bit_fp32, bnb_ms::cuda::linear4_entry<float>)
BNB_MS_ENTRY(clinear_4bit_fp16, bnb_ms::cuda::linear4_entry<fp16_t>)
BNB_MS_ENTRY(clinear_4bit_bf16, bnb_ms::cuda::linear4_entry<bf16_t>)
