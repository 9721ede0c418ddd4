// The coordinator's side of an evolution-strategies train job: it places population members on
// the workers that hold the job's replicas (worker/es_replica.h), shapes their fitness and
// broadcasts each generation's update. Only seeds' coordinates and scalars cross the network:
// per generation (generation, member ids) out and one float per member back, then the shaped
// fitness (one float per member) out and one checksum per replica back, so the traffic is
// O(population) bytes whatever the model's size.
//
// Placement by capacity: members wait in one queue and each replica takes the next as soon as
// it is free (one member per call), so a worker with more cores takes more members.
//
// Replicas are groups (EsGroup): one worker holding the whole model, or a pipeline of workers
// each holding a stage's layers (a model no one worker has room for). A pipelined member is
// scored through the stages, the first calling the next with each pass's activations (worker
// to worker: the coordinator still sends only member ids); every stage applies the update to
// its own tensors, and the group's checksum is the sum of its stages', equal to a whole
// replica's. A group whose worker fails is dropped whole and its member re-run elsewhere.
//
// Faults: a member whose worker fails (gone, stuck, broken) goes back into the queue and is
// re-run on another replica from its seed; the generation's result does not change. A worker
// that appears (or comes back) later is given the job and replays the logged updates, which
// brings its replica to the current generation bit for bit; it joins at the next generation.
// Replicas report a checksum after each update, and one that disagrees fails the job: the
// replicas would no longer be replicas.
//
// Checkpoints: out_dir/state.json holds the job and the log of shaped fitness; with the
// replay above it is all a restarted coordinator needs to resume, with the same result as an
// uninterrupted run. Beside it, the trainable values as GGUF (adapters.gguf or tensors.gguf,
// fetched from a replica) are what `fucina serve --adapter` / `fucina gguf export` take.
#ifndef FUCINA_COORDINATOR_ES_DRIVER_H_
#define FUCINA_COORDINATOR_ES_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/metrics.h"
#include "models/engine/config.h"
#include "worker/worker_client.h"

namespace fucina {

// A worker that can hold a replica or a stage of one.
struct EsWorker {
  std::string id;
  std::shared_ptr<WorkerClient> client;
  std::string address = {};  // how the stage before reaches it (wire::Peer)
};

// One replica of the job: a worker with the whole model (`stages` empty), or a pipeline:
// workers[i] holds stages[i] (stage 0 has the embeddings, the last the head).
struct EsGroup {
  std::vector<EsWorker> workers;
  std::vector<wire::EsShard> stages;
  // "w", or "w0[0,15)+w1[15,30)": a group whose workers or cuts change is another group.
  std::string id() const;
};
// The groups available now (alive workers; no worker in two groups); asked before every
// generation.
using EsGroupSource = std::function<std::vector<EsGroup>()>;
// Every worker a whole replica.
EsGroupSource WholeReplicas(std::function<std::vector<EsWorker>()> workers);
// Layer ranges of `stages` pipeline stages (embeddings on the first, head on the last), cut as
// evenly as the model allows (ModelConfig::CanSplitAt). INVALID_ARGUMENT when it cannot be cut
// into that many.
absl::StatusOr<std::vector<wire::EsShard>> EvenStages(const ModelConfig& config, int stages);

struct EsDriverOptions {
  wire::EsJob job;
  int64_t iterations = 10;     // generations to reach
  int checkpoint_every = 0;    // generations between checkpoints; 0: only at the end
  std::string out_dir;         // empty: no checkpoints
  // How long a generation may wait for a first worker before the job fails.
  int wait_for_workers_ms = 60'000;
  // Attempts of one member before the job fails (a member failing everywhere is not a worker
  // fault but the job's).
  int max_member_attempts = 4;
};

// One finished generation, as WatchJob reports it.
struct EsGenerationEvent {
  int64_t generation = 0;  // generations done, this one included
  float reward_mean = 0, reward_min = 0, reward_max = 0;  // members' raw fitness
  float sigma = 0;         // the generation's (scheduled) sigma
  int members_done = 0;
  int members_retried = 0;  // evaluations lost with a worker and run again
  int workers = 0;          // replicas that took part
  double seconds = 0;       // wall time of the generation
  double evaluate_seconds = 0;     // wall time of the members' phase
  double update_seconds = 0;       // wall time of the update broadcast
  double communicate_seconds = 0;  // of those, time in calls not spent on the workers (mean
                                   // over replicas)
  int64_t bytes_sent = 0;      // serialized requests of the generation's calls
  int64_t bytes_received = 0;  // and their replies
  uint64_t checksum = 0;       // of the replicas' trainable values afterwards
};

class EsDriver {
 public:
  // `metrics` may be null; it outlives the driver.
  EsDriver(EsDriverOptions options, EsGroupSource groups, EsJobMetrics* metrics = nullptr);
  ~EsDriver();

  // Continues the job checkpointed in `dir` (its state.json): its job replaces options' job
  // but for the id (iterations and out_dir stay the caller's). Errors name the file and the field.
  absl::Status Resume(const std::string& dir);

  // Runs generations until `iterations`, calling `on_generation` after each; writes the final
  // checkpoint when out_dir is set. Stop() ends it after the members in flight (CANCELLED,
  // checkpointed at the last whole generation; an unfinished generation is dropped).
  absl::Status Run(const std::function<void(const EsGenerationEvent&)>& on_generation);
  // From any thread.
  void Stop() { stop_ = true; }
  // Stop() now, not after the generation in flight: the replicas are released, which ends
  // their scoring within one pass, and Run returns CANCELLED without a checkpoint (the last
  // one written stays). From any thread; for a shutdown deadline.
  void Abort() {
    stop_ = true;
    abort_ = true;
    ReleaseReplicas();
  }
  // Frees the job's replica on every worker that holds one (best effort); a later Run or
  // EvaluateCenter loads them again. What a finished job does, whichever way it ended.
  void ReleaseReplicas();

  // The reward of the current parameters (no perturbation) on the training or holdout tasks,
  // scored by one replica.
  absl::StatusOr<float> EvaluateCenter(bool holdout);
  // Writes state.json and the trainable values' GGUF into out_dir (atomically, each).
  absl::Status WriteCheckpoint();

  const wire::EsJob& job() const { return options_.job; }
  int64_t generation() const { return static_cast<int64_t>(log_.size()); }
  uint64_t checksum() const { return checksum_; }
  int64_t num_values() const { return num_values_; }
  std::vector<std::string> replica_workers() const;

 private:
  using Replica = EsGroup;
  // Gives the job to the available groups that lack it and replays the log on them; returns
  // the ready replicas. Waits (up to wait_for_workers_ms) while there is none.
  absl::StatusOr<std::vector<std::pair<std::string, Replica>>> Join();
  // Gives the job to every stage of `groups` at once and replays the log on those that loaded:
  // each group's outcome (OK: it is a replica now).
  std::vector<absl::Status> JoinAll(const std::vector<EsGroup>& groups);
  // The job as stage `i` of `group` gets it (its shard and next stage).
  wire::EsJob StageJob(const EsGroup& group, size_t i) const;
  // An update on every stage of every group at once: each group's state, its checksum the
  // stages' sum (or its first failing stage's error).
  std::vector<absl::StatusOr<wire::EsState>> UpdateGroups(
      const std::vector<const EsGroup*>& groups, const wire::EsUpdateRequest& update);
  // The group's trainable values as one GGUF file (a pipeline's stages' files merged).
  absl::StatusOr<wire::EsSnapshotChunk> SnapshotGroup(const EsGroup& group);
  // Drops a replica whose worker failed, freeing its stages on the others; it may join again
  // later.
  void Drop(const std::string& id, const absl::Status& why);
  // Frees the job's replica on every worker of `group` (best effort).
  void Release(const EsGroup& group);
  void Count(int64_t sent, int64_t received);
  // CANCELLED, after checkpointing the current generation if it is not yet.
  absl::Status Stopped();

  EsDriverOptions options_;
  EsGroupSource groups_;
  EsJobMetrics* metrics_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> abort_{false};
  mutable std::mutex mu_;  // replicas_, byte counters (replies arrive on the clients' threads)
  std::map<std::string, Replica> replicas_;
  // Groups that refused a replica for lack of memory (by id, with the first worker's client then).
  std::map<std::string, std::shared_ptr<WorkerClient>> no_room_;
  std::vector<std::vector<float>> log_;  // shaped fitness of each generation done
  std::vector<uint64_t> checksums_;      // after each generation (0: no replica reported)
  uint64_t checksum_ = 0;                // after the last update (or of the base at start)
  int64_t num_values_ = 0;
  int64_t checkpointed_ = -1;  // the generation of the last checkpoint written
  int64_t sent_ = 0, received_ = 0;      // the current generation's bytes
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_ES_DRIVER_H_
