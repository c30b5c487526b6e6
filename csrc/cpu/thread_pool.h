// thread_pool.h -- the library's own persistent thread pool (no OpenMP).
//
// Why not OpenMP: MindSpore 2.7 links libgomp itself (every libmindspore_*.so; it is mapped after
// `import mindspore`), but its CPU ops (mul/add/matmul checked) create no OpenMP threads: they run on its
// own mindrt pool (threads "ActorThread_0" / "KernelThread_0" on 2 cores; oneDNN is built with the
// threadpool runtime on that pool), whose waits yield: the actor thread sched_yield()s for ~0.5 s after
// work, kernel threads sleep on a condition variable almost at once, a caller yields until its tasks are
// done.  After one of our OpenMP regions libgomp's workers kept spinning (a pause loop, GOMP_SPINCOUNT
// 300000 by default) on the two cores exactly when MindSpore's pool wanted them: MindSpore's mul/add ran
// up to ~40x slower in a decode step unless the user set OMP_WAIT_POLICY=PASSIVE.  This pool's workers
// spin for a few microseconds at most after a call, then sleep on a futex: between our calls they use no
// CPU.
//
// Properties (see thread_pool.cpp):
//  - threads = the CPUs this process may run on (sched_getaffinity, capped by a cgroup CPU quota);
//    BNB_MS_NUM_THREADS=<n> or bnb_ms_set_num_threads(n) override it; nothing needs them.
//  - created on the first parallel call; the calling thread does part of the work (tasks are claimed
//    one at a time, so a worker that is slow to wake up on a busy machine only takes what is left).
//  - one call at a time: a call from a second thread while the pool is busy (e.g. MindSpore's launch
//    thread and a Python thread) runs on its own thread, serially; so does a call from inside a task
//    (no nested parallelism).  No call ever waits for another call.
//  - after fork() the child gets a fresh pool on its first parallel call (pthread_atfork).
//  - the workers run each task with the caller's MXCSR (FTZ/DAZ), so results do not depend on which
//    thread ran which part.
#pragma once
#include <cstdint>

namespace bnb_ms {
namespace pool {

using TaskFn = void (*)(void *ctx, int64_t task);

// Threads a parallel call may use, the calling thread included (>= 1).  Does not start the pool.
int num_threads();

// True on a pool worker, and on a calling thread while it runs tasks of run().
bool in_parallel();

// Runs fn(ctx, t) exactly once for every t in [0, ntasks) on the calling thread and up to
// max_threads - 1 pool workers, and returns true when all have finished (an exception thrown by a
// task is rethrown here, after the others finished).  Returns false, having run nothing, when the
// call should run serially instead: ntasks < 2, max_threads < 2, called from inside a task, the pool
// busy with another thread's call, or no worker could be started.
bool run(int64_t ntasks, int max_threads, TaskFn fn, void *ctx);

// Most tasks run() accepts in one call.
constexpr int64_t kMaxTasks = (1 << 24) - 1;

}  // namespace pool
}  // namespace bnb_ms
