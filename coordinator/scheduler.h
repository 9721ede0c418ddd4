// The scheduler: admission queue, KV slot table and the pipeline driver of one model.
//
// Threading: Reserve/Submit/Cancel are called from front-end threads; everything else (the slot
// table, the pipeline, every worker call) runs on the scheduler's own thread, which loops:
//   re-plan if asked -> admit queued requests into free slots -> one lockstep step for every
//   active request (a prefill chunk or one decode token each) through all stages -> deliver.
// Requests get their output through their own Request buffer, so a slow reader never blocks
// the loop.
//
// KV reuse: finished conversations stay resident as slots (LRU, at most kv_slots). A new
// request takes the resident slot sharing its longest token prefix (truncating it), or copies
// that prefix from a busy slot into a new one, and prefills only the rest.
#ifndef FUCINA_COORDINATOR_SCHEDULER_H_
#define FUCINA_COORDINATOR_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/sampler/sampler.h"
#include "models/tokenizer/tokenizer.h"
#include "worker/worker_client.h"

namespace fucina {

class Metrics;

struct GenerateJob {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;        // stop strings, never emitted
  std::vector<int32_t> stop_token_ids;  // besides the vocabulary's end-of-generation ids
  bool ignore_eos = false;
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
};

// One request's output buffer, shared by the front end (reader) and the scheduler (writer).
class Request {
 public:
  // Waits up to `wait_ms` for output. Returns the next delta, or nullopt when nothing came in
  // time or the request is finished (then done() is true and outcome() final).
  std::optional<Delta> Next(int wait_ms);
  bool done() const;
  Outcome outcome() const;
  // Stops the request at the next step and frees its KV on every stage.
  void Cancel() { cancelled_ = true; }
  // The prompt's length in tokens (known once submitted).
  int64_t prompt_tokens() const { return static_cast<int64_t>(job_.prompt.size()); }
  bool cancelled() const { return cancelled_; }

 private:
  friend class Scheduler;
  void Push(Delta delta);
  void Finish(Outcome outcome);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Delta> deltas_;
  bool done_ = false;
  Outcome outcome_;
  std::atomic<bool> cancelled_{false};
  GenerateJob job_;
  double submitted_at_ = 0;  // seconds on a steady clock
};

// A pipeline stage as the scheduler drives it.
struct StageRef {
  std::string worker_id;
  std::shared_ptr<WorkerClient> client;
  int64_t first_layer = 0, last_layer = 0;
};

struct Pipeline {
  bool ready = false;
  std::string status;  // why not ready
  std::vector<StageRef> stages;
  std::vector<std::string> worker_ids;  // every worker the plan uses: stages and expert workers
  int kv_slots = 1;
  int64_t context = 0;
};

struct SchedulerOptions {
  int max_queue = 64;       // requests admitted but not yet running
  int batch = 4;            // requests stepped together
  int64_t prefill_chunk = 512;
};

class Scheduler {
 public:
  // Builds (loads) a pipeline from the current workers; runs on the scheduler thread.
  using Planner = std::function<Pipeline()>;
  // Told when a worker failed a call (the scheduler then re-plans).
  using FailureHook = std::function<void(const std::string& worker_id, const absl::Status&)>;

  Scheduler(const SchedulerOptions& options, const Tokenizer& tokenizer, Planner planner,
            FailureHook on_failure, Metrics* metrics);
  ~Scheduler();
  // Fails what is running or queued and joins the loop (the destructor does it too); the
  // planner and failure hook are not called afterwards.
  void Stop();

  // Takes a queue place before any tokenization; RESOURCE_EXHAUSTED when the queue is full,
  // UNAVAILABLE when the model is not ready.
  absl::StatusOr<std::shared_ptr<Request>> Reserve();
  // Queues a reserved request (prompt checked against the context here).
  absl::Status Submit(const std::shared_ptr<Request>& request, GenerateJob job);
  // Gives back a reservation that will not be submitted.
  void Unreserve(const std::shared_ptr<Request>& request);

  // Called on the scheduler thread after every plan with the new readiness.
  void SetReadyHook(std::function<void(bool)> hook) {
    std::lock_guard<std::mutex> lock(mu_);
    ready_hook_ = std::move(hook);
  }
  // Asks the loop to re-plan: at once, failing the running requests (a worker died), or with
  // `drain` once they finish, admitting no new ones meanwhile (a worker joined).
  void RequestReplan(bool drain = false);
  // A worker of the current plan was declared dead from outside the loop (it stopped
  // heartbeating; it may hang rather than fail). From any thread: the model is not ready at once
  // (new requests are refused, not queued behind a hung call), the calls in flight on every stage
  // are cancelled, the running requests fail with `why`, and the loop re-plans. The failures
  // that the cancellation causes are laid to `why`, not to the stages whose calls were cut.
  void WorkerDied(const std::string& worker_id, const absl::Status& why);
  // Blocks until `count` plans have been made since start (or the timeout); the readiness.
  bool WaitForPlans(int count, int timeout_ms);
  int plans() const;
  bool ready() const { return ready_; }
  std::string status() const;
  int running() const { return running_; }
  int waiting() const { return waiting_; }
  int kv_slots() const;
  int resident_slots() const;

 private:
  struct Slot;
  struct Active;

  int64_t pipeline_context() const;
  void Loop();
  void Replan();
  void Admit();
  void Step();
  bool AcquireSlot(Active& a);
  void ReleaseSlot(uint64_t slot);
  void UpdateSlotMetrics();  // resident count and the KV usage gauge
  // Calls the ready hook with the current readiness; from any thread.
  void NotifyReady();
  // What a transport failure of `stage`'s call means: the death WorkerDied announced (which cut
  // the call), or else the stage's worker failed, which is reported and starts a re-plan.
  absl::Status StageFailure(const StageRef& stage, const absl::Status& status);
  // Runs `fn` on every stage; a failure marks the stage's worker as failed.
  absl::Status OnEveryStage(const std::function<absl::Status(WorkerClient&)>& fn);
  // Fails every running request. Their sessions are not released: only a re-plan (which
  // drops every session) or shutdown follows.
  void FailAll(const absl::Status& status);
  void Finish(Active& a, absl::Status status, const std::string& reason,
              const std::string& stop_sequence = "");
  void Deliver(Active& a, const wire::SegmentResult& result);

  SchedulerOptions options_;
  const Tokenizer& tokenizer_;
  Planner planner_;
  FailureHook on_failure_;
  Metrics* metrics_;

  // Guards queue_, replan_, planning_, stopping_, status_, plans_, death_, dead_worker_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  bool replan_ = true;
  bool replan_drain_ = false;
  bool stopping_ = false;
  int plans_ = 0;
  bool planning_ = false;
  std::string status_ = "loading";
  std::function<void(bool)> ready_hook_;
  absl::Status death_;  // set by WorkerDied until the re-plan: why calls in flight were cut
  std::string dead_worker_;  // whose death death_ is
  std::mutex hook_mu_;       // serializes the ready hook's calls (NotifyReady)
  std::mutex cancel_mu_;  // stage_clients_; held while WorkerDied cancels their calls
  std::vector<std::shared_ptr<WorkerClient>> stage_clients_;  // the plan's, for WorkerDied
  std::atomic<bool> ready_{false};
  std::atomic<int> waiting_{0};
  std::atomic<int> running_{0};
  std::atomic<int> kv_slots_{0};
  std::atomic<int> resident_{0};
  std::atomic<int64_t> context_{0};

  // ---- Scheduler thread only. ----
  Pipeline pipeline_;
  std::vector<std::unique_ptr<Active>> active_;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t next_slot_id_ = 1;
  uint64_t clock_ = 0;
  std::thread thread_;  // last
};

// What every front end does with a request, in this order: takes a queue place (a full server
// refuses before spending time on tokenization), builds the job with `make_job` (tokenization,
// templates), submits. On error the place is given back and the status is what to answer.
absl::StatusOr<std::shared_ptr<Request>> StartRequest(
    Scheduler& scheduler, const std::function<absl::StatusOr<GenerateJob>()>& make_job);

// Hands the request's output to `on_delta` until it finishes. `client_gone` is polled every
// 50 ms; when it says so, or `on_delta` returns false, the request is cancelled (its KV freed).
Outcome RelayRequest(Request& request, const std::function<bool()>& client_gone,
                     const std::function<bool(const Delta&)>& on_delta);

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_SCHEDULER_H_
