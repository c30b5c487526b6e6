// gemm_fp.cu -- CUDA twin of csrc/cpu/gemm_fp.cpp: full-precision linear out[..., N] = A[..., K] @ W[N, K]^T
// (+ bias).  Same entry points (cgemm_fp_{fp32,fp16,bf16}), params, checks (checks/gemm_fp.h), status codes
// and arithmetic as the CPU library:
//   acc[l] (l = k mod 16) is the sequential fused multiply-add over k = l, l+16, ... of fp32(A[m, k]) *
//   fp32(W[n, k]); the 16 lanes are combined in the CPU's fixed tree ((a0+a8) + (a4+a12)) + ...; then
//   + fp32(bias[n]) and one rounding to the suffix's dtype -- so the result is bit-identical to the CPU's.
// A simple kernel: 16 threads per output (thread = lane l), warp shuffles for the tree, every row of A
// in turn (blockIdx.y).  Correct, not tuned (W is read once per row of A).
#include "checks/gemm_fp.h"
#include "cuda/aot_cuda.cuh"

namespace bnb_ms {
namespace cuda {
namespace {

constexpr int kThreads = 256;  // 16 outputs per block

__device__ __forceinline__ float bias_at(const void *bias, DType dt, int64_t n) {
  if (dt == DType::f32) return static_cast<const float *>(bias)[n];
  if (dt == DType::f16) return __half2float(static_cast<const __half *>(bias)[n]);
  return __bfloat162float(static_cast<const __nv_bfloat16 *>(bias)[n]);
}

template <class T>
__global__ void __launch_bounds__(kThreads) gemm_fp_kernel(const T *__restrict__ A, const T *__restrict__ W,
                                                           const void *__restrict__ bias, DType bias_dt,
                                                           T *__restrict__ out, int64_t M, int64_t N, int64_t K) {
  const int l = threadIdx.x & 15;
  const int64_t n_raw = (int64_t)blockIdx.x * (kThreads / 16) + threadIdx.x / 16;
  const int64_t n = n_raw < N ? n_raw : N - 1;  // every thread takes part in the shuffles
  const T *w = W + n * K;
  for (int64_t m = blockIdx.y; m < M; m += gridDim.y) {
    const T *a = A + m * K;
    float acc = 0.0f;
    for (int64_t k = l; k < K; k += 16) acc = __fmaf_rn(to_float(a[k]), to_float(w[k]), acc);
    const float u = __fadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, 8));  // lane i < 8: acc[i] + acc[i+8]
    const float t = __fadd_rn(u, __shfl_xor_sync(0xffffffffu, u, 4));      // lane i < 4: u[i] + u[i+4]
    const float v = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, 2));      // lane 0: t0 + t2, lane 1: t1 + t3
    float r = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
    if (l == 0 && n_raw < N) {
      if (bias) r = __fadd_rn(r, bias_at(bias, bias_dt, n));
      out[m * N + n] = from_float<T>(r);
    }
  }
}

template <class H>
int gemm_fp_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::GemmFp<T> a;
  if (int s = checks::gemm_fp<T>(c, &a)) return s;
  if (a.empty) return OK;
  const int64_t M = a.M, N = a.N;
  dim3 grid((unsigned)((N + kThreads / 16 - 1) / (kThreads / 16)), (unsigned)(M < 65535 ? M : 65535));
  gemm_fp_kernel<T><<<grid, kThreads, 0, c.cu_stream()>>>(a.A, a.W, a.bias, a.bias_dt, a.out, M, N, a.K);
  return launch_status();
}

}  // namespace
}  // namespace cuda
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cgemm_fp_fp32, bnb_ms::cuda::gemm_fp_entry<float>)
BNB_MS_ENTRY(cgemm_fp_fp16, bnb_ms::cuda::gemm_fp_entry<fp16_t>)
BNB_MS_ENTRY(cgemm_fp_bf16, bnb_ms::cuda::gemm_fp_entry<bf16_t>)
