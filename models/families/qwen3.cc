// Qwen3 dense and MoE (general.architecture "qwen3" / "qwen3moe"): GQA attention with a
// per-head RMSNorm of q and k before RoPE, NeoX-style RoPE over the whole head, SwiGLU FFN
// or a top-k routed mixture of SwiGLU experts with renormalised router weights.
#include "absl/strings/str_cat.h"
#include "models/engine/registry.h"
#include "models/families/common.h"

namespace fucina {

absl::StatusOr<ModelConfig> ReadQwen3Config(const gguf::File& file) {
  auto meta = gguf::Meta::ForFile(file, gguf::ZeroPolicy::kRejectZero);
  if (!meta.ok()) return meta.status();
  auto config = families::ReadCommonConfig(*meta);
  if (!config.ok()) return config.status();
  ModelConfig c = *std::move(config);
  // Qwen3 decouples the head size from hidden / heads (0.6B: 1024 / 16 heads, head 128).
  auto key_length = meta->Int("attention.key_length");
  if (!key_length.ok()) return key_length.status();
  c.head_dim = static_cast<int64_t>(*key_length);
  c.rope_dims = c.head_dim;
  c.rope_mode = RopeMode::kNeox;
  c.qk_norm = true;
  c.norm_topk_prob = true;  // Qwen3-MoE renormalises the selected experts' weights.
  if (c.arch == "qwen3moe" && !c.IsMoe()) {
    return absl::InvalidArgumentError("qwen3moe.expert_count is missing");
  }
  return c;
}

}  // namespace fucina
