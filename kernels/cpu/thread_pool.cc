#include "kernels/cpu/thread_pool.h"

#include <immintrin.h>

#include <cstdlib>

namespace fucina {
namespace {

// Spin before sleeping: ~2000 pauses is 10-300 us depending on the CPU's pause latency,
// longer than the gap between the matvecs of one decode step, short enough that an
// oversubscribed machine falls back to futex waits quickly.
constexpr int kSpinIterations = 2000;

inline void CpuRelax() { _mm_pause(); }

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {
  workers_.reserve(num_threads_ - 1);
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { WorkerLoop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

// Joining protocol (all seq_cst, a Dekker-style handshake): a worker increments active_ and
// then reads open_; the caller clears open_ and then reads active_. Either the worker sees
// open_ == false and backs off without touching the job, or the caller sees its increment and
// waits for it. job_fn_/job_ctx_ are written only while open_ is false and active_ is 0.
void ThreadPool::RunErased(JobFn fn, void* ctx) {
  job_fn_ = fn;
  job_ctx_ = ctx;
  open_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  generation_.notify_all();
  fn(ctx, 0);
  open_.store(false, std::memory_order_seq_cst);
  int active = active_.load(std::memory_order_seq_cst);
  for (int spin = 0; active != 0 && spin < kSpinIterations; ++spin) {
    CpuRelax();
    active = active_.load(std::memory_order_seq_cst);
  }
  while (active != 0) {
    active_.wait(active, std::memory_order_seq_cst);
    active = active_.load(std::memory_order_seq_cst);
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
    if (stop_.load(std::memory_order_seq_cst)) return;
    active_.fetch_add(1, std::memory_order_seq_cst);
    if (open_.load(std::memory_order_seq_cst)) job_fn_(job_ctx_, thread);
    if (active_.fetch_sub(1, std::memory_order_seq_cst) == 1) active_.notify_all();
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
