// x86_float.cuh -- fp32 a * b, a + b and fma(a, b, c) on the GPU with the NaN the CPU library's x86 SSE/AVX
// arithmetic produces, so that the CUDA kernels' outputs equal the CPU library's bytes for NaN inputs too:
// a NaN result is the first NaN operand (source operand order) made quiet, or the x86 default NaN 0xffc00000 for
// an invalid operation (inf * 0, inf - inf), where CUDA would give 0x7fffffff.  Finite and infinite results are
// the plain IEEE round-to-nearest operations (__fmul_rn / __fadd_rn / __fmaf_rn: never contracted).
// Used by fourbit.cu (dequantize), int8.cu (mm_dequant, the mixed matmul) and weightonly.cu (dequantize).
#pragma once

namespace bnb_ms {
namespace cuda {

__device__ __forceinline__ float nan_x86(float a, float b) {
  if (a != a) return __uint_as_float(__float_as_uint(a) | 0x400000u);
  if (b != b) return __uint_as_float(__float_as_uint(b) | 0x400000u);
  return __uint_as_float(0xffc00000u);
}
__device__ __forceinline__ float mul_x86(float a, float b) {
  const float r = __fmul_rn(a, b);
  return r == r ? r : nan_x86(a, b);
}
__device__ __forceinline__ float add_x86(float a, float b) {
  const float r = __fadd_rn(a, b);
  return r == r ? r : nan_x86(a, b);
}
// fma(a, b, c) as the CPU library's fma_x86: a NaN result takes the NaN of c + a * b in two steps.
__device__ __forceinline__ float fma_x86(float a, float b, float c) {
  const float r = __fmaf_rn(a, b, c);
  return r == r ? r : add_x86(c, mul_x86(a, b));
}

}  // namespace cuda
}  // namespace bnb_ms
