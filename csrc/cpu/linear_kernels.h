// linear_kernels.h -- internal (not exported) linear kernels shared between feature files.
//
// linear4_f32: the 4-bit GEMV of fourbit.cpp (clinear_4bit_fp32's kernel) for callers inside the
// library, e.g. the fused decoder layers of decoder.cpp.  out[m, n] = sum_k A[m, k] * W[n, k] (+ bias[n])
// with W the [N, K] NF4/FP4 weight behind `packed`; absmax fp32 per block (absmax_f32), or double quant
// (absmax_q uint8 codes, code2 f32[256], absmax2 f32 per bs2 blocks, offset).  Same numerics as the
// entry point (bit-identical per row).  Threads: the kernel's own (parallel over output rows).
//
// int8_linear_f32: the fused LLM.int8() forward of int8.cpp (cint8_linear_fp32's kernel, the same bytes) on fp32
// activations A [M, K]: out [M, N] = A @ (CB * SCB / 127).T (+ bias): A rounded to fp16 before the vector-wise
// quantization (as upstream), int8 GEMM, dequantization; threshold > 0 multiplies the outlier columns in fp32.
// K <= 131071 (exact int32 accumulation; the caller checks).  Threads: the kernel's own.  Scratch: per calling
// thread, as the entry point's.
//
// dense_linear_f32: the full-precision linear of gemm_fp.cpp (cgemm_fp_*'s kernel) on fp32 activations A [M, K]
// and an fp32 / fp16 / bf16 weight W [N, K] (widened in registers), with an fp32 result: per output the same fma
// chain and reduction tree as the entry points (cgemm_fp_fp32's bits for an fp32 weight; for a 16-bit weight the
// value cgemm_fp_fp16/bf16 rounds to its dtype last, on fp32 activations).  Threads: the kernel's own.
#pragma once
#include <cstdint>

#include "aot.h"

namespace bnb_ms {

// The calls of a linear with nothing to multiply: M * N == 0 (true, nothing written) or K == 0 (out = bias or 0,
// true). False: the caller runs its kernel.
inline bool linear_without_products(const float *bias, float *out, int64_t M, int64_t N, int64_t K) {
  if (M * N == 0) return true;
  if (K != 0) return false;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) out[m * N + n] = bias ? bias[n] : 0.0f;
  return true;
}

struct Linear4Weight {
  const uint8_t *packed = nullptr;  // (N*K+1)/2 bytes
  const float *code = nullptr;      // 16 entries
  const float *absmax_f32 = nullptr;
  const uint8_t *absmax_q = nullptr;  // nested (double quant) when non-null
  const float *code2 = nullptr, *absmax2 = nullptr;
  float offset = 0.0f;
  int64_t blocksize = 64, blocksize2 = 256;
};

void linear4_f32(const Linear4Weight &w, const float *A, const float *bias, float *out, int64_t M, int64_t N,
                 int64_t K);

// M rows in bf16 compute: fourbit.cpp's one-row bf16 kernel (x and bf16(code) multiplied as vdpbf16ps does, scaled
// per 64-element half unit; each row's result clinear_4bit_bf16dot_bf16's bits on that bf16 row alone), fp32 out, the
// weights read once for all rows.  Returns false, doing nothing, where that kernel does not apply (K % 64,
// blocksize not a power of two >= 64).
bool linear4_bf16_gemv_f32(const Linear4Weight &w, const float *A, const float *bias, float *out, int64_t M, int64_t N,
                           int64_t K);

// Weight rows [n0, n1) of the 4-bit weight dequantized to fp32 into dst ((n1 - n0) x K, row-major): the
// values dequantize_4bit gives (code[nibble] * the block's absmax, double quant decoded first).
void decode4_rows_f32(const Linear4Weight &w, int64_t n0, int64_t n1, int64_t K, float *dst);
// The same rows as flushed bf16 words, Kw >= K per row (zeros past K): decode4_rows_f32's values rounded as the bf16
// panel GEMM rounds them, decoded directly.
void decode4_rows_bf16(const Linear4Weight &w, int64_t n0, int64_t n1, int64_t K, int64_t Kw, uint16_t *dst);

struct Int8Weight {
  const int8_t *CB = nullptr;  // int8 [N, K], row-wise absmax quantized
  const float *SCB = nullptr;  // [N] row absmax (the scale of row n is SCB[n] / 127)
  float threshold = 0.0f;      // >= 0; > 0: outlier columns (|a| >= threshold) multiplied in fp32
};

void int8_linear_f32(const Int8Weight &w, const float *A, const float *bias, float *out, int64_t M, int64_t N,
                     int64_t K);

void dense_linear_f32(const float *A, const void *W, DType wdt, const float *bias, float *out, int64_t M, int64_t N,
                      int64_t K);

}  // namespace bnb_ms
