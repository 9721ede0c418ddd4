// MergeModel (models/engine/merge.h): an exported model computes what base + adapters compute
// (the adapter path in the blocks, not the merge, is the reference), its merged weights equal
// W + scale * B A summed here in double from the files' raw bytes, replaced tensors carry the
// tensors file's bytes, untouched ones the base's, and bad trained files are refused by name
// with no output left behind.
#include "models/engine/merge.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/engine/fixture.h"
#include "models/engine/lora.h"
#include "models/engine/model.h"
#include "models/gguf/gguf.h"
#include "models/gguf/writer.h"
#include "tests/models/engine/fixture_files.h"

namespace fucina {
namespace {

const std::vector<int32_t> kPrompt = {5, 80, 17, 200, 33, 9, 120, 64};

FixtureOptions SmallQwen3() { return SmallQwen3Fixture(11); }

// Deterministic values in [-scale, scale) (an LCG; the test needs no statistics).
class Values {
 public:
  explicit Values(uint64_t seed) : state_(seed) {}
  float Next(float scale) {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(state_ >> 40) / (1 << 24) * 2 - 1) * scale;
  }

 private:
  uint64_t state_;
};

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return d;
}

std::vector<float> F32(const gguf::TensorInfo& t) {
  EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
  const float* p = reinterpret_cast<const float*>(t.data);
  return std::vector<float>(p, p + t.num_elements());
}

class MergeTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    pool_ = new ThreadPool(2);
    FixtureOptions other = SmallQwen3();
    other.hidden = 48;  // same family, other shapes: its adapters fit no tensor here
    other.head_dim = 24;
    MakeFixtureFiles("merge", {{"base", SmallQwen3()}, {"other", other}}, *pool_, &paths_);
  }
  static void TearDownTestSuite() {
    RemoveFixtureFiles(&paths_);
    delete pool_;
  }
  void SetUp() override {
    dir_ = testing::TempDir() + "/merge_" + std::to_string(getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static const std::string& base() { return paths_[0]; }
  static std::unique_ptr<Model> Load(const std::string& path, const LoadOptions& o = {}) {
    auto m = Model::Load(path, o, *pool_);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  static std::vector<float> Logits(Model& m) { return PromptLogits(m, kPrompt); }
  // Rank-3 adapters on `targets` of `model_path` with B drawn from `seed` (nonzero), saved.
  static std::string WriteAdapters(const std::string& model_path, const std::string& out,
                                   std::vector<LoraTarget> targets, uint64_t seed) {
    auto m = Load(model_path);
    EXPECT_TRUE(m->AddLora(targets, 3, 6.0f, seed).ok());
    Values values(seed);
    m->mutable_lora().ForEach([&](int64_t, LoraTarget, LoraAdapter& ad) {
      for (float& v : ad.b) v = values.Next(0.2f);
    });
    const absl::Status s = m->SaveLora(out);
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  // A tensors file: general.type "tensors" and the given f32 tensors.
  static absl::Status WriteTensors(
      const std::string& out, const std::vector<std::pair<std::string, std::vector<int64_t>>>& ts,
      std::vector<std::vector<float>>* values, const char* type = "tensors") {
    auto w = gguf::Writer::Create(out);
    if (!w.ok()) return w.status();
    (*w)->SetValue("general.type", gguf::Value::Str(type));
    Values gen(77);
    values->clear();
    for (const auto& [name, dims] : ts) {
      int64_t n = 1;
      for (int64_t d : dims) n *= d;
      values->emplace_back(n);
      for (float& v : values->back()) v = gen.Next(0.3f);
      const std::vector<float>& v = values->back();
      absl::Status s = (*w)->AddTensorBytes(
          name, dims, GgmlType::kF32,
          {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
      if (!s.ok()) return s;
    }
    return (*w)->Finish();
  }
  absl::Status Merge(std::vector<std::string> trained, const std::string& out,
                     const char* type = nullptr) {
    MergeOptions options;
    if (type != nullptr) {
      auto t = gguf::ParseQuantTarget(type);
      EXPECT_TRUE(t.ok());
      options.type = *t;
    }
    return MergeModel(base(), trained, out, options, *pool_);
  }
  // W [out, in] + scale * B A of every adapter in `adapter_file` on `name`, in double from the
  // files' bytes; `w` is the starting value (the base's, or a replacement).
  static std::vector<double> MergedInDouble(const std::string& adapter_file,
                                            const std::string& name, const std::vector<float>& w) {
    auto f = gguf::File::Open(adapter_file);
    EXPECT_TRUE(f.ok());
    const gguf::TensorInfo* a = (*f)->FindTensor(name + ".lora_a");  // [in, rank]
    const gguf::TensorInfo* b = (*f)->FindTensor(name + ".lora_b");  // [rank, out]
    EXPECT_TRUE(a != nullptr && b != nullptr) << name;
    const int64_t in = a->dims[0], rank = a->dims[1], out = b->dims[1];
    const double alpha = *(*f)->Find("adapter.lora.alpha")->AsFloat();
    const float* pa = reinterpret_cast<const float*>(a->data);
    const float* pb = reinterpret_cast<const float*>(b->data);
    std::vector<double> m(w.begin(), w.end());
    EXPECT_EQ(static_cast<int64_t>(w.size()), in * out);
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        double ba = 0;
        for (int64_t r = 0; r < rank; ++r) ba += double(pb[o * rank + r]) * pa[r * in + i];
        m[o * in + i] += alpha / rank * ba;
      }
    }
    return m;
  }
  // No output, and no temporary one, after a refused merge.
  void ExpectNoOutput(const std::string& out) {
    EXPECT_FALSE(std::filesystem::exists(out)) << out;
    EXPECT_FALSE(std::filesystem::exists(out + ".tmp")) << out;
  }

  static inline ThreadPool* pool_ = nullptr;
  static inline std::vector<std::string> paths_;
  std::string dir_;
};

TEST_F(MergeTest, LoraMergedEqualsBasePlusAdapter) {
  const std::string adapters = WriteAdapters(base(), dir_ + "/adapters.gguf",
                                             {LoraTarget::kQ, LoraTarget::kV}, 5);
  const std::string out = dir_ + "/merged.gguf";
  ASSERT_TRUE(Merge({adapters}, out, "f32").ok());

  auto adapted = Load(base());
  ASSERT_TRUE(adapted->LoadLora(adapters).ok());
  auto merged = Load(out);
  auto plain = Load(base());
  const std::vector<float> want = Logits(*adapted), got = Logits(*merged);
  const double diff = MaxAbsDiff(want, got), moved = MaxAbsDiff(want, Logits(*plain));
  std::printf("max |merged - base+adapter| = %.3g; the adapter moves logits by %.3g\n", diff,
              moved);
  EXPECT_LT(diff, 1e-4);
  EXPECT_GT(moved, 1e-2);  // the adapters matter, so a merge that dropped them would fail

  // The merged weights against the files' bytes; the untouched tensors are the base's bytes.
  auto in = gguf::File::Open(base());
  auto res = gguf::File::Open(out);
  ASSERT_TRUE(in.ok() && res.ok());
  ASSERT_EQ((*res)->tensors().size(), (*in)->tensors().size());
  int merged_count = 0;
  for (const gguf::TensorInfo& t : (*in)->tensors()) {
    const gguf::TensorInfo* m = (*res)->FindTensor(t.name);
    ASSERT_NE(m, nullptr) << t.name;
    EXPECT_EQ(m->dims, t.dims);
    EXPECT_EQ(m->type, GgmlType::kF32);
    const bool adapted_tensor =
        t.name.ends_with("attn_q.weight") || t.name.ends_with("attn_v.weight");
    if (!adapted_tensor) {
      EXPECT_EQ(std::memcmp(m->data, t.data, t.nbytes), 0) << t.name;
      continue;
    }
    ++merged_count;
    const std::vector<double> expect = MergedInDouble(adapters, t.name, F32(t));
    const std::vector<float> actual = F32(*m);
    double d = 0;
    for (size_t i = 0; i < expect.size(); ++i) d = std::max(d, std::abs(expect[i] - actual[i]));
    EXPECT_LT(d, 1e-5) << t.name;
  }
  EXPECT_EQ(merged_count, 4);  // q and v of two layers
}

TEST_F(MergeTest, TensorsFileReplacesItsTensorsByteForByte) {
  const std::string name = "blk.1.ffn_down.weight";  // [ffn, hidden] in GGUF order
  std::vector<std::vector<float>> values;
  const std::string tensors = dir_ + "/tensors.gguf";
  ASSERT_TRUE(WriteTensors(tensors, {{name, {64, 32}}}, &values).ok());
  const std::string out = dir_ + "/merged.gguf";
  // Without --type every tensor keeps its (here f32) type.
  ASSERT_TRUE(Merge({tensors}, out).ok());

  auto res = gguf::File::Open(out);
  auto in = gguf::File::Open(base());
  ASSERT_TRUE(res.ok() && in.ok());
  for (const gguf::TensorInfo& t : (*in)->tensors()) {
    const gguf::TensorInfo* m = (*res)->FindTensor(t.name);
    ASSERT_NE(m, nullptr);
    if (t.name == name) {
      ASSERT_EQ(m->nbytes, values[0].size() * sizeof(float));
      EXPECT_EQ(std::memcmp(m->data, values[0].data(), m->nbytes), 0);
    } else {
      EXPECT_EQ(std::memcmp(m->data, t.data, t.nbytes), 0) << t.name;
    }
  }
  // The same logits as the base with that tensor overwritten in memory.
  LoadOptions options;
  options.f32_tensors = [&](std::string_view n) { return n == name; };
  auto edited = Load(base(), options);
  int copies = 0;
  edited->VisitParameters([&](const Parameter& p) {
    if (p.name != name) return;
    for (const ParameterLocation& loc : p.locations) {
      ASSERT_TRUE(loc.owned);
      std::memcpy(const_cast<void*>(loc.view.data), values[0].data(),
                  values[0].size() * sizeof(float));
      ++copies;
    }
  });
  ASSERT_EQ(copies, 1);
  const double diff = MaxAbsDiff(Logits(*edited), Logits(*Load(out)));
  std::printf("max |merged - edited in memory| = %.3g\n", diff);
  EXPECT_LT(diff, 1e-5);
}

TEST_F(MergeTest, DirectoryWithAdaptersAndTensorsOnTheSameMatrix) {
  // A run's directory: the replacement comes first, then the adapter on top of it.
  const std::string name = "blk.0.ffn_down.weight";
  WriteAdapters(base(), dir_ + "/adapters.gguf", {LoraTarget::kDown}, 9);
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(WriteTensors(dir_ + "/tensors.gguf", {{name, {64, 32}}}, &values).ok());
  auto files = TrainedFilesAt(dir_);
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(*files, (std::vector<std::string>{dir_ + "/adapters.gguf", dir_ + "/tensors.gguf"}));
  const std::string out = testing::TempDir() + "/merge_dir_" + std::to_string(getpid()) + ".gguf";
  ASSERT_TRUE(Merge(*files, out).ok());
  auto res = gguf::File::Open(out);
  ASSERT_TRUE(res.ok());
  const std::vector<double> expect = MergedInDouble(dir_ + "/adapters.gguf", name, values[0]);
  const std::vector<float> actual = F32(*(*res)->FindTensor(name));
  double d = 0;
  for (size_t i = 0; i < expect.size(); ++i) d = std::max(d, std::abs(expect[i] - actual[i]));
  EXPECT_LT(d, 1e-5);
  // Layer 1's down only carries the adapter.
  auto in = gguf::File::Open(base());
  const std::vector<double> expect1 =
      MergedInDouble(dir_ + "/adapters.gguf", "blk.1.ffn_down.weight",
                     F32(*(*in)->FindTensor("blk.1.ffn_down.weight")));
  const std::vector<float> actual1 = F32(*(*res)->FindTensor("blk.1.ffn_down.weight"));
  d = 0;
  for (size_t i = 0; i < expect1.size(); ++i) d = std::max(d, std::abs(expect1[i] - actual1[i]));
  EXPECT_LT(d, 1e-5);
  std::remove(out.c_str());

  std::filesystem::create_directories(dir_ + "/empty");
  auto none = TrainedFilesAt(dir_ + "/empty");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("adapters.gguf"), std::string::npos);
  EXPECT_EQ(TrainedFilesAt(dir_ + "/missing").status().code(), absl::StatusCode::kNotFound);
  auto one = TrainedFilesAt(dir_ + "/tensors.gguf");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, std::vector<std::string>{dir_ + "/tensors.gguf"});
}

TEST_F(MergeTest, BadTrainedFilesAreRefusedByNameAndLeaveNoOutput) {
  const std::string out = dir_ + "/merged.gguf";
  std::vector<std::vector<float>> values;
  auto refused = [&](const std::string& file, const std::vector<std::string>& words) {
    const absl::Status s = Merge({file}, out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    for (const std::string& w : words) {
      EXPECT_NE(s.message().find(w), std::string::npos) << "'" << w << "' not in: " << s;
    }
    ExpectNoOutput(out);
  };
  // Dims that differ from the base's.
  const std::string wrong_dims = dir_ + "/wrong_dims.gguf";
  ASSERT_TRUE(WriteTensors(wrong_dims, {{"blk.0.attn_q.weight", {16, 32}}}, &values).ok());
  refused(wrong_dims, {wrong_dims, "blk.0.attn_q.weight", "[16, 32]", "[32, 32]"});
  // A tensor the base lacks.
  const std::string unknown = dir_ + "/unknown.gguf";
  ASSERT_TRUE(WriteTensors(unknown, {{"blk.7.attn_q.weight", {32, 32}}}, &values).ok());
  refused(unknown, {unknown, "blk.7.attn_q.weight", "has no tensor"});
  // Neither an adapter nor a tensors file: a model, and a file of another general.type.
  refused(paths_[1], {paths_[1], "general.type"});
  const std::string other_type = dir_ + "/other_type.gguf";
  ASSERT_TRUE(WriteTensors(other_type, {{"blk.0.attn_q.weight", {32, 32}}}, &values, "model").ok());
  refused(other_type, {other_type, "general.type is 'model'"});
  // Adapters of the same family whose shapes fit no tensor of this base.
  const std::string other_lora =
      WriteAdapters(paths_[1], dir_ + "/other_lora.gguf", {LoraTarget::kQ}, 3);
  refused(other_lora, {other_lora, "blk.0.attn_q.weight", "[48, 48]", "[32, 32]"});
  // One tensor replaced by two files.
  const std::string t1 = dir_ + "/t1.gguf", t2 = dir_ + "/t2.gguf";
  ASSERT_TRUE(WriteTensors(t1, {{"blk.0.attn_q.weight", {32, 32}}}, &values).ok());
  ASSERT_TRUE(WriteTensors(t2, {{"blk.0.attn_q.weight", {32, 32}}}, &values).ok());
  const absl::Status twice = Merge({t1, t2}, out);
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find(t1), std::string::npos) << twice;
  ExpectNoOutput(out);
}

TEST_F(MergeTest, Q8ExportRequantizesEveryMatrix) {
  const std::string adapters = WriteAdapters(base(), dir_ + "/adapters.gguf",
                                             {LoraTarget::kQ, LoraTarget::kV}, 5);
  const std::string out = dir_ + "/merged_q8.gguf";
  ASSERT_TRUE(Merge({adapters}, out, "q8_0").ok());
  auto res = gguf::File::Open(out);
  ASSERT_TRUE(res.ok());
  int matrices = 0;
  for (const gguf::TensorInfo& t : (*res)->tensors()) {
    const bool matrix = t.dims.size() == 2 && t.name.find("_norm") == std::string::npos;
    EXPECT_EQ(t.type, matrix ? GgmlType::kQ8_0 : GgmlType::kF32) << t.name;
    matrices += matrix;
  }
  EXPECT_GE(matrices, 1 + 2 * 7);  // token_embd, and q k v o gate up down per layer
  EXPECT_EQ(*(*res)->Find("general.file_type")->AsUint(), 7u);  // llama.cpp's MOSTLY_Q8_0

  // The same bytes as `gguf quantize --type q8_0` of the f32 export: one merge, one rounding.
  const std::string f32_out = dir_ + "/merged_f32.gguf", quantized = dir_ + "/quantized.gguf";
  ASSERT_TRUE(Merge({adapters}, f32_out, "f32").ok());
  auto f32_file = gguf::File::Open(f32_out);
  ASSERT_TRUE(f32_file.ok());
  ASSERT_TRUE(gguf::QuantizeModel(**f32_file, quantized, *gguf::ParseQuantTarget("q8_0"), {},
                                  *pool_)
                  .ok());
  auto q = gguf::File::Open(quantized);
  ASSERT_TRUE(q.ok());
  for (const gguf::TensorInfo& t : (*q)->tensors()) {
    const gguf::TensorInfo* m = (*res)->FindTensor(t.name);
    ASSERT_TRUE(m != nullptr && m->type == t.type && m->nbytes == t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(m->data, t.data, t.nbytes), 0) << t.name;
  }

  auto adapted = Load(base());
  ASSERT_TRUE(adapted->LoadLora(adapters).ok());
  const double diff = MaxAbsDiff(Logits(*adapted), Logits(*Load(out)));
  // The error one q8_0 rounding gives this fixture: the base model's, quantized alone.
  const std::string base_q8 = dir_ + "/base_q8.gguf";
  auto base_file = gguf::File::Open(base());
  ASSERT_TRUE(base_file.ok());
  ASSERT_TRUE(gguf::QuantizeModel(**base_file, base_q8, *gguf::ParseQuantTarget("q8_0"), {},
                                  *pool_)
                  .ok());
  const double rounding = MaxAbsDiff(Logits(*Load(base())), Logits(*Load(base_q8)));
  std::printf("max |q8_0 merged - base+adapter (f32)| = %.3g (base alone: %.3g)\n", diff,
              rounding);
  EXPECT_LT(diff, 2 * rounding);  // merging adds no error beyond that rounding
  EXPECT_GT(diff, 0.0);           // it was quantized
  EXPECT_GT(MaxAbsDiff(Logits(*adapted), Logits(*Load(base()))), 10 * rounding);  // adapters matter
}

}  // namespace
}  // namespace fucina
