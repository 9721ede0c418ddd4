// The coordinator of one model: its text front end (text_front_end.h), the worker registry
// (worker_registry.h), the plan loader (plan_loader.h) and the scheduler. Front ends (gRPC, HTTP) talk to it; workers register with
// it (in-process ones through AddWorker, remote ones through the Registry service).
//
// Liveness: remote workers heartbeat; one silent for `dead_after_ms`, or failing a call, is
// marked dead and the model is re-planned on the survivors (not ready when they cannot hold
// it). A worker that registers again later is planned in.
#ifndef FUCINA_COORDINATOR_COORDINATOR_H_
#define FUCINA_COORDINATOR_COORDINATOR_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/metrics.h"
#include "coordinator/placement.h"
#include "coordinator/plan_loader.h"
#include "coordinator/scheduler.h"
#include "coordinator/text_front_end.h"
#include "coordinator/train_jobs.h"
#include "coordinator/worker_registry.h"
#include "fucina/v1/generate.pb.h"
#include "models/engine/config.h"
#include "models/engine/kv_cache.h"
#include "models/gguf/gguf.h"
#include "models/grammar/grammar.h"
#include "worker/worker_client.h"

namespace fucina {

struct CoordinatorOptions {
  std::string model_path;
  // A LoRA adapter GGUF every pipeline stage applies to its layers (LoadShardRequest
  // adapter_path); checked against the model at Create. Empty: none.
  std::string adapter_path;
  // Train jobs' checkpoints live under this folder (TrainJobs); empty: jobs take no out_dir.
  std::string train_dir;
  std::string served_name;  // empty: the model file's stem (general.name is an alias)
  // Chat requests without a system message get this one ('' keeps the template's own default,
  // which for small models can be long and derail them). The same default as `fucina run`.
  std::string system_prompt = "You are a helpful assistant.";
  // Control-token text ("<|im_end|>") in user and tool content becomes the control token, as in
  // llama-server and vLLM by default. Off: it stays text, so a user cannot end their turn and
  // write the system's (the template's own tokens, and system and assistant content, are parsed).
  bool parse_special_in_content = false;
  int64_t context = 4096;
  std::string cache_type = "f16";
  std::string activation_type = "f32";
  int kv_slots = 8;
  int expert_workers = 0;
  int threads = 0;  // per shard, at most each worker's own --threads; 0: all of a worker's
  SchedulerOptions scheduler;
  // Defaults for what a request leaves unset (those of `fucina run`).
  SamplingParams sampling;
  int64_t max_tokens = 128;
  int heartbeat_ms = 1000;
  int dead_after_ms = 3000;
  // A request's grammar that takes longer to compile is refused (--grammar-timeout).
  std::chrono::milliseconds grammar_timeout = kDefaultGrammarCompileLimit;
};

class Coordinator {
 public:
  // Opens the model's GGUF for its metadata, tokenizer and template (the weights stay on the
  // workers). Metrics register in `registry`.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(
      const CoordinatorOptions& options, std::shared_ptr<prometheus::Registry> registry);
  ~Coordinator();

  // A worker joins (in process: empty address). Returns its id; the model is re-planned.
  std::string AddWorker(const std::string& address, const WorkerInfo& info,
                        std::shared_ptr<WorkerClient> client, const std::string& device = "cpu");
  // In-process workers joining together (one plan for all of them).
  std::vector<std::string> AddWorkers(
      const std::vector<std::pair<WorkerInfo, std::shared_ptr<WorkerClient>>>& workers);
  // False when the id is unknown or was declared dead (the worker should register again).
  // `stats` (optional) is the worker's load, kept for placement().
  bool Heartbeat(const std::string& worker_id, const wire::WorkerStats* stats = nullptr) {
    return workers_->Heartbeat(worker_id, stats);
  }
  void MarkDead(const std::string& worker_id, const absl::Status& why);
  std::shared_ptr<WorkerClient> ClientFor(const std::string& worker_id) const {
    return workers_->ClientFor(worker_id);
  }
  std::vector<WorkerRecord> Workers() const { return workers_->Workers(); }

  const CoordinatorOptions& options() const { return options_; }
  const std::string& served_name() const { return served_name_; }
  // Whether a request's model field names the served model: empty, the served name, or the
  // model's general.name.
  bool Serves(const std::string& model) const;
  const ModelConfig& config() const { return config_; }
  // Tokenizing, chat templates and grammar checks, before anything is queued.
  const TextFrontEnd& text() const { return *text_; }
  Scheduler& scheduler() { return *scheduler_; }
  Metrics& metrics() { return *metrics_; }
  // Evolution-strategies train jobs over the alive workers (fucina.v1.Train).
  TrainJobs& train_jobs() { return *train_jobs_; }
  ::fucina::v1::Placement placement() const;
  // Called on the scheduler thread after every (re-)plan with the model's readiness (gRPC
  // health follows it). Set before the first worker is added.
  void SetReadyListener(std::function<void(bool ready)> listener) {
    scheduler_->SetReadyHook(std::move(listener));
  }

 private:
  Coordinator() = default;
  // Train replicas (TrainJobs' placement): every alive worker whole, or the serving plan's
  // stages as one pipelined replica once its shards are loaded.
  std::vector<EsGroup> TrainGroups(bool pipeline) const;

  CoordinatorOptions options_;
  std::string served_name_;
  std::unique_ptr<gguf::File> file_;
  ModelConfig config_;
  ModelSize size_;
  std::unique_ptr<TextFrontEnd> text_;
  std::unique_ptr<Metrics> metrics_;

  std::unique_ptr<WorkerRegistry> workers_;  // its watcher calls MarkDead
  // The plan as the loader last published it (never null).
  std::shared_ptr<const ClusterPlan> plan() const {
    std::lock_guard<std::mutex> lock(mu_);
    return plan_;
  }
  mutable std::mutex mu_;  // plan_
  std::shared_ptr<const ClusterPlan> plan_ = std::make_shared<const ClusterPlan>();
  std::unique_ptr<PlanLoader> loader_;  // the scheduler's planner
  std::unique_ptr<Scheduler> scheduler_;  // after the state its planner reads
  std::unique_ptr<EsMetrics> es_metrics_;
  std::unique_ptr<TrainJobs> train_jobs_;  // last: its jobs call Workers() until they stop
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_COORDINATOR_H_
