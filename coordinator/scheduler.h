// The scheduler of one model: composes the admission queue, the KV slot table, the pipeline
// driver and the request outputs, and owns the plan (which workers hold which stage) and its
// failures.
//
// Threading: Reserve/Submit/Cancel and WorkerDied are called from front-end and watcher
// threads; everything else (the plan, the slot table, the driver, every worker call) runs on
// the scheduler's own thread, which loops:
//   run the replies that came in -> re-plan if asked -> admit queued requests into free slots
//   -> start the next step of every idle micro-batch -> sleep until something happens.
// Requests get their output through their own Request buffer, so a slow reader never blocks
// the loop.
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
#include "coordinator/admission.h"
#include "coordinator/pipeline_driver.h"
#include "coordinator/placement.h"
#include "coordinator/request.h"
#include "coordinator/slot_table.h"
#include "models/tokenizer/tokenizer.h"
#include "worker/worker_client.h"

namespace fucina {

class Metrics;

struct SchedulerOptions {
  int max_queue = 64;  // requests admitted but not yet running
  int batch = 4;       // requests running at once, across all micro-batches
  int micro_batches = 0;  // groups stepped independently; 0: one per stage
  int64_t max_step_tokens = 512;  // tokens per step of a group: decode first, prompt chunks after
  bool speculative = false;  // --spec: requests decode speculatively unless they opt out
  int max_draft = 8;         // --spec-max: longest draft per verify step
};

class Scheduler {
 public:
  // Makes (places and loads) the plan over the current workers; runs on the scheduler thread.
  using Planner = std::function<ClusterPlan()>;
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
  int waiting() const { return admission_.waiting(); }
  int kv_slots() const;
  int resident_slots() const;
  // Micro-batches of the current plan (0 before one is ready).
  int micro_batches() const { return micro_batches_; }

 private:
  // What wakes the loop: work posted for it (replies) and changes it must look at. Shared
  // with the callbacks of calls in flight, which may outlive the scheduler: what they post
  // after it stopped is dropped unrun.
  struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> posted;
    uint64_t wakes = 0;  // the loop sleeps until this changes

    void Post(std::function<void()> fn);
    void Wake();
  };

  void Loop();
  void Replan();
  void Admit();
  void UpdateCounts();  // running, waiting, resident and KV usage: atomics and gauges
  // Calls the ready hook with the current readiness; from any thread.
  void NotifyReady();
  // What a failure of `worker_id`'s call means: the death WorkerDied announced (which cut the
  // call), or else that worker failed, which is reported and starts a re-plan.
  absl::Status WorkerFailure(const std::string& worker_id, const absl::Status& status);
  // Whether Reserve and Submit take a request now. Holds mu_.
  bool AcceptsLocked() const;

  SchedulerOptions options_;
  const Tokenizer& tokenizer_;
  Planner planner_;
  FailureHook on_failure_;
  Metrics* metrics_;
  std::shared_ptr<Mailbox> mailbox_ = std::make_shared<Mailbox>();
  AdmissionQueue admission_;

  // Guards replan_, replan_drain_, planning_, stopping_, status_, plans_, death_, dead_worker_,
  // ready_hook_; ready_ changes under it.
  mutable std::mutex mu_;
  std::condition_variable cv_;  // WaitForPlans sleeps on it
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
  std::atomic<int> running_{0};
  std::atomic<int> kv_slots_{0};
  std::atomic<int> resident_{0};
  std::atomic<int> micro_batches_{0};
  std::atomic<int64_t> context_{0};

  // ---- Scheduler thread only. ----
  ClusterPlan plan_;  // the planner's last, stepped here
  SlotTable slots_;
  PipelineDriver driver_;
  std::thread thread_;  // last
};

// What every front end does with a request, in this order: takes a queue place (a full server
// refuses before spending time on tokenization), builds the job with `make_job` (tokenization,
// templates), submits. On error the place is given back and the status is what to answer.
absl::StatusOr<std::shared_ptr<Request>> StartRequest(
    Scheduler& scheduler, const std::function<absl::StatusOr<GenerateJob>()>& make_job);

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_SCHEDULER_H_
