// Llama (general.architecture "llama"; also SmolLM2 and other Llama-shaped models): GQA
// attention without q/k norms, normal (interleaved-pair) RoPE over rope.dimension_count dims,
// Llama-3 frequency factors from rope_freqs.weight when present, SwiGLU FFN.
#include "models/engine/registry.h"
#include "models/families/common.h"

namespace fucina {

absl::StatusOr<ModelConfig> ReadLlamaConfig(const gguf::File& file) {
  auto meta = gguf::Meta::ForFile(file, gguf::ZeroPolicy::kRejectZero);
  if (!meta.ok()) return meta.status();
  auto config = families::ReadCommonConfig(*meta);
  if (!config.ok()) return config.status();
  ModelConfig c = *std::move(config);
  if (c.hidden % c.num_heads != 0) {
    return absl::InvalidArgumentError("llama.embedding_length is not a multiple of "
                                      "llama.attention.head_count");
  }
  // attention.key_length is usually absent: the head size is hidden / heads.
  auto key_length = meta->IntOpt("attention.key_length");
  if (!key_length.ok()) return key_length.status();
  c.head_dim = static_cast<int64_t>(key_length->value_or(c.hidden / c.num_heads));
  auto rope_dims = meta->IntOpt("rope.dimension_count");
  if (!rope_dims.ok()) return rope_dims.status();
  c.rope_dims = static_cast<int64_t>(rope_dims->value_or(c.head_dim));
  c.rope_mode = RopeMode::kNormal;
  c.qk_norm = false;
  return c;
}

}  // namespace fucina
