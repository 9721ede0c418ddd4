// The bound streams of `fucina bench kernels` read every byte and do each product once per
// head: on inputs whose sums are exact in f32, every SIMD level returns the scalar loop's value
// for every group size. A stream that skipped a block, a scale or a head would be a bound for
// less work than the kernels do.
#include "bench/stream_bounds.h"

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina::cli {
namespace {

std::vector<Isa> SimdLevels() {
  std::vector<Isa> levels;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (static_cast<int>(isa) <= static_cast<int>(DetectedIsa())) levels.push_back(isa);
  }
  return levels;
}

// nb blocks whose scales are 0.5, 1 or 2 and whose quants span `range` around 0: small enough
// that every partial sum of the value stream is a multiple of 0.5 below 2^23.
std::vector<BlockQ8_0> Blocks(int64_t nb, int range) {
  std::vector<BlockQ8_0> b(nb);
  const float scales[3] = {0.5f, 1.0f, 2.0f};
  uint32_t state = 12345;  // a small LCG: no pattern a wrong scale or quant could cancel in
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  for (int64_t i = 0; i < nb; ++i) {
    b[i].d = Fp32ToFp16(scales[next() % 3]);
    for (int j = 0; j < 32; ++j) {
      b[i].qs[j] = static_cast<int8_t>(static_cast<int>(next() % (2 * range + 1)) - range);
    }
  }
  return b;
}

TEST(StreamBoundsTest, EveryLevelComputesTheScalarStreams) {
  // 101 blocks: a multiple of no stream's step (8, 32 or 2 blocks), so every tail loop runs.
  constexpr int64_t kBlocks = 101;
  const std::vector<BlockQ8_0> keys = Blocks(kBlocks, 128);  // int32 sums: any quant is exact
  const std::vector<BlockQ8_0> values = Blocks(kBlocks, 15);
  std::vector<f16_t> halves(64 * 51);
  for (size_t i = 0; i < halves.size(); ++i) {
    halves[i] = Fp32ToFp16(0.5f * static_cast<float>(static_cast<int>((i * i + 7 * i) % 61) - 30));
  }
  for (Isa isa : SimdLevels()) {
    for (int heads = 1; heads <= 9; ++heads) {
      SCOPED_TRACE(testing::Message() << IsaName(isa) << ", " << heads << " heads");
      EXPECT_EQ(DotQ8_0Stream(keys.data(), kBlocks, heads, isa),
                DotQ8_0Stream(keys.data(), kBlocks, heads, Isa::kScalar));
      EXPECT_EQ(DequantQ8_0Stream(values.data(), kBlocks, heads, isa),
                DequantQ8_0Stream(values.data(), kBlocks, heads, Isa::kScalar));
      EXPECT_EQ(ConvertF16Stream(halves.data(), 64 * 51, heads, isa),
                ConvertF16Stream(halves.data(), 64 * 51, heads, Isa::kScalar));
    }
  }
}

TEST(StreamBoundsTest, EachHeadAddsItsProducts) {
  // Heads weigh 1, 2, ...: the scalar stream of h heads is (1 + ... + h) times one head's.
  const std::vector<BlockQ8_0> b = Blocks(40, 15);
  const float one = DequantQ8_0Stream(b.data(), 40, 1, Isa::kScalar);
  ASSERT_NE(one, 0.0f);
  for (int heads = 2; heads <= 8; ++heads) {
    EXPECT_EQ(DequantQ8_0Stream(b.data(), 40, heads, Isa::kScalar),
              one * static_cast<float>(heads * (heads + 1) / 2));
  }
  EXPECT_EQ(DequantQ8_0Stream(b.data(), 40, 12, Isa::kScalar),
            DequantQ8_0Stream(b.data(), 40, 8, Isa::kScalar));  // more than 8: measured as 8
}

}  // namespace
}  // namespace fucina::cli
