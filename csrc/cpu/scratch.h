// scratch.h -- per-thread scratch arrays aligned to a cache line.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace bnb_ms {

// get(n): n elements of T, 64-byte aligned, contents unspecified (callers write before they read); the storage
// grows and is kept, so a kernel that declares one `static thread_local` allocates nothing once it has grown.
// Why aligned: a full-width AVX-512 load that splits two cache lines costs about two loads (measured on the 4-bit
// GEMM's 4 x 6 tile, Xeon with AVX-512: 75-87 -> 110-130 GFLOP/s on one core once its operands were aligned).
template <class T>
class Scratch {
 public:
  T *get(size_t n) {
    buf_.resize(n * sizeof(T) + 64);
    return reinterpret_cast<T *>((reinterpret_cast<uintptr_t>(buf_.data()) + 63) & ~uintptr_t(63));
  }

 private:
  std::vector<unsigned char> buf_;
};

}  // namespace bnb_ms
