// The worker actor's train jobs (worker_actor.h): replicas beside the shard, one scoring pass
// per executor task, pipelined members' passes through the stages, and the
// replicas' bytes against the memory budget.
#include "worker/worker_actor.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "worker/activations.h"

namespace fucina {

// One member's scoring seen from the first stage of a replica: each pass runs this stage's
// part on the executor, then, in a pipeline, goes to the next stage (off the executor), whose
// reply comes from the last. New streams ride along with the next pass. A whole replica is a
// pipeline of one stage.
class WorkerActor::EsPipeline : public train::ScoringForward {
 public:
  EsPipeline(WorkerActor& actor, EsJobState stage, const wire::EsEvaluateRequest& request,
             int member)
      : actor_(actor), stage_(std::move(stage)), request_(request), member_(member) {}

  int64_t vocab_size() const override { return stage_.replica->config().vocab_size; }
  int64_t pass_rows() const override { return train::ScoringPassRows(stage_.replica->config()); }

  absl::Status ResetStreams(std::span<const int64_t> capacities) override {
    new_streams_.assign(capacities.begin(), capacities.end());
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Verdict>> Pass(std::span<const Segment> segments,
                                            std::span<const Row> rows) override {
    if (absl::Status s = actor_.SelectMember(stage_, request_.job_id(), request_.generation(),
                                             member_);
        !s.ok()) {
      return s;
    }
    std::vector<float> x;
    auto own = actor_.executor_.Call(
        [&]() -> absl::StatusOr<std::vector<train::ScoringForward::Verdict>> {
          if (absl::Status s = actor_.CheckHeld(stage_, request_.job_id()); !s.ok()) return s;
          return stage_.replica->StagePass(request_.generation(), member_, new_streams_,
                                           segments, x, rows);
        });
    if (!own.ok() || stage_.next == nullptr) return own;
    wire::EsForwardRequest next;
    next.set_job_id(request_.job_id());
    next.set_generation(request_.generation());
    next.set_member(member_);
    next.mutable_new_streams()->Add(new_streams_.begin(), new_streams_.end());
    new_streams_.clear();
    for (const Segment& s : segments) {
      wire::EsPassSegment* out = next.add_segments();
      out->set_stream(s.stream);
      out->mutable_tokens()->Add(s.tokens.begin(), s.tokens.end());
    }
    const int64_t hidden = stage_.replica->config().hidden;
    EncodeActivations(x.data(), static_cast<int64_t>(x.size()) / hidden, hidden,
                      wire::ACTIVATION_F32, next.mutable_activations());
    for (const Row& r : rows) {
      next.add_rows(r.row);
      next.add_targets(r.target);
    }
    auto reply = stage_.next->EsForward(next);
    if (!reply.ok()) return reply.status();
    if (reply->argmax_size() != static_cast<int>(rows.size()) ||
        reply->logprob_size() != static_cast<int>(rows.size())) {
      return absl::InternalError(absl::StrCat("the next stage sent ", reply->argmax_size(),
                                              " verdicts for ", rows.size(), " rows"));
    }
    std::vector<Verdict> verdicts(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      verdicts[i] = {reply->argmax(static_cast<int>(i)), reply->logprob(static_cast<int>(i))};
    }
    return verdicts;
  }

 private:
  WorkerActor& actor_;
  const EsJobState stage_;
  const wire::EsEvaluateRequest& request_;
  const int member_;
  std::vector<int64_t> new_streams_;
};

absl::Status WorkerActor::CheckHeld(const EsJobState& stage, const std::string& job_id) {
  // A job released meanwhile (stopped, or its coordinator's shutdown deadline) ends its
  // scoring here, within one pass or one tensor.
  auto current = Stage(job_id);
  if (!current.ok() || current->replica != stage.replica) {
    return absl::CancelledError(absl::StrCat("train job '", job_id, "' was released"));
  }
  return absl::OkStatus();
}

absl::Status WorkerActor::SelectMember(const EsJobState& stage, const std::string& job_id,
                                       int64_t generation, int member) {
  // One trainable tensor a task: a full-mode model's perturbation is seconds of writes, and
  // the forward steps this worker serves run between them.
  for (;;) {
    absl::StatusOr<bool> selected = executor_.Call([&]() -> absl::StatusOr<bool> {
      if (absl::Status s = CheckHeld(stage, job_id); !s.ok()) return s;
      return stage.replica->SelectStep(generation, member);
    });
    if (!selected.ok()) return selected.status();
    if (*selected) return absl::OkStatus();
  }
}

absl::StatusOr<EsReplica*> WorkerActor::Replica(const std::string& job_id) {
  auto stage = Stage(job_id);
  if (!stage.ok()) return stage.status();
  return stage->replica.get();
}

absl::StatusOr<WorkerActor::EsJobState> WorkerActor::Stage(const std::string& job_id) {
  auto it = es_jobs_.find(job_id);
  if (it == es_jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no train job '", job_id, "' on this worker"));
  }
  return it->second;
}

// The loading runs on the executor.
void WorkerActor::EsLoadAsync(wire::EsJob job, Callback<wire::EsState> done) {
  if (absl::Status s = ValidateEsJob(job); !s.ok()) return done(s);
  executor_.Post([this, job = std::move(job), done = std::move(done)] { done(DoEsLoad(job)); });
}

void WorkerActor::EsEvaluateAsync(wire::EsEvaluateRequest request,
                                  Callback<wire::EsEvaluateResponse> done) {
  OffExecutor([this, request = std::move(request), done = std::move(done)] {
    done(DoEsEvaluate(request));
  });
}

void WorkerActor::EsUpdateAsync(wire::EsUpdateRequest request, Callback<wire::EsState> done) {
  OffExecutor([this, request = std::move(request), done = std::move(done)] {
    done(DoEsUpdate(request));
  });
}

void WorkerActor::EsForwardAsync(wire::EsForwardRequest request,
                                 Callback<wire::EsForwardResponse> done) {
  OffExecutor([this, request = std::move(request), done = std::move(done)] {
    done(DoEsForward(request));
  });
}

absl::StatusOr<wire::EsState> WorkerActor::DoEsLoad(const wire::EsJob& job) {
  es_jobs_.erase(job.job_id());  // its memory goes before the new replica's is taken
  std::string path = job.model_path();
  if (options_.locate_model) {
    // The tensors the replica holds: the whole model, or its shard.
    wire::LoadShardRequest whole;
    whole.set_model_path(job.model_path());
    whole.set_last_layer(job.has_shard() ? job.shard().last_layer() : -1);
    whole.set_first_layer(job.has_shard() ? job.shard().first_layer() : 0);
    whole.set_embeddings(!job.has_shard() || job.shard().embeddings());
    whole.set_head(!job.has_shard() || job.shard().head());
    auto located = options_.locate_model(whole);
    if (!located.ok()) return located.status();
    path = *std::move(located);
  }
  std::shared_ptr<WorkerClient> next;
  if (job.has_next_stage()) {
    next = resolver_(job.next_stage());
    if (next == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("next_stage: cannot reach worker ",
                                                     job.next_stage().worker_id(), " ",
                                                     job.next_stage().address()));
    }
  }
  auto replica = EsReplica::Create(job, path, max_threads_);
  if (!replica.ok()) return replica.status();
  // Checked once the replica's size is known (its owned copies are made by the load); a
  // refused replica is freed at once.
  const int64_t need = ReplicaBytes(**replica);
  if (options_.memory_budget > 0 && UsedBytes() + need > options_.memory_budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "train job '", job.job_id(), "' needs ", need, " bytes on this worker; ",
        std::max<int64_t>(0, options_.memory_budget - UsedBytes()),
        " of its memory budget are free"));
  }
  wire::EsState state = (*replica)->State();
  es_jobs_[job.job_id()] = {*std::move(replica), std::move(next)};
  return state;
}

absl::StatusOr<wire::EsEvaluateResponse> WorkerActor::DoEsEvaluate(
    const wire::EsEvaluateRequest& request) {
  wire::EsEvaluateResponse response;
  const auto start = std::chrono::steady_clock::now();
  for (int32_t member : request.members()) {
    // Scored from this thread, one executor task per pass (a whole replica is a pipeline of
    // one stage), so a forward step queued meanwhile waits for one pass, never for a member.
    auto stage = executor_.Call([&]() -> absl::StatusOr<EsJobState> {
      auto stage = Stage(request.job_id());
      if (!stage.ok()) return stage.status();
      const EsReplica& replica = *stage->replica;
      if (replica.generation() != request.generation()) {
        return absl::FailedPreconditionError(
            absl::StrCat("evaluation of generation ", request.generation(),
                         " for a replica at ", replica.generation()));
      }
      if (replica.is_stage() && !replica.job().shard().embeddings()) {
        return absl::FailedPreconditionError(
            "members are scored from the first stage of a pipeline, this is a later one");
      }
      return stage;
    });
    if (!stage.ok()) return stage.status();
    if (!stage->replica->BeginScoring()) {
      return absl::AbortedError(absl::StrCat("train job '", request.job_id(),
                                             "' is scoring another member on this worker"));
    }
    absl::StatusOr<float> fitness = ScoreThroughPipeline(*stage, request, member);
    stage->replica->EndScoring();
    if (!fitness.ok()) return fitness.status();
    response.add_fitness(*fitness);
  }
  response.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return response;
}

absl::StatusOr<float> WorkerActor::ScoreThroughPipeline(const EsJobState& stage,
                                                        const wire::EsEvaluateRequest& request,
                                                        int member) {
  EsPipeline pipeline(*this, stage, request, member);
  return stage.replica->Score(pipeline, member, request.holdout());
}

absl::StatusOr<wire::EsForwardResponse> WorkerActor::DoEsForward(
    const wire::EsForwardRequest& request) {
  auto stage = executor_.Call([&] { return Stage(request.job_id()); });
  if (!stage.ok()) return stage.status();
  if (request.rows_size() != request.targets_size()) {
    return absl::InvalidArgumentError(absl::StrCat(request.rows_size(), " rows but ",
                                                   request.targets_size(), " targets"));
  }
  std::vector<train::ScoringForward::Segment> segments;
  int64_t rows = 0;
  for (const wire::EsPassSegment& s : request.segments()) {
    segments.push_back({s.stream(), {s.tokens().data(), static_cast<size_t>(s.tokens_size())}});
    rows += s.tokens_size();
  }
  std::vector<train::ScoringForward::Row> wanted;
  for (int i = 0; i < request.rows_size(); ++i) {
    wanted.push_back({request.rows(i), request.targets(i)});
  }
  const ModelConfig& config = stage->replica->config();
  std::vector<float> x;
  if (!stage->replica->job().shard().embeddings()) {
    // Bounded before the buffer is sized: the rows a pass may have.
    if (rows > train::kMaxPassRows) {
      return absl::InvalidArgumentError(absl::StrCat("a pass of ", rows, " rows exceeds ",
                                                     train::kMaxPassRows));
    }
    if (request.activations().type() != wire::ACTIVATION_F32) {
      return absl::InvalidArgumentError("activations: a train pass carries f32 (exact) rows");
    }
    x.resize(rows * config.hidden);
    if (absl::Status s = DecodeActivations(request.activations(), rows, config.hidden, x.data());
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("activations: ", s.message()));
    }
  }
  if (absl::Status s = SelectMember(*stage, request.job_id(), request.generation(),
                                    request.member());
      !s.ok()) {
    return s;
  }
  auto own = executor_.Call([&] {
    return stage->replica->StagePass(
        request.generation(), request.member(),
        {request.new_streams().data(), static_cast<size_t>(request.new_streams_size())},
        segments, x, wanted);
  });
  if (!own.ok()) return own.status();
  if (stage->next == nullptr) {
    wire::EsForwardResponse response;
    for (const train::ScoringForward::Verdict& v : *own) {
      response.add_argmax(v.argmax);
      response.add_logprob(v.logprob);
    }
    return response;
  }
  wire::EsForwardRequest onward = request;
  EncodeActivations(x.data(), rows, config.hidden, wire::ACTIVATION_F32,
                    onward.mutable_activations());
  return stage->next->EsForward(onward);
}

absl::StatusOr<wire::EsState> WorkerActor::DoEsUpdate(const wire::EsUpdateRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  auto stage = executor_.Call([&] { return Stage(request.job_id()); });
  if (!stage.ok()) return stage.status();
  EsReplica& replica = *stage->replica;
  // No member is scored on a half-updated replica (the driver never overlaps the two).
  if (!replica.BeginScoring()) {
    return absl::AbortedError(absl::StrCat("train job '", request.job_id(),
                                           "' is scoring a member on this worker"));
  }
  // One trainable tensor a task, as for a member's selection.
  absl::Status s = executor_.Call([&] { return replica.BeginUpdate(request); });
  while (s.ok() && !executor_.Call([&] { return replica.UpdateStep(); })) {
  }
  replica.EndScoring();
  if (!s.ok()) return s;
  return executor_.Call([&] {
    wire::EsState state = replica.State();
    state.set_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return state;
  });
}

void WorkerActor::EsSnapshotAsync(wire::EsSnapshotRequest request,
                                  Callback<wire::EsSnapshotChunk> done) {
  executor_.Post([this, request = std::move(request), done = std::move(done)] {
    auto replica = Replica(request.job_id());
    if (!replica.ok()) return done(replica.status());
    done((*replica)->Snapshot());
  });
}

void WorkerActor::EsReleaseAsync(wire::EsReleaseRequest request, Callback<wire::EsState> done) {
  executor_.Post([this, request = std::move(request), done = std::move(done)] {
    wire::EsState state;
    state.set_job_id(request.job_id());
    es_jobs_.erase(request.job_id());  // idempotent, like ReleaseSession
    done(std::move(state));
  });
}

int64_t WorkerActor::ReplicaBytes(const EsReplica& replica) const {
  const bool shares_file = model_ != nullptr && shard_.model_path() == replica.job().model_path();
  return replica.owned_bytes() +
         std::max<int64_t>(0, replica.mapped_bytes() - (shares_file ? weight_bytes_ : 0));
}

}  // namespace fucina
