// A model family defined and registered entirely in this file: adding one touches no other
// family's code. "toymlp" is embeddings, then per layer a scaled SwiGLU residual
//   x += s_l * down(silu(gate(h)) * up(h)),  h = rms_norm(x) * ffn_norm
// (GatedFfn from blocks.h, its own tensor table and metadata keys), then the tied head. Its
// fixture is written, loaded and run through the engine, and the logits are checked against a
// computation in double done here from the file's tensors; ModelSize and ShardTensorNames work
// from its table. Also: the registry's errors.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/thread_pool.h"
#include "kernels/norm.h"
#include "models/engine/blocks.h"
#include "models/engine/family.h"
#include "models/engine/fixture.h"
#include "models/engine/model.h"
#include "models/engine/model_size.h"
#include "models/engine/registry.h"
#include "models/gguf/gguf.h"
#include "models/gguf/meta.h"
#include "models/gguf/writer.h"

namespace fucina {
namespace {

constexpr const char* kToyArch = "toymlp";

// ---- The family ----

absl::StatusOr<ModelConfig> ReadToyConfig(const gguf::File& file) {
  auto meta = gguf::Meta::ForFile(file, gguf::ZeroPolicy::kRejectZero);
  if (!meta.ok()) return meta.status();
  auto hidden = meta->Int("embedding_length");
  if (!hidden.ok()) return hidden.status();
  auto layers = meta->Int("block_count");
  if (!layers.ok()) return layers.status();
  auto ffn = meta->Int("feed_forward_length");
  if (!ffn.ok()) return ffn.status();
  auto eps = meta->Float("attention.layer_norm_rms_epsilon");
  if (!eps.ok()) return eps.status();
  const gguf::TensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) {
    return absl::InvalidArgumentError("token_embd.weight is missing or not 2-D");
  }
  ModelConfig c;
  c.arch = kToyArch;
  c.vocab_size = embd->dims[1];
  c.hidden = static_cast<int64_t>(*hidden);
  c.num_layers = static_cast<int64_t>(*layers);
  c.ffn = static_cast<int64_t>(*ffn);
  c.rms_eps = *eps;
  // No attention: the smallest geometry Validate accepts (the model never reads its cache).
  c.num_heads = c.num_heads_kv = 1;
  c.head_dim = c.rope_dims = 2;
  c.UniformLayers();
  return c;
}

void WriteToyConfig(const ModelConfig& c, gguf::Writer& w) {
  w.SetValue("toymlp.embedding_length", gguf::Value::U32(c.hidden));
  w.SetValue("toymlp.block_count", gguf::Value::U32(c.num_layers));
  w.SetValue("toymlp.feed_forward_length", gguf::Value::U32(c.ffn));
  w.SetValue("toymlp.attention.layer_norm_rms_epsilon", gguf::Value::F32(c.rms_eps));
}

absl::StatusOr<ModelConfig> ToyFixtureConfig(const FixtureOptions& o, int64_t vocab) {
  ModelConfig c;
  c.arch = kToyArch;
  c.vocab_size = vocab;
  c.hidden = o.hidden;
  c.num_layers = o.num_layers;
  c.ffn = o.ffn;
  c.rms_eps = o.rms_eps;
  c.num_heads = c.num_heads_kv = 1;
  c.head_dim = c.rope_dims = 2;
  c.UniformLayers();
  return c;
}

TensorTable ToyTensors(const ModelConfig& c) {
  TensorTable t;
  AddEmbeddingAndHead(t, c);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    AddVector(t, LayerTensor(l, "ffn_norm.weight"), c.hidden, TensorPart::kLayer, l);
    AddFfnTensors(t, c, l, c.ffn);
    t.push_back({LayerTensor(l, "toy_scale.weight"), {1}, TensorPart::kLayer, l,
                 TensorInit::kScale, /*optional=*/false, /*quantize=*/false});
  }
  return t;
}

class ToyModel : public FamilyModel {
 public:
  explicit ToyModel(const ModelConfig& c) : c_(c) {}

  absl::Status Bind(TensorBinder& b, const LoadOptions& options) override {
    first_ = options.first_layer;
    for (int64_t l = first_; l < options.last_layer; ++l) {
      Layer layer;
      auto norm = b.Vector(LayerTensor(l, "ffn_norm.weight"));
      if (!norm.ok()) return norm.status();
      layer.norm = *norm;
      auto ffn = BindFfn(b, l);
      if (!ffn.ok()) return ffn.status();
      layer.ffn = *ffn;
      auto scale = b.Vector(LayerTensor(l, "toy_scale.weight"));
      if (!scale.ok()) return scale.status();
      layer.scale = *scale;
      layers_.push_back(layer);
    }
    return absl::OkStatus();
  }

  absl::Status ForwardLayer(ForwardContext& ctx, int64_t l) override {
    const Layer& L = layers_[l - first_];
    const int64_t n = ctx.rows() * c_.hidden;
    float* h = ForwardScratch::Grow(ctx.scratch().h, n);
    float* out = ForwardScratch::Grow(ctx.scratch().out, n);
    RmsNorm(ctx.x(), L.norm, c_.rms_eps, ctx.rows(), c_.hidden, h);
    GatedFfn(ctx, l, L.ffn, c_.ffn, Activation::kSilu, h, out);
    for (int64_t i = 0; i < n; ++i) ctx.x()[i] += L.scale[0] * out[i];
    return absl::OkStatus();
  }

 private:
  struct Layer {
    const float* norm = nullptr;
    FfnWeights ffn;
    const float* scale = nullptr;
  };
  const ModelConfig& c_;
  int64_t first_ = 0;
  std::vector<Layer> layers_;
};

const ModelFamily kToyFamily = {
    .arch = kToyArch,
    .read_config = ReadToyConfig,
    .tensors = ToyTensors,
    .create = [](const ModelConfig& c, const gguf::File&) -> std::unique_ptr<FamilyModel> {
      return std::make_unique<ToyModel>(c);
    },
    .write_config = WriteToyConfig,
    .fixture_config = ToyFixtureConfig,
};

// ---- The tests ----

class ToyFamilyTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Once per process, whichever tests run.
    static const absl::Status registered = RegisterModelFamily(&kToyFamily);
    ASSERT_TRUE(registered.ok()) << registered;
    pool_ = new ThreadPool(2);
    path_ = testing::TempDir() + "/toymlp_" + std::to_string(getpid()) + ".gguf";
    FixtureOptions o;
    o.arch = kToyArch;
    o.num_layers = 3;
    o.hidden = 32;
    o.ffn = 48;
    o.init_std = 0.3;  // residual branches that move the logits
    o.seed = 5;
    const absl::Status made = MakeFixture(o, path_, *pool_);
    ASSERT_TRUE(made.ok()) << made;
  }
  static void TearDownTestSuite() {
    std::remove(path_.c_str());
    delete pool_;
    pool_ = nullptr;
  }

  static inline ThreadPool* pool_ = nullptr;
  static inline std::string path_;
};

// Row-major f32 tensor values from the file, dims[0] the row length.
std::vector<double> Values(const gguf::File& f, const std::string& name) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->type, GgmlType::kF32) << name;
  const float* p = reinterpret_cast<const float*>(t->data);
  return std::vector<double>(p, p + t->num_elements());
}

// y[r] = sum_c w[r * cols + c] * x[c].
std::vector<double> MatVec(const std::vector<double>& w, const std::vector<double>& x) {
  const size_t cols = x.size(), rows = w.size() / cols;
  std::vector<double> y(rows, 0.0);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  }
  return y;
}

std::vector<double> RmsNormed(const std::vector<double>& x, const std::vector<double>& w,
                              double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * w[i];
  return out;
}

// The toy's logits for one token, from the definition in the header comment.
std::vector<double> HandLogits(const gguf::File& f, int32_t token, int64_t layers, double eps) {
  const std::vector<double> embd = Values(f, "token_embd.weight");
  const size_t hidden = f.FindTensor("token_embd.weight")->dims[0];
  std::vector<double> x(embd.begin() + token * hidden, embd.begin() + (token + 1) * hidden);
  for (int64_t l = 0; l < layers; ++l) {
    const std::vector<double> h =
        RmsNormed(x, Values(f, LayerTensor(l, "ffn_norm.weight")), eps);
    const std::vector<double> gate = MatVec(Values(f, LayerTensor(l, "ffn_gate.weight")), h);
    const std::vector<double> up = MatVec(Values(f, LayerTensor(l, "ffn_up.weight")), h);
    std::vector<double> act(gate.size());
    for (size_t i = 0; i < act.size(); ++i) act[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
    const std::vector<double> down = MatVec(Values(f, LayerTensor(l, "ffn_down.weight")), act);
    const double s = Values(f, LayerTensor(l, "toy_scale.weight"))[0];
    for (size_t i = 0; i < hidden; ++i) x[i] += s * down[i];
  }
  return MatVec(embd, RmsNormed(x, Values(f, "output_norm.weight"), eps));  // tied head
}

TEST_F(ToyFamilyTest, LoadsAndRunsAsComputedByHand) {
  auto model = Model::Load(path_, LoadOptions{}, *pool_);
  ASSERT_TRUE(model.ok()) << model.status();
  const ModelConfig& c = (*model)->config();
  EXPECT_EQ(c.arch, kToyArch);
  EXPECT_EQ(c.num_layers, 3);
  EXPECT_EQ(c.hidden, 32);
  auto kv = (*model)->NewKvCache(16, GgmlType::kF32);
  ASSERT_TRUE(kv.ok()) << kv.status();
  const std::vector<int32_t> tokens = {5, 200, 77, 5};
  auto logits = (*model)->ForwardStepAllLogits(**kv, tokens, 0);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const int64_t vocab = c.vocab_size;
  ASSERT_EQ(static_cast<int64_t>(logits->size()), 4 * vocab);
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<double> want = HandLogits((*model)->file(), tokens[i], 3, c.rms_eps);
    ASSERT_EQ(static_cast<int64_t>(want.size()), vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      worst = std::max(worst, std::fabs((*logits)[i * vocab + v] - want[v]));
      scale = std::max(scale, std::fabs(want[v]));
    }
  }
  // Float matmuls and norms against double: a few ulp of the logits' scale.
  EXPECT_GT(scale, 0.1);
  EXPECT_LT(worst, 1e-5 * scale) << "scale " << scale;
  // Not vacuous: the layers move the logits away from the embeddings' own.
  const std::vector<double> no_layers = HandLogits((*model)->file(), tokens[0], 0, c.rms_eps);
  double moved = 0.0;
  for (int64_t v = 0; v < vocab; ++v) moved = std::max(moved, std::fabs(no_layers[v] - (*logits)[v]));
  EXPECT_GT(moved, 100 * worst);
}

TEST_F(ToyFamilyTest, SizesAndShardsComeFromItsTable) {
  auto file = gguf::File::Open(path_);
  ASSERT_TRUE(file.ok()) << file.status();
  auto config = ReadModelConfig(**file);
  ASSERT_TRUE(config.ok()) << config.status();
  const ModelSize size = MeasureModel(**file, *config);
  auto bytes = [&](const std::string& name) {
    const gguf::TensorInfo* t = (*file)->FindTensor(name);
    return t == nullptr ? int64_t{0} : static_cast<int64_t>(t->nbytes);
  };
  for (int64_t l = 0; l < 3; ++l) {
    int64_t want = 0;
    for (const char* s : {"ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
                          "ffn_down.weight", "toy_scale.weight"}) {
      want += bytes(LayerTensor(l, s));
    }
    EXPECT_EQ(size.layer_bytes[l], want) << l;
    EXPECT_EQ(size.expert_bytes[l], 0) << l;
  }
  EXPECT_EQ(size.embedding_bytes, bytes("token_embd.weight"));
  EXPECT_EQ(size.head_bytes, bytes("output_norm.weight") + bytes("token_embd.weight"));  // tied

  // A last-stage shard of layer 1..2: its layer's tensors and the head (token_embd as tied).
  const LoadOptions shard{.first_layer = 1, .last_layer = 2, .embeddings = false, .head = true};
  auto names = ShardTensorNames(**file, shard);
  ASSERT_TRUE(names.ok()) << names.status();
  const std::set<std::string> got(names->begin(), names->end());
  const std::set<std::string> want = {
      "blk.1.ffn_norm.weight", "blk.1.ffn_gate.weight", "blk.1.ffn_up.weight",
      "blk.1.ffn_down.weight", "blk.1.toy_scale.weight", "output_norm.weight",
      "token_embd.weight"};
  EXPECT_EQ(got, want);
  // What the shard binds is what ShardTensorNames promised.
  auto model = Model::Load(path_, shard, *pool_);
  ASSERT_TRUE(model.ok()) << model.status();
  std::set<std::string> bound;
  (*model)->VisitParameters([&](const Parameter& p) { bound.insert(p.name); });
  EXPECT_EQ(bound, want);
}

TEST(ModelFamilyRegistry, ArchitecturesAreUnique) {
  auto llama = FindModelFamily("llama");
  ASSERT_TRUE(llama.ok()) << llama.status();
  const absl::Status again = RegisterModelFamily(*llama);
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists) << again;
  // Another family object under a built-in name is refused too.
  ModelFamily impostor = kToyFamily;
  impostor.arch = "gemma4";
  const absl::Status clash = RegisterModelFamily(&impostor);
  EXPECT_EQ(clash.code(), absl::StatusCode::kAlreadyExists) << clash;
  EXPECT_NE(std::string(clash.message()).find("gemma4"), std::string::npos) << clash;
  auto gemma4 = FindModelFamily("gemma4");
  ASSERT_TRUE(gemma4.ok());
  EXPECT_NE(*gemma4, &impostor);
}

TEST(ModelFamilyRegistry, UnknownArchitectureListsTheKnownOnes) {
  auto none = FindModelFamily("mamba9");
  ASSERT_FALSE(none.ok());
  const std::string message(none.status().message());
  EXPECT_NE(message.find("'mamba9'"), std::string::npos) << message;
  for (const char* known : {"llama", "qwen3", "qwen3moe", "gemma4"}) {
    EXPECT_NE(message.find(known), std::string::npos) << known << ": " << message;
  }
  // The same through a file: Model::Load names the architecture it cannot run.
  ThreadPool pool(1);
  const std::string path =
      testing::TempDir() + "/unknown_arch_" + std::to_string(getpid()) + ".gguf";
  {
    auto w = gguf::Writer::Create(path);
    ASSERT_TRUE(w.ok()) << w.status();
    (*w)->SetValue("general.architecture", gguf::Value::Str("mamba9"));
    const std::vector<float> embd(8 * 4, 0.5f);
    ASSERT_TRUE((*w)->AddTensorBytes("token_embd.weight", {8, 4}, GgmlType::kF32,
                                     {reinterpret_cast<const uint8_t*>(embd.data()),
                                      embd.size() * sizeof(float)})
                    .ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto model = Model::Load(path, LoadOptions{}, pool);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(std::string(model.status().message()).find("'mamba9'"), std::string::npos)
      << model.status();
  EXPECT_NE(std::string(model.status().message()).find("gemma4"), std::string::npos)
      << model.status();
  std::remove(path.c_str());
}

}  // namespace
}  // namespace fucina
