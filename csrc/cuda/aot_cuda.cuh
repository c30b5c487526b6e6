// aot_cuda.cuh -- what every CUDA entry point shares: the AOT call view with a scalar reader that
// accepts device-resident 0-d tensors, launch/status helpers, fp16/bf16 conversions that round
// exactly like the CPU library (aot.h), and (opt-in) the per-process cuBLASLt context.
//
// Conventions for CUDA kernels of this library:
//   * every kernel launch, memset and copy goes on the `stream` argument of the entry point;
//   * malformed calls return a bnb_ms::E_* code before any memory is touched (same checks, in the
//     same order, as the CPU entry point of the same name: the op table is shared); features with a
//     header in csrc/checks/ share the check code itself with the CPU library (checks/common.h);
//   * launch/runtime failures return E_DEVICE (and kernels with a `has_error` output also write it);
//   * no --use_fast_math: results must be the CPU library's bytes, so IEEE rounding is kept and
//     denormals are not flushed (use __f*_rn intrinsics where the order of operations matters).
//
// A source that calls cuBLASLt defines BNB_MS_NEEDS_CUBLASLT before including this header; CMake
// links cuBLASLt only into builds that have such a source, and tools/cuda_syntax_check.sh skips it
// (CI has nvcc but no cuBLAS headers).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <mutex>

#include "aot.h"

#ifdef BNB_MS_NEEDS_CUBLASLT
#include <cublasLt.h>

#include <mutex>
#include <vector>
#endif

namespace bnb_ms {

// CUDA's 16-bit element types have the dtypes of aot.h's fp16_t / bf16_t (used by the shared checks,
// csrc/checks/*.h, which are templated on the element type each library uses).
template <> constexpr DType dtype_of<__half>() { return DType::f16; }
template <> constexpr DType dtype_of<__nv_bfloat16>() { return DType::bf16; }

namespace cuda {

// ---- scalars ------------------------------------------------------------------------------------
// MindSpore's GPU runtime passes Python scalars as 0-d tensors that may live in device memory.
// The reader asks the driver where the pointer lives; device (or unknown-to-host) memory is copied
// to the host on the caller's stream, which is then synchronized (the value decides shapes/grids).
// Host, pinned and managed memory are read directly.
struct ScalarReader {
  // The stream of the entry point being served on this thread (set by CudaCall).
  static cudaStream_t &stream() {
    static thread_local cudaStream_t s = nullptr;
    return s;
  }
  static size_t size_of(DType dt) {
    switch (dt) {
      case DType::i64: case DType::f64: return 8;
      case DType::i32: case DType::f32: return 4;
      case DType::boolean: return 1;
      default: return 0;
    }
  }
  static bool read(const void *p, DType dt, double *out) {
    if (!p) return false;
    const size_t sz = size_of(dt);
    if (!sz) return false;
    cudaPointerAttributes attr;
    cudaError_t err = cudaPointerGetAttributes(&attr, p);
    bool on_device = false;
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // old drivers report plain host memory as an error: clear it
    } else if (attr.type == cudaMemoryTypeDevice) {
      on_device = true;
    } else if (attr.type == cudaMemoryTypeManaged) {
      if (cudaStreamSynchronize(stream()) != cudaSuccess) return false;
    }
    unsigned char buf[8] = {0};
    if (on_device) {
      if (cudaMemcpyAsync(buf, p, sz, cudaMemcpyDeviceToHost, stream()) != cudaSuccess) return false;
      if (cudaStreamSynchronize(stream()) != cudaSuccess) return false;
      p = buf;
    }
    return HostScalarReader::read(p, dt, out);
  }
};

// The AOT call view for CUDA entry points: remembers the stream for the scalar reader.
struct CudaCall : Call<ScalarReader> {
  CudaCall(int n, void **p, int *nd, int64_t **sh, const char **dt, void *st)
      : Call<ScalarReader>(n, p, nd, sh, dt, st) {
    ScalarReader::stream() = static_cast<cudaStream_t>(st);
  }
  cudaStream_t cu_stream() const { return static_cast<cudaStream_t>(stream); }
};

// ---- launch helpers -----------------------------------------------------------------------------
// Status after a launch: E_DEVICE if the launch failed (the error is cleared so it does not leak
// into the caller's next check).
inline int launch_status() { return cudaGetLastError() == cudaSuccess ? OK : E_DEVICE; }

// ---- has_error outputs (aot.h) ------------------------------------------------------------------
namespace detail {
static __global__ void set_i32(int32_t *p, int32_t v) { *p = v; }  // (static: one per translation unit)
}  // namespace detail
// Writes `code` into the has_error output `p` on the stream.  Returns OK when it was written (the failure is
// then the output's to report), else `code` (p null: the call has no has_error output) or E_DEVICE.
inline int write_has_error(cudaStream_t st, int32_t *p, int code) {
  if (!p) return code;
  if (code == OK) {
    if (cudaMemsetAsync(p, 0, sizeof(int32_t), st) == cudaSuccess) return OK;
    (void)cudaGetLastError();
    return E_DEVICE;
  }
  detail::set_i32<<<1, 1, 0, st>>>(p, code);
  return launch_status() == OK ? OK : code;
}

inline int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 1;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) return 1;
  return n;
}

// Per kernel and device, once: raises the kernel's dynamic shared-memory limit to `smem` (above the default
// 48 KiB where needed) and returns how many `threads`-thread blocks fit on a multiprocessor.
template <class K>
int blocks_per_sm_with_smem(K kernel, int threads, size_t smem, int *blocks_per_sm) {
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
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, kernel, threads, smem) != cudaSuccess || o <= 0) {
    (void)cudaGetLastError();
    return E_DEVICE;
  }
  if (used < 256) cache[used++] = {(const void *)kernel, dev, o};
  *blocks_per_sm = o;
  return OK;
}

inline bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- 16-bit conversions, bit-identical to aot.h's host versions ---------------------------------
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  // round to nearest even; NaN -> sign | 0x7e00 | payload >> 13 (aot.h's f32_to_fp16; __float2half_rn gives 0x7fff).
  // Both computed and one selected (no branch in the store loops).
  const uint32_t b = __float_as_uint(v);
  const unsigned short nan = (unsigned short)(((b >> 16) & 0x8000u) | 0x7e00u | ((b >> 13) & 0x3ffu));
  const unsigned short r = __half_as_ushort(__float2half_rn(v));
  return __ushort_as_half(v != v ? nan : r);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  // round to nearest even; NaN keeps its top bits and is made quiet (aot.h's f32_to_bf16)
  uint32_t b = __float_as_uint(v);
  uint16_t r;
  if ((b & 0x7fffffffu) > 0x7f800000u) r = (uint16_t)((b >> 16) | 0x40u);
  else r = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
  return __ushort_as_bfloat16(r);
}

// Maps the host-side element types of aot.h onto CUDA's.
template <class T> struct DevType;
template <> struct DevType<float> { using type = float; };
template <> struct DevType<fp16_t> { using type = __half; };
template <> struct DevType<bf16_t> { using type = __nv_bfloat16; };

// ---- blockwise 8-bit scaling (quant_block_scale of cpu/quant_lut.h) ------------------------------
// A block's values are looked up as (x * pre) * inv: pre = 1, inv = 1 / absmax, or, where that reciprocal
// overflows (absmax < 2^-128), the block scaled by 2^64 first. absmax > 0.
struct QuantScale {
  float pre, inv;
};
__device__ __forceinline__ QuantScale quant_block_scale(float absmax) {
  const float inv = __fdiv_rn(1.0f, absmax);
  if (!isinf(inv)) return {1.0f, inv};
  return {18446744073709551616.0f, __fdiv_rn(1.0f, __fmul_rn(absmax, 18446744073709551616.0f))};
}
__device__ __forceinline__ float quant_block_scaled(float x, QuantScale k) {
  return __fmul_rn(__fmul_rn(x, k.pre), k.inv);
}

#ifdef BNB_MS_NEEDS_CUBLASLT
// ---- cuBLASLt context ---------------------------------------------------------------------------
// One handle per process and device, created on first use; one workspace per (device, stream), so
// kernels on different streams never share scratch memory.  Nothing is freed before process exit
// (the CUDA context may already be gone by then).  There is no Python-side device object.
struct LtContext {
  cublasLtHandle_t handle = nullptr;
  void *workspace = nullptr;
  size_t workspace_size = 0;
  cudaStream_t stream = nullptr;  // the caller's stream: pass it to every cublasLt* call
};

constexpr size_t kLtWorkspaceBytes = 32u << 20;  // NVIDIA's recommendation for Hopper

// Returns OK and fills *ctx, or E_DEVICE.  Thread-safe.
inline int lt_context(cudaStream_t stream, LtContext *ctx) {
  struct PerStream { cudaStream_t stream; void *ws; };
  struct PerDevice { cublasLtHandle_t handle = nullptr; std::vector<PerStream> ws; };
  static std::mutex mu;
  static std::vector<PerDevice> devices;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return E_DEVICE;
  std::lock_guard<std::mutex> lock(mu);
  if ((int)devices.size() <= dev) devices.resize(dev + 1);
  PerDevice &d = devices[dev];
  if (!d.handle && cublasLtCreate(&d.handle) != CUBLAS_STATUS_SUCCESS) {
    d.handle = nullptr;
    return E_DEVICE;
  }
  void *ws = nullptr;
  for (auto &s : d.ws)
    if (s.stream == stream) ws = s.ws;
  if (!ws) {
    if (cudaMalloc(&ws, kLtWorkspaceBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return E_DEVICE;
    }
    d.ws.push_back({stream, ws});
  }
  ctx->handle = d.handle;
  ctx->workspace = ws;
  ctx->workspace_size = kLtWorkspaceBytes;
  ctx->stream = stream;
  return OK;
}
#endif

}  // namespace cuda
}  // namespace bnb_ms
