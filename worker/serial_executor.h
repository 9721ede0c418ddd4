// The executor an actor owns its state on: tasks run one at a time, in order, like an Asio
// strand.
//
// Post() never blocks and runs the task on the executor's thread. Call() runs fn and returns its
// result: on the calling thread when the executor is idle (as a strand's dispatch does, saving
// two thread wake-ups per call, which matter at one call per token per stage), else by posting
// and waiting. Either way no two tasks overlap, so RPC handlers and in-process clients reach an
// actor from any thread while its state is touched by one task at a time. A task runs in the
// CallScope current where it was posted, so the peer calls it makes are cut with the served
// call it works for.
#ifndef FUCINA_WORKER_SERIAL_EXECUTOR_H_
#define FUCINA_WORKER_SERIAL_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>

#include "worker/call_scope.h"

namespace fucina {

class SerialExecutor {
 public:
  SerialExecutor() : thread_([this] { Loop(); }) {}
  ~SerialExecutor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    thread_.join();  // runs what was already posted first
  }
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(Task{std::move(task), CallScope::Current()});
    }
    cv_.notify_one();
  }

  // Runs fn on the executor and returns its result. Must not be called from the executor's
  // own thread (it would wait for itself): such callers run fn directly.
  template <typename Fn>
  std::invoke_result_t<Fn> Call(Fn fn) {
    if (std::this_thread::get_id() == thread_.get_id()) return fn();
    {
      std::unique_lock<std::mutex> run(run_mu_, std::try_to_lock);
      if (run.owns_lock() && idle()) return fn();
    }
    std::packaged_task<std::invoke_result_t<Fn>()> task(std::move(fn));
    auto result = task.get_future();
    Post([&task] { task(); });
    return result.get();
  }

  // Tasks posted and not yet finished (the actor's queue depth).
  int pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(tasks_.size()) + (busy_ ? 1 : 0);
  }

 private:
  void Loop() {
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
        busy_ = true;
      }
      {
        std::lock_guard<std::mutex> run(run_mu_);
        CallScope::Enter scope(std::move(task.scope));
        task.run();
      }
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
  }

  bool idle() const {
    std::lock_guard<std::mutex> lock(mu_);
    return tasks_.empty() && !busy_;
  }

  struct Task {
    std::function<void()> run;
    std::shared_ptr<CallScope> scope;  // current where it was posted
  };

  mutable std::mutex mu_;   // tasks_, stopping_, busy_
  std::mutex run_mu_;       // held while a task runs, on whichever thread
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  bool busy_ = false;  // a posted task was taken and has not finished
  std::thread thread_;  // last: starts after the state above exists
};

}  // namespace fucina

#endif  // FUCINA_WORKER_SERIAL_EXECUTOR_H_
