// Pre-tokenization of byte-level BPE vocabularies: splits text into the words BPE merges
// within, exactly as llama.cpp's unicode_regex_split does for each tokenizer.ggml.pre.
//
// llama.cpp runs a list of regexes per pre-tokenizer, each one re-splitting the pieces the
// previous one produced (text between matches stays a piece of its own). The common regexes
// (GPT-2's, Llama 3's, Qwen2's, Qwen3.5's) are hand-written state machines there, whose
// behaviour is the reference; the others are std::regex over text where each code point is
// replaced by a class byte. Each is a hand-written splitter here, over full Unicode classes.
#ifndef FUCINA_MODELS_TOKENIZER_PRETOKENIZE_H_
#define FUCINA_MODELS_TOKENIZER_PRETOKENIZE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fucina {

enum class PreTokenizer {
  kDefault,    // punctuation runs, GPT-2, \p{N}+, [0-9]{3} (llama.cpp's fallback list).
  kGpt2,       // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,     // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|...
  kQwen2,      // Llama 3's with \p{N} (one digit per word).
  kQwen35,     // Qwen2's with [\p{L}\p{M}]+ letter runs.
  kStarcoder,  // \p{N}, then GPT-2's.
  kFalcon,     // [\p{P}$+<=>^~|`]+, GPT-2's, [0-9][0-9][0-9].
  kNewlines,   // [^\n]+|[\n]+ (Gemma 4: merges alone shape the words within a line).
};

// What a tokenizer.ggml.pre name selects, and the vocabulary defaults llama.cpp ties to it.
struct PreTokenizerSpec {
  PreTokenizer kind = PreTokenizer::kDefault;
  bool ignore_merges = false;  // A word that is itself a token is emitted without merging.
  bool add_bos = false;        // Default of add_bos when tokenizer.ggml.add_bos_token is absent.
  bool no_bos = false;         // The vocabulary has no BOS token unless the file names one.
  // SentencePiece-style BPE (Gemma 4): spaces become U+2581 before splitting, words are merged
  // as raw UTF-8 (no byte-level encoding), tokens decode with U+2581 as a space, and bytes no
  // merge covers fall back to <0xNN> tokens.
  bool escape_whitespaces = false;
  // A word made only of newlines is emitted whole when it is a token (llama.cpp's Gemma 4 fix:
  // its merges do not rebuild every newline run the vocabulary has).
  bool newline_words_whole = false;
  // add_bos is on even when tokenizer.ggml.add_bos_token says false (Gemma 4 needs its BOS).
  bool force_add_bos = false;
};

// The spec for `pre` as llama.cpp's llama_vocab::impl::load maps it (an empty name is
// llama.cpp's "default"); nullopt for names it does not know or this code does not implement.
std::optional<PreTokenizerSpec> FindPreTokenizer(std::string_view pre);

// Splits `text` into words (UTF-8). Invalid UTF-8 bytes become U+FFFD first, as in llama.cpp.
// The words concatenate to the (repaired) text.
std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text);

}  // namespace fucina

#endif  // FUCINA_MODELS_TOKENIZER_PRETOKENIZE_H_
