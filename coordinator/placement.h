// Placement planner: which worker holds which layers and experts of a model.
//
// Pure function of the live workers (memory budget, cores) and the model's sizes, so it is
// tested without any RPC. Layers are split into contiguous stages across the stage workers in
// proportion to their throughput (cores), moved as needed so each stage's weights plus the KV of
// every resident slot fit its memory budget; embeddings go to the first stage and the head to
// the last. With expert workers, each MoE layer's experts are spread over them (round-robin by
// id) and stay off the stage workers.
#ifndef FUCINA_COORDINATOR_PLACEMENT_H_
#define FUCINA_COORDINATOR_PLACEMENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/ggml_type.h"
#include "models/engine/config.h"
#include "models/engine/model_size.h"

namespace fucina {

class WorkerClient;  // worker/worker_client.h

struct WorkerInfo {
  std::string id;
  int cores = 1;
  int64_t memory_budget = 0;  // 0: unlimited
};

struct StagePlan {
  std::string worker_id;
  int64_t first_layer = 0, last_layer = 0;  // [first, last)
  bool embeddings = false, head = false;
  int64_t weight_bytes = 0;
  std::shared_ptr<WorkerClient> client;  // the worker's, set by the plan loader (placement: null)
};

struct ExpertPlan {
  std::string worker_id;
  std::vector<int32_t> experts;
  int64_t weight_bytes = 0;
};

// The one plan of a model on the cluster: its placement, then its load state. PlanPlacement
// makes it (`ready`: a placement was found); the plan loader (plan_loader.h) fills in the
// workers' clients and loads the shards on the scheduler's thread (`ready` then: every shard
// is loaded), and the scheduler steps it. Everyone else reads the loader's published copies,
// immutable (`std::shared_ptr<const ClusterPlan>`).
struct ClusterPlan {
  bool ready = false;
  std::string status;  // why not ready, or a one-line summary
  // In order; each stage hands its activations and the step's session operations to the next
  // itself, so steps go to stages[0] only.
  std::vector<StagePlan> stages;
  std::vector<ExpertPlan> experts;
  int kv_slots = 0;  // resident sessions every stage can hold
  int64_t context = 0;

  // Every worker the plan uses: the stages', then the expert workers'.
  std::vector<std::string> worker_ids() const;
  bool Uses(const std::string& worker_id) const;
};

struct PlanRequest {
  ModelConfig config;
  ModelSize size;
  int64_t context = 4096;
  GgmlType cache_type = GgmlType::kF16;
  int kv_slots = 8;        // wanted resident sessions (clamped to what budgets hold, >= 1)
  int expert_workers = 0;  // MoE: workers dedicated to experts
  int max_stages = 0;      // 0: every stage worker gets layers
};

// With expert_workers == 0, a MoE model that does not fit is retried with 1, 2, ... expert
// workers before it is declared not ready.
ClusterPlan PlanPlacement(const PlanRequest& request, const std::vector<WorkerInfo>& workers);
// Exactly as requested (no automatic expert workers).
ClusterPlan PlanWith(const PlanRequest& request, const std::vector<WorkerInfo>& workers);

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_PLACEMENT_H_
