// optim.cu -- fused optimizer updates with 32-bit or blockwise 8-bit state on CUDA: the same entry
// points, checks, in-place semantics and status output as csrc/cpu/optim.cpp (read its header for
// the update rules, which follow upstream bitsandbytes 0.50's CPU implementation).
//
// Numerics: the hyper-parameter constants are computed on the host exactly as the CPU library does
// (double, rounded to float once) and passed by value; each element's update is the CPU's sequence
// of float operations (the target is built with -fmad=false, so nothing is contracted; sqrtf and
// division are IEEE-rounded without --use_fast_math).  p, state and absmax bytes therefore equal the
// CPU library's.  The LAMB/LARS path (max_unorm > 0) sums squares in double like the CPU, but in a
// different order (per-warp partials + atomics), so the norms can differ in the last bits of a
// double; they only reach the result after rounding to float.
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

namespace bnb_ms {
namespace cuda {
namespace {

constexpr int64_t kBlock = checks::kOptBlock;
constexpr int kCodeN = (int)checks::kCodeSize;
constexpr int kLutN = 65536;

// Constants of the update, computed on the host as optim.cpp's K does.
struct Kd {
  float b1, omb1, b2, omb2, b3, omb3, alpha, eps, gnorm, decay, wd, neg_lr;
  float c1, c2, eps_c2, neg_lr_c1, adam_step32;
  bool has_wd, first;
};

Kd make_k(const Hyper &h) {
  Kd k;
  k.b1 = (float)h.beta1; k.omb1 = (float)(1.0 - h.beta1);
  k.b2 = (float)h.beta2; k.omb2 = (float)(1.0 - h.beta2);
  k.b3 = (float)h.beta3; k.omb3 = (float)(1.0 - h.beta3);
  k.alpha = (float)h.alpha; k.eps = (float)h.eps; k.gnorm = (float)h.gnorm;
  k.has_wd = h.wd > 0.0; k.wd = (float)h.wd; k.decay = (float)(1.0 - h.lr * h.wd);
  k.neg_lr = (float)(-h.lr);
  const double dc1 = 1.0 - std::pow(h.beta1, (double)h.step);
  const double dc2 = std::sqrt(1.0 - std::pow(h.beta2, (double)h.step));
  k.c1 = (float)dc1; k.c2 = (float)dc2;
  k.eps_c2 = (float)(h.eps * dc2);
  k.neg_lr_c1 = (float)(-h.lr / dc1);
  k.adam_step32 = (float)(-h.lr * dc2 / dc1);
  k.first = h.step == 1;
  return k;
}

// One element: optim.cpp's update_elem, operation for operation.
template <Opt O, bool Q8, bool UNORM>
__device__ __forceinline__ void update_elem(const Kd &k, float g, float &p, float &s1, float &s1b, float &s2,
                                            float *upd) {
  g = g * k.gnorm;
  if (O == ADAM) {
    s1 = s1 * k.b1 + k.omb1 * g;
    s2 = s2 * k.b2 + k.omb2 * g * g;
    if (Q8) {
      const float denom = sqrtf(s2) / k.c2 + k.eps;
      if (k.has_wd) p = p * k.decay;
      p = p + k.neg_lr_c1 * (s1 / denom);
    } else {
      const float u = s1 / (sqrtf(s2) + k.eps_c2);
      if (UNORM) { *upd = u; return; }
      if (k.has_wd) p = p * k.decay;
      p = p + k.adam_step32 * u;
    }
  } else if (O == ADEMAMIX) {
    s1 = s1 * k.b1 + k.omb1 * g;
    s1b = s1b * k.b3 + k.omb3 * g;
    s2 = s2 * k.b2 + k.omb2 * g * g;
    const float u = (s1 / k.c1 + k.alpha * s1b) / (sqrtf(s2) / k.c2 + k.eps);
    if (k.has_wd) p = p * k.decay;
    p = p + k.neg_lr * u;
  } else if (O == MOMENTUM) {
    if (Q8 || k.has_wd) g = g + k.wd * p;
    s1 = k.first ? g : s1 * k.b1 + g;
    if (UNORM) { *upd = s1; return; }
    p = p + k.neg_lr * s1;
  } else if (O == LION) {
    if (k.has_wd) p = p * k.decay;
    const float u = s1 * k.b1 + k.omb1 * g;
    const float sg = u > 0.0f ? 1.0f : (u < 0.0f ? -1.0f : (u == u ? 0.0f : u));  // NaN stays NaN
    p = p + k.neg_lr * sg;
    s1 = s1 * k.b2 + k.omb2 * g;
  } else if (O == RMSPROP) {
    if (Q8 || k.has_wd) g = g + k.wd * p;
    s1 = s1 * k.b1 + k.omb1 * g * g;
    const float u = g / (sqrtf(s1) + k.eps);
    if (UNORM) { *upd = u; return; }
    p = p + k.neg_lr * u;
  } else {  // ADAGRAD
    if (Q8 || k.has_wd) g = g + k.wd * p;
    s1 = s1 + g * g;
    p = p + k.neg_lr * (g / (sqrtf(s1) + k.eps));
  }
}

__device__ __forceinline__ void warp_add_double(double v, double *dst) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0 && v != 0.0) atomicAdd(dst, v);
}

// ---- 32-bit state -------------------------------------------------------------------------------
template <class T, Opt O, bool UNORM>
__global__ void __launch_bounds__(256)
opt32(Kd k, const T *__restrict__ g, T *__restrict__ p, float *__restrict__ s1, float *__restrict__ s2,
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
  const double scale = unorm > max_unorm * pn ? (max_unorm * pn) / unorm : 1.0;
  *coef = (float)(factor * scale);
}

template <class T>
__global__ void __launch_bounds__(256)
unorm_apply(Kd k, bool decay, const float *__restrict__ coefp, const float *__restrict__ upd, T *__restrict__ p,
            int64_t n) {
  const float coef = *coefp;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float pv = to_float(p[i]);
    if (decay) pv = pv * k.decay;
    p[i] = from_float<T>(pv + coef * upd[i]);
  }
}

inline int grid_for(int64_t work, int threads, int per_sm) {
  const int64_t want = (work + threads - 1) / threads;
  const int64_t cap = (int64_t)sm_count() * per_sm;
  return (int)(want < 1 ? 1 : (want < cap ? want : cap));
}

template <class T, Opt O>
int update32(cudaStream_t st, const Hyper &h, const T *g, T *p, float *s1, float *s2, float *unorm_vec,
             double max_unorm, double param_norm, int64_t n) {
  const Kd k = make_k(h);
  const int grid = grid_for(n, 256, 8);
  const bool unorm_path = max_unorm > 0.0 && (O == ADAM || O == MOMENTUM || O == RMSPROP);
  if (!unorm_path) {
    opt32<T, O, false><<<grid, 256, 0, st>>>(k, g, p, s1, s2, nullptr, nullptr, n);
    return launch_status();
  }
  // LAMB / LARS: scratch = [sum p^2, sum upd^2 (doubles)][coef][pad][upd (n floats)]
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
    const double factor = O == ADAM ? -h.lr * std::sqrt(1.0 - std::pow(h.beta2, (double)h.step)) /
                                          (1.0 - std::pow(h.beta1, (double)h.step))
                                    : -h.lr;
    unorm_finalize<<<1, 1, 0, st>>>(sums, coef, unorm_vec, max_unorm, param_norm, factor);
    unorm_apply<T><<<grid, 256, 0, st>>>(k, O == ADAM && k.has_wd, coef, upd, p, n);
    rc = launch_status();
  }
  if (cudaFreeAsync(scratch, st) != cudaSuccess) {
    (void)cudaGetLastError();
    rc = E_DEVICE;
  }
  return rc;
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
opt8(Kd k, const T *__restrict__ g, T *__restrict__ p, uint8_t *__restrict__ s1, uint8_t *__restrict__ s2,
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
      const float gv = to_float(g[i]);
      if (isfinite(gv)) {
        pv = to_float(p[i]);
        update_elem<O, true, false>(k, gv, pv, m, mb, v, nullptr);
        p[i] = from_float<T>(pv);
      } else {  // optim.cpp's update_elem8: a non-finite gradient leaves p and zeroes the element's states
        m = mb = v = 0.0f;
      }
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
  const Kd k = make_k(h);
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
#define BNB_OPT32(name, T, O)                                                                        \
  BNB_MS_EXPORT int name(BNB_MS_AOT_ARGS) {                                                          \
    return bnb_ms::cuda::entry32<T, bnb_ms::O>(nparam, params, ndims, shapes, dtypes, stream, extra); \
  }
#define BNB_OPT8(name, T, O)                                                                         \
  BNB_MS_EXPORT int name(BNB_MS_AOT_ARGS) {                                                          \
    return bnb_ms::cuda::entry8<T, bnb_ms::O>(nparam, params, ndims, shapes, dtypes, stream, extra); \
  }

BNB_OPT32(cadam32bit_grad_fp32, float, ADAM)
BNB_OPT32(cadam32bit_grad_fp16, fp16_t, ADAM)
BNB_OPT32(cadam32bit_grad_bf16, bf16_t, ADAM)
BNB_OPT32(cademamix32bit_grad_fp32, float, ADEMAMIX)
BNB_OPT32(cademamix32bit_grad_fp16, fp16_t, ADEMAMIX)
BNB_OPT32(cademamix32bit_grad_bf16, bf16_t, ADEMAMIX)
BNB_OPT32(clion32bit_grad_fp32, float, LION)
BNB_OPT32(clion32bit_grad_fp16, fp16_t, LION)
BNB_OPT32(clion32bit_grad_bf16, bf16_t, LION)
BNB_OPT32(cmomentum32bit_grad_32, float, MOMENTUM)
BNB_OPT32(cmomentum32bit_grad_16, fp16_t, MOMENTUM)
BNB_OPT32(cmomentum32bit_grad_bf16, bf16_t, MOMENTUM)
BNB_OPT32(crmsprop32bit_grad_32, float, RMSPROP)
BNB_OPT32(crmsprop32bit_grad_16, fp16_t, RMSPROP)
BNB_OPT32(crmsprop32bit_grad_bf16, bf16_t, RMSPROP)
BNB_OPT32(cadagrad32bit_grad_32, float, ADAGRAD)
BNB_OPT32(cadagrad32bit_grad_16, fp16_t, ADAGRAD)
BNB_OPT32(cadagrad32bit_grad_bf16, bf16_t, ADAGRAD)

BNB_OPT8(cadam_8bit_blockwise_grad_fp32, float, ADAM)
BNB_OPT8(cadam_8bit_blockwise_grad_fp16, fp16_t, ADAM)
BNB_OPT8(cadam_8bit_blockwise_grad_bf16, bf16_t, ADAM)
BNB_OPT8(cademamix_8bit_blockwise_grad_fp32, float, ADEMAMIX)
BNB_OPT8(cademamix_8bit_blockwise_grad_fp16, fp16_t, ADEMAMIX)
BNB_OPT8(cademamix_8bit_blockwise_grad_bf16, bf16_t, ADEMAMIX)
BNB_OPT8(cmomentum_8bit_blockwise_grad_fp32, float, MOMENTUM)
BNB_OPT8(cmomentum_8bit_blockwise_grad_fp16, fp16_t, MOMENTUM)
BNB_OPT8(cmomentum_8bit_blockwise_grad_bf16, bf16_t, MOMENTUM)
BNB_OPT8(crmsprop_8bit_blockwise_grad_fp32, float, RMSPROP)
BNB_OPT8(crmsprop_8bit_blockwise_grad_fp16, fp16_t, RMSPROP)
BNB_OPT8(crmsprop_8bit_blockwise_grad_bf16, bf16_t, RMSPROP)
BNB_OPT8(clion_8bit_blockwise_grad_fp32, float, LION)
BNB_OPT8(clion_8bit_blockwise_grad_fp16, fp16_t, LION)
BNB_OPT8(clion_8bit_blockwise_grad_bf16, bf16_t, LION)
BNB_OPT8(cadagrad_8bit_blockwise_grad_fp32, float, ADAGRAD)
BNB_OPT8(cadagrad_8bit_blockwise_grad_fp16, fp16_t, ADAGRAD)
BNB_OPT8(cadagrad_8bit_blockwise_grad_bf16, bf16_t, ADAGRAD)
#undef BNB_OPT32
#undef BNB_OPT8
