// checks/fourbit.h -- argument checks of the fused 4-bit linear forward clinear_4bit_{fp32,fp16,bf16}, shared by
// csrc/cpu/fourbit.cpp and csrc/cuda/fourbit.cu (the pattern: checks/common.h).
#pragma once
#include "checks/common.h"

namespace bnb_ms {
namespace checks {

template <class T>
struct Linear4 : Parsed {
  const T *A = nullptr;               // [M, K]
  const uint8_t *B = nullptr;         // >= (N*K+1)/2 packed bytes of the [N, K] weight
  const float *absmax = nullptr;      // fp32 [nb], when not nested
  const uint8_t *absmax_q = nullptr;  // uint8 [nb] codes, when nested
  const float *code = nullptr;        // [16]
  const float *absmax2 = nullptr, *code2 = nullptr;  // nested: fp32 [ceil(nb/bs2)], fp32 [256]
  float offset = 0.0f;                // nested: read through the call's scalar reader (host or device)
  const T *bias = nullptr;            // [N] or null
  T *out = nullptr;                   // [M, N]
  int64_t M = 0, N = 0, K = 0, bs = 0, bs2 = 1;
  bool nested = false;
};

// params: A T[..., K], B u8[>= (N*K+1)/2], absmax f32[nb] | u8[nb] (nested), code f32[16],
//   absmax2 f32[>= ceil(nb/bs2)] | none, code2 f32[256] | none, offset f32 0-d | none, bias T[N] | none,
//   blocksize i64, blocksize2 i64, n_out i64 -> out T[..., N]        (nb = ceil(N*K/blocksize))
template <class T, class C>
int linear4(const C &c, Linear4<T> *a) {
  if (c.nparam != 12) return E_NPARAM;
  enum { A, B, ABSMAX, CODE, ABSMAX2, CODE2, OFFSET, BIAS, BS, BS2, NOUT, OUT };
  const bool nested = c.dtype(ABSMAX) == DType::u8;
  if (c.dtype(A) != dtype_of<T>() || c.dtype(B) != DType::u8 || (!nested && c.dtype(ABSMAX) != DType::f32) ||
      c.dtype(CODE) != DType::f32 || c.dtype(OUT) != dtype_of<T>() || (!c.is_none(BIAS) && c.dtype(BIAS) != dtype_of<T>()))
    return E_DTYPE;
  if (nested && (c.dtype(ABSMAX2) != DType::f32 || c.dtype(CODE2) != DType::f32 || c.dtype(OFFSET) != DType::f32))
    return E_DTYPE;
  int64_t bs, bs2, N;
  if (!c.scalar_i64(BS, &bs) || bs <= 0 || bs % 2 || !c.scalar_i64(NOUT, &N) || N < 0 || !c.scalar_i64(BS2, &bs2) ||
      bs2 <= 0)
    return E_VALUE;
  if (c.rank(A) < 1) return E_SHAPE;
  const int64_t K = c.cols(A), M = c.rows(A), nb = (N * K + bs - 1) / bs;
  if (c.numel(CODE) != 16 || c.numel(OUT) != M * N || c.numel(B) < (N * K + 1) / 2 || c.numel(ABSMAX) < nb ||
      (!c.is_none(BIAS) && c.numel(BIAS) != N))
    return E_SHAPE;
  if (nested && (c.numel(CODE2) != 256 || c.numel(ABSMAX2) < (nb + bs2 - 1) / bs2 || c.rank(OFFSET) != 0))
    return E_SHAPE;
  a->M = M, a->N = N, a->K = K, a->bs = bs, a->bs2 = bs2, a->nested = nested;
  a->out = c.template ptr<T>(OUT);
  a->bias = c.is_none(BIAS) ? nullptr : c.template ptr<T>(BIAS);
  if (M * N == 0) {
    a->empty = true;
    return OK;
  }
  if (!c.params[A] || !c.params[B] || !c.params[ABSMAX] || !c.params[CODE] || !c.params[OUT] ||
      (nested && (!c.params[ABSMAX2] || !c.params[CODE2] || !c.params[OFFSET])))
    return E_NULL;
  if (nested && !c.scalar_f32(OFFSET, &a->offset)) return E_VALUE;
  a->A = c.template ptr<T>(A);
  a->B = c.template ptr<uint8_t>(B);
  a->code = c.template ptr<float>(CODE);
  if (nested) {
    a->absmax_q = c.template ptr<uint8_t>(ABSMAX);
    a->absmax2 = c.template ptr<float>(ABSMAX2);
    a->code2 = c.template ptr<float>(CODE2);
  } else {
    a->absmax = c.template ptr<float>(ABSMAX);
  }
  return OK;
}

}  // namespace checks
}  // namespace bnb_ms
