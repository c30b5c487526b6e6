// checks/fourbit.h -- argument checks of the 4-bit (NF4/FP4) entry points, shared by csrc/cpu/fourbit.cpp and
// csrc/cuda/fourbit.cu (the pattern: checks/common.h): cquantize_blockwise_*_{fp4,nf4},
// cdequantize_blockwise_*_{fp4,nf4}, cgemm_4bit_inference_naive_* and the fused linear forward clinear_4bit_*.
#pragma once
#include "checks/common.h"

namespace bnb_ms {
namespace checks {

constexpr int64_t kCode4Size = 16;  // entries of a 4-bit code

template <class T>
struct Quantize4 : Parsed {
  const float *code = nullptr;  // [16]
  const T *A = nullptr;         // [n]
  uint8_t *out = nullptr;       // [(n+1)/2] packed, element 2j in the high nibble
  float *absmax = nullptr;      // [nb]
  int64_t n = 0, nb = 0, bs = 0;
};

// params: code f32[16], A T[...], blocksize i64 -> out u8[(n+1)/2, 1], absmax f32[ceil(n/bs)]  (bs even)
template <class T, class C>
int quantize4(const C &c, Quantize4<T> *a) {
  if (c.nparam != 5) return E_NPARAM;
  enum { CODE, A, BS, OUT, ABSMAX };
  if (c.dtype(CODE) != DType::f32 || c.dtype(A) != dtype_of<T>() || c.dtype(OUT) != DType::u8 ||
      c.dtype(ABSMAX) != DType::f32)
    return E_DTYPE;
  int64_t bs;
  if (!c.scalar_i64(BS, &bs) || bs <= 0 || bs % 2) return E_VALUE;
  const int64_t n = c.numel(A), nb = (n + bs - 1) / bs;
  if (c.numel(CODE) != kCode4Size || c.numel(OUT) != (n + 1) / 2 || c.numel(ABSMAX) != nb) return E_SHAPE;
  a->n = n, a->nb = nb, a->bs = bs;
  if (n == 0) {
    a->empty = true;
    return OK;
  }
  if (!c.params[CODE] || !c.params[A] || !c.params[OUT] || !c.params[ABSMAX]) return E_NULL;
  a->code = c.template ptr<float>(CODE);
  a->A = c.template ptr<T>(A);
  a->out = c.template ptr<uint8_t>(OUT);
  a->absmax = c.template ptr<float>(ABSMAX);
  return OK;
}

template <class T>
struct Dequantize4 : Parsed {
  const float *code = nullptr;    // [16]
  const uint8_t *A = nullptr;     // >= (n+1)/2 packed bytes
  const float *absmax = nullptr;  // >= ceil(n/bs)
  T *out = nullptr;               // [n]
  int64_t n = 0, bs = 0;
};

// params: code f32[16], A u8[>= (n+1)/2], absmax f32[>= ceil(n/bs)], blocksize i64, n i64 -> out T[n]  (bs even)
template <class T, class C>
int dequantize4(const C &c, Dequantize4<T> *a) {
  if (c.nparam != 6) return E_NPARAM;
  enum { CODE, A, ABSMAX, BS, N, OUT };
  if (c.dtype(CODE) != DType::f32 || c.dtype(A) != DType::u8 || c.dtype(ABSMAX) != DType::f32 ||
      c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  int64_t bs, n;
  if (!c.scalar_i64(BS, &bs) || bs <= 0 || bs % 2 || !c.scalar_i64(N, &n) || n < 0) return E_VALUE;
  if (c.numel(CODE) != kCode4Size || c.numel(OUT) != n || c.numel(A) < (n + 1) / 2 ||
      c.numel(ABSMAX) < (n + bs - 1) / bs)
    return E_SHAPE;
  a->n = n, a->bs = bs;
  if (n == 0) {
    a->empty = true;
    return OK;
  }
  if (!c.params[CODE] || !c.params[A] || !c.params[OUT] || !c.params[ABSMAX]) return E_NULL;
  a->code = c.template ptr<float>(CODE);
  a->A = c.template ptr<uint8_t>(A);
  a->absmax = c.template ptr<float>(ABSMAX);
  a->out = c.template ptr<T>(OUT);
  return OK;
}

template <class T>
struct Gemv4 : Parsed {
  const T *A = nullptr;           // [M, K]
  const uint8_t *B = nullptr;     // >= (N*K+1)/2 packed bytes of the [N, K] weight
  const float *absmax = nullptr;  // >= ceil(N*K/bs)
  const float *code = nullptr;    // [16]
  T *out = nullptr;               // [M, N]
  int64_t M = 0, N = 0, K = 0, bs = 0;
};

// params: A T[..., K] (M rows), B u8[>= (N*K+1)/2], absmax f32[>= ceil(N*K/bs)], code f32[16], blocksize i64,
//   n_out i64 -> out T[..., N]  (bs even; K == 0 is well-formed: the libraries write zeros)
template <class T, class C>
int gemv4(const C &c, Gemv4<T> *a) {
  if (c.nparam != 7) return E_NPARAM;
  enum { A, B, ABSMAX, CODE, BS, NOUT, OUT };
  if (c.dtype(A) != dtype_of<T>() || c.dtype(B) != DType::u8 || c.dtype(ABSMAX) != DType::f32 ||
      c.dtype(CODE) != DType::f32 || c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  int64_t bs, N;
  if (!c.scalar_i64(BS, &bs) || bs <= 0 || bs % 2 || !c.scalar_i64(NOUT, &N) || N < 0) return E_VALUE;
  if (c.rank(A) < 1) return E_SHAPE;
  const int64_t K = c.cols(A), M = c.rows(A);
  if (c.numel(CODE) != kCode4Size || c.numel(OUT) != M * N || c.numel(B) < (N * K + 1) / 2 ||
      c.numel(ABSMAX) < (N * K + bs - 1) / bs)
    return E_SHAPE;
  a->M = M, a->N = N, a->K = K, a->bs = bs;
  if (M * N == 0) {
    a->empty = true;
    return OK;
  }
  if (!c.params[A] || !c.params[B] || !c.params[ABSMAX] || !c.params[CODE] || !c.params[OUT]) return E_NULL;
  a->A = c.template ptr<T>(A);
  a->B = c.template ptr<uint8_t>(B);
  a->absmax = c.template ptr<float>(ABSMAX);
  a->code = c.template ptr<float>(CODE);
  a->out = c.template ptr<T>(OUT);
  return OK;
}

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
  if (c.numel(CODE) != kCode4Size || c.numel(OUT) != M * N || c.numel(B) < (N * K + 1) / 2 || c.numel(ABSMAX) < nb ||
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
