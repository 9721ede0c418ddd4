// The attention tile kernels of every SIMD level on this machine (kernels/cpu/ops_isa.h):
// scores and weighted sums against plain loops, the direct kernels, which read K and V
// straight from cache rows, against the staged path through an f32 tile buffer, and q8_0
// value rows against their contract's loop, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"
#include "kernels/fp16.h"
#include "kernels/ggml_type.h"
#include "kernels/quant/blocks.h"
#include "tests/kernels/random_floats.h"

namespace fucina {
namespace {

// The SIMD tile kernels against plain loops on the same buffers: every key count of a tile
// (partial 8/16-key reduction blocks), row counts around the 4-row accumulator blocks, and
// buffer widths that are not multiples of the 32/64-dim accumulator chunks.
TEST(AttentionTileKernelsTest, ScoresAndAccumMatchPlainLoops) {
  struct Kernels {
    const char* name;
    decltype(&avx2::AttnTileScores) scores;
    decltype(&avx2::AttnTileAccum) accum;
  };
  std::vector<Kernels> levels;
  if (DetectedIsa() >= Isa::kAvx2) {
    levels.push_back({"avx2", avx2::AttnTileScores, avx2::AttnTileAccum});
  }
  if (DetectedIsa() >= Isa::kAvx512) {
    levels.push_back({"avx512", avx512::AttnTileScores, avx512::AttnTileAccum});
  }
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this machine";
  constexpr int kTile = 32, kSld = 40;
  for (int ld : {16, 48, 80, 144}) {
    for (int n_rows : {1, 2, 3, 4, 5, 9}) {
      const std::vector<float> q = Random(n_rows * ld, -1.0f, 1.0f, ld + n_rows);
      const std::vector<float> kv = Random(kTile * ld, -1.0f, 1.0f, 3 * ld + n_rows);
      const std::vector<float> p = Random(n_rows * kSld, 0.0f, 1.0f, 5 * ld + n_rows);
      const std::vector<float> acc0 = Random(n_rows * ld, -1.0f, 1.0f, 7 * ld + n_rows);
      for (int n_keys = 1; n_keys <= kTile; ++n_keys) {
        for (const Kernels& k : levels) {
          SCOPED_TRACE(std::string(k.name) + " ld=" + std::to_string(ld) + " rows=" +
                       std::to_string(n_rows) + " keys=" + std::to_string(n_keys));
          std::vector<float> s(n_rows * kSld, -5.0f);
          // Rows past n_keys (read by the last 8/16-key block) must not reach stored scores.
          std::vector<float> k_nan = kv;
          std::fill(k_nan.begin() + n_keys * ld, k_nan.end(), std::nanf(""));
          k.scores(q.data(), n_rows, ld, k_nan.data(), n_keys, s.data(), kSld);
          std::vector<float> acc = acc0;
          k.accum(p.data(), kSld, n_rows, kv.data(), n_keys, ld, acc.data());
          for (int r = 0; r < n_rows; ++r) {
            for (int t = 0; t < kSld; ++t) {
              if (t >= n_keys) {
                ASSERT_EQ(s[r * kSld + t], -5.0f) << "score past n_keys written";
                continue;
              }
              double dot = 0.0, mag = 0.0;
              for (int d = 0; d < ld; ++d) {
                dot += static_cast<double>(q[r * ld + d]) * kv[t * ld + d];
                mag += std::fabs(static_cast<double>(q[r * ld + d]) * kv[t * ld + d]);
              }
              ASSERT_NEAR(s[r * kSld + t], dot, 1e-6 * mag + 1e-30) << r << " " << t;
            }
            for (int d = 0; d < ld; ++d) {
              double want = acc0[r * ld + d], mag = std::fabs(want);
              for (int t = 0; t < n_keys; ++t) {
                want += static_cast<double>(p[r * kSld + t]) * kv[t * ld + d];
                mag += std::fabs(static_cast<double>(p[r * kSld + t]) * kv[t * ld + d]);
              }
              ASSERT_NEAR(acc[r * ld + d], want, 1e-6 * mag + 1e-30) << r << " " << d;
            }
          }
        }
      }
    }
  }
}

// The kernels of one SIMD level that the direct-rows test compares.
struct DirectKind {
  GgmlType type;
  decltype(&avx2::AttnLoadRowsF16) load;
  decltype(&avx2::AttnRowScoresF16) scores;
  decltype(&avx2::AttnRowAccumF16) accum;
  std::vector<int> head_dims;
};
struct DirectLevel {
  const char* name;
  decltype(&avx2::AttnTileScores) tile_scores;
  decltype(&avx2::AttnTileAccum) tile_accum;
  std::vector<DirectKind> kinds;
};

#define FUCINA_DIRECT_LEVEL(ns)                                                                \
  DirectLevel {                                                                                \
    #ns, ns::AttnTileScores, ns::AttnTileAccum,                                                \
        {{GgmlType::kF32, ns::AttnLoadRowsF32, ns::AttnRowScoresF32, ns::AttnRowAccumF32,      \
          {40, 64, 100, 128}},                                                                 \
         {GgmlType::kF16, ns::AttnLoadRowsF16, ns::AttnRowScoresF16, ns::AttnRowAccumF16,      \
          {40, 64, 100, 128}}}                                                                 \
  }

// One case of the test below: n_keys cache rows of hd dims, n_rows query rows.
void ExpectDirectEqualsStaged(const DirectLevel& level, const DirectKind& kind, int hd,
                              int n_keys, int n_rows, uint32_t seed) {
  const int ld = (hd + 15) / 16 * 16;
  // Cache rows 8 bytes apart from dense; values through the cache type's rounding.
  const KvLayout one{kind.type, 1, 1, hd};
  const int64_t stride = one.HeadBytes() + 8;
  std::vector<uint8_t> k(stride * n_keys), v(stride * n_keys);
  const std::vector<float> kf = Random(n_keys * hd, -2.0f, 2.0f, seed++);
  const std::vector<float> vf = Random(n_keys * hd, -2.0f, 2.0f, seed++);
  for (int t = 0; t < n_keys; ++t) {
    StoreKvRows(one, k.data() + t * stride, 0, 1, kf.data() + t * hd);
    StoreKvRows(one, v.data() + t * stride, 0, 1, vf.data() + t * hd);
  }
  std::vector<float> q = Random(n_rows * ld, -1.0f, 1.0f, seed++);
  for (int r = 0; r < n_rows; ++r) {
    std::fill(q.begin() + r * ld + hd, q.begin() + (r + 1) * ld, 0.0f);
  }
  const std::vector<float> p = Random(n_rows * 32, 0.0f, 1.0f, seed++);
  const std::vector<float> acc0 = Random(n_rows * ld, -1.0f, 1.0f, seed++);

  // Staged: the buffer holds 32 rows (round_up(n_keys, 16) are read), zero padded.
  std::vector<float> buf(32 * ld, 0.0f);
  std::vector<float> s_staged(n_rows * 32, -5.0f), s_direct(n_rows * 32, -5.0f);
  kind.load(k.data(), stride, n_keys, hd, ld, buf.data());
  level.tile_scores(q.data(), n_rows, ld, buf.data(), n_keys, s_staged.data(), 32);
  for (int r = 0; r < n_rows; ++r) {
    std::vector<float> alone(32, -5.0f);
    level.tile_scores(q.data() + r * ld, 1, ld, buf.data(), n_keys, alone.data(), 32);
    ASSERT_EQ(0, std::memcmp(alone.data(), s_staged.data() + r * 32, n_keys * 4)) << "row " << r;
  }
  kind.scores(q.data(), n_rows, ld, k.data(), stride, hd, n_keys, s_direct.data(), 32);
  ASSERT_EQ(0, std::memcmp(s_staged.data(), s_direct.data(), s_staged.size() * 4));

  std::fill(buf.begin(), buf.end(), 0.0f);
  std::vector<float> a_staged = acc0, a_direct = acc0;
  kind.load(v.data(), stride, n_keys, hd, ld, buf.data());
  level.tile_accum(p.data(), 32, n_rows, buf.data(), n_keys, ld, a_staged.data());
  kind.accum(p.data(), 32, n_rows, v.data(), stride, hd, n_keys, ld, a_direct.data());
  ASSERT_EQ(0, std::memcmp(a_staged.data(), a_direct.data(), a_staged.size() * 4));
}

// The direct tile kernels (K and V read from the cache rows) give the staged path's bits:
// AttnLoadRows* into a padded f32 buffer, then AttnTileScores / AttnTileAccum, on every level.
// Head dims with a tail past the last 16-lane chunk (100: also past the last 8-lane one; q8_0:
// a block split across chunk groups), every row count a block can have, partial key groups;
// the rows are exactly n_keys long, so a read past the last key would leave the allocation.
// Rows are scored in pairs, a last odd row alone: each row's scores equal those of the row
// scored by itself, whatever it was paired with.
TEST(AttentionTileKernelsTest, DirectRowsMatchTheStagedPathBitForBit) {
  std::vector<DirectLevel> levels;
  if (DetectedIsa() >= Isa::kAvx2) levels.push_back(FUCINA_DIRECT_LEVEL(avx2));
  if (DetectedIsa() >= Isa::kAvx512) levels.push_back(FUCINA_DIRECT_LEVEL(avx512));
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this machine";
  uint32_t seed = 100;
  for (const DirectLevel& level : levels) {
    for (const DirectKind& kind : level.kinds) {
      for (int hd : kind.head_dims) {
        for (int n_keys : {1, 7, 16, 17, 32}) {
          for (int n_rows : {1, 2, 3, 5, 8}) {
            SCOPED_TRACE(std::string(level.name) + " " + std::string(TypeName(kind.type)) +
                         " hd=" + std::to_string(hd) + " keys=" + std::to_string(n_keys) +
                         " rows=" + std::to_string(n_rows));
            ExpectDirectEqualsStaged(level, kind, hd, n_keys, n_rows, seed);
            seed += 8;
          }
        }
      }
    }
  }
}

#undef FUCINA_DIRECT_LEVEL

// q8_0 value rows: AttnRowAccumQ8_0 on every level against its contract written as a plain
// loop, bit for bit: per key in order, acc = fma(p * d, q, acc), the weight p times the block's
// f16 scale d rounded to f32, q the int8 value. Key counts past one 32-key pass of weights,
// every row count a block can have, head dims whose last chunk group is a lone 16-dim half
// block (96, 160); the rows are exactly n_keys long and start at odd offsets, so a scale or
// value read past the last row would leave the allocation. Scales span f16's range and the
// values reach -128 and 127.
TEST(AttentionTileKernelsTest, Q8_0ValueRowsMatchTheirContractBitForBit) {
  using AccumFn = decltype(&avx2::AttnRowAccumQ8_0);
  std::vector<std::pair<const char*, AccumFn>> levels;
  if (DetectedIsa() >= Isa::kAvx2) levels.emplace_back("avx2", avx2::AttnRowAccumQ8_0);
  if (DetectedIsa() >= Isa::kAvx512) levels.emplace_back("avx512", avx512::AttnRowAccumQ8_0);
  if (levels.empty()) GTEST_SKIP() << "no SIMD level on this machine";
  uint32_t seed = 500;
  for (int hd : {32, 64, 96, 128, 160, 256}) {
    const int64_t stride = static_cast<int64_t>(hd / kQK8_0 * sizeof(BlockQ8_0)) + 3;
    for (int n_keys : {1, 7, 16, 17, 32, 33, 70}) {
      // One allocation, the rows at an odd offset and ending at its last byte.
      std::vector<uint8_t> bytes(1 + stride * n_keys);
      uint8_t* rows = bytes.data() + 1;
      const std::vector<float> raw = Random(2 * n_keys * hd, -1.0f, 1.0f, seed++);
      for (int t = 0; t < n_keys; ++t) {
        for (int b = 0; b < hd / kQK8_0; ++b) {
          BlockQ8_0 block;
          // Scales from 2^-14 (f16's smallest normal) to 2^15, values over the whole int8 range.
          block.d = Fp32ToFp16(std::ldexp(1.0f + raw[2 * (t * hd + b)], (t * 7 + b * 5) % 30 - 14));
          for (int i = 0; i < kQK8_0; ++i) {
            const float x = raw[2 * (t * hd + b * kQK8_0 + i) + 1];
            block.qs[i] = static_cast<int8_t>(i == 0 ? -128 : i == 1 ? 127 : std::lround(127 * x));
          }
          std::memcpy(rows + t * stride + b * sizeof(BlockQ8_0), &block, sizeof(block));
        }
      }
      for (int n_rows : {1, 2, 3, 4, 5, 8}) {
        const int p_ld = n_keys + 5;
        const std::vector<float> p = Random(n_rows * p_ld, 0.0f, 1.0f, seed++);
        const std::vector<float> acc0 = Random(n_rows * hd, -4.0f, 4.0f, seed++);
        std::vector<float> want = acc0;
        for (int r = 0; r < n_rows; ++r) {
          for (int t = 0; t < n_keys; ++t) {
            const auto* row = reinterpret_cast<const BlockQ8_0*>(rows + t * stride);
            for (int d = 0; d < hd; ++d) {
              const BlockQ8_0& b = row[d / kQK8_0];
              const float w = p[r * p_ld + t] * Fp16ToFp32(b.d);
              float& a = want[r * hd + d];
              a = std::fma(w, static_cast<float>(b.qs[d % kQK8_0]), a);
            }
          }
        }
        for (const auto& [name, accum] : levels) {
          SCOPED_TRACE(std::string(name) + " hd=" + std::to_string(hd) + " keys=" +
                       std::to_string(n_keys) + " rows=" + std::to_string(n_rows));
          std::vector<float> got = acc0;
          accum(p.data(), p_ld, n_rows, rows, stride, hd, n_keys, hd, got.data());
          ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace fucina
