// The pipeline driver: steps the running requests through the stages in micro-batches.
//
// The running requests are split into up to `micro_batches` groups, each with at most one step
// in flight: a Forward to stage 0, which hands its rows on from stage to stage itself and
// answers with the last stage's samples (the coordinator never carries activations). A group
// whose reply is in starts its next step at once, so with S stages and S groups every stage
// computes a different group at the same time.
//
// Continuous batching: a request joins the smallest group at that group's next step and leaves
// when it finishes. A step spends a token budget (`max_step_tokens`) on its group's decode
// tokens first, one per decoding request, and on prompt chunks after (an equal share for every
// prompt, then what is left to the oldest): a long prompt is prefilled over several steps while
// the others keep decoding, and a short one that arrives meanwhile is not kept waiting behind
// it. A request's rows are computed the same whatever its group or chunks, so its output is
// too.
//
// Speculative decoding: a decoding request's drafter (on this thread: token ids only) proposes
// tokens to follow its last one; the step carries them as one segment of 1 + k positions
// (counted against max_step_tokens, decode tokens first), the last stage returns the accepted
// ones and the sample after them, and the next step's pos0 drops the rejected rows on every
// stage. A request's output is the same with and without it.
//
// Threading: one owner thread calls everything; replies arrive on the entry client's threads
// and are handed back to the owner through Hooks::post.
#ifndef FUCINA_COORDINATOR_PIPELINE_DRIVER_H_
#define FUCINA_COORDINATOR_PIPELINE_DRIVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/metrics.h"
#include "coordinator/request_output.h"
#include "coordinator/slot_table.h"
#include "worker/worker_client.h"

namespace fucina {

struct DriverOptions {
  int micro_batches = 1;
  int64_t max_step_tokens = 512;
  // Requests that do not say decode speculatively: each decode step carries the drafter's
  // tokens (models/speculative/drafter.h) and the last stage verifies them (Segment.drafts).
  bool speculative = false;
  int max_draft = 8;
};

class PipelineDriver {
 public:
  struct Hooks {
    // Runs `fn` on the owner thread soon; called from any thread.
    std::function<void(std::function<void()> fn)> post;
    // A worker failed a step (stage 0 itself, or the stage a chain failure names): the status
    // the running requests fail with. The owner re-plans.
    std::function<absl::Status(const std::string& worker_id, const absl::Status& why)>
        worker_failed;
    // The running count changed; runs before the request that left hears of its end.
    std::function<void()> counts_changed;
  };

  // `slots` and `metrics` (may be null) outlive the driver.
  PipelineDriver(SlotTable& slots, Metrics* metrics, Hooks hooks);
  ~PipelineDriver();

  // A new plan: steps go to `entry`, stage 0, whose worker is `entry_id`. Replies to the steps
  // of earlier plans are dropped. Nothing may be running (FailAll first).
  void Reset(std::shared_ptr<WorkerClient> entry, std::string entry_id,
             const DriverOptions& options);
  // A request starts running in `slot` (busy; holding `output`'s cached prompt tokens once
  // `ops`, the slot table's operations for it, are applied: they ride in its first step).
  void Add(std::unique_ptr<RequestOutput> output, SlotTable::Slot* slot, SessionOpList ops);
  // Starts the next step of every group that has requests (or session operations) and no step
  // in flight; cancelled requests of those groups leave first (their sessions freed in that
  // step). Returns how many left.
  int Launch();
  // Fails every running request with `status`. Their sessions are not released: a re-plan,
  // which drops every session, or shutdown follows.
  void FailAll(const absl::Status& status);

  int running() const { return static_cast<int>(running_.size()); }
  int in_flight() const { return in_flight_; }
  int groups() const;

 private:
  struct Running;
  struct Group;

  int LaunchGroup(int g);  // the requests that left
  // `arrived`: when the reply reached the client's thread (the mailbox wait follows).
  void OnReply(uint64_t epoch, int g, std::chrono::steady_clock::time_point arrived,
               absl::StatusOr<wire::ForwardResponse> reply);
  // Takes `r` out of its group and the running set, then ends it: OK keeps its session
  // resident, an error frees it.
  void End(Running* r, const absl::Status& status);

  SlotTable& slots_;
  Metrics* metrics_;
  Hooks hooks_;
  DriverOptions options_;
  std::shared_ptr<WorkerClient> entry_;
  std::string entry_id_;
  uint64_t epoch_ = 0;  // bumped by Reset and FailAll: older replies are dropped
  int in_flight_ = 0;
  std::vector<std::unique_ptr<Running>> running_;  // in arrival order
  std::vector<Group> groups_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_PIPELINE_DRIVER_H_
