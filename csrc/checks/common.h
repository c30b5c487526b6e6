// checks/common.h -- the argument checks of the native entry points, written once for the CPU library
// (csrc/cpu, g++) and the CUDA library (csrc/cuda, nvcc).  One header per feature: checks/<feature>.h.
//
// The pattern
//   * Per entry-point family, a small struct (derived from checks::Parsed) holding what the call
//     says: element pointers, sizes, scalars.  `empty` means "well-formed, nothing to compute".
//   * Per family, one function template
//         template <class T, class C> int checks::<family>(const C &c, Args<T> *a)
//     C is the call view: Call<> on the CPU (aot.h, host scalars), cuda::CudaCall on CUDA
//     (cuda/aot_cuda.cuh, scalars may sit in device memory).  T is the element type as the library
//     spells it (float / fp16_t / bf16_t on the CPU, float / __half / __nv_bfloat16 on CUDA:
//     dtype_of<T>() knows both); variants (bits, optimizer) are more template parameters.
//     It runs the op's checks in the op's order -- arity (E_NPARAM), dtypes (E_DTYPE), shapes
//     (E_SHAPE), scalars (E_VALUE), as the family needs them -- and returns the first failure, before
//     any param memory is touched (scalars excepted).  Then it fills *a; if there is nothing to
//     compute it sets a->empty and returns OK (before the null checks: an empty tensor may have a
//     null buffer); otherwise it checks the pointers the kernel needs (E_NULL) and returns OK.
//     The order is part of the op: both libraries must return the same status for every malformed
//     call (tools/gpu_check.py check_bad_calls* compares them).
//   * Each library's entry point is then
//         Call<> c(nparam, params, ndims, shapes, dtypes, stream);   // CUDA: CudaCall c(...)
//         checks::Foo<T> a;
//         if (int s = checks::foo(c, &a)) return s;
//         if (a.empty) return OK;                                     // + library work on empty input
//         ...compute (CPU) or launch (CUDA) from a...
//   * What differs between the libraries stays in the library: writes on the empty path (std::memset
//     vs cudaMemsetAsync), status outputs (a host store vs an async memset).  A write that belongs in
//     the middle of the checks (optim: the status output is zeroed once the call is known to be
//     well-formed, before the empty/null checks) is passed as a callable `on_valid()` returning a
//     status; the check returns that status if it is not OK.
//   * Headers here include only aot.h and standard headers; functions that device code also calls
//     are marked BNB_MS_HD.
#pragma once
#include <cstdint>

#include "aot.h"

#ifdef __CUDACC__
#define BNB_MS_HD __host__ __device__
#else
#define BNB_MS_HD
#endif

namespace bnb_ms {
namespace checks {

struct Parsed {
  bool empty = false;  // well-formed and nothing to compute: the entry point returns OK
};

// Number of entries of a quantization code (blockwise quantization, 8-bit optimizer state).
constexpr int64_t kCodeSize = 256;

}  // namespace checks
}  // namespace bnb_ms
