// Shared by the family config readers: the GGUF key convention every family follows.
#ifndef FUCINA_MODELS_FAMILIES_COMMON_H_
#define FUCINA_MODELS_FAMILIES_COMMON_H_

#include "absl/status/statusor.h"
#include "models/engine/config.h"
#include "models/gguf/meta.h"

namespace fucina::families {

// Reads the keys every decoder family shares (<arch>.block_count, embedding_length,
// feed_forward_length, attention.head_count[_kv], attention.layer_norm_rms_epsilon,
// rope.freq_base, context_length, the optional MoE trio) and the vocabulary size from
// token_embd.weight. head_dim/rope_dims are left for the family to decide.
absl::StatusOr<ModelConfig> ReadCommonConfig(const gguf::Meta& meta);

}  // namespace fucina::families

#endif  // FUCINA_MODELS_FAMILIES_COMMON_H_
