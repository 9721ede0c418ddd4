// Evolution strategies in one process (models/train/es.h) on a small random-weight fixture: the
// update rule's bookkeeping (antithetic members, restore, rank shaping, determinism across
// thread counts and processes' model copies) and that training raises the nll reward.
#include "models/train/es.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/engine/fixture.h"
#include "models/engine/lora.h"
#include "models/engine/model.h"
#include "models/train/tasks.h"
#include "tests/models/engine/fixture_files.h"

namespace fucina::train {
namespace {

std::string TempPath(const std::string& name) {
  return testing::TempDir() + "/es_test_" + std::to_string(getpid()) + "_" + name;
}

// The head (tied embeddings) and every FFN down projection train.
bool Trainable(std::string_view name) {
  return name == "token_embd.weight" || name.ends_with("ffn_down.weight");
}

// Byte-vocabulary prompts whose answer is always token 65 ('A'): a skill the random model does
// not have, learnable through the head.
std::vector<Task> Tasks() {
  std::vector<Task> tasks;
  for (int i = 0; i < 6; ++i) {
    Task t;
    for (int j = 0; j < 5; ++j) t.prompt.push_back((i * 31 + j * 17 + 3) % 200 + 20);
    t.answer = {65};
    tasks.push_back(t);
  }
  return tasks;
}

class EsTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    ThreadPool pool(2);
    ASSERT_TRUE(MakeFixture(SmallQwen3Fixture(5), Path(), pool).ok());
  }
  static void TearDownTestSuite() { std::remove(Path().c_str()); }
  static std::string Path() { return TempPath("model.gguf"); }

  static std::unique_ptr<Model> Load(ThreadPool& pool) {
    LoadOptions load;
    load.f32_tensors = Trainable;
    auto model = Model::Load(Path(), load, pool);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? *std::move(model) : nullptr;
  }

  static EsOptions Options() {
    EsOptions o;
    o.population = 16;
    o.sigma = 0.05f;
    o.lr = 0.1f;
    o.seed = 42;
    return o;
  }
};

TEST(EsOptionsTest, ValidateNamesTheField) {
  EsOptions o;
  o.population = 5;
  EXPECT_NE(o.Validate().message().find("population"), std::string::npos);
  o.population = 4;
  o.sigma = 0;
  EXPECT_NE(o.Validate().message().find("sigma"), std::string::npos);
  o.sigma = 1e-3f;
  o.lr = -1;
  EXPECT_NE(o.Validate().message().find("lr"), std::string::npos);
}

TEST(EsShapeTest, CenteredRanksWithStableTies) {
  const std::vector<float> fitness = {0.3f, -1.0f, 0.3f, 2.0f, 0.0f};
  const std::vector<float> shaped = EsTrainer::ShapeFitness(fitness);
  // Ranks: -1.0 -> 0, 0.0 -> 1, 0.3 (member 0) -> 2, 0.3 (member 2) -> 3, 2.0 -> 4; centered
  // (-1/2 .. 1/2 in steps of 1/4) and divided by their standard deviation sqrt(1/8).
  const std::vector<double> want = {0.0, -std::sqrt(2.0), std::sqrt(0.5), std::sqrt(2.0),
                                    -std::sqrt(0.5)};
  double sum = 0, sq = 0;
  for (size_t i = 0; i < shaped.size(); ++i) {
    EXPECT_NEAR(shaped[i], want[i], 1e-6) << i;
    sum += shaped[i];
    sq += shaped[i] * shaped[i];
  }
  EXPECT_NEAR(sum, 0.0, 1e-6);
  EXPECT_NEAR(sq / shaped.size(), 1.0, 1e-6);
}

TEST_F(EsTest, NoTrainableTensorsIsAClearError) {
  ThreadPool pool(1);
  auto model = Model::Load(Path(), LoadOptions{}, pool);
  ASSERT_TRUE(model.ok());
  auto trainer = EsTrainer::Create(**model, Options(), pool);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find("f32_tensors"), std::string::npos);
}

TEST_F(EsTest, MembersAreAntitheticAndTheModelIsRestored) {
  ThreadPool pool(2);
  auto model = Load(pool);
  auto trainer = EsTrainer::Create(*model, Options(), pool);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  EXPECT_EQ((*trainer)->tensor_names().size(), 3u);  // token_embd + 2 ffn_down
  const uint64_t before = (*trainer)->Checksum();
  const std::vector<float> theta((*trainer)->values(0).begin(), (*trainer)->values(0).end());
  // What the forward reads for token_embd while each member runs.
  std::vector<std::vector<float>> seen;
  const FitnessFn capture = [&](Model& m) -> absl::StatusOr<float> {
    m.VisitParameters([&](const Parameter& p) {
      if (p.name != "token_embd.weight") return;
      const float* v = static_cast<const float*>(p.locations.front().view.data);
      seen.emplace_back(v, v + theta.size());
    });
    return 0.0f;
  };
  for (int member : {0, 1, 2}) ASSERT_TRUE((*trainer)->Evaluate(7, member, capture).ok());
  ASSERT_EQ(seen.size(), 3u);
  double moved = 0;
  for (size_t i = 0; i < theta.size(); ++i) {
    // Member 1 is member 0 mirrored through theta (up to the rounding of theta +- sigma eps);
    // member 2 draws other noise.
    EXPECT_NEAR(seen[0][i] - theta[i], -(seen[1][i] - theta[i]), 1e-7) << i;
    moved += std::abs(seen[0][i] - theta[i]);
  }
  EXPECT_GT(moved / theta.size(), 0.5 * Options().sigma);  // |N(0,1)| averages 0.8
  EXPECT_NE(seen[0], seen[2]);
  // Between members and after them the model holds theta again.
  EXPECT_EQ((*trainer)->Checksum(), before);
  auto again = Load(pool);
  auto fresh = EsTrainer::Create(*again, Options(), pool);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->Checksum(), before);
}

TEST_F(EsTest, SameJobSameParametersWhateverTheThreads) {
  // Two model copies, one and two threads: the noise and the forward are bit-identical, so
  // the parameters after a few generations are too.
  std::vector<uint64_t> sums;
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    auto model = Load(pool);
    auto trainer = EsTrainer::Create(*model, Options(), pool);
    ASSERT_TRUE(trainer.ok());
    const std::vector<Task> tasks = Tasks();
    for (int g = 0; g < 3; ++g) {
      auto r = (*trainer)->Step(g, [&](Model& m) { return MeanAnswerLogProb(m, tasks); });
      ASSERT_TRUE(r.ok()) << r.status();
    }
    sums.push_back((*trainer)->Checksum());
  }
  EXPECT_EQ(sums[0], sums[1]);
}

TEST_F(EsTest, TrainingRaisesTheAnswerLogProb) {
  ThreadPool pool(2);
  auto model = Load(pool);
  auto trainer = EsTrainer::Create(*model, Options(), pool);
  ASSERT_TRUE(trainer.ok());
  const std::vector<Task> tasks = Tasks();
  const FitnessFn reward = [&](Model& m) { return MeanAnswerLogProb(m, tasks); };
  auto start = reward(*model);
  ASSERT_TRUE(start.ok());
  for (int g = 0; g < 12; ++g) ASSERT_TRUE((*trainer)->Step(g, reward).ok());
  auto end = reward(*model);
  ASSERT_TRUE(end.ok());
  std::printf("mean answer log-prob: %.4f -> %.4f\n", *start, *end);
  // Fixed seeds: the rise is the same every run; 1 nat is far beyond noise.
  EXPECT_GT(*end - *start, 1.0f);
}

TEST_F(EsTest, LoraModeTrainsOnlyTheAdapters) {
  // No f32 copies of base tensors: the adapters (B = 0 at the start) are all that trains.
  ThreadPool pool(2);
  auto model = Model::Load(Path(), LoadOptions{}, pool);
  ASSERT_TRUE(model.ok());
  const std::vector<LoraTarget> targets = {LoraTarget::kQ, LoraTarget::kV, LoraTarget::kDown};
  ASSERT_TRUE((*model)->AddLora(targets, 4, 8.0f, 1).ok());
  EsOptions o = Options();
  o.lr = 0.2f;
  auto trainer = EsTrainer::Create(**model, o, pool);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  for (const std::string& name : (*trainer)->tensor_names()) {
    EXPECT_TRUE(name.ends_with(".lora_a") || name.ends_with(".lora_b")) << name;
  }
  EXPECT_EQ((*trainer)->tensor_names().size(), 2u * 3 * 2);  // 2 layers x 3 targets x (A, B)
  const std::vector<Task> tasks = Tasks();
  const FitnessFn reward = [&](Model& m) { return MeanAnswerLogProb(m, tasks); };
  auto start = reward(**model);
  ASSERT_TRUE(start.ok());
  for (int g = 0; g < 12; ++g) ASSERT_TRUE((*trainer)->Step(g, reward).ok());
  auto end = reward(**model);
  ASSERT_TRUE(end.ok());
  std::printf("lora: mean answer log-prob %.4f -> %.4f\n", *start, *end);
  EXPECT_GT(*end - *start, 0.5f);
}

}  // namespace
}  // namespace fucina::train
