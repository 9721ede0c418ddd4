// Which workers a plan uses and what happens when they change: every shard of a plan loading
// at once, a worker dying mid-generation (its streams fail, the plan is remade without it), a
// worker joining while requests run, survivors too small for the model.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "models/engine/model_size.h"
#include "tests/worker/fake_worker_client.h"
#include "models/engine/registry.h"
#include "tests/coordinator/cluster_fixture.h"

namespace fucina {
namespace {

// A worker that forwards to a real actor until it "dies": after `fail_after` forward calls
// every call fails with UNAVAILABLE, as a killed process's would.
class DyingWorker : public ForwardingWorkerClient {
 public:
  DyingWorker(std::shared_ptr<WorkerActor> actor, int fail_after)
      : ForwardingWorkerClient(std::move(actor)), left_(fail_after) {}
  void LoadShardAsync(wire::LoadShardRequest r, LoadShardCallback done) override {
    if (dead()) return done(Dead());
    ForwardingWorkerClient::LoadShardAsync(std::move(r), std::move(done));
  }
  void ForwardAsync(wire::ForwardRequest r, ForwardCallback done) override {
    if (left_-- <= 0) return done(Dead());
    ForwardingWorkerClient::ForwardAsync(std::move(r), std::move(done));
  }
  void ExpertForwardAsync(wire::ExpertForwardRequest r,
                          Callback<wire::ExpertForwardResponse> done) override {
    if (dead()) return done(Dead());
    ForwardingWorkerClient::ExpertForwardAsync(std::move(r), std::move(done));
  }
  void GetStatsAsync(Callback<wire::WorkerStats> done) override {
    if (dead()) return done(Dead());
    ForwardingWorkerClient::GetStatsAsync(std::move(done));
  }

 private:
  bool dead() const { return left_ < 0; }
  static absl::Status Dead() { return absl::UnavailableError("connection refused"); }
  std::atomic<int> left_;
};

// Shard loads held until the test lets them through: which loads are in flight at once.
struct HeldLoads {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::function<void()>> pending;  // each runs its load on its actor and answers
};

// A worker whose loads wait in `held` (everything else goes straight to its actor).
class LoadHoldingWorker : public ForwardingWorkerClient {
 public:
  LoadHoldingWorker(std::shared_ptr<WorkerActor> actor, HeldLoads* held)
      : ForwardingWorkerClient(std::move(actor)), held_(held) {}
  void LoadShardAsync(wire::LoadShardRequest r, LoadShardCallback done) override {
    {
      std::lock_guard<std::mutex> lock(held_->mu);
      held_->pending.push_back([actor = target(), r = std::move(r), done = std::move(done)] {
        done(actor->LoadShard(r));
      });
    }
    held_->cv.notify_all();
  }

 private:
  HeldLoads* held_;
};

TEST_F(ClusterTest, APlanLoadsItsShardsOnEveryWorkerAtOnce) {
  // Three stages and an expert worker: all four loads are in flight before any is answered
  // (one after another, the second would never arrive while the first is held).
  CoordinatorOptions options;
  options.model_path = FixturePath("moe");
  options.expert_workers = 1;
  options.context = 256;
  options.cache_type = "f32";
  auto registry = std::make_shared<prometheus::Registry>();
  auto c = Coordinator::Create(options, registry);
  ASSERT_TRUE(c.ok()) << c.status();
  Coordinator* coordinator = c->get();
  HeldLoads held;
  std::vector<std::pair<WorkerInfo, std::shared_ptr<WorkerClient>>> workers;
  for (int i = 0; i < 4; ++i) {
    auto actor = std::make_shared<WorkerActor>(
        WorkerOptions{.threads = 1},
        [coordinator](const wire::Peer& p) { return coordinator->ClientFor(p.worker_id()); });
    workers.emplace_back(WorkerInfo{"", 1, 0},
                         std::make_shared<LoadHoldingWorker>(actor, &held));
  }
  coordinator->AddWorkers(workers);
  std::vector<std::function<void()>> loads;
  {
    std::unique_lock<std::mutex> lock(held.mu);
    ASSERT_TRUE(held.cv.wait_for(lock, std::chrono::seconds(30),
                                 [&] { return held.pending.size() == 4; }))
        << held.pending.size() << " of 4 loads in flight at once";
    loads = std::move(held.pending);
  }
  EXPECT_FALSE(coordinator->scheduler().ready());
  std::vector<std::thread> answer;
  for (auto& load : loads) answer.emplace_back(std::move(load));
  for (auto& t : answer) t.join();
  ASSERT_TRUE(coordinator->scheduler().WaitForPlans(1, 60000)) << coordinator->scheduler().status();
  EXPECT_EQ(coordinator->placement().stages_size(), 3);
  EXPECT_TRUE(Generate(*coordinator, Job(kPrompt, 4)).outcome.status.ok());
}

TEST_F(ClusterTest, DeadWorkerFailsItsStreamsAndIsReplaced) {
  // The same with speculative decoding on: the stage dies during verify steps, which fail like
  // any other.
  for (bool speculative : {false, true}) {
    SCOPED_TRACE(speculative ? "speculative" : "plain");
    const std::string path = FixturePath("dense");
    CoordinatorOptions options;
    options.model_path = path;
    options.context = 256;
    options.cache_type = "f32";
    options.scheduler.speculative = speculative;
    auto registry = std::make_shared<prometheus::Registry>();
    auto c = Coordinator::Create(options, registry);
    ASSERT_TRUE(c.ok());
    auto a0 = std::make_shared<WorkerActor>(WorkerOptions{.threads = 1});
    auto a1 = std::make_shared<WorkerActor>(WorkerOptions{.threads = 1});
    (*c)->AddWorker("", WorkerInfo{"", 1, 0}, a0);
    // The second stage dies after 5 steps.
    (*c)->AddWorker("", WorkerInfo{"", 1, 0}, std::make_shared<DyingWorker>(a1, 5));
    ASSERT_TRUE((*c)->scheduler().WaitForPlans(1, 60000));
    const int plans = (*c)->scheduler().plans();
    std::vector<int32_t> prompt = kPrompt;
    prompt.insert(prompt.end(), kPrompt.begin(), kPrompt.end());
    GenerateJob job = Job(prompt, 50);
    job.ignore_eos = true;
    Output out = Generate(**c, job);
    EXPECT_TRUE(absl::IsUnavailable(out.outcome.status)) << out.outcome.status;
    EXPECT_NE(out.outcome.status.message().find("failed"), std::string::npos);
    // A request sent at once, while the cluster re-plans, waits for the new plan instead of
    // failing with "model not ready" (a worker dying is a pause for new requests).
    Output again = Generate(**c, Job(kPrompt, 8));
    ASSERT_TRUE(again.outcome.status.ok()) << again.outcome.status;
    EXPECT_EQ(again.ids, Reference(path, Job(kPrompt, 8)));
    // Re-planned on the survivor: one stage.
    ASSERT_TRUE((*c)->scheduler().WaitForPlans(plans + 1, 60000));
    EXPECT_EQ((*c)->placement().stages_size(), 1);
    bool dead_seen = false;
    for (const WorkerRecord& w : (*c)->Workers()) dead_seen |= !w.alive;
    EXPECT_TRUE(dead_seen);
    if (speculative) {  // the failed steps carried drafts
      EXPECT_GT(MetricValue(*registry, "fucina_spec_decode_num_drafts_total"), 0);
    }
  }
}

TEST_F(ClusterTest, JoiningWorkerWaitsForRunningRequests) {
  const std::string path = FixturePath("dense");
  auto cluster = StartCluster(path, 1, 0);
  Coordinator& c = *cluster->coordinator;
  GenerateJob job = Job(kPrompt, 40);
  job.ignore_eos = true;
  auto running = Submit(c, job);
  ASSERT_TRUE(running->Next(10000).has_value());
  const int plans = c.scheduler().plans();
  c.AddWorker("", WorkerInfo{"", 1, 0}, std::make_shared<WorkerActor>(WorkerOptions{.threads = 1}));
  // The running request finishes on the old plan, unharmed.
  Output rest = Drain(*running);
  EXPECT_TRUE(rest.outcome.status.ok()) << rest.outcome.status;
  EXPECT_EQ(rest.outcome.completion_tokens, 40);
  ASSERT_TRUE(c.scheduler().WaitForPlans(plans + 1, 60000));
  EXPECT_EQ(c.placement().stages_size(), 2);
  EXPECT_EQ(Generate(c, Job(kPrompt, 8)).ids, Reference(path, Job(kPrompt, 8)));
}

TEST_F(ClusterTest, NotReadyWhenSurvivorsCannotHoldTheModel) {
  // Budgets that hold 60% of what the whole model needs (weights, the tied head's second use
  // of token_embd, one KV slot): two workers are needed.
  const std::string path = FixturePath("dense");
  auto file = gguf::File::Open(path);
  ASSERT_TRUE(file.ok());
  auto config = ReadModelConfig(**file);
  ASSERT_TRUE(config.ok());
  const ModelSize size = MeasureModel(**file, *config);
  const int64_t whole = size.LayersBytes(0, config->num_layers, 0) + size.embedding_bytes +
                        size.head_bytes +
                        KvBytesPerSession(*config, 0, config->num_layers, 256, GgmlType::kF32);
  const int64_t budget = whole * 6 / 10;
  CoordinatorOptions options;
  options.kv_slots = 1;
  auto cluster = StartCluster(path, 1, 0, options, budget);
  Scheduler& s = cluster->coordinator->scheduler();
  EXPECT_FALSE(s.ready());
  auto r = s.Reserve();
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("memory"), std::string::npos) << r.status();
  // A second worker joins: ready.
  auto actor = std::make_shared<WorkerActor>(WorkerOptions{.threads = 1,
                                                           .memory_budget = budget});
  const int plans = s.plans();
  cluster->coordinator->AddWorker("", WorkerInfo{"", 1, budget}, actor);
  EXPECT_TRUE(s.WaitForPlans(plans + 1, 60000)) << s.status();
  EXPECT_EQ(cluster->coordinator->placement().stages_size(), 2);
}

}  // namespace
}  // namespace fucina
