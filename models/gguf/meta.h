// Typed metadata getters for one model family: keys are "<arch>.<suffix>" (llama.block_count)
// except String/StringOpt/Array lookups, which take the full key.
//
// Required integers are where malformed conversions show up first (a zero head count divides by
// zero much later), so the family chooses a ZeroPolicy: qwen3, qwen3moe and llama reject a
// present-but-zero required integer; gemma-like families, whose files legitimately carry zeros
// (e.g. sliding-window fields), accept them. Every error names the key and the file.
#ifndef FUCINA_MODELS_GGUF_META_H_
#define FUCINA_MODELS_GGUF_META_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/gguf/gguf.h"

namespace fucina::gguf {

enum class ZeroPolicy { kRejectZero, kAcceptZero };

// The policy each family declares: gemma-like families (gemma*, diffusion-gemma) accept
// zeros; qwen3, qwen3moe, qwen35, llama and every other family reject them.
ZeroPolicy ZeroPolicyForArch(std::string_view arch);

class Meta {
 public:
  // `file` must outlive the Meta.
  Meta(const File& file, std::string arch, ZeroPolicy zero_policy);
  // The arch is general.architecture (a required, non-empty string).
  static absl::StatusOr<Meta> ForFile(const File& file, ZeroPolicy zero_policy);

  const std::string& arch() const { return arch_; }
  const File& file() const { return *file_; }
  std::string Key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }

  // Required: NotFound if absent; InvalidArgument if not a non-negative integer (or zero under
  // kRejectZero).
  absl::StatusOr<uint64_t> Int(std::string_view suffix) const;
  // Absent -> nullopt; present values are type-checked but may be zero.
  absl::StatusOr<std::optional<uint64_t>> IntOpt(std::string_view suffix) const;
  // A scalar broadcast to n entries, or an integer array of exactly n entries (per-layer values
  // such as head_count_kv in some families). Required; zero policy applies to every entry.
  absl::StatusOr<std::vector<uint64_t>> IntPerLayer(std::string_view suffix, size_t n) const;
  // Float types, or integers (converted).
  absl::StatusOr<float> Float(std::string_view suffix) const;
  absl::StatusOr<std::optional<float>> FloatOpt(std::string_view suffix) const;
  absl::StatusOr<bool> Bool(std::string_view suffix) const;
  absl::StatusOr<std::optional<bool>> BoolOpt(std::string_view suffix) const;

  // Full keys (no arch prefix), e.g. "tokenizer.ggml.model".
  absl::StatusOr<std::string> String(std::string_view full_key) const;
  absl::StatusOr<std::optional<std::string>> StringOpt(std::string_view full_key) const;
  // An array whose elements have `elem` type.
  absl::StatusOr<const Array*> ArrayOf(std::string_view full_key, ValueType elem) const;
  absl::StatusOr<std::vector<std::string>> StringArray(std::string_view full_key) const;

 private:
  absl::Status Missing(std::string_view key) const;
  absl::Status WrongType(std::string_view key, const Value& v, std::string_view expected) const;
  absl::StatusOr<uint64_t> CheckInt(std::string_view key, const Value& v, bool required) const;
  absl::StatusOr<float> CheckFloat(std::string_view key, const Value& v) const;

  const File* file_;
  std::string arch_;
  ZeroPolicy zero_policy_;
};

}  // namespace fucina::gguf

#endif  // FUCINA_MODELS_GGUF_META_H_
