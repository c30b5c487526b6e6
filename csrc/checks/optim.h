// checks/optim.h -- argument checks of the fused optimizer updates (c<opt>32bit_grad_* with 32-bit
// state, c<opt>_8bit_blockwise_grad_* with blockwise 8-bit state), shared by csrc/cpu/optim.cpp and
// csrc/cuda/optim.cu, with the vocabulary both libraries use (Opt, two_state, Hyper).  The pattern
// is described in checks/common.h.
//
// Both families zero their int32[1] status output once the call is known to be well-formed, before
// the empty/null checks; the libraries write it differently, so the check calls `on_valid()` (after
// filling a->status, which may be null) at that point and returns its status if it is not OK.
#pragma once
#include "checks/common.h"

namespace bnb_ms {

enum Opt { ADAM, MOMENTUM, RMSPROP, LION, ADAGRAD, ADEMAMIX };
BNB_MS_HD constexpr bool two_state(Opt O) { return O == ADAM || O == ADEMAMIX; }

// The hyper-parameters as the caller passed them (Python floats arrive as 0-d tensors; read in double).
struct Hyper {
  double beta1, beta2, beta3, alpha, eps, wd, lr, gnorm;
  int64_t step;
};

namespace checks {

constexpr int64_t kOptBlock = 256;  // quantization block of the 8-bit state

// Reads the scalars in this order; false (E_VALUE) if one is missing / not a number or step < 1.
template <class C>
bool read_hyper(const C &c, int beta1, int beta2, int beta3, int alpha, int eps, int wd, int step, int lr, int gnorm,
                Hyper *h) {
  if (!c.scalar(beta1, &h->beta1) || !c.scalar(beta2, &h->beta2) || !c.scalar(beta3, &h->beta3) ||
      !c.scalar(alpha, &h->alpha) || !c.scalar(eps, &h->eps) || !c.scalar(wd, &h->wd) || !c.scalar(lr, &h->lr) ||
      !c.scalar(gnorm, &h->gnorm) || !c.scalar_i64(step, &h->step))
    return false;
  return h->step >= 1;
}

template <class T>
struct Optimizer32 : Parsed {
  const T *g = nullptr;
  T *p = nullptr;
  float *s1 = nullptr;     // [n] ([2n] for AdEMAMix: m1 then m2)
  float *s2 = nullptr;     // [n] for two-state optimizers, else null
  float *unorm = nullptr;  // [>= 1] or null (no LAMB/LARS norm output)
  int32_t *status = nullptr;
  int64_t n = 0;
  Hyper h;
  double max_unorm = 0.0, param_norm = 0.0;
};

// params: g T[n], p T[n], state1 f32[n | 2n], state2 f32[n] | none, unorm_vec f32[1] | none,
//         max_unorm, param_norm, beta1, beta2, beta3, alpha, eps, weight_decay, step, lr, gnorm_scale,
//         skip_zeros  ->  status i32[1]
template <class T, Opt O, class C, class OnValid>
int optimizer_32bit(const C &c, Optimizer32<T> *a, OnValid &&on_valid) {
  if (c.nparam != 18) return E_NPARAM;
  enum { G, P, S1, S2, UN, MAXU, PN, B1, B2, B3, AL, EPS, WD, STEP, LR, GN, SKIP, OUT };
  if (c.dtype(G) != dtype_of<T>() || c.dtype(P) != dtype_of<T>() || c.dtype(S1) != DType::f32 ||
      c.dtype(OUT) != DType::i32)
    return E_DTYPE;
  const int64_t n = c.numel(P);
  if (c.numel(G) != n || c.numel(S1) != (O == ADEMAMIX ? 2 * n : n) || c.numel(OUT) != 1) return E_SHAPE;
  if (two_state(O)) {
    if (c.is_none(S2)) return E_NULL;
    if (c.dtype(S2) != DType::f32) return E_DTYPE;
    if (c.numel(S2) != n) return E_SHAPE;
    a->s2 = c.template ptr<float>(S2);
  }
  if (!c.is_none(UN)) {
    if (c.dtype(UN) != DType::f32) return E_DTYPE;
    if (c.numel(UN) < 1) return E_SHAPE;
    a->unorm = c.template ptr<float>(UN);
  }
  if (!read_hyper(c, B1, B2, B3, AL, EPS, WD, STEP, LR, GN, &a->h) || !c.scalar(MAXU, &a->max_unorm) ||
      !c.scalar(PN, &a->param_norm))
    return E_VALUE;
  a->n = n;
  a->g = c.template ptr<T>(G);
  a->p = c.template ptr<T>(P);
  a->s1 = c.template ptr<float>(S1);
  a->status = c.template ptr<int32_t>(OUT);
  if (int s = on_valid()) return s;
  if (n == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->g || !a->p || !a->s1) return E_NULL;
  return OK;
}

template <class T>
struct Optimizer8 : Parsed {
  const T *g = nullptr;
  T *p = nullptr;
  uint8_t *s1 = nullptr;      // [n] ([2n] for AdEMAMix)
  uint8_t *s2 = nullptr;      // [n] for two-state optimizers, else null
  const float *q1 = nullptr;  // code of state1 [256]
  const float *q2 = nullptr;  // code of state2 [256] or null
  float *a1 = nullptr;        // absmax of state1 [nb] ([2nb] for AdEMAMix)
  float *a2 = nullptr;        // absmax of state2 [nb] or null
  int32_t *status = nullptr;
  int64_t n = 0;
  Hyper h;
};

// params: g T[n], p T[n], state1 u8[n | 2n], state2 u8[n] | none, qmap1 f32[256], qmap2 f32[256] | none,
//         absmax1 f32[nb | 2nb], absmax2 f32[nb] | none, beta1, beta2, beta3, alpha, eps, step, lr,
//         weight_decay, gnorm_scale, skip_zeros  ->  status i32[1]          (nb = ceil(n / 256))
template <class T, Opt O, class C, class OnValid>
int optimizer_8bit_blockwise(const C &c, Optimizer8<T> *a, OnValid &&on_valid) {
  if (c.nparam != 19) return E_NPARAM;
  enum { G, P, S1, S2, Q1, Q2, A1, A2, B1, B2, B3, AL, EPS, STEP, LR, WD, GN, SKIP, OUT };
  if (c.dtype(G) != dtype_of<T>() || c.dtype(P) != dtype_of<T>() || c.dtype(S1) != DType::u8 ||
      c.dtype(Q1) != DType::f32 || c.dtype(A1) != DType::f32 || c.dtype(OUT) != DType::i32)
    return E_DTYPE;
  const int64_t n = c.numel(P), nb = (n + kOptBlock - 1) / kOptBlock;
  const int64_t mult = O == ADEMAMIX ? 2 : 1;
  if (c.numel(G) != n || c.numel(S1) != mult * n || c.numel(Q1) != kCodeSize || c.numel(A1) != mult * nb ||
      c.numel(OUT) != 1)
    return E_SHAPE;
  if (two_state(O)) {
    if (c.is_none(S2) || c.is_none(Q2) || c.is_none(A2)) return E_NULL;
    if (c.dtype(S2) != DType::u8 || c.dtype(Q2) != DType::f32 || c.dtype(A2) != DType::f32) return E_DTYPE;
    if (c.numel(S2) != n || c.numel(Q2) != kCodeSize || c.numel(A2) != nb) return E_SHAPE;
    a->s2 = c.template ptr<uint8_t>(S2);
    a->q2 = c.template ptr<float>(Q2);
    a->a2 = c.template ptr<float>(A2);
  }
  if (!read_hyper(c, B1, B2, B3, AL, EPS, WD, STEP, LR, GN, &a->h)) return E_VALUE;
  a->n = n;
  a->g = c.template ptr<T>(G);
  a->p = c.template ptr<T>(P);
  a->s1 = c.template ptr<uint8_t>(S1);
  a->q1 = c.template ptr<float>(Q1);
  a->a1 = c.template ptr<float>(A1);
  a->status = c.template ptr<int32_t>(OUT);
  if (int s = on_valid()) return s;
  if (n == 0) {
    a->empty = true;
    return OK;
  }
  if (!a->g || !a->p || !a->s1 || !a->q1 || !a->a1) return E_NULL;
  return OK;
}

}  // namespace checks
}  // namespace bnb_ms
