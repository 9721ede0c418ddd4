// Model families keyed by general.architecture: each family reads its ModelConfig from GGUF
// metadata (its key prefix, zero policy and defaults are data in its own file,
// models/families/<family>.cc); the decoder itself is shared (models/engine/model.cc).
#ifndef FUCINA_MODELS_ENGINE_REGISTRY_H_
#define FUCINA_MODELS_ENGINE_REGISTRY_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "models/engine/config.h"
#include "models/gguf/gguf.h"

namespace fucina {

using ReadConfigFn = absl::StatusOr<ModelConfig> (*)(const gguf::File& file);

struct ModelFamily {
  std::string_view arch;
  ReadConfigFn read_config;
};

// The family for `arch`; an error listing the known ones if there is none.
absl::StatusOr<const ModelFamily*> FindModelFamily(std::string_view arch);

// Reads general.architecture and the family's config, validated.
absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::File& file);

// Family config readers (models/families/*.cc).
absl::StatusOr<ModelConfig> ReadQwen3Config(const gguf::File& file);
absl::StatusOr<ModelConfig> ReadLlamaConfig(const gguf::File& file);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_REGISTRY_H_
