// What the cluster tests share: the coordinator with in-process worker actors (the embedded
// mode, no sockets) on small fixture models, requests through its scheduler, and the
// single-process engine as the reference.
#ifndef FUCINA_TESTS_COORDINATOR_CLUSTER_FIXTURE_H_
#define FUCINA_TESTS_COORDINATOR_CLUSTER_FIXTURE_H_

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "coordinator/coordinator.h"
#include "models/engine/fixture.h"
#include "models/engine/model.h"
#include "models/engine/session.h"
#include "worker/worker_actor.h"

namespace fucina {

inline std::string FixturePath(const std::string& name) {
  return testing::TempDir() + "/cluster_" + std::to_string(getpid()) + "_" + name + ".gguf";
}

struct Cluster {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<Coordinator> coordinator;
  std::vector<std::shared_ptr<WorkerActor>> actors;
};

// A coordinator with `stages` stage workers and `expert_workers` expert workers, all in
// process with one thread each; waits for the plan.
inline std::unique_ptr<Cluster> StartCluster(const std::string& path, int stages, int expert_workers,
                                      CoordinatorOptions options = {},
                                      int64_t budget = 0) {
  auto cluster = std::make_unique<Cluster>();
  options.model_path = path;
  options.expert_workers = expert_workers;
  if (options.context == 4096) options.context = 256;
  if (options.cache_type == "f16") options.cache_type = "f32";
  auto c = Coordinator::Create(options, cluster->registry);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  cluster->coordinator = *std::move(c);
  Coordinator* coordinator = cluster->coordinator.get();
  std::vector<std::pair<WorkerInfo, std::shared_ptr<WorkerClient>>> workers;
  for (int i = 0; i < stages + expert_workers; ++i) {
    auto actor = std::make_shared<WorkerActor>(
        WorkerOptions{.threads = 1, .memory_budget = budget},
        [coordinator](const wire::Peer& p) { return coordinator->ClientFor(p.worker_id()); });
    workers.emplace_back(WorkerInfo{"", 1, budget}, actor);
    cluster->actors.push_back(std::move(actor));
  }
  coordinator->AddWorkers(workers);
  coordinator->scheduler().WaitForPlans(1, 60000);
  return cluster;
}

struct Output {
  std::vector<int32_t> ids;
  std::vector<SampleResult> samples;
  std::string text;
  std::vector<std::string> deltas;
  Outcome outcome;
};

inline std::shared_ptr<Request> Submit(Coordinator& c, GenerateJob job) {
  auto r = c.scheduler().Reserve();
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  absl::Status s = c.scheduler().Submit(*r, std::move(job));
  EXPECT_TRUE(s.ok()) << s;
  return *r;
}

inline Output Drain(Request& r) {
  Output out;
  while (!r.done()) {
    if (auto d = r.Next(1000)) {
      out.ids.insert(out.ids.end(), d->ids.begin(), d->ids.end());
      out.samples.insert(out.samples.end(), d->samples.begin(), d->samples.end());
      out.text += d->text;
      out.deltas.push_back(d->text);
    }
  }
  out.outcome = r.outcome();
  return out;
}

inline Output Generate(Coordinator& c, GenerateJob job) {
  auto r = Submit(c, std::move(job));
  if (r == nullptr) return {};
  return Drain(*r);
}

inline GenerateJob Job(std::vector<int32_t> prompt, int64_t max_tokens, float temp = 0,
                uint64_t seed = 0) {
  GenerateJob job;
  job.prompt = std::move(prompt);
  job.max_tokens = max_tokens;
  job.sampling.temperature = temp;
  job.sampling.seed = seed;
  return job;
}

// The single-process reference: Session::Generate on the whole model.
inline std::vector<int32_t> Reference(const std::string& path, const GenerateJob& job) {
  ThreadPool pool(1);
  auto model = Model::Load(path, {}, pool);
  EXPECT_TRUE(model.ok()) << model.status();
  auto tokenizer = Tokenizer::FromGguf((*model)->file());
  EXPECT_TRUE(tokenizer.ok());
  auto kv = (*model)->NewKvCache(256, GgmlType::kF32);
  Session session(**model, **tokenizer, *std::move(kv));
  GenerationOptions o;
  o.max_tokens = job.max_tokens;
  o.sampling = job.sampling;
  auto r = session.Generate(job.prompt, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

inline double MetricValue(prometheus::Registry& registry, const std::string& name) {
  double total = 0;
  for (const prometheus::MetricFamily& f : registry.Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      total += f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return total;
}

class ClusterTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    ThreadPool pool(2);
    FixtureOptions dense;
    dense.arch = "qwen3";
    dense.num_layers = 6;
    dense.peaked = true;
    dense.seed = 11;
    ASSERT_TRUE(MakeFixture(dense, FixturePath("dense"), pool).ok());
    // Unpeaked: sampling spreads, so drafts are rejected too.
    FixtureOptions flat = dense;
    flat.peaked = false;
    flat.num_layers = 3;
    ASSERT_TRUE(MakeFixture(flat, FixturePath("flat"), pool).ok());
    FixtureOptions llama = dense;
    llama.arch = "llama";
    llama.tied = false;
    ASSERT_TRUE(MakeFixture(llama, FixturePath("llama"), pool).ok());
    FixtureOptions moe = dense;
    moe.arch = "qwen3moe";
    moe.num_layers = 3;
    moe.num_experts = 8;
    moe.num_experts_used = 2;
    ASSERT_TRUE(MakeFixture(moe, FixturePath("moe"), pool).ok());
    // Gemma 4: sliding (window 4, shorter than the prompt) and global layers of different
    // geometry, the last three reading earlier layers' K/V, routed experts beside the MLP.
    FixtureOptions gemma = dense;
    gemma.arch = "gemma4";
    gemma.num_layers = 6;
    gemma.head_dim = 16;
    gemma.head_dim_global = 32;
    gemma.kv_heads_global = 1;
    gemma.sliding_window = 4;
    gemma.shared_kv_layers = 3;
    gemma.moe = true;
    gemma.num_experts = 8;
    gemma.num_experts_used = 2;
    gemma.expert_ffn = 32;
    ASSERT_TRUE(MakeFixture(gemma, FixturePath("gemma4"), pool).ok());
  }
  static void TearDownTestSuite() {
    for (const char* name : {"dense", "flat", "llama", "moe", "gemma4"}) {
      std::remove(FixturePath(name).c_str());
    }
  }
};

const std::vector<int32_t> kPrompt = {12, 200, 33, 47, 5, 91, 18, 64};

}  // namespace fucina

#endif  // FUCINA_TESTS_COORDINATOR_CLUSTER_FIXTURE_H_
