// A suffix automaton over a token sequence (Blumer et al.; the drafting structure of
// SAM-Decoding, arXiv 2411.10666): the text grows one token at a time in amortized O(1), and a
// match of a token stream against it advances in amortized O(1) per token, always holding the
// longest suffix of the stream that occurs in the text. That occurrence's continuation in the
// text is what a drafter proposes.
//
// States are the automaton's (at most 2n); transitions live in one hash map keyed by (state,
// token), with each state's list of tokens beside it (a split copies them), so memory is O(n)
// whatever the vocabulary.
#ifndef FUCINA_MODELS_SPECULATIVE_SUFFIX_AUTOMATON_H_
#define FUCINA_MODELS_SPECULATIVE_SUFFIX_AUTOMATON_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace fucina {

class SuffixAutomaton {
 public:
  // The longest suffix of a stream that occurs in the text: its automaton state and length.
  struct Match {
    int32_t state = 0;
    int64_t length = 0;
  };

  SuffixAutomaton();

  // Appends `token` to the text. Matches taken before stay valid (see Normalize).
  void Append(int32_t token);
  std::span<const int32_t> text() const { return text_; }

  // The match of stream + `token`, given the match of the stream: follows the transition by
  // `token`, falling back along suffix links (shorter suffixes) until one exists.
  Match Step(Match match, int32_t token) const;
  // A match taken before Append calls, moved to the state that now holds its length (an
  // Append can split a state in two).
  Match Normalize(Match match) const;
  // Index in text() of the last token of the match's first occurrence (-1 for the empty match).
  int64_t FirstEnd(const Match& match) const;

 private:
  struct State {
    int64_t length = 0;      // of the longest string of the state
    int32_t link = -1;       // suffix link
    int64_t first_end = -1;  // end index of the first occurrence
  };
  static uint64_t Key(int32_t state, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) |
           static_cast<uint32_t>(token);
  }
  int32_t Next(int32_t state, int32_t token) const {
    auto it = next_.find(Key(state, token));
    return it == next_.end() ? -1 : it->second;
  }

  std::vector<State> states_;
  absl::flat_hash_map<uint64_t, int32_t> next_;
  std::vector<std::vector<int32_t>> out_;  // per state: the tokens it has transitions by
  int32_t last_ = 0;  // the state of the whole text
  std::vector<int32_t> text_;
};

}  // namespace fucina

#endif  // FUCINA_MODELS_SPECULATIVE_SUFFIX_AUTOMATON_H_
