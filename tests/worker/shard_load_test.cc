// Loading a shard: a load that fails part way leaves the actor holding nothing (no peers that
// CancelInFlight would reach, no weights counted, no expert FFN pointing into a destroyed
// model), and the default memory budget of a worker process comes from the memory it may use.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "kernels/cpu/thread_pool.h"
#include "models/engine/fixture.h"
#include "tests/worker/fake_worker_client.h"
#include "tests/worker/fixture_model.h"
#include "worker/worker_actor.h"

namespace fucina {
namespace {

// An expert peer that only counts the cancels it is sent.
class CountingPeer : public FakeWorkerClient {
 public:
  void CancelInFlight() override { ++cancels; }
  std::atomic<int> cancels{0};
};

class ShardLoadTest : public FixtureModelTest {
 protected:
  static void SetUpTestSuite() {
    MakeModel("shard_load");
    moe_path_ = new std::string(testing::TempDir() + "/shard_load_moe_" +
                                std::to_string(getpid()) + ".gguf");
    FixtureOptions o;
    o.arch = "qwen3moe";
    o.num_layers = 2;
    ThreadPool pool(1);
    ASSERT_TRUE(MakeFixture(o, *moe_path_, pool).ok());
  }
  static void TearDownTestSuite() {
    RemoveModel();
    std::remove(moe_path_->c_str());
    delete moe_path_;
  }

  // The whole MoE fixture with experts 0 and 1 on the peer "e1".
  static wire::LoadShardRequest MoeShard() {
    wire::LoadShardRequest r;
    r.set_model_path(*moe_path_);
    r.set_stage(0);
    r.set_first_layer(0);
    r.set_last_layer(2);
    r.set_embeddings(true);
    r.set_head(true);
    r.set_context(32);
    r.set_cache_type("f32");
    wire::Peer* peer = r.add_expert_peers();
    peer->set_worker_id("e1");
    peer->add_experts(0);
    peer->add_experts(1);
    return r;
  }

  static inline std::string* moe_path_ = nullptr;
};

TEST_F(ShardLoadTest, AFailedLoadLeavesNoPeersWeightsOrModel) {
  auto peer = std::make_shared<CountingPeer>();
  WorkerActor w({.threads = 1}, [&](const wire::Peer&) { return peer; });
  // Refused after the expert peers were resolved: the last stage takes no next stage.
  wire::LoadShardRequest bad = MoeShard();
  bad.mutable_next_stage()->set_worker_id("s9");
  auto r = w.LoadShard(bad);
  ASSERT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();

  w.CancelInFlight();
  EXPECT_EQ(peer->cancels.load(), 0) << "a failed load left its expert peer behind";
  auto stats = w.GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->weight_bytes(), 0);
  EXPECT_EQ(stats->sessions(), 0);
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {1, 2});
  auto step = w.Forward(f);
  EXPECT_TRUE(absl::IsFailedPrecondition(step.status())) << step.status();
  EXPECT_TRUE(IsWorkerFailure(step.status()));  // it holds no stage: a re-plan's business

  // The same actor loads a good shard afterwards, and then its peer is reachable.
  ASSERT_TRUE(w.LoadShard(MoeShard()).ok());
  w.CancelInFlight();
  EXPECT_EQ(peer->cancels.load(), 1);
}

TEST(DefaultMemoryBudget, TakesTheSmallerOfTheCgroupLimitAndTheMachine) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  EXPECT_EQ(DefaultMemoryBudget(0, 10 * kGiB), 8 * kGiB);
  EXPECT_EQ(DefaultMemoryBudget(5 * kGiB, 10 * kGiB), 4 * kGiB);   // a pod's memory.max
  EXPECT_EQ(DefaultMemoryBudget(20 * kGiB, 10 * kGiB), 8 * kGiB);  // a limit past the machine
  EXPECT_EQ(DefaultMemoryBudget(5 * kGiB, 0), 4 * kGiB);
  EXPECT_EQ(DefaultMemoryBudget(0, 0), 0);
  const int64_t here = DefaultMemoryBudget();
  EXPECT_GT(here, 0);
  EXPECT_LE(here, static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE));
}

TEST_F(ShardLoadTest, EverySizeIsCheckedAgainstTheBudget) {
  WorkerActor probe({.threads = 1});
  auto loaded = probe.LoadShard(Shard(0, 0, 4, true, true));
  ASSERT_TRUE(loaded.ok());
  // Room for the weights and a few sessions of the fixture's 32 positions.
  WorkerActor w({.threads = 1,
                 .memory_budget = loaded->weight_bytes() + 4 * loaded->kv_bytes_per_session()});
  wire::LoadShardRequest huge = Shard(0, 0, 4, true, true);
  huge.set_context(int64_t{1} << 40);
  auto r = w.LoadShard(huge);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("context"), std::string::npos) << r.status();
  huge.set_context(int64_t{1} << 20);  // a valid context no session of which fits the budget
  r = w.LoadShard(huge);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("context"), std::string::npos) << r.status();

  ASSERT_TRUE(w.LoadShard(Shard(0, 0, 4, true, true)).ok());
  // All-position logits of 32 rows: within the context, past the budget's free bytes? The
  // fixture's vocabulary is small, so many sessions' worth are asked for in one step.
  wire::ForwardRequest f;
  for (int i = 0; i < 64; ++i) {
    wire::Segment s = Seg(100 + i, 0, std::vector<int32_t>(32, 3), false);
    s.set_all_logits(true);
    *f.add_segments() = s;
  }
  auto step = w.Forward(f);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_GT(step->errors_size(), 50);  // at most 4 sessions fit
  bool named = false;
  for (const wire::SegmentError& e : step->errors()) {
    EXPECT_EQ(e.code(), static_cast<int>(absl::StatusCode::kResourceExhausted)) << e.message();
    named |= e.message().find("segments") != std::string::npos ||
             e.message().find("KV") != std::string::npos;
  }
  EXPECT_TRUE(named);
  EXPECT_LE(w.GetStats()->sessions(), 4);
}

}  // namespace
}  // namespace fucina
