// vec_io.cuh -- 16-byte vector loads of fp32/fp16/bf16 elements kept raw in registers (half the registers of
// floats for 16-bit types), widened one element at a time, and NaN-propagating max: what the blockwise 8-bit
// (blockwise.cu) and 4-bit (fourbit.cu) team quantizers share.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda/aot_cuda.cuh"

namespace bnb_ms {
namespace cuda {

// Elements per 16-byte vector.
template <class T> struct Vec { static constexpr int N = 16 / (int)sizeof(T); };

template <class T>
__device__ __forceinline__ float elem(const uint4 &raw, int e) {
  if constexpr (Vec<T>::N == 4) {
    return __uint_as_float(e == 0 ? raw.x : e == 1 ? raw.y : e == 2 ? raw.z : raw.w);
  } else {
    const uint32_t word = (e >> 1) == 0 ? raw.x : (e >> 1) == 1 ? raw.y : (e >> 1) == 2 ? raw.z : raw.w;
    const unsigned short bits = (unsigned short)((e & 1) ? (word >> 16) : (word & 0xffffu));
    if constexpr (std::is_same<T, __half>::value)
      return __half2float(__ushort_as_half(bits));
    else
      return __uint_as_float((uint32_t)bits << 16);
  }
}

// The V elements at A + off (16-byte aligned when whole); elements at or past n read as +0.
template <class T>
__device__ __forceinline__ uint4 load_vec(const T *__restrict__ A, int64_t off, int64_t n, bool valid) {
  constexpr int V = Vec<T>::N;
  uint4 x;
  if (valid && off + V <= n) {
    x = __ldg(reinterpret_cast<const uint4 *>(A + off));
  } else {
    T h[V];
#pragma unroll
    for (int e = 0; e < V; ++e) h[e] = (valid && off + e < n) ? A[off + e] : from_float<T>(0.0f);
    memcpy(&x, h, sizeof(x));
  }
  return x;
}

// max(a, b) that returns NaN when either is NaN (PTX max.NaN, sm_80+).
__device__ __forceinline__ float fmax_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}

}  // namespace cuda
}  // namespace bnb_ms
