// checks/int8.h -- argument checks of the LLM.int8() entry points (cint8_vector_quant, cigemmlt_32,
// cdequant_mm_int32_{fp16,fp32,bf16}), shared by csrc/cpu/int8.cpp and csrc/cuda/int8.cu.  The pattern
// is described in checks/common.h.
//
// Two of the inputs are dtype-dispatched inside one entry point (vector quant's A, mm dequant's bias):
// the struct keeps their DType and an untyped pointer, and the library picks the kernel.
#pragma once
#include "checks/common.h"

namespace bnb_ms {
namespace checks {

// Longest K the int8 GEMM takes: |sum_k a * b| <= K * 2^14 < 2^31, exact in int32.
constexpr int64_t kIgemmMaxK = 131071;

BNB_MS_HD constexpr bool is_float_dtype(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }

struct VectorQuant : Parsed {
  DType dt = DType::none;  // A's dtype: f32 | f16 | bf16
  const void *A = nullptr;
  int8_t *out = nullptr;
  float *row_stats = nullptr;
  uint8_t *col_flags = nullptr;
  int64_t rows = 0, cols = 0, n = 0;
  float threshold = 0.0f;
};

// params: A (f32|f16|bf16)[..., K], threshold f32 -> out i8[like A], row_stats f32[rows], col_flags u8[K]
template <class C>
int vector_quant(const C &c, VectorQuant *a) {
  if (c.nparam != 5) return E_NPARAM;
  enum { A, THR, OUT, ROWS, FLAGS };
  const DType dt = c.dtype(A);
  if (!is_float_dtype(dt) || c.dtype(OUT) != DType::i8 || c.dtype(ROWS) != DType::f32 || c.dtype(FLAGS) != DType::u8)
    return E_DTYPE;
  float thr;
  if (!c.scalar_f32(THR, &thr) || !(thr >= 0.0f)) return E_VALUE;
  if (c.rank(A) < 1) return E_SHAPE;
  const int64_t cols = c.cols(A), n = c.numel(A), rows = cols ? n / cols : 0;
  if (c.numel(OUT) != n || c.numel(ROWS) != rows || c.numel(FLAGS) != cols) return E_SHAPE;
  a->dt = dt;
  a->threshold = thr;
  a->rows = rows;
  a->cols = cols;
  a->n = n;
  a->A = c.template ptr<const void>(A);
  a->out = c.template ptr<int8_t>(OUT);
  a->row_stats = c.template ptr<float>(ROWS);
  a->col_flags = c.template ptr<uint8_t>(FLAGS);
  if (n == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->A || !a->out || !a->row_stats || !a->col_flags) return E_NULL;
  return OK;
}

struct Igemm : Parsed {
  const int8_t *A = nullptr;
  const int8_t *B = nullptr;
  int32_t *out = nullptr;
  int64_t M = 0, N = 0, K = 0;  // M counts rows as numel(A) / K, 0 for K == 0: not empty means M, N, K >= 1
};

// params: A i8[..., K], B i8[N, K] -> out i32[..., N]
template <class C>
int igemm(const C &c, Igemm *a) {
  if (c.nparam != 3) return E_NPARAM;
  enum { A, B, OUT };
  if (c.dtype(A) != DType::i8 || c.dtype(B) != DType::i8 || c.dtype(OUT) != DType::i32) return E_DTYPE;
  if (c.rank(A) < 1 || c.rank(B) != 2) return E_SHAPE;
  const int64_t K = c.cols(A), N = c.dim(B, 0);
  if (c.dim(B, 1) != K || K > kIgemmMaxK) return E_SHAPE;
  const int64_t M = K ? c.numel(A) / K : 0;
  if (c.numel(OUT) != M * N || c.cols(OUT) != N) return E_SHAPE;
  a->M = M;
  a->N = N;
  a->K = K;
  a->A = c.template ptr<int8_t>(A);
  a->B = c.template ptr<int8_t>(B);
  a->out = c.template ptr<int32_t>(OUT);
  if (M == 0 || N == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->out || !a->A || !a->B) return E_NULL;
  return OK;
}

template <class T>
struct MmDequant : Parsed {
  const int32_t *A = nullptr;
  const float *row_stats = nullptr;
  const float *col_stats = nullptr;
  DType bias_dt = DType::none;  // none: no bias (a "none" param or a null pointer); else f32 | f16 | bf16
  const void *bias = nullptr;
  T *out = nullptr;
  int64_t rows = 0, cols = 0, n = 0;
};

// params: A i32[..., N], row_stats f32[rows], col_stats f32[N], bias (f32|f16|bf16)[N] | none -> out T[like A]
template <class T, class C>
int mm_dequant(const C &c, MmDequant<T> *a) {
  if (c.nparam != 5) return E_NPARAM;
  enum { A, RS, CS, BIAS, OUT };
  if (c.dtype(A) != DType::i32 || c.dtype(RS) != DType::f32 || c.dtype(CS) != DType::f32 ||
      c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  const bool has_bias = !c.is_none(BIAS);
  const DType bdt = has_bias ? c.dtype(BIAS) : DType::none;
  if (has_bias && !is_float_dtype(bdt)) return E_DTYPE;
  if (c.rank(A) < 1) return E_SHAPE;
  const int64_t cols = c.cols(A), n = c.numel(A), rows = cols ? n / cols : 0;
  if (c.numel(OUT) != n || c.numel(RS) != rows || c.numel(CS) != cols || (has_bias && c.numel(BIAS) != cols))
    return E_SHAPE;
  a->rows = rows;
  a->cols = cols;
  a->n = n;
  a->A = c.template ptr<int32_t>(A);
  a->row_stats = c.template ptr<float>(RS);
  a->col_stats = c.template ptr<float>(CS);
  a->bias_dt = bdt;
  a->bias = has_bias ? c.template ptr<const void>(BIAS) : nullptr;
  a->out = c.template ptr<T>(OUT);
  if (n == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->A || !a->row_stats || !a->col_stats || !a->out) return E_NULL;
  return OK;
}

}  // namespace checks
}  // namespace bnb_ms
