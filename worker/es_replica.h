// One evolution-strategies train job's replica on a worker: the whole model with the job's
// trainable parameters (full-mode tensors held as f32 copies, or LoRA adapters), its tasks and
// reward, and the EsTrainer that perturbs, scores and updates them (models/train/es.h).
//
// Replicas of a job agree bit for bit: each is built from the same EsJob and advanced by the
// same sequence of (generation, shaped fitness) updates, and the noise is regenerated from the
// job's seed. A replica never sends or receives parameter values, except as a snapshot file
// for checkpoints. Not thread-safe: the worker actor calls it from its executor.
#ifndef FUCINA_WORKER_ES_REPLICA_H_
#define FUCINA_WORKER_ES_REPLICA_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fucina/cluster/v1/worker.pb.h"
#include "kernels/cpu/thread_pool.h"
#include "models/engine/model.h"
#include "models/tokenizer/tokenizer.h"
#include "models/train/es.h"
#include "models/train/scoring.h"
#include "models/train/tasks.h"

namespace fucina {

namespace wire = ::fucina::cluster::v1;

// Checks a job's fields that need no model (INVALID_ARGUMENT naming the field): the id, mode,
// options, reward, tasks and their token ids against `vocab_size` when it is > 0.
absl::Status ValidateEsJob(const wire::EsJob& job, int64_t vocab_size = 0);

// The trainer's options a job asks for (a decay of 0 means none).
train::EsOptions EsOptionsOf(const wire::EsJob& job);

class EsReplica {
 public:
  // Loads the model at `model_path` (a local file with every tensor) for `job`, with at most
  // `max_threads` threads.
  static absl::StatusOr<std::unique_ptr<EsReplica>> Create(const wire::EsJob& job,
                                                           const std::string& model_path,
                                                           int max_threads);

  const wire::EsJob& job() const { return job_; }
  const ModelConfig& config() const { return model_->config(); }
  int64_t generation() const { return generation_; }
  wire::EsState State() const;

  // Whether this replica is one stage of a pipelined replica (EsJob.shard).
  bool is_stage() const { return job_.has_shard(); }

  // The fitness of the member `forward` holds (EsTrainer::kCenter: the parameters themselves),
  // on the training tasks or the holdout ones, scored through it: a pipeline whose first stage
  // is this replica (a whole replica is a pipeline of one). Runs on the caller's thread,
  // reading only what Create set (the tasks, the tokenizer, the reward); the passes reach this
  // replica through StagePass. A non-finite fitness is INVALID_ARGUMENT (the job's fault).
  absl::StatusOr<float> Score(train::ScoringForward& forward, int member, bool holdout) const;
  // One scoring at a time per replica (a member's passes select its parameters and restart the
  // streams): false when one is running already.
  bool BeginScoring() { return !scoring_.exchange(true); }
  void EndScoring() { scoring_ = false; }
  // This replica's part of one pass of member `member`'s scoring (all of it for a whole
  // replica, its layers for a stage): the
  // member's parameters are selected (once per member: they stay until another is asked for),
  // the streams restarted when `new_streams` is not empty, and the segments' rows run through
  // the stage's layers in `x` (activations from the stage before, or embedded here). With the
  // head, returns the verdicts of `rows`; without, nothing, and x holds the rows for the next
  // stage. Errors name the field; a wrong generation is FAILED_PRECONDITION.
  absl::StatusOr<std::vector<train::ScoringForward::Verdict>> StagePass(
      int64_t generation, int member, std::span<const int64_t> new_streams,
      std::span<const train::ScoringForward::Segment> segments, std::vector<float>& x,
      std::span<const train::ScoringForward::Row> rows);
  // Selects member `member`'s parameters one trainable tensor a call (EsTrainer::SelectStep):
  // true once selected, after which StagePass writes nothing. Lets the worker interleave the
  // writes (seconds for a full-mode model) with the forward steps it serves.
  absl::StatusOr<bool> SelectStep(int64_t generation, int member);
  // The current generation's update; the generation advances. The request's generation must
  // be the current one (FAILED_PRECONDITION otherwise, nothing changed).
  absl::Status Update(const wire::EsUpdateRequest& request);
  // The same one trainable tensor a call: BeginUpdate checks the request, each UpdateStep
  // updates a tensor and returns true (the generation advanced) after the last.
  absl::Status BeginUpdate(const wire::EsUpdateRequest& request);
  bool UpdateStep();
  // The trainable values as a GGUF file (adapters.gguf or tensors.gguf), whole in one chunk.
  // Selects the unperturbed parameters first.
  absl::StatusOr<wire::EsSnapshotChunk> Snapshot();

  // Bytes the replica owns (fused weights, trainable f32 copies, adapters: every owned
  // location VisitParameters lists) and the bytes of the model's weights it maps.
  int64_t owned_bytes() const { return owned_bytes_; }
  int64_t mapped_bytes() const { return mapped_bytes_; }

 private:
  EsReplica() = default;

  wire::EsJob job_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<train::EsTrainer> trainer_;
  std::unique_ptr<train::StageScorer> stage_;  // a stage replica's streams
  train::RewardSpec reward_;
  std::vector<train::Task> tasks_, holdout_;
  int64_t generation_ = 0;
  int64_t owned_bytes_ = 0;
  int64_t mapped_bytes_ = 0;
  std::atomic<bool> scoring_{false};
};

}  // namespace fucina

#endif  // FUCINA_WORKER_ES_REPLICA_H_
