// checks/gemm_fp.h -- argument checks of the full-precision linear entry points cgemm_fp_{fp32,fp16,bf16}
// (out[..., N] = A[..., K] @ W[N, K]^T (+ bias)), shared by csrc/cpu/gemm_fp.cpp and csrc/cuda/gemm_fp.cu.
// The pattern is described in checks/common.h.
//
// The bias is dtype-dispatched inside the entry point (f32 | f16 | bf16, or none): the struct keeps its
// DType and an untyped pointer, and the library widens it.
#pragma once
#include "checks/common.h"

namespace bnb_ms {
namespace checks {

BNB_MS_HD constexpr bool gemm_fp_bias_dtype(DType d) { return d == DType::f32 || d == DType::f16 || d == DType::bf16; }

template <class T>
struct GemmFp : Parsed {
  const T *A = nullptr;  // [M, K] (rows of a row-major [..., K])
  const T *W = nullptr;  // [N, K]; may be null when K == 0
  DType bias_dt = DType::none;  // none: no bias (a "none" param or a null pointer); else f32 | f16 | bf16
  const void *bias = nullptr;
  T *out = nullptr;  // [M, N]
  int64_t M = 0, N = 0, K = 0;
};

// params: A T[..., K], W T[N, K], bias (f32|f16|bf16)[N] | none -> out T[..., N]
template <class T, class C>
int gemm_fp(const C &c, GemmFp<T> *a) {
  if (c.nparam != 4) return E_NPARAM;
  enum { A, W, BIAS, OUT };
  if (c.dtype(A) != dtype_of<T>() || c.dtype(W) != dtype_of<T>() || c.dtype(OUT) != dtype_of<T>()) return E_DTYPE;
  const bool has_bias = !c.is_none(BIAS);
  const DType bdt = has_bias ? c.dtype(BIAS) : DType::none;
  if (has_bias && !gemm_fp_bias_dtype(bdt)) return E_DTYPE;
  if (c.rank(A) < 1 || c.rank(W) != 2) return E_SHAPE;
  const int64_t K = c.cols(A), N = c.dim(W, 0);
  int64_t M = 1;  // product of A's leading dimensions (also when K == 0: out = bias, or 0)
  for (int d = 0; d + 1 < c.rank(A); ++d) M *= c.dim(A, d);
  if (c.dim(W, 1) != K || c.numel(OUT) != M * N || (has_bias && c.numel(BIAS) != N)) return E_SHAPE;
  a->M = M;
  a->N = N;
  a->K = K;
  a->A = c.template ptr<T>(A);
  a->W = c.template ptr<T>(W);
  a->bias_dt = bdt;
  a->bias = has_bias ? c.template ptr<const void>(BIAS) : nullptr;
  a->out = c.template ptr<T>(OUT);
  if (M * N == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->out || (K && (!a->A || !a->W))) return E_NULL;
  return OK;
}

}  // namespace checks
}  // namespace bnb_ms
