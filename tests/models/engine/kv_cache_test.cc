// KvCache with per-layer geometry: what each layer allocates (global rows, sliding-window rings,
// nothing for layers reading another layer's K/V), which positions a ring still holds, and how
// far a cache rolls back (Truncate, CopyPrefixFrom) once a ring has wrapped.
#include "models/engine/kv_cache.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/attention.h"

namespace fucina {
namespace {

using Geometry = std::vector<KvLayerGeometry>;

// A global layer, a sliding layer of window 8, and a layer reading each (gemma4's shape).
Geometry Mixed() {
  return {{2, 32, 0, -1}, {1, 64, 8, -1}, {2, 32, 0, 0}, {1, 64, 8, 1}};
}

std::unique_ptr<KvCache> MustCreate(const Geometry& g, GgmlType type, int64_t capacity) {
  auto kv = KvCache::Create(g, type, capacity);
  EXPECT_TRUE(kv.ok()) << kv.status();
  return kv.ok() ? *std::move(kv) : nullptr;
}

// The value stored for (position, layer, kv head, element): tells positions apart after a copy.
float Value(int64_t pos, int64_t layer, int head, int d) {
  return static_cast<float>(pos) + 0.25f * static_cast<float>(layer) +
         0.0625f * static_cast<float>(head) - 0.001f * static_cast<float>(d);
}

// Stores positions [len, len + n) in every layer that stores K/V, as a forward pass does, and
// advances the cache. K gets Value(), V its negation.
void Append(KvCache& kv, int64_t n) {
  for (int64_t l = 0; l < kv.num_layers(); ++l) {
    if (!kv.stores(l)) continue;
    const KvLayout& layout = kv.layout(l);
    std::vector<float> k(n * layout.num_heads_kv * layout.head_dim), v(k.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int h = 0; h < layout.num_heads_kv; ++h) {
        for (int d = 0; d < layout.head_dim; ++d) {
          const size_t at = (i * layout.num_heads_kv + h) * layout.head_dim + d;
          k[at] = Value(kv.len() + i, l, h, d);
          v[at] = -k[at];
        }
      }
    }
    StoreKvRows(kv.key_layout(l), kv.k(l), kv.len(), n, k.data());
    StoreKvRows(layout, kv.v(l), kv.len(), n, v.data());
  }
  kv.Advance(n);
}

// Whether layer `layer` (its own storage or its source's) holds position `pos` as Append wrote
// it, in K and V: the values after the cache type's rounding (a one-position cache of that
// type converts them the same way).
bool Holds(const KvCache& kv, int64_t layer, int64_t pos) {
  const KvLayout& layout = kv.layout(layer);
  const int64_t storage = kv.stores(layer) ? layer : kv.geometry(layer).source;
  const KvLayout one{layout.type, 1, 1, layout.head_dim};
  std::vector<uint8_t> row(one.TotalBytes());
  std::vector<float> want(layout.head_dim), got(layout.head_dim), in(layout.head_dim);
  for (int h = 0; h < layout.num_heads_kv; ++h) {
    for (float sign : {1.0f, -1.0f}) {
      for (int d = 0; d < layout.head_dim; ++d) in[d] = sign * Value(pos, storage, h, d);
      StoreKvRows(one, row.data(), 0, 1, in.data());
      LoadKvHead(one, row.data(), 0, 0, want.data());
      LoadKvHead(sign > 0 ? kv.key_layout(layer) : layout, sign > 0 ? kv.k(layer) : kv.v(layer),
                 pos, h, got.data());
      if (got != want) return false;
    }
  }
  return true;
}

TEST(KvRows, WindowPlusSlackInWholeTilesCappedByCapacity) {
  EXPECT_EQ(KvRows(0, 512), 512);           // global: every position keeps its row
  EXPECT_EQ(KvRows(8, 512), 160);           // 8 + 128 -> 160
  EXPECT_EQ(KvRows(32, 4096), 160);         // 32 + 128 = 160 exactly
  EXPECT_EQ(KvRows(33, 4096), 192);
  EXPECT_EQ(KvRows(1024, 1 << 20), 1152);
  EXPECT_EQ(KvRows(8, 100), 100);           // a short cache never wraps
  EXPECT_EQ(KvRows(4096, 1000), 1000);
  for (int64_t w : {1, 7, 100, 513}) {
    const int64_t rows = KvRows(w, 1 << 20);
    EXPECT_EQ(rows % 32, 0) << w;
    EXPECT_GE(rows, w + kSlidingSlack) << w;
    EXPECT_LT(rows, w + kSlidingSlack + 32) << w;
  }
}

TEST(KvCacheGeometry, BytesIsWhatEachLayerAllocates) {
  constexpr int64_t kCapacity = 1000;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    SCOPED_TRACE(std::string(TypeName(type)));
    const Geometry g = Mixed();
    auto kv = MustCreate(g, type, kCapacity);
    ASSERT_NE(kv, nullptr);
    // K and V: the global layer's 1000 rows of 2 x 32 values (q8_0: 1008, whole tiles of 16 on
    // every CPU), the sliding layer's ring of 8 + 128 -> 160 rows of 1 x 64 values, nothing
    // for the two reading layers.
    const bool tiled = KeyTilesApply(type);
    const int64_t rows = type == GgmlType::kQ8_0 ? 1008 : kCapacity;
    const int64_t want = 2 * (rows * RowBytes(type, 32) * 2 + 160 * RowBytes(type, 64));
    EXPECT_EQ(KvCache::Bytes(g, type, kCapacity), want);
    EXPECT_EQ(static_cast<int64_t>(kv->bytes()), want);
    EXPECT_EQ(kv->layout(0).capacity, rows);
    EXPECT_EQ(kv->key_layout(0).capacity, rows);
    EXPECT_EQ(kv->key_layout(0).tiles16, tiled);
    EXPECT_FALSE(kv->layout(0).tiles16);
    EXPECT_EQ(kv->layout(1).capacity, 160);
    EXPECT_EQ(kv->window(1), 8);
    EXPECT_TRUE(kv->stores(0) && kv->stores(1));
    EXPECT_FALSE(kv->stores(2) || kv->stores(3));
    // Reading layers alias their sources' storage and layout.
    EXPECT_EQ(kv->k(2), kv->k(0));
    EXPECT_EQ(kv->v(2), kv->v(0));
    EXPECT_EQ(kv->k(3), kv->k(1));
    EXPECT_EQ(kv->v(3), kv->v(1));
    EXPECT_EQ(kv->layout(3).capacity, 160);
    EXPECT_EQ(kv->layout(2).head_dim, 32);
    // The stored layers do not overlap: each holds what was written to it.
    Append(*kv, 5);
    for (int64_t l = 0; l < 4; ++l) {
      for (int64_t p = 0; p < 5; ++p) EXPECT_TRUE(Holds(*kv, l, p)) << l << " " << p;
    }
  }
  // A uniform cache is the sum of its layers.
  const Geometry uniform(3, KvLayerGeometry{4, 16});
  EXPECT_EQ(KvCache::Bytes(uniform, GgmlType::kF16, 64), 3 * 2 * 64 * 4 * 16 * 2);
}

TEST(KvCacheGeometry, CreateRejectsBadGeometry) {
  const struct {
    const char* what;
    Geometry layers;
    GgmlType type;
  } cases[] = {
      {"a later source", {{2, 32, 0, 1}, {2, 32, 0, -1}}, GgmlType::kF32},
      {"itself as source", {{2, 32, 0, -1}, {2, 32, 0, 1}}, GgmlType::kF32},
      {"a source that reads another", {{2, 32, 0, -1}, {2, 32, 0, 0}, {2, 32, 0, 1}},
       GgmlType::kF32},
      {"q8_0 with a head not in 32s", {{2, 40}}, GgmlType::kQ8_0},
      {"a type caches do not hold", {{2, 32}}, GgmlType::kQ4_0},
      {"no heads", {{0, 32}}, GgmlType::kF32},
      {"no layers", {}, GgmlType::kF32},
  };
  for (const auto& c : cases) {
    auto kv = KvCache::Create(c.layers, c.type, 64);
    EXPECT_FALSE(kv.ok()) << c.what;
    EXPECT_EQ(kv.status().code(), absl::StatusCode::kInvalidArgument) << c.what << kv.status();
  }
  EXPECT_FALSE(KvCache::Create(Mixed(), GgmlType::kF32, 0).ok());
}

TEST(KvCacheTruncate, GlobalLayersRollBackAnywhere) {
  auto kv = MustCreate({{2, 32}, {2, 32}}, GgmlType::kF16, 300);
  Append(*kv, 300);
  EXPECT_EQ(kv->MinTruncateLength(), 0);
  EXPECT_TRUE(kv->Truncate(1).ok());
  EXPECT_EQ(kv->len(), 1);
  EXPECT_EQ(kv->Truncate(2).code(), absl::StatusCode::kInvalidArgument);  // past len()
  EXPECT_EQ(kv->Truncate(-1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvCacheTruncate, WrappedRingRollsBackWithinItsSlack) {
  auto kv = MustCreate(Mixed(), GgmlType::kF32, 1000);
  // Before the ring (160 rows) wraps, any length is fine.
  Append(*kv, 150);
  EXPECT_EQ(kv->MinTruncateLength(), 0);
  EXPECT_TRUE(kv->Truncate(3).ok());
  Append(*kv, 397);  // positions 3..399 again: the ring holds [240, 400)
  ASSERT_EQ(kv->len(), 400);
  for (int64_t p = 240; p < 400; ++p) ASSERT_TRUE(Holds(*kv, 1, p)) << p;
  EXPECT_FALSE(Holds(*kv, 1, 239));  // overwritten by 399
  // Truncating to L needs [L - 7, L) in the ring: L >= 240 + 7.
  EXPECT_EQ(kv->MinTruncateLength(), 247);
  // Dropping kSlidingSlack positions always works (the ring keeps window + slack).
  EXPECT_TRUE(kv->Truncate(400 - kSlidingSlack).ok());
  const absl::Status deep = kv->Truncate(246);
  EXPECT_EQ(deep.code(), absl::StatusCode::kFailedPrecondition) << deep;
  EXPECT_NE(std::string(deep.message()).find("no further than 247"), std::string::npos) << deep;
  EXPECT_EQ(kv->len(), 400 - kSlidingSlack);  // a refused truncation changes nothing
  EXPECT_TRUE(kv->Truncate(247).ok());
  // Re-forwarding after a truncation does not restore what the ring overwrote: the limit
  // stays until the cache is cleared.
  Append(*kv, 20);
  EXPECT_EQ(kv->MinTruncateLength(), 247);
  EXPECT_FALSE(kv->Truncate(246).ok());
  // Truncate(0) starts over, whatever wrapped.
  EXPECT_TRUE(kv->Truncate(0).ok());
  EXPECT_EQ(kv->len(), 0);
  EXPECT_EQ(kv->MinTruncateLength(), 0);
  Append(*kv, 10);
  EXPECT_TRUE(kv->Truncate(1).ok());
}

TEST(KvCacheTruncate, SlackHoldsForEveryWindow) {
  for (int64_t window : {1, 8, 100, 1000}) {
    auto kv = MustCreate({{1, 32, window, -1}}, GgmlType::kF16, 4000);
    Append(*kv, 3000);
    EXPECT_TRUE(kv->Truncate(3000 - kSlidingSlack).ok()) << window;
    // The limit is exact: the oldest position the next query needs is the oldest the ring
    // holds.
    const int64_t min_len = kv->MinTruncateLength();
    EXPECT_EQ(min_len - window + 1, 3000 - kv->layout(0).capacity) << window;
    EXPECT_FALSE(kv->Truncate(min_len - 1).ok()) << window;
  }
}

TEST(KvCacheCopyPrefix, WrappedRingCopiesWhole) {
  auto src = MustCreate(Mixed(), GgmlType::kF16, 1000);
  Append(*src, 400);
  auto dst = MustCreate(Mixed(), GgmlType::kF16, 1000);
  Append(*dst, 37);  // stale contents the copy replaces
  ASSERT_TRUE(dst->CopyPrefixFrom(*src, 300).ok());
  EXPECT_EQ(dst->len(), 300);
  for (int64_t p = 0; p < 300; ++p) {
    ASSERT_TRUE(Holds(*dst, 0, p)) << p;
    ASSERT_TRUE(Holds(*dst, 2, p)) << p;
  }
  // The ring holds what the source's did, so the next query (at 300) sees its window.
  for (int64_t p = 240; p < 300; ++p) {
    ASSERT_TRUE(Holds(*dst, 1, p)) << p;
    ASSERT_TRUE(Holds(*dst, 3, p)) << p;
  }
  // And it rolls back no further than the source could.
  EXPECT_EQ(dst->MinTruncateLength(), src->MinTruncateLength());
  EXPECT_EQ(dst->Truncate(246).code(), absl::StatusCode::kFailedPrecondition);
  // Appending continues the ring where the source's positions left off.
  Append(*dst, 50);
  for (int64_t p = 300 - 8; p < 350; ++p) ASSERT_TRUE(Holds(*dst, 1, p)) << p;

  // A prefix the source's ring no longer holds.
  auto other = MustCreate(Mixed(), GgmlType::kF16, 1000);
  const absl::Status deep = other->CopyPrefixFrom(*src, 246);
  EXPECT_EQ(deep.code(), absl::StatusCode::kFailedPrecondition) << deep;
  EXPECT_EQ(other->len(), 0);
  // Zero positions is always a valid prefix.
  EXPECT_TRUE(other->CopyPrefixFrom(*src, 0).ok());
  EXPECT_EQ(other->len(), 0);
  // A wrapped ring cannot move into a cache whose ring has another size (capacity 150: the
  // ring is the whole cache), even for a prefix the source still holds.
  auto just_wrapped = MustCreate(Mixed(), GgmlType::kF16, 1000);
  Append(*just_wrapped, 170);
  ASSERT_EQ(just_wrapped->MinTruncateLength(), 10 + 7);
  auto small = MustCreate(Mixed(), GgmlType::kF16, 150);
  EXPECT_EQ(small->CopyPrefixFrom(*just_wrapped, 100).code(), absl::StatusCode::kInvalidArgument);
  auto same = MustCreate(Mixed(), GgmlType::kF16, 1000);
  EXPECT_TRUE(same->CopyPrefixFrom(*just_wrapped, 100).ok());
  for (int64_t p = 100 - 7; p < 100; ++p) EXPECT_TRUE(Holds(*same, 3, p)) << p;
}

TEST(KvCacheCopyPrefix, UnwrappedPrefixAndMismatches) {
  auto src = MustCreate(Mixed(), GgmlType::kQ8_0, 1000);
  Append(*src, 100);
  // Into a smaller cache (its ring is the whole cache): positions keep their rows.
  auto dst = MustCreate(Mixed(), GgmlType::kQ8_0, 64);
  ASSERT_TRUE(dst->CopyPrefixFrom(*src, 60).ok());
  EXPECT_EQ(dst->MinTruncateLength(), 0);
  for (int64_t l = 0; l < 4; ++l) {
    for (int64_t p = 0; p < 60; ++p) ASSERT_TRUE(Holds(*dst, l, p)) << l << " " << p;
  }
  EXPECT_EQ(dst->CopyPrefixFrom(*src, 65).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dst->CopyPrefixFrom(*src, -1).code(), absl::StatusCode::kInvalidArgument);
  auto big = MustCreate(Mixed(), GgmlType::kQ8_0, 1000);
  EXPECT_EQ(big->CopyPrefixFrom(*src, 101).code(), absl::StatusCode::kInvalidArgument);

  // Another type, window, source or head count is another geometry.
  Geometry window = Mixed(), source = Mixed(), heads = Mixed();
  window[1].window = 16;
  window[3].window = 16;
  source[3].source = -1;
  heads[0].num_heads_kv = 1;
  heads[2].num_heads_kv = 1;
  for (const auto& [what, g, type] :
       {std::tuple{"type", Mixed(), GgmlType::kF16}, std::tuple{"window", window, GgmlType::kQ8_0},
        std::tuple{"source", source, GgmlType::kQ8_0},
        std::tuple{"heads", heads, GgmlType::kQ8_0}}) {
    auto to = MustCreate(g, type, 1000);
    EXPECT_FALSE(to->SameGeometry(*src)) << what;
    const absl::Status s = to->CopyPrefixFrom(*src, 10);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what << ": " << s;
    EXPECT_NE(std::string(s.message()).find("geometry"), std::string::npos) << s;
  }
  EXPECT_TRUE(big->SameGeometry(*src));
}

}  // namespace
}  // namespace fucina
