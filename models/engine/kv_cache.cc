#include "models/engine/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

// Ring rows are whole attention tiles (kernels/cpu/attention.cc walks keys 32 at a time from
// multiples of 32), so no tile wraps around the ring.
constexpr int64_t kRingAlign = 32;

}  // namespace

int64_t KvRows(int64_t window, int64_t capacity) {
  if (window <= 0) return capacity;
  const int64_t ring = (window + kSlidingSlack + kRingAlign - 1) / kRingAlign * kRingAlign;
  return std::min(ring, capacity);
}

namespace {

// The V layout of a layer that stores K/V (its K layout adds tiles16 where KeyTilesApply). A
// tiled K needs whole tiles, so q8_0 rows round up to 16 on every CPU: a cache's size must not
// depend on the machine that plans it (the coordinator sizes workers' caches with its own).
KvLayout StorageLayout(const KvLayerGeometry& g, GgmlType type, int64_t capacity) {
  int64_t rows = KvRows(g.window, capacity);
  if (type == GgmlType::kQ8_0) rows = (rows + 15) / 16 * 16;
  return KvLayout{type, rows, g.num_heads_kv, g.head_dim};
}

KvLayout KeyLayout(const KvLayout& values) {
  KvLayout k = values;
  k.tiles16 = KeyTilesApply(values.type);
  return k;
}

}  // namespace

int64_t KvCache::Bytes(std::span<const KvLayerGeometry> layers, GgmlType type,
                       int64_t capacity) {
  int64_t total = 0;
  for (const KvLayerGeometry& g : layers) {
    if (g.source >= 0) continue;
    total += 2 * StorageLayout(g, type, capacity).TotalBytes();
  }
  return total;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(int64_t num_layers, int num_heads_kv,
                                                         int head_dim, GgmlType type,
                                                         int64_t capacity) {
  if (num_layers <= 0) return absl::InvalidArgumentError("KV cache needs at least one layer");
  std::vector<KvLayerGeometry> layers(num_layers, KvLayerGeometry{num_heads_kv, head_dim});
  return Create(layers, type, capacity);
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(std::span<const KvLayerGeometry> layers,
                                                         GgmlType type, int64_t capacity) {
  if (layers.empty()) return absl::InvalidArgumentError("KV cache needs at least one layer");
  std::unique_ptr<KvCache> cache(new KvCache());
  cache->type_ = type;
  cache->capacity_ = capacity;
  double total = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const KvLayerGeometry& g = layers[i];
    Layer layer{g, {}, {}};
    if (g.source >= 0) {
      if (g.source >= static_cast<int64_t>(i) || layers[g.source].source >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "KV cache layer ", i, " reads layer ", g.source,
            ", which is not an earlier layer storing its own K/V"));
      }
      layer.layout = KvLayout{type, 0, g.num_heads_kv, g.head_dim};
      layer.key_layout = layer.layout;
    } else {
      layer.layout = StorageLayout(g, type, capacity);
      layer.key_layout = KeyLayout(layer.layout);
      if (absl::Status s = ValidateKvLayout(layer.layout); !s.ok()) return s;
      if (absl::Status s = ValidateKvLayout(layer.key_layout); !s.ok()) return s;
      total += 2.0 * static_cast<double>(layer.layout.TotalBytes());
    }
    cache->layers_.push_back(layer);
  }
  // Guard the allocation size: 1 TiB is far beyond any machine this runs on.
  if (total > static_cast<double>(int64_t{1} << 40)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV cache of ", capacity, " positions would need ", total / (1 << 30), " GiB"));
  }
  cache->bytes_ = static_cast<size_t>(total);
  absl::StatusOr<StreamedBuffer> data = StreamedBuffer::Create(cache->bytes_);
  if (!data.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache of ", capacity, " positions: ", data.status().message()));
  }
  cache->data_ = *std::move(data);
  uint8_t* p = cache->data_.data();
  for (Layer& layer : cache->layers_) {
    if (layer.geometry.source >= 0) continue;
    const size_t bytes = static_cast<size_t>(layer.layout.TotalBytes());
    layer.k = p;
    layer.v = p + bytes;
    p += 2 * bytes;
  }
  return cache;
}

void KvCache::Advance(int64_t n) {
  len_ += n;
  high_water_ = std::max(high_water_, len_);
}

int64_t KvCache::MinTruncateLength() const {
  int64_t min_len = 0;
  for (const Layer& layer : layers_) {
    if (layer.geometry.source >= 0 || layer.geometry.window <= 0) continue;
    // Positions still intact in the ring: [high_water - rows, ...). The next query at L sees
    // [L - window + 1, L].
    const int64_t lowest = std::max<int64_t>(0, high_water_ - layer.layout.capacity);
    if (lowest > 0) min_len = std::max(min_len, lowest + layer.geometry.window - 1);
  }
  return min_len;
}

absl::Status KvCache::Truncate(int64_t len) {
  if (len < 0 || len > len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot truncate a KV cache of length ", len_, " to ", len));
  }
  if (len == 0) {
    Clear();
    return absl::OkStatus();
  }
  if (const int64_t min_len = MinTruncateLength(); len < min_len) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot truncate a KV cache of length ", len_, " to ", len,
        ": its sliding-window layers keep ", kSlidingSlack,
        " positions beyond their window, so it rolls back no further than ", min_len));
  }
  len_ = len;
  return absl::OkStatus();
}

void KvCache::Clear() {
  len_ = 0;
  high_water_ = 0;
}

bool KvCache::SameGeometry(const KvCache& other) const {
  if (other.type_ != type_ || other.layers_.size() != layers_.size()) return false;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const KvLayerGeometry& a = layers_[i].geometry;
    const KvLayerGeometry& b = other.layers_[i].geometry;
    if (a.num_heads_kv != b.num_heads_kv || a.head_dim != b.head_dim || a.window != b.window ||
        a.source != b.source) {
      return false;
    }
  }
  return true;
}

absl::Status KvCache::CopyPrefixFrom(const KvCache& other, int64_t n) {
  if (!SameGeometry(other)) {
    return absl::InvalidArgumentError("KV prefix copy between caches of different geometry");
  }
  if (n < 0 || n > other.len_ || n > capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("KV prefix copy of ", n, " positions from a ",
                                                   other.len_, "-position cache into capacity ",
                                                   capacity()));
  }
  if (n > 0 && n < other.MinTruncateLength()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV prefix copy of ", n, " positions: the source's sliding-window rings no longer hold "
        "what position ", n, " attends to (they roll back no further than ",
        other.MinTruncateLength(), ")"));
  }
  bool any_wrapped = false;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& to = layers_[i];
    const Layer& from = other.layers_[i];
    if (to.geometry.source >= 0) continue;
    // A ring that wrapped copies whole, into a ring of the same size (positions keep their
    // rows); otherwise positions [0, n) sit in rows [0, n) on both sides.
    const bool wrapped = other.high_water_ > from.layout.capacity;
    if (wrapped && to.layout.capacity != from.layout.capacity) {
      return absl::InvalidArgumentError(
          "KV prefix copy of a wrapped sliding-window ring into a ring of another size");
    }
    any_wrapped |= wrapped;
    int64_t rows = wrapped ? from.layout.capacity : std::min(n, from.layout.capacity);
    // Whole tiles of a tiled K (capacity is a multiple of 16): a tile's scales follow its
    // quants. Rows past n in the last one are copied too, and never read before rewritten.
    if (to.key_layout.tiles16) rows = (rows + 15) / 16 * 16;
    const size_t bytes = static_cast<size_t>(to.layout.HeadBytes() * rows);
    for (int h = 0; h < to.layout.num_heads_kv; ++h) {  // head-major: one span per kv head.
      std::memcpy(static_cast<uint8_t*>(to.k) + to.layout.RowOffset(0, h),
                  static_cast<const uint8_t*>(from.k) + from.layout.RowOffset(0, h), bytes);
      std::memcpy(static_cast<uint8_t*>(to.v) + to.layout.RowOffset(0, h),
                  static_cast<const uint8_t*>(from.v) + from.layout.RowOffset(0, h), bytes);
    }
  }
  len_ = n;
  high_water_ = any_wrapped ? std::max(n, other.high_water_) : n;
  return absl::OkStatus();
}

absl::StatusOr<GgmlType> ParseKvCacheType(std::string_view name) {
  if (name == "f32") return GgmlType::kF32;
  if (name == "f16") return GgmlType::kF16;
  if (name == "q8_0") return GgmlType::kQ8_0;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown cache type '", std::string(name), "' (expected f32, f16 or q8_0)"));
}

}  // namespace fucina
