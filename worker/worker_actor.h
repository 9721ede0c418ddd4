// The worker actor: owns one shard of a model (a layer range with or without embeddings and
// head, or a set of MoE experts) and the KV caches of the sessions the coordinator runs
// through it.
//
// Threading: all state lives on the actor's SerialExecutor; every call posts to it (the train
// calls that drive it from outside run on a thread of their own), so gRPC handlers and
// in-process callers may call from any thread. Forward steps run
// one at a time on the executor, each using the shard's whole thread pool.
//
// Pipelining: a stage with a next stage sends its output rows there itself (asynchronously)
// and answers its caller with the next stage's reply; its executor is free for the next step as
// soon as its own layers are done, so with several steps in flight every stage computes at once.
//
// Ownership of sessions: a session's KV is created by its first Forward segment (pos0 = 0) or
// by a CopyPrefix operation, and freed only by a ReleaseSession operation or by loading another
// shard: the coordinator owns the slot table and every eviction decision. Those operations ride
// in the steps (ForwardRequest.session_ops), applied in order before the step's segments on
// every stage, so they are ordered with the steps of the sessions they change. The worker refuses new sessions beyond its
// memory budget (RESOURCE_EXHAUSTED) rather than evicting on its own.
#ifndef FUCINA_WORKER_WORKER_ACTOR_H_
#define FUCINA_WORKER_WORKER_ACTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "kernels/cpu/thread_pool.h"
#include "models/engine/model.h"
#include "models/grammar/grammar.h"
#include "models/sampler/sampler.h"
#include "models/speculative/verify.h"
#include "worker/es_replica.h"
#include "worker/forward_reply.h"
#include "worker/serial_executor.h"
#include "worker/step_times.h"
#include "worker/worker_client.h"

namespace fucina {

class RemoteExperts;  // worker/remote_experts.h

struct WorkerOptions {
  int threads = 0;            // 0: ThreadPool::Default()'s count
  // Bytes for weights, KV and a step's rows; 0: unlimited (a worker process defaults to the
  // memory it may use: DefaultMemoryBudget()).
  int64_t memory_budget = 0;
  // Observes each forward step's wall time (the worker's latency histogram); on the executor.
  std::function<void(double seconds)> on_forward;
  // The local file to open for a shard (on the executor, before the shard loads). Null: the
  // request's model_path as it is. A worker process installs one that fetches the shard's
  // tensors from the coordinator when that path cannot be opened here (worker/model_fetch.h);
  // its error fails the LoadShard.
  std::function<absl::StatusOr<std::string>(const wire::LoadShardRequest& request)> locate_model;
};

// The memory budget of a worker started without one: 80% of what this process may use (the
// cgroup's memory.max where one is set, as in a pod; else the machine's physical memory), the
// rest left for what the budget does not count (gRPC buffers, stacks, the allocator's slack).
// 0 when neither can be read.
int64_t DefaultMemoryBudget();
// The same from given limits (bytes; <= 0: not set), for tests.
int64_t DefaultMemoryBudget(int64_t cgroup_limit, int64_t physical);

// The model loading options a LoadShard asks for (stage < 0: an experts-only shard).
LoadOptions LoadOptionsFor(const wire::LoadShardRequest& request);

class WorkerActor : public WorkerClient {
 public:
  // Resolves an expert peer named in a shard to a client (by default gRPC by address, plaintext
  // and without a join token: a worker process passes one dialling with its credentials; the
  // embedded mode maps worker ids to in-process actors).
  using PeerResolver =
      std::function<std::shared_ptr<WorkerClient>(const wire::Peer& peer)>;

  explicit WorkerActor(const WorkerOptions& options, PeerResolver resolver = nullptr);
  ~WorkerActor() override;

  // Posted to the actor's executor, which then runs `done`.
  void LoadShardAsync(wire::LoadShardRequest request, LoadShardCallback done) override;
  // Posted to the executor; with a next stage, `done` runs on the thread of that stage's reply.
  void ForwardAsync(wire::ForwardRequest request, ForwardCallback done) override;
  // Cuts this actor's calls to its expert peers (a stage whose own caller gave up must not wait
  // on a hung expert worker until the deadline); from any thread.
  void CancelInFlight() override;
  void ExpertForwardAsync(wire::ExpertForwardRequest request,
                          Callback<wire::ExpertForwardResponse> done) override;
  void GetStatsAsync(Callback<wire::WorkerStats> done) override;
  // Train jobs: each holds its own replica beside the shard (the whole model, or one stage of a
  // pipelined replica). A member's scoring runs off the executor, on a thread of the call's own
  // (the first stage's EsEvaluate, a later stage's EsForward; EsUpdate too): each stage's part
  // of a pass is one executor task, so the shard's forward steps wait for one pass at most,
  // never for a whole member, and calls to the next stage wait off the executor, so no stage
  // holds its executor while another computes (two jobs' pipelines may cross the same
  // workers). The others are posted to the executor.
  void EsLoadAsync(wire::EsJob job, Callback<wire::EsState> done) override;
  void EsEvaluateAsync(wire::EsEvaluateRequest request,
                       Callback<wire::EsEvaluateResponse> done) override;
  void EsUpdateAsync(wire::EsUpdateRequest request, Callback<wire::EsState> done) override;
  void EsSnapshotAsync(wire::EsSnapshotRequest request,
                       Callback<wire::EsSnapshotChunk> done) override;
  void EsReleaseAsync(wire::EsReleaseRequest request, Callback<wire::EsState> done) override;
  void EsForwardAsync(wire::EsForwardRequest request,
                      Callback<wire::EsForwardResponse> done) override;

  int64_t memory_budget() const { return options_.memory_budget; }
  int num_threads() const { return max_threads_; }

 private:
  struct Session {
    std::unique_ptr<KvCache> kv;
    std::vector<int32_t> history;       // tokens in kv (the last stage's penalty window)
    std::unique_ptr<Sampler> sampler;   // last stage, set by a segment's sampling
    std::unique_ptr<GrammarMatcher> grammar;  // last stage: the reply's grammar, if any
    int32_t top_logprobs = 0;
  };
  class EsPipeline;
  // A train job on this worker: its replica (shared: a pipelined evaluation running off the
  // executor keeps it alive through an EsRelease) and, on a stage before the last, the next.
  struct EsJobState {
    std::shared_ptr<EsReplica> replica;
    std::shared_ptr<WorkerClient> next;
  };

  // The bodies, run on the executor.
  absl::StatusOr<wire::LoadShardResponse> DoLoadShard(const wire::LoadShardRequest& request);
  // DoLoadShard's work after the old shard is gone; on failure DoLoadShard clears what it set.
  absl::StatusOr<wire::LoadShardResponse> LoadNewShard(const wire::LoadShardRequest& request);
  // Drops the shard, its sessions and peers: the state of a worker that holds nothing.
  void ClearShard();
  // One step's task; `laps` times its parts.
  absl::StatusOr<wire::ForwardResponse> DoForward(const wire::ForwardRequest& request,
                                                  StepLaps& laps);
  absl::StatusOr<wire::ExpertForwardResponse> DoExpertForward(
      const wire::ExpertForwardRequest& request);
  // The train calls' bodies, run off the executor (they post its tasks and wait for them).
  absl::StatusOr<wire::EsEvaluateResponse> DoEsEvaluate(const wire::EsEvaluateRequest& request);
  absl::StatusOr<wire::EsState> DoEsUpdate(const wire::EsUpdateRequest& request);
  absl::StatusOr<wire::EsForwardResponse> DoEsForward(const wire::EsForwardRequest& request);
  absl::StatusOr<wire::EsState> DoEsLoad(const wire::EsJob& job);  // on the executor
  // Runs `body` on a thread of its own, in the calling thread's CallScope (so the peer calls
  // it makes are cut with the call that made it); the destructor joins what is still running.
  void OffExecutor(std::function<void()> body);
  // One of a step's session operations; a failure is about the request (its session).
  absl::Status ApplySessionOp(const wire::SessionOp& op);
  absl::Status ApplyCopyPrefix(const wire::CopyPrefix& copy);
  wire::WorkerStats DoStats() const;

  // Checks one segment against its session (or its creation); OK or the reason it cannot run.
  absl::Status CheckSegment(const wire::Segment& segment, int64_t* new_kv_bytes) const;
  absl::StatusOr<Session*> SessionOrNew(uint64_t id);
  // The job's replica, or NOT_FOUND naming it.
  absl::StatusOr<EsReplica*> Replica(const std::string& job_id);
  // The job's replica, a stage whose part of a pass runs here (in EsForward or the first stage's
  // EsEvaluate), with its next stage; NOT_FOUND naming the job.
  absl::StatusOr<EsJobState> Stage(const std::string& job_id);
  // CANCELLED when `stage` is no longer the job's (released or reloaded). On the executor.
  absl::Status CheckHeld(const EsJobState& stage, const std::string& job_id);
  // Member `member` selected on `stage`'s replica one trainable tensor per executor task; from
  // the calling thread.
  absl::Status SelectMember(const EsJobState& stage, const std::string& job_id,
                            int64_t generation, int member);
  // Member `member`'s fitness scored through the pipeline `stage` starts (its first stage).
  absl::StatusOr<float> ScoreThroughPipeline(const EsJobState& stage,
                                             const wire::EsEvaluateRequest& request,
                                             int member);
  int64_t KvBytes() const;
  // The memory budget not held by the shard, its sessions and the replicas (unlimited: a
  // quarter of int64's range, so sums of a step's sizes cannot overflow).
  int64_t FreeBudgetBytes() const;
  // What the shard, its sessions and the train replicas hold against the memory budget.
  int64_t UsedBytes() const;
  // A train replica's cost: its owned bytes, plus the weights it maps that the shard does not
  // (same file: the pages are shared).
  int64_t ReplicaBytes(const EsReplica& replica) const;

  WorkerOptions options_;
  PeerResolver resolver_;
  int max_threads_;  // the worker's --threads
  // ---- State below is touched on the executor only. ----
  std::unique_ptr<ThreadPool> pool_;  // sized per shard (LoadShardRequest.threads)
  wire::LoadShardRequest shard_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<RemoteExperts> remote_experts_;
  // The expert peers of the current shard, for CancelInFlight from other threads.
  std::mutex peers_mu_;
  std::vector<std::shared_ptr<WorkerClient>> peers_;  // expert peers and the next stage
  std::shared_ptr<WorkerClient> next_stage_;  // the shard's next_stage; null on the last
  int64_t weight_bytes_ = 0;
  int64_t kv_bytes_per_session_ = 0;
  // node_hash_map: Session pointers stay valid while a step creates other sessions.
  absl::node_hash_map<uint64_t, Session> sessions_;
  // The last stage's token table for grammars, built from the model's metadata on first use.
  std::shared_ptr<const GrammarVocab> grammar_vocab_;
  // A segment's grammar, compiled (on the executor) when it arrives with its sampling.
  absl::StatusOr<std::unique_ptr<GrammarMatcher>> CompileGrammar(const wire::Sampling& sampling);
  // Shared with the callbacks of chained steps, which may outlive the actor.
  std::shared_ptr<StepTimeTotals> step_times_ = std::make_shared<StepTimeTotals>();
  int64_t forwarded_positions_ = 0;
  int64_t expert_tokens_ = 0;
  std::vector<int64_t> expert_counts_;  // [num_experts]: (row, expert) pairs computed here
  int64_t activation_bytes_in_ = 0;
  int64_t activation_bytes_out_ = 0;
  std::vector<float> logits_;  // the last stage's head output, reused across steps
  // A step's buffers, reused across steps so decode allocates none of them per token.
  struct StepBuffers {
    std::vector<float> input, x, last_rows;  // activations in, the rows, the head's input
    std::vector<int64_t> offsets;            // segment i's first row in `input`
    std::vector<int> ok;                     // the segments that run
    std::vector<Model::Segment> segments;
    std::vector<Session*> sessions;
    std::vector<std::unique_ptr<GrammarMatcher>> grammars;
    std::vector<int64_t> first_row;  // the last stage's: each sampled segment's logits row
    std::vector<absl::StatusOr<Verified>> verified;
  } buffers_;
  absl::node_hash_map<std::string, EsJobState> es_jobs_;  // by job id
  // OffExecutor's threads: each marks itself finished; the next start joins those.
  std::mutex off_mu_;
  std::vector<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> off_threads_;
  SerialExecutor executor_;  // last: destroyed first, so no task outlives the state
};

}  // namespace fucina

#endif  // FUCINA_WORKER_WORKER_ACTOR_H_
