// Shared by the family files: the GGUF key convention every family follows, and the pre-norm
// GQA decoder llama and qwen3 are made of (they differ in options only).
#ifndef FUCINA_MODELS_FAMILIES_COMMON_H_
#define FUCINA_MODELS_FAMILIES_COMMON_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "models/engine/blocks.h"
#include "models/engine/config.h"
#include "models/engine/family.h"
#include "models/engine/fixture.h"
#include "models/engine/model.h"
#include "models/gguf/meta.h"
#include "models/gguf/writer.h"

namespace fucina::families {

// Reads the keys every decoder family shares (<arch>.block_count, embedding_length,
// feed_forward_length, attention.head_count[_kv], attention.layer_norm_rms_epsilon,
// rope.freq_base, context_length, the optional MoE trio) and the vocabulary size from
// token_embd.weight. head_dim/rope_dims and the LayerSpecs are left for the family to decide.
absl::StatusOr<ModelConfig> ReadCommonConfig(const gguf::Meta& meta);

// Writes the keys ReadCommonConfig reads (the fixture writer).
void WriteCommonConfig(const ModelConfig& c, gguf::Writer& w);

// The config fields every fixture shares (FixtureOptions' sizes, rope base, eps).
ModelConfig BaseFixtureConfig(const FixtureOptions& o, int64_t vocab);

// Pre-norm decoder layer: x += attn(rms_norm(x)); x += ffn(rms_norm(x)), with a SwiGLU FFN or
// routed SwiGLU experts. Tensors: attn_norm, attn_{q,k,v,output}[, attn_{q,k}_norm], ffn_norm,
// ffn_{gate,up,down} or ffn_gate_inp + ffn_{gate,up,down}_exps; rope_freqs.weight (global,
// optional: llama-3 frequency factors).
struct PreNormDecoderOptions {
  bool qk_norm = false;             // qwen3: per-head RMSNorm of q and k before RoPE
  RopeMode rope_mode = RopeMode::kNeox;
  bool renormalize_experts = true;  // the selected experts' weights sum to 1
  bool rope_freqs = false;          // llama-3: optional rope_freqs.weight frequency divisors
};
TensorTable PreNormDecoderTensors(const ModelConfig& c, const PreNormDecoderOptions& o);
std::unique_ptr<FamilyModel> NewPreNormDecoder(const ModelConfig& c,
                                               const PreNormDecoderOptions& o);

}  // namespace fucina::families

#endif  // FUCINA_MODELS_FAMILIES_COMMON_H_
