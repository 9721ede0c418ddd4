#include "coordinator/request.h"

#include <chrono>

#include "absl/strings/str_format.h"
#include "models/log/log.h"

namespace fucina {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::optional<Delta> Request::Next(int wait_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(wait_ms),
               [this] { return done_ || !deltas_.empty(); });
  if (deltas_.empty()) return std::nullopt;
  Delta d = std::move(deltas_.front());
  deltas_.pop_front();
  return d;
}

bool Request::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ && deltas_.empty();
}

Outcome Request::outcome() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outcome_;
}

void Request::Push(Delta delta) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    deltas_.push_back(std::move(delta));
  }
  cv_.notify_all();
}

void Request::Finish(Outcome outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    // Logged before the reader can see the end: its last line precedes any later one.
    LogOutcome(outcome);
    done_ = true;
    outcome_ = std::move(outcome);
  }
  cv_.notify_all();
}

void Request::LogOutcome(const Outcome& outcome) const {
  const double seconds = submitted_at_ > 0 ? SteadySeconds() - submitted_at_ : 0;
  if (outcome.status.ok()) {
    FUCINA_LOG(kInfo).Request(id())
        << "finished (" << outcome.finish_reason << "): " << outcome.prompt_tokens
        << " prompt tokens (" << outcome.cached_tokens << " cached), "
        << outcome.completion_tokens << " generated, " << absl::StrFormat("%.3f", seconds)
        << " s";
    return;
  }
  const bool cancelled = absl::IsCancelled(outcome.status);
  LogMessage(cancelled ? LogSeverity::kInfo : LogSeverity::kWarning, __FILE__, __LINE__)
          .Request(id())
      << (cancelled ? "cancelled" : "failed") << " after " << outcome.completion_tokens
      << " generated tokens, " << absl::StrFormat("%.3f", seconds)
      << " s: " << outcome.status.message();
}

Outcome RelayRequest(Request& request, const std::function<bool()>& client_gone,
                     const std::function<bool(const Delta&)>& on_delta) {
  // Well inside the 1 s a disconnect may take to free its KV.
  constexpr int kPollMs = 50;
  while (!request.done()) {
    if (client_gone()) request.Cancel();
    auto d = request.Next(kPollMs);
    if (d && !request.cancelled() && !on_delta(*d)) request.Cancel();
  }
  return request.outcome();
}

}  // namespace fucina
