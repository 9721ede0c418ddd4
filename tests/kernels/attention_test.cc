// Causal GQA attention over f32 / f16 / q8_0 KV caches: every kernel level on this machine
// against the double-precision two-pass reference on the same cache contents, causality, head
// ranges, sliding windows over ring caches, and a hand-computed case. The SIMD tile kernels'
// own checks against plain loops and the staged path are in attention_tiles_test.cc.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"
#include "kernels/fp16.h"
#include "kernels/ggml_type.h"
#include "kernels/quant/blocks.h"
#include "tests/kernels/random_floats.h"

namespace fucina {
namespace {

std::vector<Isa> Levels() {
  std::vector<Isa> levels = {Isa::kScalar};
  if (DetectedIsa() >= Isa::kAvx2) levels.push_back(Isa::kAvx2);
  if (DetectedIsa() >= Isa::kAvx512) levels.push_back(Isa::kAvx512);
  return levels;
}

// A filled cache pair plus queries for one configuration.
struct AttnCase {
  KvLayout layout;
  std::vector<uint8_t> k, v;
  std::vector<float> q;
  AttentionArgs args;

  std::vector<float> kf;  // the keys as stored

  AttnCase(GgmlType type, int num_heads, int num_heads_kv, int head_dim, int64_t n_q, int64_t pos0,
        uint32_t seed) {
    layout.type = type;
    // Spare rows past the last query stay unread; whole tiles of 16 so q8_0 keys can be tiled.
    layout.capacity = (pos0 + n_q + 3 + 15) / 16 * 16;
    layout.num_heads_kv = num_heads_kv;
    layout.head_dim = head_dim;
    EXPECT_TRUE(ValidateKvLayout(layout).ok());
    k.assign(static_cast<size_t>(layout.TotalBytes()), 0);
    v.assign(static_cast<size_t>(layout.TotalBytes()), 0);
    const int64_t rows = layout.capacity;
    kf = Random(rows * num_heads_kv * head_dim, -1.0f, 1.0f, seed);
    const std::vector<float> vf = Random(rows * num_heads_kv * head_dim, -1.0f, 1.0f, seed + 1);
    StoreKvRows(layout, k.data(), 0, rows, kf.data());
    StoreKvRows(layout, v.data(), 0, rows, vf.data());
    // Queries large enough that the softmax is far from uniform (scores of a few units).
    q = Random(n_q * num_heads * head_dim, -2.5f, 2.5f, seed + 2);
    args.q = q.data();
    args.n_q = n_q;
    args.pos0 = pos0;
    args.num_heads = num_heads;
    args.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    args.layout = layout;
    args.k_cache = k.data();
    args.v_cache = v.data();
  }
  int64_t OutSize() const { return args.n_q * args.num_heads * layout.head_dim; }

  // Re-stores the keys as a tiles16 K cache (q8_0).
  void TileKeys() {
    KvLayout tiled = layout;
    tiled.tiles16 = true;
    EXPECT_TRUE(ValidateKvLayout(tiled).ok());
    std::fill(k.begin(), k.end(), 0);
    StoreKvRows(tiled, k.data(), 0, layout.capacity, kf.data());
    args.k_tiles16 = true;
  }
};

TEST(AttentionTest, HandComputedTwoPositions) {
  // head_dim 2, one head. K0 = [1, 0], K1 = [0, 1], V0 = [1, 2], V1 = [3, 4].
  // Query at position 0 sees only row 0: out = V0. Query at position 1 = [0, ln 3] with scale 1:
  // scores 0 and ln 3, weights 1/4 and 3/4, out = [2.5, 3.5].
  KvLayout l{GgmlType::kF32, 2, 1, 2};
  const float kf[4] = {1, 0, 0, 1}, vf[4] = {1, 2, 3, 4};
  std::vector<uint8_t> k(l.TotalBytes()), v(l.TotalBytes());
  StoreKvRows(l, k.data(), 0, 2, kf);
  StoreKvRows(l, v.data(), 0, 2, vf);
  const float q[4] = {5.0f, -7.0f, 0.0f, std::log(3.0f)};
  AttentionArgs a;
  a.q = q;
  a.n_q = 2;
  a.pos0 = 0;
  a.num_heads = 1;
  a.scale = 1.0f;
  a.layout = l;
  a.k_cache = k.data();
  a.v_cache = v.data();
  for (bool ref : {true, false}) {
    for (Isa isa : Levels()) {
      SCOPED_TRACE(std::string(ref ? "ref" : IsaName(isa)));
      float out[4];
      ref ? AttentionRef(a, out) : AttentionHeadsForIsa(isa, a, 0, 1, out);
      EXPECT_NEAR(out[0], 1.0, 1e-6);
      EXPECT_NEAR(out[1], 2.0, 1e-6);
      EXPECT_NEAR(out[2], 2.5, 1e-6);
      EXPECT_NEAR(out[3], 3.5, 1e-6);
    }
  }
}

struct Config {
  GgmlType type;
  int head_dim;
};

TEST(AttentionTest, AllLevelsMatchReference) {
  // head_dim 36 and 40 exercise the 8- and 16-lane tails of the f32/f16 kernels.
  const Config configs[] = {{GgmlType::kF32, 64},  {GgmlType::kF32, 36}, {GgmlType::kF16, 128},
                            {GgmlType::kF16, 40},  {GgmlType::kQ8_0, 64}, {GgmlType::kQ8_0, 96}};
  for (const Config& c : configs) {
    double worst = 0.0;
    for (int group : {1, 2, 4}) {
      for (int64_t n_q : {1, 5}) {
        for (int64_t pos0 : {0, 37, 100}) {
          const int kv_heads = 2;
          AttnCase s(c.type, kv_heads * group, kv_heads, c.head_dim, n_q, pos0,
                  static_cast<uint32_t>(group * 1000 + n_q * 100 + pos0));
          std::vector<float> want(s.OutSize());
          AttentionRef(s.args, want.data());
          for (Isa isa : Levels()) {
            SCOPED_TRACE(std::string(TypeName(c.type)) + " hd=" + std::to_string(c.head_dim) +
                         " group=" + std::to_string(group) + " n_q=" + std::to_string(n_q) +
                         " pos0=" + std::to_string(pos0) + " " + std::string(IsaName(isa)));
            std::vector<float> got(s.OutSize(), std::nanf(""));
            AttentionHeadsForIsa(isa, s.args, 0, s.args.num_heads, got.data());
            for (size_t i = 0; i < got.size(); ++i) {
              // Outputs are convex combinations of |V| <= 1 values: absolute tolerance.
              ASSERT_NEAR(got[i], want[i], 2e-6) << i;
              worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
            }
          }
        }
      }
    }
    std::printf("  %-5s head_dim %3d: max |attention - reference| %.3g\n",
                std::string(TypeName(c.type)).c_str(), c.head_dim, worst);
  }
}

TEST(AttentionTest, TiledQ8_0KeysGiveTheRowMajorBitsOnEveryLevel) {
  // The same quantized keys in tiles16 tiles: the tile kernel (or, at levels without it, the
  // rows unpacked first) computes the same integer block sums, scales and order as the
  // row-major path, so outputs are identical; the reference reads the tiles through
  // LoadKvHead. Decode pairs, prefill blocks past one 32-key tile, partial last tiles,
  // windows.
  for (int head_dim : {64, 128}) {
    for (int group : {1, 2, 12}) {  // 12: more query rows than the tile kernel's 8 columns
      for (int64_t n_q : {1, 3, 40}) {
        for (int64_t pos0 : {0, 29, 100}) {
          for (int64_t window : {0, 20}) {
            SCOPED_TRACE("hd=" + std::to_string(head_dim) + " group=" + std::to_string(group) +
                         " n_q=" + std::to_string(n_q) + " pos0=" + std::to_string(pos0) +
                         " window=" + std::to_string(window));
            const uint32_t seed = static_cast<uint32_t>(head_dim + group * 7 + n_q * 11 + pos0);
            AttnCase rows(GgmlType::kQ8_0, 2 * group, 2, head_dim, n_q, pos0, seed);
            AttnCase tiled(GgmlType::kQ8_0, 2 * group, 2, head_dim, n_q, pos0, seed);
            rows.args.window = tiled.args.window = window;
            tiled.TileKeys();
            ASSERT_NE(rows.k, tiled.k);  // the layouts differ
            std::vector<float> want(rows.OutSize()), want_tiled(rows.OutSize());
            AttentionRef(rows.args, want.data());
            AttentionRef(tiled.args, want_tiled.data());
            ASSERT_EQ(want, want_tiled);
            for (Isa isa : Levels()) {
              SCOPED_TRACE(std::string(IsaName(isa)));
              std::vector<float> a(rows.OutSize(), std::nanf("")), b(a);
              AttentionHeadsForIsa(isa, rows.args, 0, rows.args.num_heads, a.data());
              AttentionHeadsForIsa(isa, tiled.args, 0, tiled.args.num_heads, b.data());
              ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
              for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], want[i], 2e-6) << i;
            }
          }
        }
      }
    }
  }
}

TEST(AttentionTest, GqaGroupsAndPrefillBlocksMatchReference) {
  // Group sizes 1..8 change how many query rows share a converted K/V tile, and n_q 40 (more
  // than a 32-key tile, several query blocks) covers blocks whose queries see different key
  // counts; head_dim 36/40 leave zero-padded buffer columns.
  const Config configs[] = {{GgmlType::kF32, 36}, {GgmlType::kF16, 40}, {GgmlType::kF16, 128},
                            {GgmlType::kQ8_0, 32}};
  for (const Config& c : configs) {
    double worst = 0.0;
    for (int group : {1, 2, 4, 8}) {
      for (int64_t n_q : {1, 3, 40}) {
        for (int64_t pos0 : {0, 45}) {
          AttnCase s(c.type, group, 1, c.head_dim, n_q, pos0,
                     static_cast<uint32_t>(77 + group * 1000 + n_q * 100 + pos0));
          std::vector<float> want(s.OutSize());
          AttentionRef(s.args, want.data());
          for (Isa isa : Levels()) {
            SCOPED_TRACE(std::string(TypeName(c.type)) + " hd=" + std::to_string(c.head_dim) +
                         " group=" + std::to_string(group) + " n_q=" + std::to_string(n_q) +
                         " pos0=" + std::to_string(pos0) + " " + std::string(IsaName(isa)));
            std::vector<float> got(s.OutSize(), std::nanf(""));
            AttentionHeadsForIsa(isa, s.args, 0, s.args.num_heads, got.data());
            for (size_t i = 0; i < got.size(); ++i) {
              ASSERT_NEAR(got[i], want[i], 2e-6) << i;
              worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
            }
          }
        }
      }
    }
    std::printf("  %-5s head_dim %3d, groups 1-8: max |attention - reference| %.3g\n",
                std::string(TypeName(c.type)).c_str(), c.head_dim, worst);
  }
}

// `all`, the output of `block` (several queries in one call), holds for each query the bits
// it gets run alone (decode).
void ExpectEachQueryAlone(Isa isa, const AttentionArgs& block, const std::vector<float>& all) {
  const int64_t per_query = block.num_heads * block.layout.head_dim;
  for (int64_t i = 0; i < block.n_q; ++i) {
    AttentionArgs one = block;
    one.q = block.q + i * per_query;
    one.n_q = 1;
    one.pos0 = block.pos0 + i;
    std::vector<float> alone(per_query);
    AttentionHeadsForIsa(isa, one, 0, one.num_heads, alone.data());
    for (int64_t e = 0; e < per_query; ++e) {
      ASSERT_EQ(all[i * per_query + e], alone[e]) << "query " << i << " element " << e;
    }
  }
}

TEST(AttentionTest, PrefillBlockEqualsOneQueryAtATime) {
  // Queries batched into one block must give bit-identical results to the same queries run
  // alone (decode): keys past a query's causal limit get weight exactly 0.
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    for (int group : {1, 2, 3}) {
      constexpr int64_t kNq = 11, kPos0 = 27;
      AttnCase s(type, 2 * group, 2, 64, kNq, kPos0, 99 + group);
      for (Isa isa : Levels()) {
        SCOPED_TRACE(std::string(TypeName(type)) + " group=" + std::to_string(group) + " " +
                     std::string(IsaName(isa)));
        std::vector<float> all(s.OutSize());
        AttentionHeadsForIsa(isa, s.args, 0, s.args.num_heads, all.data());
        ExpectEachQueryAlone(isa, s.args, all);
      }
    }
  }
}

TEST(AttentionTest, LongContextMatchesReferenceAndDecode) {
  // 600+ keys: a q8_0 K cache is scored 256 keys per call, so the keys cross several score
  // calls and end in a partial one. The result matches the reference, and a prefill block
  // (staged V) gives each query the bits it gets alone (decode).
  constexpr int64_t kNq = 9, kPos0 = 601;
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0}) {
    for (bool tiled : {false, true}) {
      if (tiled && type != GgmlType::kQ8_0) continue;
      AttnCase s(type, 4, 2, 64, kNq, kPos0, 7 + static_cast<uint32_t>(tiled));
      if (tiled) s.TileKeys();
      std::vector<float> want(s.OutSize());
      AttentionRef(s.args, want.data());
      for (Isa isa : Levels()) {
        SCOPED_TRACE(std::string(TypeName(type)) + (tiled ? " tiled K " : " ") +
                     std::string(IsaName(isa)));
        std::vector<float> all(s.OutSize());
        AttentionHeadsForIsa(isa, s.args, 0, s.args.num_heads, all.data());
        for (size_t i = 0; i < all.size(); ++i) ASSERT_NEAR(all[i], want[i], 2e-6) << i;
        ExpectEachQueryAlone(isa, s.args, all);
      }
    }
  }
}

std::string Trace(GgmlType type, int group, int64_t window, int64_t n_q, int64_t pos0, Isa isa) {
  return std::string(TypeName(type)) + " group=" + std::to_string(group) +
         " window=" + std::to_string(window) + " n_q=" + std::to_string(n_q) +
         " pos0=" + std::to_string(pos0) + " " + std::string(IsaName(isa));
}

TEST(AttentionTest, SlidingWindowMatchesReference) {
  // Windows of one key, shorter than a 32-key tile, crossing a tile edge, and longer than the
  // sequence; query blocks whose queries start in different tiles.
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    for (int group : {1, 3}) {
      for (int64_t window : {1, 5, 33, 500}) {
        for (int64_t n_q : {1, 7, 40}) {
          for (int64_t pos0 : {0, 45, 100}) {
            AttnCase s(type, 2 * group, 2, 64, n_q, pos0,
                       static_cast<uint32_t>(window * 7 + group * 1000 + n_q * 100 + pos0));
            s.args.window = window;
            std::vector<float> want(s.OutSize());
            AttentionRef(s.args, want.data());
            for (Isa isa : Levels()) {
              SCOPED_TRACE(Trace(type, group, window, n_q, pos0, isa));
              std::vector<float> got(s.OutSize(), std::nanf(""));
              AttentionHeadsForIsa(isa, s.args, 0, s.args.num_heads, got.data());
              for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-6) << i;
              // A window at least as long as every query's history is no window at all, bit
              // for bit; a shorter one changes the later queries.
              AttentionArgs unwindowed = s.args;
              unwindowed.window = 0;
              std::vector<float> all(s.OutSize());
              AttentionHeadsForIsa(isa, unwindowed, 0, s.args.num_heads, all.data());
              if (window >= pos0 + n_q) {
                ASSERT_EQ(got, all);
              } else {
                ASSERT_NE(got, all);
              }
            }
          }
        }
      }
    }
  }
}

TEST(AttentionTest, WindowHidesOlderRows) {
  // Junk in the rows just before a query's window changes nothing for that query.
  constexpr int64_t kWindow = 6, kPos0 = 70, kNq = 3;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(std::string(TypeName(type)));
    AttnCase s(type, 4, 2, 32, kNq, kPos0, 8);
    s.args.window = kWindow;
    std::vector<float> before(s.OutSize()), after(s.OutSize());
    Attention(s.args, before.data());
    // Positions [kPos0 - kWindow - 10, kPos0 - kWindow] are outside every query's window
    // (query 0 at kPos0 sees [kPos0 - kWindow + 1, kPos0]). Large but finite, as rows a ring
    // overwrote are.
    const std::vector<float> junk = Random(11 * 2 * 32, -50.0f, 50.0f, 9);
    StoreKvRows(s.layout, s.k.data(), kPos0 - kWindow - 10, 11, junk.data());
    StoreKvRows(s.layout, s.v.data(), kPos0 - kWindow - 10, 11, junk.data());
    Attention(s.args, after.data());
    EXPECT_EQ(before, after);
    // Row kPos0 - kWindow + 1 is inside query 0's window only.
    StoreKvRows(s.layout, s.v.data(), kPos0 - kWindow + 1, 1, junk.data());
    Attention(s.args, after.data());
    const int64_t per_query = 4 * 32;
    EXPECT_NE(std::vector<float>(before.begin(), before.begin() + per_query),
              std::vector<float>(after.begin(), after.begin() + per_query));
    EXPECT_EQ(std::vector<float>(before.begin() + per_query, before.end()),
              std::vector<float>(after.begin() + per_query, after.end()));
  }
}

// The same positions stored in a cache holding all of them and in a ring of kRing rows (a
// multiple of the 32-key tile, as KvCache sizes rings), written in chunks that wrap.
struct RingCase {
  static constexpr int kHeadsKv = 2, kHeadDim = 64;
  KvLayout full, ring;
  bool tiled_k;  // K caches in tiles16 (q8_0; the full cache's rows round up to 16)
  std::vector<uint8_t> full_k, full_v, ring_k, ring_v;

  RingCase(GgmlType type, int64_t positions, int64_t ring_rows, uint32_t seed,
           bool tiled = false)
      : full{type, tiled ? (positions + 15) / 16 * 16 : positions, kHeadsKv, kHeadDim},
        ring{type, ring_rows, kHeadsKv, kHeadDim},
        tiled_k(tiled) {
    full_k.assign(full.TotalBytes(), 0);
    full_v.assign(full.TotalBytes(), 0);
    ring_k.assign(ring.TotalBytes(), 0);
    ring_v.assign(ring.TotalBytes(), 0);
    KvLayout full_keys = full, ring_keys = ring;
    full_keys.tiles16 = ring_keys.tiles16 = tiled;
    const int64_t per_pos = kHeadsKv * kHeadDim;
    const std::vector<float> kf = Random(positions * per_pos, -1.0f, 1.0f, seed);
    const std::vector<float> vf = Random(positions * per_pos, -1.0f, 1.0f, seed + 1);
    StoreKvRows(full_keys, full_k.data(), 0, positions, kf.data());
    StoreKvRows(full, full_v.data(), 0, positions, vf.data());
    for (int64_t p = 0; p < positions; p += 13) {
      const int64_t n = std::min<int64_t>(13, positions - p);
      StoreKvRows(ring_keys, ring_k.data(), p, n, kf.data() + p * per_pos);
      StoreKvRows(ring, ring_v.data(), p, n, vf.data() + p * per_pos);
    }
  }
  AttentionArgs Args(const float* q, int num_heads, int64_t n_q, int64_t pos0, int64_t window,
                     bool use_ring) const {
    AttentionArgs a;
    a.q = q;
    a.n_q = n_q;
    a.pos0 = pos0;
    a.window = window;
    a.num_heads = num_heads;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
    a.layout = use_ring ? ring : full;
    a.k_tiles16 = tiled_k;
    a.k_cache = use_ring ? ring_k.data() : full_k.data();
    a.v_cache = use_ring ? ring_v.data() : full_v.data();
    return a;
  }
};

TEST(AttentionTest, RingCacheHoldsTheLastRows) {
  // 230 positions through a 64-row ring: the queries at the end see only what the ring still
  // holds, and get the bits the full cache gives. Up to ring - window + 1 queries fit in one
  // call (Model::ForwardLayers' round limit): one more and the oldest query's first key has
  // been overwritten.
  constexpr int64_t kPositions = 230, kRing = 64;
  const std::pair<GgmlType, bool> cases[] = {{GgmlType::kF32, false},
                                             {GgmlType::kF16, false},
                                             {GgmlType::kQ8_0, false},
                                             {GgmlType::kQ8_0, true}};  // tiled K
  for (const auto& [type, tiled] : cases) {
    for (int64_t window : {1, 8, 40, 64}) {
      const int group = 2, heads = RingCase::kHeadsKv * group;
      RingCase c(type, kPositions, kRing, static_cast<uint32_t>(window), tiled);
      SCOPED_TRACE(tiled ? "tiled K" : "row-major K");
      const int64_t max_q = kRing - window + 1;
      const int64_t per_query = heads * RingCase::kHeadDim;
      const std::vector<float> q = Random((max_q + 1) * per_query, -2.5f, 2.5f, 3);
      for (int64_t n_q : {int64_t{1}, max_q, max_q + 1}) {
        const int64_t pos0 = kPositions - n_q;
        const float* qp = q.data() + (max_q + 1 - n_q) * per_query;
        const AttentionArgs on_ring = c.Args(qp, heads, n_q, pos0, window, true);
        const AttentionArgs on_full = c.Args(qp, heads, n_q, pos0, window, false);
        std::vector<float> want(n_q * per_query);
        AttentionRef(on_full, want.data());
        for (Isa isa : Levels()) {
          SCOPED_TRACE(Trace(type, group, window, n_q, pos0, isa));
          std::vector<float> got(n_q * per_query), full(n_q * per_query);
          AttentionHeadsForIsa(isa, on_ring, 0, heads, got.data());
          AttentionHeadsForIsa(isa, on_full, 0, heads, full.data());
          if (n_q <= max_q) {
            for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-6) << i;
            ASSERT_EQ(got, full);
          } else {
            // The oldest query lost a key; the others still match.
            EXPECT_NE(std::vector<float>(got.begin(), got.begin() + per_query),
                      std::vector<float>(full.begin(), full.begin() + per_query));
            EXPECT_EQ(std::vector<float>(got.begin() + per_query, got.end()),
                      std::vector<float>(full.begin() + per_query, full.end()));
          }
        }
      }
    }
  }
}

TEST(AttentionTest, WindowedPrefillBlockEqualsOneQueryAtATime) {
  // As PrefillBlockEqualsOneQueryAtATime, with windows over a ring that has wrapped: queries
  // of one block start in different tiles, and a query skips the tiles before its window, so
  // a decode step and a prefill give the same bits.
  constexpr int64_t kPositions = 150, kRing = 96, kNq = 11;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    for (int64_t window : {5, 37}) {
      for (int group : {1, 2, 3}) {
        const int heads = RingCase::kHeadsKv * group;
        RingCase c(type, kPositions, kRing, static_cast<uint32_t>(40 + window + group));
        const int64_t per_query = heads * RingCase::kHeadDim, pos0 = kPositions - kNq;
        const std::vector<float> q = Random(kNq * per_query, -2.5f, 2.5f, 12 + group);
        for (Isa isa : Levels()) {
          SCOPED_TRACE(Trace(type, group, window, kNq, pos0, isa));
          const AttentionArgs block = c.Args(q.data(), heads, kNq, pos0, window, true);
          std::vector<float> all(kNq * per_query);
          AttentionHeadsForIsa(isa, block, 0, heads, all.data());
          ExpectEachQueryAlone(isa, block, all);
        }
      }
    }
  }
}

TEST(AttentionTileKernelsTest, LoadRowsIsExactAndLeavesPadding) {
  // Every level converts a tile exactly like LoadKvHead and does not write columns >= hd.
  using LoadFn = decltype(&avx2::AttnLoadRowsF16);
  const Config configs[] = {{GgmlType::kF32, 36}, {GgmlType::kF32, 40}, {GgmlType::kF16, 36},
                            {GgmlType::kF16, 40}, {GgmlType::kF16, 128}};
  for (const Config& c : configs) {
    std::vector<std::pair<std::string, LoadFn>> levels;
    const bool f16 = c.type == GgmlType::kF16;
    if (DetectedIsa() >= Isa::kAvx2) {
      levels.emplace_back("avx2", f16 ? avx2::AttnLoadRowsF16 : avx2::AttnLoadRowsF32);
    }
    if (DetectedIsa() >= Isa::kAvx512) {
      levels.emplace_back("avx512", f16 ? avx512::AttnLoadRowsF16 : avx512::AttnLoadRowsF32);
    }
    const int hd = c.head_dim, ld = (hd + 15) / 16 * 16 + 16;
    AttnCase s(c.type, 2, 2, hd, 1, 20, 11);  // 24 rows; tile of 21 rows of kv head 1.
    const int n_rows = 21;
    std::vector<float> want(hd);
    for (const auto& [name, load] : levels) {
      SCOPED_TRACE(std::string(TypeName(c.type)) + " hd=" + std::to_string(hd) + " " + name);
      std::vector<float> dst(static_cast<size_t>(n_rows + 1) * ld, 7.0f);
      load(s.k.data() + s.layout.RowOffset(0, 1), s.layout.HeadBytes(), n_rows, hd, ld,
           dst.data());
      for (int t = 0; t < n_rows + 1; ++t) {
        if (t < n_rows) LoadKvHead(s.layout, s.k.data(), t, 1, want.data());
        for (int d = 0; d < ld; ++d) {
          const float expect = (t < n_rows && d < hd) ? want[d] : 7.0f;
          ASSERT_EQ(dst[t * ld + d], expect) << t << " " << d;
        }
      }
    }
  }
}

TEST(AttentionTest, FutureRowsDoNotLeakIntoEarlierQueries) {
  // Tiled q8_0 keys too: a partial last tile is scored whole, so NaN rows in its spare lanes
  // must stay out of every output.
  const std::pair<GgmlType, bool> cases[] = {{GgmlType::kF32, false},
                                             {GgmlType::kF16, false},
                                             {GgmlType::kQ8_0, false},
                                             {GgmlType::kQ8_0, true}};
  for (const auto& [type, tiled] : cases) {
    SCOPED_TRACE(std::string(TypeName(type)) + (tiled ? " tiled K" : ""));
    constexpr int64_t kNq = 4, kPos0 = 10;
    AttnCase s(type, 4, 2, 32, kNq, kPos0, 42);
    if (tiled) s.TileKeys();
    KvLayout k_layout = s.layout;
    k_layout.tiles16 = tiled;
    for (Isa isa : Levels()) {
      SCOPED_TRACE(std::string(IsaName(isa)));
      AttnCase c = s;
      c.args.k_cache = c.k.data();
      c.args.v_cache = c.v.data();
      std::vector<float> before(c.OutSize()), after(c.OutSize());
      AttentionHeadsForIsa(isa, c.args, 0, c.args.num_heads, before.data());
      // Overwrite cache row kPos0 + 2 (seen by queries 2 and 3 only) with very different K/V.
      const std::vector<float> junk = Random(2 * 32, -9.0f, 9.0f, 7);
      StoreKvRows(k_layout, c.k.data(), kPos0 + 2, 1, junk.data());
      StoreKvRows(c.layout, c.v.data(), kPos0 + 2, 1, junk.data());
      AttentionHeadsForIsa(isa, c.args, 0, c.args.num_heads, after.data());
      const int64_t per_query = 4 * 32;
      for (int64_t i = 0; i < 2 * per_query; ++i) EXPECT_EQ(before[i], after[i]) << i;
      int changed = 0;
      for (int64_t i = 2 * per_query; i < kNq * per_query; ++i) changed += before[i] != after[i];
      EXPECT_GT(changed, per_query);  // both later queries moved.
      // The spare rows past pos0 + n_q are never read: garbage there changes nothing.
      const std::vector<float> nan_rows(2 * 32 * 3, std::nanf(""));
      StoreKvRows(k_layout, c.k.data(), kPos0 + kNq, 3, nan_rows.data());
      StoreKvRows(c.layout, c.v.data(), kPos0 + kNq, 3, nan_rows.data());
      std::vector<float> again(c.OutSize());
      AttentionHeadsForIsa(isa, c.args, 0, c.args.num_heads, again.data());
      EXPECT_EQ(0, std::memcmp(after.data(), again.data(), after.size() * sizeof(float)));
    }
  }
}

TEST(AttentionTest, HeadRangeWritesOnlyItsHeads) {
  AttnCase s(GgmlType::kF16, 8, 2, 64, 3, 20, 5);
  std::vector<float> full(s.OutSize());
  Attention(s.args, full.data());
  // Two "threads": [0, 3) and [3, 8) (3 splits a GQA group of 4) fill the same result.
  std::vector<float> split(s.OutSize(), -123.0f);
  AttentionHeads(s.args, 0, 3, split.data());
  for (int64_t i = 0; i < s.args.n_q; ++i) {
    for (int h = 3; h < 8; ++h) EXPECT_EQ(split[(i * 8 + h) * 64], -123.0f);
  }
  AttentionHeads(s.args, 3, 8, split.data());
  EXPECT_EQ(split, full);
}

TEST(KvCacheTest, StoreConvertsLikeGgml) {
  KvLayout l{GgmlType::kQ8_0, 2, 1, 32};
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = (j - 10) * 0.25f;  // amax = 21 * 0.25 = 5.25.
  std::vector<uint8_t> cache(l.TotalBytes());
  StoreKvRows(l, cache.data(), 1, 1, x.data());
  const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(cache.data() + l.RowOffset(1, 0));
  const float d = 5.25f / 127.0f;
  EXPECT_EQ(b->d, Fp32ToFp16(d));
  for (int j = 0; j < 32; ++j) EXPECT_EQ(b->qs[j], static_cast<int8_t>(std::roundf(x[j] / d)));
  EXPECT_EQ(b->qs[31], 127);
  std::vector<float> back(32);
  LoadKvHead(l, cache.data(), 1, 0, back.data());
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(back[j], Fp16ToFp32(b->d) * b->qs[j]);
    EXPECT_NEAR(back[j], x[j], d);  // q8_0 error is at most half a step (plus f16 scale).
  }
  KvLayout h{GgmlType::kF16, 1, 2, 3};
  const float hx[6] = {1.0f / 3.0f, -2.5f, 65504.0f, 1e-8f, 0.1f, -0.0f};
  std::vector<uint8_t> hc(h.TotalBytes());
  StoreKvRows(h, hc.data(), 0, 1, hx);
  float hb[3];
  LoadKvHead(h, hc.data(), 0, 1, hb);  // kv head 1 = hx[3..5].
  for (int j = 0; j < 3; ++j) EXPECT_EQ(hb[j], Fp16ToFp32(Fp32ToFp16(hx[3 + j])));
}

TEST(KvCacheTest, StoreWrapsAroundTheRing) {
  // 20 positions from 25 into a 32-row ring: rows 25..31 then 0..12; rows 13..24 untouched.
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(std::string(TypeName(type)));
    const KvLayout l{type, 32, 2, 32};
    std::vector<uint8_t> cache(l.TotalBytes(), 0xAB);
    const std::vector<float> x = Random(20 * 2 * 32, -3.0f, 3.0f, 4);
    StoreKvRows(l, cache.data(), 25, 20, x.data());
    // What one position converts to, stored alone in a one-row cache.
    const KvLayout one{type, 1, 2, 32};
    std::vector<uint8_t> row(one.TotalBytes());
    for (int64_t i = 0; i < 20; ++i) {
      StoreKvRows(one, row.data(), 0, 1, x.data() + i * 2 * 32);
      for (int h = 0; h < 2; ++h) {
        EXPECT_EQ(0, std::memcmp(cache.data() + l.RowOffset(25 + i, h),
                                 row.data() + one.RowOffset(0, h), l.HeadBytes()))
            << "position " << 25 + i << " head " << h;
      }
      std::vector<float> back(32), want(32);
      LoadKvHead(l, cache.data(), 25 + i, 1, back.data());
      LoadKvHead(one, row.data(), 0, 1, want.data());
      EXPECT_EQ(back, want) << "position " << 25 + i;
    }
    for (int64_t r = 13; r < 25; ++r) {
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = cache.data() + l.RowOffset(r, h);
        EXPECT_TRUE(std::all_of(p, p + l.HeadBytes(), [](uint8_t b) { return b == 0xAB; }))
            << "row " << r << " head " << h << " was written";
      }
    }
  }
}

TEST(KvCacheTest, TiledStoreWritesOnlyItsRowsAroundTheRing) {
  // 20 positions from 25 into a 32-row tiled ring: rows 25..31 then 0..12, each read back as
  // a one-row row-major cache holds it; rows 13..24 keep what the tiles held before.
  KvLayout l{GgmlType::kQ8_0, 32, 2, 64};
  l.tiles16 = true;
  ASSERT_TRUE(ValidateKvLayout(l).ok());
  std::vector<uint8_t> cache(l.TotalBytes(), 0xAB);
  const std::vector<uint8_t> before = cache;
  const std::vector<float> x = Random(20 * 2 * 64, -3.0f, 3.0f, 6);
  StoreKvRows(l, cache.data(), 25, 20, x.data());
  const KvLayout one{GgmlType::kQ8_0, 1, 2, 64};
  std::vector<uint8_t> row(one.TotalBytes());
  std::vector<float> back(64), want(64);
  for (int64_t i = 0; i < 20; ++i) {
    StoreKvRows(one, row.data(), 0, 1, x.data() + i * 2 * 64);
    for (int h = 0; h < 2; ++h) {
      LoadKvHead(l, cache.data(), 25 + i, h, back.data());
      LoadKvHead(one, row.data(), 0, h, want.data());
      EXPECT_EQ(back, want) << "position " << 25 + i << " head " << h;
    }
  }
  for (int64_t r = 13; r < 25; ++r) {
    for (int h = 0; h < 2; ++h) {
      LoadKvHead(l, cache.data(), r, h, back.data());
      LoadKvHead(l, before.data(), r, h, want.data());
      EXPECT_EQ(0, std::memcmp(back.data(), want.data(), 64 * sizeof(float)))
          << "row " << r << " head " << h << " was written";
    }
  }
}

TEST(KvCacheTest, ValidateRejectsBadLayouts) {
  EXPECT_TRUE(ValidateKvLayout({GgmlType::kQ8_0, 16, 2, 64}).ok());
  EXPECT_TRUE(ValidateKvLayout({GgmlType::kQ8_0, 32, 2, 64, true}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kQ8_0, 24, 2, 64, true}).ok());  // part of a tile
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kF16, 32, 2, 64, true}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kQ8_0, 16, 2, 40}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kQ4_0, 16, 2, 64}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kF32, 0, 2, 64}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kF16, 16, 2, 0}).ok());
}

}  // namespace
}  // namespace fucina
