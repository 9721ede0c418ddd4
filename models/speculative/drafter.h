// A draft-model-free drafter: proposes the tokens likely to follow a stream, for one verify
// pass to check (verify.h). Two sources, cascaded as in SAM-Decoding (arXiv 2411.10666) with
// Token Recycling (arXiv 2408.08696):
//
//   1. Suffix automata over the stream (prompt + generated tokens) and over an optional
//      reference document: the longest suffix of the stream that occurred before (in either;
//      ties go to the stream), at least min_match tokens long, proposes what followed it.
//   2. Token Recycling: each token's recent successors as the model chose them in verify
//      passes (Observe: the emitted tokens, so only token ids, never logits, and no scan of the
//      vocabulary per row, which cost more than it saved on a 5 ms decode step); with no match
//      long enough, a chain of the latest successors. A chain, not a tree: the verify pass is
//      one causal forward over k + 1 positions (Model::ForwardStepAllLogits, a pipeline stage's
//      segment), with no tree attention.
//
// The draft length follows the recent acceptance rate (an exponential average of accepted /
// drafted): long while drafts land, 1 when they do not, and nothing at all when acceptance
// collapses, except one probing token every kProbeEvery steps, so free text costs next to
// nothing beyond plain decoding.
#ifndef FUCINA_MODELS_SPECULATIVE_DRAFTER_H_
#define FUCINA_MODELS_SPECULATIVE_DRAFTER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "models/speculative/suffix_automaton.h"

namespace fucina {

struct DrafterOptions {
  int max_draft = 8;   // tokens per verify pass at most (0: never drafts)
  int min_match = 2;   // shortest automaton match that drafts
  int successors = 4;  // Token Recycling: successors kept per token (latest first)
  // Token Recycling's memory bound: tokens with a successor list (successors x 4 B each).
  int64_t max_recycled_tokens = 1 << 16;
};

class Drafter {
 public:
  explicit Drafter(DrafterOptions options = {});

  // A document the output is likely to copy from (--spec-ref), tokenized once.
  void SetReference(std::span<const int32_t> tokens);
  // Extends the stream: the prompt, then each token generated.
  void Accept(std::span<const int32_t> tokens);
  // Up to `limit` tokens proposed to follow the stream (fewer, or none: see the header).
  std::vector<int32_t> Draft(int limit);
  // Token Recycling: the model chose `next` after `token`.
  void Observe(int32_t token, int32_t next);
  // A verify pass emitted `tokens` after the stream's `last` token: their successors are
  // observed and the stream extended by them.
  void Emitted(int32_t last, std::span<const int32_t> tokens);
  // The outcome of a verify pass of `drafted` (> 0) tokens of which `accepted` held.
  void Record(int drafted, int accepted);

  double acceptance() const { return rate_; }

  // Below this acceptance rate nothing is drafted but a probe every kProbeEvery steps.
  static constexpr double kCollapsed = 0.1;
  static constexpr int kProbeEvery = 16;

 private:
  // What follows the first occurrence of `match` in `text`, at most `limit` tokens.
  static void Continue(const SuffixAutomaton& sam, const SuffixAutomaton::Match& match,
                       int limit, std::vector<int32_t>* out);

  DrafterOptions options_;
  SuffixAutomaton stream_, reference_;
  SuffixAutomaton::Match stream_match_, reference_match_;
  int32_t last_ = -1;  // the stream's last token
  absl::flat_hash_map<int32_t, std::vector<int32_t>> successors_;
  double rate_ = 0.5;  // exponential average of accepted / drafted
  int idle_ = 0;       // steps without a draft since acceptance collapsed
};

}  // namespace fucina

#endif  // FUCINA_MODELS_SPECULATIVE_DRAFTER_H_
