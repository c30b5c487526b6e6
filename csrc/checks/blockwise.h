// checks/blockwise.h -- argument checks of cquantize_blockwise_* / cdequantize_blockwise_* (blockwise
// 8-bit quantization with a 256-entry code), shared by csrc/cpu/blockwise.cpp and
// csrc/cuda/blockwise.cu.  The pattern is described in checks/common.h.
#pragma once
#include "checks/common.h"

namespace bnb_ms {
namespace checks {

template <class T>
struct QuantizeBlockwise : Parsed {
  const float *code = nullptr;
  const T *A = nullptr;
  uint8_t *out = nullptr;
  float *absmax = nullptr;
  int64_t n = 0, blocksize = 0;
};

// params: code f32[256], A T[...], blocksize i64  ->  out u8[same shape as A], absmax f32[ceil(n/bs)]
template <class T, class C>
int quantize_blockwise(const C &c, QuantizeBlockwise<T> *a) {
  if (c.nparam != 5) return E_NPARAM;
  enum { CODE, A, BS, OUT, ABSMAX };
  if (c.dtype(CODE) != DType::f32 || c.dtype(A) != dtype_of<T>() || c.dtype(OUT) != DType::u8 ||
      c.dtype(ABSMAX) != DType::f32)
    return E_DTYPE;
  int64_t bs;
  if (!c.scalar_i64(BS, &bs) || bs <= 0) return E_VALUE;
  const int64_t n = c.numel(A);
  if (c.numel(CODE) != kCodeSize || c.numel(OUT) != n || c.numel(ABSMAX) != (n + bs - 1) / bs) return E_SHAPE;
  a->n = n;
  a->blocksize = bs;
  a->code = c.template ptr<float>(CODE);
  a->A = c.template ptr<T>(A);
  a->out = c.template ptr<uint8_t>(OUT);
  a->absmax = c.template ptr<float>(ABSMAX);
  if (n == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->code || !a->A || !a->out || !a->absmax) return E_NULL;
  return OK;
}

template <class T>
struct DequantizeBlockwise : Parsed {
  const float *code = nullptr;
  const uint8_t *A = nullptr;
  const float *absmax = nullptr;
  T *out = nullptr;
  int64_t n = 0, blocksize = 0;
};

// params: code f32[256], A u8[...], absmax f32[>= ceil(n/bs)], blocksize i64  ->  out T[same shape as A]
template <class T, class C>
int dequantize_blockwise(const C &c, DequantizeBlockwise<T> *a) {
  if (c.nparam != 5) return E_NPARAM;
  enum { CODE, A, ABSMAX, BS, OUT };
  if (c.dtype(CODE) != DType::f32 || c.dtype(A) != DType::u8 || c.dtype(ABSMAX) != DType::f32 ||
      c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  int64_t bs;
  if (!c.scalar_i64(BS, &bs) || bs <= 0) return E_VALUE;
  const int64_t n = c.numel(A);
  if (c.numel(CODE) != kCodeSize || c.numel(OUT) != n || c.numel(ABSMAX) < (n + bs - 1) / bs) return E_SHAPE;
  a->n = n;
  a->blocksize = bs;
  a->code = c.template ptr<float>(CODE);
  a->A = c.template ptr<uint8_t>(A);
  a->absmax = c.template ptr<float>(ABSMAX);
  a->out = c.template ptr<T>(OUT);
  if (n == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->code || !a->A || !a->out || !a->absmax) return E_NULL;
  return OK;
}

}  // namespace checks
}  // namespace bnb_ms
