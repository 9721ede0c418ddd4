// Train replicas (worker/es_replica.h) that hold a shard: two stages' replicas, given the
// same updates as a whole-model replica, hold the same values, their checksums adding up to
// the whole model's (the noise is keyed by tensor name, the checksum a sum over tensors); a
// shard replica refuses to score members alone. Two stage actors chained score every member
// as the whole replica does, bit for bit, and a stage refuses hostile passes naming the field.
#include "worker/es_replica.h"

#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/train/es.h"
#include "worker/worker_actor.h"
#include "tests/models/engine/fixture_files.h"

namespace fucina {
namespace {

WorkerOptions Threads(int n) {
  WorkerOptions o;
  o.threads = n;
  return o;
}

class EsReplicaTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    ThreadPool pool(2);
    ASSERT_TRUE(MakeFixture(SmallQwen3Fixture(7), Path(), pool).ok());
  }
  static void TearDownTestSuite() { std::remove(Path().c_str()); }
  static std::string Path() { return FixtureTempPath("es_replica_test", "model"); }

  // Every layer's FFN down projection and attention output: tensors of one layer each, so the
  // stages' sets are disjoint.
  static wire::EsJob Job() {
    wire::EsJob job;
    job.set_job_id("shards");
    job.set_model_path(Path());
    job.set_mode("full");
    job.set_tensors("blk\\.[0-9]+\\.(ffn_down|attn_output)\\.weight");
    job.set_population(6);
    job.set_sigma(0.05f);
    job.set_lr(0.1f);
    job.set_seed(9);
    job.mutable_reward()->set_kind("nll");
    wire::EsTask* t = job.add_tasks();
    t->add_prompt(40);
    t->add_answer(65);
    return job;
  }
  static wire::EsJob Stage(int64_t first, int64_t last, bool embeddings, bool head) {
    wire::EsJob job = Job();
    job.mutable_shard()->set_first_layer(first);
    job.mutable_shard()->set_last_layer(last);
    job.mutable_shard()->set_embeddings(embeddings);
    job.mutable_shard()->set_head(head);
    if (!head) job.mutable_next_stage()->set_worker_id("next");
    return job;
  }
};

TEST_F(EsReplicaTest, StageReplicasAddUpToTheWholeModel) {
  auto whole = EsReplica::Create(Job(), Path(), 2);
  auto first = EsReplica::Create(Stage(0, 1, true, false), Path(), 1);
  auto second = EsReplica::Create(Stage(1, 2, false, true), Path(), 2);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*first)->State().num_tensors() + (*second)->State().num_tensors(),
            (*whole)->State().num_tensors());
  auto sum = [&] { return (*first)->State().checksum() + (*second)->State().checksum(); };
  EXPECT_EQ(sum(), (*whole)->State().checksum());
  const uint64_t base = (*whole)->State().checksum();
  for (int64_t g = 0; g < 3; ++g) {
    // Any fitness will do: the same shaped values go to every replica.
    const std::vector<float> fitness = {0.3f, -1.0f, 2.5f, 0.1f * g, -0.7f, 1.2f};
    wire::EsUpdateRequest update;
    update.set_job_id("shards");
    update.set_generation(g);
    for (float v : train::EsTrainer::ShapeFitness(fitness)) update.add_shaped(v);
    for (EsReplica* r : {whole->get(), first->get(), second->get()}) {
      ASSERT_TRUE(r->Update(update).ok());
    }
    EXPECT_EQ(sum(), (*whole)->State().checksum()) << "generation " << g + 1;
  }
  EXPECT_NE((*whole)->State().checksum(), base);

  // A wrong range names the field.
  auto bad = EsReplica::Create(Stage(1, 1, false, true), Path(), 1);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("shard"), std::string::npos) << bad.status();
}

TEST_F(EsReplicaTest, TheWorkerRefusesHostileTrainCallsNamingWhatIsWrong) {
  WorkerActor worker(Threads(1));
  ASSERT_TRUE(worker.EsLoad(Job()).ok());
  auto expect = [](absl::Status s, absl::StatusCode code, const std::string& text) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(text), std::string::npos) << s;
  };
  wire::EsEvaluateRequest eval;
  eval.set_job_id("shards");
  eval.add_members(99);
  expect(worker.EsEvaluate(eval).status(), absl::StatusCode::kInvalidArgument, "member 99");
  eval.set_members(0, -2);
  expect(worker.EsEvaluate(eval).status(), absl::StatusCode::kInvalidArgument, "member -2");
  eval.set_members(0, 0);
  eval.set_generation(5);
  expect(worker.EsEvaluate(eval).status(), absl::StatusCode::kFailedPrecondition,
         "generation 5");
  eval.set_job_id("nobody");
  expect(worker.EsEvaluate(eval).status(), absl::StatusCode::kNotFound, "nobody");
  wire::EsUpdateRequest update;
  update.set_job_id("shards");
  update.add_shaped(1.0f);  // one value for a population of 6
  expect(worker.EsUpdate(update).status(), absl::StatusCode::kInvalidArgument, "population");
  update.set_generation(-1);
  expect(worker.EsUpdate(update).status(), absl::StatusCode::kFailedPrecondition,
         "generation -1");
  wire::EsJob bad = Job();
  bad.set_population(1 << 20);
  expect(worker.EsLoad(bad).status(), absl::StatusCode::kInvalidArgument, "population");
  bad = Job();
  bad.set_job_id("");
  expect(worker.EsLoad(bad).status(), absl::StatusCode::kInvalidArgument, "job_id");
  // Nothing refused changed the replica: it still evaluates and sits at generation 0.
  wire::EsEvaluateRequest good;
  good.set_job_id("shards");
  good.add_members(1);
  EXPECT_TRUE(worker.EsEvaluate(good).ok());
}

TEST_F(EsReplicaTest, StagesScoreMembersAsTheWholeReplicaAndRefuseHostilePasses) {
  auto last = std::make_shared<WorkerActor>(Threads(1));
  WorkerActor first(Threads(1),
                    [&](const wire::Peer& peer) -> std::shared_ptr<WorkerClient> {
                      return peer.worker_id() == "next" ? last : nullptr;
                    });
  WorkerActor whole(Threads(2));
  ASSERT_TRUE(whole.EsLoad(Job()).ok());
  ASSERT_TRUE(first.EsLoad(Stage(0, 1, true, false)).ok());
  ASSERT_TRUE(last->EsLoad(Stage(1, 2, false, true)).ok());
  wire::EsEvaluateRequest eval;
  eval.set_job_id("shards");
  for (int m = -1; m < 6; ++m) eval.add_members(m);
  auto want = whole.EsEvaluate(eval);
  auto got = first.EsEvaluate(eval);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < eval.members_size(); ++i) {
    EXPECT_EQ(got->fitness(i), want->fitness(i)) << "member " << eval.members(i);
  }
  EXPECT_NE(got->fitness(1), got->fitness(2));  // members differ: each was perturbed
  // Members are scored from the first stage only.
  auto later = last->EsEvaluate(eval);
  EXPECT_TRUE(absl::IsFailedPrecondition(later.status())) << later.status();

  // A valid pass to the last stage: one stream, one row, then each field made hostile.
  const int64_t hidden = 32;
  wire::EsForwardRequest pass;
  pass.set_job_id("shards");
  pass.set_member(0);
  pass.add_new_streams(4);
  wire::EsPassSegment* seg = pass.add_segments();
  seg->set_stream(0);
  seg->add_tokens(40);
  pass.mutable_activations()->set_rows(1);
  pass.mutable_activations()->set_hidden(hidden);
  pass.mutable_activations()->set_data(std::string(hidden * sizeof(float), '\0'));
  pass.add_rows(0);
  pass.add_targets(65);
  ASSERT_TRUE(last->EsForward(pass).ok()) << last->EsForward(pass).status();
  auto expect = [&](const std::function<void(wire::EsForwardRequest&)>& edit,
                    absl::StatusCode code, const std::string& text) {
    wire::EsForwardRequest bad = pass;
    edit(bad);
    absl::Status s = last->EsForward(bad).status();
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(text), std::string::npos) << s;
  };
  using C = absl::StatusCode;
  expect([](auto& r) { r.set_job_id("nobody"); }, C::kNotFound, "nobody");
  expect([](auto& r) { r.set_generation(3); }, C::kFailedPrecondition, "generation 3");
  expect([](auto& r) { r.set_member(99); }, C::kInvalidArgument, "member 99");
  expect([](auto& r) { r.mutable_segments(0)->set_stream(7); }, C::kInvalidArgument, "stream 7");
  expect([](auto& r) { r.set_new_streams(0, int64_t{1} << 40); }, C::kInvalidArgument,
         "positions");
  expect([](auto& r) { for (int i = 0; i < 5000; ++i) r.add_new_streams(1); },
         C::kInvalidArgument, "streams");
  expect([](auto& r) { r.mutable_activations()->set_data("abc"); }, C::kInvalidArgument,
         "activations");
  expect([](auto& r) { r.mutable_activations()->set_type(wire::ACTIVATION_F16); },
         C::kInvalidArgument, "f32");
  expect([](auto& r) { r.mutable_segments(0)->add_tokens(41); }, C::kInvalidArgument,
         "activations");
  expect([](auto& r) { r.set_targets(0, 1 << 20); }, C::kInvalidArgument, "target");
  expect([](auto& r) { r.set_rows(0, 5); }, C::kInvalidArgument, "row 5");
  expect([](auto& r) { r.add_rows(0); }, C::kInvalidArgument, "targets");
  expect([&](auto& r) {  // 5 rows into a stream of 4 positions
    for (int i = 0; i < 4; ++i) r.mutable_segments(0)->add_tokens(40);
    r.mutable_activations()->set_rows(5);
    r.mutable_activations()->set_data(std::string(5 * hidden * sizeof(float), '\0'));
  }, C::kOutOfRange, "capacity");
  // The stages still score as the whole replica does.
  got = first.EsEvaluate(eval);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int i = 0; i < eval.members_size(); ++i) EXPECT_EQ(got->fitness(i), want->fitness(i));
}

}  // namespace
}  // namespace fucina
