// Byte-pair merging of one pre-tokenized word, as llama.cpp's llm_tokenizer_bpe_session.
#ifndef FUCINA_MODELS_TOKENIZER_BPE_H_
#define FUCINA_MODELS_TOKENIZER_BPE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace fucina {

// Merge ranks from tokenizer.ggml.merges ("left right", index = rank; lower merges first).
class BpeMerges {
 public:
  // Splits `line` at its first space after the first byte (so a merge may start with a space,
  // as llama.cpp reads them); a line without one is recorded as ("", ""), which no pair of
  // non-empty symbols matches. Duplicates keep their first (lowest) rank.
  void Add(std::string_view line, int32_t rank);
  // Rank of merging `left` with `right`, or -1.
  int32_t Rank(std::string_view left, std::string_view right) const;
  size_t size() const { return ranks_.size(); }

 private:
  // Key: left + ' ' + right. Unambiguous because Rank refuses a `left` with a space after its
  // first byte, which Add never produces either.
  absl::flat_hash_map<std::string, int32_t> ranks_;
};

// Merges the UTF-8 characters of `word` by rank until no adjacent pair has a merge, and appends
// the resulting pieces (views into `word`) in order. Ties between equal ranks go to the
// leftmost pair, the queue order llama.cpp uses.
void BpeMergeWord(std::string_view word, const BpeMerges& merges,
                  std::vector<std::string_view>* pieces);

}  // namespace fucina

#endif  // FUCINA_MODELS_TOKENIZER_BPE_H_
