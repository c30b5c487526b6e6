// optim.cu -- fused optimizer updates with 32-bit or blockwise 8-bit state on CUDA: the same entry
// points, checks, in-place semantics and status output as csrc/cpu/optim.cpp (read its header for
// the update rules, which follow upstream bitsandbytes 0.50's CPU implementation).
//
// Numerics: the update rule itself is optim_rule.h, the same source the CPU library compiles (constants
// computed on the host in double and rounded to float once, OptConsts; one element's update,
// update_elem / update_elem8; the max_unorm step).  The target is built with -fmad=false, so nothing is
// contracted; sqrtf and division are IEEE-rounded without --use_fast_math.  p, state and absmax bytes
// therefore equal the CPU library's.  The LAMB/LARS path (max_unorm > 0) sums squares in double like the
// CPU, but in a different order (per-warp partials + atomics), so the norms can differ in the last bits of
// a double; they only reach the result after rounding to float.
//
// 8-bit blockwise state: one 256-thread block per 256-element quantization block (persistent grid):
// dequantize code[q] * absmax, update, block absmax, requantize.  Requantization uses the 255
// thresholds of blockwise.cu's table construction (T[c] = first grid bin above the running max of
// the code's midpoints) kept in shared memory, and a binary search of the element's grid bin among
// them -- the CPU's 65536-entry lookup table without building it.
//
// In place: p, state1, state2, absmax1, absmax2 (and unorm_vec) are updated in the caller's device
// buffers; the declared output is an int32[1] status, set to 0 on the stream.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "checks/optim.h"
#include "cuda/aot_cuda.cuh"
#include "cuda/code_lut.cuh"
#include "cuda/vec_io.cuh"
#include "optim_rule.h"

namespace bnb_ms {
namespace cuda {
namespace {

constexpr int64_t kBlock = checks::kOptBlock;
constexpr int kCodeN = (int)checks::kCodeSize;
constexpr int kLutN = kLut;

__device__ __forceinline__ void warp_add_double(double v, double *dst) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0 && v != 0.0) atomicAdd(dst, v);
}

// ---- 32-bit state -------------------------------------------------------------------------------
template <class T, Opt O, bool UNORM>
__global__ void __launch_bounds__(256)
opt32(OptConsts k, const T *__restrict__ g, T *__restrict__ p, float *__restrict__ s1, float *__restrict__ s2,
      float *__restrict__ upd, double *__restrict__ usum, int64_t n) {
  double acc = 0.0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float pv = to_float(p[i]);
    float m = s1[i], mb = 0.0f, v = 0.0f, u = 0.0f;
    if (O == ADEMAMIX) mb = s1[n + i];
    if (two_state(O)) v = s2[i];
    update_elem<O, false, UNORM>(k, to_float(g[i]), pv, m, mb, v, &u);
    s1[i] = m;
    if (O == ADEMAMIX) s1[n + i] = mb;
    if (two_state(O)) s2[i] = v;
    if (UNORM) {
      upd[i] = u;
      const double d = (double)u;
      acc += d * d;
    } else {
      p[i] = from_float<T>(pv);
    }
  }
  if (UNORM) warp_add_double(acc, usum);
}

template <class T>
__global__ void __launch_bounds__(256) sum_squares(const T *__restrict__ x, double *__restrict__ out, int64_t n) {
  double acc = 0.0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const double v = (double)to_float(x[i]);
    acc += v * v;
  }
  warp_add_double(acc, out);
}

// sums[0] = sum p^2, sums[1] = sum upd^2 -> *coef (float), *unorm_vec
__global__ void unorm_finalize(const double *sums, float *coef, float *unorm_vec, double max_unorm,
                               double param_norm, double factor) {
  const double pn = param_norm > 0.0 ? param_norm : sqrt(sums[0]);
  const double unorm = sqrt(sums[1]);
  if (unorm_vec) *unorm_vec = (float)unorm;
  *coef = unorm_coef(factor, unorm, max_unorm, pn);
}

template <class T, Opt O>
__global__ void __launch_bounds__(256)
unorm_apply(OptConsts k, const float *__restrict__ coefp, const float *__restrict__ upd, T *__restrict__ p, int64_t n) {
  const float coef = *coefp;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    p[i] = from_float<T>(unorm_step<O>(k, coef, upd[i], to_float(p[i])));
}

inline int grid_for(int64_t work, int threads, int per_sm) {
  const int64_t want = (work + threads - 1) / threads;
  const int64_t cap = (int64_t)sm_count() * per_sm;
  return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

// LAMB / LARS (max_unorm > 0; Adam, Momentum, RMSprop): the raw updates and their norm, then the scaled step.
template <class T, Opt O>
int update32_unorm(cudaStream_t st, const OptConsts &k, const Hyper &h, int grid, const T *g, T *p, float *s1,
                   float *s2, float *unorm_vec, double max_unorm, double param_norm, int64_t n) {
  // scratch = [sum p^2, sum upd^2 (doubles)][coef][pad][upd (n floats)]
  char *scratch = nullptr;
  if (cudaMallocAsync(reinterpret_cast<void **>(&scratch), 32 + (size_t)n * 4, st) != cudaSuccess) {
    (void)cudaGetLastError();
    return E_DEVICE;
  }
  double *sums = reinterpret_cast<double *>(scratch);
  float *coef = reinterpret_cast<float *>(scratch + 16);
  float *upd = reinterpret_cast<float *>(scratch + 32);
  int rc = OK;
  if (cudaMemsetAsync(scratch, 0, 32, st) != cudaSuccess) rc = E_DEVICE;
  if (rc == OK) {
    if (param_norm <= 0.0) sum_squares<T><<<grid, 256, 0, st>>>(p, sums, n);
    opt32<T, O, true><<<grid, 256, 0, st>>>(k, g, p, s1, s2, upd, sums + 1, n);
    unorm_finalize<<<1, 1, 0, st>>>(sums, coef, unorm_vec, max_unorm, param_norm, unorm_factor<O>(h));
    unorm_apply<T, O><<<grid, 256, 0, st>>>(k, coef, upd, p, n);
    rc = launch_status();
  }
  if (cudaFreeAsync(scratch, st) != cudaSuccess) {
    (void)cudaGetLastError();
    rc = E_DEVICE;
  }
  return rc;
}

template <class T, Opt O>
int update32(cudaStream_t st, const Hyper &h, const T *g, T *p, float *s1, float *s2, float *unorm_vec,
             double max_unorm, double param_norm, int64_t n) {
  const OptConsts k = opt_consts(h);
  const int grid = grid_for(n, 256, 8);
  if constexpr (has_unorm_path<O>()) {
    if (max_unorm > 0.0) return update32_unorm<T, O>(st, k, h, grid, g, p, s1, s2, unorm_vec, max_unorm, param_norm, n);
  }
  opt32<T, O, false><<<grid, 256, 0, st>>>(k, g, p, s1, s2, nullptr, nullptr, n);
  return launch_status();
}

// ---- 8-bit blockwise state: generic kernel (any alignment) -----------------------------------------
// thr[c] (c < 255) = first grid bin i with v(i) > max(mid[0..c]) (NaN mid = +inf); the CPU table's
// entry for bin i is #{c : thr[c] <= i}.  blockDim.x == 256; ends with __syncthreads().
__device__ void build_thresholds(const float *__restrict__ code, float *pm, int *thr) {
  const int t = threadIdx.x;
  if (t < kCodeN - 1) {
    const float m = __fmul_rn(0.5f, __fadd_rn(code[t], code[t + 1]));
    pm[t] = (m != m) ? __int_as_float(0x7f800000) : m;
  } else {
    pm[t] = __int_as_float(0x7f800000);
  }
  __syncthreads();
  for (int off = 1; off < kCodeN; off <<= 1) {
    const float v = (t >= off) ? fmaxf(pm[t], pm[t - off]) : pm[t];
    __syncthreads();
    pm[t] = v;
    __syncthreads();
  }
  if (t < kCodeN - 1) {
    const float p = pm[t];
    int lo = 0, hi = kLutN;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (grid_value(mid) > p) hi = mid; else lo = mid + 1;
    }
    thr[t] = lo;
  }
  __syncthreads();
}

__device__ __forceinline__ uint8_t quant_thr(const int *thr, float x) {
  const int i = (int)grid_index(x);
  int lo = 0, hi = kCodeN - 1;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (thr[mid] <= i) lo = mid + 1; else hi = mid;
  }
  return (uint8_t)lo;
}

// max over the 256 threads (NaN ignored, as std::max(amax, fabs(v)) on the CPU)
__device__ __forceinline__ float block_absmax(float v, float *red) {
  v = fabsf(v);
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.0f;
#pragma unroll
  for (int w = 0; w < 8; ++w) r = fmaxf(r, red[w]);
  return r;
}


template <class T, Opt O>
__global__ void __launch_bounds__(256)
opt8(OptConsts k, const T *__restrict__ g, T *__restrict__ p, uint8_t *__restrict__ s1, uint8_t *__restrict__ s2,
     float *__restrict__ a1, float *__restrict__ a2, const float *__restrict__ q1, const float *__restrict__ q2,
     int64_t n, int64_t nb) {
  __shared__ float pm[kCodeN];
  __shared__ int thr1[kCodeN], thr2[kCodeN];
  __shared__ float c1[kCodeN], c2[kCodeN];
  __shared__ float red[2][3][8];
  const int t = threadIdx.x;
  build_thresholds(q1, pm, thr1);
  if (two_state(O)) build_thresholds(q2, pm, thr2);
  c1[t] = q1[t];
  if (two_state(O)) c2[t] = q2[t];
  __syncthreads();
  int parity = 0;
  for (int64_t b = blockIdx.x; b < nb; b += gridDim.x, parity ^= 1) {
    const int64_t i = b * kBlock + t;
    const bool valid = i < n;
    float m = 0.0f, mb = 0.0f, v = 0.0f, pv = 0.0f;
    const float sc1 = a1[b];
    float scb = 0.0f, sc2 = 0.0f;
    if (O == ADEMAMIX) scb = a1[nb + b];
    if (two_state(O)) sc2 = a2[b];
    if (valid) {
      m = __fmul_rn(c1[s1[i]], sc1);
      if (O == ADEMAMIX) mb = __fmul_rn(c1[s1[n + i]], scb);
      if (two_state(O)) v = __fmul_rn(c2[s2[i]], sc2);
      pv = to_float(p[i]);
      update_elem8<O>(k, to_float(g[i]), pv, m, mb, v);
      p[i] = from_float<T>(pv);
    } else {
      m = mb = v = 0.0f;
    }
    // red[parity]: the next iteration's reductions use the other buffer, so one barrier suffices
    const float am1 = block_absmax(m, red[parity][0]);
    float amb = 0.0f, am2 = 0.0f;
    if (O == ADEMAMIX) amb = block_absmax(mb, red[parity][1]);
    if (two_state(O)) am2 = block_absmax(v, red[parity][2]);
    if (t == 0) {
      a1[b] = am1;
      if (O == ADEMAMIX) a1[nb + b] = amb;
      if (two_state(O)) a2[b] = am2;
    }
    if (valid) {
      s1[i] = am1 == 0.0f ? 0 : quant_thr(thr1, quant_block_scaled(m, quant_block_scale(am1)));
      if (O == ADEMAMIX) s1[n + i] = amb == 0.0f ? 0 : quant_thr(thr1, quant_block_scaled(mb, quant_block_scale(amb)));
      if (two_state(O)) s2[i] = am2 == 0.0f ? 0 : quant_thr(thr2, quant_block_scaled(v, quant_block_scale(am2)));
    }
  }
}

// ---- 8-bit blockwise state: fast kernel -----------------------------------------------------------
// One warp per 256-element quantization block, 8 consecutive elements per lane (16-byte loads and stores
// of g and p, 8-byte ones of the state codes), the absmax by warp shuffles (no block barrier), and the
// requantization through the 64 KiB grid->code table of each state's code (cuda/code_lut.cuh, built once
// per thread block of the persistent grid): one shared-memory lookup per value instead of an 8-step binary
// search over the thresholds.  Same operations per element as opt8, so the same bytes.
constexpr int kOpt8Threads = 512;
constexpr int kOpt8Warps = kOpt8Threads / 32;

template <class T>
__device__ __forceinline__ void load8(const T *__restrict__ src, int64_t i0, int64_t n, uint32_t (&raw)[8]) {
  // raw bits of src[i0 .. i0 + 8) (0 past n)
  if (i0 + 8 <= n) {
    if constexpr (sizeof(T) == 4) {
      const uint4 a = __ldg(reinterpret_cast<const uint4 *>(src + i0)), b = __ldg(reinterpret_cast<const uint4 *>(src + i0) + 1);
      raw[0] = a.x; raw[1] = a.y; raw[2] = a.z; raw[3] = a.w; raw[4] = b.x; raw[5] = b.y; raw[6] = b.z; raw[7] = b.w;
    } else {
      const uint4 a = __ldg(reinterpret_cast<const uint4 *>(src + i0));
      const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) raw[e] = (w[e >> 1] >> (16 * (e & 1))) & 0xffffu;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      raw[e] = 0;
      if (i0 + e < n) {
        if constexpr (sizeof(T) == 4) raw[e] = __float_as_uint(__ldg(reinterpret_cast<const float *>(src) + i0 + e));
        else raw[e] = __ldg(reinterpret_cast<const unsigned short *>(src) + i0 + e);
      }
    }
  }
}

template <class T>
__device__ __forceinline__ float raw_to_float(uint32_t r) {
  if constexpr (sizeof(T) == 4) return __uint_as_float(r);
  else if constexpr (std::is_same<T, __half>::value) return __half2float(__ushort_as_half((unsigned short)r));
  else return __uint_as_float(r << 16);
}

template <class T>
__device__ __forceinline__ uint32_t float_to_raw(float v) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(v);
  } else {
    const T h = from_float<T>(v);
    unsigned short u;
    memcpy(&u, &h, 2);
    return u;
  }
}

template <class T>
__device__ __forceinline__ void store8(T *__restrict__ dst, int64_t i0, int64_t n, const uint32_t (&raw)[8]) {
  if (i0 + 8 <= n) {
    if constexpr (sizeof(T) == 4) {
      reinterpret_cast<uint4 *>(dst + i0)[0] = make_uint4(raw[0], raw[1], raw[2], raw[3]);
      reinterpret_cast<uint4 *>(dst + i0)[1] = make_uint4(raw[4], raw[5], raw[6], raw[7]);
    } else {
      *reinterpret_cast<uint4 *>(dst + i0) = make_uint4(raw[0] | (raw[1] << 16), raw[2] | (raw[3] << 16),
                                                        raw[4] | (raw[5] << 16), raw[6] | (raw[7] << 16));
    }
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (i0 + e < n) {
        if constexpr (sizeof(T) == 4) reinterpret_cast<uint32_t *>(dst)[i0 + e] = raw[e];
        else reinterpret_cast<unsigned short *>(dst)[i0 + e] = (unsigned short)raw[e];
      }
    }
  }
}

__device__ __forceinline__ uint2 load_codes8(const uint8_t *__restrict__ s, int64_t i0, int64_t n) {
  if (i0 + 8 <= n) return __ldg(reinterpret_cast<const uint2 *>(s + i0));
  uint32_t w[2] = {0u, 0u};
  for (int e = 0; e < 8; ++e)
    if (i0 + e < n) w[e >> 2] |= (uint32_t)s[i0 + e] << (8 * (e & 3));
  return make_uint2(w[0], w[1]);
}

__device__ __forceinline__ void store_codes8(uint8_t *__restrict__ s, int64_t i0, int64_t n, const uint32_t (&c)[8]) {
  const uint2 w = make_uint2(c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24), c[4] | (c[5] << 8) | (c[6] << 16) | (c[7] << 24));
  if (i0 + 8 <= n) {
    *reinterpret_cast<uint2 *>(s + i0) = w;
  } else {
    for (int e = 0; e < 8; ++e)
      if (i0 + e < n) s[i0 + e] = (uint8_t)((e < 4 ? w.x : w.y) >> (8 * (e & 3)));
  }
}

__device__ __forceinline__ float warp_absmax8(const float (&v)[8]) {  // NaN ignored, as the CPU's std::max
  float a = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(v[e]));
#pragma unroll
  for (int o = 16; o; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  return a;
}

__device__ __forceinline__ void requant8(const uint8_t *lut, const float (&v)[8], float am, uint32_t (&c)[8]) {
  const QuantScale k = quant_block_scale(am);
  if (am != 0.0f && k.pre == 1.0f) {  // uniform per warp; x * 1 == x, so the usual block skips that multiply
#pragma unroll
    for (int e = 0; e < 8; ++e) c[e] = lut[grid_index(__fmul_rn(v[e], k.inv))];
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) c[e] = am == 0.0f ? 0u : lut[grid_index(quant_block_scaled(v[e], k))];
  }
}

template <class T, Opt O>
__global__ void __launch_bounds__(kOpt8Threads)
opt8_warp(OptConsts k, const T *__restrict__ g, T *__restrict__ p, uint8_t *__restrict__ s1, uint8_t *__restrict__ s2,
          float *__restrict__ a1, float *__restrict__ a2, const float *__restrict__ q1, const float *__restrict__ q2,
          int64_t n, int64_t nb) {
  extern __shared__ __align__(16) uint8_t luts[];  // state1's table, then state2's (two-state optimizers)
  __shared__ float c1[kCodeN], c2[kCodeN];
  build_lut(q1, luts);
  __syncthreads();
  if (two_state(O)) {
    build_lut(q2, luts + kLut);
    __syncthreads();
  }
  for (int i = threadIdx.x; i < kCodeN; i += blockDim.x) {
    c1[i] = q1[i];
    if (two_state(O)) c2[i] = q2[i];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  for (int64_t b = (int64_t)blockIdx.x * kOpt8Warps + (threadIdx.x >> 5); b < nb; b += (int64_t)gridDim.x * kOpt8Warps) {
    const int64_t i0 = b * kBlock + 8 * lane;
    uint32_t graw[8], praw[8];
    load8<T>(g, i0, n, graw);
    load8<T>(p, i0, n, praw);
    const uint2 q1w = load_codes8(s1, i0, n);
    uint2 qbw = make_uint2(0u, 0u), q2w = make_uint2(0u, 0u);
    if (O == ADEMAMIX) qbw = load_codes8(s1 + n, i0, n);
    if (two_state(O)) q2w = load_codes8(s2, i0, n);
    const float sc1 = a1[b];
    float scb = 0.0f, sc2 = 0.0f;
    if (O == ADEMAMIX) scb = a1[nb + b];
    if (two_state(O)) sc2 = a2[b];
    float m[8], mb[8], v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      m[e] = mb[e] = v[e] = 0.0f;
      if (i0 + e < n) {
        const int sh = 8 * (e & 3);
        m[e] = __fmul_rn(c1[((e < 4 ? q1w.x : q1w.y) >> sh) & 0xffu], sc1);
        if (O == ADEMAMIX) mb[e] = __fmul_rn(c1[((e < 4 ? qbw.x : qbw.y) >> sh) & 0xffu], scb);
        if (two_state(O)) v[e] = __fmul_rn(c2[((e < 4 ? q2w.x : q2w.y) >> sh) & 0xffu], sc2);
        float pv = raw_to_float<T>(praw[e]);
        update_elem8<O>(k, raw_to_float<T>(graw[e]), pv, m[e], mb[e], v[e]);
        praw[e] = float_to_raw<T>(pv);
      }
    }
    store8<T>(p, i0, n, praw);
    uint32_t c[8];
    const float am1 = warp_absmax8(m);
    requant8(luts, m, am1, c);
    store_codes8(s1, i0, n, c);
    if (lane == 0) a1[b] = am1;
    if (O == ADEMAMIX) {
      const float amb = warp_absmax8(mb);
      requant8(luts, mb, amb, c);
      store_codes8(s1 + n, i0, n, c);
      if (lane == 0) a1[nb + b] = amb;
    }
    if (two_state(O)) {
      const float am2 = warp_absmax8(v);
      requant8(luts + kLut, v, am2, c);
      store_codes8(s2, i0, n, c);
      if (lane == 0) a2[b] = am2;
    }
  }
}

template <class T, Opt O>
int update8(cudaStream_t st, const Hyper &h, const T *g, T *p, uint8_t *s1, uint8_t *s2, float *a1, float *a2,
            const float *q1, const float *q2, int64_t n) {
  const OptConsts k = opt_consts(h);
  const int64_t nb = (n + kBlock - 1) / kBlock;
  const bool fast = aligned16(g) && aligned16(p) && (reinterpret_cast<uintptr_t>(s1) & 7u) == 0 &&
                    (!two_state(O) || (reinterpret_cast<uintptr_t>(s2) & 7u) == 0) && (O != ADEMAMIX || n % 8 == 0);
  if (fast) {
    const size_t smem = (two_state(O) ? 2 : 1) * (size_t)kLut;
    int per_sm = 0;
    if (int s = blocks_per_sm_with_smem(opt8_warp<T, O>, kOpt8Threads, smem, &per_sm)) return s;
    const int64_t want = (nb + kOpt8Warps - 1) / kOpt8Warps, cap = (int64_t)sm_count() * per_sm;
    const int grid = (int)(want < cap ? want : cap);
    opt8_warp<T, O><<<grid, kOpt8Threads, smem, st>>>(k, g, p, s1, s2, a1, a2, q1, q2, n, nb);
    return launch_status();
  }
  const int64_t cap = (int64_t)sm_count() * 8;
  const int grid = (int)(nb < cap ? nb : cap);
  opt8<T, O><<<grid, 256, 0, st>>>(k, g, p, s1, s2, a1, a2, q1, q2, n, nb);
  return launch_status();
}

// ---- entry points: checks in checks/optim.h (shared with the CPU library) -----------------------
// The status output is the optimizers' has_error (aot.h): zeroed once the call is well-formed; a failure on
// well-formed input (scratch allocation, a launch, or one forced by bnb_ms_force_error("optim", code)) is
// written there.
inline int zero_status(cudaStream_t st, int32_t *status) { return status ? write_has_error(st, status, OK) : OK; }
inline int report_status(cudaStream_t st, int32_t *status, int code) {
  return code == OK ? (int)OK : write_has_error(st, status, code);
}

template <class H, Opt O>
int entry32(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Optimizer32<T> a;
  if (int s = checks::optimizer_32bit<T, O>(c, &a, [&] { return zero_status(c.cu_stream(), a.status); })) return s;
  if (int f = forced_error("optim")) return report_status(c.cu_stream(), a.status, f);
  if (a.empty) return OK;
  return report_status(c.cu_stream(), a.status,
                       update32<T, O>(c.cu_stream(), a.h, a.g, a.p, a.s1, a.s2, a.unorm, a.max_unorm, a.param_norm, a.n));
}

template <class H, Opt O>
int entry8(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Optimizer8<T> a;
  if (int s = checks::optimizer_8bit_blockwise<T, O>(c, &a, [&] { return zero_status(c.cu_stream(), a.status); }))
    return s;
  if (int f = forced_error("optim")) return report_status(c.cu_stream(), a.status, f);
  if (a.empty) return OK;
  return report_status(c.cu_stream(), a.status,
                       update8<T, O>(c.cu_stream(), a.h, a.g, a.p, a.s1, a.s2, a.a1, a.a2, a.q1, a.q2, a.n));
}

}  // namespace
}  // namespace cuda
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;

BNB_MS_ENTRY(cadam32bit_grad_fp32, bnb_ms::cuda::entry32<float, bnb_ms::ADAM>)
BNB_MS_ENTRY(cadam32bit_grad_fp16, bnb_ms::cuda::entry32<fp16_t, bnb_ms::ADAM>)
BNB_MS_ENTRY(cadam32bit_grad_bf16, bnb_ms::cuda::entry32<bf16_t, bnb_ms::ADAM>)
BNB_MS_ENTRY(cademamix32bit_grad_fp32, bnb_ms::cuda::entry32<float, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cademamix32bit_grad_fp16, bnb_ms::cuda::entry32<fp16_t, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cademamix32bit_grad_bf16, bnb_ms::cuda::entry32<bf16_t, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(clion32bit_grad_fp32, bnb_ms::cuda::entry32<float, bnb_ms::LION>)
BNB_MS_ENTRY(clion32bit_grad_fp16, bnb_ms::cuda::entry32<fp16_t, bnb_ms::LION>)
BNB_MS_ENTRY(clion32bit_grad_bf16, bnb_ms::cuda::entry32<bf16_t, bnb_ms::LION>)
BNB_MS_ENTRY(cmomentum32bit_grad_32, bnb_ms::cuda::entry32<float, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(cmomentum32bit_grad_16, bnb_ms::cuda::entry32<fp16_t, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(cmomentum32bit_grad_bf16, bnb_ms::cuda::entry32<bf16_t, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(crmsprop32bit_grad_32, bnb_ms::cuda::entry32<float, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(crmsprop32bit_grad_16, bnb_ms::cuda::entry32<fp16_t, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(crmsprop32bit_grad_bf16, bnb_ms::cuda::entry32<bf16_t, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(cadagrad32bit_grad_32, bnb_ms::cuda::entry32<float, bnb_ms::ADAGRAD>)
BNB_MS_ENTRY(cadagrad32bit_grad_16, bnb_ms::cuda::entry32<fp16_t, bnb_ms::ADAGRAD>)
BNB_MS_ENTRY(cadagrad32bit_grad_bf16, bnb_ms::cuda::entry32<bf16_t, bnb_ms::ADAGRAD>)

BNB_MS_ENTRY(cadam_8bit_blockwise_grad_fp32, bnb_ms::cuda::entry8<float, bnb_ms::ADAM>)
BNB_MS_ENTRY(cadam_8bit_blockwise_grad_fp16, bnb_ms::cuda::entry8<fp16_t, bnb_ms::ADAM>)
BNB_MS_ENTRY(cadam_8bit_blockwise_grad_bf16, bnb_ms::cuda::entry8<bf16_t, bnb_ms::ADAM>)
BNB_MS_ENTRY(cademamix_8bit_blockwise_grad_fp32, bnb_ms::cuda::entry8<float, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cademamix_8bit_blockwise_grad_fp16, bnb_ms::cuda::entry8<fp16_t, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cademamix_8bit_blockwise_grad_bf16, bnb_ms::cuda::entry8<bf16_t, bnb_ms::ADEMAMIX>)
BNB_MS_ENTRY(cmomentum_8bit_blockwise_grad_fp32, bnb_ms::cuda::entry8<float, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(cmomentum_8bit_blockwise_grad_fp16, bnb_ms::cuda::entry8<fp16_t, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(cmomentum_8bit_blockwise_grad_bf16, bnb_ms::cuda::entry8<bf16_t, bnb_ms::MOMENTUM>)
BNB_MS_ENTRY(crmsprop_8bit_blockwise_grad_fp32, bnb_ms::cuda::entry8<float, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(crmsprop_8bit_blockwise_grad_fp16, bnb_ms::cuda::entry8<fp16_t, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(crmsprop_8bit_blockwise_grad_bf16, bnb_ms::cuda::entry8<bf16_t, bnb_ms::RMSPROP>)
BNB_MS_ENTRY(clion_8bit_blockwise_grad_fp32, bnb_ms::cuda::entry8<float, bnb_ms::LION>)
BNB_MS_ENTRY(clion_8bit_blockwise_grad_fp16, bnb_ms::cuda::entry8<fp16_t, bnb_ms::LION>)
BNB_MS_ENTRY(clion_8bit_blockwise_grad_bf16, bnb_ms::cuda::entry8<bf16_t, bnb_ms::LION>)
BNB_MS_ENTRY(cadagrad_8bit_blockwise_grad_fp32, bnb_ms::cuda::entry8<float, bnb_ms::ADAGRAD>)
BNB_MS_ENTRY(cadagrad_8bit_blockwise_grad_fp16, bnb_ms::cuda::entry8<fp16_t, bnb_ms::ADAGRAD>)
BNB_MS_ENTRY(cadagrad_8bit_blockwise_grad_bf16, bnb_ms::cuda::entry8<bf16_t, bnb_ms::ADAGRAD>)
