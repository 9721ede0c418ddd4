#include "coordinator/admission.h"

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "models/log/log.h"

namespace fucina {

absl::StatusOr<std::shared_ptr<Request>> AdmissionQueue::Reserve() {
  std::lock_guard<std::mutex> lock(mu_);
  if (waiting_ >= max_queue_) {
    return absl::ResourceExhaustedError(absl::StrCat("queue full: ", waiting_,
                                                     " requests waiting (--max-queue ",
                                                     max_queue_, ")"));
  }
  ++waiting_;
  auto request = std::make_shared<Request>();
  request->set_submitted_at(SteadySeconds());
  return request;
}

void AdmissionQueue::Unreserve() {
  std::lock_guard<std::mutex> lock(mu_);
  --waiting_;
}

absl::Status AdmissionQueue::Submit(const std::shared_ptr<Request>& request, GenerateJob job,
                                    int64_t context, int32_t vocab) {
  absl::Status error;
  if (job.prompt.empty()) {
    error = absl::InvalidArgumentError("empty prompt");
  } else if (static_cast<int64_t>(job.prompt.size()) >= context) {
    error = absl::InvalidArgumentError(absl::StrCat("prompt of ", job.prompt.size(),
                                                    " tokens does not fit the context of ",
                                                    context, " (--ctx)"));
  } else if (job.max_tokens < 1) {
    error = absl::InvalidArgumentError("max_tokens must be at least 1");
  } else {
    for (int32_t id : job.prompt) {
      if (id < 0 || id >= vocab) {
        error = absl::InvalidArgumentError(
            absl::StrCat("token id ", id, " outside the vocabulary [0, ", vocab, ")"));
        break;
      }
    }
  }
  if (!error.ok()) {
    Unreserve();
    return error;
  }
  if (job.request_id.empty()) {
    static std::atomic<uint64_t> next_id{1};
    job.request_id = absl::StrCat("req-", next_id.fetch_add(1));
  }
  FUCINA_LOG(kInfo).Request(job.request_id)
      << "queued: " << job.prompt.size() << " prompt tokens, max_tokens " << job.max_tokens;
  request->set_job(std::move(job));
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(request);
  }
  if (on_queued_) on_queued_();
  return absl::OkStatus();
}

std::shared_ptr<Request> AdmissionQueue::Front() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!queue_.empty() && queue_.front()->cancelled()) {
    queue_.front()->Finish(Outcome::Failure(absl::CancelledError("cancelled while queued")));
    queue_.pop_front();
    --waiting_;
  }
  return queue_.empty() ? nullptr : queue_.front();
}

void AdmissionQueue::Pop() {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return;
  queue_.pop_front();
  --waiting_;
}

void AdmissionQueue::DropCancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(queue_, [this](const std::shared_ptr<Request>& r) {
    if (!r->cancelled()) return false;
    r->Finish(Outcome::Failure(absl::CancelledError("cancelled while queued")));
    --waiting_;
    return true;
  });
}

void AdmissionQueue::FailAll(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : queue_) r->Finish(Outcome::Failure(why));
  waiting_ -= static_cast<int>(queue_.size());
  queue_.clear();
}

int AdmissionQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_;
}

bool AdmissionQueue::empty() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty();
}

}  // namespace fucina
