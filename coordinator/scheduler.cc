#include "coordinator/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "coordinator/metrics.h"
#include "models/log/log.h"

namespace fucina {

// ---- Mailbox ----

void Scheduler::Mailbox::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu);
    posted.push_back(std::move(fn));
    ++wakes;
  }
  cv.notify_all();
}

void Scheduler::Mailbox::Wake() {
  {
    std::lock_guard<std::mutex> lock(mu);
    ++wakes;
  }
  cv.notify_all();
}

// ---- Scheduler ----

Scheduler::Scheduler(const SchedulerOptions& options, const Tokenizer& tokenizer,
                     Planner planner, FailureHook on_failure, Metrics* metrics)
    : options_(options),
      tokenizer_(tokenizer),
      planner_(std::move(planner)),
      on_failure_(std::move(on_failure)),
      metrics_(metrics),
      admission_(options.max_queue, [mailbox = mailbox_] { mailbox->Wake(); }),
      driver_(slots_, metrics,
              {.post = [mailbox = mailbox_](std::function<void()> fn) {
                 mailbox->Post(std::move(fn));
               },
               .worker_failed = [this](const std::string& worker_id,
                                       const absl::Status& why) {
                 return WorkerFailure(worker_id, why);
               },
               .counts_changed = [this] { UpdateCounts(); }}),
      thread_([this] { Loop(); }) {}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  mailbox_->Wake();
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Scheduler::AcceptsLocked() const {
  // A re-plan (a worker joined or died) is a pause, not an outage: what arrives meanwhile
  // waits in the queue and runs on the new plan, or fails with the queue if that plan cannot
  // serve. Before any plan, and after one that left the model unservable, requests fail fast.
  return ready_ || (plans_ > 0 && (replan_ || replan_drain_ || planning_));
}

absl::StatusOr<std::shared_ptr<Request>> Scheduler::Reserve() {
  absl::StatusOr<std::shared_ptr<Request>> request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!AcceptsLocked()) {
      return absl::UnavailableError(absl::StrCat("model not ready: ", status_));
    }
    request = admission_.Reserve();
  }
  if (metrics_) metrics_->SetQueue(running_, admission_.waiting());
  return request;
}

void Scheduler::Unreserve(const std::shared_ptr<Request>& request) {
  admission_.Unreserve();
  if (metrics_) metrics_->SetQueue(running_, admission_.waiting());
}

absl::Status Scheduler::Submit(const std::shared_ptr<Request>& request, GenerateJob job) {
  // Under mu_, so a plan that fails the queue (not ready) cannot miss this request.
  std::lock_guard<std::mutex> lock(mu_);
  if (!AcceptsLocked()) {
    admission_.Unreserve();
    return absl::UnavailableError(absl::StrCat("model not ready: ", status_));
  }
  return admission_.Submit(request, std::move(job), context_, tokenizer_.vocab_size());
}

void Scheduler::NotifyReady() {
  // Serialized, and reading ready_ inside, so a late "not ready" from WorkerDied cannot land
  // after the re-plan's "ready" and leave health stale.
  std::lock_guard<std::mutex> hook_lock(hook_mu_);
  std::function<void(bool)> hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = ready_hook_;
  }
  if (hook) hook(ready_);
}

void Scheduler::WorkerDied(const std::string& worker_id, const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    death_ = why;
    dead_worker_ = worker_id;
    replan_ = true;
    ready_ = false;
    status_ = absl::StrCat("re-planning: ", why.message());
  }
  NotifyReady();
  {
    // Under cancel_mu_, so the cut reaches the old plan's calls only: the re-plan that the cut
    // sets off clears stage_clients_ (under the same lock) before it loads any shard.
    std::lock_guard<std::mutex> lock(cancel_mu_);
    FUCINA_LOG(kWarning) << why.message() << ": cancelling the calls in flight on "
                         << stage_clients_.size() << " stage(s)";
    for (const auto& client : stage_clients_) client->CancelInFlight();
  }
  mailbox_->Wake();
}

absl::Status Scheduler::WorkerFailure(const std::string& worker_id, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!death_.ok()) return death_;  // the re-plan is already asked for
  }
  // The hook declares the worker dead, which (through WorkerDied) cuts the other calls in
  // flight and words the failure with what the coordinator knows of the worker.
  if (on_failure_) on_failure_(worker_id, status);
  RequestReplan();
  std::lock_guard<std::mutex> lock(mu_);
  if (!death_.ok()) return death_;
  return absl::UnavailableError(absl::StrCat("worker ", worker_id, " failed: ", status.message()));
}

void Scheduler::RequestReplan(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    (drain ? replan_drain_ : replan_) = true;
  }
  mailbox_->Wake();
}

bool Scheduler::WaitForPlans(int count, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
               [&] { return plans_ >= count && !replan_ && !replan_drain_ && !planning_; });
  return ready_;
}

int Scheduler::plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_;
}

std::string Scheduler::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

int Scheduler::kv_slots() const { return kv_slots_; }
int Scheduler::resident_slots() const { return resident_; }

void Scheduler::UpdateCounts() {
  running_ = driver_.running();
  resident_ = slots_.resident();
  if (metrics_) {
    metrics_->SetQueue(running_, admission_.waiting());
    metrics_->SetKvUsage(kv_slots_ > 0 ? static_cast<double>(resident_) / kv_slots_ : 0.0);
  }
}

// ---- The loop ----

void Scheduler::Loop() {
  while (true) {
    std::deque<std::function<void()>> posted;
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(mailbox_->mu);
      posted.swap(mailbox_->posted);
      seen = mailbox_->wakes;
    }
    for (auto& fn : posted) fn();  // replies, in arrival order
    bool replan = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
      replan = replan_ || (replan_drain_ && driver_.running() == 0);
      if (replan) replan_ = replan_drain_ = false;
      planning_ = replan;
    }
    if (replan) Replan();
    // Requests that leave at launch (cancelled) free places for the queue.
    do {
      Admit();
    } while (driver_.Launch() > 0);
    UpdateCounts();
    std::unique_lock<std::mutex> lock(mailbox_->mu);
    mailbox_->cv.wait(lock, [&] { return mailbox_->wakes != seen; });
  }
  const absl::Status shutdown = absl::UnavailableError("the server is shutting down");
  driver_.FailAll(shutdown);
  admission_.FailAll(shutdown);
  UpdateCounts();
}

void Scheduler::Replan() {
  // Not ready (and not serving, for health) until the new plan's shards are loaded.
  absl::Status why = absl::UnavailableError(
      "the cluster is being re-planned (a worker joined or left)");
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = false;
    if (!death_.ok()) {
      why = death_;  // what the running requests hear, rather than the cuts it caused
    } else {
      status_ = "re-planning: a worker joined or left";
    }
  }
  NotifyReady();
  // A re-plan drops every session on every stage: no release calls, which a hung worker would
  // hold until their deadline.
  driver_.FailAll(why);
  slots_.Reset(0);
  {
    // Deaths announced before this plan concern the old one.
    std::lock_guard<std::mutex> lock(mu_);
    death_ = absl::OkStatus();
  }
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    stage_clients_.clear();
  }
  plan_ = planner_();
  const bool usable = plan_.ready && !plan_.stages.empty();
  context_ = plan_.context;
  kv_slots_ = usable ? plan_.kv_slots : 0;
  slots_.Reset(kv_slots_);
  const int groups =
      options_.micro_batches > 0 ? options_.micro_batches
                                 : std::max<int>(1, static_cast<int>(plan_.stages.size()));
  driver_.Reset(usable ? plan_.stages[0].client : nullptr,
                usable ? plan_.stages[0].worker_id : "",
                {.micro_batches = groups,
                 .max_step_tokens = options_.max_step_tokens,
                 .speculative = options_.speculative,
                 .max_draft = options_.max_draft});
  micro_batches_ = usable ? groups : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = plan_.status;
    ++plans_;
    planning_ = false;
    // A death announced while planning matters only if the new plan uses that worker (its
    // record may have been read before it was forgotten): then the loop plans again.
    const bool uses_dead = !death_.ok() && plan_.Uses(dead_worker_);
    if (!death_.ok() && !uses_dead) {
      death_ = absl::OkStatus();
      replan_ = false;
    }
    ready_ = usable && !uses_dead;
    // Fail fast: nothing queued can run until a worker joins.
    if (!ready_) admission_.FailAll(absl::UnavailableError("model not ready: " + status_));
  }
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    for (const StagePlan& stage : plan_.stages) {
      if (stage.client != nullptr) stage_clients_.push_back(stage.client);
    }
  }
  cv_.notify_all();
  NotifyReady();
  UpdateCounts();
}

void Scheduler::Admit() {
  // A queued request whose client left gives its place back at once, even while every place
  // in the batch is taken.
  admission_.DropCancelled();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ready_ || replan_ || replan_drain_) return;
  }
  while (driver_.running() < options_.batch) {
    std::shared_ptr<Request> request = admission_.Front();
    if (request == nullptr) return;
    int64_t cached = 0;
    SessionOpList ops;
    SlotTable::Slot* slot = slots_.Acquire(request->job().prompt, &cached, &ops);
    if (slot == nullptr) return;  // every slot busy: the queue waits
    admission_.Pop();
    FUCINA_LOG(kInfo).Request(request->id())
        << "running in session " << slot->id << ": " << cached << " of "
        << request->prompt_tokens() << " prompt tokens cached";
    driver_.Add(std::make_unique<RequestOutput>(request, tokenizer_, context_, cached, metrics_),
                slot, std::move(ops));
  }
}

absl::StatusOr<std::shared_ptr<Request>> StartRequest(
    Scheduler& scheduler, const std::function<absl::StatusOr<GenerateJob>()>& make_job) {
  auto reserved = scheduler.Reserve();
  if (!reserved.ok()) return reserved.status();
  auto job = make_job();
  if (!job.ok()) {
    scheduler.Unreserve(*reserved);
    return job.status();
  }
  if (absl::Status s = scheduler.Submit(*reserved, *std::move(job)); !s.ok()) return s;
  return reserved;
}

}  // namespace fucina
