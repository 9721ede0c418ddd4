// A persistent fork-join thread pool for kernels.
//
// Decode calls a few hundred small matvecs per token, so dispatch latency matters more than
// generality. Work is handed out in chunks from an atomic counter and workers join a job
// opportunistically: the caller never waits for a worker that has not started (a descheduled
// worker on a busy machine would otherwise stall every job for a time slice), only for those
// already running a chunk. Idle workers spin briefly on a generation counter, then sleep on it
// (futex via std::atomic::wait).
//
// Thread safety: one job at a time. Run/ParallelFor must not be called concurrently or from
// inside a job (callers own a pool per executor).
#ifndef FUCINA_KERNELS_CPU_THREAD_POOL_H_
#define FUCINA_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace fucina {

class ThreadPool {
 public:
  // `num_threads` counts the caller: 1 means no worker threads. Values < 1 are taken as 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, thread) over disjoint ranges covering [0, n), each at most `grain`
  // long, handed out dynamically to the caller and whichever workers join. `thread` is in
  // [0, num_threads()) and unique among concurrently running calls (per-thread scratch).
  // Returns when all ranges are done.
  template <typename Fn>
  void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (num_threads_ == 1 || n <= grain) {
      fn(int64_t{0}, n, 0);
      return;
    }
    std::atomic<int64_t> next{0};
    auto body = [&](int thread) {
      for (;;) {
        const int64_t begin = next.fetch_add(grain, std::memory_order_relaxed);
        if (begin >= n) break;
        fn(begin, begin + grain < n ? begin + grain : n, thread);
      }
    };
    using F = decltype(body);
    RunErased([](void* ctx, int thread) { (*static_cast<F*>(ctx))(thread); }, &body);
  }

  // Calls fn(part) for every part in [0, num_threads()), in parallel where workers are free.
  template <typename Fn>
  void Run(Fn&& fn) {
    ParallelFor(num_threads_, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t p = b; p < e; ++p) fn(static_cast<int>(p));
    });
  }

  // A process-wide pool sized from FUCINA_THREADS, else the number of hardware threads.
  static ThreadPool& Default();

 private:
  using JobFn = void (*)(void* ctx, int thread);
  // Publishes the job, runs it on the caller, then waits for the workers that joined.
  // `fn` must return only when no work is left to claim.
  void RunErased(JobFn fn, void* ctx);
  void WorkerLoop(int thread);

  const int num_threads_;
  std::vector<std::thread> workers_;
  JobFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  std::atomic<uint32_t> generation_{0};  // bumped to publish a job; workers wait on it.
  std::atomic<bool> open_{false};        // whether workers may still join the current job.
  std::atomic<int> active_{0};           // workers inside (or checking) the current job.
  std::atomic<bool> stop_{false};
};

}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_THREAD_POOL_H_
