// The worker actor's train jobs (worker_actor.h): replicas beside the shard, one member's
// evaluation per executor task, and their bytes against the memory budget.
#include "worker/worker_actor.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace fucina {

absl::StatusOr<EsReplica*> WorkerActor::Replica(const std::string& job_id) {
  auto it = es_jobs_.find(job_id);
  if (it == es_jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no train job '", job_id, "' on this worker"));
  }
  return it->second.get();
}

absl::StatusOr<wire::EsState> WorkerActor::EsLoad(const wire::EsJob& job) {
  if (absl::Status s = ValidateEsJob(job); !s.ok()) return s;
  return executor_.Call([&]() -> absl::StatusOr<wire::EsState> {
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
    es_jobs_[job.job_id()] = *std::move(replica);
    return state;
  });
}

absl::StatusOr<wire::EsEvaluateResponse> WorkerActor::EsEvaluate(
    const wire::EsEvaluateRequest& request) {
  wire::EsEvaluateResponse response;
  const auto start = std::chrono::steady_clock::now();
  // One executor task per member: forward steps of the shard queued meanwhile run between.
  for (int32_t member : request.members()) {
    absl::StatusOr<float> fitness = executor_.Call([&]() -> absl::StatusOr<float> {
      auto replica = Replica(request.job_id());
      if (!replica.ok()) return replica.status();
      if ((*replica)->generation() != request.generation()) {
        return absl::FailedPreconditionError(
            absl::StrCat("evaluation of generation ", request.generation(),
                         " for a replica at ", (*replica)->generation()));
      }
      return (*replica)->Evaluate(member, request.holdout());
    });
    if (!fitness.ok()) return fitness.status();
    response.add_fitness(*fitness);
  }
  response.set_seconds(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return response;
}

absl::StatusOr<wire::EsState> WorkerActor::EsUpdate(const wire::EsUpdateRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  return executor_.Call([&]() -> absl::StatusOr<wire::EsState> {
    auto replica = Replica(request.job_id());
    if (!replica.ok()) return replica.status();
    if (absl::Status s = (*replica)->Update(request); !s.ok()) return s;
    wire::EsState state = (*replica)->State();
    state.set_seconds(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return state;
  });
}

absl::StatusOr<wire::EsSnapshotChunk> WorkerActor::EsSnapshot(
    const wire::EsSnapshotRequest& request) {
  return executor_.Call([&]() -> absl::StatusOr<wire::EsSnapshotChunk> {
    auto replica = Replica(request.job_id());
    if (!replica.ok()) return replica.status();
    return (*replica)->Snapshot();
  });
}

absl::StatusOr<wire::EsState> WorkerActor::EsRelease(const wire::EsReleaseRequest& request) {
  return executor_.Call([&]() -> absl::StatusOr<wire::EsState> {
    wire::EsState state;
    state.set_job_id(request.job_id());
    es_jobs_.erase(request.job_id());  // idempotent, like ReleaseSession
    return state;
  });
}

int64_t WorkerActor::ReplicaBytes(const EsReplica& replica) const {
  const bool shares_file = model_ != nullptr && shard_.model_path() == replica.job().model_path();
  return replica.owned_bytes() +
         std::max<int64_t>(0, replica.mapped_bytes() - (shares_file ? weight_bytes_ : 0));
}

}  // namespace fucina
