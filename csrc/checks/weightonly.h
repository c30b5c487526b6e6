// checks/weightonly.h -- argument checks of the weight-only int8 / int4 ops
// (c{quantize,dequantize,gemm}_weight_only_int{8,4}_*), shared by csrc/cpu/weightonly.cpp and
// csrc/cuda/weightonly.cu.  The pattern is described in checks/common.h.
#pragma once
#include "checks/common.h"

namespace bnb_ms {
namespace checks {

// Bytes per weight row: int8 one per k, int4 two nibbles per byte (an odd K pads the row).
BNB_MS_HD constexpr int64_t wo_row_bytes(int bits, int64_t K) { return bits == 8 ? K : (K + 1) / 2; }
template <int BITS> constexpr DType wo_qdtype() { return BITS == 8 ? DType::i8 : DType::u8; }

template <class T>
struct QuantizeWeightOnly : Parsed {
  const T *W = nullptr;
  uint8_t *q = nullptr;
  float *scale = nullptr;  // on the empty path the library zeroes scale[0, N) (if N and scale)
  int64_t N = 0, K = 0, rb = 0;
};

// params: W T[N, K] -> q (i8[N, K] | u8[N, (K+1)/2]), scale f32[N]
template <class T, int BITS, class C>
int quantize_weight_only(const C &c, QuantizeWeightOnly<T> *a) {
  if (c.nparam != 3) return E_NPARAM;
  enum { W, Q, SCALE };
  if (c.dtype(W) != dtype_of<T>() || c.dtype(Q) != wo_qdtype<BITS>() || c.dtype(SCALE) != DType::f32) return E_DTYPE;
  if (c.rank(W) != 2) return E_SHAPE;
  const int64_t N = c.dim(W, 0), K = c.dim(W, 1), rb = wo_row_bytes(BITS, K);
  if (c.numel(Q) != N * rb || c.numel(SCALE) != N) return E_SHAPE;
  a->N = N;
  a->K = K;
  a->rb = rb;
  a->W = c.template ptr<T>(W);
  a->q = c.template ptr<uint8_t>(Q);
  a->scale = c.template ptr<float>(SCALE);
  if (N * K == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->W || !a->q || !a->scale) return E_NULL;
  return OK;
}

template <class T>
struct DequantizeWeightOnly : Parsed {
  const uint8_t *q = nullptr;
  const float *scale = nullptr;
  T *out = nullptr;
  int64_t N = 0, K = 0, rb = 0;
};

// params: q, scale f32[N], K i64 -> W' T[N, K]
template <class T, int BITS, class C>
int dequantize_weight_only(const C &c, DequantizeWeightOnly<T> *a) {
  if (c.nparam != 4) return E_NPARAM;
  enum { Q, SCALE, KK, OUT };
  if (c.dtype(Q) != wo_qdtype<BITS>() || c.dtype(SCALE) != DType::f32 || c.dtype(OUT) != dtype_of<T>()) return E_DTYPE;
  int64_t K;
  if (!c.scalar_i64(KK, &K) || K < 0) return E_VALUE;
  const int64_t N = c.numel(SCALE), rb = wo_row_bytes(BITS, K);
  if (c.numel(Q) != N * rb || c.numel(OUT) != N * K) return E_SHAPE;
  a->N = N;
  a->K = K;
  a->rb = rb;
  a->q = c.template ptr<uint8_t>(Q);
  a->scale = c.template ptr<float>(SCALE);
  a->out = c.template ptr<T>(OUT);
  if (N * K == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->q || !a->scale || !a->out) return E_NULL;
  return OK;
}

template <class T>
struct GemmWeightOnly : Parsed {
  const T *A = nullptr;
  const uint8_t *q = nullptr;  // may be null when K == 0
  const float *scale = nullptr;
  T *out = nullptr;
  int64_t M = 0, N = 0, K = 0, rb = 0;
};

// params: A T[..., K], q, scale f32[N] -> out T[..., N]
template <class T, int BITS, class C>
int gemm_weight_only(const C &c, GemmWeightOnly<T> *a) {
  if (c.nparam != 4) return E_NPARAM;
  enum { A, Q, SCALE, OUT };
  if (c.dtype(A) != dtype_of<T>() || c.dtype(Q) != wo_qdtype<BITS>() || c.dtype(SCALE) != DType::f32 ||
      c.dtype(OUT) != dtype_of<T>())
    return E_DTYPE;
  if (c.rank(A) < 1) return E_SHAPE;
  const int64_t K = c.cols(A), M = c.rows(A), N = c.numel(SCALE), rb = wo_row_bytes(BITS, K);
  if (c.numel(Q) != N * rb || c.numel(OUT) != M * N) return E_SHAPE;
  a->M = M;
  a->N = N;
  a->K = K;
  a->rb = rb;
  a->A = c.template ptr<T>(A);
  a->q = c.template ptr<uint8_t>(Q);
  a->scale = c.template ptr<float>(SCALE);
  a->out = c.template ptr<T>(OUT);
  if (M * N == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->A || !a->scale || !a->out || (K && !a->q)) return E_NULL;
  return OK;
}

}  // namespace checks
}  // namespace bnb_ms
