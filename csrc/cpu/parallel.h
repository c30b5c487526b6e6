// parallel.h -- parallel loops over the library's thread pool (cpu/thread_pool.h; no OpenMP).
//
// Every kernel's result is independent of how its range is split, so these give the same bytes
// for any thread count (tests/test_thread_pool.py checks 1 thread against the pool).
#pragma once
#include <cstdint>

#include "cpu/thread_pool.h"

namespace bnb_ms {

// Threads a parallel loop may use (the calling thread included).
inline int max_parallel_threads() { return pool::num_threads(); }

namespace detail {
template <class F>
struct RangeTasks {
  F *f;
  int64_t n, chunk;
  static void call(void *self, int64_t t) {
    const RangeTasks &r = *static_cast<const RangeTasks *>(self);
    const int64_t b = t * r.chunk, e = b + r.chunk < r.n ? b + r.chunk : r.n;
    if (b < e) (*r.f)(b, e);
  }
};

// f(b, e) over [0, n) in chunks of `chunk`, claimed one at a time by the pool's threads; f(0, n) on
// the calling thread when the pool cannot take the call (see pool::run).
template <class F>
inline void run_range(int64_t n, int64_t chunk, int nthreads, F &f) {
  if ((n + chunk - 1) / chunk > pool::kMaxTasks) chunk = (n + pool::kMaxTasks - 1) / pool::kMaxTasks;
  RangeTasks<F> r{&f, n, chunk};
  if (pool::run((n + chunk - 1) / chunk, nthreads, &RangeTasks<F>::call, &r)) return;
  f(0, n);
}
}  // namespace detail

// Run f(begin, end) over [0, n) in contiguous chunks, in parallel when the work is large enough that
// waking the pool (a few microseconds) is worth it.  `grain` is the minimum chunk size: n <= grain
// runs serially.  Up to 4 chunks per thread, so a thread that starts late only takes what is left.
template <class F>
inline void parallel_for(int64_t n, int64_t grain, F &&f) {
  if (n <= 0) return;
  const int nt = pool::num_threads();
  if (n > grain && nt > 1 && !pool::in_parallel()) {
    const int64_t g = grain > 1 ? grain : 1;
    int64_t ntasks = (n + g - 1) / g;
    if (ntasks > 4 * (int64_t)nt) ntasks = 4 * (int64_t)nt;
    detail::run_range(n, (n + ntasks - 1) / ntasks, nt, f);
    return;
  }
  f(0, n);
}

// Run f(begin, end) over [0, n) in chunks of `chunk` (the last one shorter), handed out to the
// threads one at a time; f(0, n) when it runs serially.
template <class F>
inline void parallel_for_dynamic(int64_t n, int64_t chunk, F &&f) {
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  const int64_t nchunks = (n + chunk - 1) / chunk;
  const int nt = pool::num_threads();
  if (nchunks > 1 && nt > 1 && !pool::in_parallel()) {
    detail::run_range(n, chunk, nt, f);
    return;
  }
  f(0, n);
}

}  // namespace bnb_ms
