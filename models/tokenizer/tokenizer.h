// Text <-> token ids for GGUF models, id-for-id what llama.cpp produces for the same file.
//
// Built from the tokenizer.ggml.* metadata: "gpt2" vocabularies are byte-level BPE with the
// pre-tokenizer named by tokenizer.ggml.pre; "llama" vocabularies are SentencePiece-style
// (scores, byte fallback, U+2581 for spaces); "gemma4" vocabularies are BPE over raw UTF-8 with
// U+2581 for spaces, split only at newline runs, with <0xNN> byte fallback. Special tokens,
// BOS/EOS and end-of-generation ids follow llama.cpp's llama_vocab, including its defaults and
// text-based detection.
#ifndef FUCINA_MODELS_TOKENIZER_TOKENIZER_H_
#define FUCINA_MODELS_TOKENIZER_TOKENIZER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "models/gguf/gguf.h"
#include "models/tokenizer/bpe.h"
#include "models/tokenizer/pretokenize.h"

namespace fucina {

// Per-token attribute bits, with llama.cpp's llama_token_attr values.
inline constexpr uint32_t kTokenAttrUnknown = 1u << 0;
inline constexpr uint32_t kTokenAttrUnused = 1u << 1;
inline constexpr uint32_t kTokenAttrNormal = 1u << 2;
inline constexpr uint32_t kTokenAttrControl = 1u << 3;
inline constexpr uint32_t kTokenAttrUserDefined = 1u << 4;
inline constexpr uint32_t kTokenAttrByte = 1u << 5;
inline constexpr uint32_t kTokenAttrLstrip = 1u << 7;
inline constexpr uint32_t kTokenAttrRstrip = 1u << 8;

class Tokenizer {
 public:
  // Errors name the key at fault: a missing or unknown tokenizer.ggml.model, an unknown
  // tokenizer.ggml.pre (a file without the key gets llama.cpp's "default"), missing
  // tokenizer.ggml.tokens or (for BPE) tokenizer.ggml.merges, arrays of the wrong type or
  // shorter than the vocabulary.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const gguf::File& file);

  // llama_tokenize(text, add_special, parse_special). add_special adds BOS/EOS as add_bos() /
  // add_eos() say; parse_special matches control (and unknown) tokens in the text before the
  // model's tokenizer runs. User-defined tokens are always matched. Invalid UTF-8 bytes are
  // tokenized as U+FFFD, as llama.cpp does.
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special) const;
  // The same with parse_special, except that no control (or unknown) token is matched where
  // its text starts inside one of `plain` (byte ranges [first, second) of `text`): a chat's
  // user and tool content is text, even when it spells "<|im_end|>". Tokens stay as they are
  // around those ranges (no fragment boundary is added).
  std::vector<int32_t> EncodeWithPlainRanges(
      std::string_view text, bool add_special,
      std::span<const std::pair<size_t, size_t>> plain) const;

  // Concatenated token bytes (may be invalid UTF-8, e.g. a character split across the end).
  // As llama_detokenize without its clean-up of spaces (so Encode then Decode round-trips):
  // SPM vocabularies drop one leading space of the first piece; skip_special drops a leading BOS
  // / trailing EOS (when add_bos / add_eos) and renders control and unknown tokens as nothing.
  std::string Decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // The bytes `id` decodes to: byte-level decoded for BPE, U+2581 -> space and <0xNN> -> byte
  // for SPM and "gemma4"; control and user-defined tokens as their text. Empty for out-of-range
  // ids.
  std::string TokenToPiece(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  std::optional<int32_t> bos_id() const { return OptionalId(bos_); }
  std::optional<int32_t> eos_id() const { return OptionalId(eos_); }
  // llama.cpp's special_eog_ids: EOS, EOT, EOM, FIM pad/repo/file-separator and tokens whose
  // text ends a turn in known chat formats (<|im_end|>, <|eot_id|>, <|endoftext|>, ...).
  bool IsEndOfGeneration(int32_t id) const;
  const std::vector<int32_t>& end_of_generation_ids() const { return eog_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // The id of the token whose vocabulary text is exactly `piece` (raw, e.g. "Ġthe", "▁the").
  std::optional<int32_t> TokenId(std::string_view piece) const;
  // kTokenAttr* bits of `id` as llama.cpp derives them (0 for out-of-range ids).
  uint32_t TokenAttributes(int32_t id) const;

 private:
  enum class Model { kBpe, kSpm };

  Tokenizer() = default;
  static std::optional<int32_t> OptionalId(int32_t id) {
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }
  absl::Status Load(const gguf::File& file);
  void DetectSpecialTokens(const gguf::File& file);
  std::string ComputePiece(int32_t id) const;
  int32_t Find(std::string_view text) const;
  std::vector<int32_t> EncodeImpl(std::string_view text, bool add_special, bool parse_special,
                                  std::span<const std::pair<size_t, size_t>> plain) const;
  // Tokenizes one fragment of plain text (no special tokens) with the model.
  void EncodeBpe(std::string_view text, std::vector<int32_t>* out) const;

  Model model_ = Model::kBpe;
  PreTokenizerSpec pre_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  int32_t bos_ = -1;
  int32_t eos_ = -1;

  std::vector<std::string> tokens_;
  std::vector<uint32_t> attrs_;
  std::vector<float> scores_;
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  BpeMerges merges_;
  std::array<int32_t, 256> byte_tokens_{};  // SPM byte fallback; -1 where missing.
  std::vector<int32_t> special_tokens_;     // Matched before tokenizing; longest text first.
  std::vector<std::string> pieces_;         // TokenToPiece by id.
  std::vector<int32_t> eog_;                // Sorted.
};

// Cuts a byte stream (e.g. token pieces as they are generated) at UTF-8 character boundaries.
// Push returns every byte up to the last complete character; an incomplete but so-far valid
// sequence at the end is held back until the next Push or Flush. Bytes that cannot be part of
// a valid sequence are passed through unchanged at once (not replaced by U+FFFD): the
// concatenated output always equals the concatenated input, and callers that need valid UTF-8
// replace them.
class Utf8Stream {
 public:
  std::string Push(std::string_view bytes);
  // Returns the held-back bytes (an incomplete sequence) and resets the stream.
  std::string Flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  std::string pending_;
};

// `bytes` with every byte that does not belong to a complete, valid UTF-8 sequence replaced by
// U+FFFD: text for protocols that require valid UTF-8 (protobuf strings, JSON).
std::string ValidUtf8(std::string_view bytes);

}  // namespace fucina

#endif  // FUCINA_MODELS_TOKENIZER_TOKENIZER_H_
