#include "models/speculative/verify.h"

namespace fucina {

Verified VerifyDrafts(Sampler& sampler, std::span<const float> rows, int64_t vocab,
                      std::span<const int32_t> tokens, size_t drafts) {
  Verified v;
  const size_t base = tokens.size() - drafts;  // through t
  for (size_t i = 0; i <= drafts; ++i) {
    SampleResult s = sampler.Sample(rows.subspan(i * vocab, vocab), tokens.first(base + i));
    const int32_t id = s.id;
    v.tokens.push_back(id);
    v.samples.push_back(std::move(s));
    if (i == drafts || id != tokens[base + i]) break;
    ++v.accepted;
  }
  return v;
}

}  // namespace fucina
