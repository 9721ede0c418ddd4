// Writer -> reader round trips: every value type (including nested arrays), every ggml tensor
// type with random shapes and bytes, custom alignment, writer-side validation, and split files.
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gguf/gguf.h"
#include "absl/strings/str_format.h"
#include "models/gguf/writer.h"
#include "tests/models/gguf/gguf_test_util.h"

namespace fucina::gguf {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

std::vector<std::pair<std::string, Value>> AllValueTypes() {
  std::vector<std::pair<std::string, Value>> kv = {
      {"t.u8", Value::U8(250)},
      {"t.i8", Value::I8(-7)},
      {"t.u16", Value::U16(65000)},
      {"t.i16", Value::I16(-32000)},
      {"t.u32", Value::U32(4000000000u)},
      {"t.i32", Value::I32(-2000000000)},
      {"t.f32", Value::F32(3.25f)},
      {"t.bool", Value::Bool(true)},
      {"t.str", Value::Str(std::string("utf8 \xE2\x82\xAC and a NUL \0 inside", 28))},
      {"t.empty_str", Value::Str("")},
      {"t.u64", Value::U64(UINT64_MAX)},
      {"t.i64", Value::I64(INT64_MIN)},
      {"t.f64", Value::F64(-1e300)},
      {"t.strs", Value::StrArray({"a", "", "ccc"})},
      {"t.f32s", Value::F32Array({1.5f, -0.0f, 1e-30f})},
      {"t.i32s", Value::I32Array({1, -2, 3})},
      {"t.empty_arr", Value::Array(ValueType::kUint16, {})},
      {"t.bools", Value::Array(ValueType::kBool, {Value::Bool(false), Value::Bool(true)})},
      {"t.nested",
       Value::Array(ValueType::kArray,
                    {Value::I32Array({1, 2}), Value::StrArray({"x"}),
                     Value::Array(ValueType::kArray, {Value::F32Array({0.5f})})})},
  };
  return kv;
}

TEST(GgufRoundTrip, EveryValueType) {
  ScratchDir dir;
  const std::string path = dir.File("values.gguf");
  auto w = Writer::Create(path);
  ASSERT_TRUE(w.ok()) << w.status();
  const auto kv = AllValueTypes();
  for (const auto& [k, v] : kv) (*w)->SetValue(k, v);
  ASSERT_TRUE((*w)->Finish().ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto f = File::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->alignment(), 32u);
  ASSERT_EQ((*f)->metadata().size(), kv.size());
  for (size_t i = 0; i < kv.size(); ++i) {
    EXPECT_EQ((*f)->metadata()[i].first, kv[i].first);  // File order preserved.
    EXPECT_EQ((*f)->metadata()[i].second, kv[i].second) << kv[i].first;
  }
  EXPECT_EQ(*(*f)->Find("t.i8")->AsInt(), -7);
  EXPECT_FALSE((*f)->Find("t.i8")->AsUint().has_value());
  EXPECT_EQ(*(*f)->Find("t.u64")->AsUint(), UINT64_MAX);
  EXPECT_FALSE((*f)->Find("t.u64")->AsInt().has_value());
  EXPECT_EQ(*(*f)->Find("t.u16")->AsFloat(), 65000.0);
  EXPECT_EQ((*f)->Find("t.nested")->AsArray()->items[2].AsArray()->items[0].AsArray()->elem_type,
            ValueType::kFloat32);
  EXPECT_EQ((*f)->Find("missing"), nullptr);
  EXPECT_TRUE((*f)->tensors().empty());
}

TEST(GgufRoundTrip, SetValueReplacesInPlace) {
  ScratchDir dir;
  auto w = Writer::Create(dir.File("r.gguf"));
  ASSERT_TRUE(w.ok());
  (*w)->SetValue("a", Value::U32(1));
  (*w)->SetValue("b", Value::U32(2));
  (*w)->SetValue("a", Value::Str("one"));
  ASSERT_TRUE((*w)->Finish().ok());
  auto f = File::Open(dir.File("r.gguf"));
  ASSERT_TRUE(f.ok());
  ASSERT_EQ((*f)->metadata().size(), 2u);
  EXPECT_EQ((*f)->metadata()[0].first, "a");
  EXPECT_EQ(*(*f)->metadata()[0].second.AsString(), "one");
}

TEST(GgufRoundTrip, DisplayStrings) {
  EXPECT_EQ(Value::U32(7).ToDisplayString(), "7");
  EXPECT_EQ(Value::I8(-3).ToDisplayString(), "-3");
  EXPECT_EQ(Value::Bool(false).ToDisplayString(), "false");
  EXPECT_EQ(Value::F32(0.5f).ToDisplayString(), "0.5");
  EXPECT_EQ(Value::Str("a\"b\n").ToDisplayString(), "\"a\\\"b\\n\"");
  EXPECT_EQ(Value::I32Array({1, 2, 3, 4}).ToDisplayString(2), "[1, 2, ... (4 items)]");
  EXPECT_EQ(Value::StrArray({"x"}).ToDisplayString(), "[\"x\"]");
  EXPECT_THAT(Value::Str(std::string(100, 'z')).ToDisplayString(), HasSubstr("(100 bytes)"));
  EXPECT_EQ(ValueTypeName(ValueType::kFloat64), "float64");
}

struct Declared {
  std::string name;
  std::vector<int64_t> dims;
  GgmlType type;
  std::vector<uint8_t> bytes;
};

// Every known ggml type, 1..4 random dims, random bytes, through both AddTensor flavours.
void RoundTripAllTypes(uint32_t alignment, uint32_t seed) {
  ScratchDir dir;
  const std::string path = dir.File("tensors.gguf");
  std::mt19937 rng(seed);
  std::vector<Declared> declared;
  for (uint32_t id = 0; id < 64; ++id) {
    const std::optional<GgmlTypeInfo> info = LookupGgmlType(id);
    if (!info) continue;
    Declared d{"tensor." + std::string(info->name), {}, static_cast<GgmlType>(id), {}};
    const int n_dims = 1 + static_cast<int>(rng() % 4);
    d.dims.push_back(info->block_size * (1 + rng() % 3));
    for (int k = 1; k < n_dims; ++k) d.dims.push_back(1 + rng() % 3);
    int64_t rows = 1;
    for (int k = 1; k < n_dims; ++k) rows *= d.dims[k];
    d.bytes.resize(RowBytes(d.type, d.dims[0]) * rows);
    for (uint8_t& b : d.bytes) b = static_cast<uint8_t>(rng());
    declared.push_back(std::move(d));
  }
  auto w = Writer::Create(path, alignment);
  ASSERT_TRUE(w.ok());
  (*w)->SetValue("general.architecture", Value::Str("test"));
  std::vector<int> fill_order;
  for (size_t i = 0; i < declared.size(); ++i) {
    const Declared& d = declared[i];
    if (i % 2 == 0) {
      ASSERT_TRUE((*w)->AddTensorBytes(d.name, d.dims, d.type, d.bytes).ok());
    } else {
      ASSERT_TRUE((*w)->AddTensor(d.name, d.dims, d.type,
                                  [&d, &fill_order, i](std::span<uint8_t> out) {
                                    fill_order.push_back(static_cast<int>(i));
                                    EXPECT_EQ(out.size(), d.bytes.size());
                                    std::copy(d.bytes.begin(), d.bytes.end(), out.begin());
                                    return absl::OkStatus();
                                  })
                      .ok());
    }
  }
  ASSERT_TRUE((*w)->Finish().ok());
  for (size_t k = 1; k < fill_order.size(); ++k) EXPECT_LT(fill_order[k - 1], fill_order[k]);

  auto f = File::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), alignment);
  if (alignment != 32) {
    EXPECT_EQ(*(*f)->Find("general.alignment")->AsUint(), alignment);
  }
  EXPECT_EQ((*f)->data_offset() % alignment, 0u);
  ASSERT_EQ((*f)->tensors().size(), declared.size());
  for (size_t i = 0; i < declared.size(); ++i) {
    const TensorInfo& t = (*f)->tensors()[i];
    EXPECT_EQ(t.name, declared[i].name);
    EXPECT_EQ(t.dims, declared[i].dims);
    EXPECT_EQ(t.type, declared[i].type);
    EXPECT_EQ(t.offset % alignment, 0u);
    EXPECT_EQ(t.split, 0u);
    ASSERT_EQ(t.nbytes, declared[i].bytes.size());
    EXPECT_TRUE(std::equal(t.data, t.data + t.nbytes, declared[i].bytes.begin())) << t.name;
    EXPECT_EQ((*f)->FindTensor(t.name), &t);
  }
}

TEST(GgufRoundTrip, EveryTensorTypeDefaultAlignment) {
  for (uint32_t seed = 1; seed <= 3; ++seed) RoundTripAllTypes(32, seed);
}
TEST(GgufRoundTrip, EveryTensorTypeCustomAlignment) {
  RoundTripAllTypes(64, 7);
  RoundTripAllTypes(1, 8);
}

TEST(GgufRoundTrip, FromBytesMatchesOpen) {
  ScratchDir dir;
  const std::string path = dir.File("m.gguf");
  auto w = Writer::Create(path);
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> bytes(18 * 2, 0x5a);
  ASSERT_TRUE((*w)->AddTensorBytes("q", {64}, GgmlType::kQ4_0, bytes).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto f = File::FromBytes(file, "copy");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->path(), "copy");
  EXPECT_EQ((*f)->file_size(), file.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*f)->tensors()[0].data) % 32, 0u);
  EXPECT_EQ((*f)->tensors()[0].data[17], 0x5a);
}

// Binding copies the matrices decode streams and releases the mapping's pages of them; the
// tensors must still read the same, and a file held as a copy (FromBytes) must not lose them.
TEST(GgufRoundTrip, ReleasedPagesReadTheSame) {
  ScratchDir dir;
  const std::string path = dir.File("m.gguf");
  auto w = Writer::Create(path);
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> bytes(64 * 4096);  // several pages of f32
  std::mt19937 rng(3);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE((*w)->AddTensorBytes("t", {16 * 4096}, GgmlType::kF32, bytes).ok());
  ASSERT_TRUE((*w)->Finish().ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto mapped = File::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  auto copy = File::FromBytes(file, "copy");
  ASSERT_TRUE(copy.ok()) << copy.status();
  for (const File* f : {mapped->get(), copy->get()}) {
    const TensorInfo& t = f->tensors()[0];
    ASSERT_EQ(std::vector<uint8_t>(t.data, t.data + bytes.size()), bytes);
    f->ReleasePages(t.data, bytes.size());
    f->ReleasePages(t.data + 100, 3 * 4096);  // an unaligned range: its whole pages only
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + bytes.size()), bytes) << f->path();
  }
}

TEST(GgufWriter, RejectsBadDeclarations) {
  ScratchDir dir;
  auto w = Writer::Create(dir.File("bad.gguf"));
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> bytes(64);
  Writer& wr = **w;
  EXPECT_THAT(wr.AddTensorBytes("", {4}, GgmlType::kF32, bytes).message(), HasSubstr("name"));
  EXPECT_THAT(wr.AddTensorBytes(std::string(65, 'n'), {4}, GgmlType::kF32, bytes).message(),
              HasSubstr("name"));
  EXPECT_THAT(wr.AddTensorBytes("z", {0}, GgmlType::kF32, bytes).message(),
              HasSubstr("positive"));
  EXPECT_THAT(wr.AddTensorBytes("z", {1, 1, 1, 1, 1}, GgmlType::kF32, bytes).message(),
              HasSubstr("1..4 dims"));
  EXPECT_THAT(wr.AddTensorBytes("z", {16}, GgmlType::kQ8_0, bytes).message(),
              HasSubstr("block size 32"));
  EXPECT_THAT(wr.AddTensorBytes("z", {8}, GgmlType::kF32, bytes).message(),
              HasSubstr("64 bytes given, its shape needs 32"));
  ASSERT_TRUE(wr.AddTensorBytes("z", {16}, GgmlType::kF32, bytes).ok());
  EXPECT_THAT(wr.AddTensorBytes("z", {16}, GgmlType::kF32, bytes).message(),
              HasSubstr("duplicate"));
  EXPECT_FALSE(Writer::Create(dir.File("x.gguf"), 48).ok());
}

TEST(GgufWriter, FailedFillLeavesNoFile) {
  ScratchDir dir;
  const std::string path = dir.File("fail.gguf");
  {
    auto w = Writer::Create(path);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->AddTensor("t", {4}, GgmlType::kF32, [](std::span<uint8_t>) {
                   return absl::DataLossError("source went away");
                 }).ok());
    absl::Status s = (*w)->Finish();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(GgufWriter, RejectsConflictingAlignmentKeyAndMalformedArrays) {
  ScratchDir dir;
  {
    auto w = Writer::Create(dir.File("a.gguf"), 64);
    ASSERT_TRUE(w.ok());
    (*w)->SetValue("general.alignment", Value::U32(32));
    EXPECT_THAT((*w)->Finish().message(), HasSubstr("general.alignment"));
  }
  {
    auto w = Writer::Create(dir.File("b.gguf"));
    ASSERT_TRUE(w.ok());
    (*w)->SetValue("mixed", Value::Array(ValueType::kUint8, {Value::U8(1), Value::U32(2)}));
    EXPECT_THAT((*w)->Finish().message(), HasSubstr("mixed"));
  }
}

// Split models: parts written with the writer and the split.* keys, reopened as one.
class GgufSplitTest : public ::testing::Test {
 protected:
  // Writes `n` parts of prefix "model" with 2 f32 tensors each; part k's tensors are filled
  // with byte k+1. Metadata only in part 0.
  void WriteParts(int n, int tensors_count_key, int bad_count_part = -1) {
    for (int k = 0; k < n; ++k) {
      auto w = Writer::Create(SplitPath(dir_.File("model"), k + 1, n));
      ASSERT_TRUE(w.ok());
      (*w)->SetValue("split.no", Value::U16(static_cast<uint16_t>(k)));
      const int count = k == bad_count_part ? n + 1 : n;
      (*w)->SetValue("split.count", Value::U16(static_cast<uint16_t>(count)));
      (*w)->SetValue("split.tensors.count", Value::I32(tensors_count_key));
      if (k == 0) (*w)->SetValue("general.architecture", Value::Str("llama"));
      for (int j = 0; j < 2; ++j) {
        const uint8_t fill = static_cast<uint8_t>(k + 1);
        ASSERT_TRUE((*w)->AddTensor(absl::StrFormat("blk.%d.w", 2 * k + j), {8, 1 + j},
                                    GgmlType::kF32,
                                    [fill](std::span<uint8_t> out) {
                                      std::fill(out.begin(), out.end(), fill);
                                      return absl::OkStatus();
                                    })
                        .ok());
      }
      ASSERT_TRUE((*w)->Finish().ok());
    }
  }
  ScratchDir dir_;
};

TEST_F(GgufSplitTest, MergesAllParts) {
  WriteParts(3, 6);
  for (int open_part : {1, 2, 3}) {
    auto f = File::Open(SplitPath(dir_.File("model"), open_part, 3));
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ((*f)->num_splits(), 3u);
    EXPECT_EQ((*f)->path(), SplitPath(dir_.File("model"), 1, 3));
    EXPECT_EQ(*(*f)->Find("general.architecture")->AsString(), "llama");
    ASSERT_EQ((*f)->tensors().size(), 6u);
    for (int i = 0; i < 6; ++i) {
      const TensorInfo* t = (*f)->FindTensor(absl::StrFormat("blk.%d.w", i));
      ASSERT_NE(t, nullptr);
      EXPECT_EQ(t->split, static_cast<uint32_t>(i / 2));
      EXPECT_EQ(t->nbytes, 32u * (1 + i % 2));
      EXPECT_EQ(t->data[0], i / 2 + 1);
      EXPECT_EQ(t->data[t->nbytes - 1], i / 2 + 1);
    }
  }
}

TEST_F(GgufSplitTest, MissingPartIsNotFound) {
  WriteParts(3, 6);
  std::filesystem::remove(SplitPath(dir_.File("model"), 3, 3));
  auto f = File::Open(SplitPath(dir_.File("model"), 1, 3));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("model-00003-of-00003.gguf"));
}

TEST_F(GgufSplitTest, InconsistentCountRejected) {
  WriteParts(3, 6, /*bad_count_part=*/1);
  auto f = File::Open(SplitPath(dir_.File("model"), 1, 3));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()),
              HasSubstr("model-00002-of-00003.gguf: key 'split.count' is 4, expected 3"));
}

TEST_F(GgufSplitTest, WrongTensorTotalRejected) {
  WriteParts(2, 5);
  auto f = File::Open(SplitPath(dir_.File("model"), 1, 2));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("split.tensors.count is 5"));
}

TEST_F(GgufSplitTest, PartsOutOfOrderRejected) {
  WriteParts(2, 4);
  // Swap the two parts' contents: part 1's file now says split.no = 1.
  const std::string p1 = SplitPath(dir_.File("model"), 1, 2);
  const std::string p2 = SplitPath(dir_.File("model"), 2, 2);
  std::filesystem::rename(p1, dir_.File("tmp"));
  std::filesystem::rename(p2, p1);
  std::filesystem::rename(dir_.File("tmp"), p2);
  auto f = File::Open(p1);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("'split.no' is 1, expected 0"));
}

TEST(GgufSplitPath, ParsesAndFormats) {
  std::string prefix;
  uint32_t part = 0, count = 0;
  ASSERT_TRUE(ParseSplitPath("dir/m-00002-of-00005.gguf", &prefix, &part, &count));
  EXPECT_EQ(prefix, "dir/m");
  EXPECT_EQ(part, 2u);
  EXPECT_EQ(count, 5u);
  EXPECT_EQ(SplitPath(prefix, 2, 5), "dir/m-00002-of-00005.gguf");
  EXPECT_FALSE(ParseSplitPath("m-00006-of-00005.gguf", &prefix, &part, &count));
  EXPECT_FALSE(ParseSplitPath("m-0000a-of-00005.gguf", &prefix, &part, &count));
  EXPECT_FALSE(ParseSplitPath("m.gguf", &prefix, &part, &count));
}

}  // namespace
}  // namespace fucina::gguf
