// Model families keyed by general.architecture (models/engine/family.h): the built-in ones
// (models/families/<arch>.cc) and any registered at run time (tests, plugins).
#ifndef FUCINA_MODELS_ENGINE_REGISTRY_H_
#define FUCINA_MODELS_ENGINE_REGISTRY_H_

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/engine/config.h"
#include "models/engine/family.h"
#include "models/gguf/gguf.h"

namespace fucina {

// The family for `arch`; an error listing the known ones if there is none.
absl::StatusOr<const ModelFamily*> FindModelFamily(std::string_view arch);

// Adds a family (which must outlive every use). Error if its arch is already known.
absl::Status RegisterModelFamily(const ModelFamily* family);

// Reads general.architecture and the family's config, validated.
absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::File& file);

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_REGISTRY_H_
