// Per-session key/value cache for a range of layers, each with its own geometry.
//
// Layer i stores K and V, each [heads_kv_i, rows_i, head_dim_i] in f32, f16 or q8_0 (a kv
// head's rows back to back: kernels/attention.h KvLayout), or reads another layer's (shared
// K/V: gemma4's trailing layers). Position p lives in row p % rows_i. A global layer has
// rows_i = capacity, so every position keeps its row; a sliding-window layer of window W keeps
// a ring of rows_i = W + kSlidingSlack rounded up to a multiple of 32 (or capacity, when
// smaller). A q8_0 cache rounds rows_i up to a multiple of 16, whole tiles of a tiled K
// (key_layout).
// Positions [0, len) are valid. A cache belongs to one stream and is used by one thread at a
// time.
//
// Rolling back a ring: truncating to L needs positions [L - W + 1, L) still in the ring, so a
// cache can drop up to the slack's worth of its newest positions (kSlidingSlack; more while it
// is still shorter than its ring). Truncate and CopyPrefixFrom refuse anything deeper with
// FAILED_PRECONDITION naming the layer; callers then start the session over (its tokens are
// forwarded again) — the prefix cache does this on its own.
#ifndef FUCINA_MODELS_ENGINE_KV_CACHE_H_
#define FUCINA_MODELS_ENGINE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention.h"
#include "kernels/cpu/streamed_memory.h"

namespace fucina {

// The longest context any command accepts (positions per session): past it the KV arithmetic
// of a session, not the machine, is the limit worth stating.
inline constexpr int64_t kMaxContext = int64_t{1} << 24;

// Positions a sliding-window ring keeps beyond its window: how far a session can roll back
// (a rejected speculative draft, a short truncation) without forwarding its tokens again.
inline constexpr int64_t kSlidingSlack = 128;

// One layer of a cache.
struct KvLayerGeometry {
  int num_heads_kv = 0;
  int head_dim = 0;
  int64_t window = 0;   // 0: global attention; else the positions a query sees.
  int64_t source = -1;  // -1: the layer stores its own K/V; else the cache layer it reads.
};

class KvCache {
 public:
  // One entry per layer. Errors: unsupported type, q8_0 with a head size not a multiple of 32,
  // non-positive sizes, a source that is not an earlier layer storing its own K/V.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(std::span<const KvLayerGeometry> layers,
                                                         GgmlType type, int64_t capacity);
  // `num_layers` global layers of one geometry.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(int64_t num_layers, int num_heads_kv,
                                                         int head_dim, GgmlType type,
                                                         int64_t capacity);
  // Bytes Create would allocate, without allocating (memory planning).
  static int64_t Bytes(std::span<const KvLayerGeometry> layers, GgmlType type,
                       int64_t capacity);

  int64_t len() const { return len_; }
  int64_t capacity() const { return capacity_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  GgmlType type() const { return type_; }
  const KvLayerGeometry& geometry(int64_t layer) const { return layers_[layer].geometry; }
  // Layout of the storage layer `layer` reads (its own, or its source's): of its V cache, and
  // of its K cache but for key_layout's tiles16 (q8_0 where the tile kernel exists).
  const KvLayout& layout(int64_t layer) const { return layers_[Storage(layer)].layout; }
  const KvLayout& key_layout(int64_t layer) const { return layers_[Storage(layer)].key_layout; }
  int64_t window(int64_t layer) const { return layers_[layer].geometry.window; }
  // Whether `layer` stores K/V (false: it reads its source's, written by the source).
  bool stores(int64_t layer) const { return layers_[layer].geometry.source < 0; }
  size_t bytes() const { return bytes_; }

  // Storage of layer i (0-based within the cache's own layers): its source's when shared.
  void* k(int64_t layer) { return layers_[Storage(layer)].k; }
  void* v(int64_t layer) { return layers_[Storage(layer)].v; }
  const void* k(int64_t layer) const { return layers_[Storage(layer)].k; }
  const void* v(int64_t layer) const { return layers_[Storage(layer)].v; }

  // Marks `n` more positions valid (after their rows were stored). Precondition: fits.
  void Advance(int64_t n);
  // The smallest length Truncate accepts now (0 when no ring has wrapped).
  int64_t MinTruncateLength() const;
  // Drops positions [len, this->len()): rejected drafts, prefix reuse. Errors: len > len(), or
  // below MinTruncateLength() (FAILED_PRECONDITION).
  absl::Status Truncate(int64_t len);
  void Clear();
  // Copies positions [0, n) of `other` (same geometry) into this cache and sets len() = n.
  // Rings copy whole; `other` must be able to truncate to n.
  absl::Status CopyPrefixFrom(const KvCache& other, int64_t n);
  bool SameGeometry(const KvCache& other) const;

 private:
  struct Layer {
    KvLayerGeometry geometry;
    KvLayout layout;      // rows = layout.capacity
    KvLayout key_layout;  // the same, tiles16 where KeyTilesApply
    void* k = nullptr;
    void* v = nullptr;
  };
  KvCache() = default;
  int64_t Storage(int64_t layer) const {
    const int64_t s = layers_[layer].geometry.source;
    return s < 0 ? layer : s;
  }

  std::vector<Layer> layers_;
  GgmlType type_ = GgmlType::kF32;
  int64_t capacity_ = 0;
  int64_t len_ = 0;
  int64_t high_water_ = 0;  // the most positions ever valid since Clear: what rings overwrote.
  size_t bytes_ = 0;
  StreamedBuffer data_;  // every layer's K and V: decode reads them each token (huge pages)
};

// Rows a layer of `window` keeps in a cache of `capacity` positions (a q8_0 cache allocates
// them rounded up to 16).
int64_t KvRows(int64_t window, int64_t capacity);

// Parses "f32" | "f16" | "q8_0" (the --cache-type flag).
absl::StatusOr<GgmlType> ParseKvCacheType(std::string_view name);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_KV_CACHE_H_
