// The placement planner on synthetic model sizes: proportional splits, budgets, slots, experts,
// and per-layer geometry (gemma4-like: sliding-window rings, layers reading earlier layers' K/V,
// per-layer embeddings).
#include "coordinator/placement.h"

#include <gtest/gtest.h>

#include "models/engine/kv_cache.h"

namespace fucina {
namespace {

// A model of `layers` layers of 100 bytes (+ `expert` bytes per expert), 1000-byte embeddings
// and head, and KV of 10 bytes per layer per session (context 1, f32, 1 head of 1... scaled
// through the config below).
PlanRequest Request(int64_t layers, int64_t experts = 0, int64_t expert_bytes = 0) {
  PlanRequest r;
  r.config.num_layers = layers;
  r.config.num_heads_kv = 1;
  r.config.head_dim = 1;
  r.config.hidden = 8;
  r.config.num_experts = experts;
  r.config.num_experts_used = experts > 0 ? 2 : 0;
  r.config.UniformLayers();
  r.size.layer_bytes.assign(layers, 100);
  r.size.expert_bytes.assign(layers, expert_bytes);
  r.size.embedding_bytes = 1000;
  r.size.head_bytes = 1000;
  r.context = 1;  // f32 K + V of one value: 8 bytes per layer per session
  r.cache_type = GgmlType::kF32;
  r.kv_slots = 4;
  return r;
}

WorkerInfo W(const std::string& id, int cores, int64_t budget = 0) {
  return WorkerInfo{id, cores, budget};
}

TEST(Placement, OneWorkerHoldsEverything) {
  ClusterPlan p = PlanPlacement(Request(10), {W("a", 2)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 1u);
  EXPECT_EQ(p.stages[0].first_layer, 0);
  EXPECT_EQ(p.stages[0].last_layer, 10);
  EXPECT_TRUE(p.stages[0].embeddings);
  EXPECT_TRUE(p.stages[0].head);
  EXPECT_EQ(p.kv_slots, 4);
}

TEST(Placement, SplitsInProportionToCores) {
  PlanRequest r = Request(12);
  r.size.head_bytes = 0;  // layers alone (the next test weighs the head)
  ClusterPlan p = PlanPlacement(r, {W("a", 1), W("b", 2), W("c", 1)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 3u);
  EXPECT_EQ(p.stages[0].last_layer - p.stages[0].first_layer, 3);
  EXPECT_EQ(p.stages[1].last_layer - p.stages[1].first_layer, 6);
  EXPECT_EQ(p.stages[2].last_layer - p.stages[2].first_layer, 3);
  EXPECT_TRUE(p.stages[0].embeddings && !p.stages[0].head);
  EXPECT_TRUE(!p.stages[2].embeddings && p.stages[2].head);
  // Contiguous and complete.
  EXPECT_EQ(p.stages[0].first_layer, 0);
  EXPECT_EQ(p.stages[1].first_layer, p.stages[0].last_layer);
  EXPECT_EQ(p.stages[2].first_layer, p.stages[1].last_layer);
  EXPECT_EQ(p.stages[2].last_layer, 12);
}

TEST(Placement, TheHeadCountsAsWorkOfTheLastStage) {
  // 12 layers of 100 bytes and a head of 400: 800 bytes of work per token for each of two
  // equal workers, so the last stage holds 4 layers beside the head.
  PlanRequest r = Request(12);
  r.size.head_bytes = 400;
  ClusterPlan p = PlanPlacement(r, {W("a", 1), W("b", 1)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].last_layer, 8);
  EXPECT_EQ(p.stages[1].first_layer, 8);
  EXPECT_TRUE(p.stages[1].head);
}

TEST(Placement, SmallBudgetTakesFewerLayers) {
  // Worker a can hold embeddings + 2 layers + KV for 4 slots: 1000 + 200 + 4*2*8 = 1264.
  ClusterPlan p = PlanPlacement(Request(10), {W("a", 1, 1300), W("b", 1)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].last_layer, 2);
  EXPECT_EQ(p.stages[1].first_layer, 2);
  EXPECT_EQ(p.stages[1].last_layer, 10);
}

TEST(Placement, NotReadyWhenBudgetsCannotHoldTheModel) {
  ClusterPlan p = PlanPlacement(Request(10), {W("a", 1, 1200), W("b", 1, 1200)});
  EXPECT_FALSE(p.ready);
  EXPECT_NE(p.status.find("not enough memory"), std::string::npos) << p.status;
  EXPECT_TRUE(p.stages.empty());
}

TEST(Placement, NoWorkersIsNotReady) {
  ClusterPlan p = PlanPlacement(Request(4), {});
  EXPECT_FALSE(p.ready);
  EXPECT_EQ(p.status, "no workers");
}

TEST(Placement, SlotsClampedToWhatBudgetsHold) {
  // Everything on one worker: weights 1000 + 1000 + 1000 = 3000; KV 10 layers * 8 = 80 a slot.
  ClusterPlan p = PlanPlacement(Request(10), {W("a", 1, 3000 + 2 * 80 + 79)});
  ASSERT_TRUE(p.ready) << p.status;
  EXPECT_EQ(p.kv_slots, 2);
}

TEST(Placement, ExpertWorkersGetExpertsRoundRobin) {
  PlanRequest r = Request(4, /*experts=*/8, /*expert_bytes=*/10);
  r.expert_workers = 2;
  ClusterPlan p = PlanPlacement(r, {W("s", 1), W("e0", 1), W("e1", 1)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 1u);
  EXPECT_EQ(p.stages[0].worker_id, "s");
  ASSERT_EQ(p.experts.size(), 2u);
  EXPECT_EQ(p.experts[0].worker_id, "e0");
  EXPECT_EQ(p.experts[0].experts, (std::vector<int32_t>{0, 2, 4, 6}));
  EXPECT_EQ(p.experts[1].experts, (std::vector<int32_t>{1, 3, 5, 7}));
  EXPECT_EQ(p.experts[0].weight_bytes, 4 * 4 * 10);
}

TEST(Placement, ExpertsMoveToDedicatedWorkersWhenTheyDoNotFit) {
  // Embeddings + head 2000, 4 layers of 100, 8 experts of 100 bytes per layer: 5600 with the
  // experts, 2400 without.
  PlanRequest r = Request(4, 8, 100);
  ClusterPlan p = PlanPlacement(r, {W("s", 1, 2600), W("e0", 1, 1700), W("e1", 1, 1700)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 1u);
  EXPECT_EQ(p.stages[0].worker_id, "s");
  EXPECT_EQ(p.experts.size(), 2u);
  // Asked for exactly: not ready.
  EXPECT_FALSE(PlanWith(r, {W("s", 1, 2600), W("e0", 1, 1700), W("e1", 1, 1700)}).ready);
}

TEST(Placement, ExpertWorkersNeedAStageWorker) {
  PlanRequest r = Request(4, 8, 10);
  r.expert_workers = 2;
  ClusterPlan p = PlanPlacement(r, {W("e0", 1), W("e1", 1)});
  EXPECT_FALSE(p.ready);
}

// A gemma4-like model of 12 layers: sliding layers (window 512, 2 KV heads of 256) with every
// sixth layer global (1 KV head of 512); the last four layers store no K/V: the sliding ones
// read layer 7, the global one layer 5. So a cut after layer 5 is illegal (layer 11 reads 5).
PlanRequest Gemma4Like(int64_t per_layer_input = 0) {
  PlanRequest r = Request(12);
  ModelConfig& c = r.config;
  c.arch = "gemma4";
  c.num_heads = 8;
  c.num_heads_kv = 2;
  c.head_dim = 256;
  c.per_layer_input = per_layer_input;
  c.layers.clear();  // Request's uniform layers, replaced by gemma4's
  for (int64_t l = 0; l < 12; ++l) {
    LayerSpec s;
    const bool global = l % 6 == 5;
    s.attention = global ? AttentionKind::kGlobal : AttentionKind::kSliding;
    s.window = global ? 0 : 512;
    s.num_heads = 8;
    s.num_heads_kv = global ? 1 : 2;
    s.head_dim = global ? 512 : 256;
    s.rope_dims = s.head_dim;
    s.ffn = 64;
    if (l >= 8) s.kv_source = global ? 5 : 7;
    c.layers.push_back(s);
  }
  r.context = 4096;
  r.cache_type = GgmlType::kF16;
  return r;
}

// The stages cover the layers in order, and no stage boundary parts a layer from the layer
// whose K/V it reads.
void ExpectLegalStages(const ClusterPlan& p, const ModelConfig& c) {
  ASSERT_FALSE(p.stages.empty());
  EXPECT_EQ(p.stages.front().first_layer, 0);
  EXPECT_EQ(p.stages.back().last_layer, c.num_layers);
  for (size_t i = 0; i < p.stages.size(); ++i) {
    const StagePlan& s = p.stages[i];
    if (i > 0) EXPECT_EQ(s.first_layer, p.stages[i - 1].last_layer);
    EXPECT_TRUE(c.CanSplitAt(s.first_layer)) << "cut at " << s.first_layer;
    for (int64_t l = s.first_layer; l < s.last_layer; ++l) {
      const int64_t src = c.layers[l].kv_source;
      if (src >= 0) {
        EXPECT_GE(src, s.first_layer) << "layer " << l << " is apart from its K/V source";
      }
    }
  }
}

TEST(Placement, SharedKvLayersStayWithTheirSource) {
  const PlanRequest r = Gemma4Like();
  // The cuts the proportional split would make for three equal workers (after layers 3 and 7)
  // include an illegal one: the planner has to move it.
  ASSERT_TRUE(r.config.CanSplitAt(4));
  ASSERT_FALSE(r.config.CanSplitAt(8));
  const std::vector<std::vector<WorkerInfo>> clusters = {
      {W("a", 1), W("b", 1)},          {W("a", 1), W("b", 3)},
      {W("a", 3), W("b", 1)},          {W("a", 1), W("b", 1), W("c", 1)},
      {W("a", 2), W("b", 1), W("c", 1)}, {W("a", 1), W("b", 1), W("c", 4)},
      {W("a", 1), W("b", 8), W("c", 1)}};
  int multi_stage = 0;
  for (const auto& workers : clusters) {
    SCOPED_TRACE(std::to_string(workers.size()) + " workers, cores " +
                 std::to_string(workers[0].cores) + "/" + std::to_string(workers[1].cores));
    const ClusterPlan p = PlanPlacement(r, workers);
    ASSERT_TRUE(p.ready) << p.status;
    ExpectLegalStages(p, r.config);
    multi_stage += p.stages.size() > 1;
  }
  EXPECT_GT(multi_stage, 0) << "every plan was one stage: nothing was cut";
}

TEST(Placement, PerLayerEmbeddingsRunInOneStage) {
  const PlanRequest r = Gemma4Like(/*per_layer_input=*/256);
  const ClusterPlan p = PlanPlacement(r, {W("a", 1), W("b", 1), W("c", 1)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 1u);
  EXPECT_EQ(p.stages[0].first_layer, 0);
  EXPECT_EQ(p.stages[0].last_layer, 12);
  EXPECT_TRUE(p.stages[0].embeddings && p.stages[0].head);
  // No worker can hold it whole: not ready, rather than a split the model cannot run.
  const int64_t kv = KvBytesPerSession(r.config, 0, 12, r.context, r.cache_type);
  const int64_t budget = 1000 + 1000 + 12 * 100 + kv - 1;
  const ClusterPlan none = PlanPlacement(r, {W("a", 1, budget), W("b", 1, budget)});
  EXPECT_FALSE(none.ready);
  EXPECT_TRUE(none.stages.empty());
  EXPECT_NE(none.status.find("not enough memory"), std::string::npos) << none.status;
  // The worker with the most memory takes it, so it holds the most sessions: the first worker
  // could hold one, the second four.
  const int64_t weights = 1000 + 1000 + 12 * 100;
  PlanRequest slots = r;
  slots.kv_slots = 8;
  const ClusterPlan best = PlanPlacement(slots, {W("a", 1, weights + kv + kv / 2),
                                          W("b", 1, weights + 4 * kv + kv / 2)});
  ASSERT_TRUE(best.ready) << best.status;
  ASSERT_EQ(best.stages.size(), 1u);
  EXPECT_EQ(best.stages[0].worker_id, "b");
  EXPECT_EQ(best.kv_slots, 4);
}

TEST(Placement, KvBytesFollowEachLayersGeometry) {
  PlanRequest r = Gemma4Like();
  const ModelConfig& c = r.config;
  // f16 K and V: a sliding layer keeps 2 heads x 256 values in a ring of 512 + 128 = 640 rows,
  // a global layer 1 head x 512 values in all 4096 rows, layers 8..11 nothing (within a stage
  // holding their sources). Layers 0-4 and 6-7 are sliding, 5 global.
  ASSERT_EQ(KvRows(512, 4096), 640);
  const int64_t sliding = 2 * 640 * 2 * 256 * 2;
  const int64_t global = 2 * 4096 * 1 * 512 * 2;
  EXPECT_LT(sliding, global);
  EXPECT_EQ(KvBytesPerSession(c, 0, 12, 4096, GgmlType::kF16), 7 * sliding + global);
  EXPECT_EQ(KvBytesPerSession(c, 0, 5, 4096, GgmlType::kF16), 5 * sliding);
  EXPECT_EQ(KvBytesPerSession(c, 5, 12, 4096, GgmlType::kF16), 2 * sliding + global);
  // A context shorter than a ring: sliding layers keep every position, as global ones.
  EXPECT_EQ(KvBytesPerSession(c, 0, 1, 256, GgmlType::kF16), 2 * 256 * 2 * 256 * 2);

  // The planner sizes slots with these bytes: one worker with room for the weights and 3.5
  // sessions gets 3 slots (sized as 8 uniform global layers, one session would not fit).
  r.kv_slots = 8;
  const int64_t weights = 1000 + 1000 + 12 * 100;
  const int64_t per_session = 7 * sliding + global;
  ASSERT_LT(weights + 3 * per_session + per_session / 2, weights + 8 * global);
  ClusterPlan p = PlanPlacement(r, {W("a", 1, weights + 3 * per_session + per_session / 2)});
  ASSERT_TRUE(p.ready) << p.status;
  EXPECT_EQ(p.kv_slots, 3);
  // Two stages: each holds its own layers' KV; the stage with the global layer limits slots.
  const int64_t first_weights = 1000 + 5 * 100, second_weights = 1000 + 7 * 100;
  const int64_t budget = second_weights + 2 * (2 * sliding + global) + 1;
  ASSERT_GE(budget - first_weights, 3 * 5 * sliding);  // the first stage alone would hold 3
  p = PlanPlacement(r, {W("a", 1, budget), W("b", 1, budget)});
  ASSERT_TRUE(p.ready) << p.status;
  ExpectLegalStages(p, c);
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].last_layer, 5);
  EXPECT_EQ(p.kv_slots, 2);
}

}  // namespace
}  // namespace fucina
