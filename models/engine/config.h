// Hyperparameters of a decoder-only transformer, read from GGUF metadata by the family files
// (models/families/*.cc) and validated once at load.
#ifndef FUCINA_MODELS_ENGINE_CONFIG_H_
#define FUCINA_MODELS_ENGINE_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/rope.h"

namespace fucina {

struct ModelConfig {
  std::string arch;            // general.architecture
  std::string name;            // general.name (may be empty)
  int64_t vocab_size = 0;      // rows of token_embd.weight
  int64_t hidden = 0;          // embedding_length
  int64_t ffn = 0;             // feed_forward_length (dense layers)
  int64_t num_layers = 0;      // block_count
  int64_t num_heads = 0;       // attention.head_count
  int64_t num_heads_kv = 0;    // attention.head_count_kv
  int64_t head_dim = 0;        // attention.key_length, else hidden / num_heads
  int64_t context_length = 0;  // context_length (training context; a default, not a limit)
  float rms_eps = 1e-6f;
  float rope_base = 10000.0f;
  RopeMode rope_mode = RopeMode::kNeox;
  int64_t rope_dims = 0;       // rotated dims per head (rope.dimension_count, else head_dim)
  bool qk_norm = false;        // per-head RMSNorm of q and k before RoPE (qwen3)

  // Mixture of experts (num_experts == 0: dense).
  int64_t num_experts = 0;
  int64_t num_experts_used = 0;
  int64_t expert_ffn = 0;
  bool norm_topk_prob = true;  // renormalise the selected experts' weights to sum to 1

  bool IsMoe() const { return num_experts > 0; }
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_heads_kv * head_dim; }

  // Structural checks; errors name the GGUF key at fault.
  absl::Status Validate() const;
};

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_CONFIG_H_
