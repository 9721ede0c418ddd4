#include "models/engine/registry.h"

#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

constexpr ModelFamily kFamilies[] = {
    {"qwen3", ReadQwen3Config},
    {"qwen3moe", ReadQwen3Config},
    {"llama", ReadLlamaConfig},
};

}  // namespace

absl::StatusOr<const ModelFamily*> FindModelFamily(std::string_view arch) {
  for (const ModelFamily& f : kFamilies) {
    if (f.arch == arch) return &f;
  }
  std::string known;
  for (const ModelFamily& f : kFamilies) absl::StrAppend(&known, known.empty() ? "" : ", ",
                                                         std::string(f.arch));
  return absl::UnimplementedError(absl::StrCat("unsupported architecture '", std::string(arch),
                                               "' (supported: ", known, ")"));
}

absl::StatusOr<ModelConfig> ReadModelConfig(const gguf::File& file) {
  const gguf::Value* arch = file.Find("general.architecture");
  if (arch == nullptr || arch->AsString() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": general.architecture is missing or not a string"));
  }
  auto family = FindModelFamily(*arch->AsString());
  if (!family.ok()) return family.status();
  auto config = (*family)->read_config(file);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(file.path(), ": ", config.status().message()));
  }
  if (absl::Status s = config->Validate(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(file.path(), ": ", s.message()));
  }
  return config;
}

}  // namespace fucina
