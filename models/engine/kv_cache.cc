#include "models/engine/kv_cache.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace fucina {

KvCache::KvCache(int64_t num_layers, KvLayout layout)
    : num_layers_(num_layers),
      layout_(layout),
      data_(new uint8_t[static_cast<size_t>(layout.TotalBytes()) * 2 * num_layers]) {}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(int64_t num_layers, int num_heads_kv,
                                                         int head_dim, GgmlType type,
                                                         int64_t capacity) {
  const KvLayout layout{type, capacity, num_heads_kv, head_dim};
  if (absl::Status s = ValidateKvLayout(layout); !s.ok()) return s;
  if (num_layers <= 0) return absl::InvalidArgumentError("KV cache needs at least one layer");
  // Guard the allocation size: 1 TiB is far beyond any machine this runs on.
  const double total = static_cast<double>(layout.TotalBytes()) * 2 * num_layers;
  if (total > static_cast<double>(int64_t{1} << 40)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache of ", capacity, " positions would need ", total / (1 << 30),
                     " GiB"));
  }
  return std::unique_ptr<KvCache>(new KvCache(num_layers, layout));
}

absl::Status KvCache::Truncate(int64_t len) {
  if (len < 0 || len > len_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot truncate a KV cache of length ", len_, " to ", len));
  }
  len_ = len;
  return absl::OkStatus();
}

absl::Status KvCache::CopyPrefixFrom(const KvCache& other, int64_t n) {
  if (other.num_layers_ != num_layers_ || other.layout_.type != layout_.type ||
      other.layout_.num_heads_kv != layout_.num_heads_kv ||
      other.layout_.head_dim != layout_.head_dim) {
    return absl::InvalidArgumentError("KV prefix copy between caches of different geometry");
  }
  if (n < 0 || n > other.len_ || n > capacity()) {
    return absl::InvalidArgumentError(absl::StrCat("KV prefix copy of ", n, " positions from a ",
                                                   other.len_, "-position cache into capacity ",
                                                   capacity()));
  }
  const size_t bytes = static_cast<size_t>(layout_.PositionBytes() * n);
  for (int64_t l = 0; l < num_layers_; ++l) {
    std::memcpy(k(l), other.k(l), bytes);
    std::memcpy(v(l), other.v(l), bytes);
  }
  len_ = n;
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
