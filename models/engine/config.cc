#include "models/engine/config.h"

#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

absl::Status Bad(const std::string& arch, const char* key, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat("invalid config: ", arch, ".", key, " ", why));
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  if (vocab_size <= 0) {
    return absl::InvalidArgumentError("invalid config: token_embd.weight has no rows");
  }
  if (hidden <= 0) return Bad(arch, "embedding_length", "must be positive");
  if (num_layers <= 0) return Bad(arch, "block_count", "must be positive");
  if (num_heads <= 0) return Bad(arch, "attention.head_count", "must be positive");
  if (num_heads_kv <= 0) return Bad(arch, "attention.head_count_kv", "must be positive");
  if (num_heads % num_heads_kv != 0) {
    return Bad(arch, "attention.head_count_kv",
               absl::StrCat("(", num_heads_kv, ") must divide attention.head_count (", num_heads,
                            ")"));
  }
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return Bad(arch, "attention.key_length", absl::StrCat("(", head_dim, ") must be even"));
  }
  if (rope_dims <= 0 || rope_dims % 2 != 0 || rope_dims > head_dim) {
    return Bad(arch, "rope.dimension_count",
               absl::StrCat("(", rope_dims, ") must be even and at most the head size"));
  }
  if (IsMoe()) {
    if (num_experts_used <= 0 || num_experts_used > num_experts) {
      return Bad(arch, "expert_used_count",
                 absl::StrCat("(", num_experts_used, ") must be in [1, expert_count=",
                              num_experts, "]"));
    }
    if (expert_ffn <= 0) return Bad(arch, "expert_feed_forward_length", "must be positive");
  } else if (ffn <= 0) {
    return Bad(arch, "feed_forward_length", "must be positive");
  }
  return absl::OkStatus();
}

}  // namespace fucina
