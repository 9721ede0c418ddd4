#include "models/speculative/verify.h"

namespace fucina {

Verified VerifyDrafts(Sampler& sampler, std::span<const float> rows, int64_t vocab,
                      std::span<const int32_t> drafts, std::vector<int32_t>& history) {
  Verified v;
  const size_t base = history.size();
  for (size_t i = 0; i <= drafts.size(); ++i) {
    SampleResult s = sampler.Sample(rows.subspan(i * vocab, vocab), history);
    const int32_t id = s.id;
    v.tokens.push_back(id);
    v.samples.push_back(std::move(s));
    if (i == drafts.size() || id != drafts[i]) break;
    history.push_back(id);
    ++v.accepted;
  }
  history.resize(base);
  return v;
}

}  // namespace fucina
