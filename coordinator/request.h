// One generation request as the serving side sees it: the job a front end built, and the output
// buffer between the scheduler (writer) and the front end relaying it to its client (reader).
#ifndef FUCINA_COORDINATOR_REQUEST_H_
#define FUCINA_COORDINATOR_REQUEST_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "models/grammar/grammar.h"
#include "models/sampler/sampler.h"

namespace fucina {

struct GenerateJob {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;        // stop strings, never emitted
  std::vector<int32_t> stop_token_ids;  // besides the vocabulary's end-of-generation ids
  bool ignore_eos = false;
  // Speculative decoding (verify steps of drafts, same output); unset: the server's default.
  std::optional<bool> speculative;
  // Constrained decoding (compiled once by the front end to refuse a bad one; the last stage
  // holds the matcher).
  GrammarSpec grammar;
  // Names the request on every log line of its life: the front end's reply id where it has
  // one; empty: the scheduler names it req-N when it is queued.
  std::string request_id;
};

// A piece of output: text that is safe to show (complete UTF-8, no part of a stop string) and
// the tokens generated since the previous delta.
struct Delta {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<SampleResult> samples;  // one per id
};

struct Outcome {
  absl::Status status;
  std::string finish_reason;  // stop | length
  std::string stop_sequence;  // the stop string that ended it, if one did
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;

  static Outcome Failure(absl::Status status) {
    Outcome o;
    o.status = std::move(status);
    return o;
  }
};

// One request's output buffer, shared by the front end (reader) and the scheduler (writer).
class Request {
 public:
  // ---- The reader's side. ----
  // Waits up to `wait_ms` for output. Returns the next delta, or nullopt when nothing came in
  // time or the request is finished (then done() is true and outcome() final).
  std::optional<Delta> Next(int wait_ms);
  bool done() const;
  Outcome outcome() const;
  // Stops the request at its next step and frees its KV on every stage.
  void Cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  // The prompt's length in tokens (known once submitted).
  int64_t prompt_tokens() const { return static_cast<int64_t>(job_.prompt.size()); }
  // The name of its log lines (known once submitted).
  const std::string& id() const { return job_.request_id; }

  // ---- The scheduler's side. ----
  const GenerateJob& job() const { return job_; }
  void set_job(GenerateJob job) { job_ = std::move(job); }
  double submitted_at() const { return submitted_at_; }
  void set_submitted_at(double seconds) { submitted_at_ = seconds; }
  void Push(Delta delta);
  // The first call sets the outcome (and logs it); later ones are ignored.
  void Finish(Outcome outcome);

 private:
  void LogOutcome(const Outcome& outcome) const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Delta> deltas_;
  bool done_ = false;
  Outcome outcome_;
  std::atomic<bool> cancelled_{false};
  GenerateJob job_;          // set before the scheduler sees the request, then read-only
  double submitted_at_ = 0;  // seconds on a steady clock
};

// Seconds on a steady clock (the time base of Request::submitted_at and the latency metrics).
double SteadySeconds();

// Hands the request's output to `on_delta` until it finishes. `client_gone` is polled every
// 50 ms; when it says so, or `on_delta` returns false, the request is cancelled (its KV freed).
Outcome RelayRequest(Request& request, const std::function<bool()>& client_gone,
                     const std::function<bool(const Delta&)>& on_delta);

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_REQUEST_H_
