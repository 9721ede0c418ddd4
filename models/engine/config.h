// Hyperparameters of a decoder-only transformer, read from GGUF metadata by the family files
// (models/families/*.cc) and validated once at load. What can differ from layer to layer is
// data (LayerSpec, one per layer): the cache, ModelSize, the planner and the worker size memory
// from it, and the family's forward reads it.
#ifndef FUCINA_MODELS_ENGINE_CONFIG_H_
#define FUCINA_MODELS_ENGINE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "kernels/rope.h"
#include "models/engine/kv_cache.h"

namespace fucina {

enum class AttentionKind { kGlobal, kSliding };

// One layer's geometry.
struct LayerSpec {
  AttentionKind attention = AttentionKind::kGlobal;
  int64_t window = 0;        // kSliding: a query sees the last `window` positions, itself included.
  int64_t num_heads = 0;
  int64_t num_heads_kv = 0;
  int64_t head_dim = 0;
  int64_t kv_source = -1;    // -1: stores its own K/V; else the (earlier) layer whose K/V it reads.
  float rope_base = 10000.0f;
  int64_t rope_dims = 0;     // rotated dims per head
  int64_t ffn = 0;           // dense (or shared-expert) feed-forward width; 0: none
  bool moe = false;          // routed experts (ModelConfig's expert counts)

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_heads_kv * head_dim; }
};

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

  // Per-layer geometry, [num_layers]. Families with one geometry fill it with UniformLayers.
  std::vector<LayerSpec> layers;
  // Per-layer embeddings (gemma4 PLE) width; 0: none. A PLE model runs in one stage.
  int64_t per_layer_input = 0;
  // Final logits become cap * tanh(logits / cap) (gemma); 0: none.
  float final_logit_softcap = 0.0f;

  bool IsMoe() const { return num_experts > 0; }
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_heads_kv * head_dim; }

  // LayerSpecs of a model whose layers all share the global fields above.
  void UniformLayers();
  // Whether a pipeline may cut between layers `layer - 1` and `layer`: no layer at or after the
  // cut reads K/V stored before it, and the model has no per-layer embeddings.
  bool CanSplitAt(int64_t layer) const;
  // The cache geometry of layers [first, last) (sources re-indexed within the range).
  // Precondition: `layers` holds every layer (read configs are validated for it).
  std::vector<KvLayerGeometry> KvGeometry(int64_t first, int64_t last) const;

  // Structural checks; errors name the GGUF key at fault.
  absl::Status Validate() const;
};

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_CONFIG_H_
