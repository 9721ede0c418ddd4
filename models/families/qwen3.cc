// Qwen3 dense and MoE (general.architecture "qwen3" / "qwen3moe"): GQA attention with a
// per-head RMSNorm of q and k before RoPE, NeoX-style RoPE over the whole head, SwiGLU FFN
// or a top-k routed mixture of SwiGLU experts with renormalised router weights.
#include "absl/strings/str_cat.h"
#include "models/families/common.h"

namespace fucina {
namespace {

constexpr families::PreNormDecoderOptions kOptions{
    .qk_norm = true, .rope_mode = RopeMode::kNeox, .renormalize_experts = true};

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
  if (c.arch == "qwen3moe" && !c.IsMoe()) {
    return absl::InvalidArgumentError("qwen3moe.expert_count is missing");
  }
  c.UniformLayers();
  return c;
}

void WriteQwen3Config(const ModelConfig& c, gguf::Writer& w) {
  families::WriteCommonConfig(c, w);
  w.SetValue(absl::StrCat(c.arch, ".attention.key_length"), gguf::Value::U32(c.head_dim));
  w.SetValue(absl::StrCat(c.arch, ".attention.value_length"), gguf::Value::U32(c.head_dim));
}

absl::StatusOr<ModelConfig> Qwen3FixtureConfig(const FixtureOptions& o, int64_t vocab) {
  ModelConfig c = families::BaseFixtureConfig(o, vocab);
  if (o.arch == "qwen3moe") {
    c.num_experts = o.num_experts;
    c.num_experts_used = o.num_experts_used;
    c.expert_ffn = o.expert_ffn;
    c.ffn = 0;
  }
  c.UniformLayers();
  return c;
}

TensorTable Qwen3Tensors(const ModelConfig& c) {
  return families::PreNormDecoderTensors(c, kOptions);
}

std::unique_ptr<FamilyModel> NewQwen3(const ModelConfig& c, const gguf::File&) {
  return families::NewPreNormDecoder(c, kOptions);
}

}  // namespace

extern const ModelFamily kQwen3Family = {
    .arch = "qwen3",
    .read_config = ReadQwen3Config,
    .tensors = Qwen3Tensors,
    .create = NewQwen3,
    .write_config = WriteQwen3Config,
    .fixture_config = Qwen3FixtureConfig,
};

extern const ModelFamily kQwen3MoeFamily = {
    .arch = "qwen3moe",
    .read_config = ReadQwen3Config,
    .tensors = Qwen3Tensors,
    .create = NewQwen3,
    .write_config = WriteQwen3Config,
    .fixture_config = Qwen3FixtureConfig,
};

}  // namespace fucina
