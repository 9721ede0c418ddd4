#include "models/families/common.h"

#include "absl/strings/str_cat.h"

namespace fucina::families {

#define FUCINA_ASSIGN_OR_RETURN(lhs, expr) \
  auto lhs##_or = (expr);                  \
  if (!lhs##_or.ok()) return lhs##_or.status();

absl::StatusOr<ModelConfig> ReadCommonConfig(const gguf::Meta& meta) {
  ModelConfig c;
  c.arch = meta.arch();
  if (auto name = meta.StringOpt("general.name"); name.ok() && name->has_value()) c.name = **name;
  FUCINA_ASSIGN_OR_RETURN(hidden, meta.Int("embedding_length"));
  FUCINA_ASSIGN_OR_RETURN(layers, meta.Int("block_count"));
  FUCINA_ASSIGN_OR_RETURN(heads, meta.Int("attention.head_count"));
  FUCINA_ASSIGN_OR_RETURN(eps, meta.Float("attention.layer_norm_rms_epsilon"));
  FUCINA_ASSIGN_OR_RETURN(heads_kv, meta.IntOpt("attention.head_count_kv"));
  FUCINA_ASSIGN_OR_RETURN(base, meta.FloatOpt("rope.freq_base"));
  FUCINA_ASSIGN_OR_RETURN(ctx, meta.IntOpt("context_length"));
  FUCINA_ASSIGN_OR_RETURN(experts, meta.IntOpt("expert_count"));
  c.hidden = static_cast<int64_t>(*hidden_or);
  c.num_layers = static_cast<int64_t>(*layers_or);
  c.num_heads = static_cast<int64_t>(*heads_or);
  c.num_heads_kv = static_cast<int64_t>(heads_kv_or->value_or(c.num_heads));
  c.rms_eps = *eps_or;
  c.rope_base = base_or->value_or(10000.0f);
  c.context_length = static_cast<int64_t>(ctx_or->value_or(4096));
  c.num_experts = static_cast<int64_t>(experts_or->value_or(0));
  if (c.IsMoe()) {
    FUCINA_ASSIGN_OR_RETURN(used, meta.Int("expert_used_count"));
    FUCINA_ASSIGN_OR_RETURN(eff, meta.Int("expert_feed_forward_length"));
    c.num_experts_used = static_cast<int64_t>(*used_or);
    c.expert_ffn = static_cast<int64_t>(*eff_or);
    FUCINA_ASSIGN_OR_RETURN(ffn, meta.IntOpt("feed_forward_length"));
    c.ffn = static_cast<int64_t>(ffn_or->value_or(0));
  } else {
    FUCINA_ASSIGN_OR_RETURN(ffn, meta.Int("feed_forward_length"));
    c.ffn = static_cast<int64_t>(*ffn_or);
  }
  const gguf::TensorInfo* embd = meta.file().FindTensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) {
    return absl::InvalidArgumentError("tensor token_embd.weight is missing or not 2-D");
  }
  if (embd->dims[0] != c.hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat("token_embd.weight rows have ", embd->dims[0], " values but ", meta.arch(),
                     ".embedding_length is ", c.hidden));
  }
  c.vocab_size = embd->dims[1];
  return c;
}

}  // namespace fucina::families
