// The placement planner on synthetic model sizes: proportional splits, budgets, slots, experts.
#include "coordinator/placement.h"

#include <gtest/gtest.h>

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
  Plan p = PlanPlacement(Request(10), {W("a", 2)});
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
  Plan p = PlanPlacement(r, {W("a", 1), W("b", 2), W("c", 1)});
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
  Plan p = PlanPlacement(r, {W("a", 1), W("b", 1)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].last_layer, 8);
  EXPECT_EQ(p.stages[1].first_layer, 8);
  EXPECT_TRUE(p.stages[1].head);
}

TEST(Placement, SmallBudgetTakesFewerLayers) {
  // Worker a can hold embeddings + 2 layers + KV for 4 slots: 1000 + 200 + 4*2*8 = 1264.
  Plan p = PlanPlacement(Request(10), {W("a", 1, 1300), W("b", 1)});
  ASSERT_TRUE(p.ready) << p.status;
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].last_layer, 2);
  EXPECT_EQ(p.stages[1].first_layer, 2);
  EXPECT_EQ(p.stages[1].last_layer, 10);
}

TEST(Placement, NotReadyWhenBudgetsCannotHoldTheModel) {
  Plan p = PlanPlacement(Request(10), {W("a", 1, 1200), W("b", 1, 1200)});
  EXPECT_FALSE(p.ready);
  EXPECT_NE(p.status.find("not enough memory"), std::string::npos) << p.status;
  EXPECT_TRUE(p.stages.empty());
}

TEST(Placement, NoWorkersIsNotReady) {
  Plan p = PlanPlacement(Request(4), {});
  EXPECT_FALSE(p.ready);
  EXPECT_EQ(p.status, "no workers");
}

TEST(Placement, SlotsClampedToWhatBudgetsHold) {
  // Everything on one worker: weights 1000 + 1000 + 1000 = 3000; KV 10 layers * 8 = 80 a slot.
  Plan p = PlanPlacement(Request(10), {W("a", 1, 3000 + 2 * 80 + 79)});
  ASSERT_TRUE(p.ready) << p.status;
  EXPECT_EQ(p.kv_slots, 2);
}

TEST(Placement, ExpertWorkersGetExpertsRoundRobin) {
  PlanRequest r = Request(4, /*experts=*/8, /*expert_bytes=*/10);
  r.expert_workers = 2;
  Plan p = PlanPlacement(r, {W("s", 1), W("e0", 1), W("e1", 1)});
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
  Plan p = PlanPlacement(r, {W("s", 1, 2600), W("e0", 1, 1700), W("e1", 1, 1700)});
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
  Plan p = PlanPlacement(r, {W("e0", 1), W("e1", 1)});
  EXPECT_FALSE(p.ready);
}

}  // namespace
}  // namespace fucina
