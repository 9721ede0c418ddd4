#include "models/train/scoring.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace fucina::train {

int64_t ScoringPassRows(const ModelConfig& c) {
  constexpr double kPassMacs = 8e9;
  double macs = 0;  // per row
  for (const LayerSpec& l : c.layers) {
    macs += static_cast<double>(c.hidden) * (2 * l.q_dim() + 2 * l.kv_dim() + 3 * l.ffn);
    if (l.moe) macs += 3.0 * c.hidden * c.expert_ffn * c.num_experts_used;
  }
  const double rows = macs > 0 ? kPassMacs / macs : 512;
  return std::clamp<int64_t>(static_cast<int64_t>(rows) / 16 * 16, 32, 512);
}
namespace {

// Rows of one head call: bounds the logits held at once to kHeadRows x vocab floats (39 MB for
// a 151k vocabulary).
constexpr int64_t kHeadRows = 64;

// log softmax(row)[id], in double.
double LogProb(const float* row, int64_t vocab, int32_t id) {
  double mx = row[0];
  for (int64_t v = 1; v < vocab; ++v) mx = std::max<double>(mx, row[v]);
  double z = 0;
  for (int64_t v = 0; v < vocab; ++v) z += std::exp(row[v] - mx);
  return row[id] - mx - std::log(z);
}

}  // namespace

absl::Status StageScorer::ResetStreams(std::span<const int64_t> capacities) {
  if (static_cast<int64_t>(capacities.size()) > kMaxScoringStreams) {
    return absl::InvalidArgumentError(absl::StrCat(capacities.size(), " streams exceed ",
                                                   kMaxScoringStreams));
  }
  int64_t total = 0;
  for (int64_t c : capacities) {
    if (c < 1 || c > kMaxStreamPositions) {
      return absl::InvalidArgumentError(absl::StrCat("a stream of ", c,
                                                     " positions is outside [1, ",
                                                     kMaxStreamPositions, "]"));
    }
    total += c;
  }
  if (total > kMaxScoringPositions) {
    return absl::InvalidArgumentError(
        absl::StrCat("streams of ", total, " positions exceed ", kMaxScoringPositions));
  }
  streams_.clear();  // the old caches go before the new ones are made
  for (int64_t c : capacities) {
    auto kv = model_.NewKvCache(c, GgmlType::kF32);
    if (!kv.ok()) {
      streams_.clear();
      return kv.status();
    }
    streams_.push_back(*std::move(kv));
  }
  return absl::OkStatus();
}

absl::Status StageScorer::Layers(std::span<const ScoringForward::Segment> segments,
                                 std::vector<float>& x) {
  const int64_t hidden = model_.config().hidden;
  if (segments.empty()) return absl::InvalidArgumentError("a pass needs a segment");
  std::vector<Model::Segment> kv_segments;
  std::vector<int32_t> tokens;
  int64_t rows = 0;
  for (const ScoringForward::Segment& s : segments) {
    if (s.stream < 0 || s.stream >= static_cast<int64_t>(streams_.size())) {
      return absl::InvalidArgumentError(absl::StrCat("stream ", s.stream, " is outside [0, ",
                                                     streams_.size(), ")"));
    }
    if (s.tokens.empty()) return absl::InvalidArgumentError("a segment has no tokens");
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (rows + n > kMaxPassRows) {
      return absl::InvalidArgumentError(absl::StrCat("a pass of more than ", kMaxPassRows,
                                                     " rows"));
    }
    kv_segments.push_back({streams_[s.stream].get(), rows, n, s.tokens});
    if (model_.has_embeddings()) tokens.insert(tokens.end(), s.tokens.begin(), s.tokens.end());
    rows += n;
  }
  if (model_.has_embeddings()) {
    x.resize(rows * hidden);
    if (absl::Status s = model_.Embed(tokens, x.data()); !s.ok()) return s;
  } else if (static_cast<int64_t>(x.size()) != rows * hidden) {
    return absl::InvalidArgumentError(absl::StrCat(x.size(), " activations for ", rows,
                                                   " rows of ", hidden));
  }
  return model_.ForwardLayers(x.data(), rows, kv_segments);
}

absl::StatusOr<std::vector<ScoringForward::Verdict>> StageScorer::Verdicts(
    const float* x, int64_t rows, std::span<const ScoringForward::Row> wanted) {
  if (!model_.has_head()) return absl::FailedPreconditionError("this stage has no head");
  const int64_t hidden = model_.config().hidden;
  const int64_t vocab = model_.config().vocab_size;
  for (const ScoringForward::Row& w : wanted) {
    if (w.row < 0 || w.row >= rows) {
      return absl::InvalidArgumentError(absl::StrCat("row ", w.row, " is outside the pass's ",
                                                     rows));
    }
    if (w.target < -1 || w.target >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("target ", w.target,
                                                     " is outside the vocabulary"));
    }
  }
  std::vector<ScoringForward::Verdict> out(wanted.size());
  for (size_t i0 = 0; i0 < wanted.size(); i0 += kHeadRows) {
    const int64_t n = std::min<int64_t>(kHeadRows, static_cast<int64_t>(wanted.size() - i0));
    h_.resize(n * hidden);
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(x + wanted[i0 + i].row * hidden, hidden, &h_[i * hidden]);
    }
    logits_.resize(n * vocab);
    if (absl::Status s = model_.Head(h_.data(), n, logits_.data()); !s.ok()) return s;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = &logits_[i * vocab];
      ScoringForward::Verdict& v = out[i0 + i];
      v.argmax = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      if (wanted[i0 + i].target >= 0) v.logprob = LogProb(row, vocab, wanted[i0 + i].target);
    }
  }
  return out;
}

int64_t LocalScoring::vocab_size() const {
  return stage_.config().vocab_size;
}

absl::StatusOr<std::vector<ScoringForward::Verdict>> LocalScoring::Pass(
    std::span<const Segment> segments, std::span<const Row> rows) {
  if (absl::Status s = stage_.Layers(segments, x_); !s.ok()) return s;
  const int64_t n = static_cast<int64_t>(x_.size()) / stage_.config().hidden;
  return stage_.Verdicts(x_.data(), n, rows);
}

}  // namespace fucina::train
