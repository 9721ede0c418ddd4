#include "coordinator/request_fields.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Counts past what any vocabulary or history holds mean "all": clamped, never wrapped.
int32_t ClampCount(int64_t v) { return static_cast<int32_t>(std::min(v, kInt32Max)); }

absl::Status FieldError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("field '", field, "' ", what));
}

}  // namespace

absl::Status ResolveRequestFields(const RequestFields& f, const SamplingParams& sampling,
                                  int64_t max_tokens, int32_t vocab_size, GenerateJob* job) {
  SamplingParams p = sampling;
  // Negative counts are left for the range check to name; only large ones are clamped.
  auto count = [](int64_t v) { return v < 0 ? static_cast<int32_t>(std::max<int64_t>(v, -2))
                                            : ClampCount(v); };
  if (f.temperature) p.temperature = static_cast<float>(*f.temperature);
  if (f.top_p) p.top_p = static_cast<float>(*f.top_p);
  if (f.min_p) p.min_p = static_cast<float>(*f.min_p);
  if (f.repetition_penalty) p.repetition_penalty = static_cast<float>(*f.repetition_penalty);
  if (f.presence_penalty) p.presence_penalty = static_cast<float>(*f.presence_penalty);
  if (f.frequency_penalty) p.frequency_penalty = static_cast<float>(*f.frequency_penalty);
  if (f.top_k) p.top_k = count(*f.top_k);
  if (f.penalty_last_n) p.penalty_last_n = count(*f.penalty_last_n);
  if (f.seed) p.seed = *f.seed;
  if (f.top_logprobs) {
    if (*f.top_logprobs < 0 || *f.top_logprobs > kMaxTopLogprobs) {
      return FieldError("top_logprobs",
                        absl::StrCat("must be in [0, ", kMaxTopLogprobs, "], got ", *f.top_logprobs));
    }
    p.top_logprobs = static_cast<int32_t>(*f.top_logprobs);
  }
  p.logit_bias.clear();  // the count is the validator's; ids are checked before narrowing
  for (const auto& [id, bias] : f.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return FieldError("logit_bias", absl::StrCat("names token id ", id,
                                                   ", outside the vocabulary [0, ", vocab_size,
                                                   ")"));
    }
    p.logit_bias.push_back({static_cast<int32_t>(id), static_cast<float>(bias)});
  }
  if (absl::Status s = ValidateSamplingParams(p, vocab_size); !s.ok()) return s;
  job->sampling = std::move(p);

  if (f.max_tokens) {
    if (*f.max_tokens < 1) {
      return FieldError(f.max_tokens_field,
                        absl::StrCat("must be at least 1, got ", *f.max_tokens));
    }
    // Larger than the context is fine: a reply ends when the context is full.
    job->max_tokens = *f.max_tokens;
  } else if (f.max_tokens_required) {
    return FieldError(f.max_tokens_field, "is required (at least 1)");
  } else {
    job->max_tokens = max_tokens;
  }

  if (f.stop.size() > kMaxStopStrings) {
    return FieldError(f.stop_field, absl::StrCat("has ", f.stop.size(), " strings, at most ",
                                                 kMaxStopStrings, " are allowed"));
  }
  for (const std::string& s : f.stop) {
    if (s.size() > kMaxStopBytes) {
      return FieldError(f.stop_field, absl::StrCat("holds a string of ", s.size(),
                                                   " bytes, at most ", kMaxStopBytes,
                                                   " are allowed"));
    }
  }
  job->stop = f.stop;
  job->stop_token_ids.clear();
  for (int64_t id : f.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return FieldError("stop_token_ids", absl::StrCat("holds token id ", id,
                                                       ", outside the vocabulary [0, ",
                                                       vocab_size, ")"));
    }
    job->stop_token_ids.push_back(static_cast<int32_t>(id));
  }
  job->ignore_eos = f.ignore_eos.value_or(false);
  job->speculative = f.speculative;
  return absl::OkStatus();
}

}  // namespace fucina
