// Tests for the k-quants (kernels/quant/k_quants.h): scalar references against ggml's own numpy
// dequantizer and hand-computed blocks, quantizer accuracy, and every SIMD path available on
// this CPU against the scalar reference.
#include "kernels/quant/k_quants.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "tests/kernels/python_ref.h"

namespace fucina {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers.

std::vector<float> GaussianRow(int64_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// A finite f16 (never inf/NaN), either sign, normal or subnormal.
f16_t RandomFiniteF16(std::mt19937& rng) {
  for (;;) {
    const f16_t h = static_cast<f16_t>(rng());
    if ((h & 0x7C00) != 0x7C00) return h;
  }
}

template <typename Block>
void FillRandomBytes(Block* b, std::mt19937& rng) {
  auto* p = reinterpret_cast<uint8_t*>(b);
  for (size_t i = 0; i < sizeof(Block); ++i) p[i] = static_cast<uint8_t>(rng());
}

// Q8_K block with random quants in [-128, 127], consistent bsums and a positive scale.
BlockQ8_K RandomQ8K(std::mt19937& rng) {
  BlockQ8_K b;
  for (int j = 0; j < kQK_K; ++j) b.qs[j] = static_cast<int8_t>(rng());
  for (int j = 0; j < kQK_K / 16; ++j) {
    int s = 0;
    for (int l = 0; l < 16; ++l) s += b.qs[16 * j + l];
    b.bsums[j] = static_cast<int16_t>(s);
  }
  b.d = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, -7);
  return b;
}

struct KIsa {
  const char* name;
  void (*quantize_q8_k)(const float*, BlockQ8_K*, int64_t);
  float (*dot_q4_k)(int64_t, const BlockQ4_K*, const BlockQ8_K*);
  float (*dot_q5_k)(int64_t, const BlockQ5_K*, const BlockQ8_K*);
  float (*dot_q6_k)(int64_t, const BlockQ6_K*, const BlockQ8_K*);
};

// The SIMD paths this CPU can run; each is compared with the scalar reference.
std::vector<KIsa> SimdPaths() {
  std::vector<KIsa> paths;
  const Isa isa = DetectedIsa();
  if (isa >= Isa::kAvx2) {
    paths.push_back({"avx2", avx2::QuantizeRowQ8_K, avx2::VecDotQ4_KQ8_K, avx2::VecDotQ5_KQ8_K,
                     avx2::VecDotQ6_KQ8_K});
  }
  if (isa >= Isa::kAvx512) {
    paths.push_back({"avx512", avx512::QuantizeRowQ8_K, avx512::VecDotQ4_KQ8_K,
                     avx512::VecDotQ5_KQ8_K, avx512::VecDotQ6_KQ8_K});
  }
  return paths;
}

// Number of elements whose f32 bit patterns differ (dequantization is exact in f32, so the
// two implementations must agree bit for bit).
int64_t CountBitMismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return -1;
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += FloatToBits(a[i]) != FloatToBits(b[i]);
  return bad;
}

// ---------------------------------------------------------------------------------------------
// Block sets for the dequantization comparison: quantizer output, random bytes, and edge cases.

std::vector<float> MixedRows(int64_t n) {
  // Gaussian, a large-offset row (mins matter), tiny values and a sparse row with outliers.
  std::vector<float> x = GaussianRow(n, 1);
  std::vector<float> off = GaussianRow(n, 2, 0.1f);
  for (float& v : off) v += 3.0f;
  std::vector<float> tiny = GaussianRow(n, 3, 1e-4f);
  std::vector<float> sparse(n, 0.0f);
  std::mt19937 rng(4);
  for (int64_t i = 0; i < n; i += 37) sparse[i] = static_cast<float>(rng() % 2001) - 1000.0f;
  x.insert(x.end(), off.begin(), off.end());
  x.insert(x.end(), tiny.begin(), tiny.end());
  x.insert(x.end(), sparse.begin(), sparse.end());
  return x;
}

// Q4_K / Q5_K edge blocks: every 6-bit value in every scale and min position, d = 0, dmin = 0,
// all quants at their maximum, extreme f16 values.
template <typename Block>
std::vector<Block> EdgeBlocksQx_K(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Block> blocks;
  for (int v = 0; v < 64; ++v) {
    Block b;
    FillRandomBytes(&b, rng);
    b.d = RandomFiniteF16(rng);
    b.dmin = RandomFiniteF16(rng);
    // Bytes 0..11 as 8 scales/mins: scale j = (v + j) % 64, min j = (v + 7 * j + 1) % 64.
    for (int k = 0; k < 12; ++k) b.scales[k] = 0;
    for (int j = 0; j < 8; ++j) {
      const uint8_t s = (v + j) % 64, m = (v + 7 * j + 1) % 64;
      if (j < 4) {
        b.scales[j] |= s;
        b.scales[j + 4] |= m;
      } else {
        b.scales[j + 4] = static_cast<uint8_t>((s & 0xF) | ((m & 0xF) << 4));
        b.scales[j - 4] |= static_cast<uint8_t>((s >> 4) << 6);
        b.scales[j] |= static_cast<uint8_t>((m >> 4) << 6);
      }
    }
    blocks.push_back(b);
  }
  const f16_t specials[] = {0x0000, 0x8000, 0x3C00, 0x7BFF, 0xFBFF, 0x0001, 0x03FF, 0x0400};
  for (f16_t d : specials) {
    for (f16_t dmin : specials) {
      Block b;
      std::memset(&b, 0xFF, sizeof(b));  // all scales/mins 63, all quants at max.
      b.d = d;
      b.dmin = dmin;
      blocks.push_back(b);
    }
  }
  for (int k = 0; k < 64; ++k) {
    Block b;
    FillRandomBytes(&b, rng);
    b.d = RandomFiniteF16(rng);
    b.dmin = RandomFiniteF16(rng);
    blocks.push_back(b);
  }
  return blocks;
}

std::vector<BlockQ6_K> EdgeBlocksQ6_K(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<BlockQ6_K> blocks;
  for (int v = 0; v < 16; ++v) {  // every int8 scale value in every position.
    BlockQ6_K b;
    FillRandomBytes(&b, rng);
    for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(16 * v + j * 17);
    b.d = RandomFiniteF16(rng);
    blocks.push_back(b);
  }
  const f16_t specials[] = {0x0000, 0x8000, 0x3C00, 0x7BFF, 0xFBFF, 0x0001};
  for (f16_t d : specials) {
    for (uint8_t fill : {0x00, 0xFF}) {  // all q = 0 (-32 after offset) or all q = 63.
      BlockQ6_K b;
      std::memset(&b, fill, sizeof(b));
      for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<int8_t>(j % 2 ? -128 : 127);
      b.d = d;
      blocks.push_back(b);
    }
  }
  for (int k = 0; k < 64; ++k) {
    BlockQ6_K b;
    FillRandomBytes(&b, rng);
    b.d = RandomFiniteF16(rng);
    blocks.push_back(b);
  }
  return blocks;
}

template <typename Block>
void ExpectDequantMatchesPython(const char* type_name, std::vector<Block> blocks,
                                void (*dequantize)(const Block*, float*, int64_t)) {
  const int64_t n = static_cast<int64_t>(blocks.size()) * kQK_K;
  std::vector<float> ours(n);
  dequantize(blocks.data(), ours.data(), n);
  const std::vector<float> ref =
      testing_ref::Dequantize(type_name, blocks.data(), blocks.size() * sizeof(Block));
  ASSERT_FALSE(ref.empty()) << type_name << ": no output from the reference script";
  EXPECT_EQ(CountBitMismatches(ours, ref), 0) << type_name << " over " << blocks.size()
                                              << " blocks";
}

TEST(KQuantsDequantTest, Q4_KMatchesGgmlNumpy) {
  FUCINA_SKIP_WITHOUT_PYTHON();
  const std::vector<float> x = MixedRows(4 * kQK_K);
  std::vector<BlockQ4_K> blocks(x.size() / kQK_K);
  QuantizeRowQ4_K(x.data(), blocks.data(), static_cast<int64_t>(x.size()));
  const std::vector<BlockQ4_K> edge = EdgeBlocksQx_K<BlockQ4_K>(10);
  blocks.insert(blocks.end(), edge.begin(), edge.end());
  ExpectDequantMatchesPython("Q4_K", blocks, DequantizeRowQ4_K);
}

TEST(KQuantsDequantTest, Q5_KMatchesGgmlNumpy) {
  FUCINA_SKIP_WITHOUT_PYTHON();
  const std::vector<float> x = MixedRows(4 * kQK_K);
  std::vector<BlockQ5_K> blocks(x.size() / kQK_K);
  QuantizeRowQ5_K(x.data(), blocks.data(), static_cast<int64_t>(x.size()));
  const std::vector<BlockQ5_K> edge = EdgeBlocksQx_K<BlockQ5_K>(11);
  blocks.insert(blocks.end(), edge.begin(), edge.end());
  ExpectDequantMatchesPython("Q5_K", blocks, DequantizeRowQ5_K);
}

TEST(KQuantsDequantTest, Q6_KMatchesGgmlNumpy) {
  FUCINA_SKIP_WITHOUT_PYTHON();
  const std::vector<float> x = MixedRows(4 * kQK_K);
  std::vector<BlockQ6_K> blocks(x.size() / kQK_K);
  QuantizeRowQ6_K(x.data(), blocks.data(), static_cast<int64_t>(x.size()));
  const std::vector<BlockQ6_K> edge = EdgeBlocksQ6_K(12);
  blocks.insert(blocks.end(), edge.begin(), edge.end());
  ExpectDequantMatchesPython("Q6_K", blocks, DequantizeRowQ6_K);
}

// ---------------------------------------------------------------------------------------------
// Hand-computed blocks.

TEST(KQuantsDequantTest, Q4_KHandBlock) {
  // d = 0.5, dmin = 0.25; scales {1,2,3,4,17,33,63,0}, mins {0,1,2,3,20,40,5,63} packed by hand:
  // bytes 0..3 = scale j | (scale j+4 >> 4) << 6, bytes 4..7 likewise for mins,
  // bytes 8..11 = (scale j+4 & 15) | (min j+4 & 15) << 4.
  BlockQ4_K b;
  b.d = 0x3800;
  b.dmin = 0x3400;
  const uint8_t packed[12] = {65, 130, 195, 4, 64, 129, 2, 195, 65, 129, 95, 240};
  std::memcpy(b.scales, packed, 12);
  // Low nibble of qs[l] = l % 16, high nibble = 15 - l % 16.
  for (int l = 0; l < kQK_K / 2; ++l) b.qs[l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
  std::vector<float> y(kQK_K);
  DequantizeRowQ4_K(&b, y.data(), kQK_K);
  // Element e: 64-element chunk c = e / 64; r = e % 64 < 32 takes the low nibble of qs[32c + r]
  // (sub-block 2c), else the high nibble of qs[32c + r - 32] (sub-block 2c + 1).
  EXPECT_EQ(y[0], 0.0f);        // sb 0: 0.5*1*0 - 0.25*0
  EXPECT_EQ(y[5], 2.5f);        // sb 0: 0.5*1*5
  EXPECT_EQ(y[40], 6.75f);      // sb 1: 0.5*2*7 - 0.25*1
  EXPECT_EQ(y[131], 20.5f);     // sb 4: 0.5*17*3 - 0.25*20
  EXPECT_EQ(y[202], 313.75f);   // sb 6: 0.5*63*10 - 0.25*5
  EXPECT_EQ(y[239], -15.75f);   // sb 7: 0.5*0*0 - 0.25*63
  EXPECT_EQ(y[160], 0.5f * 33 * 15 - 0.25f * 40);  // sb 5, first high nibble
  const int sc[8] = {1, 2, 3, 4, 17, 33, 63, 0}, mn[8] = {0, 1, 2, 3, 20, 40, 5, 63};
  for (int e = 0; e < kQK_K; ++e) {
    const int r = e % 64, sb = 2 * (e / 64) + (r >= 32);
    const int q = r < 32 ? r % 16 : 15 - (r - 32) % 16;
    EXPECT_EQ(y[e], 0.5f * sc[sb] * q - 0.25f * mn[sb]) << "element " << e;
  }
}

TEST(KQuantsDequantTest, Q6_KHandBlock) {
  const int8_t scales[16] = {1, -1, 2, -2, 3, -3, 4, -4, 127, -128, 5, -5, 6, -6, 7, -7};
  BlockQ6_K b;
  b.d = 0x3400;  // 0.25
  std::memcpy(b.scales, scales, 16);
  // q(e) = e % 64, laid out by hand: in half h, element 32k + l (k = 0..3) keeps its low 4 bits
  // in ql[64h + l + 32*(k & 1)] (low nibble for k < 2, high for k >= 2) and its top 2 bits in
  // bits 2k..2k+1 of qh[32h + l].
  std::memset(b.ql, 0, sizeof(b.ql));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32, q = e % 64;
    b.ql[64 * h + l + 32 * (k & 1)] |= static_cast<uint8_t>((q & 0xF) << (k >= 2 ? 4 : 0));
    b.qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
  }
  std::vector<float> y(kQK_K);
  DequantizeRowQ6_K(&b, y.data(), kQK_K);
  EXPECT_EQ(y[0], -8.0f);       // 0.25 * 1 * (0 - 32)
  EXPECT_EQ(y[17], 3.75f);      // 0.25 * -1 * (17 - 32)
  EXPECT_EQ(y[143], -539.75f);  // 0.25 * 127 * (15 - 32)
  EXPECT_EQ(y[159], 32.0f);     // 0.25 * -128 * (31 - 32)
  EXPECT_EQ(y[255], -54.25f);   // 0.25 * -7 * (63 - 32)
  for (int e = 0; e < kQK_K; ++e) {
    EXPECT_EQ(y[e], 0.25f * scales[e / 16] * (e % 64 - 32)) << "element " << e;
  }
}

TEST(KQuantsDequantTest, Q8_KIsScaleTimesQuant) {
  // gguf's numpy package has no Q8_K (it never appears in files), so this checks by hand.
  BlockQ8_K b[2];
  b[0].d = 0.5f;
  for (int j = 0; j < kQK_K; ++j) b[0].qs[j] = static_cast<int8_t>(j - 128);
  b[1].d = -3.0f;
  for (int j = 0; j < kQK_K; ++j) b[1].qs[j] = static_cast<int8_t>(j % 2 ? 127 : -127);
  std::vector<float> y(2 * kQK_K);
  DequantizeRowQ8_K(b, y.data(), 2 * kQK_K);
  for (int j = 0; j < kQK_K; ++j) {
    EXPECT_EQ(y[j], 0.5f * static_cast<float>(j - 128));
    EXPECT_EQ(y[kQK_K + j], j % 2 ? -381.0f : 381.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// Weight quantizers. gguf 0.17.1's numpy package implements no k-quant quantizer
// (quantize_blocks raises NotImplementedError for Q4_K/Q5_K/Q6_K), so byte-identity with
// llama-quantize cannot be checked here; the quantizers are instead held to their round-trip
// accuracy on Gaussian data (relative RMS error, measured values in the comments) and to
// basic invariants.

template <typename Block>
double RelativeRmse(const std::vector<float>& x, void (*quantize)(const float*, Block*, int64_t),
                    void (*dequantize)(const Block*, float*, int64_t)) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<Block> q(n / kQK_K);
  quantize(x.data(), q.data(), n);
  std::vector<float> y(n);
  dequantize(q.data(), y.data(), n);
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    ref += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

TEST(KQuantsQuantizeTest, RoundTripErrorOnGaussianData) {
  const std::vector<float> x = GaussianRow(64 * kQK_K, 21);
  const double q4 = RelativeRmse(x, QuantizeRowQ4_K, DequantizeRowQ4_K);
  const double q5 = RelativeRmse(x, QuantizeRowQ5_K, DequantizeRowQ5_K);
  const double q6 = RelativeRmse(x, QuantizeRowQ6_K, DequantizeRowQ6_K);
  // Measured: Q4_K 0.0719, Q5_K 0.0361, Q6_K 0.0177; bounds leave ~10% margin.
  EXPECT_LT(q4, 0.079);
  EXPECT_LT(q5, 0.040);
  EXPECT_LT(q6, 0.0195);
  // Each extra bit roughly halves the error (measured ratios 1.99 and 2.04).
  EXPECT_GT(q4 / q5, 1.8);
  EXPECT_GT(q5 / q6, 1.8);
  std::printf("relative RMSE: Q4_K %.4f, Q5_K %.4f, Q6_K %.4f\n", q4, q5, q6);
}

TEST(KQuantsQuantizeTest, ZeroRowsGiveZeroBlocks) {
  const std::vector<float> x(2 * kQK_K, 0.0f);
  std::vector<float> y(x.size(), 1.0f);
  BlockQ4_K q4[2];
  QuantizeRowQ4_K(x.data(), q4, 2 * kQK_K);
  DequantizeRowQ4_K(q4, y.data(), 2 * kQK_K);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  BlockQ5_K q5[2];
  QuantizeRowQ5_K(x.data(), q5, 2 * kQK_K);
  DequantizeRowQ5_K(q5, y.data(), 2 * kQK_K);
  for (float v : y) EXPECT_EQ(v, 0.0f);
  BlockQ6_K q6[2];
  QuantizeRowQ6_K(x.data(), q6, 2 * kQK_K);
  DequantizeRowQ6_K(q6, y.data(), 2 * kQK_K);
  for (float v : y) EXPECT_EQ(std::fabs(v), 0.0f);
  BlockQ8_K q8[2];
  QuantizeRowQ8_K(x.data(), q8, 2 * kQK_K);
  for (const BlockQ8_K& b : q8) {
    EXPECT_EQ(b.d, 0.0f);
    for (int16_t s : b.bsums) EXPECT_EQ(s, 0);
  }
}

TEST(KQuantsQuantizeTest, Q8_KMapsLargestMagnitudeToMinus127) {
  std::vector<float> x = GaussianRow(kQK_K, 22);
  x[77] = -9.0f;  // largest magnitude, negative: d = 1 / (-127 / -9) > 0.
  x[200] = 9.0f;  // same magnitude later: the first one decides the sign.
  BlockQ8_K b;
  QuantizeRowQ8_K(x.data(), &b, kQK_K);
  EXPECT_EQ(b.qs[77], -127);
  EXPECT_EQ(b.qs[200], 127);
  EXPECT_FLOAT_EQ(b.d, 9.0f / 127.0f);
  for (int j = 0; j < kQK_K / 16; ++j) {
    int s = 0;
    for (int l = 0; l < 16; ++l) s += b.qs[16 * j + l];
    EXPECT_EQ(b.bsums[j], s);
  }
  // Dequantized activations are within half a step of the input.
  std::vector<float> y(kQK_K);
  DequantizeRowQ8_K(&b, y.data(), kQK_K);
  for (int j = 0; j < kQK_K; ++j) EXPECT_LE(std::fabs(y[j] - x[j]), 0.5f * b.d * 1.0001f);
}

// ---------------------------------------------------------------------------------------------
// SIMD Q8_K quantizer: bit-exact with the scalar reference.

std::vector<float> Q8KStressRow() {
  std::vector<float> x;
  // Gaussian blocks at several magnitudes.
  for (float sigma : {1.0f, 1e-3f, 1e4f, 1e-30f}) {
    const std::vector<float> g = GaussianRow(kQK_K, static_cast<uint32_t>(sigma * 1000) + 5, sigma);
    x.insert(x.end(), g.begin(), g.end());
  }
  // Exact halves after scaling: max = -127 gives iscale = 1, so x = k + 0.5 exercises ties.
  std::vector<float> halves(kQK_K);
  for (int j = 0; j < kQK_K; ++j) halves[j] = static_cast<float>(j % 100) - 50.5f;
  halves[3] = -127.0f;
  x.insert(x.end(), halves.begin(), halves.end());
  // Ties of |max| with opposite signs, first positive then first negative.
  for (float first : {5.0f, -5.0f}) {
    std::vector<float> t = GaussianRow(kQK_K, 31);
    t[250] = first;
    t[251] = -first;
    x.insert(x.end(), t.begin(), t.end());
  }
  // An all-zero block, and a block of one nonzero value.
  x.insert(x.end(), kQK_K, 0.0f);
  std::vector<float> one(kQK_K, 0.0f);
  one[255] = -1e-20f;
  x.insert(x.end(), one.begin(), one.end());
  return x;
}

TEST(KQuantsSimdTest, QuantizeQ8_KBitExact) {
  const std::vector<KIsa> paths = SimdPaths();
  if (paths.empty()) GTEST_SKIP() << "no SIMD path on this CPU";
  const std::vector<float> x = Q8KStressRow();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<BlockQ8_K> ref(n / kQK_K);
  QuantizeRowQ8_K(x.data(), ref.data(), n);
  for (const KIsa& isa : paths) {
    std::vector<BlockQ8_K> got(n / kQK_K);
    std::memset(got.data(), 0xA5, got.size() * sizeof(BlockQ8_K));
    isa.quantize_q8_k(x.data(), got.data(), n);
    for (size_t b = 0; b < ref.size(); ++b) {
      EXPECT_EQ(std::memcmp(&ref[b], &got[b], sizeof(BlockQ8_K)), 0)
          << isa.name << " block " << b;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Dots.

// sum |w_i * a_i| in double over dequantized operands: the scale float rounding errors follow.
template <typename Block>
double AbsDot(const std::vector<Block>& w, const std::vector<BlockQ8_K>& a, int64_t n,
              void (*dequantize)(const Block*, float*, int64_t)) {
  std::vector<float> wf(n), af(n);
  dequantize(w.data(), wf.data(), n);
  DequantizeRowQ8_K(a.data(), af.data(), n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::fabs(static_cast<double>(wf[i]) * af[i]);
  return s;
}

template <typename Block>
double ExactDot(const std::vector<Block>& w, const std::vector<BlockQ8_K>& a, int64_t n,
                void (*dequantize)(const Block*, float*, int64_t)) {
  std::vector<float> wf(n), af(n);
  dequantize(w.data(), wf.data(), n);
  DequantizeRowQ8_K(a.data(), af.data(), n);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(wf[i]) * af[i];
  return s;
}

const int64_t kDotSizes[] = {256, 512, 256 * 3, 256 * 7, 4096, 4096 + 256};

// Reassociation tolerance, relative to sum |w_i a_i|: each path sums a few hundred float
// products of exact integer partial sums; measured max 2.1e-8 (scalar vs double) and 3.0e-8
// (SIMD vs scalar), printed by the test.
constexpr double kDotRelTol = 2e-6;

// Weights from the quantizer and from random bytes (every scale, extreme d), activations from
// the Q8_K quantizer and random Q8_K blocks (including -128).
template <typename Block>
void CheckDots(const char* type_name, void (*quantize)(const float*, Block*, int64_t),
               void (*dequantize)(const Block*, float*, int64_t),
               float (*scalar_dot)(int64_t, const Block*, const BlockQ8_K*),
               float (*KIsa::*simd_dot)(int64_t, const Block*, const BlockQ8_K*)) {
  const std::vector<KIsa> paths = SimdPaths();
  double worst_scalar = 0, worst_simd = 0;
  for (int64_t n : kDotSizes) {
    for (int variant = 0; variant < 2; ++variant) {
      const int64_t nb = n / kQK_K;
      std::vector<Block> w(nb);
      std::vector<BlockQ8_K> a(nb);
      std::mt19937 rng(static_cast<uint32_t>(n * 2 + variant));
      if (variant == 0) {
        const std::vector<float> wx = GaussianRow(n, static_cast<uint32_t>(n));
        const std::vector<float> ax = GaussianRow(n, static_cast<uint32_t>(n + 1), 3.0f);
        quantize(wx.data(), w.data(), n);
        QuantizeRowQ8_K(ax.data(), a.data(), n);
      } else {
        for (Block& b : w) {
          FillRandomBytes(&b, rng);
          // Keep d modest so no float overflow: |d| < 1, positive or negative.
          b.d = static_cast<f16_t>((rng() & 0x8000) | (rng() % 0x3C00));
          if constexpr (sizeof(Block) != sizeof(BlockQ6_K)) {
            b.dmin = static_cast<f16_t>((rng() & 0x8000) | (rng() % 0x3C00));
          }
        }
        for (BlockQ8_K& b : a) b = RandomQ8K(rng);
      }
      const double exact = ExactDot(w, a, n, dequantize);
      const double mag = AbsDot(w, a, n, dequantize);
      const float scalar = scalar_dot(n, w.data(), a.data());
      const double scalar_err = std::fabs(scalar - exact) / mag;
      worst_scalar = std::max(worst_scalar, scalar_err);
      EXPECT_LE(scalar_err, kDotRelTol) << type_name << " scalar n=" << n << " variant " << variant;
      for (const KIsa& isa : paths) {
        const float simd = (isa.*simd_dot)(n, w.data(), a.data());
        const double err = std::fabs(static_cast<double>(simd) - scalar) / mag;
        worst_simd = std::max(worst_simd, err);
        EXPECT_LE(err, kDotRelTol) << type_name << " " << isa.name << " n=" << n << " variant "
                                   << variant << ": " << simd << " vs scalar " << scalar;
      }
    }
  }
  std::printf("%s dot: max rel err scalar vs double %.3g, simd vs scalar %.3g\n", type_name,
              worst_scalar, worst_simd);
}

TEST(KQuantsDotTest, Q4_K) {
  CheckDots<BlockQ4_K>("Q4_K", QuantizeRowQ4_K, DequantizeRowQ4_K, VecDotQ4_KQ8_K,
                       &KIsa::dot_q4_k);
}

TEST(KQuantsDotTest, Q5_K) {
  CheckDots<BlockQ5_K>("Q5_K", QuantizeRowQ5_K, DequantizeRowQ5_K, VecDotQ5_KQ8_K,
                       &KIsa::dot_q5_k);
}

TEST(KQuantsDotTest, Q6_K) {
  CheckDots<BlockQ6_K>("Q6_K", QuantizeRowQ6_K, DequantizeRowQ6_K, VecDotQ6_KQ8_K,
                       &KIsa::dot_q6_k);
}

// Against the unquantized activations the only extra error is Q8_K rounding: at most half a
// step (|d_block| / 2) per element, so |dot - w . x| <= sum_i |w_i| * |d_block(i)| / 2. Rounding
// errors are near-uniform and independent, so the error is also within 6 standard deviations
// sqrt(sum_i w_i^2 d_block(i)^2 / 12) (fixed seed: deterministic).
TEST(KQuantsDotTest, ActivationQuantizationErrorIsBounded) {
  const int64_t n = 4096;
  const std::vector<float> wx = GaussianRow(n, 41);
  const std::vector<float> ax = GaussianRow(n, 42, 2.0f);
  std::vector<BlockQ4_K> w(n / kQK_K);
  std::vector<BlockQ8_K> a(n / kQK_K);
  QuantizeRowQ4_K(wx.data(), w.data(), n);
  QuantizeRowQ8_K(ax.data(), a.data(), n);
  std::vector<float> wf(n);
  DequantizeRowQ4_K(w.data(), wf.data(), n);
  double exact = 0, bound = 0, variance = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double step = std::fabs(a[i / kQK_K].d);
    exact += static_cast<double>(wf[i]) * ax[i];
    bound += std::fabs(static_cast<double>(wf[i])) * step * 0.5;
    variance += static_cast<double>(wf[i]) * wf[i] * step * step / 12;
  }
  const float dot = VecDotQ4_KQ8_K(n, w.data(), a.data());
  const double err = std::fabs(dot - exact);
  EXPECT_LE(err, bound * 1.001) << "dot " << dot << " exact " << exact;
  EXPECT_LE(err, 6 * std::sqrt(variance)) << "dot " << dot << " exact " << exact;
  std::printf("dot %.6f vs w.x %.6f: |err| %.4g, hard bound %.4g, sigma %.4g\n", dot, exact, err,
              bound, std::sqrt(variance));
}

}  // namespace
}  // namespace fucina
