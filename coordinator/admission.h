// The admission queue: requests accepted but not yet running. A bounded FIFO filled by front-end
// threads (Reserve, Submit) and drained by the scheduler thread (Front, Pop, FailAll).
//
// A place is taken before any tokenization (Reserve), so a full server refuses a request before
// spending CPU on it; `waiting()` counts reserved and queued requests alike.
#ifndef FUCINA_COORDINATOR_ADMISSION_H_
#define FUCINA_COORDINATOR_ADMISSION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/request.h"

namespace fucina {

class AdmissionQueue {
 public:
  // `on_queued` runs (on the submitting thread, no lock held) after a request is queued.
  AdmissionQueue(int max_queue, std::function<void()> on_queued)
      : max_queue_(max_queue), on_queued_(std::move(on_queued)) {}

  // A queue place; RESOURCE_EXHAUSTED naming --max-queue when every place is taken.
  absl::StatusOr<std::shared_ptr<Request>> Reserve();
  // Gives back a place that will not be submitted.
  void Unreserve();
  // Queues a reserved request once its job fits the model: a non-empty prompt shorter than
  // `context`, token ids in [0, vocab), max_tokens >= 1 (INVALID_ARGUMENT naming what is wrong;
  // the place is given back then).
  absl::Status Submit(const std::shared_ptr<Request>& request, GenerateJob job, int64_t context,
                      int32_t vocab);

  // The oldest queued request its client still wants (the cancelled ones before it finish with
  // CANCELLED and leave); null when none.
  std::shared_ptr<Request> Front();
  // Removes Front() (it starts running).
  void Pop();
  // Finishes every cancelled request wherever it is in the queue, so a client that left gives
  // its place back even while nothing can start.
  void DropCancelled();
  // Finishes every queued request with `why` (not ready, shutting down).
  void FailAll(const absl::Status& why);

  int waiting() const;
  bool empty() const;

 private:
  const int max_queue_;
  std::function<void()> on_queued_;
  mutable std::mutex mu_;
  std::deque<std::shared_ptr<Request>> queue_;
  int waiting_ = 0;  // reserved + queued
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_ADMISSION_H_
