// thread_pool.cpp -- see thread_pool.h for what it guarantees.
//
// One job at a time.  Its owner (the thread that won `busy`) writes fn/ctx into the pool, then
// publishes `state` = job id (16 bits) | next task (24) | number of tasks (24) and bumps `epoch`,
// the futex word the workers sleep on.  Every thread (owner included) claims tasks with a CAS on
// `state`, so a claim can only succeed for the job the state names and only while tasks remain; the
// job's fn/ctx are read after a successful claim, and stay valid until that task is counted in `done`
// (the owner returns only when done == number of tasks).  A worker that wakes after the last task was
// claimed finds nothing to do and goes back to sleep without touching the job.
//
// Waiting: a worker spins for at most kSpinNs after its last task (consecutive parallel loops inside
// one kernel then reuse it without a wake-up), then sleeps on `epoch`.  The owner, once no task is
// left to claim, spins up to kSpinNs for the tasks still running elsewhere, then sleeps on `done`.
// Lost wake-ups are excluded by the usual pairing: sleepers announce themselves (seq_cst) before
// re-reading the word, wakers change the word (seq_cst) before reading the announcement, and the
// futex call itself re-checks the word.
#include "cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BNB_MS_POOL_X86 1
#endif

#include "aot.h"

namespace bnb_ms {
namespace pool {
namespace {

constexpr int64_t kSpinNs = 4000;          // bounded spin before sleeping (workers and owner)
constexpr int64_t kOwnerYieldNs = 2000000;  // the owner yields up to 2 ms for the last tasks, then sleeps
constexpr int kMaxThreads = 256;

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word must be a plain 32-bit word");

inline void cpu_relax() {
#ifdef BNB_MS_POOL_X86
  _mm_pause();
#endif
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if defined(__linux__)
inline void futex_wait(std::atomic<uint32_t> *w, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}
inline void futex_wake(std::atomic<uint32_t> *w, int n) {
  syscall(SYS_futex, reinterpret_cast<uint32_t *>(w), FUTEX_WAKE_PRIVATE, n, nullptr, nullptr, 0);
}
#else  // (only Linux is a target; elsewhere sleepers poll)
inline void futex_wait(std::atomic<uint32_t> *w, uint32_t expected) {
  if (w->load() == expected) std::this_thread::sleep_for(std::chrono::microseconds(50));
}
inline void futex_wake(std::atomic<uint32_t> *, int) {}
#endif

// Spin up to kSpinNs while *w == v, then sleep until it changes; returns the new value.
uint32_t wait_while_equal(std::atomic<uint32_t> *w, uint32_t v, std::atomic<int> *sleepers) {
  uint32_t x = w->load(std::memory_order_acquire);
  if (x != v) return x;
  const int64_t deadline = now_ns() + kSpinNs;
  for (int i = 1;; ++i) {
    cpu_relax();
    x = w->load(std::memory_order_acquire);
    if (x != v) return x;
    if ((i & 31) == 0 && now_ns() > deadline) break;
  }
  for (;;) {
    sleepers->fetch_add(1, std::memory_order_seq_cst);
    x = w->load(std::memory_order_seq_cst);
    if (x == v) futex_wait(w, v);
    sleepers->fetch_sub(1, std::memory_order_relaxed);
    x = w->load(std::memory_order_acquire);
    if (x != v) return x;
  }
}

// state word
constexpr uint64_t kTaskMask = (1ull << 24) - 1;
inline uint64_t st_ntasks(uint64_t s) { return s & kTaskMask; }
inline uint64_t st_next(uint64_t s) { return (s >> 24) & kTaskMask; }
constexpr uint64_t kNextOne = 1ull << 24;

thread_local bool tl_in_parallel = false;

struct Pool {
  // the job (written by its owner before `state` is published; read after a successful claim)
  std::atomic<TaskFn> fn{nullptr};
  std::atomic<void *> ctx{nullptr};
  std::atomic<int> max_workers{0};  // workers with a smaller index may join this job
  std::atomic<uint32_t> mxcsr{0};
  alignas(64) std::atomic<uint64_t> state{0};
  alignas(64) std::atomic<uint32_t> epoch{0};  // bumped per job; workers sleep on it
  std::atomic<int> sleepers{0};
  alignas(64) std::atomic<uint32_t> done{0};  // tasks of the current job finished; the owner sleeps on it
  std::atomic<int> owner_sleeping{0};
  alignas(64) std::atomic<bool> busy{false};
  std::atomic<int> nworkers{0};
  std::atomic<bool> failed{false};  // a task threw (first exception kept in `error`)
  std::mutex error_mu;
  std::exception_ptr error;

  void record(std::exception_ptr e) {
    std::lock_guard<std::mutex> lk(error_mu);
    if (!error) error = e;
    failed.store(true, std::memory_order_relaxed);
  }

  // Claims and runs tasks of the published job until none is left (a worker first takes the job's
  // MXCSR).
  void work(bool is_worker) {
    uint64_t s = state.load(std::memory_order_acquire);
    uint64_t last_job = ~0ull;
    for (;;) {
      const uint64_t n = st_ntasks(s), t = st_next(s);
      if (t >= n) return;
      if (!state.compare_exchange_weak(s, s + kNextOne, std::memory_order_acq_rel, std::memory_order_acquire))
        continue;
      const TaskFn f = fn.load(std::memory_order_relaxed);
      void *c = ctx.load(std::memory_order_relaxed);
#ifdef BNB_MS_POOL_X86
      if (is_worker && (s >> 48) != last_job) {
        const uint32_t want = mxcsr.load(std::memory_order_relaxed), have = _mm_getcsr();
        if ((want & ~0x3Fu) != (have & ~0x3Fu)) _mm_setcsr((have & 0x3Fu) | (want & ~0x3Fu));
      }
#endif
      last_job = s >> 48;
      try {
        f(c, (int64_t)t);
      } catch (...) {
        record(std::current_exception());
      }
      if (done.fetch_add(1, std::memory_order_seq_cst) + 1 == (uint32_t)n &&
          owner_sleeping.load(std::memory_order_seq_cst))
        futex_wake(&done, 1);
      s = state.load(std::memory_order_acquire);
    }
  }
};

void set_thread_name(int index) {
#if defined(__linux__)
  char name[16];
  std::snprintf(name, sizeof name, "bnb_ms_pool_%d", index);
  pthread_setname_np(pthread_self(), name);
#endif
}

void worker_main(Pool *p, int index, uint32_t seen) {
  tl_in_parallel = true;  // a kernel called from a task runs serially
  set_thread_name(index);
  for (;;) {
    seen = wait_while_equal(&p->epoch, seen, &p->sleepers);
    if (index < p->max_workers.load(std::memory_order_relaxed)) p->work(true);
  }
}

// ---- the process-wide pool ---------------------------------------------------------------------
std::atomic<Pool *> g_pool{nullptr};
alignas(std::mutex) unsigned char g_create_mu_storage[sizeof(std::mutex)];
std::mutex *g_create_mu = new (g_create_mu_storage) std::mutex();
std::atomic<int> g_default_threads{0};  // 0: not computed yet
std::atomic<int> g_limit{0};            // bnb_ms_set_num_threads (0: none)

int cgroup_cpu_limit() {  // cgroup v2 cpu.max "quota period" -> ceil(quota / period); 0 if none
  FILE *f = std::fopen("/sys/fs/cgroup/cpu.max", "r");
  if (!f) return 0;
  char quota[32] = {0};
  long long period = 0;
  int limit = 0;
  if (std::fscanf(f, "%31s %lld", quota, &period) == 2 && std::strcmp(quota, "max") != 0 && period > 0) {
    const long long q = std::atoll(quota);
    if (q > 0) limit = (int)((q + period - 1) / period);
  }
  std::fclose(f);
  return limit;
}

int compute_default_threads() {
  if (const char *env = std::getenv("BNB_MS_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n < kMaxThreads ? n : kMaxThreads;
  }
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = (int)std::thread::hardware_concurrency();
  const int q = cgroup_cpu_limit();
  if (q > 0 && q < n) n = q;
  if (n < 1) n = 1;
  return n < kMaxThreads ? n : kMaxThreads;
}

int default_threads() {
  int n = g_default_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    n = compute_default_threads();
    g_default_threads.store(n, std::memory_order_relaxed);
  }
  return n;
}

void atfork_child() {
  // Only the forking thread exists in the child: the parent's workers are gone, so its pool is
  // abandoned (not freed: its mutex may have been held) and the next parallel call makes a new one.
  g_pool.store(nullptr, std::memory_order_relaxed);
  g_create_mu = new (g_create_mu_storage) std::mutex();
  g_default_threads.store(0, std::memory_order_relaxed);  // the child's affinity may differ
}

const int g_atfork_registered = pthread_atfork(nullptr, nullptr, atfork_child);

// Starts worker `index`; false if the thread could not be created.  Workers block the asynchronous
// signals (they are delivered to the process's other threads, e.g. Python's main thread).
bool start_worker(Pool *p, int index) {
  sigset_t block, old;
  sigfillset(&block);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP}) sigdelset(&block, sig);
  pthread_sigmask(SIG_SETMASK, &block, &old);
  bool ok = true;
  try {
    std::thread(worker_main, p, index, p->epoch.load(std::memory_order_acquire)).detach();
  } catch (...) {
    ok = false;
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return ok;
}

// The pool, with at least `workers` workers started where possible (null if it cannot be made).
Pool *get_pool(int workers) {
  Pool *p = g_pool.load(std::memory_order_acquire);
  if (p && p->nworkers.load(std::memory_order_acquire) >= workers) return p;
  std::lock_guard<std::mutex> lk(*g_create_mu);
  p = g_pool.load(std::memory_order_relaxed);
  if (!p) {
    p = new (std::nothrow) Pool();
    if (!p) return nullptr;
    g_pool.store(p, std::memory_order_release);
  }
  for (int i = p->nworkers.load(std::memory_order_relaxed); i < workers; ++i) {
    if (!start_worker(p, i)) break;
    p->nworkers.store(i + 1, std::memory_order_release);
  }
  return p;
}

}  // namespace

int num_threads() {
  const int l = g_limit.load(std::memory_order_relaxed);
  return l > 0 ? l : default_threads();
}

bool in_parallel() { return tl_in_parallel; }

bool run(int64_t ntasks, int max_threads, TaskFn fn, void *ctx) {
  (void)g_atfork_registered;
  if (ntasks < 2 || max_threads < 2 || tl_in_parallel || ntasks > kMaxTasks) return false;
  if (max_threads > kMaxThreads) max_threads = kMaxThreads;
  Pool *p = get_pool(max_threads - 1);
  if (!p) return false;
  const int workers = std::min(max_threads - 1, p->nworkers.load(std::memory_order_acquire));
  if (workers < 1) return false;
  bool expected = false;
  if (!p->busy.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;

  // publish the job
  p->fn.store(fn, std::memory_order_relaxed);
  p->ctx.store(ctx, std::memory_order_relaxed);
  p->max_workers.store(workers, std::memory_order_relaxed);
#ifdef BNB_MS_POOL_X86
  p->mxcsr.store(_mm_getcsr(), std::memory_order_relaxed);
#endif
  p->done.store(0, std::memory_order_relaxed);
  const uint32_t e = p->epoch.load(std::memory_order_relaxed) + 1;
  p->state.store(((uint64_t)(e & 0xFFFF) << 48) | (uint64_t)ntasks, std::memory_order_release);
  p->epoch.store(e, std::memory_order_seq_cst);
  if (p->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake(&p->epoch, INT_MAX);

  // take part, then wait for the tasks still running on workers
  tl_in_parallel = true;
  p->work(false);
  tl_in_parallel = false;
  const uint32_t n = (uint32_t)ntasks;
  if (p->done.load(std::memory_order_acquire) != n) {
    // The tasks left are running on workers (at most one task each).  Spin briefly, then yield the
    // core (to that worker if it shares it), and sleep only if they take long (a preempted worker):
    // on a busy machine a sleeping owner loses its core for a whole time slice.
    const int64_t t0 = now_ns();
    for (int i = 1; p->done.load(std::memory_order_acquire) != n; ++i) {
      if (i < 64) {
        cpu_relax();
        continue;
      }
      const int64_t dt = now_ns() - t0;
      if (dt < kSpinNs) {
        cpu_relax();
      } else if (dt < kOwnerYieldNs) {
        sched_yield();
      } else {
        p->owner_sleeping.store(1, std::memory_order_seq_cst);
        for (uint32_t d; (d = p->done.load(std::memory_order_seq_cst)) != n;) futex_wait(&p->done, d);
        p->owner_sleeping.store(0, std::memory_order_relaxed);
        break;
      }
    }
  }
  std::exception_ptr err;
  if (p->failed.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lk(p->error_mu);
    err = p->error;
    p->error = nullptr;
    p->failed.store(false, std::memory_order_relaxed);
  }
  p->busy.store(false, std::memory_order_release);
  if (err) std::rethrow_exception(err);
  return true;
}

}  // namespace pool
}  // namespace bnb_ms

// Plain C helpers (ctypes): the thread count parallel kernels use.  n <= 0 restores the default (the
// CPUs this process may use, or BNB_MS_NUM_THREADS).  Returns the count now in effect.
BNB_MS_EXPORT int bnb_ms_set_num_threads(int n) {
  bnb_ms::pool::g_limit.store(n > 0 ? (n < bnb_ms::pool::kMaxThreads ? n : bnb_ms::pool::kMaxThreads) : 0,
                              std::memory_order_relaxed);
  return bnb_ms::pool::num_threads();
}
BNB_MS_EXPORT int bnb_ms_get_num_threads() { return bnb_ms::pool::num_threads(); }
// Worker threads started so far (0 until the first parallel call).
BNB_MS_EXPORT int bnb_ms_pool_workers() {
  bnb_ms::pool::Pool *p = bnb_ms::pool::g_pool.load(std::memory_order_acquire);
  return p ? p->nworkers.load(std::memory_order_acquire) : 0;
}
