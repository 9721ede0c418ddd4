#include "coordinator/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "coordinator/metrics.h"
#include "coordinator/output_text.h"
#include "worker/activations.h"
#include "worker/sampling_wire.h"

namespace fucina {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Transport-level failures mean the worker is gone or stuck, DATA_LOSS that its model file
// broke under it; anything else is about the request.
bool IsWorkerFailure(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s) ||
         absl::IsUnknown(s) || absl::IsInternal(s) || absl::IsFailedPrecondition(s) ||
         absl::IsDataLoss(s);
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace

// ---- Request ----

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
    done_ = true;
    outcome_ = std::move(outcome);
  }
  cv_.notify_all();
}

// ---- Scheduler state ----

struct Scheduler::Slot {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // whose K/V rows every stage holds for this session
  bool busy = false;
  uint64_t last_used = 0;
};

struct Scheduler::Active {
  std::shared_ptr<Request> request;
  Slot* slot = nullptr;
  size_t prompt_pos = 0;       // next prompt token to forward
  int32_t pending = -1;        // sampled, not yet forwarded
  int64_t cached = 0;
  std::unique_ptr<OutputText> output;  // the tokens so far as the client sees them
  Delta out;                   // this step's output
  double last_token_at = 0;
  bool finished = false;
};

Scheduler::Scheduler(const SchedulerOptions& options, const Tokenizer& tokenizer,
                     Planner planner, FailureHook on_failure, Metrics* metrics)
    : options_(options),
      tokenizer_(tokenizer),
      planner_(std::move(planner)),
      on_failure_(std::move(on_failure)),
      metrics_(metrics),
      thread_([this] { Loop(); }) {}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::shared_ptr<Request>> Scheduler::Reserve() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ready_) {
    return absl::UnavailableError(absl::StrCat("model not ready: ", status_));
  }
  if (waiting_ >= options_.max_queue) {
    return absl::ResourceExhaustedError(absl::StrCat("queue full: ", waiting_.load(),
                                                     " requests waiting (--max-queue ",
                                                     options_.max_queue, ")"));
  }
  ++waiting_;
  if (metrics_) metrics_->SetQueue(running_, waiting_);
  auto request = std::make_shared<Request>();
  request->submitted_at_ = Now();
  return request;
}

void Scheduler::Unreserve(const std::shared_ptr<Request>& request) {
  --waiting_;
  if (metrics_) metrics_->SetQueue(running_, waiting_);
}

absl::Status Scheduler::Submit(const std::shared_ptr<Request>& request, GenerateJob job) {
  absl::Status error;
  if (job.prompt.empty()) {
    error = absl::InvalidArgumentError("empty prompt");
  } else if (static_cast<int64_t>(job.prompt.size()) >= pipeline_context()) {
    error = absl::InvalidArgumentError(absl::StrCat("prompt of ", job.prompt.size(),
                                                    " tokens does not fit the context of ",
                                                    pipeline_context(), " (--ctx)"));
  } else if (job.max_tokens < 1) {
    error = absl::InvalidArgumentError("max_tokens must be at least 1");
  } else {
    for (int32_t id : job.prompt) {
      if (id < 0 || id >= tokenizer_.vocab_size()) {
        error = absl::InvalidArgumentError(absl::StrCat("token id ", id,
                                                        " outside the vocabulary [0, ",
                                                        tokenizer_.vocab_size(), ")"));
        break;
      }
    }
  }
  if (!error.ok()) {
    Unreserve(request);
    return error;
  }
  request->job_ = std::move(job);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(request);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

int64_t Scheduler::pipeline_context() const { return context_; }

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
    std::fprintf(stderr, "%s: cancelling the calls in flight on %zu stage(s)\n",
                 std::string(why.message()).c_str(), stage_clients_.size());
    for (const auto& client : stage_clients_) client->CancelInFlight();
  }
  cv_.notify_all();
}

absl::Status Scheduler::StageFailure(const StageRef& stage, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!death_.ok()) return death_;  // the re-plan is already asked for
  }
  absl::Status failure = absl::UnavailableError(
      absl::StrCat("worker ", stage.worker_id, " failed: ", status.message()));
  if (on_failure_) on_failure_(stage.worker_id, failure);
  RequestReplan();
  return failure;
}

void Scheduler::RequestReplan(bool drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    (drain ? replan_drain_ : replan_) = true;
  }
  cv_.notify_all();
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

// ---- The loop ----

void Scheduler::Loop() {
  while (true) {
    bool replan = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] {
        return stopping_ || replan_ || (replan_drain_ && active_.empty()) || !active_.empty() ||
               (!queue_.empty() && ready_);
      });
      if (stopping_) break;
      replan = replan_ || (replan_drain_ && active_.empty());
      if (replan) replan_ = replan_drain_ = false;
      planning_ = replan;
    }
    if (replan) Replan();
    Admit();
    if (!active_.empty()) Step();
  }
  FailAll(absl::UnavailableError("the server is shutting down"));
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : queue_) {
    r->Finish({absl::UnavailableError("the server is shutting down")});
    --waiting_;
  }
  queue_.clear();
}

void Scheduler::Replan() {
  // Not ready (and not serving, for health) until the new plan's shards are loaded.
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = false;
    status_ = "re-planning: a worker joined or left";
  }
  NotifyReady();
  FailAll(absl::UnavailableError("the cluster is being re-planned (a worker joined or left)"));
  slots_.clear();
  UpdateSlotMetrics();
  {
    // Deaths announced before this plan concern the old one.
    std::lock_guard<std::mutex> lock(mu_);
    death_ = absl::OkStatus();
  }
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    stage_clients_.clear();
  }
  pipeline_ = planner_();
  context_ = pipeline_.context;
  kv_slots_ = pipeline_.ready ? pipeline_.kv_slots : 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = pipeline_.status;
    ++plans_;
    planning_ = false;
    // A death announced while planning matters only if the new plan uses that worker (its
    // record may have been read before it was forgotten): then the loop plans again.
    const bool uses_dead =
        !death_.ok() && std::find(pipeline_.worker_ids.begin(), pipeline_.worker_ids.end(),
                                  dead_worker_) != pipeline_.worker_ids.end();
    if (!death_.ok() && !uses_dead) {
      death_ = absl::OkStatus();
      replan_ = false;
    }
    ready_ = pipeline_.ready && !uses_dead;
    if (!ready_) {
      // Fail fast: nothing queued can run until a worker joins.
      for (auto& r : queue_) {
        r->Finish({absl::UnavailableError(absl::StrCat("model not ready: ", status_))});
        --waiting_;
      }
      queue_.clear();
    }
  }
  {
    std::lock_guard<std::mutex> lock(cancel_mu_);
    for (const StageRef& stage : pipeline_.stages) stage_clients_.push_back(stage.client);
  }
  cv_.notify_all();
  NotifyReady();
  if (metrics_) metrics_->SetQueue(running_, waiting_);
}

void Scheduler::FailAll(const absl::Status& status) {
  for (auto& a : active_) {
    if (a->finished) continue;
    // A re-plan (or shutdown) follows, which drops every session on every stage: no release
    // calls, which a hung worker would hold until their deadline.
    a->slot = nullptr;
    Finish(*a, status, "");
  }
  active_.clear();
  running_ = 0;
}

absl::Status Scheduler::OnEveryStage(const std::function<absl::Status(WorkerClient&)>& fn) {
  for (const StageRef& stage : pipeline_.stages) {
    absl::Status s = fn(*stage.client);
    if (!s.ok()) return IsWorkerFailure(s) ? StageFailure(stage, s) : s;
  }
  return absl::OkStatus();
}

void Scheduler::ReleaseSlot(uint64_t id) {
  auto it = std::find_if(slots_.begin(), slots_.end(),
                         [id](const std::unique_ptr<Slot>& s) { return s->id == id; });
  if (it == slots_.end()) return;
  slots_.erase(it);
  UpdateSlotMetrics();
  wire::ReleaseSessionRequest release;
  release.set_session_id(id);
  OnEveryStage([&](WorkerClient& w) { return w.ReleaseSession(release).status(); })
      .IgnoreError();  // a dead worker's sessions are gone anyway; the re-plan clears the rest
}

bool Scheduler::AcquireSlot(Active& a) {
  const std::vector<int32_t>& prompt = a.request->job_.prompt;
  // The longest common prefix among resident slots; at least the last prompt token is
  // recomputed so its logits exist.
  Slot* best = nullptr;
  size_t best_len = 0;
  for (auto& s : slots_) {
    const size_t n = std::min(CommonPrefix(s->tokens, prompt), prompt.size() - 1);
    if (n > best_len || (n == best_len && best != nullptr && !s->busy && best->busy)) {
      best = s.get();
      best_len = n;
    }
  }
  if (best_len == 0) best = nullptr;

  Slot* slot = nullptr;
  if (best != nullptr && !best->busy) {
    slot = best;  // take the slot over, dropping what it holds past the common prefix
    if (slot->tokens.size() > best_len) {
      wire::TruncateSessionRequest t;
      t.set_session_id(slot->id);
      t.set_length(static_cast<int64_t>(best_len));
      if (!OnEveryStage([&](WorkerClient& w) { return w.TruncateSession(t).status(); }).ok()) {
        ReleaseSlot(slot->id);  // frees `best` too
        slot = best = nullptr;
        best_len = 0;
      }
    }
  }
  if (slot == nullptr) {
    // A fresh session: evict the least recently used idle slot when full.
    if (static_cast<int>(slots_.size()) >= pipeline_.kv_slots) {
      Slot* lru = nullptr;
      for (auto& s : slots_) {
        if (!s->busy && s.get() != best && (lru == nullptr || s->last_used < lru->last_used)) {
          lru = s.get();
        }
      }
      if (lru == nullptr) return false;  // every slot busy: wait
      ReleaseSlot(lru->id);
    }
    auto fresh = std::make_unique<Slot>();
    fresh->id = next_slot_id_++;
    slot = fresh.get();
    slots_.push_back(std::move(fresh));
    UpdateSlotMetrics();
    if (best != nullptr) {
      // Another request is using the prefix: copy its rows.
      wire::CopyPrefixRequest copy;
      copy.set_from_session(best->id);
      copy.set_to_session(slot->id);
      copy.set_length(static_cast<int64_t>(best_len));
      if (OnEveryStage([&](WorkerClient& w) { return w.CopyPrefix(copy).status(); }).ok()) {
        slot->tokens.assign(prompt.begin(), prompt.begin() + best_len);
      } else {
        // Stages that did copy hold rows the slot does not claim: start them all empty.
        wire::ReleaseSessionRequest release;
        release.set_session_id(slot->id);
        OnEveryStage([&](WorkerClient& w) { return w.ReleaseSession(release).status(); })
            .IgnoreError();
        best_len = 0;
      }
    }
  }
  slot->tokens.resize(best_len);
  slot->busy = true;
  slot->last_used = ++clock_;
  a.slot = slot;
  a.prompt_pos = best_len;
  a.cached = static_cast<int64_t>(best_len);
  return true;
}

void Scheduler::Admit() {
  // A queued request whose client left gives its place back at once, even while every batch
  // place is taken.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if ((*it)->cancelled()) {
        (*it)->Finish({absl::CancelledError("cancelled while queued")});
        --waiting_;
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (metrics_) metrics_->SetQueue(running_, waiting_);
  while (static_cast<int>(active_.size()) < options_.batch) {
    std::shared_ptr<Request> request;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty() || !ready_ || replan_drain_) return;
      request = queue_.front();
    }
    if (request->cancelled()) {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
      --waiting_;
      request->Finish({absl::CancelledError("cancelled while queued")});
      continue;
    }
    auto a = std::make_unique<Active>();
    a->request = request;
    if (!AcquireSlot(*a)) return;  // all slots busy: the queue waits
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
      --waiting_;
    }
    const GenerateJob& job = request->job_;
    a->output = std::make_unique<OutputText>(
        tokenizer_, job,
        std::min<int64_t>(job.max_tokens, context_ - static_cast<int64_t>(job.prompt.size())));
    if (metrics_) metrics_->OnPrefixQuery(static_cast<int64_t>(job.prompt.size()), a->cached);
    active_.push_back(std::move(a));
    running_ = static_cast<int>(active_.size());
    if (metrics_) metrics_->SetQueue(running_, waiting_);
  }
}

void Scheduler::Finish(Active& a, absl::Status status, const std::string& reason,
                       const std::string& stop_sequence) {
  a.finished = true;
  const GenerateJob& job = a.request->job_;
  Outcome o;
  o.status = status;
  o.finish_reason = reason;
  o.stop_sequence = stop_sequence;
  o.prompt_tokens = static_cast<int64_t>(job.prompt.size());
  o.completion_tokens = a.output->tokens();
  o.cached_tokens = a.cached;
  if (status.ok()) {
    a.slot->busy = false;
    a.slot->last_used = ++clock_;
  } else if (a.slot != nullptr) {
    // Cancelled or failed: its KV is freed on every stage.
    ReleaseSlot(a.slot->id);
    a.slot = nullptr;
  }
  // The counts are right before the client hears of the end (it may look at them at once).
  running_ = static_cast<int>(std::count_if(active_.begin(), active_.end(),
                                            [](const auto& x) { return !x->finished; }));
  if (metrics_) {
    metrics_->OnFinished(o, Now() - a.request->submitted_at_);
    metrics_->SetQueue(running_, waiting_);
  }
  a.request->Finish(std::move(o));
}

void Scheduler::Deliver(Active& a, const wire::SegmentResult& result) {
  const int32_t id = result.token();
  const double now = Now();
  if (a.output->tokens() == 0) {
    if (metrics_) metrics_->ObserveTtft(now - a.request->submitted_at_);
  } else if (metrics_) {
    metrics_->ObserveItl(now - a.last_token_at);
  }
  a.last_token_at = now;
  if (metrics_) metrics_->OnGenerated(1);
  SampleResult sample;
  sample.id = id;
  sample.logprob = result.logprob();
  for (const wire::TokenLogprob& t : result.top()) sample.top.push_back({t.id(), t.logprob()});
  a.out.ids.push_back(id);
  a.out.samples.push_back(std::move(sample));
  a.pending = id;

  OutputText::Step step = a.output->Push(id);
  a.out.text += step.text;
  if (!a.out.ids.empty() || !a.out.text.empty()) {
    a.request->Push(std::move(a.out));
    a.out = Delta();
  }
  if (!step.finish_reason.empty()) {
    Finish(a, absl::OkStatus(), step.finish_reason, step.stop_sequence);
  }
}

void Scheduler::Step() {
  // Cancelled requests leave first.
  for (auto& a : active_) {
    if (a->request->cancelled()) Finish(*a, absl::CancelledError("cancelled"), "");
  }
  std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->finished; });
  running_ = static_cast<int>(active_.size());
  if (active_.empty()) {
    if (metrics_) metrics_->SetQueue(running_, waiting_);
    return;
  }

  // One segment per active request: its next prompt chunk, or its last sampled token.
  wire::ForwardRequest request;
  std::vector<Active*> order;
  for (auto& a : active_) {
    const GenerateJob& job = a->request->job_;
    wire::Segment* seg = request.add_segments();
    seg->set_session_id(a->slot->id);
    seg->set_pos0(static_cast<int64_t>(a->slot->tokens.size()));
    if (a->prompt_pos < job.prompt.size()) {
      const size_t end = std::min(job.prompt.size(),
                                  a->prompt_pos + static_cast<size_t>(options_.prefill_chunk));
      for (size_t i = a->prompt_pos; i < end; ++i) seg->add_token_ids(job.prompt[i]);
      if (end < job.prompt.size()) {
        seg->set_prefill_only(true);
      } else {
        *seg->mutable_sampling() = SamplingToWire(job.sampling);
      }
    } else {
      seg->add_token_ids(a->pending);
    }
    order.push_back(a.get());
  }
  // Through the stages; a segment failing on one stage is dropped from the rest.
  wire::ForwardResponse response;
  for (size_t s = 0; s < pipeline_.stages.size(); ++s) {
    const StageRef& stage = pipeline_.stages[s];
    request.set_stage(static_cast<int32_t>(s));
    auto reply = stage.client->Forward(request);
    if (!reply.ok()) {
      absl::Status status = reply.status();
      if (IsWorkerFailure(status)) {
        FailAll(StageFailure(stage, status));
        return;
      }
      for (Active* a : order) Finish(*a, status, "");
      order.clear();
      break;
    }
    if (reply->errors_size() > 0) {
      // Drop failed segments (and their rows from the activations).
      std::vector<bool> failed(request.segments_size(), false);
      for (const wire::SegmentError& e : reply->errors()) {
        if (e.index() < 0 || e.index() >= request.segments_size()) continue;
        failed[e.index()] = true;
        Finish(*order[e.index()],
               absl::Status(static_cast<absl::StatusCode>(e.code()), e.message()), "");
      }
      wire::ForwardRequest kept;
      std::vector<Active*> kept_order;
      for (int i = 0; i < request.segments_size(); ++i) {
        if (failed[i]) continue;
        *kept.add_segments() = request.segments(i);
        kept_order.push_back(order[i]);
      }
      request = std::move(kept);
      order = std::move(kept_order);
    }
    // Segment failures removed from `request` above already left their rows out of the reply.
    if (s + 1 < pipeline_.stages.size()) {
      *request.mutable_activations() = std::move(*reply->mutable_activations());
    } else {
      response = *std::move(reply);
    }
    if (order.empty()) break;
  }

  // Book-keeping: what every stage now holds, then the samples.
  for (int i = 0; i < request.segments_size() && i < static_cast<int>(order.size()); ++i) {
    Active& a = *order[i];
    const wire::Segment& seg = request.segments(i);
    a.slot->tokens.insert(a.slot->tokens.end(), seg.token_ids().begin(), seg.token_ids().end());
    if (a.prompt_pos < a.request->job_.prompt.size()) {
      a.prompt_pos += seg.token_ids_size();
    }
  }
  for (const wire::SegmentResult& result : response.results()) {
    for (Active* a : order) {
      if (a->slot != nullptr && a->slot->id == result.session_id() && !a->finished) {
        Deliver(*a, result);
        break;
      }
    }
  }
  std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->finished; });
  running_ = static_cast<int>(active_.size());
  if (metrics_) metrics_->SetQueue(running_, waiting_);
}

void Scheduler::UpdateSlotMetrics() {
  resident_ = static_cast<int>(slots_.size());
  if (metrics_) {
    metrics_->SetKvUsage(pipeline_.kv_slots > 0 && pipeline_.ready
                             ? static_cast<double>(slots_.size()) / pipeline_.kv_slots
                             : 0.0);
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
