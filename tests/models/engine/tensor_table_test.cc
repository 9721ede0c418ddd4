// The users of a family's tensor table, on gemma4 fixtures (per-layer geometry, layers without
// K/V tensors, per-layer embeddings, expert stacks): MeasureModel accounts for every byte of
// the file in the right part, ShardTensorNames lists exactly what a shard binds (and a shard
// loads from a file whose other tensors are garbage, with the same results), and
// Model::VisitParameters lists every bound tensor with each of its copies.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/tile_layout.h"
#include "models/engine/fixture.h"
#include "tests/models/engine/fixture_files.h"
#include "models/engine/model.h"
#include "models/engine/model_size.h"
#include "models/engine/registry.h"
#include "models/gguf/gguf.h"
#include "models/gguf/writer.h"

namespace fucina {
namespace {

using Variant = FixtureVariant;

FixtureOptions Gemma4(const char* type) {
  FixtureOptions o;
  o.arch = "gemma4";
  o.type = type;
  o.num_layers = 6;
  o.hidden = 64;
  o.ffn = 128;
  o.num_heads = 4;
  o.num_heads_kv = 2;
  o.head_dim = 32;
  o.head_dim_global = 64;
  o.kv_heads_global = 1;
  o.sliding_window = 8;
  o.shared_kv_layers = 3;  // layers 3..5 read layers 1 and 2: the only legal cut is at 1
  o.num_experts = 4;
  o.num_experts_used = 2;
  o.expert_ffn = 64;
  o.init_std = 0.1;
  o.seed = 9;
  return o;
}

std::vector<Variant> Variants() {
  FixtureOptions moe = Gemma4("q8_0");
  moe.moe = true;
  FixtureOptions ple = Gemma4("f32");
  ple.per_layer_input = 8;
  return {{"gemma4_f32", Gemma4("f32")},
          {"gemma4_q8_0", Gemma4("q8_0")},
          {"gemma4moe_q8_0", moe},
          {"gemma4ple_f32", ple}};
}

std::string TempPath(const std::string& name) { return FixtureTempPath("tensor_table", name); }

class TensorTableTest : public testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() {
    pool_ = new ThreadPool(2);
    MakeFixtureFiles("tensor_table", Variants(), *pool_, &paths_);
  }
  static void TearDownTestSuite() {
    RemoveFixtureFiles(&paths_);
    delete pool_;
    pool_ = nullptr;
  }

  void SetUp() override {
    auto file = gguf::File::Open(path());
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *std::move(file);
    auto config = ReadModelConfig(*file_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *std::move(config);
  }

  const std::string& path() const { return paths_[GetParam()]; }

  // The shards worth checking: the whole model, each side of every legal cut, and for MoE the
  // experts alone.
  std::vector<LoadOptions> Shards() const {
    std::vector<LoadOptions> out = {LoadOptions{}};
    for (int64_t l = 1; l < config_.num_layers; ++l) {
      if (!config_.CanSplitAt(l)) continue;
      out.push_back({.first_layer = 0, .last_layer = l, .embeddings = true, .head = false});
      out.push_back({.first_layer = l, .last_layer = -1, .embeddings = false, .head = true});
    }
    if (config_.IsMoe()) {
      out.push_back({.first_layer = 2, .last_layer = 4, .embeddings = false, .head = false,
                     .experts_only = true});
    }
    return out;
  }

  static inline ThreadPool* pool_ = nullptr;
  static inline std::vector<std::string> paths_;
  std::unique_ptr<gguf::File> file_;
  ModelConfig config_;
};

std::string VariantName(const testing::TestParamInfo<int>& info) {
  return Variants()[info.param].name;
}

INSTANTIATE_TEST_SUITE_P(Gemma4Fixtures, TensorTableTest,
                         testing::Range(0, static_cast<int>(Variants().size())), VariantName);

std::string Describe(const LoadOptions& o) {
  return "layers [" + std::to_string(o.first_layer) + ", " + std::to_string(o.last_layer) +
         ")" + (o.embeddings ? " +embeddings" : "") + (o.head ? " +head" : "") +
         (o.experts_only ? " experts only" : "");
}

std::set<std::string> BoundNames(const Model& model) {
  std::set<std::string> out;
  model.VisitParameters([&](const Parameter& p) { out.insert(p.name); });
  return out;
}

TEST_P(TensorTableTest, MeasureModelAccountsForEveryByteOfTheFile) {
  // Each tensor classified by its name, independently of the table.
  std::vector<int64_t> layer(config_.num_layers, 0), experts(config_.num_layers, 0);
  int64_t embedding = 0, head = 0, global = 0, total = 0;
  for (const gguf::TensorInfo& t : file_->tensors()) {
    const int64_t bytes = static_cast<int64_t>(t.nbytes);
    total += bytes;
    if (absl::StartsWith(t.name, "blk.")) {
      const int64_t l = std::stoll(t.name.substr(4));
      (absl::StrContains(t.name, "_exps.") ? experts : layer)[l] += bytes;
    } else if (t.name == "token_embd.weight" || absl::StartsWith(t.name, "per_layer_")) {
      embedding += bytes;
    } else if (t.name == "output_norm.weight" || t.name == "output.weight") {
      head += bytes;
    } else if (t.name == "rope_freqs.weight") {
      global += bytes;
    } else {
      ADD_FAILURE() << "unexpected tensor " << t.name;
    }
  }
  ASSERT_EQ(file_->FindTensor("output.weight"), nullptr) << "the fixtures tie the head";
  head += static_cast<int64_t>(file_->FindTensor("token_embd.weight")->nbytes);
  EXPECT_GT(global, 0);

  const ModelSize size = MeasureModel(*file_, config_);
  EXPECT_EQ(size.embedding_bytes, embedding);
  EXPECT_EQ(size.head_bytes, head);
  int64_t measured = size.embedding_bytes + global;
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    EXPECT_EQ(size.layer_bytes[l], layer[l]) << "layer " << l;
    EXPECT_EQ(size.expert_bytes[l] * config_.num_experts, experts[l]) << "layer " << l;
    measured += size.layer_bytes[l] + size.expert_bytes[l] * config_.num_experts;
  }
  // Layers reading another layer's K/V have no K/V projections, so they weigh less.
  EXPECT_LT(size.layer_bytes[4], size.layer_bytes[1]);
  // Every byte once (the tied head's token_embd is counted with the embeddings).
  EXPECT_EQ(measured + head - static_cast<int64_t>(file_->FindTensor("token_embd.weight")->nbytes),
            total);
  // A one-stage plan holds the embeddings and the tied head, which counts token_embd again.
  EXPECT_EQ(size.StageBytes(0, config_.num_layers, config_.num_experts, true, true) + global,
            total + static_cast<int64_t>(file_->FindTensor("token_embd.weight")->nbytes));
}

TEST_P(TensorTableTest, ShardTensorNamesAreExactlyWhatAShardBinds) {
  for (const LoadOptions& shard : Shards()) {
    SCOPED_TRACE(Describe(shard));
    auto names = ShardTensorNames(*file_, shard);
    ASSERT_TRUE(names.ok()) << names.status();
    auto model = Model::Load(path(), shard, *pool_);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(BoundNames(**model), std::set<std::string>(names->begin(), names->end()));
  }
  // The whole model binds every tensor of the file.
  auto full = ShardTensorNames(*file_, LoadOptions{});
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->size(), file_->tensors().size());
}

// A copy of the file in which every tensor not in `keep` is 0xFF bytes (NaN in f32 and in the
// f16 scales of quantized blocks): a shard that read one would show it in its results.
absl::Status CopyWithGarbage(const gguf::File& f, const std::set<std::string>& keep,
                             const std::string& dst, std::vector<std::vector<uint8_t>>& hold) {
  auto w = gguf::Writer::Create(dst);
  if (!w.ok()) return w.status();
  for (const auto& [k, v] : f.metadata()) (*w)->SetValue(k, v);
  for (const gguf::TensorInfo& t : f.tensors()) {
    std::span<const uint8_t> bytes(t.data, t.nbytes);
    if (!keep.contains(t.name)) {
      hold.emplace_back(t.nbytes, 0xFF);
      bytes = hold.back();
    }
    if (absl::Status s = (*w)->AddTensorBytes(t.name, t.dims, t.type, bytes); !s.ok()) return s;
  }
  return (*w)->Finish();
}

TEST_P(TensorTableTest, AShardLoadsFromItsTensorsAlone) {
  const int64_t hidden = config_.hidden, vocab = config_.vocab_size;
  int index = 0;
  for (const LoadOptions& shard : Shards()) {
    SCOPED_TRACE(Describe(shard));
    auto names = ShardTensorNames(*file_, shard);
    ASSERT_TRUE(names.ok()) << names.status();
    const std::string garbled = TempPath(std::string(Variants()[GetParam()].name) + "_shard" +
                                         std::to_string(index++));
    std::vector<std::vector<uint8_t>> hold;
    ASSERT_TRUE(
        CopyWithGarbage(*file_, std::set<std::string>(names->begin(), names->end()), garbled, hold)
            .ok());
    auto want_model = Model::Load(path(), shard, *pool_);
    auto got_model = Model::Load(garbled, shard, *pool_);
    ASSERT_TRUE(want_model.ok()) << want_model.status();
    ASSERT_TRUE(got_model.ok()) << got_model.status();

    // The shard's whole surface on the same inputs: embeddings, layers over a few positions,
    // the head, or the experts.
    const std::vector<int32_t> tokens = {3, 150, 42, 7, 99};
    const int64_t n = static_cast<int64_t>(tokens.size());
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x0(n * hidden);
    for (float& v : x0) v = normal(rng);
    auto run = [&](Model& m) {
      std::vector<float> out;
      if (m.experts_only()) {
        const std::vector<int32_t> rows = {0, 1, 2, 3}, ids = {0, 3, 1, 2};
        out.resize(rows.size() * hidden);
        EXPECT_TRUE(m.ExpertOutputs(shard.first_layer, x0.data(), rows, ids, out.data()).ok());
        return out;
      }
      std::vector<float> x = x0;
      if (m.has_embeddings()) EXPECT_TRUE(m.Embed(tokens, x.data()).ok());
      auto kv = m.NewKvCache(16, GgmlType::kF16);
      EXPECT_TRUE(kv.ok()) << kv.status();
      const Model::Segment seg[] = {{kv->get(), 0, n, tokens}};
      const absl::Status s = m.ForwardLayers(x.data(), n, seg);
      EXPECT_TRUE(s.ok()) << s;
      out = x;
      if (m.has_head()) {
        out.resize(n * vocab);
        EXPECT_TRUE(m.Head(x.data(), n, out.data()).ok());
      }
      return out;
    };
    const std::vector<float> want = run(**want_model), got = run(**got_model);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(want[i])) << i;
      ASSERT_EQ(got[i], want[i]) << i;
    }
    std::remove(garbled.c_str());
  }
}

TEST_P(TensorTableTest, ParametersListEveryCopyOfEveryTensor) {
  auto model = Model::Load(path(), LoadOptions{}, *pool_);
  ASSERT_TRUE(model.ok()) << model.status();
  std::set<std::string> seen;
  int fused = 0;
  // The model's own mapping: locations point into it.
  const gguf::File& mapped = (*model)->file();
  (*model)->VisitParameters([&](const Parameter& p) {
    SCOPED_TRACE(p.name);
    EXPECT_TRUE(seen.insert(p.name).second) << "listed twice";
    const gguf::TensorInfo* t = mapped.FindTensor(p.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(p.dims, t->dims);
    ASSERT_FALSE(p.locations.empty());
    // The first location is the file's mapping itself.
    EXPECT_FALSE(p.locations[0].owned);
    EXPECT_EQ(p.locations[0].view.data, static_cast<const void*>(t->data));
    // Fused q/k/v and gate/up: one more, owned copy of the same bytes.
    const bool fusable = absl::EndsWith(p.name, "attn_k.weight") ||
                         absl::EndsWith(p.name, "attn_v.weight") ||
                         absl::EndsWith(p.name, "ffn_gate.weight") ||
                         absl::EndsWith(p.name, "ffn_up.weight") ||
                         (absl::EndsWith(p.name, "attn_q.weight") &&
                          config_.layers[std::stoll(p.name.substr(4))].kv_source < 0);
    if (!fusable) {
      EXPECT_EQ(p.locations.size(), 1u);
      return;
    }
    ASSERT_EQ(p.locations.size(), 2u);
    const WeightView& copy = p.locations[1].view;
    EXPECT_TRUE(p.locations[1].owned);
    EXPECT_NE(copy.data, p.locations[0].view.data);
    EXPECT_EQ(copy.rows * static_cast<int64_t>(copy.row_stride), static_cast<int64_t>(t->nbytes));
    // A fused copy repacked for the tile kernels says so, and holds the same rows.
    std::vector<uint8_t> rows;
    const void* bytes = copy.data;
    if (copy.layout == WeightLayout::kTiles16) {
      rows.resize(t->nbytes);
      UnpackTiles16(copy, rows.data());
      bytes = rows.data();
    }
    EXPECT_EQ(std::memcmp(bytes, t->data, t->nbytes), 0);
    ++fused;
  });
  std::set<std::string> all;
  for (const gguf::TensorInfo& t : file_->tensors()) all.insert(t.name);
  EXPECT_EQ(seen, all);
  // q, k, v in the three layers storing K/V and gate, up in all six.
  EXPECT_EQ(fused, 3 * 3 + 6 * 2);
}

// gemma4 refuses q8_0 K/V (attention at scale 1 over unit-RMS heads magnifies its rounding),
// by name, before any cache is made; f16 and f32 run.
TEST_P(TensorTableTest, Gemma4RefusesQ8_0KvCaches) {
  auto model = Model::Load(path(), LoadOptions{}, *pool_);
  ASSERT_TRUE(model.ok()) << model.status();
  auto q8 = (*model)->NewKvCache(64, GgmlType::kQ8_0);
  ASSERT_FALSE(q8.ok());
  EXPECT_EQ(q8.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(q8.status().message().find("q8_0"), std::string::npos) << q8.status();
  for (GgmlType type : {GgmlType::kF16, GgmlType::kF32}) {
    EXPECT_TRUE((*model)->NewKvCache(64, type).ok());
  }
}

}  // namespace
}  // namespace fucina
