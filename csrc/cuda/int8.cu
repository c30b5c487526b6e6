// int8.cu -- LLM.int8() on CUDA: the same entry points, checks and bytes as csrc/cpu/int8.cpp (read its
// header comment for the numerics, which follow upstream bitsandbytes 0.50.2's default backend).
//
//  * cint8_vector_quant: with threshold > 0 a first kernel flags the columns holding an outlier
//    (|x| >= threshold rounded to A's dtype; flags zeroed on the stream first; without a threshold
//    the row kernel zeroes them, so that case is one launch).  Then one thread
//    block per row: absmax over the non-outliers (a NaN makes it the quiet NaN 0x7fc00000, as the CPU), row_stats,
//    q = round_half_even(x * ((1 / absmax) * 127)) in fp32 with explicit _rn intrinsics; outliers,
//    and (when there is more than one row) flagged columns, give 0; a row with absmax 0 gives 0.
//    A product that is NaN or out of int32 range converts to 0, which is what the CPU's
//    (int8_t)(int)nearbyint(...) gives on x86 (the "integer indefinite" 0x80000000 truncated).
//    Whether any column is flagged need not be known: without outliers the outlier tests are void.
//  * cigemmlt_32: C[M, N] = A[M, K] . B[N, K]^T in int32 through cuBLASLt (column-major view:
//    C^T[N, M] = op_T(B as K x N) . (A as K x M), the "TN" int8 layout Hopper's IMMA kernels take),
//    one handle + workspace per process/device/stream (aot_cuda.cuh), bound to the caller's stream.
//    The heuristic's pick is cached per (device, M, N, K, pointer alignments).  Shapes or pointers
//    cuBLASLt rejects (no algorithm, a failed call, K or N not a multiple of 4, pointers not 4-byte
//    aligned) take a SIMT kernel (64x64 tiles, __dp4a); both are exact (|sum| < 2^31 for K < 2^17).
//    BNB_MS_IGEMM=simt forces the SIMT kernel, BNB_MS_IGEMM=lt forbids it (E_UNSUPPORTED when
//    cuBLASLt cannot run the call) -- for tests.
//  * cdequant_mm_int32_{fp16,fp32,bf16}: out = ((float(A) * (row * col)) * 6.200124e-05f) (+ bias),
//    every step rounded in fp32 as on the CPU (NaNs with the x86 bits), then rounded to the output
//    dtype; 4 elements a thread.
//
//  * cint8_mixed_mm_dequant_* / cint8_linear_*: the outlier columns and the fused linear forward (see
//    "mixed mm dequant" below).
//
// Every launch, memset and cuBLASLt call goes on the entry point's stream.  Must not be compiled with
// --use_fast_math (denormals, 1/x).
#define BNB_MS_NEEDS_CUBLASLT 1

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>

#include "checks/int8.h"
#include "cuda/aot_cuda.cuh"
#include "cuda/x86_float.cuh"

namespace bnb_ms {
namespace cuda {
namespace {

// ------------------------------------------------------------------------------------------------
// vector quant
// ------------------------------------------------------------------------------------------------
constexpr int kVqThreads = 256;

template <class T>
__global__ void __launch_bounds__(256) vq_col_flags(const T *__restrict__ A, uint8_t *__restrict__ flags,
                                                    int64_t rows, int64_t cols, float thr) {
  const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  bool hit = false;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) hit |= fabsf(to_float(A[r * cols + c])) >= thr;
  if (hit) flags[c] = 1;
}

// x * s -> int8 as the CPU's (int8_t)(int)nearbyint(x * s) on x86.
__device__ __forceinline__ int8_t q8(float x, float s) {
  const float p = __fmul_rn(x, s);
  if (!(fabsf(p) < 2147483648.0f)) return 0;  // NaN, +-inf, out of int32 range: 0x80000000 -> 0
  return (int8_t)__float2int_rn(p);
}

// max of two |x| that propagates NaN (torch.max's rule; fmaxf drops it) as the CPU's 0x7fc00000.
__device__ __forceinline__ float max_nan(float a, float b) {
  return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

template <class T>
__device__ __forceinline__ float block_max(float v, float *red) {
  for (int o = 16; o; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < (int)(blockDim.x >> 5) ? red[l] : 0.0f;
    for (int o = 16; o; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (l == 0) red[32] = v;
  }
  __syncthreads();
  v = red[32];
  __syncthreads();  // red is reused by the next row
  return v;
}

// One block per row (grid-stride over rows).  VEC: 16-byte loads of A (V elements) and V-byte stores.
template <class T, bool VEC>
__global__ void __launch_bounds__(kVqThreads) vq_rows(const T *__restrict__ A, int8_t *__restrict__ out,
                                                      float *__restrict__ row_stats,
                                                      const uint8_t *__restrict__ flags, uint8_t *clear_flags,
                                                      int64_t rows, int64_t cols, float thr, bool split,
                                                      bool zero_cols) {
  constexpr int V = 16 / sizeof(T);
  __shared__ float red[33];
  if (clear_flags)  // no threshold: the flags are all 0, written here instead of a separate memset
    for (int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += (int64_t)gridDim.x * blockDim.x)
      clear_flags[c] = 0;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *a = A + r * cols;
    int8_t *o = out + r * cols;
    float amax = 0.0f;
    if (VEC) {
      const int64_t nv = cols / V;
      for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
        union { uint4 u; T t[V]; } x;
        x.u = reinterpret_cast<const uint4 *>(a)[i];
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float v = fabsf(to_float(x.t[j]));
          if (!(split && v >= thr)) amax = max_nan(amax, v);
        }
      }
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = fabsf(to_float(a[c]));
        if (!(split && v >= thr)) amax = max_nan(amax, v);
      }
    }
    amax = block_max<T>(amax, red);
    if (threadIdx.x == 0) row_stats[r] = amax;
    const bool zero = amax == 0.0f;
    const float s = zero ? 0.0f : __fmul_rn(__fdiv_rn(1.0f, amax), 127.0f);
    if (VEC) {
      const int64_t nv = cols / V;
      for (int64_t i = threadIdx.x; i < nv; i += blockDim.x) {
        union { uint4 u; T t[V]; } x;
        x.u = reinterpret_cast<const uint4 *>(a)[i];
        union { uint2 u2; uint32_t u1; int8_t q[8]; } y;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const float v = to_float(x.t[j]);
          int8_t q = 0;
          if (!zero && !(split && fabsf(v) >= thr) && !(zero_cols && flags[i * V + j])) q = q8(v, s);
          y.q[j] = q;
        }
        if (V == 8) reinterpret_cast<uint2 *>(o)[i] = y.u2;
        else reinterpret_cast<uint32_t *>(o)[i] = y.u1;
      }
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = to_float(a[c]);
        int8_t q = 0;
        if (!zero && !(split && fabsf(v) >= thr) && !(zero_cols && flags[c])) q = q8(v, s);
        o[c] = q;
      }
    }
  }
}

template <class H>
int vector_quant(cudaStream_t st, const void *Av, int8_t *out, float *rs, uint8_t *flags, int64_t rows,
                 int64_t cols, float threshold) {
  using T = typename DevType<H>::type;
  const T *A = static_cast<const T *>(Av);
  const bool split = threshold > 0.0f;
  // the threshold rounded to A's dtype (torch compares in that dtype), as the CPU does
  const float thr = split ? to_f32<H>(from_f32<H>(threshold)) : 0.0f;
  const int sms = sm_count();
  if (split) {
    if (cudaMemsetAsync(flags, 0, (size_t)cols, st) != cudaSuccess) { (void)cudaGetLastError(); return E_DEVICE; }
    const int64_t gx = (cols + 255) / 256;
    const int64_t gy = std::min<int64_t>(rows, std::max<int64_t>(1, (int64_t)sms * 16 / gx));
    vq_col_flags<T><<<dim3((unsigned)gx, (unsigned)gy), 256, 0, st>>>(A, flags, rows, cols, thr);
    if (launch_status() != OK) return E_DEVICE;
  }
  const bool zero_cols = split && rows > 1;
  constexpr int V = 16 / sizeof(T);
  const bool vec = cols % V == 0 && aligned16(A) && (reinterpret_cast<uintptr_t>(out) % V) == 0;
  const unsigned grid = (unsigned)std::min<int64_t>(rows, (int64_t)sms * 64);
  uint8_t *clear = split ? nullptr : flags;
  if (vec) vq_rows<T, true><<<grid, kVqThreads, 0, st>>>(A, out, rs, flags, clear, rows, cols, thr, split, zero_cols);
  else vq_rows<T, false><<<grid, kVqThreads, 0, st>>>(A, out, rs, flags, clear, rows, cols, thr, split, zero_cols);
  return launch_status();
}

// ---- entry point: checks in checks/int8.h (shared with the CPU library) -------------------------
int vector_quant_entry(BNB_MS_AOT_ARGS) {
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::VectorQuant a;
  if (int s = checks::vector_quant(c, &a)) return s;
  if (a.empty) return OK;
  const cudaStream_t st = c.cu_stream();
  if (a.dt == DType::f32)
    return vector_quant<float>(st, a.A, a.out, a.row_stats, a.col_flags, a.rows, a.cols, a.threshold);
  if (a.dt == DType::f16)
    return vector_quant<fp16_t>(st, a.A, a.out, a.row_stats, a.col_flags, a.rows, a.cols, a.threshold);
  return vector_quant<bf16_t>(st, a.A, a.out, a.row_stats, a.col_flags, a.rows, a.cols, a.threshold);
}

// ------------------------------------------------------------------------------------------------
// int8 GEMM
// ------------------------------------------------------------------------------------------------

// SIMT fallback: 64x64 output tile per 256-thread block, K in steps of 32 bytes staged in shared
// memory as packed int8x4 words, 4x4 outputs per thread with __dp4a (exact int32 arithmetic).
constexpr int kTM = 64, kTN = 64, kTK = 32;

__device__ __forceinline__ void load8(const int8_t *__restrict__ X, int64_t r, int64_t rows, int64_t K, int64_t k,
                                      bool vec8, uint32_t w[2]) {
  w[0] = w[1] = 0;
  if (r >= rows || k >= K) return;
  const int8_t *p = X + r * K + k;
  if (vec8 && k + 8 <= K) {
    const uint2 v = *reinterpret_cast<const uint2 *>(p);
    w[0] = v.x;
    w[1] = v.y;
    return;
  }
  const int64_t e = K - k < 8 ? K - k : 8;
  for (int t = 0; t < e; ++t) w[t >> 2] |= (uint32_t)(uint8_t)p[t] << (8 * (t & 3));
}

__global__ void __launch_bounds__(256) igemm_simt(const int8_t *__restrict__ A, const int8_t *__restrict__ B,
                                                  int32_t *__restrict__ C, int64_t M, int64_t N, int64_t K,
                                                  bool vec8) {
  __shared__ int32_t As[kTM][kTK / 4 + 1];
  __shared__ int32_t Bs[kTN][kTK / 4 + 1];
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int lr = threadIdx.x >> 2, lw = (threadIdx.x & 3) * 2;  // loader: tile row, first word
  const int64_t n0 = (int64_t)blockIdx.x * kTN;
  for (int64_t m0 = (int64_t)blockIdx.y * kTM; m0 < M; m0 += (int64_t)gridDim.y * kTM) {
    int32_t acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = 0;
    for (int64_t k0 = 0; k0 < K; k0 += kTK) {
      uint32_t a[2], b[2];
      load8(A, m0 + lr, M, K, k0 + lw * 4, vec8, a);
      load8(B, n0 + lr, N, K, k0 + lw * 4, vec8, b);
      __syncthreads();
      As[lr][lw] = (int32_t)a[0];
      As[lr][lw + 1] = (int32_t)a[1];
      Bs[lr][lw] = (int32_t)b[0];
      Bs[lr][lw + 1] = (int32_t)b[1];
      __syncthreads();
#pragma unroll
      for (int w = 0; w < kTK / 4; ++w) {
        int av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) av[i] = As[ty + 16 * i][w];
#pragma unroll
        for (int j = 0; j < 4; ++j) bv[j] = Bs[tx + 16 * j][w];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(av[i], bv[j], acc[i][j]);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t m = m0 + ty + 16 * i;
      if (m >= M) continue;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t n = n0 + tx + 16 * j;
        if (n < N) C[m * N + n] = acc[i][j];
      }
    }
    __syncthreads();
  }
}

int igemm_simt_launch(cudaStream_t st, const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N,
                      int64_t K) {
  const bool vec8 = K % 8 == 0 && (reinterpret_cast<uintptr_t>(A) & 7) == 0 && (reinterpret_cast<uintptr_t>(B) & 7) == 0;
  const int64_t gx = (N + kTN - 1) / kTN, gy = std::min<int64_t>((M + kTM - 1) / kTM, 65535);
  if (gx > INT_MAX) return E_SHAPE;
  igemm_simt<<<dim3((unsigned)gx, (unsigned)gy), 256, 0, st>>>(A, B, C, M, N, K, vec8);
  return launch_status();
}

// ---- cuBLASLt path ------------------------------------------------------------------------------
uint32_t align_of(const void *p) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && (v & (a - 1))) a >>= 1;
  return a;
}

struct AlgoKey {
  int dev;
  int64_t m, n, k;
  uint32_t al_a, al_b, al_c;
  bool operator==(const AlgoKey &o) const {
    return dev == o.dev && m == o.m && n == o.n && k == o.k && al_a == o.al_a && al_b == o.al_b && al_c == o.al_c;
  }
};
struct AlgoEntry {
  AlgoKey key;
  bool ok;
  cublasLtMatmulAlgo_t algo;
};

// RAII for the per-call descriptors (cheap host objects; the expensive heuristic is cached).
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  ~LtDescs() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Returns true when cuBLASLt computed C (enqueued on the stream); false leaves C untouched.
bool igemm_lt(cudaStream_t st, const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  if (K % 4 || N % 4) return false;
  const uint32_t al_a = align_of(A), al_b = align_of(B), al_c = align_of(C);
  if (al_a < 4 || al_b < 4 || al_c < 4) return false;
  LtContext ctx;
  if (lt_context(st, &ctx) != OK) return false;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) { (void)cudaGetLastError(); return false; }
  LtDescs d;
  // column-major: C^T (N x M, ld N) = op_T(W: K x N, ld K) . (X: K x M, ld K)
  if (cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32I, CUDA_R_32I) != CUBLAS_STATUS_SUCCESS) return false;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  if (cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) != CUBLAS_STATUS_SUCCESS)
    return false;
  if (cublasLtMatrixLayoutCreate(&d.la, CUDA_R_8I, (uint64_t)K, (uint64_t)N, K) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&d.lb, CUDA_R_8I, (uint64_t)K, (uint64_t)M, K) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&d.lc, CUDA_R_32I, (uint64_t)N, (uint64_t)M, N) != CUBLAS_STATUS_SUCCESS)
    return false;

  static std::mutex mu;
  static std::vector<AlgoEntry> cache;
  const AlgoKey key{dev, M, N, K, al_b, al_a, al_c};  // cuBLASLt's "A" is our B (the weight)
  AlgoEntry entry{};
  bool found = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto &e : cache)
      if (e.key == key) { entry = e; found = true; break; }
  }
  if (!found) {
    entry.key = key;
    entry.ok = false;
    cublasLtMatmulPreference_t pref = nullptr;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS) {
      const uint64_t ws = ctx.workspace_size;
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_b, sizeof al_b);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a, sizeof al_a);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
      cublasLtMatmulHeuristicResult_t res;
      int count = 0;
      if (cublasLtMatmulAlgoGetHeuristic(ctx.handle, d.op, d.la, d.lb, d.lc, d.lc, pref, 1, &res, &count) ==
              CUBLAS_STATUS_SUCCESS &&
          count > 0 && res.state == CUBLAS_STATUS_SUCCESS) {
        entry.ok = true;
        entry.algo = res.algo;
      }
      cublasLtMatmulPreferenceDestroy(pref);
    }
    std::lock_guard<std::mutex> lock(mu);
    if (cache.size() < 4096) cache.push_back(entry);
  }
  if (!entry.ok) return false;
  const int32_t alpha = 1, beta = 0;
  const cublasStatus_t s = cublasLtMatmul(ctx.handle, d.op, &alpha, B, d.la, A, d.lb, &beta, C, d.lc, C, d.lc,
                                          &entry.algo, ctx.workspace, ctx.workspace_size, st);
  if (s != CUBLAS_STATUS_SUCCESS) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// ---- entry point: checks in checks/int8.h (shared with the CPU library) -------------------------
int igemm_entry(BNB_MS_AOT_ARGS) {
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Igemm a;
  if (int s = checks::igemm(c, &a)) return s;
  const cudaStream_t st = c.cu_stream();
  // A failure on well-formed input (cuBLASLt cannot run it under BNB_MS_IGEMM=lt, a failed launch, or one forced
  // by bnb_ms_force_error("igemm", code)) goes to has_error when the call has it, else to the status.
  const auto report = [&](int code) { return code == OK ? (int)OK : write_has_error(st, a.has_error, code); };
  if (a.has_error && write_has_error(st, a.has_error, OK) != OK) return E_DEVICE;
  if (int f = forced_error("igemm")) return report(f);
  if (a.empty) return OK;
  const int64_t M = a.M, N = a.N, K = a.K;
  const char *mode = std::getenv("BNB_MS_IGEMM");
  const bool force_simt = mode && std::strcmp(mode, "simt") == 0;
  const bool lt_only = mode && std::strcmp(mode, "lt") == 0;
  if (!force_simt && igemm_lt(st, a.A, a.B, a.out, M, N, K)) return OK;
  if (lt_only) return report(E_UNSUPPORTED);
  return report(igemm_simt_launch(st, a.A, a.B, a.out, M, N, K));
}

// ------------------------------------------------------------------------------------------------
// mm dequant
// ------------------------------------------------------------------------------------------------
constexpr float kMmDequant = 6.200124e-05f;

// mul_x86 / add_x86 / fma_x86 (cuda/x86_float.cuh): the x86 NaN results, which matter for fp32/bf16 outputs.

template <class T, class BT>
__device__ __forceinline__ T dq1(int32_t a, float rv, float cv, const BT *bias, int64_t j) {
  float v = mul_x86(__int2float_rn(a), mul_x86(rv, cv));
  v = mul_x86(v, kMmDequant);
  if (bias) v = add_x86(v, to_float(bias[j]));
  return from_float<T>(v);
}

// 4 consecutive outputs per thread; grid.x over column groups, grid.y (strided) over rows.
// VEC: cols % 4 == 0 and A, col_stats 16-byte aligned, out aligned to 4 elements.
template <class T, class BT, bool VEC>
__global__ void __launch_bounds__(256) mm_dequant_k(const int32_t *__restrict__ A, const float *__restrict__ rs,
                                                    const float *__restrict__ cs, const BT *__restrict__ bias,
                                                    T *__restrict__ out, int64_t rows, int64_t cols) {
  const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (c >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float rv = rs[r];
    const int32_t *a = A + r * cols;
    T *o = out + r * cols;
    if (VEC) {
      const int4 av = *reinterpret_cast<const int4 *>(a + c);
      const float4 cv = *reinterpret_cast<const float4 *>(cs + c);
      union { T t[4]; uint2 u2; uint4 u4; } y;
      y.t[0] = dq1<T, BT>(av.x, rv, cv.x, bias, c);
      y.t[1] = dq1<T, BT>(av.y, rv, cv.y, bias, c + 1);
      y.t[2] = dq1<T, BT>(av.z, rv, cv.z, bias, c + 2);
      y.t[3] = dq1<T, BT>(av.w, rv, cv.w, bias, c + 3);
      if (sizeof(T) == 4) *reinterpret_cast<uint4 *>(o + c) = y.u4;
      else *reinterpret_cast<uint2 *>(o + c) = y.u2;
    } else {
      const int64_t e = cols - c < 4 ? cols - c : 4;
      for (int64_t j = 0; j < e; ++j) o[c + j] = dq1<T, BT>(a[c + j], rv, cs[c + j], bias, c + j);
    }
  }
}

template <class T, class BT>
int mm_dequant(cudaStream_t st, const int32_t *A, const float *rs, const float *cs, const BT *bias, T *out,
               int64_t rows, int64_t cols) {
  const int64_t groups = (cols + 3) / 4;
  const int64_t gx = (groups + 255) / 256, gy = std::min<int64_t>(rows, 65535);
  if (gx > INT_MAX) return E_SHAPE;
  const bool vec = cols % 4 == 0 && aligned16(A) && aligned16(cs) &&
                   (reinterpret_cast<uintptr_t>(out) % (4 * sizeof(T))) == 0;
  const dim3 grid((unsigned)gx, (unsigned)gy);
  if (vec) mm_dequant_k<T, BT, true><<<grid, 256, 0, st>>>(A, rs, cs, bias, out, rows, cols);
  else mm_dequant_k<T, BT, false><<<grid, 256, 0, st>>>(A, rs, cs, bias, out, rows, cols);
  return launch_status();
}

// ---- entry point: checks in checks/int8.h (shared with the CPU library) -------------------------
template <class H>
int mm_dequant_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::MmDequant<T> a;
  if (int s = checks::mm_dequant<T>(c, &a)) return s;
  if (a.empty) return OK;
  const cudaStream_t st = c.cu_stream();
  const int32_t *A = a.A;
  const float *rs = a.row_stats, *cs = a.col_stats;
  if (a.bias_dt == DType::none) return mm_dequant<T, float>(st, A, rs, cs, nullptr, a.out, a.rows, a.cols);
  if (a.bias_dt == DType::f32)
    return mm_dequant<T, float>(st, A, rs, cs, static_cast<const float *>(a.bias), a.out, a.rows, a.cols);
  if (a.bias_dt == DType::f16)
    return mm_dequant<T, __half>(st, A, rs, cs, static_cast<const __half *>(a.bias), a.out, a.rows, a.cols);
  return mm_dequant<T, __nv_bfloat16>(st, A, rs, cs, static_cast<const __nv_bfloat16 *>(a.bias), a.out, a.rows,
                                      a.cols);
}

// ------------------------------------------------------------------------------------------------
// mixed mm dequant (outlier columns) and the fused linear forward -- the CPU's numerics
// (csrc/cpu/int8.cpp, "mixed mm dequant"), composed of the kernels above:
//  * cint8_mixed_mm_dequant_<T>: flag_list compacts the flagged columns (ascending) on the device, then
//    one thread per output: d = the mm dequant in fp32 (dq1's steps); the columns, ascending, in blocks of
//    192 (half of them, rounded up, for 192 < count < 384): per block acc = fma(A, w, acc) from 0 with
//    w = (float(CB) * col_stats) * 7.874015718698502e-3f, then d = d + acc; out = T(d); no flagged
//    column: out = T(d) (cdequant_mm_int32's bytes). x86 NaN rules as mul_x86/add_x86/fma_x86.
//  * cint8_linear_<T>: fp32 A rounded to fp16 (to_half), vector_quant, the int8 GEMM (as cigemmlt_32:
//    cuBLASLt, else the SIMT kernel; BNB_MS_IGEMM as there), then the mixed or the plain mm dequant.
//    Intermediates live in one device scratch buffer per (device, stream) (grown on demand).
// ------------------------------------------------------------------------------------------------
constexpr float kInt8Dequant = 7.874015718698502e-3f;  // float32(1 / 127)
constexpr int kMixedBlock = 192;  // outlier columns per block of the outlier sum (csrc/cpu/int8.cpp)

// One device buffer per (device, stream), grown on demand (the stream is synchronized before the old
// one is freed); nothing is freed before process exit.  The returned lock is held while the caller
// enqueues work on the buffer, so two host threads sharing a stream never resize it under each other.
struct Scratch {
  void *p = nullptr;
  std::unique_lock<std::mutex> lock;
};

int scratch(cudaStream_t st, size_t bytes, Scratch *s) {
  struct Buf { int dev; cudaStream_t st; void *p; size_t size; };
  static std::mutex mu;
  static std::vector<Buf> bufs;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) { (void)cudaGetLastError(); return E_DEVICE; }
  s->lock = std::unique_lock<std::mutex>(mu);
  bytes = std::max<size_t>(bytes, 256);
  Buf *b = nullptr;
  for (auto &e : bufs)
    if (e.dev == dev && e.st == st) b = &e;
  if (b && b->size >= bytes) {
    s->p = b->p;
    return OK;
  }
  if (b) {
    if (cudaStreamSynchronize(st) != cudaSuccess || cudaFree(b->p) != cudaSuccess) { (void)cudaGetLastError(); return E_DEVICE; }
    b->p = nullptr;
    b->size = 0;
  }
  void *p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) { (void)cudaGetLastError(); return E_DEVICE; }
  if (b) {
    b->p = p;
    b->size = bytes;
  } else {
    bufs.push_back({dev, st, p, bytes});
  }
  s->p = p;
  return OK;
}

// Carves 256-byte aligned pieces out of a scratch buffer.
struct Carve {
  char *base;
  size_t off = 0;
  explicit Carve(void *p) : base(static_cast<char *>(p)) {}
  template <class X> X *take(int64_t n) {
    X *r = reinterpret_cast<X *>(base + off);
    off += ((size_t)n * sizeof(X) + 255) / 256 * 256;
    return r;
  }
  static size_t bytes(int64_t n, size_t size) { return ((size_t)n * size + 255) / 256 * 256; }
};

// J[0..*count) = the flagged columns in ascending order (one block; 1024 columns per step).
__global__ void __launch_bounds__(1024) flag_list(const uint8_t *__restrict__ flags, int64_t K, int32_t *__restrict__ J,
                                                  int32_t *__restrict__ count) {
  __shared__ int wsum[32];
  int base = 0;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int64_t k0 = 0; k0 < K; k0 += blockDim.x) {
    const int64_t k = k0 + threadIdx.x;
    const bool f = k < K && flags[k] != 0;
    const unsigned m = __ballot_sync(0xffffffffu, f);
    if (lane == 0) wsum[w] = __popc(m);
    __syncthreads();
    int off = 0, total = 0;
    for (int i = 0; i < nw; ++i) {
      off += i < w ? wsum[i] : 0;
      total += wsum[i];
    }
    if (f) J[base + off + __popc(m & ((1u << lane) - 1u))] = (int32_t)k;
    base += total;
    __syncthreads();  // wsum is rewritten by the next step
  }
  if (threadIdx.x == 0) *count = base;
}

template <class T, class BT>
__global__ void __launch_bounds__(256) mixed_dequant_k(const int32_t *__restrict__ C, const float *__restrict__ rs,
                                                       const float *__restrict__ cs, const BT *__restrict__ bias,
                                                       const T *__restrict__ A, int64_t K, const int8_t *__restrict__ CB,
                                                       const int32_t *__restrict__ J, const int32_t *__restrict__ count,
                                                       T *__restrict__ out, int64_t rows, int64_t N) {
  const int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int nJ = *count;
  const float cv = cs[n];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    float v = mul_x86(__int2float_rn(C[r * N + n]), mul_x86(rs[r], cv));
    v = mul_x86(v, kMmDequant);
    if (bias) v = add_x86(v, to_float(bias[n]));
    if (nJ > 0) {
      const int bs = (nJ > kMixedBlock && nJ < 2 * kMixedBlock) ? (nJ + 1) / 2 : kMixedBlock;
      for (int t0 = 0; t0 < nJ; t0 += bs) {
        const int t1 = min(nJ, t0 + bs);
        float acc = 0.0f;
        for (int t = t0; t < t1; ++t) {
          const int64_t j = J[t];
          const float w = mul_x86(mul_x86(__int2float_rn((int)CB[n * K + j]), cv), kInt8Dequant);
          acc = fma_x86(to_float(A[r * K + j]), w, acc);
        }
        v = add_x86(v, acc);
      }
    }
    out[r * N + n] = from_float<T>(v);
  }
}

// The flagged columns' part (count and J on the device) or, with K == 0, the plain mm dequant.
template <class T, class BT>
int mixed_dequant(cudaStream_t st, const int32_t *C, const float *rs, const float *cs, const BT *bias, const T *A,
                  int64_t K, const int8_t *CB, const uint8_t *flags, int32_t *J, int32_t *count, T *out, int64_t rows,
                  int64_t N) {
  if (K == 0) return mm_dequant<T, BT>(st, C, rs, cs, bias, out, rows, N);
  flag_list<<<1, 1024, 0, st>>>(flags, K, J, count);
  if (launch_status() != OK) return E_DEVICE;
  const int64_t gx = (N + 255) / 256, gy = std::min<int64_t>(rows, 65535);
  if (gx > INT_MAX) return E_SHAPE;
  mixed_dequant_k<T, BT><<<dim3((unsigned)gx, (unsigned)gy), 256, 0, st>>>(C, rs, cs, bias, A, K, CB, J, count, out,
                                                                            rows, N);
  return launch_status();
}

// ---- entry point: checks in checks/int8.h (shared with the CPU library) -------------------------
template <class H>
int mixed_mm_dequant_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::MixedMmDequant<T> a;
  if (int s = checks::mixed_mm_dequant<T>(c, &a)) return s;
  if (a.empty) return OK;
  const cudaStream_t st = c.cu_stream();
  Scratch sc;
  if (int s = scratch(st, Carve::bytes(a.K + 1, 4), &sc)) return s;
  Carve cv(sc.p);
  int32_t *J = cv.take<int32_t>(a.K), *count = cv.take<int32_t>(1);
  const int32_t *C = a.C;
  const float *rs = a.row_stats, *cs = a.col_stats;
  if (a.bias_dt == DType::none)
    return mixed_dequant<T, float>(st, C, rs, cs, nullptr, a.A, a.K, a.CB, a.col_flags, J, count, a.out, a.rows, a.N);
  if (a.bias_dt == DType::f32)
    return mixed_dequant<T, float>(st, C, rs, cs, static_cast<const float *>(a.bias), a.A, a.K, a.CB, a.col_flags, J,
                                   count, a.out, a.rows, a.N);
  if (a.bias_dt == DType::f16)
    return mixed_dequant<T, __half>(st, C, rs, cs, static_cast<const __half *>(a.bias), a.A, a.K, a.CB, a.col_flags, J,
                                    count, a.out, a.rows, a.N);
  return mixed_dequant<T, __nv_bfloat16>(st, C, rs, cs, static_cast<const __nv_bfloat16 *>(a.bias), a.A, a.K, a.CB,
                                         a.col_flags, J, count, a.out, a.rows, a.N);
}

__global__ void __launch_bounds__(256) to_half(const float *__restrict__ x, __half *__restrict__ y, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] = from_float<__half>(x[i]);
}

// cigemmlt_32's path choice (cuBLASLt, else the SIMT kernel; BNB_MS_IGEMM=simt|lt as there).
int igemm_run(cudaStream_t st, const int8_t *A, const int8_t *B, int32_t *C, int64_t M, int64_t N, int64_t K) {
  const char *mode = std::getenv("BNB_MS_IGEMM");
  const bool force_simt = mode && std::strcmp(mode, "simt") == 0;
  const bool lt_only = mode && std::strcmp(mode, "lt") == 0;
  if (!force_simt && igemm_lt(st, A, B, C, M, N, K)) return OK;
  if (lt_only) return E_UNSUPPORTED;
  return igemm_simt_launch(st, A, B, C, M, N, K);
}

template <class H, class BT>
int int8_linear(cudaStream_t st, const checks::Int8Linear<typename DevType<H>::type> &a, const BT *bias) {
  using T = typename DevType<H>::type;
  const int64_t M = a.rows, N = a.N, K = a.K;
  const bool f32 = std::is_same<H, float>::value;
  const size_t bytes = (f32 ? Carve::bytes(M * K, 2) : 0) + Carve::bytes(M * K, 1) + Carve::bytes(M, 4) +
                       Carve::bytes(M * N, 4) + Carve::bytes(K + 1, 4);
  Scratch sc;
  if (int s = scratch(st, bytes, &sc)) return s;
  Carve cv(sc.p);
  __half *a16 = f32 ? cv.take<__half>(M * K) : nullptr;
  int8_t *CA = cv.take<int8_t>(M * K);
  float *SCA = cv.take<float>(M);
  int32_t *C = cv.take<int32_t>(M * N);
  int32_t *J = cv.take<int32_t>(K), *count = cv.take<int32_t>(1);
  int s;
  if (f32) {
    const int64_t n = M * K;
    const unsigned grid = (unsigned)std::min<int64_t>((n + 255) / 256, (int64_t)sm_count() * 32);
    to_half<<<grid, 256, 0, st>>>(reinterpret_cast<const float *>(a.A), a16, n);
    if (launch_status() != OK) return E_DEVICE;
    s = vector_quant<fp16_t>(st, a16, CA, SCA, a.col_flags, M, K, a.threshold);
  } else {
    s = vector_quant<H>(st, a.A, CA, SCA, a.col_flags, M, K, a.threshold);
  }
  if (s != OK) return s;
  if ((s = igemm_run(st, CA, a.CB, C, M, N, K)) != OK) return s;
  if (a.threshold > 0.0f)
    return mixed_dequant<T, BT>(st, C, SCA, a.SCB, bias, a.A, K, a.CB, a.col_flags, J, count, a.out, M, N);
  return mm_dequant<T, BT>(st, C, SCA, a.SCB, bias, a.out, M, N);
}

// ---- entry point: checks in checks/int8.h (shared with the CPU library) -------------------------
template <class H>
int int8_linear_entry(BNB_MS_AOT_ARGS) {
  using T = typename DevType<H>::type;
  CudaCall c(nparam, params, ndims, shapes, dtypes, stream);
  checks::Int8Linear<T> a;
  if (int s = checks::int8_linear<T>(c, &a)) return s;
  const cudaStream_t st = c.cu_stream();
  if (a.empty) {  // col_flags = 0; K == 0: out = 0 (as the CPU library)
    if (a.col_flags && a.K && cudaMemsetAsync(a.col_flags, 0, (size_t)a.K, st) != cudaSuccess) {
      (void)cudaGetLastError();
      return E_DEVICE;
    }
    if (a.out && a.K == 0 && a.rows > 0 && a.N > 0 &&
        cudaMemsetAsync(a.out, 0, (size_t)(a.rows * a.N) * sizeof(T), st) != cudaSuccess) {
      (void)cudaGetLastError();
      return E_DEVICE;
    }
    return OK;
  }
  if (a.bias_dt == DType::none) return int8_linear<H, float>(st, a, nullptr);
  if (a.bias_dt == DType::f32) return int8_linear<H, float>(st, a, static_cast<const float *>(a.bias));
  if (a.bias_dt == DType::f16) return int8_linear<H, __half>(st, a, static_cast<const __half *>(a.bias));
  return int8_linear<H, __nv_bfloat16>(st, a, static_cast<const __nv_bfloat16 *>(a.bias));
}


}  // namespace
}  // namespace cuda
}  // namespace bnb_ms

using bnb_ms::bf16_t;
using bnb_ms::fp16_t;
BNB_MS_ENTRY(cint8_vector_quant, bnb_ms::cuda::vector_quant_entry)
BNB_MS_ENTRY(cigemmlt_32, bnb_ms::cuda::igemm_entry)
BNB_MS_EXPORT_FORCE_ERROR
BNB_MS_ENTRY(cdequant_mm_int32_fp16, bnb_ms::cuda::mm_dequant_entry<fp16_t>)
BNB_MS_ENTRY(cdequant_mm_int32_fp32, bnb_ms::cuda::mm_dequant_entry<float>)
BNB_MS_ENTRY(cdequant_mm_int32_bf16, bnb_ms::cuda::mm_dequant_entry<bf16_t>)
BNB_MS_ENTRY(cint8_mixed_mm_dequant_fp16, bnb_ms::cuda::mixed_mm_dequant_entry<fp16_t>)
BNB_MS_ENTRY(cint8_mixed_mm_dequant_fp32, bnb_ms::cuda::mixed_mm_dequant_entry<float>)
BNB_MS_ENTRY(cint8_mixed_mm_dequant_bf16, bnb_ms::cuda::mixed_mm_dequant_entry<bf16_t>)
BNB_MS_ENTRY(cint8_linear_fp16, bnb_ms::cuda::int8_linear_entry<fp16_t>)
BNB_MS_ENTRY(cint8_linear_fp32, bnb_ms::cuda::int8_linear_entry<float>)
BNB_MS_ENTRY(cint8_linear_bf16, bnb_ms::cuda::int8_linear_entry<bf16_t>)
