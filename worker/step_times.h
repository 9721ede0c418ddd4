// Where a stage's Forward steps spend their time (wire::StepTimes): the parts of each step's
// task on the actor, measured as laps of one clock so they add up to the task, and the waits
// around it (the executor's queue, the next stage's reply). A serving breakdown reads them
// (`fucina bench cluster-aggregate`) through the worker's metrics.
#ifndef FUCINA_WORKER_STEP_TIMES_H_
#define FUCINA_WORKER_STEP_TIMES_H_

#include <chrono>
#include <cstdint>
#include <mutex>

#include "worker/worker_client.h"

namespace fucina {

// A steady-clock duration in seconds, as the step times count them.
inline double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// Seconds by part, summed over `steps` steps (the fields of wire::StepTimes).
struct StepTimes {
  int64_t steps = 0;
  double queue = 0, session_ops = 0, validate = 0, input = 0, kernels = 0, attention = 0,
         head = 0, sampling = 0, output = 0, send = 0, chain = 0, served = 0;

  void Add(const StepTimes& other);
  void ToWire(wire::StepTimes* out) const;
};

// One step's task timed as consecutive laps: each Lap adds the time since the previous one
// (or since `start`) to a part.
class StepLaps {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StepLaps(Clock::time_point start) : last_(start) { times_.steps = 1; }

  void Lap(double StepTimes::*part) {
    const Clock::time_point now = Clock::now();
    times_.*part += Seconds(now - last_);
    last_ = now;
  }
  // Moves `seconds` (measured inside an earlier lap of `from`) from `from` to `to`.
  void Move(double StepTimes::*from, double StepTimes::*to, double seconds) {
    times_.*from -= seconds;
    times_.*to += seconds;
  }
  const StepTimes& times() const { return times_; }

 private:
  Clock::time_point last_;
  StepTimes times_;
};

// Whether every segment of `request` decodes (one row, or one plus its drafts, sampled): a
// decode step, whose times are kept apart from prompt chunks' (they differ by orders of
// magnitude, and serving throughput is measured on decode). The coordinator counts its side
// of a step by the same rule, so both count the same steps.
bool IsDecodeStep(const wire::ForwardRequest& request);

// The worker's totals by kind of step, added to from the executor and from the threads replies
// arrive on.
class StepTimeTotals {
 public:
  void Add(bool decode, const StepTimes& times) {
    std::lock_guard<std::mutex> lock(mu_);
    (decode ? decode_ : other_).Add(times);
  }
  void ToWire(wire::WorkerStats* stats) const {
    std::lock_guard<std::mutex> lock(mu_);
    decode_.ToWire(stats->mutable_decode_step_times());
    other_.ToWire(stats->mutable_other_step_times());
  }

 private:
  mutable std::mutex mu_;
  StepTimes decode_, other_;
};

}  // namespace fucina

#endif  // FUCINA_WORKER_STEP_TIMES_H_
