// Causal GQA attention over f32 / f16 / q8_0 KV caches: every kernel level on this machine
// against the double-precision two-pass reference on the same cache contents, causality, head
// ranges, and a hand-computed case.
#include "kernels/attention.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/isa.h"
#include "kernels/fp16.h"
#include "kernels/ggml_type.h"
#include "kernels/quant/blocks.h"

namespace fucina {
namespace {

std::vector<float> Random(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

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

  AttnCase(GgmlType type, int num_heads, int num_heads_kv, int head_dim, int64_t n_q, int64_t pos0,
        uint32_t seed) {
    layout.type = type;
    layout.capacity = pos0 + n_q + 3;  // spare rows past the last query stay unread.
    layout.num_heads_kv = num_heads_kv;
    layout.head_dim = head_dim;
    EXPECT_TRUE(ValidateKvLayout(layout).ok());
    k.assign(static_cast<size_t>(layout.TotalBytes()), 0);
    v.assign(static_cast<size_t>(layout.TotalBytes()), 0);
    const int64_t rows = layout.capacity;
    const std::vector<float> kf = Random(rows * num_heads_kv * head_dim, -1.0f, 1.0f, seed);
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

TEST(AttentionTest, FutureRowsDoNotLeakIntoEarlierQueries) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(std::string(TypeName(type)));
    constexpr int64_t kNq = 4, kPos0 = 10;
    AttnCase s(type, 4, 2, 32, kNq, kPos0, 42);
    std::vector<float> before(s.OutSize()), after(s.OutSize());
    Attention(s.args, before.data());
    // Overwrite cache row kPos0 + 2 (seen by queries 2 and 3 only) with very different K/V.
    const std::vector<float> junk = Random(2 * 32, -9.0f, 9.0f, 7);
    StoreKvRows(s.layout, s.k.data(), kPos0 + 2, 1, junk.data());
    StoreKvRows(s.layout, s.v.data(), kPos0 + 2, 1, junk.data());
    Attention(s.args, after.data());
    const int64_t per_query = 4 * 32;
    for (int64_t i = 0; i < 2 * per_query; ++i) EXPECT_EQ(before[i], after[i]) << i;
    int changed = 0;
    for (int64_t i = 2 * per_query; i < kNq * per_query; ++i) changed += before[i] != after[i];
    EXPECT_GT(changed, per_query);  // both later queries moved.
    // The spare rows past pos0 + n_q are never read: garbage there changes nothing.
    const std::vector<float> nan_rows(2 * 32 * 3, std::nanf(""));
    StoreKvRows(s.layout, s.k.data(), kPos0 + kNq, 3, nan_rows.data());
    std::vector<float> again(s.OutSize());
    Attention(s.args, again.data());
    EXPECT_EQ(after, again);
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
  const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(cache.data() + l.PositionBytes());
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

TEST(KvCacheTest, ValidateRejectsBadLayouts) {
  EXPECT_TRUE(ValidateKvLayout({GgmlType::kQ8_0, 16, 2, 64}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kQ8_0, 16, 2, 40}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kQ4_0, 16, 2, 64}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kF32, 0, 2, 64}).ok());
  EXPECT_FALSE(ValidateKvLayout({GgmlType::kF16, 16, 2, 0}).ok());
}

}  // namespace
}  // namespace fucina
