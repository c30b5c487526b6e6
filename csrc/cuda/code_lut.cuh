// code_lut.cuh -- the CPU library's grid->code table of blockwise 8-bit quantization (cpu/quant_lut.h) built in
// shared memory by one thread block, for any 256-entry code (sorted or not): blockwise.cu's quantize and
// optim.cu's 8-bit state requantization look codes up in it.
//   mid[c] = 0.5 * (code[c] + code[c+1])   (NaN counts as +inf: the CPU scan stops there)
//   pm     = running max of mid             (non-decreasing)
//   T[c]   = first grid bin i with v(i) > pm[c], v(i) = -1 + 2i/65535 (monotone in i)
//   lut[i] = #{c : T[c] <= i}               (= the CPU's "first c with mid[c] >= v(i)")
#pragma once
#include <cstdint>

#include "cuda/aot_cuda.cuh"

namespace bnb_ms {
namespace cuda {

constexpr int kCode = 256;
constexpr int kLut = 65536;

__device__ __forceinline__ float grid_value(int i) {  // -1 + (2i)/65535, as the CPU computes it
  return __fadd_rn(-1.0f, __fdiv_rn(2.0f * (float)i, (float)(kLut - 1)));
}

__device__ __forceinline__ uint32_t grid_index(float v) {
  v = fminf(1.0f, fmaxf(-1.0f, v));  // NaN -> -1, as std::min(1, std::max(-1, v))
  const float t = __fmul_rn(__fadd_rn(v, 1.0f), 0.5f);
  return __float2uint_rz(__fmaf_rn(t, (float)(kLut - 1), 0.5f));
}

// Builds lut[65536] in shared memory.  Needs blockDim.x >= 256 and a __syncthreads() after.
__device__ inline void build_lut(const float *__restrict__ code, uint8_t *lut) {
  __shared__ float pm[kCode];
  __shared__ int thr[kCode];
  const int t = threadIdx.x;
  if (t < kCode - 1) {
    float m = __fmul_rn(0.5f, __fadd_rn(code[t], code[t + 1]));
    pm[t] = (m != m) ? __int_as_float(0x7f800000) : m;
  } else if (t == kCode - 1) {
    pm[t] = __int_as_float(0x7f800000);  // sentinel
  }
  __syncthreads();
  for (int off = 1; off < kCode; off <<= 1) {  // inclusive running max (Hillis-Steele)
    float v = 0.0f;
    if (t < kCode) v = (t >= off) ? fmaxf(pm[t], pm[t - off]) : pm[t];
    __syncthreads();
    if (t < kCode) pm[t] = v;
    __syncthreads();
  }
  if (t < kCode - 1) {  // T[c] = first i with v(i) > pm[c]
    const float p = pm[t];
    int lo = 0, hi = kLut;
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (grid_value(mid) > p) hi = mid; else lo = mid + 1;
    }
    thr[t] = lo;
  } else if (t == kCode - 1) {
    thr[t] = kLut + 1;  // never counted
  }
  __syncthreads();
  // lut[i] = #{c < 255 : T[c] <= i}; T is non-decreasing, so a lane walks c up as i grows.  Warp w fills
  // words [w * per_warp, (w + 1) * per_warp), lane l every 32nd of them (conflict-free stores); one binary
  // search per lane for its first word, then at most 255 steps of the walk in all.
  uint32_t *lut32 = reinterpret_cast<uint32_t *>(lut);
  const int nwarps = blockDim.x >> 5, per_warp = (kLut / 4) / nwarps;
  const int w0 = (t >> 5) * per_warp + (t & 31);
  int c;
  {
    int lo = 0, hi = kCode - 1;  // count of T[c] <= 4 * w0, c in [0, 255)
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (thr[mid] <= 4 * w0) lo = mid + 1; else hi = mid;
    }
    c = lo;
  }
  for (int w = w0; w < (t >> 5) * per_warp + per_warp; w += 32) {
    const int i0 = 4 * w;
    uint32_t word = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      while (c < kCode - 1 && thr[c] <= i0 + k) ++c;
      word |= (uint32_t)c << (8 * k);
    }
    lut32[w] = word;
  }
}

}  // namespace cuda
}  // namespace bnb_ms
