#include "coordinator/plan_loader.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "models/engine/kv_cache.h"
#include "models/log/log.h"
#include "worker/activations.h"

namespace fucina {

ClusterPlan PlanLoader::Load() {
  while (true) {
    const std::vector<WorkerRecord> alive = workers_.Alive();
    std::vector<WorkerInfo> infos;
    for (const WorkerRecord& w : alive) infos.push_back(w.info);
    PlanRequest request;
    request.config = config_;
    request.size = size_;
    request.context = options_.context;
    request.cache_type = *ParseKvCacheType(options_.cache_type);
    request.kv_slots = options_.kv_slots;
    request.expert_workers = options_.expert_workers;
    ClusterPlan plan = PlanPlacement(request, infos);
    plan.context = options_.context;
    if (!plan.ready) {
      // Health and refusals then say why the workers went, not only that they did.
      if (const std::string last_failure = workers_.last_failure(); !last_failure.empty()) {
        absl::StrAppend(&plan.status, " (last failure: ", last_failure, ")");
      }
      publish_(std::make_shared<const ClusterPlan>(plan));
      if (!infos.empty()) FUCINA_LOG(kWarning) << "model not ready: " << plan.status;
      return plan;
    }
    auto record = [&](const std::string& id) -> const WorkerRecord& {
      return *std::find_if(alive.begin(), alive.end(),
                           [&](const WorkerRecord& w) { return w.id == id; });
    };
    for (StagePlan& s : plan.stages) s.client = record(s.worker_id).client;
    // What GetPlacement reports: not ready until the shards below are loaded.
    {
      ClusterPlan loading = plan;
      loading.ready = false;
      loading.status = "loading: " + plan.status;
      publish_(std::make_shared<const ClusterPlan>(std::move(loading)));
    }
    wire::ActivationType activation;
    ParseActivationType(options_.activation_type, &activation).IgnoreError();
    // Every shard of the plan, expert workers first; all load at once (a stage only names its
    // peers at load time, it does not call them), and the first failure in this order counts.
    struct Load {
      std::string worker_id;
      wire::LoadShardRequest request;
    };
    std::vector<Load> loads;
    for (const ExpertPlan& e : plan.experts) {
      wire::LoadShardRequest load;
      load.set_model_path(options_.model_path);
      load.set_stage(-1);
      load.set_first_layer(0);
      load.set_last_layer(config_.num_layers);
      load.set_context(options_.context);
      load.set_cache_type(options_.cache_type);
      load.set_threads(options_.threads);
      for (int32_t x : e.experts) load.add_serve_experts(x);
      loads.push_back({e.worker_id, std::move(load)});
    }
    for (size_t i = 0; i < plan.stages.size(); ++i) {
      const StagePlan& s = plan.stages[i];
      wire::LoadShardRequest load;
      load.set_model_path(options_.model_path);
      load.set_adapter_path(options_.adapter_path);
      load.set_stage(static_cast<int32_t>(i));
      load.set_first_layer(s.first_layer);
      load.set_last_layer(s.last_layer);
      load.set_embeddings(s.embeddings);
      load.set_head(s.head);
      load.set_context(options_.context);
      load.set_cache_type(options_.cache_type);
      load.set_activation_type(activation);
      load.set_threads(options_.threads);
      for (const ExpertPlan& e : plan.experts) {
        wire::Peer* peer = load.add_expert_peers();
        peer->set_worker_id(e.worker_id);
        peer->set_address(record(e.worker_id).address);
        for (int32_t x : e.experts) peer->add_experts(x);
      }
      if (i + 1 < plan.stages.size()) {
        // Activations go from stage to stage; the coordinator talks to stage 0 only.
        const WorkerRecord& next = record(plan.stages[i + 1].worker_id);
        load.mutable_next_stage()->set_worker_id(next.id);
        load.mutable_next_stage()->set_address(next.address);
      }
      loads.push_back({s.worker_id, std::move(load)});
    }
    const auto replies = CallAll<wire::LoadShardResponse>(loads.size(), [&](size_t i, auto done) {
      record(loads[i].worker_id).client->LoadShardAsync(loads[i].request, std::move(done));
    });
    absl::Status failed;
    std::string failed_worker;
    for (size_t i = 0; i < loads.size() && failed.ok(); ++i) {
      failed = replies[i].status();
      failed_worker = loads[i].worker_id;
    }
    if (failed.ok()) {
      publish_(std::make_shared<const ClusterPlan>(plan));
      // Which worker (and device) holds what: the first thing to read when a plan surprises.
      std::string where;
      for (const StagePlan& st : plan.stages) {
        const WorkerRecord& w = record(st.worker_id);
        absl::StrAppend(&where, "; ", w.id, w.address.empty() ? "" : "@" + w.address, " (",
                        w.device, ") layers ", st.first_layer, "-", st.last_layer);
      }
      for (const ExpertPlan& e : plan.experts) {
        const WorkerRecord& w = record(e.worker_id);
        absl::StrAppend(&where, "; ", w.id, " (", w.device, ") ", e.experts.size(), " experts");
      }
      FUCINA_LOG(kInfo) << "placement: " << plan.status << where;
      return plan;
    }
    if (FailureOriginOf(failed) == FailureOrigin::kTransport) {
      workers_.Forget(failed_worker, failed);  // and plan again without it, here
      continue;
    }
    plan.ready = false;
    plan.status = absl::StrCat("loading on worker ", failed_worker, " failed: ", failed.message());
    publish_(std::make_shared<const ClusterPlan>(plan));
    FUCINA_LOG(kWarning) << "model not ready: " << plan.status;
    return plan;
  }
}

}  // namespace fucina
