// checks/int8.h -- argument checks of the LLM.int8() entry points (cint8_vector_quant, cigemmlt_32,
// cdequant_mm_int32_{fp16,fp32,bf16}, cint8_mixed_mm_dequant_{fp16,fp32,bf16}, cint8_linear_{fp16,fp32,bf16}),
// shared by csrc/cpu/int8.cpp and csrc/cuda/int8.cu.  The pattern is described in checks/common.h.
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
  int32_t *has_error = nullptr;  // int32[1], or null: a caller without it (3 params) gets failures as the status
  int64_t M = 0, N = 0, K = 0;  // M counts rows as numel(A) / K, 0 for K == 0: not empty means M, N, K >= 1
};

// params: A i8[..., K], B i8[N, K] -> out i32[..., N], has_error i32[1] (the op table's row; ctypes callers may
// leave has_error out)
template <class C>
int igemm(const C &c, Igemm *a) {
  if (c.nparam != 3 && c.nparam != 4) return E_NPARAM;
  enum { A, B, OUT, HAS_ERROR };
  const bool he = c.nparam == 4;
  if (c.dtype(A) != DType::i8 || c.dtype(B) != DType::i8 || c.dtype(OUT) != DType::i32 ||
      (he && c.dtype(HAS_ERROR) != DType::i32))
    return E_DTYPE;
  if (c.rank(A) < 1 || c.rank(B) != 2) return E_SHAPE;
  const int64_t K = c.cols(A), N = c.dim(B, 0);
  if (c.dim(B, 1) != K || K > kIgemmMaxK) return E_SHAPE;
  const int64_t M = K ? c.numel(A) / K : 0;
  if (c.numel(OUT) != M * N || c.cols(OUT) != N || (he && c.numel(HAS_ERROR) != 1)) return E_SHAPE;
  if (he) {
    if (!c.params[HAS_ERROR]) return E_NULL;
    a->has_error = c.template ptr<int32_t>(HAS_ERROR);
  }
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

// Product of all dimensions of param i but the last (the rows of its row-major 2-D view; 1 for rank <= 1).
template <class C>
int64_t lead_rows(const C &c, int i) {
  int64_t n = 1;
  for (int d = 0; d + 1 < c.rank(i); ++d) n *= c.dim(i, d);
  return n;
}

template <class T>
struct MixedMmDequant : Parsed {
  const int32_t *C = nullptr;
  const float *row_stats = nullptr;
  const float *col_stats = nullptr;
  DType bias_dt = DType::none;  // none | f32 | f16 | bf16
  const void *bias = nullptr;
  const T *A = nullptr;
  const int8_t *CB = nullptr;
  const uint8_t *col_flags = nullptr;
  T *out = nullptr;
  int64_t rows = 0, N = 0, K = 0;
};

// params: C i32[..., N], row_stats f32[rows], col_stats f32[N], bias (f32|f16|bf16)[N] | none,
//         A T[..., K] (same rows), CB i8[N, K], col_flags u8[K] -> out T[..., N] (like C)
template <class T, class C>
int mixed_mm_dequant(const C &c, MixedMmDequant<T> *a) {
  if (c.nparam != 8) return E_NPARAM;
  enum { CI, RS, CS, BIAS, A, CB, FLAGS, OUT };
  if (c.dtype(CI) != DType::i32 || c.dtype(RS) != DType::f32 || c.dtype(CS) != DType::f32 ||
      c.dtype(A) != dtype_of<T>() || c.dtype(CB) != DType::i8 || c.dtype(FLAGS) != DType::u8 ||
      c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  const bool has_bias = !c.is_none(BIAS);
  const DType bdt = has_bias ? c.dtype(BIAS) : DType::none;
  if (has_bias && !is_float_dtype(bdt)) return E_DTYPE;
  if (c.rank(CI) < 1 || c.rank(A) < 1 || c.rank(CB) != 2 || c.rank(OUT) < 1) return E_SHAPE;
  const int64_t N = c.cols(CI), K = c.cols(A), rows = lead_rows(c, CI);
  if (lead_rows(c, A) != rows || c.dim(CB, 0) != N || c.dim(CB, 1) != K || c.numel(RS) != rows ||
      c.numel(CS) != N || (has_bias && c.numel(BIAS) != N) || c.numel(FLAGS) != K || lead_rows(c, OUT) != rows ||
      c.cols(OUT) != N)
    return E_SHAPE;
  a->rows = rows;
  a->N = N;
  a->K = K;
  a->C = c.template ptr<int32_t>(CI);
  a->row_stats = c.template ptr<float>(RS);
  a->col_stats = c.template ptr<float>(CS);
  a->bias_dt = bdt;
  a->bias = has_bias ? c.template ptr<const void>(BIAS) : nullptr;
  a->A = c.template ptr<const T>(A);
  a->CB = c.template ptr<int8_t>(CB);
  a->col_flags = c.template ptr<uint8_t>(FLAGS);
  a->out = c.template ptr<T>(OUT);
  if (rows == 0 || N == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->C || !a->row_stats || !a->col_stats || !a->out || (K && (!a->A || !a->CB || !a->col_flags))) return E_NULL;
  return OK;
}

template <class T>
struct Int8Linear : Parsed {
  const T *A = nullptr;
  const int8_t *CB = nullptr;
  const float *SCB = nullptr;
  DType bias_dt = DType::none;  // none | f32 | f16 | bf16
  const void *bias = nullptr;
  float threshold = 0.0f;
  T *out = nullptr;
  uint8_t *col_flags = nullptr;
  int64_t rows = 0, N = 0, K = 0;
};

// params: A T[..., K], CB i8[N, K], SCB f32[N], bias (f32|f16|bf16)[N] | none, threshold f32
//         -> out T[..., N], col_flags u8[K]
// empty (rows, N or K is 0): the library writes col_flags = 0 and, for K == 0, out = 0.
template <class T, class C>
int int8_linear(const C &c, Int8Linear<T> *a) {
  if (c.nparam != 7) return E_NPARAM;
  enum { A, CB, SCB, BIAS, THR, OUT, FLAGS };
  if (c.dtype(A) != dtype_of<T>() || c.dtype(CB) != DType::i8 || c.dtype(SCB) != DType::f32 ||
      c.dtype(OUT) != dtype_of<T>() || c.dtype(FLAGS) != DType::u8)
    return E_DTYPE;
  const bool has_bias = !c.is_none(BIAS);
  const DType bdt = has_bias ? c.dtype(BIAS) : DType::none;
  if (has_bias && !is_float_dtype(bdt)) return E_DTYPE;
  if (c.rank(A) < 1 || c.rank(CB) != 2 || c.rank(OUT) < 1) return E_SHAPE;
  const int64_t K = c.cols(A), N = c.dim(CB, 0), rows = lead_rows(c, A);
  if (c.dim(CB, 1) != K || K > kIgemmMaxK || c.numel(SCB) != N || (has_bias && c.numel(BIAS) != N) ||
      lead_rows(c, OUT) != rows || c.cols(OUT) != N || c.numel(FLAGS) != K)
    return E_SHAPE;
  float thr;
  if (!c.scalar_f32(THR, &thr) || !(thr >= 0.0f)) return E_VALUE;
  a->threshold = thr;
  a->rows = rows;
  a->N = N;
  a->K = K;
  a->A = c.template ptr<const T>(A);
  a->CB = c.template ptr<int8_t>(CB);
  a->SCB = c.template ptr<float>(SCB);
  a->bias_dt = bdt;
  a->bias = has_bias ? c.template ptr<const void>(BIAS) : nullptr;
  a->out = c.template ptr<T>(OUT);
  a->col_flags = c.template ptr<uint8_t>(FLAGS);
  if (rows == 0 || N == 0 || K == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->A || !a->CB || !a->SCB || !a->out || !a->col_flags) return E_NULL;
  return OK;
}

}  // namespace checks
}  // namespace bnb_ms
