// Token sampler: picks the next token from a row of logits the way llama.cpp's default sampler
// chain does, restricted to the stages Fucina exposes:
//
//   logit_bias -> penalties -> top_k -> top_p -> min_p -> temperature -> dist
//
// (llama.cpp adds the logit-bias sampler first too; common/common.h's default order is then penalties, dry, top_n_sigma, top_k, typical_p,
// top_p, min_p, xtc, temperature; the stages not listed here are off by default there.) So
// top_p and min_p judge the untempered probabilities, and temperature only reshapes the
// survivors. temperature <= 0 is greedy: the argmax of the penalized logits, ties to the
// lowest id.
//
// Determinism: candidates are ordered by (logit descending, id ascending) everywhere, the draw
// is PositionDraw(seed, history.size()) (rng.h, fully specified: keyed by the position the
// token takes, so a token does not depend on how many samples came before it, which is what
// lets speculative decoding verify drafts with the draws plain decoding uses), and sums run in
// double in a fixed order, so a seed gives the same tokens on every machine for the same
// logits.
//
// Logprobs are reported under the model's raw distribution (log-softmax of the logits as given,
// before penalties, filters and temperature), as OpenAI's API reports them.
#ifndef FUCINA_MODELS_SAMPLER_SAMPLER_H_
#define FUCINA_MODELS_SAMPLER_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/sampler/rng.h"

namespace fucina {

// Added to a token's logit before anything else (OpenAI's logit_bias: -100 bans a token in
// practice, +100 all but forces it).
struct LogitBias {
  int32_t id;
  float bias;
};

// Defaults are llama.cpp's (common_params_sampling).
struct SamplingParams {
  float temperature = 0.8f;        // <= 0: greedy.
  int32_t top_k = 40;              // <= 0: off.
  float top_p = 0.95f;             // >= 1: off.
  float min_p = 0.05f;             // <= 0: off.
  float repetition_penalty = 1.0f; // 1: off. Divides positive logits, multiplies negative ones.
  float presence_penalty = 0.0f;   // Subtracted once from every token seen in the window.
  float frequency_penalty = 0.0f;  // Subtracted once per occurrence in the window.
  int32_t penalty_last_n = 64;     // Window: the last N history tokens; 0: off; -1: all.
  uint64_t seed = 0;
  int32_t top_logprobs = 0;        // Entries in SampleResult::top (clamped to the vocabulary).
  std::vector<LogitBias> logit_bias;  // Ids outside the vocabulary are ignored.
};

// The accepted ranges, shared by every front end (HTTP, gRPC, the CLI's flags) and the worker.
inline constexpr float kMaxTemperature = 100.0f;
inline constexpr float kMaxRepetitionPenalty = 100.0f;
inline constexpr float kMaxAbsPresenceFrequencyPenalty = 2.0f;  // OpenAI's [-2, 2]
inline constexpr float kMaxAbsLogitBias = 100.0f;               // OpenAI's [-100, 100]
inline constexpr size_t kMaxLogitBiasEntries = 4096;
inline constexpr int32_t kMaxTopLogprobs = 20;

// How ValidateSamplingParams names a field in its messages.
enum class SamplingFieldNames {
  kRequest,  // "field 'temperature' ..." (the HTTP and gRPC request fields)
  kFlags,    // "--temp ..." (the command-line defaults of run, serve and coordinator)
};

// OK when every field is in its range: temperature finite in [0, kMaxTemperature]; top_p in
// (0, 1]; min_p in [0, 1]; top_k >= -1 (<= 0: off); repetition_penalty in
// (0, kMaxRepetitionPenalty]; presence/frequency penalties in [-2, 2]; penalty_last_n >= -1;
// top_logprobs in [0, kMaxTopLogprobs]; at most kMaxLogitBiasEntries logit biases, each finite in
// [-100, 100] with an id in [0, vocab_size) (vocab_size <= 0: ids are not checked). Otherwise
// INVALID_ARGUMENT naming the field, the range and the value.
absl::Status ValidateSamplingParams(const SamplingParams& params, int32_t vocab_size,
                                    SamplingFieldNames names = SamplingFieldNames::kRequest);

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct SampleResult {
  int32_t id;
  // Of the chosen token under the raw distribution: log-softmax of the raw logits.
  float logprob;
  // The top_logprobs most likely tokens under the raw distribution, descending (ties: lower id
  // first).
  std::vector<TokenLogprob> top;
};

// A token still in the running, with its (penalized, possibly tempered) logit.
struct Candidate {
  int32_t id;
  float logit;
};

// The stages, exposed for tests and for callers composing their own chains. Each keeps
// `candidates` ordered by (logit descending, id ascending) on return.
//
// Adds each bias to its token's logit (ids outside [0, logits.size()) are ignored).
void ApplyLogitBias(std::span<float> logits, std::span<const LogitBias> biases);
// llama.cpp's penalties: for each token with count c > 0 in the last `penalty_last_n` entries
// of `history`: logit = logit <= 0 ? logit * repetition_penalty : logit / repetition_penalty;
// then logit -= c * frequency_penalty + presence_penalty. History ids outside [0, n) are
// ignored.
void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                    const SamplingParams& params);
// Keeps the k highest (k <= 0 or k >= size: keeps all, but still sorts).
void ApplyTopK(std::vector<Candidate>& candidates, int32_t k);
// Keeps the shortest prefix whose softmax probability mass reaches p (p >= 1: all).
void ApplyTopP(std::vector<Candidate>& candidates, float p);
// Keeps tokens whose probability is at least p times the most likely one's, i.e. logit >=
// max_logit + ln(p) (p <= 0: all).
void ApplyMinP(std::vector<Candidate>& candidates, float p);
// ApplyTopK(candidates, 0) then ApplyTopP(candidates, p), sorting only as many of the best
// candidates as the nucleus needs (the total mass is one pass over all of them): sorting a
// 150k vocabulary cost ~7-25 ms a row where a nucleus holds a few hundred.
void SortAndApplyTopP(std::vector<Candidate>& candidates, float p);

// Which tokens may come next, and the token that did (constrained decoding: a grammar,
// models/grammar). Masks are one bit per token: bit (i % 32) of word i / 32.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual absl::Status Mask(std::vector<uint32_t>* mask) = 0;
  virtual absl::Status Accept(int32_t token) = 0;
  // How many of `tokens` it accepts in order from here, without advancing (drafts).
  virtual absl::StatusOr<size_t> Validate(std::span<const int32_t> tokens) = 0;
  // Nothing more may follow: the reply ends after the last accepted token.
  virtual bool stopped() const = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params);

  // `logits`: one row over the vocabulary (NaN is treated as -inf; at least one entry must be
  // finite for the result to be meaningful). `history`: every token before the one sampled
  // (prompt + generated), for the penalties and the draw: the sampled token's position is
  // history.size(). `allowed` (empty: all): a TokenConstraint's mask; the others are -inf
  // before every stage, so the draw is among allowed tokens only (logprobs stay raw). An empty
  // row yields id -1.
  SampleResult Sample(std::span<const float> logits, std::span<const int32_t> history,
                      std::span<const uint32_t> allowed = {});

  // The candidates the final draw chooses from, with their tempered logits (temperature > 0),
  // or the single greedy choice; does not touch the RNG.
  std::vector<Candidate> Candidates(std::span<const float> logits,
                                    std::span<const int32_t> history,
                                    std::span<const uint32_t> allowed = {});

  // Samples from now on use `seed`.
  void Reset(uint64_t seed);

  const SamplingParams& params() const { return params_; }

 private:
  // A token's logit changed before the filters: by a logit bias (`value` the bias) or by the
  // penalties (`value` the count in the window).
  struct Adjustment {
    int32_t id;
    bool penalty;
    float value;
  };

  // Fills candidates_ (mask + bias + penalties + filters + temperature) from `logits` in one
  // pass over the row: block by block, each block copied into block_ (L1-sized), masked and
  // adjusted there (biases and penalties touch their tokens only), and folded into the
  // selection (the argmax, a top-k heap, or every token when no top-k cuts). With
  // `raw_statistics`, the same pass takes the raw distribution's log-normalizer (log_z_) and
  // its top_logprobs best (raw_top_, unsorted).
  void Filter(std::span<const float> logits, std::span<const int32_t> history,
              std::span<const uint32_t> allowed, bool raw_statistics);

  SamplingParams params_;
  // Scratch reused across calls so a sample over a 150k vocabulary does not allocate.
  std::vector<float> block_;
  std::vector<float> exp_scratch_;
  std::vector<Adjustment> adjustments_;
  std::vector<Candidate> candidates_;
  std::vector<Candidate> raw_top_;
  double log_z_ = 0.0;
};

}  // namespace fucina

#endif  // FUCINA_MODELS_SAMPLER_SAMPLER_H_
