#include "models/gguf/meta.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace fucina::gguf {

Meta::Meta(const File& file, std::string arch, ZeroPolicy zero_policy)
    : file_(&file), arch_(std::move(arch)), zero_policy_(zero_policy) {}

absl::StatusOr<Meta> Meta::ForFile(const File& file, ZeroPolicy zero_policy) {
  Meta probe(file, "", zero_policy);
  absl::StatusOr<std::string> arch = probe.String(kKeyArchitecture);
  if (!arch.ok()) return arch.status();
  if (arch->empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: key '%s' is empty", file.path(), kKeyArchitecture));
  }
  return Meta(file, *std::move(arch), zero_policy);
}

absl::Status Meta::Missing(std::string_view key) const {
  return absl::NotFoundError(
      absl::StrFormat("%s: required key '%s' is missing", file_->path(), key));
}

absl::Status Meta::WrongType(std::string_view key, const Value& v,
                             std::string_view expected) const {
  return absl::InvalidArgumentError(absl::StrFormat("%s: key '%s' has type %s, expected %s",
                                                    file_->path(), key, ValueTypeName(v.type()),
                                                    expected));
}

absl::StatusOr<uint64_t> Meta::CheckInt(std::string_view key, const Value& v,
                                        bool required) const {
  const std::optional<uint64_t> u = v.AsUint();
  if (!u) {
    if (v.is_integer()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: key '%s' is %s, expected a non-negative integer", file_->path(), key,
          v.ToDisplayString()));
    }
    return WrongType(key, v, "a non-negative integer");
  }
  if (required && *u == 0 && zero_policy_ == ZeroPolicy::kRejectZero) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: key '%s' is 0, which %s models do not allow", file_->path(), key,
                        arch_));
  }
  return *u;
}

absl::StatusOr<float> Meta::CheckFloat(std::string_view key, const Value& v) const {
  const std::optional<double> d = v.AsFloat();
  if (!d) return WrongType(key, v, "a number");
  return static_cast<float>(*d);
}

absl::StatusOr<uint64_t> Meta::Int(std::string_view suffix) const {
  const std::string key = Key(suffix);
  const Value* v = file_->Find(key);
  if (v == nullptr) return Missing(key);
  return CheckInt(key, *v, /*required=*/true);
}

absl::StatusOr<std::optional<uint64_t>> Meta::IntOpt(std::string_view suffix) const {
  const std::string key = Key(suffix);
  const Value* v = file_->Find(key);
  if (v == nullptr) return std::nullopt;
  absl::StatusOr<uint64_t> u = CheckInt(key, *v, /*required=*/false);
  if (!u.ok()) return u.status();
  return *u;
}

absl::StatusOr<std::vector<uint64_t>> Meta::IntPerLayer(std::string_view suffix, size_t n) const {
  const std::string key = Key(suffix);
  const Value* v = file_->Find(key);
  if (v == nullptr) return Missing(key);
  const Array* arr = v->AsArray();
  if (arr == nullptr) {
    absl::StatusOr<uint64_t> u = CheckInt(key, *v, /*required=*/true);
    if (!u.ok()) return u.status();
    return std::vector<uint64_t>(n, *u);
  }
  if (arr->items.size() != n) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: key '%s' has %d entries, expected %d (one per layer)", file_->path(), key,
        arr->items.size(), n));
  }
  std::vector<uint64_t> out;
  out.reserve(n);
  for (const Value& item : arr->items) {
    absl::StatusOr<uint64_t> u = CheckInt(key, item, /*required=*/true);
    if (!u.ok()) return u.status();
    out.push_back(*u);
  }
  return out;
}

absl::StatusOr<float> Meta::Float(std::string_view suffix) const {
  const std::string key = Key(suffix);
  const Value* v = file_->Find(key);
  if (v == nullptr) return Missing(key);
  return CheckFloat(key, *v);
}

absl::StatusOr<std::optional<float>> Meta::FloatOpt(std::string_view suffix) const {
  const std::string key = Key(suffix);
  const Value* v = file_->Find(key);
  if (v == nullptr) return std::nullopt;
  absl::StatusOr<float> f = CheckFloat(key, *v);
  if (!f.ok()) return f.status();
  return *f;
}

absl::StatusOr<bool> Meta::Bool(std::string_view suffix) const {
  absl::StatusOr<std::optional<bool>> b = BoolOpt(suffix);
  if (!b.ok()) return b.status();
  if (!b->has_value()) return Missing(Key(suffix));
  return **b;
}

absl::StatusOr<std::optional<bool>> Meta::BoolOpt(std::string_view suffix) const {
  const std::string key = Key(suffix);
  const Value* v = file_->Find(key);
  if (v == nullptr) return std::nullopt;
  const std::optional<bool> b = v->AsBool();
  if (!b) return WrongType(key, *v, "bool");
  return *b;
}

absl::StatusOr<std::string> Meta::String(std::string_view full_key) const {
  absl::StatusOr<std::optional<std::string>> s = StringOpt(full_key);
  if (!s.ok()) return s.status();
  if (!s->has_value()) return Missing(full_key);
  return **std::move(s);
}

absl::StatusOr<std::optional<std::string>> Meta::StringOpt(std::string_view full_key) const {
  const Value* v = file_->Find(full_key);
  if (v == nullptr) return std::nullopt;
  const std::string* s = v->AsString();
  if (s == nullptr) return WrongType(full_key, *v, "string");
  return *s;
}

absl::StatusOr<const Array*> Meta::ArrayOf(std::string_view full_key, ValueType elem) const {
  const Value* v = file_->Find(full_key);
  if (v == nullptr) return Missing(full_key);
  const Array* arr = v->AsArray();
  if (arr == nullptr || arr->elem_type != elem) {
    return WrongType(full_key, *v,
                     absl::StrFormat("array of %s", ValueTypeName(elem)));
  }
  return arr;
}

absl::StatusOr<std::vector<std::string>> Meta::StringArray(std::string_view full_key) const {
  absl::StatusOr<const Array*> arr = ArrayOf(full_key, ValueType::kString);
  if (!arr.ok()) return arr.status();
  std::vector<std::string> out;
  out.reserve((*arr)->items.size());
  for (const Value& item : (*arr)->items) out.push_back(*item.AsString());
  return out;
}

ZeroPolicy ZeroPolicyForArch(std::string_view arch) {
  return arch.starts_with("gemma") || arch == "diffusion-gemma" ? ZeroPolicy::kAcceptZero
                                                                : ZeroPolicy::kRejectZero;
}

}  // namespace fucina::gguf
