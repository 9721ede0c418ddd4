// The plan loader: places a model's layers and experts on the alive workers (placement.h)
// and loads the shards of that plan on them, all at once. A worker whose transport fails
// while loading is forgotten and the plan is made again without it; any other failure leaves
// the model not ready, saying why. Runs on the scheduler's thread (its planner).
#ifndef FUCINA_COORDINATOR_PLAN_LOADER_H_
#define FUCINA_COORDINATOR_PLAN_LOADER_H_

#include <functional>
#include <memory>
#include <string>

#include "coordinator/placement.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_registry.h"
#include "models/engine/config.h"
#include "models/engine/model_size.h"

namespace fucina {

struct CoordinatorOptions;  // coordinator.h

class PlanLoader {
 public:
  // Every state of the plan as it changes (placed and loading, ready, or why not), for
  // GetPlacement and the train jobs: an immutable copy each, called on the loader's thread.
  using Publish = std::function<void(std::shared_ptr<const ClusterPlan> plan)>;

  // All borrowed; they outlive the loader.
  PlanLoader(const CoordinatorOptions& options, const ModelConfig& config,
             const ModelSize& size, WorkerRegistry& workers, Publish publish)
      : options_(options), config_(config), size_(size), workers_(workers),
        publish_(std::move(publish)) {}

  // The plan over the workers alive now, its shards loaded (`ready`), or why not: what the
  // scheduler steps.
  ClusterPlan Load();

 private:
  const CoordinatorOptions& options_;
  const ModelConfig& config_;
  const ModelSize& size_;
  WorkerRegistry& workers_;
  Publish publish_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_PLAN_LOADER_H_
