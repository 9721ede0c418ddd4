// Tests for kernels/quant/legacy.h: the scalar references against ggml's numpy implementation
// (PyPI gguf, via tests/kernels/gguf_*_ref.py) and hand-computed blocks, round-trip error
// bounds, and every SIMD path available on this CPU against the scalar references.
#include "kernels/quant/legacy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "tests/kernels/python_ref.h"
#include "tests/kernels/simd_isas.h"

namespace fucina {
namespace {

// ---- Function tables: one per ISA, so every test runs the same code against each path. ----

struct LegacyFns {
  decltype(&ConvertF32ToF16) f32_to_f16;
  decltype(&ConvertF16ToF32) f16_to_f32;
  decltype(&ConvertBf16ToF32) bf16_to_f32;
  decltype(&QuantizeRowQ8_0) quantize_q8_0;
  decltype(&QuantizeRowQ8_1) quantize_q8_1;
  decltype(&VecDotF32) dot_f32;
  decltype(&VecDotF16F32) dot_f16;
  decltype(&VecDotBf16F32) dot_bf16;
  decltype(&VecDotQ4_0Q8_0) dot_q4_0;
  decltype(&VecDotQ4_1Q8_1) dot_q4_1;
  decltype(&VecDotQ5_0Q8_0) dot_q5_0;
  decltype(&VecDotQ5_1Q8_1) dot_q5_1;
  decltype(&VecDotQ8_0Q8_0) dot_q8_0;
};

#define FUCINA_LEGACY_FNS(ns)                                                                 \
  LegacyFns {                                                                                 \
    ns::ConvertF32ToF16, ns::ConvertF16ToF32, ns::ConvertBf16ToF32, ns::QuantizeRowQ8_0,      \
        ns::QuantizeRowQ8_1, ns::VecDotF32, ns::VecDotF16F32, ns::VecDotBf16F32,              \
        ns::VecDotQ4_0Q8_0, ns::VecDotQ4_1Q8_1, ns::VecDotQ5_0Q8_0, ns::VecDotQ5_1Q8_1,       \
        ns::VecDotQ8_0Q8_0                                                                    \
  }

const LegacyFns& Fns(Isa isa) {
  static const LegacyFns kScalar = FUCINA_LEGACY_FNS(fucina);
  static const LegacyFns kAvx2 = FUCINA_LEGACY_FNS(fucina::avx2);
  static const LegacyFns kAvx512 = FUCINA_LEGACY_FNS(fucina::avx512);
  switch (isa) {
    case Isa::kAvx2: return kAvx2;
    case Isa::kAvx512: return kAvx512;
    default: return kScalar;
  }
}

// ---- Data. ----

// Roughly normal values with a per-block magnitude spread over 5 decades, so scales cover
// normal f16 values far from the limits; a few blocks get one large outlier.
std::vector<float> RandomRow(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 2.0f);
  std::vector<float> x(n);
  for (int64_t b = 0; b < n; b += 32) {
    const float scale = std::pow(10.0f, exponent(rng));
    for (int64_t j = b; j < std::min(n, b + 32); ++j) x[j] = scale * normal(rng);
    if (rng() % 4 == 0 && b < n) x[b + rng() % std::min<int64_t>(32, n - b)] *= 9.0f;
  }
  return x;
}

// Blocks whose x * id lands exactly on k + 0.5 (d a power of two): roundf's ties.
std::vector<float> TieRow(int64_t n) {
  std::vector<float> x(n);
  for (int64_t j = 0; j < n; ++j) {
    const float unit = std::ldexp(1.0f, static_cast<int>(j / 32 % 7) - 3);  // d = unit.
    const float magnitude = (j % 32 == 0) ? 127.0f : static_cast<float>(j * 7 % 126) + 0.5f;
    x[j] = ((j / 3) % 2 ? -magnitude : magnitude) * unit;
  }
  return x;
}

uint16_t& ScaleField(BlockQ4_0& b) { return b.d; }
uint16_t& ScaleField(BlockQ4_1& b) { return b.d; }
uint16_t& ScaleField(BlockQ5_0& b) { return b.d; }
uint16_t& ScaleField(BlockQ5_1& b) { return b.d; }
uint16_t& ScaleField(BlockQ8_0& b) { return b.d; }

// Blocks with arbitrary quant bytes and extreme f16 scales (and mins): zero, negative zero,
// negative, the smallest and largest subnormal, the largest finite; plus all-ones quants
// (max nibbles, every 5th bit set) and all-zero quants.
template <typename Block>
std::vector<Block> ExtremeBlocks(uint32_t seed) {
  const uint16_t scales[] = {0x0000, 0x8000, 0xBC00, 0x3800, 0x0001, 0x03FF, 0x83FF,
                             0x0400, 0x7BFF, 0xFBFF, 0x2E66, 0xB1EC};
  std::mt19937 rng(seed);
  std::vector<Block> blocks;
  for (int variant = 0; variant < 3; ++variant) {
    for (uint16_t d : scales) {
      Block b;
      auto* bytes = reinterpret_cast<uint8_t*>(&b);
      for (size_t k = 0; k < sizeof(Block); ++k) {
        bytes[k] = variant == 0 ? static_cast<uint8_t>(rng()) : (variant == 1 ? 0xFF : 0x00);
      }
      ScaleField(b) = d;
      if constexpr (std::is_same_v<Block, BlockQ4_1> || std::is_same_v<Block, BlockQ5_1>) {
        b.m = scales[rng() % std::size(scales)];
      }
      blocks.push_back(b);
    }
  }
  return blocks;
}

// ---- Comparison helpers. ----

// Element i of two f32 arrays must have identical bits (NaNs: both NaN).
void ExpectSameFloats(const float* a, const float* b, int64_t n, const std::string& what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool same = FloatToBits(a[i]) == FloatToBits(b[i]) || (std::isnan(a[i]) && std::isnan(b[i]));
    if (!same && bad++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: " << a[i] << " (0x" << std::hex << FloatToBits(a[i])
                    << ") vs " << b[i] << " (0x" << FloatToBits(b[i]) << std::dec << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

// Largest |d32 - d16| when a scale d32 is stored as the half d16: half an ulp, which is
// relative (2^-11) for normal halves and absolute (2^-25) for subnormal ones.
double F16ScaleError(float d16) { return std::max(std::fabs(d16) * 0x1p-11, 0x1p-25); }

// ---- Per-type traits of the weight formats. ----

// kLevels: q in [0, kLevels) (symmetric formats: x = d * (q - kLevels / 2)); Q8_0's
// q in [-127, 127] is written as 255 levels.
#define FUCINA_WEIGHT_FORMAT(F, asymmetric, levels)       \
  struct F##T {                                           \
    using Block = Block##F;                               \
    static constexpr const char* kName = #F;              \
    static constexpr auto kQuantize = QuantizeRow##F;     \
    static constexpr auto kDequantize = DequantizeRow##F; \
    static constexpr bool kAsymmetric = asymmetric;       \
    static constexpr int kLevels = levels;                \
  }
FUCINA_WEIGHT_FORMAT(Q4_0, false, 16);
FUCINA_WEIGHT_FORMAT(Q4_1, true, 16);
FUCINA_WEIGHT_FORMAT(Q5_0, false, 32);
FUCINA_WEIGHT_FORMAT(Q5_1, true, 32);
FUCINA_WEIGHT_FORMAT(Q8_0, false, 255);

template <typename T>
class WeightFormatTest : public ::testing::Test {};
using WeightFormats = ::testing::Types<Q4_0T, Q4_1T, Q5_0T, Q5_1T, Q8_0T>;
class FormatName {
 public:
  template <typename T>
  static std::string GetName(int) { return T::kName; }
};
TYPED_TEST_SUITE(WeightFormatTest, WeightFormats, FormatName);

// Dequantization is exact in f32, so ours and numpy's must agree bit for bit, on blocks from
// our quantizer and on hand-built extreme blocks.
TYPED_TEST(WeightFormatTest, DequantizeMatchesPythonReference) {
  FUCINA_SKIP_WITHOUT_PYTHON();
  using Block = typename TypeParam::Block;
  const int64_t n = 32 * 64;
  std::vector<Block> blocks(n / 32);
  TypeParam::kQuantize(RandomRow(n, 11).data(), blocks.data(), n);
  const std::vector<Block> extreme = ExtremeBlocks<Block>(12);
  blocks.insert(blocks.end(), extreme.begin(), extreme.end());
  const int64_t total = static_cast<int64_t>(blocks.size()) * 32;

  const std::vector<uint8_t> ref =
      testing_ref::RunScript("gguf_dequant_ref.py", TypeParam::kName, blocks);
  ASSERT_EQ(ref.size(), static_cast<size_t>(total) * sizeof(float));
  std::vector<float> ours(total);
  TypeParam::kDequantize(blocks.data(), ours.data(), total);
  ExpectSameFloats(ours.data(), reinterpret_cast<const float*>(ref.data()), total, "dequantize");
}

// ggml's reference quantizers are deterministic; gguf's numpy port must produce our bytes.
TYPED_TEST(WeightFormatTest, QuantizeMatchesPythonReference) {
  FUCINA_SKIP_WITHOUT_PYTHON();
  using Block = typename TypeParam::Block;
  const int64_t n = 32 * 512;
  const std::vector<float> x = RandomRow(n, 21);
  std::vector<Block> ours(n / 32);
  TypeParam::kQuantize(x.data(), ours.data(), n);
  const std::vector<uint8_t> ref =
      testing_ref::RunScript("gguf_quantize_ref.py", TypeParam::kName, x);
  ASSERT_EQ(ref.size(), ours.size() * sizeof(Block));
  int64_t bad_blocks = 0;
  for (size_t b = 0; b < ours.size(); ++b) {
    if (std::memcmp(&ours[b], ref.data() + b * sizeof(Block), sizeof(Block)) != 0) {
      if (bad_blocks++ < 3) ADD_FAILURE() << TypeParam::kName << " block " << b << " differs";
    }
  }
  EXPECT_EQ(bad_blocks, 0);
}

// Quantize -> dequantize error bound per element, with d and m the stored (f16) values:
//   symmetric (Q4_0, Q5_0, Q8_0): |x - x'| <= |d| / 2, except Q4_0/Q5_0 elements above the
//     top level (x / d > levels/2 - 1/2 with the sign of the extreme opposite), clamped:
//     <= |d|;
//   asymmetric (Q4_1, Q5_1): |x - x'| <= d / 2 + |m - min| (m is min rounded to f16);
// plus the f16 rounding of d (F16ScaleError) times the largest |q|, and 1e-6 of the block's
// amax for the f32 products.
TYPED_TEST(WeightFormatTest, RoundTripWithinFormatBound) {
  using Block = typename TypeParam::Block;
  const int64_t n = 32 * 256;
  const std::vector<float> x = RandomRow(n, 31);
  std::vector<Block> blocks(n / 32);
  std::vector<float> y(n);
  TypeParam::kQuantize(x.data(), blocks.data(), n);
  TypeParam::kDequantize(blocks.data(), y.data(), n);
  double worst_ratio = 0.0;  // max |x - x'| / |d| seen.
  for (int64_t b = 0; b < n / 32; ++b) {
    const float d = Fp16ToFp32(blocks[b].d);
    float amax = 0.0f, min = x[b * 32];
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(x[b * 32 + j]));
      min = std::min(min, x[b * 32 + j]);
    }
    ASSERT_GT(std::fabs(d), 0.0f);
    double offset_error = 0.0;
    int max_q = TypeParam::kLevels / 2;
    if constexpr (TypeParam::kAsymmetric) {
      offset_error = std::fabs(Fp16ToFp32(blocks[b].m) - min);
      max_q = TypeParam::kLevels - 1;
    }
    for (int j = 0; j < 32; ++j) {
      const float xi = x[b * 32 + j];
      const bool clamped = !TypeParam::kAsymmetric && TypeParam::kLevels < 255 &&
                           xi / d > TypeParam::kLevels / 2 - 0.5f;
      const double step = clamped ? std::fabs(d) : std::fabs(d) / 2;
      const double bound = step + offset_error + max_q * F16ScaleError(d) + 1e-6 * amax;
      const double err = std::fabs(static_cast<double>(xi) - y[b * 32 + j]);
      ASSERT_LE(err, bound) << TypeParam::kName << " block " << b << " element " << j
                            << " x=" << xi << " x'=" << y[b * 32 + j] << " d=" << d;
      worst_ratio = std::max(worst_ratio, err / std::fabs(d));
    }
  }
  ::testing::Test::RecordProperty("worst_error_over_d", testing::PrintToString(worst_ratio));
  EXPECT_GT(worst_ratio, 0.0);  // The data is not exactly representable.
}

// ---- Hand-computed blocks. ----

TEST(LegacyHandComputed, Q4_0) {
  BlockQ4_0 b{};
  b.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  DequantizeRowQ4_0(&b, y, 32);
  EXPECT_EQ(y[0], -4.0f);   // (0 - 8) * 0.5
  EXPECT_EQ(y[9], 0.5f);    // (9 - 8) * 0.5
  EXPECT_EQ(y[15], 3.5f);   // (15 - 8) * 0.5
  EXPECT_EQ(y[16], 3.5f);   // high nibble of qs[0] = 15
  EXPECT_EQ(y[31], -4.0f);  // high nibble of qs[15] = 0
}

TEST(LegacyHandComputed, Q4_1) {
  BlockQ4_1 b{};
  b.d = 0x4000;  // 2
  b.m = 0xC400;  // -4
  std::memset(b.qs, 0x3A, sizeof(b.qs));  // low 10, high 3
  float y[32];
  DequantizeRowQ4_1(&b, y, 32);
  EXPECT_EQ(y[0], 16.0f);  // 10 * 2 - 4
  EXPECT_EQ(y[16], 2.0f);  // 3 * 2 - 4
}

TEST(LegacyHandComputed, Q5_0AndQ5_1) {
  BlockQ5_0 b{};
  b.d = 0xBC00;  // -1
  std::memset(b.qs, 0x21, sizeof(b.qs));  // low 1, high 2
  const uint32_t qh = 0x80000001u;        // 5th bit of elements 0 and 31.
  std::memcpy(b.qh, &qh, 4);
  float y[32];
  DequantizeRowQ5_0(&b, y, 32);
  EXPECT_EQ(y[0], -1.0f);   // (17 - 16) * -1
  EXPECT_EQ(y[1], 15.0f);   // (1 - 16) * -1
  EXPECT_EQ(y[16], 14.0f);  // (2 - 16) * -1
  EXPECT_EQ(y[31], -2.0f);  // (18 - 16) * -1

  BlockQ5_1 c{};
  c.d = 0x3400;  // 0.25
  c.m = 0x3C00;  // 1
  std::memset(c.qs, 0xFF, sizeof(c.qs));
  std::memcpy(c.qh, &qh, 4);
  DequantizeRowQ5_1(&c, y, 32);
  EXPECT_EQ(y[0], 8.75f);   // 31 * 0.25 + 1
  EXPECT_EQ(y[1], 4.75f);   // 15 * 0.25 + 1
  EXPECT_EQ(y[31], 8.75f);
}

TEST(LegacyHandComputed, Q8_0QuantizeAndDot) {
  // amax = 127 / 8, so d = 1/8 and id = 8 exactly: x * id below is exact, ties included.
  float x[32] = {};
  x[0] = 15.875f;    // 127
  x[1] = -7.9375f;   // -63.5: roundf -> -64 (half away from zero)
  x[2] = 0.0625f;    // 0.5 -> 1
  x[3] = -0.0625f;   // -0.5 -> -1
  x[4] = 0.1875f;    // 1.5 -> 2
  BlockQ8_0 b;
  QuantizeRowQ8_0(x, &b, 32);
  EXPECT_EQ(Fp16ToFp32(b.d), 0.125f);
  EXPECT_THAT(std::vector<int>(b.qs, b.qs + 6), ::testing::ElementsAre(127, -64, 1, -1, 2, 0));
  BlockQ8_1 c;
  QuantizeRowQ8_1(x, &c, 32);
  EXPECT_EQ(Fp16ToFp32(c.s), (127 - 64 + 1 - 1 + 2) * 0.125f);
  // x . x: (127^2 + 64^2 + 1 + 1 + 4) / 64.
  EXPECT_EQ(VecDotQ8_0Q8_0(32, &b, &b), (127.0f * 127 + 64 * 64 + 6) / 64);
}

TEST(LegacyHandComputed, Q4_0QuantizeUsesSignedMax) {
  float x[32] = {};
  x[5] = -2.0f;  // Largest magnitude, negative: d = -2 / -8 = 0.25 and x[5] -> q = 0.
  x[6] = 1.0f;   // 1 / 0.25 = 4 -> q = 12.
  BlockQ4_0 b;
  QuantizeRowQ4_0(x, &b, 32);
  EXPECT_EQ(Fp16ToFp32(b.d), 0.25f);
  EXPECT_EQ(b.qs[5] & 0x0F, 0);
  EXPECT_EQ(b.qs[6] & 0x0F, 12);
  EXPECT_EQ(b.qs[0] & 0x0F, 8);  // zero -> the middle level.
}

// ---- Dots of the quantized pairs. ----

#define SKIP_WITHOUT_SIMD() \
  if (SimdIsas().empty()) GTEST_SKIP() << "this CPU has no AVX2/AVX-512 path to test"

#define FUCINA_DOT_PAIR(XT, YT, dot_member)             \
  struct Dot##XT {                                      \
    using X = Block##XT;                                \
    using Y = Block##YT;                                \
    static constexpr const char* kName = #XT "x" #YT;   \
    static constexpr auto kQuantizeX = QuantizeRow##XT; \
    static constexpr auto kDequantizeX = DequantizeRow##XT; \
    static constexpr auto kDot = &LegacyFns::dot_member; \
  }
FUCINA_DOT_PAIR(Q4_0, Q8_0, dot_q4_0);
FUCINA_DOT_PAIR(Q4_1, Q8_1, dot_q4_1);
FUCINA_DOT_PAIR(Q5_0, Q8_0, dot_q5_0);
FUCINA_DOT_PAIR(Q5_1, Q8_1, dot_q5_1);
FUCINA_DOT_PAIR(Q8_0, Q8_0, dot_q8_0);

void QuantizeY(const float* a, BlockQ8_0* y, int64_t n) { QuantizeRowQ8_0(a, y, n); }
void QuantizeY(const float* a, BlockQ8_1* y, int64_t n) { QuantizeRowQ8_1(a, y, n); }

template <typename Y>
int QuantSum(const Y& y) {
  int sum = 0;
  for (int8_t q : y.qs) sum += q;
  return sum;
}

// The _1 dots use m_x * s_y where the dequantized product has m_x * d_y * sum(q_y); this is
// that (signed) difference for one block, zero for the symmetric formats.
template <typename X, typename Y>
double OffsetMismatch(const X& x, const Y& y) {
  if constexpr (std::is_same_v<Y, BlockQ8_1>) {
    return static_cast<double>(Fp16ToFp32(x.m)) *
           (Fp16ToFp32(y.s) - static_cast<double>(Fp16ToFp32(y.d)) * QuantSum(y));
  } else {
    return 0.0;
  }
}

template <typename P>
struct DotCase {
  std::vector<typename P::X> x;
  std::vector<typename P::Y> y;
  std::vector<float> activations;  // What y quantizes (empty for raw blocks).
  std::vector<float> deq_x, deq_y;
  double exact = 0;     // sum(deq_x * deq_y) + sum of OffsetMismatch: what the dot computes.
  double sum_abs = 0;   // sum |deq_x * deq_y| + sum |m_x * s_y|: scale of rounding errors.
  double offset_abs = 0;  // sum |OffsetMismatch|.
};

// From the quantizers (raw = false), or arbitrary blocks (raw = true): random quant bytes
// (Q8_0 weights include -128; activations [-127, 127] unless full_range_y) and random
// normal f16 scales of both signs for x, positive for y.
template <typename P>
DotCase<P> MakeDotCase(int64_t n, uint32_t seed, bool raw, bool full_range_y = false) {
  DotCase<P> c;
  const int64_t nb = n / 32;
  c.x.resize(nb);
  c.y.resize(nb);
  if (!raw) {
    const std::vector<float> w = RandomRow(n, seed);
    c.activations = RandomRow(n, seed + 1);
    P::kQuantizeX(w.data(), c.x.data(), n);
    QuantizeY(c.activations.data(), c.y.data(), n);
  } else {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> exponent(-8.0f, 2.0f);
    auto scale = [&](bool any_sign) {
      const float v = std::exp2(exponent(rng));
      return Fp32ToFp16(any_sign && rng() % 2 ? -v : v);
    };
    for (int64_t b = 0; b < nb; ++b) {
      auto* bytes = reinterpret_cast<uint8_t*>(&c.x[b]);
      for (size_t k = 0; k < sizeof(typename P::X); ++k) bytes[k] = static_cast<uint8_t>(rng());
      c.x[b].d = scale(true);
      if constexpr (std::is_same_v<typename P::Y, BlockQ8_1>) c.x[b].m = scale(true);
      c.y[b].d = scale(false);
      for (int8_t& q : c.y[b].qs) {
        q = static_cast<int8_t>(full_range_y ? static_cast<int>(rng() % 256) - 128
                                             : static_cast<int>(rng() % 255) - 127);
      }
      if constexpr (std::is_same_v<typename P::Y, BlockQ8_1>) {
        c.y[b].s = Fp32ToFp16(Fp16ToFp32(c.y[b].d) * QuantSum(c.y[b]));
      }
    }
  }
  c.deq_x.resize(n);
  c.deq_y.resize(n);
  P::kDequantizeX(c.x.data(), c.deq_x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    c.deq_y[i] = Fp16ToFp32(c.y[i / 32].d) * c.y[i / 32].qs[i % 32];
    c.exact += static_cast<double>(c.deq_x[i]) * c.deq_y[i];
    c.sum_abs += std::fabs(static_cast<double>(c.deq_x[i]) * c.deq_y[i]);
  }
  for (int64_t b = 0; b < nb; ++b) {
    const double mismatch = OffsetMismatch(c.x[b], c.y[b]);
    c.exact += mismatch;
    c.offset_abs += std::fabs(mismatch);
    if constexpr (std::is_same_v<typename P::Y, BlockQ8_1>) {
      c.sum_abs += std::fabs(static_cast<double>(Fp16ToFp32(c.x[b].m)) * Fp16ToFp32(c.y[b].s));
    }
  }
  return c;
}

template <typename P>
class QuantDotTest : public ::testing::Test {};
using QuantDots = ::testing::Types<DotQ4_0, DotQ4_1, DotQ5_0, DotQ5_1, DotQ8_0>;
TYPED_TEST_SUITE(QuantDotTest, QuantDots, FormatName);

constexpr int64_t kDotSizes[] = {32, 64, 96, 32 * 7, 4096, 4096 + 32};
// f32 accumulation of at most 129 block terms: error <= ~129 * 2^-24 * sum|terms| < 1e-5.
constexpr double kDotRelTolerance = 1e-5;

// The scalar dot computes sum_b d_x d_y sum(q_x q_y) (+ m_x s_y) in f32: it must match the
// double-precision dot of the dequantized blocks (with the s_y convention) to f32 rounding.
TYPED_TEST(QuantDotTest, ScalarMatchesDequantizedDot) {
  for (bool raw : {false, true}) {
    for (int64_t n : kDotSizes) {
      const DotCase<TypeParam> c = MakeDotCase<TypeParam>(n, static_cast<uint32_t>(n), raw);
      const float dot = (Fns(Isa::kScalar).*TypeParam::kDot)(n, c.x.data(), c.y.data());
      EXPECT_NEAR(dot, c.exact, kDotRelTolerance * c.sum_abs) << "n=" << n << " raw=" << raw;
    }
  }
}

// Against the f32 activations themselves the only extra error is the activations'
// quantization: |a - d16 q| <= d32 / 2 + 127 |d32 - d16| per element (RN in f32, then d's
// f16 rounding e), i.e. <= (d16 + e) / 2 + 127 e, weighted by |deq_x|, plus the s_y mismatch
// for the _1 formats.
TYPED_TEST(QuantDotTest, ScalarWithinActivationQuantizationError) {
  for (int64_t n : kDotSizes) {
    const DotCase<TypeParam> c = MakeDotCase<TypeParam>(n, static_cast<uint32_t>(n) + 7, false);
    double reference = 0, bound = kDotRelTolerance * c.sum_abs + c.offset_abs;
    for (int64_t i = 0; i < n; ++i) {
      reference += static_cast<double>(c.deq_x[i]) * c.activations[i];
      const float d = Fp16ToFp32(c.y[i / 32].d);
      const double e = F16ScaleError(d);
      bound += std::fabs(c.deq_x[i]) * ((d + e) / 2 + 127 * e);
    }
    const float dot = (Fns(Isa::kScalar).*TypeParam::kDot)(n, c.x.data(), c.y.data());
    EXPECT_NEAR(dot, reference, bound) << "n=" << n;
    EXPECT_NE(dot, reference) << "n=" << n << ": activations quantized losslessly?";
  }
}

TYPED_TEST(QuantDotTest, SimdMatchesScalar) {
  SKIP_WITHOUT_SIMD();
  for (Isa isa : SimdIsas()) {
    double worst = 0;
    for (bool raw : {false, true}) {
      for (int64_t n : kDotSizes) {
        const DotCase<TypeParam> c = MakeDotCase<TypeParam>(n, static_cast<uint32_t>(n) + 3, raw);
        const float scalar = (Fns(Isa::kScalar).*TypeParam::kDot)(n, c.x.data(), c.y.data());
        const float simd = (Fns(isa).*TypeParam::kDot)(n, c.x.data(), c.y.data());
        EXPECT_NEAR(simd, scalar, kDotRelTolerance * c.sum_abs)
            << IsaName(isa) << " n=" << n << " raw=" << raw;
        worst = std::max(worst, std::fabs(static_cast<double>(simd) - scalar) / c.sum_abs);
      }
    }
    ::testing::Test::RecordProperty(std::string("worst_rel_error_") + std::string(IsaName(isa)),
                                    testing::PrintToString(worst));
  }
}

// The AVX-512 dots use an offset identity instead of the sign trick: exact for q_y = -128.
TYPED_TEST(QuantDotTest, Avx512ExactForFullRangeActivations) {
  if (DetectedIsa() != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  for (int64_t n : kDotSizes) {
    const DotCase<TypeParam> c = MakeDotCase<TypeParam>(n, static_cast<uint32_t>(n) + 5, true, true);
    const float scalar = (Fns(Isa::kScalar).*TypeParam::kDot)(n, c.x.data(), c.y.data());
    const float simd = (Fns(Isa::kAvx512).*TypeParam::kDot)(n, c.x.data(), c.y.data());
    EXPECT_NEAR(simd, scalar, kDotRelTolerance * c.sum_abs) << "n=" << n;
  }
}

// ---- SIMD quantizers: bit-exact with the scalar references. ----

TEST(LegacySimd, Q8QuantizersBitExact) {
  SKIP_WITHOUT_SIMD();
  std::vector<std::vector<float>> rows = {RandomRow(32, 1), RandomRow(96, 2),
                                          RandomRow(4096 + 32, 3), TieRow(32 * 21)};
  std::vector<float> tiny = RandomRow(32 * 8, 4);  // f16-subnormal and zero scales.
  for (size_t i = 0; i < tiny.size(); ++i) tiny[i] = i < 32 ? 0.0f : tiny[i] * 1e-6f;
  rows.push_back(tiny);
  for (Isa isa : SimdIsas()) {
    for (const std::vector<float>& x : rows) {
      const int64_t n = static_cast<int64_t>(x.size());
      std::vector<BlockQ8_0> a(n / 32), b(n / 32);
      QuantizeRowQ8_0(x.data(), a.data(), n);
      Fns(isa).quantize_q8_0(x.data(), b.data(), n);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(BlockQ8_0)), 0)
          << IsaName(isa) << " Q8_0 n=" << n;
      std::vector<BlockQ8_1> c(n / 32), d(n / 32);
      QuantizeRowQ8_1(x.data(), c.data(), n);
      Fns(isa).quantize_q8_1(x.data(), d.data(), n);
      EXPECT_EQ(std::memcmp(c.data(), d.data(), c.size() * sizeof(BlockQ8_1)), 0)
          << IsaName(isa) << " Q8_1 n=" << n;
    }
  }
}

// ---- Float types: conversions and dots. ----

// Special f32 inputs for half/bfloat16 rounding: zeros, infinities, NaNs with payloads,
// f16 subnormal/normal/overflow boundaries and exact ties between adjacent halves.
std::vector<float> SpecialFloats() {
  std::vector<uint32_t> bits = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFBFFFFF, 0x7FA00000,
                                0x00000001, 0x807FFFFF, 0x33000000, 0x33000001, 0x33800000,
                                0x387FC000, 0x38800000, 0x477FE000, 0x477FEFFF, 0x477FF000,
                                0x47800000, 0x4B000000, 0x3F800000, 0xBF800001};
  std::vector<float> v;
  for (uint32_t b : bits) v.push_back(BitsToFloat(b));
  for (uint32_t h = 0; h < 0x7C00; h += 37) {  // Midpoints between consecutive halves.
    const double mid = (static_cast<double>(Fp16ToFp32(h)) + Fp16ToFp32(h + 1)) / 2;
    v.push_back(static_cast<float>(mid));
    v.push_back(-static_cast<float>(mid));
  }
  std::mt19937 rng(5);
  for (int i = 0; i < (1 << 16); ++i) v.push_back(BitsToFloat(rng()));
  return v;
}

std::vector<uint16_t> AllHalves() {
  std::vector<uint16_t> h(1 << 16);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i);
  return h;
}

constexpr int64_t kTailLengths[] = {1, 7, 15, 16, 17, 33};

TEST(LegacySimd, ConversionsBitExact) {
  SKIP_WITHOUT_SIMD();
  const std::vector<float> f = SpecialFloats();
  const std::vector<uint16_t> halves = AllHalves();
  for (Isa isa : SimdIsas()) {
    SCOPED_TRACE(IsaName(isa));
    std::vector<uint16_t> a(f.size()), b(f.size());
    ConvertF32ToF16(f.data(), a.data(), static_cast<int64_t>(f.size()));
    Fns(isa).f32_to_f16(f.data(), b.data(), static_cast<int64_t>(f.size()));
    EXPECT_EQ(a, b);
    std::vector<float> fa(halves.size()), fb(halves.size());
    ConvertF16ToF32(halves.data(), fa.data(), static_cast<int64_t>(halves.size()));
    Fns(isa).f16_to_f32(halves.data(), fb.data(), static_cast<int64_t>(halves.size()));
    EXPECT_EQ(std::memcmp(fa.data(), fb.data(), fa.size() * 4), 0) << "f16 -> f32";
    ConvertBf16ToF32(halves.data(), fa.data(), static_cast<int64_t>(halves.size()));
    Fns(isa).bf16_to_f32(halves.data(), fb.data(), static_cast<int64_t>(halves.size()));
    EXPECT_EQ(std::memcmp(fa.data(), fb.data(), fa.size() * 4), 0) << "bf16 -> f32";
    // Tails: every short length, writing nothing past n.
    for (int64_t n : kTailLengths) {
      std::vector<uint16_t> h(n + 1, 0xABCD);
      std::vector<float> g(n + 1, -3.0f);
      Fns(isa).f32_to_f16(f.data() + 100, h.data(), n);
      EXPECT_EQ(std::vector<uint16_t>(h.begin(), h.end() - 1),
                std::vector<uint16_t>(a.begin() + 100, a.begin() + 100 + n));
      EXPECT_EQ(h[n], 0xABCD) << "n=" << n;
      Fns(isa).f16_to_f32(halves.data() + 0x3C00, g.data(), n);
      EXPECT_EQ(g[0], 1.0f);
      EXPECT_EQ(g[n], -3.0f) << "n=" << n;
      Fns(isa).bf16_to_f32(halves.data() + 0x3F80, g.data(), n);
      EXPECT_EQ(g[0], 1.0f);
      EXPECT_EQ(g[n], -3.0f) << "n=" << n;
    }
  }
}

TEST(LegacyScalar, HalfRoundTripIsIdentity) {
  for (uint32_t h = 0; h < (1u << 16); ++h) {
    const float f = Fp16ToFp32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_EQ(Fp32ToFp16(f) & 0x7E00, 0x7E00) << h;
      continue;
    }
    ASSERT_EQ(Fp32ToFp16(f), h);
    ASSERT_EQ(Fp32ToBf16(Bf16ToFp32(static_cast<uint16_t>(h))), h);
  }
}

// F16 and BF16 conversions against numpy, both directions (NaN payloads aside for F16, where
// numpy keeps them and ggml canonicalizes).
TEST(LegacyScalar, FloatConversionsMatchPythonReference) {
  FUCINA_SKIP_WITHOUT_PYTHON();
  const std::vector<uint16_t> halves = AllHalves();
  std::vector<float> ours(halves.size());
  for (const char* type : {"F16", "BF16"}) {
    const bool f16 = std::string(type) == "F16";
    const std::vector<uint8_t> ref = testing_ref::RunScript("gguf_dequant_ref.py", type, halves);
    ASSERT_EQ(ref.size(), halves.size() * 4);
    (f16 ? ConvertF16ToF32 : ConvertBf16ToF32)(halves.data(), ours.data(), 1 << 16);
    ExpectSameFloats(ours.data(), reinterpret_cast<const float*>(ref.data()), 1 << 16, type);

    const std::vector<float> f = SpecialFloats();
    const std::vector<uint8_t> qref = testing_ref::RunScript("gguf_quantize_ref.py", type, f);
    ASSERT_EQ(qref.size(), f.size() * 2);
    std::vector<uint16_t> q(f.size());
    (f16 ? ConvertF32ToF16 : ConvertF32ToBf16)(f.data(), q.data(), static_cast<int64_t>(f.size()));
    int64_t bad = 0;
    for (size_t i = 0; i < f.size(); ++i) {
      uint16_t r;
      std::memcpy(&r, qref.data() + 2 * i, 2);
      if (f16 && std::isnan(f[i])) {
        EXPECT_EQ(r & 0x7C00, 0x7C00);
        EXPECT_EQ(q[i] & 0x7E00, 0x7E00);
      } else if (r != q[i] && bad++ < 5) {
        ADD_FAILURE() << type << " of 0x" << std::hex << FloatToBits(f[i]) << ": ours 0x" << q[i]
                      << " numpy 0x" << r;
      }
    }
    EXPECT_EQ(bad, 0) << type;
  }
}

constexpr int64_t kFloatDotSizes[] = {1, 7, 15, 16, 17, 33, 4096 + 3};

// x values with exactly representable f32 conversions, y random; returns sum |x_i y_i| and
// the exact dot (long double holds every f32 product exactly).
struct FloatDotCase {
  std::vector<float> xf, y;
  std::vector<uint16_t> xh, xb;
  long double exact_f32 = 0, exact_f16 = 0, exact_bf16 = 0, abs_f32 = 0, abs_f16 = 0, abs_bf16 = 0;
};

FloatDotCase MakeFloatDotCase(int64_t n, uint32_t seed) {
  FloatDotCase c;
  c.xf = RandomRow(n, seed);
  c.y = RandomRow(n, seed + 100);
  c.xh.resize(n);
  c.xb.resize(n);
  ConvertF32ToF16(c.xf.data(), c.xh.data(), n);
  ConvertF32ToBf16(c.xf.data(), c.xb.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const long double y = c.y[i];
    c.exact_f32 += c.xf[i] * y;
    c.abs_f32 += std::fabs(c.xf[i] * y);
    c.exact_f16 += Fp16ToFp32(c.xh[i]) * y;
    c.abs_f16 += std::fabs(Fp16ToFp32(c.xh[i]) * y);
    c.exact_bf16 += Bf16ToFp32(c.xb[i]) * y;
    c.abs_bf16 += std::fabs(Bf16ToFp32(c.xb[i]) * y);
  }
  return c;
}

// Scalar: f32 products (2^-24 relative each) summed in double, rounded once to f32.
TEST(LegacyScalar, FloatDotsMatchExactDot) {
  for (int64_t n : kFloatDotSizes) {
    const FloatDotCase c = MakeFloatDotCase(n, static_cast<uint32_t>(n));
    const double tol = 0x1p-23;
    EXPECT_NEAR(VecDotF32(n, c.xf.data(), c.y.data()), c.exact_f32, tol * c.abs_f32) << n;
    EXPECT_NEAR(VecDotF16F32(n, c.xh.data(), c.y.data()), c.exact_f16, tol * c.abs_f16) << n;
    EXPECT_NEAR(VecDotBf16F32(n, c.xb.data(), c.y.data()), c.exact_bf16, tol * c.abs_bf16) << n;
  }
}

// SIMD: f32 FMA accumulation over n / lanes terms per lane: well under 1e-5 of sum |terms|
// for these sizes.
TEST(LegacySimd, FloatDotsMatchScalar) {
  SKIP_WITHOUT_SIMD();
  for (Isa isa : SimdIsas()) {
    for (int64_t n : kFloatDotSizes) {
      const FloatDotCase c = MakeFloatDotCase(n, static_cast<uint32_t>(n) + 9);
      const LegacyFns& f = Fns(isa);
      EXPECT_NEAR(f.dot_f32(n, c.xf.data(), c.y.data()), VecDotF32(n, c.xf.data(), c.y.data()),
                  1e-5 * c.abs_f32) << IsaName(isa) << " n=" << n;
      EXPECT_NEAR(f.dot_f16(n, c.xh.data(), c.y.data()),
                  VecDotF16F32(n, c.xh.data(), c.y.data()), 1e-5 * c.abs_f16)
          << IsaName(isa) << " n=" << n;
      EXPECT_NEAR(f.dot_bf16(n, c.xb.data(), c.y.data()),
                  VecDotBf16F32(n, c.xb.data(), c.y.data()), 1e-5 * c.abs_bf16)
          << IsaName(isa) << " n=" << n;
    }
  }
}

}  // namespace
}  // namespace fucina
