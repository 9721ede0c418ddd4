// Llama (general.architecture "llama"; also SmolLM2 and other Llama-shaped models): GQA
// attention without q/k norms, normal (interleaved-pair) RoPE over rope.dimension_count dims,
// Llama-3 frequency factors from rope_freqs.weight when present, SwiGLU FFN.
#include "absl/strings/str_cat.h"
#include "models/families/common.h"

namespace fucina {
namespace {

constexpr families::PreNormDecoderOptions kOptions{
    .qk_norm = false, .rope_mode = RopeMode::kNormal, .rope_freqs = true};

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
  c.UniformLayers();
  return c;
}

void WriteLlamaConfig(const ModelConfig& c, gguf::Writer& w) {
  families::WriteCommonConfig(c, w);
  w.SetValue("llama.rope.dimension_count", gguf::Value::U32(c.rope_dims));
  w.SetValue("llama.vocab_size", gguf::Value::U32(c.vocab_size));
}

absl::StatusOr<ModelConfig> LlamaFixtureConfig(const FixtureOptions& o, int64_t vocab) {
  if (o.hidden % o.num_heads != 0) {
    return absl::InvalidArgumentError("llama: --hidden must be a multiple of --heads");
  }
  ModelConfig c = families::BaseFixtureConfig(o, vocab);
  c.head_dim = c.rope_dims = o.hidden / o.num_heads;
  c.UniformLayers();
  return c;
}

}  // namespace

extern const ModelFamily kLlamaFamily = {
    .arch = "llama",
    .read_config = ReadLlamaConfig,
    .tensors = [](const ModelConfig& c) { return families::PreNormDecoderTensors(c, kOptions); },
    .create = [](const ModelConfig& c, const gguf::File&) {
      return families::NewPreNormDecoder(c, kOptions);
    },
    .write_config = WriteLlamaConfig,
    .fixture_config = LlamaFixtureConfig,
};

}  // namespace fucina
