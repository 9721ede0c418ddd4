// Imports a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) as the GGUF
// tokenizer.* metadata llama.cpp's converter writes: byte-level BPE as a "gpt2" vocabulary, and
// SentencePiece BPE (byte fallback, U+2581 for spaces: Llama 2, Gemma) as a "llama" one, as
// convert_hf_to_gguf.py's _set_vocab_sentencepiece does from the tokenizer.model it reads, or on
// request as a "gemma4" one (merges kept), as its Gemma 4 converter does.
#ifndef FUCINA_MODELS_GGUF_HF_TOKENIZER_H_
#define FUCINA_MODELS_GGUF_HF_TOKENIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fucina::gguf {

class Writer;

// GGUF token types (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct HfTokenizer {
  std::string model = "gpt2";          // tokenizer.ggml.model: "gpt2", "llama" or "gemma4".
  std::string pre;                     // tokenizer.ggml.pre: "qwen2", "llama3", ...; empty: none.
  std::vector<std::string> tokens;     // by id; holes filled with "[PAD<id>]".
  std::vector<int32_t> token_types;    // TokenType per id.
  std::vector<float> scores;           // "llama": by id, higher merges first; "gemma4": unused.
  std::vector<std::string> merges;     // "gpt2" and "gemma4": "a b", priority order.
  std::optional<int32_t> bos_id, eos_id, pad_id, unk_id;
  bool add_bos = false;
  std::optional<bool> add_eos;         // written only when the config says.
  std::optional<bool> add_space_prefix;  // "llama" only: whether text gets a leading space.
  std::string chat_template;           // empty if the config has none.

  // Writes tokenizer.ggml.* and tokenizer.chat_template keys.
  void WriteTo(Writer& writer) const;
};

// Reads `dir`/tokenizer.json and, if present, `dir`/tokenizer_config.json. A BPE model with
// byte_fallback is SentencePiece's and becomes a "llama" vocabulary (pre "default", `pre` is
// ignored), or with `pre` "gemma4" a "gemma4" one: merges, no pre key, add_bos on, byte pieces
// typed byte, the JSON's special added tokens control and Gemma 4's tool-call and channel
// markers user-defined, every other token normal. Any other BPE model becomes a "gpt2" one
// recording `pre` as its pre-tokenizer (the JSON's regexes are not parsed: GGUF names them);
// "gemma4" is refused for it. `min_vocab` pads the vocabulary with unused "[PAD<id>]" tokens, as
// converters do for padded embeddings. Errors name the file and what is malformed.
absl::StatusOr<HfTokenizer> ImportHfTokenizer(const std::string& dir, const std::string& pre,
                                              int64_t min_vocab = 0);

}  // namespace fucina::gguf

#endif  // FUCINA_MODELS_GGUF_HF_TOKENIZER_H_
