// The attention tile kernels of every SIMD level on this machine (kernels/cpu/ops_isa.h):
// scores and weighted sums against plain loops, and the direct kernels, which read K and V
// straight from cache rows, against the staged path through an f32 tile buffer, bit for bit.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"
#include "kernels/ggml_type.h"
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
  decltype(&avx2::AttnRowScoresF16) scores;  // null: q8_0 K is scored by integer dots
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
          {40, 64, 100, 128}},                                                                 \
         {GgmlType::kQ8_0, ns::AttnLoadRowsQ8_0, nullptr, ns::AttnRowAccumQ8_0, {64, 96, 128}}} \
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
  if (kind.scores != nullptr) {
    kind.scores(q.data(), n_rows, ld, k.data(), stride, hd, n_keys, s_direct.data(), 32);
    ASSERT_EQ(0, std::memcmp(s_staged.data(), s_direct.data(), s_staged.size() * 4));
  }

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

}  // namespace
}  // namespace fucina
