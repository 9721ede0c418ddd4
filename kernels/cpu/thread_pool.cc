#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <cstdlib>
#include <string>

namespace fucina {
namespace {

// Spin before sleeping: ~2000 pauses is 10-300 us depending on the CPU's pause latency,
// longer than the gap between the matvecs of one decode step, short enough that an
// oversubscribed machine (more threads than free cores) falls back to futex waits quickly.
constexpr int kSpinIterations = 2000;

inline void CpuRelax() { _mm_pause(); }

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  workers_.reserve(num_threads_ - 1);
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunErased(JobFn fn, void* ctx) {
  if (num_threads_ == 1) {
    fn(ctx, 0);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);  // publishes job_fn_/job_ctx_.
  generation_.notify_all();
  fn(ctx, 0);
  // Wait for the workers: spin briefly, then sleep until the last one notifies.
  int pending = pending_.load(std::memory_order_acquire);
  for (int spin = 0; pending != 0 && spin < kSpinIterations; ++spin) {
    CpuRelax();
    pending = pending_.load(std::memory_order_acquire);
  }
  while (pending != 0) {
    pending_.wait(pending, std::memory_order_acquire);
    pending = pending_.load(std::memory_order_acquire);
  }
}

void ThreadPool::WorkerLoop(int thread) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      CpuRelax();
      gen = generation_.load(std::memory_order_acquire);
    }
    while (gen == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    job_fn_(job_ctx_, thread);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = [] {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    if (const char* env = std::getenv("FUCINA_THREADS")) n = std::atoi(env);
    return new ThreadPool(n > 0 ? n : 1);
  }();
  return *pool;
}

}  // namespace fucina
