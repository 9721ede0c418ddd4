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
  } else if (ffn <= 0 && layers.empty()) {
    return Bad(arch, "feed_forward_length", "must be positive");
  }
  if (static_cast<int64_t>(layers.size()) != num_layers) {
    return absl::InternalError(absl::StrCat(arch, ": ", layers.size(), " layer specs for ",
                                            num_layers, " layers"));
  }
  for (int64_t l = 0; l < num_layers; ++l) {
    const LayerSpec& s = layers[l];
    const std::string at = absl::StrCat(" (layer ", l, ")");
    if (s.num_heads <= 0) return Bad(arch, "attention.head_count", "must be positive" + at);
    if (s.num_heads_kv <= 0 || s.num_heads % s.num_heads_kv != 0) {
      return Bad(arch, "attention.head_count_kv",
                 absl::StrCat("(", s.num_heads_kv, ") must divide attention.head_count (",
                              s.num_heads, ")", at));
    }
    if (s.head_dim <= 0 || s.head_dim % 2 != 0) {
      return Bad(arch, "attention.key_length", absl::StrCat("(", s.head_dim, ") must be even", at));
    }
    if (s.rope_dims <= 0 || s.rope_dims % 2 != 0 || s.rope_dims > s.head_dim) {
      return Bad(arch, "rope.dimension_count",
                 absl::StrCat("(", s.rope_dims, ") must be even and at most the head size", at));
    }
    if (s.attention == AttentionKind::kSliding && s.window <= 0) {
      return Bad(arch, "attention.sliding_window", "must be positive" + at);
    }
    if (s.kv_source >= 0) {
      if (s.kv_source >= l || layers[s.kv_source].kv_source >= 0) {
        return Bad(arch, "attention.shared_kv_layers",
                   absl::StrCat(": layer ", l, " would read the K/V of layer ", s.kv_source,
                                ", which stores none of its own"));
      }
      const LayerSpec& src = layers[s.kv_source];
      if (src.num_heads_kv != s.num_heads_kv || src.head_dim != s.head_dim ||
          src.window != s.window) {
        return Bad(arch, "attention.shared_kv_layers",
                   absl::StrCat(": layer ", l, " reads layer ", s.kv_source,
                                "'s K/V but their geometries differ"));
      }
    }
    if (s.moe && !IsMoe()) return Bad(arch, "expert_count", "is missing" + at);
    if (!s.moe && s.ffn <= 0) return Bad(arch, "feed_forward_length", "must be positive" + at);
  }
  return absl::OkStatus();
}

void ModelConfig::UniformLayers() {
  LayerSpec spec;
  spec.num_heads = num_heads;
  spec.num_heads_kv = num_heads_kv;
  spec.head_dim = head_dim;
  spec.rope_base = rope_base;
  spec.rope_dims = rope_dims;
  spec.ffn = IsMoe() ? 0 : ffn;
  spec.moe = IsMoe();
  layers.assign(num_layers, spec);
}

bool ModelConfig::CanSplitAt(int64_t layer) const {
  if (layer <= 0 || layer >= num_layers) return true;
  if (per_layer_input > 0) return false;
  for (int64_t l = layer; l < static_cast<int64_t>(layers.size()); ++l) {
    if (layers[l].kv_source >= 0 && layers[l].kv_source < layer) return false;
  }
  return true;
}

std::vector<KvLayerGeometry> ModelConfig::KvGeometry(int64_t first, int64_t last) const {
  std::vector<KvLayerGeometry> out;
  for (int64_t l = first; l < last; ++l) {
    const LayerSpec& s = layers[l];
    KvLayerGeometry g;
    g.num_heads_kv = static_cast<int>(s.num_heads_kv);
    g.head_dim = static_cast<int>(s.head_dim);
    g.window = s.attention == AttentionKind::kSliding ? s.window : 0;
    g.source = s.kv_source >= first ? s.kv_source - first : -1;
    out.push_back(g);
  }
  return out;
}

}  // namespace fucina
