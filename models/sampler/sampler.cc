#include "models/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

#include "kernels/softmax.h"

namespace fucina {
namespace {

// Rows are read once, in blocks this long (16 KiB of floats: with the exps' scratch, within L1).
constexpr int64_t kBlock = 4096;

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

// log(exp(a) + exp(b)), exact at the infinities.
double LogAddExp(double a, double b) {
  if (a < b) std::swap(a, b);
  if (std::isinf(a) || std::isinf(b)) return a;  // +inf wins; a -inf b adds nothing
  return a + std::log1p(std::exp(b - a));
}

// Offers v[0, m) (token ids from `first`) to a bounded heap of the `k` best, its front the
// worst kept. Tokens arrive in ascending id order, so one whose logit ties the front's is never
// better than it: only a logit above the front's gets in. FindAtLeast skips, in vectors, the
// long runs of a row below the front.
void OfferToHeap(std::vector<Candidate>& heap, size_t k, const float* v, int64_t m,
                 int64_t first) {
  int64_t i = 0;
  for (; i < m && heap.size() < k; ++i) {
    heap.push_back({static_cast<int32_t>(first + i), v[i]});
    std::push_heap(heap.begin(), heap.end(), Before);
  }
  if (heap.empty()) return;
  float floor = heap.front().logit;
  auto offer = [&](int64_t j) {
    if (v[j] > floor) {
      std::pop_heap(heap.begin(), heap.end(), Before);
      heap.back() = {static_cast<int32_t>(first + j), v[j]};
      std::push_heap(heap.begin(), heap.end(), Before);
      floor = heap.front().logit;
    }
  };
  while ((i += FindAtLeast(v + i, m - i, floor)) < m) offer(i++);
}

// The ids seen in the penalty window (inside [0, vocab)), ascending, with their counts; none
// when the penalties are off.
std::vector<std::pair<int32_t, float>> PenaltyCounts(std::span<const int32_t> history,
                                                     const SamplingParams& params, size_t vocab) {
  std::vector<std::pair<int32_t, float>> counts;
  if (params.penalty_last_n == 0 ||
      (params.repetition_penalty == 1.0f && params.frequency_penalty == 0.0f &&
       params.presence_penalty == 0.0f)) {
    return counts;
  }
  size_t window = history.size();
  if (params.penalty_last_n > 0) window = std::min(window, size_t(params.penalty_last_n));
  std::vector<int32_t> recent(history.end() - window, history.end());
  std::sort(recent.begin(), recent.end());
  for (size_t i = 0; i < recent.size();) {
    size_t j = i;
    while (j < recent.size() && recent[j] == recent[i]) ++j;
    const int32_t id = recent[i];
    if (id >= 0 && static_cast<size_t>(id) < vocab) {
      counts.emplace_back(id, static_cast<float>(j - i));
    }
    i = j;
  }
  return counts;
}

// llama.cpp's penalties of a token seen `count` times.
float Penalized(float logit, float count, const SamplingParams& params) {
  logit = logit <= 0.0f ? logit * params.repetition_penalty : logit / params.repetition_penalty;
  return logit - (count * params.frequency_penalty + params.presence_penalty);
}

}  // namespace

void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                    const SamplingParams& params) {
  for (const auto& [id, count] : PenaltyCounts(history, params, logits.size())) {
    logits[id] = Penalized(logits[id], count, params);
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
                     std::span<const uint32_t> allowed, bool raw_statistics) {
  candidates_.clear();
  raw_top_.clear();
  log_z_ = kNegInf;
  const int64_t n = static_cast<int64_t>(logits.size());
  if (n == 0) return;

  // The tokens whose logit a bias or the penalties change, ascending by id; a token's biases
  // keep their order and come before its penalties (the chain's order).
  adjustments_.clear();
  for (const LogitBias& b : params_.logit_bias) {
    if (b.id >= 0 && b.id < n) adjustments_.push_back({b.id, false, b.bias});
  }
  for (const auto& [id, count] : PenaltyCounts(history, params_, logits.size())) {
    adjustments_.push_back({id, true, count});
  }
  std::stable_sort(adjustments_.begin(), adjustments_.end(),
                   [](const Adjustment& a, const Adjustment& b) { return a.id < b.id; });

  const bool greedy = params_.temperature <= 0.0f;
  const bool top_k = !greedy && params_.top_k > 0 && params_.top_k < n;
  const size_t k_raw = std::min(size_t(std::max(params_.top_logprobs, 0)), logits.size());
  if (!greedy && !top_k) candidates_.resize(n);
  Candidate best{-1, kNegInf};
  block_.resize(std::min(n, kBlock));
  exp_scratch_.resize(block_.size());
  size_t next = 0;  // into adjustments_
  for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
    const int64_t m = std::min(kBlock, n - b0);
    const float* raw = logits.data() + b0;
    float* v = block_.data();
    if (raw_statistics) {
      log_z_ = LogAddExp(log_z_, LogSumExp(raw, m, exp_scratch_.data()));
    }
    for (int64_t i = 0; i < m; ++i) v[i] = std::isnan(raw[i]) ? kNegInf : raw[i];
    if (raw_statistics && k_raw > 0) OfferToHeap(raw_top_, k_raw, v, m, b0);
    if (!allowed.empty()) {
      for (int64_t i = 0; i < m; ++i) {
        const size_t id = static_cast<size_t>(b0 + i);
        const size_t w = id >> 5;
        if (w >= allowed.size() || ((allowed[w] >> (id & 31)) & 1u) == 0) v[i] = kNegInf;
      }
    }
    for (; next < adjustments_.size() && adjustments_[next].id < b0 + m; ++next) {
      const Adjustment& a = adjustments_[next];
      float& x = v[a.id - b0];
      x = a.penalty ? Penalized(x, a.value, params_) : x + a.value;
    }
    if (greedy) {
      const int64_t at = ArgMax(v, m);
      if (best.id < 0 || v[at] > best.logit) best = {static_cast<int32_t>(b0 + at), v[at]};
    } else if (top_k) {
      OfferToHeap(candidates_, size_t(params_.top_k), v, m, b0);
    } else {
      for (int64_t i = 0; i < m; ++i) candidates_[b0 + i] = {static_cast<int32_t>(b0 + i), v[i]};
    }
  }

  if (greedy) {
    candidates_.push_back(best);
    return;
  }
  if (top_k) {
    std::sort(candidates_.begin(), candidates_.end(), Before);  // ApplyTopK's result
    ApplyTopP(candidates_, params_.top_p);
  } else if (params_.top_k > 0) {
    ApplyTopK(candidates_, params_.top_k);  // k >= the vocabulary: sorts them all
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
  Filter(logits, history, allowed, /*raw_statistics=*/false);
  return candidates_;
}

SampleResult Sampler::Sample(std::span<const float> logits, std::span<const int32_t> history,
                             std::span<const uint32_t> allowed) {
  SampleResult result{-1, kNegInf, {}};
  if (logits.empty()) return result;
  Filter(logits, history, allowed, /*raw_statistics=*/true);

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

  // Raw distribution: log-softmax of the logits as given (NaN as -inf).
  const float chosen = logits[result.id];
  result.logprob = static_cast<float>(double(std::isnan(chosen) ? kNegInf : chosen) - log_z_);
  std::sort(raw_top_.begin(), raw_top_.end(), Before);
  result.top.reserve(raw_top_.size());
  for (const Candidate& c : raw_top_) {
    result.top.push_back({c.id, static_cast<float>(double(c.logit) - log_z_)});
  }
  return result;
}

}  // namespace fucina
