// Meta: family-prefixed typed getters, zero policy both ways, and messages naming the key.
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gguf/gguf.h"
#include "models/gguf/meta.h"
#include "models/gguf/writer.h"
#include "tests/models/gguf/gguf_test_util.h"

namespace fucina::gguf {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ScratchDir;

std::unique_ptr<File> WriteAndOpen(const ScratchDir& dir, const std::string& arch) {
  const std::string path = dir.File("meta.gguf");
  auto w = Writer::Create(path);
  EXPECT_TRUE(w.ok());
  Writer& wr = **w;
  if (!arch.empty()) wr.SetValue("general.architecture", Value::Str(arch));
  const std::string p = arch + ".";
  wr.SetValue(p + "block_count", Value::U32(28));
  wr.SetValue(p + "embedding_length", Value::U64(1024));
  wr.SetValue(p + "expert_count", Value::U32(0));
  wr.SetValue(p + "negative", Value::I32(-4));
  wr.SetValue(p + "signed_ok", Value::I16(16));
  wr.SetValue(p + "not_int", Value::Str("x"));
  wr.SetValue(p + "rope.freq_base", Value::F32(1e6f));
  wr.SetValue(p + "int_as_float", Value::U32(3));
  wr.SetValue(p + "flag", Value::Bool(true));
  wr.SetValue(p + "head_count_kv",
              Value::Array(ValueType::kUint32, {Value::U32(2), Value::U32(4), Value::U32(0)}));
  wr.SetValue("tokenizer.ggml.model", Value::Str("gpt2"));
  wr.SetValue("tokenizer.ggml.tokens", Value::StrArray({"<s>", "a"}));
  EXPECT_TRUE(wr.Finish().ok());
  auto f = File::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? *std::move(f) : nullptr;
}

TEST(Meta, PrefixedGetters) {
  ScratchDir dir;
  std::unique_ptr<File> f = WriteAndOpen(dir, "qwen3");
  ASSERT_NE(f, nullptr);
  auto m = Meta::ForFile(*f, ZeroPolicy::kRejectZero);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->arch(), "qwen3");
  EXPECT_EQ(*m->Int("block_count"), 28u);
  EXPECT_EQ(*m->Int("embedding_length"), 1024u);
  EXPECT_EQ(*m->Int("signed_ok"), 16u);
  EXPECT_EQ(**m->IntOpt("block_count"), 28u);
  EXPECT_FALSE(m->IntOpt("absent")->has_value());
  EXPECT_FLOAT_EQ(*m->Float("rope.freq_base"), 1e6f);
  EXPECT_FLOAT_EQ(*m->Float("int_as_float"), 3.0f);
  EXPECT_FALSE(m->FloatOpt("absent")->has_value());
  EXPECT_TRUE(*m->Bool("flag"));
  EXPECT_EQ(*m->String("tokenizer.ggml.model"), "gpt2");
  EXPECT_FALSE(m->StringOpt("absent")->has_value());
  EXPECT_EQ(*m->StringArray("tokenizer.ggml.tokens"), (std::vector<std::string>{"<s>", "a"}));
  EXPECT_EQ(*m->IntPerLayer("block_count", 3), (std::vector<uint64_t>{28, 28, 28}));
}

TEST(Meta, ZeroPolicy) {
  ScratchDir dir;
  std::unique_ptr<File> f = WriteAndOpen(dir, "qwen3");
  ASSERT_NE(f, nullptr);
  const Meta strict(*f, "qwen3", ZeroPolicy::kRejectZero);
  absl::StatusOr<uint64_t> zero = strict.Int("expert_count");
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(zero.status().message()),
              AllOf(HasSubstr("meta.gguf"), HasSubstr("'qwen3.expert_count' is 0")));
  // Optional keys may legitimately be zero under either policy.
  EXPECT_EQ(**strict.IntOpt("expert_count"), 0u);
  EXPECT_FALSE(strict.IntPerLayer("head_count_kv", 3).ok());

  const Meta lenient(*f, "qwen3", ZeroPolicy::kAcceptZero);
  EXPECT_EQ(*lenient.Int("expert_count"), 0u);
  EXPECT_EQ(*lenient.IntPerLayer("head_count_kv", 3), (std::vector<uint64_t>{2, 4, 0}));
  EXPECT_THAT(std::string(lenient.IntPerLayer("head_count_kv", 4).status().message()),
              HasSubstr("has 3 entries, expected 4"));
}

TEST(Meta, ErrorsNameTheKey) {
  ScratchDir dir;
  std::unique_ptr<File> f = WriteAndOpen(dir, "llama");
  ASSERT_NE(f, nullptr);
  const Meta m(*f, "llama", ZeroPolicy::kRejectZero);
  absl::StatusOr<uint64_t> missing = m.Int("attention.head_count");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              AllOf(HasSubstr("meta.gguf"), HasSubstr("'llama.attention.head_count' is missing")));
  EXPECT_THAT(std::string(m.Int("not_int").status().message()),
              HasSubstr("'llama.not_int' has type string, expected a non-negative integer"));
  EXPECT_THAT(std::string(m.Int("negative").status().message()),
              HasSubstr("'llama.negative' is -4"));
  EXPECT_THAT(std::string(m.IntOpt("not_int").status().message()), HasSubstr("llama.not_int"));
  EXPECT_THAT(std::string(m.Float("not_int").status().message()),
              HasSubstr("'llama.not_int' has type string, expected a number"));
  EXPECT_THAT(std::string(m.Float("absent").status().message()), HasSubstr("llama.absent"));
  EXPECT_THAT(std::string(m.Bool("block_count").status().message()),
              HasSubstr("'llama.block_count' has type uint32, expected bool"));
  EXPECT_THAT(std::string(m.String("llama.block_count").status().message()),
              HasSubstr("expected string"));
  EXPECT_THAT(std::string(m.String("general.nope").status().message()),
              HasSubstr("'general.nope' is missing"));
  EXPECT_THAT(std::string(m.StringArray("tokenizer.ggml.model").status().message()),
              HasSubstr("expected array of string"));
}

TEST(Meta, ForFileNeedsArchitecture) {
  ScratchDir dir;
  std::unique_ptr<File> f = WriteAndOpen(dir, "");
  ASSERT_NE(f, nullptr);
  auto m = Meta::ForFile(*f, ZeroPolicy::kAcceptZero);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("general.architecture"));
}

}  // namespace
}  // namespace fucina::gguf

namespace fucina::gguf {
namespace {

TEST(Meta, EachFamilyDeclaresItsZeroPolicy) {
  for (const char* arch : {"qwen3", "qwen3moe", "qwen35", "llama"}) {
    EXPECT_EQ(ZeroPolicyForArch(arch), ZeroPolicy::kRejectZero) << arch;
  }
  for (const char* arch : {"gemma3", "gemma4", "diffusion-gemma"}) {
    EXPECT_EQ(ZeroPolicyForArch(arch), ZeroPolicy::kAcceptZero) << arch;
  }
}

}  // namespace
}  // namespace fucina::gguf
