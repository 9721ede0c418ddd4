// Dequantization of blocks from a real, llama.cpp-produced GGUF (SmolLM2-135M-Instruct: Q8_0
// embeddings, Q4_1 layers) against ggml's numpy reference, bit for bit.
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/fp16.h"
#include "kernels/type_traits.h"
#include "models/gguf/gguf.h"
#include "tests/kernels/python_ref.h"

namespace fucina {
namespace {

TEST(RealBlocksTest, SmolLm2TensorsDequantizeLikeGgml) {
  FUCINA_SKIP_WITHOUT_PYTHON();
  const char* path = std::getenv("FUCINA_DEFAULT_MODEL");
  if (path == nullptr) GTEST_SKIP() << "FUCINA_DEFAULT_MODEL (the SmolLM2 GGUF) unset";
  auto file = gguf::File::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();

  int checked_types = 0;
  for (const char* name : {"token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight"}) {
    const gguf::TensorInfo* t = (*file)->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    const int64_t row = t->dims[0];
    // A slice of rows from the start and the end of the tensor keeps the comparison small.
    const int64_t rows = t->num_elements() / row;
    const int64_t take = std::min<int64_t>(rows, 48);
    const size_t row_bytes = RowBytes(t->type, row);
    for (int64_t first : {int64_t{0}, rows - take}) {
      const uint8_t* blocks = t->data + first * row_bytes;
      const size_t bytes = take * row_bytes;
      const std::vector<float> ref =
          testing_ref::Dequantize(std::string(TypeName(t->type)), blocks, bytes);
      ASSERT_EQ(ref.size(), static_cast<size_t>(take * row)) << name;
      std::vector<float> ours(take * row);
      GetCpuTraits(t->type)->to_float(blocks, ours.data(), take * row);
      for (size_t i = 0; i < ours.size(); ++i) {
        ASSERT_EQ(FloatToBits(ours[i]), FloatToBits(ref[i]))
            << name << " (" << TypeName(t->type) << ") element " << i << " of rows from " << first;
      }
    }
    ++checked_types;
  }
  EXPECT_EQ(checked_types, 3);
}

}  // namespace
}  // namespace fucina
