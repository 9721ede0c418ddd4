// Acceptance of one verify pass, shared by every decode loop that speculates.
//
// The pass ran the model over [t, d_1 .. d_k]: t the last token emitted (not yet in the cache)
// and d_i the drafts, giving k + 1 rows of logits; row i predicts the token after d_i (row 0:
// after t). Each row is sampled exactly as plain decoding would sample that position: the
// history up to it (drafts included) for the penalties, and the position's own draw
// (PositionDraw: a counter keyed by the seed and the position, not a stream advanced per
// sample). Drafts are accepted while they equal those samples; the first sample that differs
// (or the one after the last draft) is emitted after them. So a seed gives the same tokens
// with and without drafting, greedy or sampled, and a rejected draft shifts nothing.
#ifndef FUCINA_MODELS_SPECULATIVE_VERIFY_H_
#define FUCINA_MODELS_SPECULATIVE_VERIFY_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "models/sampler/sampler.h"

namespace fucina {

struct Verified {
  // The accepted drafts, then the sample that ended the pass: accepted + 1 tokens.
  std::vector<int32_t> tokens;
  std::vector<SampleResult> samples;  // one per token (logprobs of the verify pass)
  int accepted = 0;
  bool stopped = false;  // the constraint is complete after the last token
};

// `tokens`: every token through the pass's last one (t, then the `drafts` drafts, at its end):
// what the cache holds after the pass. `rows`: [drafts + 1, vocab] logits of the pass. Row i is
// sampled with the tokens through t and the first i drafts as its history (its position is that
// history's length).
//
// `constraint` (constrained decoding; may be null): row i is sampled among the tokens its mask
// allows after the accepted drafts before it, and every emitted token advances it. A draft the
// grammar refuses is never accepted (it cannot equal a masked sample). Once the constraint has
// stopped, the pass ends (`stopped`). Its errors are returned.
absl::StatusOr<Verified> VerifyDrafts(Sampler& sampler, std::span<const float> rows,
                                      int64_t vocab, std::span<const int32_t> tokens,
                                      size_t drafts, TokenConstraint* constraint = nullptr);

}  // namespace fucina

#endif  // FUCINA_MODELS_SPECULATIVE_VERIFY_H_
