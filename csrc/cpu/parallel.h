// parallel.h -- OpenMP helpers (the library still works when built without OpenMP).
#pragma once
#include <cstdint>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace bnb_ms {

// Run f(begin, end) over [0, n) in contiguous chunks, in parallel when the work is large enough
// that thread start-up (~10 us) is worth it.  `grain` is the minimum chunk size.
template <class F>
inline void parallel_for(int64_t n, int64_t grain, F &&f) {
#ifdef _OPENMP
  const int max_threads = omp_get_max_threads();
  if (n > grain && max_threads > 1 && !omp_in_parallel()) {
    int64_t nthreads = (n + grain - 1) / grain;
    if (nthreads > max_threads) nthreads = max_threads;
#pragma omp parallel num_threads((int)nthreads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      const int64_t chunk = (n + nt - 1) / nt;
      const int64_t b = t * chunk, e = b + chunk < n ? b + chunk : n;
      if (b < e) f(b, e);
    }
    return;
  }
#endif
  if (n > 0) f(0, n);
}

}  // namespace bnb_ms
