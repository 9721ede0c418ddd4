#include "models/engine/registry.h"

#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace fucina {

// The built-in families, one per file in models/families/.
extern const ModelFamily kLlamaFamily;
extern const ModelFamily kQwen3Family;
extern const ModelFamily kQwen3MoeFamily;
extern const ModelFamily kGemma4Family;

namespace {

std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

std::vector<const ModelFamily*>& Families() {
  static auto* families = new std::vector<const ModelFamily*>{
      &kQwen3Family, &kQwen3MoeFamily, &kLlamaFamily, &kGemma4Family};
  return *families;
}

}  // namespace

absl::Status RegisterModelFamily(const ModelFamily* family) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  for (const ModelFamily* f : Families()) {
    if (f->arch == family->arch) {
      return absl::AlreadyExistsError(
          absl::StrCat("architecture '", std::string(family->arch), "' is already registered"));
    }
  }
  Families().push_back(family);
  return absl::OkStatus();
}

absl::StatusOr<const ModelFamily*> FindModelFamily(std::string_view arch) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  for (const ModelFamily* f : Families()) {
    if (f->arch == arch) return f;
  }
  std::string known;
  for (const ModelFamily* f : Families()) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", std::string(f->arch));
  }
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
