// Per-session key/value cache for a range of layers.
//
// Layout per layer: K and V each [capacity, num_heads_kv, head_dim] in f32, f16 or q8_0
// (kernels/attention.h KvLayout). Row p holds position p; rows [0, len) are valid. A cache
// belongs to one stream and is used by one thread at a time.
#ifndef FUCINA_MODELS_ENGINE_KV_CACHE_H_
#define FUCINA_MODELS_ENGINE_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/attention.h"

namespace fucina {

// The longest context any command accepts (positions per session): past it the KV arithmetic
// of a session, not the machine, is the limit worth stating.
inline constexpr int64_t kMaxContext = int64_t{1} << 24;

class KvCache {
 public:
  // `num_layers` layers of the given geometry. Errors: unsupported type, q8_0 with a head size
  // not a multiple of 32, non-positive sizes.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(int64_t num_layers, int num_heads_kv,
                                                         int head_dim, GgmlType type,
                                                         int64_t capacity);

  int64_t len() const { return len_; }
  int64_t capacity() const { return layout_.capacity; }
  int64_t num_layers() const { return num_layers_; }
  GgmlType type() const { return layout_.type; }
  const KvLayout& layout() const { return layout_; }
  size_t bytes() const { return static_cast<size_t>(layout_.TotalBytes()) * 2 * num_layers_; }

  // Layer i of this cache (0-based within the cache's own layers).
  void* k(int64_t layer) { return data_.get() + (2 * layer) * layout_.TotalBytes(); }
  void* v(int64_t layer) { return data_.get() + (2 * layer + 1) * layout_.TotalBytes(); }
  const void* k(int64_t layer) const { return data_.get() + (2 * layer) * layout_.TotalBytes(); }
  const void* v(int64_t layer) const {
    return data_.get() + (2 * layer + 1) * layout_.TotalBytes();
  }

  // Marks `n` more positions valid (after their rows were stored). Precondition: fits.
  void Advance(int64_t n) { len_ += n; }
  // Drops positions [len, this->len()): rejected drafts, prefix reuse. Error if len > len().
  absl::Status Truncate(int64_t len);
  void Clear() { len_ = 0; }
  // Copies positions [0, n) of `other` (same geometry) into this cache and sets len() = n.
  absl::Status CopyPrefixFrom(const KvCache& other, int64_t n);

 private:
  KvCache(int64_t num_layers, KvLayout layout);

  int64_t num_layers_;
  KvLayout layout_;
  int64_t len_ = 0;
  std::unique_ptr<uint8_t[]> data_;  // [num_layers][K, V][TotalBytes]
};

// Parses "f32" | "f16" | "q8_0" (the --cache-type flag).
absl::StatusOr<GgmlType> ParseKvCacheType(std::string_view name);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_KV_CACHE_H_
