// SentencePiece-style (tokenizer.ggml.model "llama") encoding of one text fragment: llama.cpp's
// llm_tokenizer_spm_session. Adjacent symbols merge whenever their concatenation is a token,
// highest score first; what never forms a token falls back to byte tokens.
#ifndef FUCINA_MODELS_TOKENIZER_SPM_H_
#define FUCINA_MODELS_TOKENIZER_SPM_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace fucina {

struct SpmVocab {
  const absl::flat_hash_map<std::string, int32_t>* token_to_id;
  const std::vector<float>* scores;  // By id.
  // Token for each byte: "<0xNN>" or else the one-byte token; -1 if neither exists (the byte
  // is then dropped, where llama.cpp would throw).
  const std::array<int32_t, 256>* byte_tokens;
};

// `text` is already escaped (spaces as U+2581) and prefixed as the caller decides.
void SpmEncode(std::string_view text, const SpmVocab& vocab, std::vector<int32_t>* out);

}  // namespace fucina

#endif  // FUCINA_MODELS_TOKENIZER_SPM_H_
