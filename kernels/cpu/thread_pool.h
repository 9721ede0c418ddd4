// A persistent fork-join thread pool for kernels.
//
// Decode calls a few hundred small matvecs per token, so dispatch latency matters more than
// generality: workers spin briefly on a generation counter before sleeping on it (futex via
// std::atomic::wait), and the calling thread takes a share of every job. Work is handed out in
// chunks from an atomic counter so a core stolen by another process does not stall the job.
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

  // Calls fn(thread) once on each of the num_threads() threads (thread 0 is the caller) and
  // returns when all have finished.
  template <typename Fn>
  void Run(Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    RunErased([](void* ctx, int thread) { (*static_cast<F*>(ctx))(thread); }, &fn);
  }

  // Calls fn(begin, end, thread) over disjoint ranges covering [0, n), each at most `grain`
  // long, handed out dynamically. Returns when all ranges are done.
  template <typename Fn>
  void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (num_threads_ == 1 || n <= grain) {
      fn(int64_t{0}, n, 0);
      return;
    }
    std::atomic<int64_t> next{0};
    Run([&](int thread) {
      for (;;) {
        const int64_t begin = next.fetch_add(grain, std::memory_order_relaxed);
        if (begin >= n) break;
        fn(begin, begin + grain < n ? begin + grain : n, thread);
      }
    });
  }

  // A process-wide pool sized from FUCINA_THREADS, else the number of hardware threads.
  static ThreadPool& Default();

 private:
  using JobFn = void (*)(void* ctx, int thread);
  void RunErased(JobFn fn, void* ctx);
  void WorkerLoop(int thread);

  const int num_threads_;
  std::vector<std::thread> workers_;
  JobFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  std::atomic<uint32_t> generation_{0};  // bumped to publish a job; workers wait on it.
  std::atomic<int> pending_{0};          // workers still running the current job.
  std::atomic<bool> stop_{false};
};

}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_THREAD_POOL_H_
