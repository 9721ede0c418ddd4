#include "coordinator/placement.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max() / 4;

int64_t Budget(const WorkerInfo& w) { return w.memory_budget > 0 ? w.memory_budget : kUnlimited; }

}  // namespace

std::vector<std::string> ClusterPlan::worker_ids() const {
  std::vector<std::string> ids;
  for (const StagePlan& s : stages) ids.push_back(s.worker_id);
  for (const ExpertPlan& e : experts) ids.push_back(e.worker_id);
  return ids;
}

bool ClusterPlan::Uses(const std::string& worker_id) const {
  const std::vector<std::string> ids = worker_ids();
  return std::find(ids.begin(), ids.end(), worker_id) != ids.end();
}

ClusterPlan PlanPlacement(const PlanRequest& r, const std::vector<WorkerInfo>& workers) {
  ClusterPlan plan = PlanWith(r, workers);
  // A MoE model the stage workers cannot hold with its experts: move the experts to dedicated
  // workers, as few as will do.
  if (!plan.ready && r.config.IsMoe() && r.expert_workers == 0) {
    for (int e = 1; e < static_cast<int>(workers.size()); ++e) {
      PlanRequest with_experts = r;
      with_experts.expert_workers = e;
      ClusterPlan p = PlanWith(with_experts, workers);
      if (p.ready) return p;
    }
  }
  return plan;
}

ClusterPlan PlanWith(const PlanRequest& r, const std::vector<WorkerInfo>& workers) {
  ClusterPlan plan;
  const ModelConfig& c = r.config;
  const int64_t num_layers = c.num_layers;
  const bool moe = c.IsMoe();
  const int expert_workers = moe ? r.expert_workers : 0;
  if (workers.empty()) {
    plan.status = "no workers";
    return plan;
  }
  if (expert_workers >= static_cast<int>(workers.size())) {
    plan.status = absl::StrCat(workers.size(), " workers cannot hold a stage and ",
                               expert_workers, " expert workers");
    return plan;
  }
  std::vector<WorkerInfo> stage_workers(workers.begin(), workers.end() - expert_workers);
  if (r.max_stages > 0 && static_cast<int>(stage_workers.size()) > r.max_stages) {
    stage_workers.resize(r.max_stages);
  }
  // A model that cannot be cut anywhere (per-layer embeddings) runs on one stage: the stage
  // worker with the most memory, so it holds the most KV slots.
  bool splittable = false;
  for (int64_t l = 1; l < num_layers && !splittable; ++l) splittable = c.CanSplitAt(l);
  if (!splittable && stage_workers.size() > 1) {
    auto largest = std::max_element(
        stage_workers.begin(), stage_workers.end(),
        [](const WorkerInfo& a, const WorkerInfo& b) { return Budget(a) < Budget(b); });
    stage_workers = {*largest};
  }
  const int64_t local_experts = expert_workers > 0 ? 0 : c.num_experts;
  const int wanted_slots = std::max(1, r.kv_slots);

  // Bytes a worker needs for layers [first, last) with `slots` resident sessions.
  auto stage_bytes = [&](int64_t first, int64_t last, bool emb, bool head, int slots) {
    return r.size.StageBytes(first, last, local_experts, emb, head) +
           slots * KvBytesPerSession(c, first, last, r.context, r.cache_type);
  };

  // Target layer counts that give each stage work in proportion to its cores, then assign
  // front to back: each stage takes its target, or less if its budget is smaller, or more when
  // later stages would overflow. The head counts: on a small model it is as much work as
  // several layers, and the stages of a pipeline run at the pace of the slowest.
  int64_t total_cores = 0;
  for (const WorkerInfo& w : stage_workers) total_cores += std::max(1, w.cores);
  const int n = static_cast<int>(stage_workers.size());
  const bool known_work = static_cast<int64_t>(r.size.layer_work.size()) == num_layers;
  const int64_t used_experts = moe ? c.num_experts_used : 0;
  const double head_work =
      static_cast<double>(known_work ? r.size.head_work : r.size.head_bytes);
  auto layer_work = [&](int64_t l) {
    return static_cast<double>(known_work ? r.size.layer_work[l]
                                          : r.size.StageBytes(l, l + 1, used_experts, false,
                                                              false));
  };
  double total_work = head_work;
  for (int64_t l = 0; l < num_layers; ++l) total_work += layer_work(l);
  std::vector<int64_t> target(n, 0);
  int64_t layer = 0, cores = 0;
  double done = 0;
  for (int i = 0; i + 1 < n; ++i) {
    cores += std::max(1, stage_workers[i].cores);
    const double share = total_work * static_cast<double>(cores) / total_cores;  // stages 0..i
    // Layers while the next one's middle stays within the share: at least one, and one left
    // for every later stage.
    while (layer < num_layers - (n - 1 - i)) {
      const double w = layer_work(layer);
      if (target[i] > 0 && done + w / 2 > share) break;
      done += w;
      ++target[i];
      ++layer;
    }
  }
  target[n - 1] = num_layers - layer;
  // Splits the layers so each stage also holds `slots` sessions' KV; empty when impossible.
  auto split = [&](int slots) {
    std::vector<StagePlan> stages;
    auto fits = [&](int i, int64_t first, int64_t count) {
      const bool emb = first == 0, head = first + count == num_layers;
      return stage_bytes(first, first + count, emb, head, slots) <= Budget(stage_workers[i]);
    };
    int64_t first = 0;
    for (int i = 0; i < n && first < num_layers; ++i) {
      // Its target, or less if its budget is smaller, or more when the workers after it could
      // not hold the rest; the last takes everything left.
      int64_t count = i + 1 == n ? num_layers - first : std::min(target[i], num_layers - first);
      while (count > 0 && !fits(i, first, count)) --count;
      if (i + 1 < n) {
        int64_t rest_capacity = 0;
        for (int j = i + 1; j < n; ++j) {
          int64_t k = 0;
          while (first + count + rest_capacity + k < num_layers &&
                 fits(j, first + count + rest_capacity, k + 1)) {
            ++k;
          }
          rest_capacity += k;
        }
        while (first + count + rest_capacity < num_layers && fits(i, first, count + 1)) ++count;
      }
      // A cut may not part a layer from the layer whose K/V it reads: move it down to a legal
      // cut, or up when there is none (fits() then decides).
      if (count > 0 && first + count < num_layers && !c.CanSplitAt(first + count)) {
        int64_t legal = count;
        while (legal > 0 && !c.CanSplitAt(first + legal)) --legal;
        if (legal == 0) {
          legal = count;
          while (first + legal < num_layers && !c.CanSplitAt(first + legal)) ++legal;
        }
        count = legal;
        if (!fits(i, first, count)) return std::vector<StagePlan>();
      }
      if (count == 0) continue;
      StagePlan stage;
      stage.worker_id = stage_workers[i].id;
      stage.first_layer = first;
      stage.last_layer = first + count;
      stage.embeddings = first == 0;
      stage.head = first + count == num_layers;
      stage.weight_bytes = stage_bytes(first, first + count, stage.embeddings, stage.head, 0);
      stages.push_back(stage);
      first += count;
    }
    if (first < num_layers) stages.clear();
    return stages;
  };
  for (int slots = wanted_slots; slots >= 1 && plan.stages.empty(); --slots) {
    plan.stages = split(slots);
  }
  if (plan.stages.empty()) {
    int64_t need = stage_bytes(0, num_layers, true, true, 1), have = 0;
    for (const WorkerInfo& w : stage_workers) have += std::min(Budget(w), kUnlimited / 64);
    plan.status = absl::StrCat("not enough memory: the model needs ", need,
                               " bytes with one KV slot; the stage workers' budgets total ",
                               have);
    return plan;
  }

  // Slots: as many as every stage can hold, up to the wanted count.
  int slots = wanted_slots;
  for (size_t i = 0; i < plan.stages.size(); ++i) {
    const StagePlan& s = plan.stages[i];
    const int64_t kv = KvBytesPerSession(c, s.first_layer, s.last_layer, r.context, r.cache_type);
    if (kv == 0) continue;
    const WorkerInfo& w = *std::find_if(stage_workers.begin(), stage_workers.end(),
                                        [&](const WorkerInfo& x) { return x.id == s.worker_id; });
    const int64_t room = (Budget(w) - s.weight_bytes) / kv;
    slots = static_cast<int>(std::min<int64_t>(slots, room));
  }
  if (slots < 1) {
    plan.stages.clear();
    plan.status = "not enough memory for one KV slot";
    return plan;
  }
  plan.kv_slots = slots;

  // Experts: round-robin over the expert workers.
  if (expert_workers > 0) {
    for (int j = 0; j < expert_workers; ++j) {
      const WorkerInfo& w = workers[workers.size() - expert_workers + j];
      ExpertPlan e;
      e.worker_id = w.id;
      for (int32_t x = j; x < c.num_experts; x += expert_workers) e.experts.push_back(x);
      e.weight_bytes =
          r.size.ExpertBytes(0, num_layers, static_cast<int64_t>(e.experts.size()));
      if (e.weight_bytes > Budget(w)) {
        plan.stages.clear();
        plan.status = absl::StrCat("not enough memory: expert worker ", w.id, " needs ",
                                   e.weight_bytes, " bytes; its budget is ", w.memory_budget);
        return plan;
      }
      plan.experts.push_back(std::move(e));
    }
  }
  plan.ready = true;
  plan.status = absl::StrCat(plan.stages.size(), " stage(s), ", plan.experts.size(),
                             " expert worker(s), ", plan.kv_slots, " KV slot(s)");
  return plan;
}

}  // namespace fucina
