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
#include "cuda/x86_float.cuh"
#include "cuda/vec_io.cuh"

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
constexpr int kQWarps = kQThreads / 32;

// Generic path (any even blocksize, any alignment): one warp per quantization block, two elements per lane.
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
  const int64_t first = (int64_t)blockIdx.x * kQWarps + (threadIdx.x >> 5);
  const int64_t stride = (int64_t)gridDim.x * kQWarps;
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

// Fast path: the bucket from a 64-cell table instead of 15 compares.  Cell j = the top 6 mantissa bits
// of t = min(v/2 + 3, 3.75) (t in [2, 4): j = floor(16 v + 32), v in [-1-, 1+] -> j in [15, 48]; NaN -> 3.75 ->
// j = 56).  Cell j covers v in [(j-32)/16, (j-31)/16), widened by kCellPad for the rounding of t.  For the
// code's sorted midpoints m (bucket(v) = #{m < v} when they are sorted and NaN-free), a cell stores
// base = #{m < lo} and the (at most two) midpoints inside it, so bucket(v) = base + (v > m1) + (v > m2)
// exactly, and the three candidate codes order[base + 0..2] as nibbles of r.  Codes whose midpoints are
// unsorted, hold NaN, lie where clamp(v, -1, 1) would matter, or put three in one cell use the compare
// count (mode 0), as the generic path.  NF4 needs one compare per value, FP4 (midpoints -2^-8.6, 0,
// 2^-8.6 near zero) two.
constexpr int kCells = 64;
constexpr float kCellPad = 9.5367431640625e-07f;  // 2^-20 >> the 2^-22 rounding of t, in units of v

struct Cells4 {
  float m1[kCells], m2[kCells];
  uint32_t r[kCells];   // order[base], order[base + 1], order[base + 2] as nibbles 0..2
  uint32_t rb[kCells];  // bytes: order[base], order[base + 1], order[base] << 4, order[base + 1] << 4
  int mode;  // 1 or 2 compares per value, 0: count
};

__device__ __forceinline__ uint32_t cell_of(float v) {
  const float t = fminf(__fmaf_rn(v, 0.5f, 3.0f), 3.75f);  // fminf(NaN, 3.75) = 3.75
  return (__float_as_uint(t) >> 17) & (kCells - 1);
}

// Thread 0 sorts the code (make_bounds); threads 0..63 fill one cell each.  Ends with a barrier.
__device__ void build_cells(const float *__restrict__ code, Bounds4 *sb, Cells4 *cs) {
  make_bounds(code, sb);
  __syncthreads();
  const int j = threadIdx.x;
  bool sorted = true;
  for (int i = 0; i < kCode4 - 1; ++i) {
    const float m = sb->mid[i];
    // the compare count equals #{m < v} only for sorted NaN-free midpoints; clamp(v, -1, 1) of a v in
    // [-1 - 2^-22, 1 + 2^-22] changes the count only through a midpoint in [-1.001, -1) or [1, 1.001]
    if (m != m || (i > 0 && !(sb->mid[i - 1] <= m)) || (m >= -1.001f && m < -1.0f) || (m >= 1.0f && m <= 1.001f))
      sorted = false;
  }
  int count = 0;
  if (j < kCells) {
    float m1 = __int_as_float(0x7f800000), m2 = m1;
    int base = 0;
    if (j == 56) {  // NaN: bucket 15
      base = kCode4 - 1;
    } else {
      const float lo = __fsub_rn((float)(j - 32) * 0.0625f, kCellPad);
      const float hi = __fadd_rn((float)(j - 31) * 0.0625f, kCellPad);
      for (int i = 0; i < kCode4 - 1; ++i) {
        const float m = sb->mid[i];
        if (m < lo) {
          ++base;
        } else if (m < hi) {
          if (count == 0) m1 = m; else m2 = m;
          ++count;
        }
      }
    }
    uint32_t r = 0;
    for (int k = 0; k < 3; ++k) r |= (uint32_t)sb->order[min(base + k, kCode4 - 1)] << (4 * k);
    cs->m1[j] = m1;
    cs->m2[j] = m2;
    cs->r[j] = r;
    const uint32_t r0 = r & 15u, r1 = (r >> 4) & 15u;
    cs->rb[j] = r0 | (r1 << 8) | (r0 << 20) | (r1 << 28);
  }
  const bool three = __syncthreads_or(count > 2);
  const bool two = __syncthreads_or(count == 2);
  if (j == 0) cs->mode = (!sorted || three) ? 0 : (two ? 2 : 1);
  __syncthreads();
}

template <int MODE>
__device__ __forceinline__ uint32_t nibble_of(const Cells4 &cs, const Bounds4 &sb, float v) {
  if constexpr (MODE == 0) {
    const float vc = clamp1(v);
    int c = 0;
#pragma unroll
    for (int i = 0; i < kCode4 - 1; ++i) c += !(vc <= sb.mid[i]);
    return sb.order[c];
  } else {
    const uint32_t j = cell_of(v);
    int sh = v > cs.m1[j] ? 4 : 0;
    if constexpr (MODE == 2) sh += v > cs.m2[j] ? 4 : 0;
    return (cs.r[j] >> sh) & 15u;
  }
}

// V/2 packed bytes (element 2j in the high nibble of byte j), one 4- or 2-byte store.
template <int V>
__device__ __forceinline__ void store_packed(uint8_t *p, uint32_t w) {
  if constexpr (V == 8) *reinterpret_cast<uint32_t *>(p) = w;
  else *reinterpret_cast<unsigned short *>(p) = (unsigned short)w;
}

// TEAM lanes (a power of two <= 32) own one quantization block of TEAM * ITEMS * V elements (V per 16-byte
// vector); a warp serves 32 / TEAM blocks per group and G groups per step, all loads issued first.  One pass
// over A: the values stay in registers between the absmax and the codes.
template <class T, int TEAM, int ITEMS, int G, int MODE>
__device__ __forceinline__ void quantize4_team_body(const Cells4 &cs, const Bounds4 &sb, const T *__restrict__ A,
                                                    float *__restrict__ absmax, uint8_t *__restrict__ out,
                                                    int64_t bs, int64_t n, int64_t nblocks) {
  constexpr int V = Vec<T>::N;
  constexpr int PER_WARP = 32 / TEAM;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t = lane & (TEAM - 1), sub = lane / TEAM;
  const int64_t full_blocks = n / bs;
  const int64_t first = ((int64_t)blockIdx.x * kQWarps + warp) * PER_WARP * G;
  const int64_t stride = (int64_t)gridDim.x * kQWarps * PER_WARP * G;
  const uint32_t zero = sb.zero_code;
  for (int64_t b0 = first; b0 < nblocks; b0 += stride) {  // uniform per warp
    uint4 x[G][ITEMS];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int64_t b = b0 + g * PER_WARP + sub;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) x[g][k] = load_vec<T>(A, b * bs + (int64_t)(t + k * TEAM) * V, n, b < nblocks);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int64_t b = b0 + g * PER_WARP + sub;
      float amax = 0.0f;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) amax = fmax_nan(amax, fabsf(elem<T>(x[g][k], e)));
#pragma unroll
      for (int o = TEAM / 2; o > 0; o >>= 1) amax = fmax_nan(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      if (b < nblocks) {
        if (amax != amax) amax = __int_as_float(0x7fc00000);  // the CPU's NaN absmax
        const bool partial = b >= full_blocks;
        const float am = (amax > 1e-38f || amax != amax) ? amax : 1e-38f;
        if (t == 0) absmax[b] = partial ? am : amax;
        if (!partial) {  // full blocks multiply by 1 / am; every vector is whole
          const float inv = __fdiv_rn(1.0f, am);
#pragma unroll
          for (int k = 0; k < ITEMS; ++k) {
            uint32_t w = 0;
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const float v = __fmul_rn(elem<T>(x[g][k], e), inv);
              if constexpr (MODE == 1) {
                // byte e/2 of w from rb: its byte 0/1 (odd e: low nibble) or 2/3 (even e: high nibble), the
                // second of each pair when v is above the cell's midpoint; zeros elsewhere
                const uint32_t j = cell_of(v);
                const uint32_t pos = 4u * (uint32_t)(e >> 1);
                const uint32_t sel = (0x4444u & ~(0xfu << pos)) | ((e & 1 ? 0u : 2u) << pos);
                w |= __byte_perm(cs.rb[j], 0u, v > cs.m1[j] ? sel + (1u << pos) : sel);
              } else {
                w |= nibble_of<MODE>(cs, sb, v) << (8 * (e >> 1) + 4 * (~e & 1));
              }
            }
            store_packed<V>(out + ((b * bs + (int64_t)(t + k * TEAM) * V) >> 1), w);
          }
        } else {  // the trailing partial block divides by am; past n: the code of 0 (padding)
#pragma unroll
          for (int k = 0; k < ITEMS; ++k) {
            const int64_t off = b * bs + (int64_t)(t + k * TEAM) * V;
            uint32_t w = 0;
#pragma unroll
            for (int e = 0; e < V; ++e) {
              const uint32_t nib = off + e < n ? nibble_of<MODE>(cs, sb, __fdiv_rn(elem<T>(x[g][k], e), am)) : zero;
              w |= nib << (8 * (e >> 1) + 4 * (~e & 1));
            }
            if (off + V <= n) {
              store_packed<V>(out + (off >> 1), w);
            } else {
#pragma unroll
              for (int e = 0; e < V / 2; ++e)
                if (off + 2 * e < n) out[(off >> 1) + e] = (uint8_t)(w >> (8 * e));
            }
          }
        }
      }
    }
  }
}

template <class T, int TEAM, int ITEMS, int G>
__global__ void __launch_bounds__(kQThreads)
quantize4_team(const float *__restrict__ code, const T *__restrict__ A, float *__restrict__ absmax,
               uint8_t *__restrict__ out, int64_t bs, int64_t n, int64_t nblocks) {
  __shared__ Bounds4 sb;
  __shared__ Cells4 cs;
  build_cells(code, &sb, &cs);
  switch (cs.mode) {  // uniform per thread block
    case 1: quantize4_team_body<T, TEAM, ITEMS, G, 1>(cs, sb, A, absmax, out, bs, n, nblocks); break;
    case 2: quantize4_team_body<T, TEAM, ITEMS, G, 2>(cs, sb, A, absmax, out, bs, n, nblocks); break;
    default: quantize4_team_body<T, TEAM, ITEMS, G, 0>(cs, sb, A, absmax, out, bs, n, nblocks); break;
  }
}

template <class T, int TEAM, int ITEMS, int G>
int launch_q4_team(cudaStream_t st, const float *code, const T *A, float *absmax, uint8_t *out, int64_t bs,
                    int64_t n, int64_t nb) {
  const int64_t per_block = (int64_t)kQWarps * (32 / TEAM) * G;
  int per_sm = 0;  // persistent grid: only as many blocks as are resident at once
  if (int s = blocks_per_sm_with_smem(quantize4_team<T, TEAM, ITEMS, G>, kQThreads, 0, &per_sm)) return s;
  int64_t want = (nb + per_block - 1) / per_block;
  const int64_t cap = (int64_t)sm_count() * per_sm;
  const int grid = (int)(want < 1 ? 1 : (want < cap ? want : cap));
  quantize4_team<T, TEAM, ITEMS, G><<<grid, kQThreads, 0, st>>>(code, A, absmax, out, bs, n, nb);
  return OK;
}

// The team kernel for blocksize bs (a power of two, V..256 V elements, A 16-byte and out V/2-byte aligned);
// false where only the generic kernel applies.
template <class T>
bool quantize4_fast(int *status, cudaStream_t st, const float *code, const T *A, float *absmax, uint8_t *out, int64_t bs,
                    int64_t n, int64_t nb) {
  constexpr int V = Vec<T>::N;
  if ((bs & (bs - 1)) || bs < V || !aligned16(A) || (reinterpret_cast<uintptr_t>(out) % (V / 2))) return false;
  switch (bs / V) {
    case 1: *status = launch_q4_team<T, 1, 1, 4>(st, code, A, absmax, out, bs, n, nb); return true;
    case 2: *status = launch_q4_team<T, 2, 1, 4>(st, code, A, absmax, out, bs, n, nb); return true;
    case 4: *status = launch_q4_team<T, 4, 1, 4>(st, code, A, absmax, out, bs, n, nb); return true;
    case 8: *status = launch_q4_team<T, 8, 1, 4>(st, code, A, absmax, out, bs, n, nb); return true;
    case 16: *status = launch_q4_team<T, 16, 1, 4>(st, code, A, absmax, out, bs, n, nb); return true;
    case 32: *status = launch_q4_team<T, 32, 1, 4>(st, code, A, absmax, out, bs, n, nb); return true;
    case 64: *status = launch_q4_team<T, 32, 2, 2>(st, code, A, absmax, out, bs, n, nb); return true;
    case 128: *status = launch_q4_team<T, 32, 4, 1>(st, code, A, absmax, out, bs, n, nb); return true;
    case 256: *status = launch_q4_team<T, 32, 8, 1>(st, code, A, absmax, out, bs, n, nb); return true;
    default: return false;
  }
}

// ---- dequantize ---------------------------------------------------------------------------------
constexpr int kDThreads = 256;


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

inline int log2_exact(int64_t v) {  // log2(v) if v is a power of two, else -1
  if (v <= 0 || (v & (v - 1))) return -1;
  int s = 0;
  while ((int64_t(1) << s) < v) ++s;
  return s;
}

// Tiled fast path (K % 32 == 0, bs % 32 == 0, 16-byte aligned A and B): a thread block computes R output rows;
// thread t owns the 32-weight segments t, t + T, ... of those rows (J = ceil(K/32 / 256) segments per thread,
// T = K/32 / J rounded up to a warp: K = 11008 -> 2 x 192 threads, not 352, so more blocks fit on an SM), so
// its 16-byte loads of the R rows (and their absmax) are all in flight at once, and the 32
// values of x under a segment are read once into registers and serve all R rows and, for M > 1, the weights
// stay in registers across the rows of A.  Per segment and row: p = sum code[q] * x, acc += p * absmax (the
// CPU scales by absmax once per block too; the sums are taken in another order).  A warp reduces its R sums
// with 9 shuffles (a reduce-scatter: lane 4r ends with row r), then the warps' partials are added in shared
// memory.
constexpr int kGemvRows = 8;
constexpr int kGemvMaxThreads = 256;

template <class T>
__device__ __forceinline__ void load_x32(const T *__restrict__ a, float (&x)[32]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float4 v = __ldg(reinterpret_cast<const float4 *>(a) + k);
      x[4 * k] = v.x; x[4 * k + 1] = v.y; x[4 * k + 2] = v.z; x[4 * k + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint4 v = __ldg(reinterpret_cast<const uint4 *>(a) + k);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[8 * k + e] = elem<T>(v, e);
    }
  }
}

// Sum over the warp of v[r] for r < 8; lane l returns the total of row ((l >> 4) & 1) * 4 + ((l >> 3) & 1) * 2
// + ((l >> 2) & 1).
__device__ __forceinline__ float warp_reduce_scatter8(float (&v)[8]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bool up = lane & 16;
    const float send = up ? v[i] : v[i + 4], keep = up ? v[i + 4] : v[i];
    v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 16));
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool up = lane & 8;
    const float send = up ? v[i] : v[i + 2], keep = up ? v[i + 2] : v[i];
    v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 8));
  }
  {
    const bool up = lane & 4;
    const float send = up ? v[0] : v[1], keep = up ? v[1] : v[0];
    v[0] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, 4));
  }
  float r = __fadd_rn(v[0], __shfl_xor_sync(0xffffffffu, v[0], 2));
  return __fadd_rn(r, __shfl_xor_sync(0xffffffffu, r, 1));
}

template <class T>
__global__ void __launch_bounds__(kGemvMaxThreads)
gemv4_tile(const float *__restrict__ code, const uint8_t *__restrict__ B, const float *__restrict__ absmax,
           const T *__restrict__ A, T *__restrict__ out, int64_t M, int64_t N, int64_t K, int64_t bs, int shift) {
  constexpr int R = kGemvRows;
  __shared__ float c[kCode4];
  __shared__ float red[kGemvMaxThreads / 32][R];
  if (threadIdx.x < kCode4) c[threadIdx.x] = code[threadIdx.x];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int64_t segs = K >> 5;
  const int64_t row0 = (int64_t)blockIdx.x * R;
  const uint4 *Bv = reinterpret_cast<const uint4 *>(B);
  const int my_row = ((lane >> 4) & 1) * 4 + ((lane >> 3) & 1) * 2 + ((lane >> 2) & 1);
  for (int64_t m = 0; m < M; ++m) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    uint4 w[R];
    float sc[R];
    auto load = [&](int64_t s, uint4 (&wv)[R], float (&sv)[R]) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t row = row0 + r;
        if (row < N && s < segs) {
          wv[r] = __ldg(Bv + row * segs + s);
          const int64_t e = row * K + (s << 5);
          sv[r] = __ldg(absmax + (shift >= 0 ? (e >> shift) : e / bs));
        } else {
          wv[r] = make_uint4(0u, 0u, 0u, 0u);
          sv[r] = 0.0f;
        }
      }
    };
    load(threadIdx.x, w, sc);
#pragma unroll 1
    for (int64_t s = threadIdx.x; s < segs; s += blockDim.x) {
      float x[32];
      load_x32<T>(A + m * K + (s << 5), x);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float p = 0.0f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint32_t word = q == 0 ? w[r].x : q == 1 ? w[r].y : q == 2 ? w[r].z : w[r].w;
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t byte = (word >> (8 * b)) & 0xffu;
            p = fmaf(c[byte >> 4], x[8 * q + 2 * b], p);
            p = fmaf(c[byte & 15u], x[8 * q + 2 * b + 1], p);
          }
        }
        acc[r] = fmaf(p, sc[r], acc[r]);
      }
      if (s + blockDim.x < segs) load(s + blockDim.x, w, sc);
    }
    const float mine = warp_reduce_scatter8(acc);
    if ((lane & 3) == 0) red[warp][my_row] = mine;
    __syncthreads();
    if (threadIdx.x < R && row0 + threadIdx.x < N) {
      float v = red[0][threadIdx.x];
      for (int w = 1; w < nwarps; ++w) v = __fadd_rn(v, red[w][threadIdx.x]);
      out[m * N + row0 + threadIdx.x] = from_float<T>(v);
    }
    __syncthreads();  // red is reused for the next row of A
  }
}

// Launches gemv4_tile when its conditions hold; false otherwise.
template <class T>
bool gemv4_tile_launch(cudaStream_t st, const float *code, const uint8_t *B, const float *absmax, const T *A, T *out,
                       int64_t M, int64_t N, int64_t K, int64_t bs) {
  if (K % 32 || bs % 32 || !aligned16(A) || !aligned16(B)) return false;
  const int64_t segs = K >> 5;
  const int64_t per_thread = (segs + kGemvMaxThreads - 1) / kGemvMaxThreads;
  const int64_t threads = ((segs + per_thread - 1) / per_thread + 31) / 32 * 32;
  const int64_t blocks = (N + kGemvRows - 1) / kGemvRows;
  if (blocks > 0x7fffffff) return false;
  gemv4_tile<T><<<(unsigned)blocks, (unsigned)threads, 0, st>>>(code, B, absmax, A, out, M, N, K, bs, log2_exact(bs));
  return true;
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
  int st = OK;
  if (quantize4_fast<T>(&st, c.cu_stream(), a.code, a.A, a.absmax, a.out, bs, n, nb)) {
    if (st) return st;
  } else {
    const int grid = grid_for(nb, kQThreads / 32, 8);
    quantize4<T><<<grid, kQThreads, 0, c.cu_stream()>>>(a.code, a.A, a.absmax, a.out, bs, n, nb);
  }
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
  if (gemv4_tile_launch<T>(st, ga.code, b, ga.absmax, a, o, M, N, K, bs))
    ;
  else if (K % 32 == 0 && bs % 32 == 0 && aligned16(a) && aligned16(b))
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
    if (gemv4_tile_launch<T>(st, a.code, a.B, am, a.A, a.out, M, N, K, bs))
      ;
    else if (K % 32 == 0 && bs % 32 == 0 && aligned16(a.A) && aligned16(a.B))
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
