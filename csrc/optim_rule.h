// optim_rule.h -- the per-element update rule of the fused optimizers, written once for the CPU library
// (csrc/cpu/optim.cpp, g++) and the CUDA kernels (csrc/cuda/optim.cu, nvcc): Adam, AdEMAMix, Momentum,
// Lion, RMSprop, Adagrad with 32-bit state, upstream's 8-bit blockwise variant of each rule, the state
// reset of a non-finite gradient element in 8-bit state, and the LAMB/LARS (max_unorm) trust-ratio step.
//
// Numerics (upstream bitsandbytes 0.50's CPU implementation; csrc/cpu/optim.cpp's header says where it
// differs from upstream's CUDA kernels): the hyper-parameter expressions are evaluated on the host in
// double and rounded to float once (OptConsts, opt_consts); every element operation is one IEEE float
// operation in the order written here.  Both libraries are built without contraction (g++
// -ffp-contract=off, nvcc -fmad=false) and sqrt and division are correctly rounded in both (no fast
// math), so the two libraries give the same bytes.  The CPU SIMD paths (cpu/optim_simd.inc) are the
// vector form of update_elem<O, true, false> below, operation for operation.
//
// Functions device code calls are BNB_MS_RULE (__host__ __device__ __forceinline__ under nvcc, an
// always-inlined host function under g++: the CPU's per-level loops rely on it being inlined).
#pragma once
#include <cmath>

#include "checks/optim.h"

#ifdef __CUDACC__
#define BNB_MS_RULE __host__ __device__ __forceinline__
#else
#define BNB_MS_RULE inline __attribute__((always_inline))
#endif

namespace bnb_ms {

// The constants of one update, as float (what a Python scalar meeting a float32 tensor is).
struct OptConsts {
  float b1, omb1, b2, omb2, b3, omb3, alpha, eps, gnorm, decay, wd, neg_lr;
  float c1, c2, eps_c2, neg_lr_c1, adam_step32;
  bool has_wd, first;
};

// Host only: double expressions, each rounded to float once.
inline OptConsts opt_consts(const Hyper &h) {
  OptConsts k;
  k.b1 = (float)h.beta1; k.omb1 = (float)(1.0 - h.beta1);
  k.b2 = (float)h.beta2; k.omb2 = (float)(1.0 - h.beta2);
  k.b3 = (float)h.beta3; k.omb3 = (float)(1.0 - h.beta3);
  k.alpha = (float)h.alpha; k.eps = (float)h.eps; k.gnorm = (float)h.gnorm;
  k.has_wd = h.wd > 0.0; k.wd = (float)h.wd; k.decay = (float)(1.0 - h.lr * h.wd);
  k.neg_lr = (float)(-h.lr);
  const double dc1 = 1.0 - std::pow(h.beta1, (double)h.step);
  const double dc2 = std::sqrt(1.0 - std::pow(h.beta2, (double)h.step));
  k.c1 = (float)dc1; k.c2 = (float)dc2;
  k.eps_c2 = (float)(h.eps * dc2);
  k.neg_lr_c1 = (float)(-h.lr / dc1);
  k.adam_step32 = (float)(-h.lr * dc2 / dc1);
  k.first = h.step == 1;
  return k;
}

BNB_MS_RULE float opt_sqrt(float x) {
#ifdef __CUDA_ARCH__
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
BNB_MS_RULE bool opt_finite(float x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// One element of the update. Q8 selects upstream's 8-bit CPU variant of the rule (Adam's denominator
// sqrt(v) / sqrt(1 - beta2^t) + eps instead of sqrt(v) + eps * sqrt(1 - beta2^t); momentum / rmsprop /
// adagrad always add p * weight_decay to the gradient).  s1b is AdEMAMix's slow EMA, s2 the second
// state (two_state(O)); the others are not touched.  UNORM (32-bit, the max_unorm path of Adam,
// Momentum, RMSprop): the raw update goes to *upd and p is not touched.
template <Opt O, bool Q8, bool UNORM>
BNB_MS_RULE void update_elem(const OptConsts &k, float g, float &p, float &s1, float &s1b, float &s2, float *upd) {
  g = g * k.gnorm;
  if (O == ADAM) {
    s1 = s1 * k.b1 + k.omb1 * g;
    s2 = s2 * k.b2 + k.omb2 * g * g;
    if (Q8) {
      const float denom = opt_sqrt(s2) / k.c2 + k.eps;
      if (k.has_wd) p = p * k.decay;
      p = p + k.neg_lr_c1 * (s1 / denom);
    } else {
      const float u = s1 / (opt_sqrt(s2) + k.eps_c2);
      if (UNORM) { *upd = u; return; }
      if (k.has_wd) p = p * k.decay;
      p = p + k.adam_step32 * u;
    }
  } else if (O == ADEMAMIX) {
    s1 = s1 * k.b1 + k.omb1 * g;
    s1b = s1b * k.b3 + k.omb3 * g;
    s2 = s2 * k.b2 + k.omb2 * g * g;
    const float u = (s1 / k.c1 + k.alpha * s1b) / (opt_sqrt(s2) / k.c2 + k.eps);
    if (k.has_wd) p = p * k.decay;
    p = p + k.neg_lr * u;
  } else if (O == MOMENTUM) {
    if (Q8 || k.has_wd) g = g + k.wd * p;
    s1 = k.first ? g : s1 * k.b1 + g;
    if (UNORM) { *upd = s1; return; }
    p = p + k.neg_lr * s1;
  } else if (O == LION) {
    if (k.has_wd) p = p * k.decay;
    const float u = s1 * k.b1 + k.omb1 * g;
    // sign(u): 1, -1, 0 for +-0, and NaN for NaN (torch.sign / np.sign: a NaN gradient reaches p)
    const float sg = u > 0.0f ? 1.0f : (u < 0.0f ? -1.0f : (u == u ? 0.0f : u));
    p = p + k.neg_lr * sg;
    s1 = s1 * k.b2 + k.omb2 * g;
  } else if (O == RMSPROP) {
    if (Q8 || k.has_wd) g = g + k.wd * p;
    s1 = s1 * k.b1 + k.omb1 * g * g;
    const float u = g / (opt_sqrt(s1) + k.eps);
    if (UNORM) { *upd = u; return; }
    p = p + k.neg_lr * u;
  } else {  // ADAGRAD
    if (Q8 || k.has_wd) g = g + k.wd * p;
    s1 = s1 + g * g;
    p = p + k.neg_lr * (g / (opt_sqrt(s1) + k.eps));
  }
}

// One element of an 8-bit blockwise update (states already dequantized). A non-finite gradient (inf
// or NaN) updates p as upstream 0.50.2's CPU rule computes it (a NaN gradient gives a NaN parameter, never
// a silently finite one; Lion's sign(inf) is a finite step, as there), and the element's states are reset
// to 0, so they stay out of the block's new absmax (an inf/NaN state would make absmax non-finite, and
// the next dequantization code * absmax would turn the block's 255 other elements into NaN).
template <Opt O>
BNB_MS_RULE void update_elem8(const OptConsts &k, float g, float &p, float &s1, float &s1b, float &s2) {
  update_elem<O, true, false>(k, g, p, s1, s1b, s2, nullptr);
  if (!opt_finite(g)) {
    s1 = 0.0f; s1b = 0.0f; s2 = 0.0f;
  }
}

// ---- the max_unorm (LAMB / LARS trust ratio) step of the 32-bit optimizers ----------------------------
// The raw updates u (update_elem<O, false, true>) and their norm are computed first; then
//   p = (wd ? p * decay : p) + coef * u,   coef = float(factor * scale),
//   scale = unorm > max_unorm * param_norm ? max_unorm * param_norm / unorm : 1   (all in double).
template <Opt O>
constexpr bool has_unorm_path() { return O == ADAM || O == MOMENTUM || O == RMSPROP; }

// Host only: the step factor (Adam: -lr * sqrt(1 - beta2^t) / (1 - beta1^t), else -lr).
template <Opt O>
inline double unorm_factor(const Hyper &h) {
  return O == ADAM ? -h.lr * std::sqrt(1.0 - std::pow(h.beta2, (double)h.step)) / (1.0 - std::pow(h.beta1, (double)h.step))
                   : -h.lr;
}

BNB_MS_RULE float unorm_coef(double factor, double unorm, double max_unorm, double param_norm) {
  const double scale = unorm > max_unorm * param_norm ? (max_unorm * param_norm) / unorm : 1.0;
  return (float)(factor * scale);
}

// Only Adam applies decoupled weight decay on this path.
template <Opt O>
BNB_MS_RULE float unorm_step(const OptConsts &k, float coef, float u, float p) {
  if (O == ADAM && k.has_wd) p = p * k.decay;
  return p + coef * u;
}

}  // namespace bnb_ms
