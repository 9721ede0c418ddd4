// Stages that pass activations to each other (LoadShardRequest.next_stage): the reply of a
// chained Forward is the last stage's, re-indexed; stage 0 computes the next step while stage 1
// still holds the previous one; a failure further on names the worker that failed.
#include <unistd.h>

#include <future>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "tests/worker/fake_worker_client.h"
#include "tests/worker/fixture_model.h"
#include "worker/worker_actor.h"

namespace fucina {
namespace {

class StageChainTest : public FixtureModelTest {
 protected:
  static void SetUpTestSuite() { MakeModel("stage_chain"); }
  static void TearDownTestSuite() { RemoveModel(); }

  // Layers [first, last) of the 4, handing on to the worker `next` (none when empty).
  static wire::LoadShardRequest Shard(int stage, int64_t first, int64_t last,
                                      const std::string& next = "") {
    wire::LoadShardRequest r =
        FixtureModelTest::Shard(stage, first, last, first == 0, last == kLayers);
    if (!next.empty()) r.mutable_next_stage()->set_worker_id(next);
    return r;
  }

  // Starts a Forward on `w`; the future gets its reply.
  static std::future<absl::StatusOr<wire::ForwardResponse>> Start(WorkerClient& w,
                                                                  wire::ForwardRequest f) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<wire::ForwardResponse>>>();
    auto future = promise->get_future();
    w.ForwardAsync(std::move(f), [promise](absl::StatusOr<wire::ForwardResponse> r) {
      promise->set_value(std::move(r));
    });
    return future;
  }

};

TEST_F(StageChainTest, AChainOfThreeStagesSamplesWhatOneWorkerDoes) {
  std::shared_ptr<WorkerActor> s1, s2;
  auto resolve = [&](const wire::Peer& p) -> std::shared_ptr<WorkerClient> {
    return p.worker_id() == "s1" ? s1 : p.worker_id() == "s2" ? s2 : nullptr;
  };
  s1 = std::make_shared<WorkerActor>(WorkerOptions{.threads = 1}, resolve);
  s2 = std::make_shared<WorkerActor>(WorkerOptions{.threads = 1}, resolve);
  WorkerActor whole({.threads = 1});
  WorkerActor s0({.threads = 1}, resolve);
  ASSERT_TRUE(whole.LoadShard(Shard(0, 0, 4)).ok());
  ASSERT_TRUE(s0.LoadShard(Shard(0, 0, 1, "s1")).ok());
  ASSERT_TRUE(s1->LoadShard(Shard(1, 1, 3, "s2")).ok());
  ASSERT_TRUE(s2->LoadShard(Shard(2, 3, 4)).ok());

  std::vector<int32_t> a = {5, 17, 99}, b = {42, 8};
  int64_t pos_a = 0, pos_b = 0;
  for (int step = 0; step < 4; ++step) {
    wire::ForwardRequest f;
    *f.add_segments() = Seg(1, pos_a, a);
    *f.add_segments() = Seg(2, pos_b, b);
    auto want = whole.Forward(f);
    auto got = s0.Forward(f);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_FALSE(got->has_activations());  // the caller gets samples only
    ASSERT_EQ(got->results_size(), 2) << got->DebugString();
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(got->results(i).session_id(), want->results(i).session_id());
      EXPECT_EQ(got->results(i).token(), want->results(i).token()) << "step " << step;
      EXPECT_FLOAT_EQ(got->results(i).logprob(), want->results(i).logprob());
    }
    pos_a += static_cast<int64_t>(a.size());
    pos_b += static_cast<int64_t>(b.size());
    a = {want->results(0).token()};
    b = {want->results(1).token()};
  }
  // Activations went stage to stage.
  auto st0 = s0.GetStats(), st1 = s1->GetStats(), st2 = s2->GetStats();
  ASSERT_TRUE(st0.ok() && st1.ok() && st2.ok());
  EXPECT_GT(st0->activation_bytes_out(), 0);
  EXPECT_EQ(st1->activation_bytes_in(), st0->activation_bytes_out());
  EXPECT_EQ(st2->activation_bytes_in(), st1->activation_bytes_out());
  EXPECT_EQ(st2->session_lengths(0), pos_a);
}

TEST_F(StageChainTest, StageZeroComputesTheNextStepWhileStageOneHoldsThePrevious) {
  auto s1 = std::make_shared<HoldingWorkerClient>();
  WorkerActor s0({.threads = 1}, [&](const wire::Peer&) { return s1; });
  ASSERT_TRUE(s0.LoadShard(Shard(0, 0, 2, "s1")).ok());

  wire::ForwardRequest group_a, group_b;
  *group_a.add_segments() = Seg(1, 0, {7, 8, 9});
  *group_b.add_segments() = Seg(2, 0, {4, 5});
  auto reply_a = Start(s0, group_a);
  ASSERT_TRUE(s1->WaitForCalls(1));
  auto reply_b = Start(s0, group_b);
  // Stage 1 still holds group A, and stage 0 has run group B and handed it on: the two stages
  // overlap instead of stage 0 waiting for A's reply.
  ASSERT_TRUE(s1->WaitForCalls(2));
  EXPECT_EQ(s1->request(0).segments(0).session_id(), 1u);
  EXPECT_EQ(s1->request(1).segments(0).session_id(), 2u);
  EXPECT_EQ(s1->request(1).stage(), 1);
  EXPECT_EQ(s1->request(1).activations().rows(), 2);
  EXPECT_EQ(reply_a.wait_for(std::chrono::seconds(0)), std::future_status::timeout);

  // Replies reach each caller as they come, in any order.
  wire::ForwardResponse rb;
  rb.add_results()->set_session_id(2);
  rb.mutable_results(0)->set_token(11);
  ASSERT_TRUE(s1->Release(1, rb));
  auto b = reply_b.get();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->results(0).token(), 11);
  EXPECT_EQ(reply_a.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  ASSERT_TRUE(s1->Release(0, absl::UnavailableError("connection reset")));
  auto a = reply_a.get();
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->has_chain_failure());
  EXPECT_EQ(a->chain_failure().worker_id(), "s1");
  EXPECT_EQ(a->chain_failure().code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

TEST_F(StageChainTest, ErrorsOfTheNextStageArePutBackOnTheCallersSegments) {
  auto s1 = std::make_shared<HoldingWorkerClient>();
  WorkerActor s0({.threads = 1}, [&](const wire::Peer&) { return s1; });
  ASSERT_TRUE(s0.LoadShard(Shard(0, 0, 2, "s1")).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {1, 100000});  // outside the vocabulary: fails on stage 0
  *f.add_segments() = Seg(2, 0, {3});
  *f.add_segments() = Seg(3, 0, {4});
  auto reply = Start(s0, f);
  ASSERT_TRUE(s1->WaitForCalls(1));
  ASSERT_EQ(s1->request(0).segments_size(), 2);  // only the two that ran
  wire::ForwardResponse later;
  wire::SegmentError* e = later.add_errors();
  e->set_index(0);  // the next stage's segment 0: the caller's segment 1
  e->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  e->set_message("no memory");
  later.add_results()->set_session_id(3);
  ASSERT_TRUE(s1->Release(0, later));
  auto r = reply.get();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->errors_size(), 2);
  EXPECT_EQ(r->errors(0).index(), 0);
  EXPECT_EQ(r->errors(0).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(r->errors(1).index(), 1);
  EXPECT_EQ(r->errors(1).code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  ASSERT_EQ(r->results_size(), 1);
  EXPECT_EQ(r->results(0).session_id(), 3u);
}

TEST_F(StageChainTest, ARequestErrorOfTheNextStagePassesThroughAndCancelReachesIt) {
  auto s1 = std::make_shared<HoldingWorkerClient>();
  WorkerActor s0({.threads = 1}, [&](const wire::Peer&) { return s1; });
  ASSERT_TRUE(s0.LoadShard(Shard(0, 0, 2, "s1")).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {1, 2});
  auto first = Start(s0, f);
  ASSERT_TRUE(s1->WaitForCalls(1));
  ASSERT_TRUE(s1->Release(0, absl::InvalidArgumentError("session 1 holds 3 positions")));
  auto r = first.get();
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();

  // A caller that gives up cuts the call held further on (which then names the next stage).
  wire::ForwardRequest g;
  *g.add_segments() = Seg(5, 0, {1});
  auto second = Start(s0, g);
  ASSERT_TRUE(s1->WaitForCalls(2));
  s0.CancelInFlight();
  auto c = second.get();
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->has_chain_failure());
  EXPECT_EQ(c->chain_failure().code(), static_cast<int>(absl::StatusCode::kCancelled));
}

TEST_F(StageChainTest, OnlyAStageBeforeTheLastTakesANextStage) {
  WorkerActor last({.threads = 1}, [](const wire::Peer&) {
    return std::make_shared<HoldingWorkerClient>();
  });
  auto r = last.LoadShard(Shard(1, 2, 4, "s9"));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  WorkerActor unreachable({.threads = 1},
                          [](const wire::Peer&) -> std::shared_ptr<WorkerClient> { return nullptr; });
  r = unreachable.LoadShard(Shard(0, 0, 2, "s9"));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("s9"), std::string::npos);
}

}  // namespace
}  // namespace fucina
