// LoRA adapters in the shared blocks (models/engine/lora.h): zero-B adapters leave every family's
// output bit for bit, and an adapter equals merging scale * B A into the weight it sits on.
#include "models/engine/lora.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/engine/fixture.h"
#include "models/engine/model.h"
#include "models/gguf/writer.h"
#include "tests/models/engine/fixture_files.h"

namespace fucina {
namespace {

std::vector<FixtureVariant> Variants() {
  FixtureOptions qwen3 = SmallQwen3Fixture(4);
  FixtureOptions gemma4 = qwen3;
  gemma4.arch = "gemma4";
  gemma4.num_layers = 6;
  gemma4.head_dim_global = 32;
  gemma4.sliding_window = 4;
  gemma4.shared_kv_layers = 3;  // layers without K/V of their own get no k/v adapters
  return {{"qwen3", qwen3}, {"gemma4", gemma4}};
}

const std::vector<LoraTarget> kAll = {LoraTarget::kQ,    LoraTarget::kK,  LoraTarget::kV,
                                      LoraTarget::kO,    LoraTarget::kGate, LoraTarget::kUp,
                                      LoraTarget::kDown};
const std::vector<int32_t> kPrompt = {5, 80, 17, 200, 33, 9, 120};

class LoraTest : public testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    pool_ = new ThreadPool(2);
    MakeFixtureFiles("lora", Variants(), *pool_, &paths_);
  }
  static void TearDownTestSuite() {
    RemoveFixtureFiles(&paths_);
    delete pool_;
  }
  static std::vector<float> Logits(Model& m) { return PromptLogits(m, kPrompt); }
  const std::string& path() const { return paths_[GetParam()]; }
  static inline ThreadPool* pool_ = nullptr;
  static inline std::vector<std::string> paths_;
};

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraTest, testing::Values(0, 1),
                         [](const testing::TestParamInfo<int>& i) {
                           return std::string(Variants()[i.param].name);
                         });

TEST_P(LoraTest, ZeroBAdaptersChangeNothing) {
  auto model = Model::Load(path(), LoadOptions{}, *pool_);
  ASSERT_TRUE(model.ok());
  const std::vector<float> base = Logits(**model);
  ASSERT_TRUE((*model)->AddLora(kAll, 4, 8.0f, 1).ok());
  EXPECT_FALSE((*model)->lora().empty());
  EXPECT_EQ(Logits(**model), base);
  // Shared-K/V layers got no k/v adapters; every layer got q.
  const ModelConfig& c = (*model)->config();
  for (int64_t l = 0; l < c.num_layers; ++l) {
    EXPECT_NE((*model)->lora().Find(l, LoraTarget::kQ), nullptr) << l;
    EXPECT_EQ((*model)->lora().Find(l, LoraTarget::kK) != nullptr, c.layers[l].kv_source < 0);
  }
  EXPECT_FALSE((*model)->AddLora(kAll, 4, 8.0f, 1).ok());  // once
}

TEST_P(LoraTest, AnAdapterEqualsItsMergedWeight) {
  // Adapters with random B on every target, against a model whose (f32) weights carry
  // W + scale * B A, merged here in double.
  auto adapted = Model::Load(path(), LoadOptions{}, *pool_);
  ASSERT_TRUE(adapted.ok());
  ASSERT_TRUE((*adapted)->AddLora(kAll, 3, 6.0f, 7).ok());
  uint64_t state = 99;
  (*adapted)->mutable_lora().ForEach([&](int64_t, LoraTarget, LoraAdapter& ad) {
    for (float& v : ad.b) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<double>(state >> 40) / (1 << 24) - 0.5) * 0.2f;
    }
  });
  LoadOptions all_f32;
  all_f32.f32_tensors = [](std::string_view name) { return name.starts_with("blk."); };
  auto merged = Model::Load(path(), all_f32, *pool_);
  ASSERT_TRUE(merged.ok());
  int merged_count = 0;
  (*merged)->VisitParameters([&](const Parameter& p) {
    const size_t dot = p.name.find('.', 4);
    if (!p.name.starts_with("blk.") || dot == std::string::npos) return;
    const int64_t layer = std::stoll(p.name.substr(4, dot - 4));
    for (LoraTarget t : kAll) {
      if (p.name.substr(dot + 1) != std::string(LoraTargetName(t)) + ".weight") continue;
      const LoraAdapter* ad = (*adapted)->lora().Find(layer, t);
      if (ad == nullptr) continue;
      ++merged_count;
      for (const ParameterLocation& loc : p.locations) {
        float* w = const_cast<float*>(static_cast<const float*>(loc.view.data));
        for (int64_t o = 0; o < ad->out; ++o) {
          for (int64_t i = 0; i < ad->in; ++i) {
            double ba = 0;
            for (int64_t r = 0; r < ad->rank; ++r) {
              ba += static_cast<double>(ad->b[o * ad->rank + r]) * ad->a[r * ad->in + i];
            }
            w[o * ad->in + i] = static_cast<float>(w[o * ad->in + i] + ad->scale * ba);
          }
        }
      }
    }
  });
  EXPECT_GT(merged_count, 10);
  const std::vector<float> a = Logits(**adapted), m = Logits(**merged);
  ASSERT_EQ(a.size(), m.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(static_cast<double>(a[i]) - m[i]));
    max_abs = std::max(max_abs, std::abs(static_cast<double>(m[i])));
  }
  std::printf("max |adapted - merged| = %.3g (logit scale %.3g)\n", max_diff, max_abs);
  // The two differ by rounding only: the merged weight is rounded once to f32, the adapter path
  // adds its own product; gemma's f16-table GELU turns such a difference into a step of up to
  // ~5e-4 relative when an input crosses an f16 rounding boundary (qwen3: ~1e-6).
  EXPECT_LT(max_diff, 5e-4 * std::max(1.0, max_abs));
  // And the adapters matter: far from the base model.
  auto base = Model::Load(path(), LoadOptions{}, *pool_);
  const std::vector<float> b = Logits(**base);
  double moved = 0;
  for (size_t i = 0; i < a.size(); ++i) moved = std::max(moved, std::abs(double(a[i]) - b[i]));
  EXPECT_GT(moved, 100 * max_diff);
}

TEST_P(LoraTest, SavedAdaptersLoadBackAndGiveTheSameLogits) {
  auto trained = Model::Load(path(), LoadOptions{}, *pool_);
  ASSERT_TRUE(trained.ok());
  const std::vector<LoraTarget> targets = {LoraTarget::kQ, LoraTarget::kV, LoraTarget::kDown};
  ASSERT_TRUE((*trained)->AddLora(targets, 2, 4.0f, 3).ok());
  int i = 0;
  (*trained)->mutable_lora().ForEach([&](int64_t, LoraTarget, LoraAdapter& ad) {
    for (float& v : ad.b) v = 0.05f * static_cast<float>(std::sin(0.7 * ++i));
  });
  const std::string file = FixtureTempPath("lora_adapters", Variants()[GetParam()].name);
  ASSERT_TRUE((*trained)->SaveLora(file).ok());
  auto served = Model::Load(path(), LoadOptions{}, *pool_);
  ASSERT_TRUE(served.ok());
  ASSERT_TRUE((*served)->LoadLora(file).ok());
  const std::vector<float> want = Logits(**trained);
  ASSERT_TRUE(std::isfinite(want[0]));
  EXPECT_EQ(Logits(**served), want);
  EXPECT_FALSE((*served)->LoadLora(file).ok());  // once

  // Another family's adapters, and a file that is not an adapter, are refused by name.
  auto other = Model::Load(paths_[1 - GetParam()], LoadOptions{}, *pool_);
  ASSERT_TRUE(other.ok());
  const absl::Status wrong = (*other)->LoadLora(file);
  EXPECT_NE(wrong.message().find("adapters for"), std::string::npos) << wrong;
  const absl::Status not_adapter = (*other)->LoadLora(path());
  EXPECT_NE(not_adapter.message().find("not a LoRA adapter"), std::string::npos) << not_adapter;
  std::remove(file.c_str());
}

TEST_P(LoraTest, ShardsTakeTheAdaptersOfTheirOwnLayers) {
  // Two stages with one adapter file compute what the whole model with it computes; a stage
  // whose layers have no adapters in the file (written by a first-stage-only model) loads it
  // as none, and a file that does not fit the model is refused by every stage.
  auto full = Model::Load(path(), LoadOptions{}, *pool_);
  ASSERT_TRUE(full.ok());
  const ModelConfig& c = (*full)->config();
  int64_t split = -1;
  for (int64_t l = 1; l < c.num_layers && split < 0; ++l) {
    if (c.CanSplitAt(l)) split = l;
  }
  ASSERT_GT(split, 0);
  const std::vector<LoraTarget> targets = {LoraTarget::kQ, LoraTarget::kV, LoraTarget::kUp};
  ASSERT_TRUE((*full)->AddLora(targets, 2, 4.0f, 5).ok());
  int i = 0;
  (*full)->mutable_lora().ForEach([&](int64_t, LoraTarget, LoraAdapter& ad) {
    for (float& v : ad.b) v = 0.05f * static_cast<float>(std::cos(0.3 * ++i));
  });
  const std::string file = FixtureTempPath("lora_shard", Variants()[GetParam()].name);
  ASSERT_TRUE((*full)->SaveLora(file).ok());
  auto a = Model::Load(path(), LoadOptions{0, split, true, false}, *pool_);
  auto b = Model::Load(path(), LoadOptions{split, -1, false, true}, *pool_);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->LoadLora(file).ok());
  ASSERT_TRUE((*b)->LoadLora(file).ok());
  (*a)->lora().ForEach([&](int64_t layer, LoraTarget, const LoraAdapter&) {
    EXPECT_LT(layer, split);
  });
  (*b)->lora().ForEach([&](int64_t layer, LoraTarget, const LoraAdapter&) {
    EXPECT_GE(layer, split);
  });
  EXPECT_FALSE((*b)->lora().empty());
  auto kv_a = (*a)->NewKvCache(16, GgmlType::kF32);
  auto kv_b = (*b)->NewKvCache(16, GgmlType::kF32);
  ASSERT_TRUE(kv_a.ok() && kv_b.ok());
  const int64_t n = static_cast<int64_t>(kPrompt.size());
  std::vector<float> x(n * c.hidden), logits(n * c.vocab_size);
  ASSERT_TRUE((*a)->Embed(kPrompt, x.data()).ok());
  const Model::Segment seg_a[] = {{kv_a->get(), 0, n}};
  ASSERT_TRUE((*a)->ForwardLayers(x.data(), n, seg_a).ok());
  const Model::Segment seg_b[] = {{kv_b->get(), 0, n}};
  ASSERT_TRUE((*b)->ForwardLayers(x.data(), n, seg_b).ok());
  ASSERT_TRUE((*b)->Head(x.data(), n, logits.data()).ok());
  EXPECT_EQ(logits, Logits(**full));

  // Adapters on the first stage's layers only: the second stage has none of them.
  auto first_only = Model::Load(path(), LoadOptions{0, split, true, false}, *pool_);
  ASSERT_TRUE(first_only.ok());
  ASSERT_TRUE((*first_only)->AddLora(targets, 2, 4.0f, 5).ok());
  ASSERT_TRUE((*first_only)->SaveLora(file).ok());
  auto b2 = Model::Load(path(), LoadOptions{split, -1, false, true}, *pool_);
  ASSERT_TRUE(b2.ok());
  const absl::Status none = (*b2)->LoadLora(file);
  EXPECT_TRUE(none.ok()) << none;
  EXPECT_TRUE((*b2)->lora().empty());

  // An adapter on layer 0 that fits no tensor: refused by the stage without layer 0 too.
  {
    auto w = gguf::Writer::Create(file);
    ASSERT_TRUE(w.ok());
    (*w)->SetValue("general.architecture", gguf::Value::Str(c.arch));
    (*w)->SetValue("general.type", gguf::Value::Str("adapter"));
    (*w)->SetValue("adapter.type", gguf::Value::Str("lora"));
    (*w)->SetValue("adapter.lora.alpha", gguf::Value::F32(4.0f));
    const int64_t in = c.hidden + 8, out = c.layers[0].q_dim();
    const std::vector<float> zeros((in + out) * 2, 0.0f);
    const auto* bytes = reinterpret_cast<const uint8_t*>(zeros.data());
    ASSERT_TRUE((*w)->AddTensorBytes("blk.0.attn_q.weight.lora_a", {in, 2}, GgmlType::kF32,
                                     {bytes, static_cast<size_t>(in * 2 * 4)}).ok());
    ASSERT_TRUE((*w)->AddTensorBytes("blk.0.attn_q.weight.lora_b", {2, out}, GgmlType::kF32,
                                     {bytes, static_cast<size_t>(out * 2 * 4)}).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto b3 = Model::Load(path(), LoadOptions{split, -1, false, true}, *pool_);
  ASSERT_TRUE(b3.ok());
  const absl::Status misfit = (*b3)->LoadLora(file);
  EXPECT_EQ(misfit.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(misfit.message().find("blk.0.attn_q.weight.lora_a: ["), std::string::npos)
      << misfit;
  std::remove(file.c_str());
}

TEST(LoraTargets, ParseNamesAndErrors) {
  auto t = ParseLoraTargets("q,v,attn_output,down");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, (std::vector<LoraTarget>{LoraTarget::kQ, LoraTarget::kV, LoraTarget::kO,
                                         LoraTarget::kDown}));
  auto bad = ParseLoraTargets("q,x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'x'"), std::string::npos);
}

}  // namespace
}  // namespace fucina
