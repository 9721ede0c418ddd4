// Reads the real SmolLM2-135M-Instruct Q4_1 file when it is in the model cache
// ($FUCINA_CACHE/models, default ~/.cache/fucina/models); skipped otherwise.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "models/gguf/gguf.h"
#include "models/gguf/meta.h"

namespace fucina::gguf {
namespace {

std::string SmolLm2Path() {
  std::string cache;
  if (const char* c = std::getenv("FUCINA_CACHE"); c != nullptr && *c != '\0') {
    cache = c;
  } else if (const char* h = std::getenv("HOME"); h != nullptr) {
    cache = std::string(h) + "/.cache/fucina";
  }
  return cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GgufSmolLm2, ReadsRealFile) {
  const std::string path = SmolLm2Path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "model not in the cache: " << path;
  auto f = File::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const File& file = **f;
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.alignment(), 32u);
  auto m = Meta::ForFile(file, ZeroPolicy::kRejectZero);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->arch(), "llama");
  EXPECT_EQ(*m->Int("block_count"), 30u);
  EXPECT_EQ(*m->Int("embedding_length"), 576u);
  EXPECT_EQ(*m->Int("attention.head_count"), 9u);
  EXPECT_EQ(*m->Int("attention.head_count_kv"), 3u);
  EXPECT_EQ(m->StringArray("tokenizer.ggml.tokens")->size(), 49152u);

  // 30 blocks x 9 tensors (4 attention, 3 FFN, 2 norms) + token_embd + output_norm.
  EXPECT_EQ(file.tensors().size(), 30u * 9 + 2);
  const TensorInfo* embd = file.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(embd->offset, 0u);
  EXPECT_EQ(file.data_offset() % 32, 0u);
  uint64_t total = 0;
  const uint8_t* base = embd->data - embd->offset;
  for (const TensorInfo& t : file.tensors()) {
    const int64_t rows = t.num_elements() / t.dims[0];
    EXPECT_EQ(static_cast<int64_t>(t.nbytes), RowBytes(t.type, t.dims[0]) * rows);
    EXPECT_EQ(t.data, base + t.offset);
    EXPECT_LE(file.data_offset() + t.offset + t.nbytes, file.file_size());
    total += t.nbytes;
  }
  // Tensors plus alignment padding fill the data section.
  EXPECT_LE(total, file.file_size() - file.data_offset());
  EXPECT_GT(total, (file.file_size() - file.data_offset()) * 99 / 100);
}

}  // namespace
}  // namespace fucina::gguf
