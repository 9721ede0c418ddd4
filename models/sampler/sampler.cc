#include "models/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

#include "kernels/softmax.h"

namespace fucina {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The one candidate order used everywhere: logit descending, then id ascending. Total on
// non-NaN logits (NaN never reaches it: Sample maps NaN to -inf).
bool Before(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// The largest logit among `candidates`, in any order (-inf for none).
float MaxLogit(const std::vector<Candidate>& candidates) {
  float max = kNegInf;
  for (const Candidate& c : candidates) max = std::max(max, c.logit);
  return max;
}

// min-p's cut: p_i >= p * p_max  <=>  logit_i >= logit_max + ln(p).
float MinPThreshold(float max_logit, float p) { return max_logit + std::log(p); }

// exp(logit - max) of each candidate into `weights`; returns their sum. `candidates` sorted,
// so candidates[0] holds the max.
double SoftmaxWeights(const std::vector<Candidate>& candidates, std::vector<double>& weights) {
  weights.resize(candidates.size());
  const double max_logit = candidates[0].logit;
  double total = 0.0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    // A -inf max (every candidate masked) gives weight 1 to all rather than NaN.
    const double w = std::isinf(max_logit) ? 1.0 : std::exp(candidates[i].logit - max_logit);
    weights[i] = w;
    total += w;
  }
  return total;
}

}  // namespace

void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                    const SamplingParams& params) {
  if (params.penalty_last_n == 0 ||
      (params.repetition_penalty == 1.0f && params.frequency_penalty == 0.0f &&
       params.presence_penalty == 0.0f)) {
    return;
  }
  size_t window = history.size();
  if (params.penalty_last_n > 0) window = std::min(window, size_t(params.penalty_last_n));
  std::vector<int32_t> recent(history.end() - window, history.end());
  std::sort(recent.begin(), recent.end());
  const int64_t n = static_cast<int64_t>(logits.size());
  for (size_t i = 0; i < recent.size();) {
    size_t j = i;
    while (j < recent.size() && recent[j] == recent[i]) ++j;
    const int32_t id = recent[i];
    const float count = static_cast<float>(j - i);
    i = j;
    if (id < 0 || id >= n) continue;
    float& logit = logits[id];
    logit = logit <= 0.0f ? logit * params.repetition_penalty : logit / params.repetition_penalty;
    logit -= count * params.frequency_penalty + params.presence_penalty;
  }
}

void ApplyTopK(std::vector<Candidate>& candidates, int32_t k) {
  if (k <= 0 || size_t(k) >= candidates.size()) {
    std::sort(candidates.begin(), candidates.end(), Before);
    return;
  }
  // One pass with a bounded heap whose top is the worst kept candidate: for k << n nearly
  // every element is rejected by a single comparison (several times faster than nth_element
  // over a 150k vocabulary). Kept candidates are compacted into the front of the vector.
  auto heap_end = candidates.begin() + k;
  std::make_heap(candidates.begin(), heap_end, Before);
  for (auto it = heap_end; it != candidates.end(); ++it) {
    if (Before(*it, candidates.front())) {
      std::pop_heap(candidates.begin(), heap_end, Before);
      *(heap_end - 1) = *it;
      std::push_heap(candidates.begin(), heap_end, Before);
    }
  }
  candidates.resize(k);
  std::sort(candidates.begin(), candidates.end(), Before);
}

void ApplyTopP(std::vector<Candidate>& candidates, float p) {
  if (p >= 1.0f || candidates.empty()) return;
  std::vector<double> weights;
  const double total = SoftmaxWeights(candidates, weights);
  const double target = double(p) * total;
  double cum = 0.0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    cum += weights[i];
    if (cum >= target) {
      candidates.resize(i + 1);
      return;
    }
  }
}

void SortAndApplyTopP(std::vector<Candidate>& candidates, float p) {
  if (p < 1.0f && !candidates.empty()) {
    const float max = MaxLogit(candidates);
    if (!std::isinf(max)) {
      // The weights as SoftmaxWeights forms them; the total in index order rather than sorted
      // order (the same sum to rounding in the last bits).
      double total = 0.0;
      for (const Candidate& c : candidates) total += std::exp(c.logit - double(max));
      const double target = double(p) * total;
      // The m best, sorted, are the sorted order's first m: if the nucleus ends among them
      // the cut is ApplyTopP's. Else 8x more, up to sorting everything.
      std::vector<Candidate> top;
      for (size_t m = 256; m < candidates.size(); m *= 8) {
        top.assign(candidates.begin(), candidates.end());
        ApplyTopK(top, static_cast<int32_t>(m));
        double cum = 0.0;
        for (size_t i = 0; i < top.size(); ++i) {
          cum += std::exp(top[i].logit - double(max));
          if (cum >= target) {
            top.resize(i + 1);
            candidates.swap(top);
            return;
          }
        }
      }
    }
  }
  ApplyTopK(candidates, 0);
  ApplyTopP(candidates, p);
}

void ApplyMinP(std::vector<Candidate>& candidates, float p) {
  if (p <= 0.0f || candidates.empty()) return;
  const float threshold = MinPThreshold(candidates[0].logit, p);
  size_t keep = 1;  // The most likely token always passes.
  while (keep < candidates.size() && candidates[keep].logit >= threshold) ++keep;
  candidates.resize(keep);
}

Sampler::Sampler(SamplingParams params) : params_(params) {}

void Sampler::Reset(uint64_t seed) { params_.seed = seed; }

void Sampler::Filter(std::span<const float> logits, std::span<const int32_t> history,
                     std::span<const uint32_t> allowed) {
  work_.assign(logits.begin(), logits.end());
  for (float& x : work_) {
    if (std::isnan(x)) x = kNegInf;
  }
  if (!allowed.empty()) {
    for (size_t i = 0; i < work_.size(); ++i) {
      const size_t w = i >> 5;
      if (w >= allowed.size() || ((allowed[w] >> (i & 31)) & 1u) == 0) work_[i] = kNegInf;
    }
  }
  ApplyLogitBias(work_, params_.logit_bias);
  ApplyPenalties(work_, history, params_);
  candidates_.clear();
  if (work_.empty()) return;

  if (params_.temperature <= 0.0f) {
    int32_t best = 0;
    for (size_t i = 1; i < work_.size(); ++i) {
      if (work_[i] > work_[best]) best = static_cast<int32_t>(i);
    }
    candidates_.push_back({best, work_[best]});
    return;
  }

  candidates_.resize(work_.size());
  for (size_t i = 0; i < work_.size(); ++i) candidates_[i] = {static_cast<int32_t>(i), work_[i]};
  if (params_.top_k > 0) {
    ApplyTopK(candidates_, params_.top_k);
    ApplyTopP(candidates_, params_.top_p);
  } else {
    if (params_.top_p >= 1.0f && params_.min_p > 0.0f) {
      // Only min-p cuts: what it drops need not be sorted.
      const float threshold = MinPThreshold(MaxLogit(candidates_), params_.min_p);
      std::erase_if(candidates_, [&](const Candidate& c) { return c.logit < threshold; });
    }
    SortAndApplyTopP(candidates_, params_.top_p);
  }
  ApplyMinP(candidates_, params_.min_p);
  for (Candidate& c : candidates_) c.logit /= params_.temperature;
}

std::vector<Candidate> Sampler::Candidates(std::span<const float> logits,
                                           std::span<const int32_t> history,
                                           std::span<const uint32_t> allowed) {
  Filter(logits, history, allowed);
  return candidates_;
}

SampleResult Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history,
                             std::span<const uint32_t> allowed) {
  SampleResult result{-1, kNegInf, {}};
  if (logits.empty()) return result;
  Filter(logits, history, allowed);

  if (params_.temperature <= 0.0f) {
    result.id = candidates_[0].id;
  } else {
    // The position's own draw: the same whichever samples came before it.
    const double u = PositionDraw(params_.seed, static_cast<int64_t>(history.size()));
    std::vector<double> weights;
    const double total = SoftmaxWeights(candidates_, weights);
    const double target = u * total;
    // Last candidate as the fallback when rounding leaves target >= the final sum.
    result.id = candidates_.back().id;
    double cum = 0.0;
    for (size_t i = 0; i < candidates_.size(); ++i) {
      cum += weights[i];
      if (target < cum) {
        result.id = candidates_[i].id;
        break;
      }
    }
  }

  // Raw distribution: log-softmax of the logits as given (NaN as -inf). The normalizer is one
  // vectorized pass (it used to be most of a greedy row's cost: a scalar exp per entry);
  // work_, done with once Filter has chosen the candidates, holds the exps.
  auto raw = [&](size_t i) { return std::isnan(logits[i]) ? kNegInf : logits[i]; };
  const double log_z =
      LogSumExp(logits.data(), static_cast<int64_t>(logits.size()), work_.data());
  result.logprob = static_cast<float>(double(raw(result.id)) - log_z);

  const size_t k = std::min(size_t(std::max(params_.top_logprobs, 0)), logits.size());
  if (k > 0) {
    // Bounded heap of the k best raw candidates: the heap top is the worst kept one.
    std::vector<Candidate> heap;
    heap.reserve(k + 1);
    for (size_t i = 0; i < logits.size(); ++i) {
      const Candidate c{static_cast<int32_t>(i), raw(i)};
      if (heap.size() < k) {
        heap.push_back(c);
        std::push_heap(heap.begin(), heap.end(), Before);
      } else if (Before(c, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), Before);
        heap.back() = c;
        std::push_heap(heap.begin(), heap.end(), Before);
      }
    }
    std::sort(heap.begin(), heap.end(), Before);
    result.top.reserve(k);
    for (const Candidate& c : heap) {
      result.top.push_back({c.id, static_cast<float>(double(c.logit) - log_z)});
    }
  }
  return result;
}

}  // namespace fucina
