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

#include "checks/optim.h"
#include "cuda/aot_cuda.cuh"
#include "optim_rule.h"

namespace bnb_ms {
namespace cuda {
namespace {

constexpr int64_t kBlock = checks::kOptBlock;
constexpr int kCodeN = (int)checks::kCodeSize;
constexpr int kLutN = 65536;

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

// ---- 8-bit blockwise state ----------------------------------------------------------------------
__device__ __forceinline__ float grid_value(int i) {  // -1 + (2i)/65535, as the CPU computes it
  return __fadd_rn(-1.0f, __fdiv_rn(2.0f * (float)i, (float)(kLutN - 1)));
}

__device__ __forceinline__ uint32_t grid_index(float v) {
  v = fminf(1.0f, fmaxf(-1.0f, v));  // NaN -> -1, as std::min(1, std::max(-1, v))
  const float t = __fmul_rn(__fadd_rn(v, 1.0f), 0.5f);
  return __float2uint_rz(__fmaf_rn(t, (float)(kLutN - 1), 0.5f));
}

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
      if (update_elem8<O>(k, to_float(g[i]), pv, m, mb, v)) p[i] = from_float<T>(pv);
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

template <class T, Opt O>
int update8(cudaStream_t st, const Hyper &h, const T *g, T *p, uint8_t *s1, uint8_t *s2, float *a1, float *a2,
            const float *q1, const float *q2, int64_t n) {
  const OptConsts k = opt_consts(h);
  const int64_t nb = (n + kBlock - 1) / kBlock;
  const int64_t cap = (int64_t)sm_count() * 8;
  const int grid = (int)(nb < cap ? nb : cap);
  opt8<T, O><<<grid, 256, 0, st>>>(k, g, p, s1, s2, a1, a2, q1, q2, n, nb);
  return launch_status();
}

// ---- entry points: checks in checks/optim.h (shared with the CPU library) -----------------------
int zero_status(cudaStream_t st, int32_t *status) {
  if (!status) return OK;
  if (cudaMemsetAsync(status, 0, sizeof(int32_t), st) != cudaSuccess) {
    (void)cudaGetLastError();
    return E_DEVICE;
  }
  return OK;
}

template <class H, Opt O>
int entry32(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Optimizer32<T> a;
  if (int s = checks::optimizer_32bit<T, O>(c, &a, [&] { return zero_status(c.cu_stream(), a.status); })) return s;
  if (a.empty) return OK;
  return update32<T, O>(c.cu_stream(), a.h, a.g, a.p, a.s1, a.s2, a.unorm, a.max_unorm, a.param_norm, a.n);
}

template <class H, Opt O>
int entry8(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Optimizer8<T> a;
  if (int s = checks::optimizer_8bit_blockwise<T, O>(c, &a, [&] { return zero_status(c.cu_stream(), a.status); }))
    return s;
  if (a.empty) return OK;
  return update8<T, O>(c.cu_stream(), a.h, a.g, a.p, a.s1, a.s2, a.a1, a.a2, a.q1, a.q2, a.n);
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
