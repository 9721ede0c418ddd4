// The worker actor through its WorkerClient interface, in process (no sockets): shard loading,
// the session contract, malformed messages and the memory budget.
#include "worker/worker_actor.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/engine/lora.h"
#include "models/engine/model.h"
#include "tests/worker/fixture_model.h"
#include "worker/activations.h"
#include "worker/sampling_wire.h"

namespace fucina {
namespace {

class WorkerActorTest : public FixtureModelTest {
 protected:
  static void SetUpTestSuite() { MakeModel("worker_actor"); }
  static void TearDownTestSuite() { RemoveModel(); }
};

// How a step of one segment ended: the call's error, else its segment's (a segment that fails
// for its own request's reason rides in the reply; the call succeeds).
absl::Status Outcome(const absl::StatusOr<wire::ForwardResponse>& r) {
  if (!r.ok()) return r.status();
  if (r->errors_size() == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(r->errors(0).code()), r->errors(0).message());
}

TEST_F(WorkerActorTest, ForwardBeforeLoadIsAnError) {
  WorkerActor w({.threads = 1});
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {1, 2});
  auto r = w.Forward(f);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
}

TEST_F(WorkerActorTest, TwoStagesMatchOneAndKeepSessions) {
  WorkerActor whole({.threads = 1}), s0({.threads = 1}), s1({.threads = 1});
  ASSERT_TRUE(whole.LoadShard(Shard(0, 0, 4, true, true)).ok());
  ASSERT_TRUE(s0.LoadShard(Shard(0, 0, 2, true, false)).ok());
  ASSERT_TRUE(s1.LoadShard(Shard(1, 2, 4, false, true)).ok());

  std::vector<int32_t> ids = {5, 17, 99, 3};
  for (int step = 0; step < 4; ++step) {
    wire::ForwardRequest f;
    const int64_t pos0 = step == 0 ? 0 : 3 + step;
    *f.add_segments() = Seg(7, pos0, ids, step == 0);
    auto a = whole.Forward(f);
    ASSERT_TRUE(a.ok()) << a.status();
    auto mid = s0.Forward(f);
    ASSERT_TRUE(mid.ok()) << mid.status();
    ASSERT_TRUE(mid->has_activations());
    f.set_stage(1);
    *f.mutable_activations() = mid->activations();
    auto b = s1.Forward(f);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->results_size(), 1);
    ASSERT_EQ(b->results_size(), 1);
    EXPECT_EQ(a->results(0).token(), b->results(0).token()) << "step " << step;
    EXPECT_FLOAT_EQ(a->results(0).logprob(), b->results(0).logprob());
    ids = {a->results(0).token()};
  }
  auto stats = s1.GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->sessions(), 1);
  EXPECT_EQ(stats->forwarded_positions(), 4 + 3);
  ASSERT_EQ(stats->session_lengths_size(), 1);
  EXPECT_EQ(stats->session_lengths(0), 7);
  EXPECT_GT(stats->activation_bytes_in(), 0);
  // Every step timed, its parts within the time it was served: the prompt apart, then three
  // decode steps.
  EXPECT_EQ(stats->other_step_times().steps(), 1);
  const wire::StepTimes& t = stats->decode_step_times();
  EXPECT_EQ(t.steps(), 3);
  EXPECT_GT(t.kernels(), 0);
  EXPECT_GT(t.attention(), 0);
  EXPECT_GT(t.head(), 0);
  EXPECT_EQ(t.output(), 0);  // the last stage encodes no activations
  EXPECT_LE(t.queue() + t.session_ops() + t.validate() + t.input() + t.kernels() +
                t.attention() + t.head() + t.sampling(),
            t.served());
  EXPECT_GT(s0.GetStats()->decode_step_times().output(), 0);
}

// Speculative decoding's protocol on two stages: a segment carries the last token and drafts,
// the last stage accepts drafts while they equal its samples and returns them, and the next
// segment's pos0 (below the sessions' length) drops the rejected rows on both stages; the
// tokens and the logits after that are plain decoding's, bit for bit.
TEST_F(WorkerActorTest, DraftsAreVerifiedAndRejectedRowsDroppedByTheNextPos0) {
  WorkerOptions single;
  single.threads = 1;
  WorkerActor whole(single), s0(single), s1(single);
  ASSERT_TRUE(whole.LoadShard(Shard(0, 0, 4, true, true)).ok());
  ASSERT_TRUE(s0.LoadShard(Shard(0, 0, 2, true, false)).ok());
  ASSERT_TRUE(s1.LoadShard(Shard(1, 2, 4, false, true)).ok());
  auto staged = [&](wire::ForwardRequest f) -> absl::StatusOr<wire::ForwardResponse> {
    f.set_stage(0);
    auto mid = s0.Forward(f);
    if (!mid.ok()) return mid.status();
    if (!mid->errors().empty()) return *mid;
    f.set_stage(1);
    *f.mutable_activations() = mid->activations();
    return s1.Forward(f);
  };
  // Plain greedy decoding on the whole model: the reference tokens.
  const std::vector<int32_t> prompt = {5, 17, 99, 3, 42};
  std::vector<int32_t> plain;
  std::vector<int32_t> ids = prompt;
  for (int step = 0; step < 5; ++step) {
    wire::ForwardRequest f;
    *f.add_segments() = Seg(1, step == 0 ? 0 : 4 + step, ids, step == 0);
    auto r = whole.Forward(f);
    ASSERT_TRUE(r.ok()) << r.status();
    plain.push_back(r->results(0).token());
    ids = {plain.back()};
  }
  const int64_t n = static_cast<int64_t>(prompt.size());
  auto step = [&](int64_t pos0, std::vector<int32_t> tokens, int drafts) {
    wire::ForwardRequest f;
    *f.add_segments() = Seg(2, pos0, tokens, pos0 == 0);
    f.mutable_segments(0)->set_drafts(drafts);
    return staged(f);
  };
  auto first = step(0, prompt, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->results(0).token(), plain[0]);
  // Both drafts wrong: none accepted, the sample is plain's second token.
  const int32_t wrong = (plain[1] + 1) % 256;
  auto none = step(n, {plain[0], wrong, wrong}, 2);
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_TRUE(none->errors().empty()) << none->errors(0).message();
  EXPECT_EQ(none->results(0).accepted_size(), 0);
  EXPECT_EQ(none->results(0).token(), plain[1]);
  // The sessions hold 3 rows past n; pos0 n + 1 drops the two rejected ones. One right draft,
  // then a wrong one: one accepted, then plain's fourth token.
  auto one = step(n + 1, {plain[1], plain[2], (plain[3] + 1) % 256}, 2);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(one->errors().empty()) << one->errors(0).message();
  ASSERT_EQ(one->results(0).accepted_size(), 1);
  EXPECT_EQ(one->results(0).accepted(0).id(), plain[2]);
  EXPECT_EQ(one->results(0).token(), plain[3]);
  // After the rollback, the logits of the next position equal a run that never drafted.
  wire::ForwardRequest probe_spec;
  *probe_spec.add_segments() = Seg(2, n + 3, {plain[3]}, false);
  probe_spec.mutable_segments(0)->set_all_logits(true);
  auto a = whole.Forward([&] {  // plain's session at n + 3 as well: drop its last row
    wire::ForwardRequest f;
    *f.add_segments() = Seg(1, n + 3, {plain[3]}, false);
    f.mutable_segments(0)->set_all_logits(true);
    return f;
  }());
  auto b = staged(probe_spec);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->results(0).logits_size(), b->results(0).logits_size());
  for (int i = 0; i < a->results(0).logits_size(); ++i) {
    ASSERT_EQ(a->results(0).logits(i), b->results(0).logits(i)) << "logit " << i;
  }
  // Drafts must leave the last token; pos0 cannot pass the session's end: refused, named.
  wire::ForwardRequest bad;
  *bad.add_segments() = Seg(2, n + 4, {plain[4]}, false);
  bad.mutable_segments(0)->set_drafts(1);
  absl::Status refused = Outcome(staged(bad));
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("drafts"), std::string::npos) << refused;
  *bad.mutable_segments(0) = Seg(2, n + 9, {plain[4]}, false);
  refused = Outcome(staged(bad));
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("starts at"), std::string::npos) << refused;
}

TEST_F(WorkerActorTest, SegmentsSampleAcrossThePoolAsOnOneThread) {
  // The last stage samples a step's segments on all its threads: seeded samples, logprobs,
  // drafts and all-logits rows come out as on one thread, in segment order.
  WorkerActor one({.threads = 1}), two({.threads = 2});
  ASSERT_TRUE(one.LoadShard(Shard(0, 0, 4, true, true)).ok());
  ASSERT_TRUE(two.LoadShard(Shard(0, 0, 4, true, true)).ok());
  constexpr int kSessions = 6;
  std::vector<std::vector<int32_t>> last(kSessions);
  std::vector<int64_t> length(kSessions);
  auto step = [&](int round) {
    wire::ForwardRequest f;
    for (int i = 0; i < kSessions; ++i) {
      std::vector<int32_t> ids = round == 0 ? std::vector<int32_t>{5 + i, 17, 99 - i, 3}
                                            : last[i];
      wire::Segment seg = Seg(100 + i, round == 0 ? 0 : length[i], ids, round == 0);
      if (round == 0) {
        SamplingParams p;
        p.temperature = 0.9f;
        p.seed = 7 + i;
        p.top_logprobs = 3;
        p.repetition_penalty = 1.2f;
        *seg.mutable_sampling() = SamplingToWire(p);
      }
      if (round == 2 && i == 1) {  // a draft, right or wrong as it happens
        seg.add_token_ids(42);
        seg.set_drafts(1);
      }
      *f.add_segments() = seg;
    }
    if (round == 1) f.mutable_segments(3)->set_all_logits(true);
    return f;
  };
  for (int round = 0; round < 4; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const wire::ForwardRequest f = step(round);
    auto a = one.Forward(f);
    auto b = two.Forward(f);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->errors_size(), 0);
    ASSERT_EQ(b->errors_size(), 0);
    ASSERT_EQ(a->results_size(), kSessions);
    ASSERT_EQ(b->results_size(), kSessions);
    for (int i = 0; i < kSessions; ++i) {
      const wire::SegmentResult& x = a->results(i);
      const wire::SegmentResult& y = b->results(i);
      EXPECT_EQ(x.session_id(), 100 + i);
      EXPECT_EQ(y.session_id(), 100 + i);
      EXPECT_EQ(x.SerializeAsString(), y.SerializeAsString()) << "session " << i;
      const int64_t rows = f.segments(i).token_ids_size();
      length[i] = (round == 0 ? 0 : length[i]) + rows - f.segments(i).drafts() +
                  x.accepted_size();
      if (x.logits_size() > 0) {
        last[i] = {static_cast<int32_t>(std::max_element(x.logits().end() - 256,
                                                         x.logits().end()) -
                                        (x.logits().end() - 256))};
      } else {
        last[i] = {x.token()};
      }
    }
  }
}

TEST_F(WorkerActorTest, MalformedMessagesAreInvalidArgument) {
  WorkerActor s0({.threads = 1}), s1({.threads = 1});
  ASSERT_TRUE(s0.LoadShard(Shard(0, 0, 2, true, false)).ok());
  ASSERT_TRUE(s1.LoadShard(Shard(1, 2, 4, false, true)).ok());

  wire::ForwardRequest wrong_stage;
  wrong_stage.set_stage(3);
  *wrong_stage.add_segments() = Seg(1, 0, {1});
  auto r = s0.Forward(wrong_stage);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("stage 3"), std::string::npos) << r.status();

  wire::ForwardRequest bad_size;
  bad_size.set_stage(1);
  *bad_size.add_segments() = Seg(1, 0, {1, 2});
  std::vector<float> x(3 * 64, 0.5f);  // 3 rows for 2 tokens
  EncodeActivations(x.data(), 3, 64, wire::ACTIVATION_F32, bad_size.mutable_activations());
  r = s1.Forward(bad_size);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  bad_size.mutable_activations()->set_rows(2);
  bad_size.mutable_activations()->mutable_data()->resize(2 * 64 * 4 - 1);
  r = s1.Forward(bad_size);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("bytes"), std::string::npos) << r.status();

  wire::ForwardRequest unknown;
  *unknown.add_segments() = Seg(42, 5, {1});
  r = s0.Forward(unknown);
  EXPECT_TRUE(absl::IsInvalidArgument(Outcome(r))) << Outcome(r);
  EXPECT_NE(Outcome(r).message().find("unknown session 42"), std::string::npos) << Outcome(r);

  wire::ForwardRequest bad_token;
  *bad_token.add_segments() = Seg(1, 0, {1, 1 << 20});
  r = s0.Forward(bad_token);
  EXPECT_TRUE(absl::IsInvalidArgument(Outcome(r))) << Outcome(r);

  wire::ForwardRequest activations_on_stage0;
  *activations_on_stage0.add_segments() = Seg(1, 0, {1});
  EncodeActivations(x.data(), 1, 64, wire::ACTIVATION_F32,
                    activations_on_stage0.mutable_activations());
  EXPECT_TRUE(absl::IsInvalidArgument(s0.Forward(activations_on_stage0).status()));

  // Operations on sessions the stage does not hold fail alone, named; the step succeeds.
  r = s0.Forward(OpsStep(0, {TruncateOp(99, 1), CopyOp(99, 100, 1), wire::SessionOp()}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->op_errors_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r->op_errors(i).index(), i);
    EXPECT_EQ(r->op_errors(i).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_NE(r->op_errors(0).message().find("unknown session 99"), std::string::npos);
  EXPECT_NE(r->op_errors(2).message().find("kind"), std::string::npos);

  // Nothing above created a session.
  EXPECT_EQ(s0.GetStats()->sessions(), 0);
  EXPECT_EQ(s1.GetStats()->sessions(), 0);
}

TEST_F(WorkerActorTest, BadSegmentsFailAloneInABatch) {
  WorkerActor w({.threads = 1});
  ASSERT_TRUE(w.LoadShard(Shard(0, 0, 4, true, true)).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {3, 4});
  *f.add_segments() = Seg(2, 9, {5});       // unknown session
  *f.add_segments() = Seg(3, 0, {6, 7, 8});
  auto r = w.Forward(f);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->errors_size(), 1);
  EXPECT_EQ(r->errors(0).index(), 1);
  EXPECT_EQ(r->errors(0).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  ASSERT_EQ(r->results_size(), 2);
  EXPECT_EQ(r->results(0).session_id(), 1u);
  EXPECT_EQ(r->results(1).session_id(), 3u);
  EXPECT_EQ(w.GetStats()->sessions(), 2);
}

TEST_F(WorkerActorTest, OutOfRangeSamplingFailsItsSegmentAlone) {
  // The coordinator validates first; the stage checks again with the same ranges rather than
  // sample garbage from, say, a negative repetition penalty.
  WorkerActor w({.threads = 1});
  ASSERT_TRUE(w.LoadShard(Shard(0, 0, 4, true, true)).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {3, 4});
  wire::Segment bad = Seg(2, 0, {5});
  bad.mutable_sampling()->set_repetition_penalty(-3);
  *f.add_segments() = bad;
  wire::Segment bias = Seg(3, 0, {6});
  wire::TokenBias* b = bias.mutable_sampling()->add_logit_bias();
  b->set_id(1 << 30);  // outside the vocabulary
  b->set_bias(1);
  *f.add_segments() = bias;
  auto r = w.Forward(f);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->errors_size(), 2);
  EXPECT_EQ(r->errors(0).index(), 1);
  EXPECT_NE(r->errors(0).message().find("repetition_penalty"), std::string::npos)
      << r->errors(0).message();
  EXPECT_EQ(r->errors(1).index(), 2);
  EXPECT_NE(r->errors(1).message().find("logit_bias"), std::string::npos)
      << r->errors(1).message();
  ASSERT_EQ(r->results_size(), 1);
  EXPECT_EQ(r->results(0).session_id(), 1u);
}

TEST_F(WorkerActorTest, LogitBiasSteersTheLastStagesSample) {
  WorkerActor w({.threads = 1});
  ASSERT_TRUE(w.LoadShard(Shard(0, 0, 4, true, true)).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {3, 4});
  auto plain = w.Forward(f);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const int32_t greedy = plain->results(0).token();
  // The greedy choice banned, another forced: the same prompt on a new session.
  wire::Segment seg = Seg(2, 0, {3, 4});
  wire::TokenBias* ban = seg.mutable_sampling()->add_logit_bias();
  ban->set_id(greedy);
  ban->set_bias(-100);
  const int32_t forced = greedy == 7 ? 8 : 7;
  wire::TokenBias* force = seg.mutable_sampling()->add_logit_bias();
  force->set_id(forced);
  force->set_bias(100);
  wire::ForwardRequest g;
  *g.add_segments() = seg;
  auto biased = w.Forward(g);
  ASSERT_TRUE(biased.ok()) << biased.status();
  EXPECT_EQ(biased->results(0).token(), forced);
}

TEST_F(WorkerActorTest, SessionOperationsRideInTheStepBeforeItsRows) {
  WorkerActor w({.threads = 1});
  ASSERT_TRUE(w.LoadShard(Shard(0, 0, 4, true, true)).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {3, 4, 5, 6, 7});
  auto cold = w.Forward(f);
  ASSERT_TRUE(cold.ok());

  // Copy 4 positions to session 2 and recompute the 5th there, in one step: same token as the
  // cold run.
  wire::ForwardRequest g = OpsStep(0, {CopyOp(1, 2, 4)});
  *g.add_segments() = Seg(2, 4, {7});
  auto warm = w.Forward(g);
  ASSERT_TRUE(warm.ok()) << warm.status();
  EXPECT_EQ(warm->op_errors_size(), 0);
  ASSERT_EQ(warm->results_size(), 1);
  EXPECT_EQ(warm->results(0).token(), cold->results(0).token());
  EXPECT_FLOAT_EQ(warm->results(0).logprob(), cold->results(0).logprob());

  // A truncation longer than the session fails, and so does that session's segment in the
  // step; another session's segment runs.
  wire::ForwardRequest h = OpsStep(0, {TruncateOp(1, 2), TruncateOp(2, 9)});
  *h.add_segments() = Seg(1, 2, {5});
  *h.add_segments() = Seg(2, 5, {8});
  auto r = w.Forward(h);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->op_errors_size(), 1);
  EXPECT_EQ(r->op_errors(0).index(), 1);
  EXPECT_EQ(r->op_errors(0).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  ASSERT_EQ(r->errors_size(), 1);
  EXPECT_EQ(r->errors(0).index(), 1);
  EXPECT_EQ(r->errors(0).message(), r->op_errors(0).message());
  ASSERT_EQ(r->results_size(), 1);
  EXPECT_EQ(r->results(0).session_id(), 1u);
  auto stats = w.GetStats();
  ASSERT_EQ(stats->session_lengths_size(), 2);
  EXPECT_EQ(stats->session_lengths(0), 3);  // truncated to 2, then one row
  EXPECT_EQ(stats->session_lengths(1), 5);  // as the copy and its row left it

  // Releases (a step of operations only), idempotent.
  ASSERT_TRUE(w.Forward(OpsStep(0, {ReleaseOp(1), ReleaseOp(1)})).ok());
  stats = w.GetStats();
  EXPECT_EQ(stats->sessions(), 1);
  EXPECT_EQ(stats->session_ids(0), 2);
}

TEST_F(WorkerActorTest, AChainedStepHandsItsOperationsOnEvenWithoutRows) {
  WorkerActor s1({.threads = 1});
  ASSERT_TRUE(s1.LoadShard(Shard(1, 2, 4, false, true)).ok());
  auto s1_client = std::shared_ptr<WorkerClient>(&s1, [](WorkerClient*) {});
  WorkerActor s0({.threads = 1}, [&](const wire::Peer&) { return s1_client; });
  wire::LoadShardRequest first = Shard(0, 0, 2, true, false);
  first.mutable_next_stage()->set_worker_id("s1");
  ASSERT_TRUE(s0.LoadShard(first).ok());

  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {3, 4, 5});
  ASSERT_TRUE(s0.Forward(f).ok());
  // A step of operations only still reaches the last stage. The truncation of the session
  // just released fails on each stage; the reply names the later one.
  auto r = s0.Forward(OpsStep(0, {CopyOp(1, 2, 3), ReleaseOp(1), TruncateOp(1, 0)}));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->op_errors_size(), 2);  // the truncation of the released session, on each stage
  EXPECT_EQ(r->op_errors(0).index(), 2);
  EXPECT_EQ(r->op_errors(0).worker_id(), "");
  EXPECT_EQ(r->op_errors(1).index(), 2);
  EXPECT_EQ(r->op_errors(1).worker_id(), "s1");
  for (WorkerActor* stage : {&s0, &s1}) {
    auto stats = stage->GetStats();
    ASSERT_EQ(stats->sessions(), 1);
    EXPECT_EQ(stats->session_ids(0), 2);
    EXPECT_EQ(stats->session_lengths(0), 3);
  }
}

TEST_F(WorkerActorTest, MemoryBudgetRefusesNewSessions) {
  WorkerActor probe({.threads = 1});
  auto loaded = probe.LoadShard(Shard(0, 0, 4, true, true));
  ASSERT_TRUE(loaded.ok());
  // Room for the weights and exactly one session.
  WorkerActor w({.threads = 1,
                 .memory_budget = loaded->weight_bytes() + loaded->kv_bytes_per_session()});
  ASSERT_TRUE(w.LoadShard(Shard(0, 0, 4, true, true)).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, {3});
  ASSERT_TRUE(w.Forward(f).ok());
  wire::ForwardRequest g;
  *g.add_segments() = Seg(2, 0, {3});
  auto r = w.Forward(g);
  EXPECT_TRUE(absl::IsResourceExhausted(Outcome(r))) << Outcome(r);
  // A budget below the weights refuses the shard itself.
  WorkerActor tiny({.threads = 1, .memory_budget = 1000});
  EXPECT_TRUE(absl::IsResourceExhausted(tiny.LoadShard(Shard(0, 0, 4, true, true)).status()));
}

TEST_F(WorkerActorTest, ShardThreadsAreCappedByTheWorkers) {
  WorkerActor w({.threads = 2});
  wire::LoadShardRequest shard = Shard(0, 0, 4, true, true);
  shard.set_threads(1);
  ASSERT_TRUE(w.LoadShard(shard).ok());
  EXPECT_EQ(w.GetStats()->threads(), 1);
  shard.set_threads(8);
  ASSERT_TRUE(w.LoadShard(shard).ok());
  EXPECT_EQ(w.GetStats()->threads(), 2);
  shard.set_threads(0);
  ASSERT_TRUE(w.LoadShard(shard).ok());
  EXPECT_EQ(w.GetStats()->threads(), 2);
}

TEST_F(WorkerActorTest, ContextOverflowIsOutOfRange) {
  WorkerActor w({.threads = 1});
  ASSERT_TRUE(w.LoadShard(Shard(0, 0, 4, true, true)).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(1, 0, std::vector<int32_t>(33, 3));
  EXPECT_TRUE(absl::IsOutOfRange(Outcome(w.Forward(f))));
}

TEST_F(WorkerActorTest, AnAdapterAppliesToEachStagesLayers) {
  // Adapters on every layer, saved; the reference is the engine with them loaded.
  const std::string adapter = *path_ + ".adapter.gguf";
  ThreadPool pool(1);
  auto model = Model::Load(*path_, LoadOptions{}, pool);
  ASSERT_TRUE(model.ok());
  ASSERT_TRUE((*model)->AddLora({{LoraTarget::kQ, LoraTarget::kV, LoraTarget::kDown}}, 4, 8.0f, 3)
                  .ok());
  int i = 0;
  (*model)->mutable_lora().ForEach([&](int64_t, LoraTarget, LoraAdapter& ad) {
    for (float& v : ad.b) v = 0.5f * static_cast<float>(std::sin(0.37 * ++i));
  });
  ASSERT_TRUE((*model)->SaveLora(adapter).ok());
  const std::vector<int32_t> ids = {5, 17, 99, 3};
  auto kv = (*model)->NewKvCache(8, GgmlType::kF32);
  ASSERT_TRUE(kv.ok());
  auto logits = (*model)->ForwardStep(**kv, ids, 0);
  ASSERT_TRUE(logits.ok());
  const int32_t want = static_cast<int32_t>(
      std::max_element(logits->begin(), logits->end()) - logits->begin());
  double sum = 0;
  for (float l : *logits) sum += std::exp(static_cast<double>(l) - (*logits)[want]);
  const double want_logprob = -std::log(sum);

  WorkerActor plain({.threads = 1}), whole({.threads = 1}), s0({.threads = 1}),
      s1({.threads = 1});
  auto with_adapter = [&](wire::LoadShardRequest r) {
    r.set_adapter_path(adapter);
    return r;
  };
  ASSERT_TRUE(plain.LoadShard(Shard(0, 0, 4, true, true)).ok());
  ASSERT_TRUE(whole.LoadShard(with_adapter(Shard(0, 0, 4, true, true))).ok());
  ASSERT_TRUE(s0.LoadShard(with_adapter(Shard(0, 0, 2, true, false))).ok());
  ASSERT_TRUE(s1.LoadShard(with_adapter(Shard(1, 2, 4, false, true))).ok());
  wire::ForwardRequest f;
  *f.add_segments() = Seg(7, 0, ids);
  auto p = plain.Forward(f);
  auto a = whole.Forward(f);
  auto mid = s0.Forward(f);
  ASSERT_TRUE(p.ok() && a.ok() && mid.ok());
  f.set_stage(1);
  *f.mutable_activations() = mid->activations();
  auto b = s1.Forward(f);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->results(0).token(), want);
  EXPECT_NEAR(a->results(0).logprob(), want_logprob, 1e-5);
  EXPECT_EQ(b->results(0).token(), want);
  EXPECT_FLOAT_EQ(b->results(0).logprob(), a->results(0).logprob());
  EXPECT_GT(std::abs(p->results(0).logprob() - a->results(0).logprob()), 1e-3);  // it mattered

  // A worker without the file refuses the shard naming the path.
  wire::LoadShardRequest missing = Shard(0, 0, 4, true, true);
  missing.set_adapter_path(*path_ + ".missing.gguf");
  const absl::Status s = whole.LoadShard(missing).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_NE(s.message().find(*path_ + ".missing.gguf"), std::string::npos) << s;
  std::remove(adapter.c_str());
}

}  // namespace
}  // namespace fucina
