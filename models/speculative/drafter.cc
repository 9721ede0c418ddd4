#include "models/speculative/drafter.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace fucina {
namespace {

// Weight of the newest verify pass in the acceptance average.
constexpr double kRateWeight = 0.25;

}  // namespace

Drafter::Drafter(DrafterOptions options) : options_(options) {}

void Drafter::SetReference(std::span<const int32_t> tokens) {
  reference_ = SuffixAutomaton();
  for (int32_t t : tokens) reference_.Append(t);
  // Re-match the stream's recent tokens against the new reference.
  reference_match_ = {};
  const std::span<const int32_t> text = stream_.text();
  for (int32_t t : text) reference_match_ = reference_.Step(reference_match_, t);
}

void Drafter::Accept(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    // Matched against the text before t, so a match's occurrence ends before the stream's
    // end and has a continuation.
    stream_match_ = stream_.Step(stream_match_, t);
    stream_.Append(t);
    stream_match_ = stream_.Normalize(stream_match_);
    reference_match_ = reference_.Step(reference_match_, t);
    last_ = t;
  }
}

void Drafter::Continue(const SuffixAutomaton& sam, const SuffixAutomaton::Match& match,
                       int limit, std::vector<int32_t>* out) {
  const std::span<const int32_t> text = sam.text();
  const int64_t from = sam.FirstEnd(match) + 1;
  const int64_t to = std::min<int64_t>(static_cast<int64_t>(text.size()), from + limit);
  for (int64_t i = from; i < to; ++i) out->push_back(text[i]);
}

std::vector<int32_t> Drafter::Draft(int limit) {
  std::vector<int32_t> draft;
  limit = std::min(limit, options_.max_draft);
  if (limit <= 0 || last_ < 0) return draft;
  if (rate_ < kCollapsed) {
    if (++idle_ < kProbeEvery) return draft;
    idle_ = 0;
    limit = 1;
  } else {
    // 1 token at acceptance 0.1, the maximum from about 0.8.
    limit = std::min(limit, std::max(1, static_cast<int>(std::lround(rate_ * 1.25 *
                                                                     options_.max_draft))));
  }
  const bool stream_ok = stream_match_.length >= options_.min_match;
  const bool reference_ok = reference_match_.length >= options_.min_match;
  if (stream_ok && (!reference_ok || stream_match_.length >= reference_match_.length)) {
    Continue(stream_, stream_match_, limit, &draft);
  } else if (reference_ok) {
    Continue(reference_, reference_match_, limit, &draft);
  }
  if (!draft.empty()) return draft;
  // Token Recycling: the chain of most likely successors.
  int32_t t = last_;
  while (static_cast<int>(draft.size()) < limit) {
    auto it = successors_.find(t);
    if (it == successors_.end() || it->second.empty()) break;
    t = it->second.front();
    draft.push_back(t);
  }
  return draft;
}

void Drafter::Observe(int32_t token, int32_t next) {
  if (options_.successors <= 0) return;
  auto it = successors_.find(token);
  if (it == successors_.end()) {
    if (static_cast<int64_t>(successors_.size()) >= options_.max_recycled_tokens) return;
    it = successors_.emplace(token, std::vector<int32_t>()).first;
  }
  // Latest first, each once.
  std::vector<int32_t>& list = it->second;
  std::erase(list, next);
  list.insert(list.begin(), next);
  if (static_cast<int>(list.size()) > options_.successors) list.pop_back();
}

void Drafter::Emitted(int32_t last, std::span<const int32_t> tokens) {
  for (size_t i = 0; i < tokens.size(); ++i) Observe(i == 0 ? last : tokens[i - 1], tokens[i]);
  Accept(tokens);
}

void Drafter::Record(int drafted, int accepted) {
  if (drafted <= 0) return;
  rate_ = (1 - kRateWeight) * rate_ +
          kRateWeight * static_cast<double>(accepted) / static_cast<double>(drafted);
}

}  // namespace fucina
