#include "models/speculative/verify.h"

namespace fucina {

absl::StatusOr<Verified> VerifyDrafts(Sampler& sampler, std::span<const float> rows,
                                      int64_t vocab, std::span<const int32_t> tokens,
                                      size_t drafts, TokenConstraint* constraint) {
  Verified v;
  const size_t base = tokens.size() - drafts;  // through t
  std::vector<uint32_t> mask;
  for (size_t i = 0; i <= drafts; ++i) {
    if (constraint != nullptr) {
      if (absl::Status s = constraint->Mask(&mask); !s.ok()) return s;
    }
    SampleResult s = sampler.Sample(rows.subspan(i * vocab, vocab), tokens.first(base + i), mask);
    const int32_t id = s.id;
    v.tokens.push_back(id);
    v.samples.push_back(std::move(s));
    if (constraint != nullptr) {
      if (absl::Status st = constraint->Accept(id); !st.ok()) return st;
      if (constraint->stopped()) {
        v.stopped = true;
        break;
      }
    }
    if (i == drafts || id != tokens[base + i]) break;
    ++v.accepted;
  }
  return v;
}

}  // namespace fucina
