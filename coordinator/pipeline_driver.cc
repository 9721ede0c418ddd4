#include "coordinator/pipeline_driver.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "models/speculative/drafter.h"
#include "worker/forward_reply.h"
#include "worker/sampling_wire.h"
#include "worker/step_times.h"

namespace fucina {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct PipelineDriver::Running {
  std::unique_ptr<RequestOutput> output;
  SlotTable::Slot* slot = nullptr;
  size_t prompt_pos = 0;  // next prompt token to forward
  int32_t pending = -1;   // sampled, not yet forwarded
  int group = 0;
  std::unique_ptr<Drafter> drafter;  // speculative requests
  std::vector<int32_t> drafts;       // in the step in flight, after `pending`
};

struct PipelineDriver::Group {
  std::vector<Running*> members;  // in arrival order
  bool in_flight = false;
  // Session operations for the group's next step: its members' slots (an eviction, a reused or
  // copied prefix) and releases of requests that left. One step at a time per group keeps them
  // ordered with the steps of those sessions.
  SessionOpList ops;
  // The step in flight: segment i is order[i]'s, with tokens[i] of its tokens; ops_sent its
  // session operations.
  std::vector<Running*> order;
  std::vector<int64_t> tokens;
  SessionOpList ops_sent;
  // When the step in flight began to be assembled, and when its call started; whether it
  // only decodes (no prompt chunk: the kind its times are counted under).
  Clock::time_point assembling, sent;
  bool decode = false;
};

PipelineDriver::PipelineDriver(SlotTable& slots, Metrics* metrics, Hooks hooks)
    : slots_(slots), metrics_(metrics), hooks_(std::move(hooks)) {}

PipelineDriver::~PipelineDriver() = default;

int PipelineDriver::groups() const { return static_cast<int>(groups_.size()); }

void PipelineDriver::Reset(std::shared_ptr<WorkerClient> entry, std::string entry_id,
                           const DriverOptions& options) {
  ++epoch_;
  in_flight_ = 0;
  running_.clear();
  entry_ = std::move(entry);
  entry_id_ = std::move(entry_id);
  options_ = options;
  groups_.assign(std::max(1, options.micro_batches), Group());
}

void PipelineDriver::Add(std::unique_ptr<RequestOutput> output, SlotTable::Slot* slot,
                         SessionOpList ops) {
  auto r = std::make_unique<Running>();
  r->prompt_pos = static_cast<size_t>(output->cached());
  r->output = std::move(output);
  r->slot = slot;
  if (r->output->job().speculative.value_or(options_.speculative)) {
    r->drafter = std::make_unique<Drafter>(DrafterOptions{.max_draft = options_.max_draft});
    r->drafter->Accept(r->output->job().prompt);
  }
  // The smallest group; the first of those, so groups fill in order.
  int g = 0;
  for (int i = 1; i < static_cast<int>(groups_.size()); ++i) {
    if (groups_[i].members.size() < groups_[g].members.size()) g = i;
  }
  r->group = g;
  groups_[g].members.push_back(r.get());
  for (wire::SessionOp& op : ops) groups_[g].ops.push_back(std::move(op));
  running_.push_back(std::move(r));
}

int PipelineDriver::Launch() {
  int left = 0;
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    if (!groups_[g].in_flight) left += LaunchGroup(g);
  }
  return left;
}

int PipelineDriver::LaunchGroup(int g) {
  std::vector<Running*> cancelled;
  for (Running* r : groups_[g].members) {
    if (r->output->request().cancelled()) cancelled.push_back(r);
  }
  for (Running* r : cancelled) End(r, absl::CancelledError("cancelled"));
  Group& group = groups_[g];
  group.assembling = Clock::now();
  const int left = static_cast<int>(cancelled.size());
  if ((group.members.empty() && group.ops.empty()) || entry_ == nullptr) return left;

  // Decode tokens first, then prompt chunks while the budget lasts.
  wire::ForwardRequest request;
  request.set_stage(0);
  group.order.clear();
  group.tokens.clear();
  // The next segment of the step: `count` of `r`'s tokens, from its session's end.
  auto add_segment = [&](Running* r, int64_t count) {
    wire::Segment* seg = request.add_segments();
    seg->set_session_id(r->slot->id);
    seg->set_pos0(static_cast<int64_t>(r->slot->tokens.size()));
    group.order.push_back(r);
    group.tokens.push_back(count);
    return seg;
  };
  int64_t budget = options_.max_step_tokens;
  std::vector<Running*> prefilling, decoding;
  for (Running* r : group.members) {
    (r->prompt_pos < r->output->job().prompt.size() ? prefilling : decoding).push_back(r);
  }
  // Drafts share what one token per decoding request leaves of the budget.
  const int64_t draft_share =
      decoding.empty() ? 0
                       : std::max<int64_t>(0, budget - static_cast<int64_t>(decoding.size())) /
                             static_cast<int64_t>(decoding.size());
  for (Running* r : decoding) {
    r->drafts.clear();
    if (r->drafter != nullptr) {
      // Drafts past the reply's budget could never be emitted.
      const int64_t room = std::min(draft_share, r->output->budget_left() - 1);
      r->drafts = r->drafter->Draft(static_cast<int>(std::max<int64_t>(0, room)));
    }
    const int64_t k = static_cast<int64_t>(r->drafts.size());
    wire::Segment* seg = add_segment(r, 1 + k);
    seg->add_token_ids(r->pending);
    seg->mutable_token_ids()->Add(r->drafts.begin(), r->drafts.end());
    seg->set_drafts(static_cast<int32_t>(k));
    budget -= 1 + k;
  }
  // Prompt chunks: first an equal share of what the decode tokens left for every prefilling
  // request (a short prompt is not kept waiting behind an older long one), then the rest to the
  // oldest first.
  std::vector<int64_t> take(prefilling.size(), 0);
  auto unfed = [](const Running* r) {
    return static_cast<int64_t>(r->output->job().prompt.size() - r->prompt_pos);
  };
  if (!prefilling.empty() && budget > 0) {
    const int64_t share = std::max<int64_t>(1, budget / static_cast<int64_t>(prefilling.size()));
    for (size_t i = 0; i < prefilling.size(); ++i) {
      take[i] = std::min({unfed(prefilling[i]), share, budget});
      budget -= take[i];
    }
    for (size_t i = 0; i < prefilling.size(); ++i) {
      const int64_t more = std::min(unfed(prefilling[i]) - take[i], budget);
      take[i] += more;
      budget -= more;
    }
  }
  for (size_t i = 0; i < prefilling.size(); ++i) {
    if (take[i] == 0) continue;
    Running* r = prefilling[i];
    const std::vector<int32_t>& prompt = r->output->job().prompt;
    const size_t end = r->prompt_pos + static_cast<size_t>(take[i]);
    wire::Segment* seg = add_segment(r, take[i]);
    seg->mutable_token_ids()->Add(prompt.begin() + r->prompt_pos, prompt.begin() + end);
    if (end < prompt.size()) {
      seg->set_prefill_only(true);
    } else {
      *seg->mutable_sampling() = SamplingToWire(r->output->job().sampling);
      GrammarToWire(r->output->job().grammar, seg->mutable_sampling());
    }
  }
  // A step with no rows still carries the group's session operations (a release of the last
  // request that left).
  if (group.order.empty() && group.ops.empty()) return left;
  request.mutable_session_ops()->Assign(group.ops.begin(), group.ops.end());
  group.ops_sent = std::move(group.ops);
  group.ops.clear();

  if (metrics_) {
    metrics_->OnForwardCall(static_cast<int64_t>(request.ByteSizeLong()), 0,
                            static_cast<int64_t>(request.activations().data().size()));
  }
  group.in_flight = true;
  ++in_flight_;
  group.decode = IsDecodeStep(request);
  group.sent = Clock::now();
  entry_->ForwardAsync(std::move(request),
                       [post = hooks_.post, this, epoch = epoch_,
                        g](absl::StatusOr<wire::ForwardResponse> reply) {
                         post([this, epoch, g, arrived = Clock::now(),
                               reply = std::move(reply)]() mutable {
                           OnReply(epoch, g, arrived, std::move(reply));
                         });
                       });
  return left;
}

void PipelineDriver::OnReply(uint64_t epoch, int g, Clock::time_point arrived,
                             absl::StatusOr<wire::ForwardResponse> reply) {
  if (epoch != epoch_) return;  // its requests were failed; a re-plan may have followed
  Group& group = groups_[g];
  const Clock::time_point handling = Clock::now();
  Metrics::StepSeconds times{.assemble = Seconds(group.sent - group.assembling),
                             .round_trip = Seconds(arrived - group.sent),
                             .mailbox = Seconds(handling - arrived)};
  const Clock::time_point assembling = group.assembling;
  // Every path out of the handling below counts the step (a failure's too).
  struct Observe {
    Metrics* metrics;
    Metrics::StepSeconds& times;
    Clock::time_point assembling, handling;
    bool decode;
    ~Observe() {
      if (metrics == nullptr) return;
      const Clock::time_point done = Clock::now();
      times.reply = Seconds(done - handling);
      times.step = Seconds(done - assembling);
      metrics->OnStep(times, decode);
    }
  } observe{metrics_, times, assembling, handling, group.decode};
  group.in_flight = false;
  --in_flight_;
  const std::vector<Running*> order = std::move(group.order);
  const std::vector<int64_t> tokens = std::move(group.tokens);
  const SessionOpList ops_sent = std::move(group.ops_sent);
  group.ops_sent.clear();
  // Whatever the reply, every stage is done with the step: its copies no longer hold their
  // sources (a release waiting for one rides in this group's next step).
  for (const wire::SessionOp& op : ops_sent) {
    if (op.has_copy_prefix()) slots_.CopyAnswered(op.copy_prefix().to_session(), &group.ops);
  }
  if (reply.ok() && metrics_) {
    metrics_->OnForwardCall(0, static_cast<int64_t>(reply->ByteSizeLong()),
                            static_cast<int64_t>(reply->activations().data().size()));
  }
  if (!reply.ok()) {
    if (IsWorkerFailure(reply.status())) {
      FailAll(hooks_.worker_failed(entry_id_, reply.status()));
      return;
    }
    // About these requests: the ones with rows in the step, and the ones whose sessions its
    // operations changed (on some stages only, maybe).
    absl::flat_hash_set<uint64_t> touched;
    for (const wire::SessionOp& op : ops_sent) touched.insert(SessionOpTarget(op));
    for (Running* r : std::vector<Running*>(group.members)) {
      if (touched.contains(r->slot->id) ||
          std::find(order.begin(), order.end(), r) != order.end()) {
        End(r, reply.status());
      }
    }
    return;
  }
  if (reply->has_chain_failure()) {
    const wire::ChainFailure& f = reply->chain_failure();
    FailAll(hooks_.worker_failed(
        f.worker_id(), absl::Status(static_cast<absl::StatusCode>(f.code()), f.message())));
    return;
  }
  // A session operation that failed on some stage fails the request of its session, whether
  // or not this step had a segment of it (that segment failed with it).
  absl::flat_hash_map<uint64_t, absl::Status> op_failed;
  for (const wire::SessionOpError& e : reply->op_errors()) {
    if (e.index() < 0 || e.index() >= static_cast<int>(ops_sent.size())) continue;
    op_failed.try_emplace(
        SessionOpTarget(ops_sent[e.index()]),
        absl::Status(static_cast<absl::StatusCode>(e.code()),
                     e.worker_id().empty() ? e.message()
                                           : absl::StrCat(e.message(), " (on ", e.worker_id(), ")")));
  }
  std::vector<bool> failed(order.size(), false);
  if (!op_failed.empty()) {
    for (size_t i = 0; i < order.size(); ++i) failed[i] = op_failed.contains(order[i]->slot->id);
    for (Running* r : std::vector<Running*>(group.members)) {
      if (auto it = op_failed.find(r->slot->id); it != op_failed.end()) End(r, it->second);
    }
  }
  for (const wire::SegmentError& e : reply->errors()) {
    if (e.index() < 0 || e.index() >= static_cast<int>(order.size()) || failed[e.index()]) {
      continue;
    }
    failed[e.index()] = true;
    End(order[e.index()], absl::Status(static_cast<absl::StatusCode>(e.code()), e.message()));
  }
  // What every stage now holds, then the samples.
  std::vector<Running*> sampled;
  for (size_t i = 0; i < order.size(); ++i) {
    if (failed[i]) continue;
    Running* r = order[i];
    const std::vector<int32_t>& prompt = r->output->job().prompt;
    if (r->prompt_pos < prompt.size()) {
      r->slot->tokens.insert(r->slot->tokens.end(), prompt.begin() + r->prompt_pos,
                             prompt.begin() + r->prompt_pos + tokens[i]);
      r->prompt_pos += static_cast<size_t>(tokens[i]);
    } else {
      r->slot->tokens.push_back(r->pending);
    }
    if (r->prompt_pos >= prompt.size()) sampled.push_back(r);  // a sample is due
  }
  for (const wire::SegmentResult& result : reply->results()) {
    auto it = std::find_if(sampled.begin(), sampled.end(), [&](Running* r) {
      return r != nullptr && r->slot->id == result.session_id();
    });
    if (it == sampled.end()) continue;
    Running* r = *it;
    *it = nullptr;
    const size_t accepted = static_cast<size_t>(result.accepted_size());
    if (accepted > r->drafts.size()) {
      End(r, absl::InternalError(absl::StrCat("the last stage accepted ", accepted, " of ",
                                              r->drafts.size(), " drafts")));
      continue;
    }
    // Every stage holds the accepted drafts after `pending`; the rest go with the next pos0.
    r->slot->tokens.insert(r->slot->tokens.end(), r->drafts.begin(),
                           r->drafts.begin() + static_cast<std::ptrdiff_t>(accepted));
    if (!r->drafts.empty() && metrics_ != nullptr) {
      metrics_->OnDraft(static_cast<int>(r->drafts.size()), static_cast<int>(accepted));
    }
    if (r->drafter != nullptr && !r->drafts.empty()) {
      r->drafter->Record(static_cast<int>(r->drafts.size()), static_cast<int>(accepted));
    }
    // The accepted tokens one by one, then the sample that ended the check.
    std::vector<int32_t> emitted;
    bool finished = false;
    for (size_t i = 0; i < accepted && !finished; ++i) {
      const wire::TokenSample& a = result.accepted(static_cast<int>(i));
      wire::SegmentResult one;
      one.set_session_id(result.session_id());
      one.set_token(a.id());
      one.set_logprob(a.logprob());
      *one.mutable_top() = a.top();
      emitted.push_back(a.id());
      const Clock::time_point t = Clock::now();
      finished = r->output->Deliver(one);
      times.output_text += Seconds(Clock::now() - t);
    }
    if (!finished) {
      emitted.push_back(result.token());
      const Clock::time_point t = Clock::now();
      finished = r->output->Deliver(result);
      times.output_text += Seconds(Clock::now() - t);
    }
    if (r->drafter != nullptr) r->drafter->Emitted(r->pending, emitted);
    r->pending = emitted.back();
    if (finished) End(r, absl::OkStatus());
  }
  for (Running* r : sampled) {
    if (r != nullptr) {
      End(r, absl::InternalError(absl::StrCat("the last stage returned no sample for session ",
                                              r->slot->id)));
    }
  }
}

void PipelineDriver::End(Running* r, const absl::Status& status) {
  if (status.ok()) {
    slots_.Done(r->slot);
  } else {
    // Cancelled or failed: its KV is freed on every stage with the group's next step.
    slots_.Release(r->slot, &groups_[r->group].ops);
  }
  std::erase(groups_[r->group].members, r);
  auto it = std::find_if(running_.begin(), running_.end(),
                         [r](const std::unique_ptr<Running>& x) { return x.get() == r; });
  std::unique_ptr<Running> owned = std::move(*it);
  running_.erase(it);
  if (hooks_.counts_changed) hooks_.counts_changed();
  if (status.ok()) {
    owned->output->Complete();
  } else {
    owned->output->Fail(status);
  }
}

void PipelineDriver::FailAll(const absl::Status& status) {
  ++epoch_;
  in_flight_ = 0;
  std::vector<std::unique_ptr<Running>> failed = std::move(running_);
  running_.clear();
  for (Group& g : groups_) g = Group();
  if (hooks_.counts_changed) hooks_.counts_changed();
  for (auto& r : failed) r->output->Fail(status);
}

}  // namespace fucina
