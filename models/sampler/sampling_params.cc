// Range checks of SamplingParams: the one place that decides which sampling values are
// accepted, for every front end and the worker (see sampler.h).
#include <cmath>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "models/sampler/sampler.h"

namespace fucina {
namespace {

// A field's name in messages: the request field, or the flag that sets its default.
std::string Name(std::string_view field, SamplingFieldNames names) {
  if (names == SamplingFieldNames::kRequest) return absl::StrCat("field '", std::string(field), "'");
  static constexpr std::pair<std::string_view, std::string_view> kFlags[] = {
      {"temperature", "--temp"},
      {"top_p", "--top-p"},
      {"top_k", "--top-k"},
      {"min_p", "--min-p"},
      {"repetition_penalty", "--repeat-penalty"},
      {"presence_penalty", "--presence-penalty"},
      {"frequency_penalty", "--frequency-penalty"},
  };
  for (const auto& [request, flag] : kFlags) {
    if (request == field) return std::string(flag);
  }
  return std::string(field);
}

absl::Status OutOfRange(std::string_view field, SamplingFieldNames names, std::string_view range,
                        double value) {
  return absl::InvalidArgumentError(
      absl::StrCat(Name(field, names), " must be ", std::string(range), ", got ", value));
}

// NaN fails every comparison, so each check is written as "inside", negated.
absl::Status CheckFloat(std::string_view field, double value, double lo, bool lo_open, double hi,
                        std::string_view range, SamplingFieldNames names) {
  const bool inside =
      std::isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi;
  return inside ? absl::OkStatus() : OutOfRange(field, names, range, value);
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p, int32_t vocab_size,
                                    SamplingFieldNames names) {
  const double kPenalty = kMaxAbsPresenceFrequencyPenalty;
  const struct {
    std::string_view field;
    double value, lo;
    bool lo_open;
    double hi;
    std::string range;
  } floats[] = {
      {"temperature", p.temperature, 0, false, kMaxTemperature,
       absl::StrCat("in [0, ", kMaxTemperature, "] (0: greedy)")},
      {"top_p", p.top_p, 0, true, 1, "in (0, 1] (1: off)"},
      {"min_p", p.min_p, 0, false, 1, "in [0, 1] (0: off)"},
      {"repetition_penalty", p.repetition_penalty, 0, true, kMaxRepetitionPenalty,
       absl::StrCat("in (0, ", kMaxRepetitionPenalty, "] (1: off)")},
      {"presence_penalty", p.presence_penalty, -kPenalty, false, kPenalty, "in [-2, 2]"},
      {"frequency_penalty", p.frequency_penalty, -kPenalty, false, kPenalty, "in [-2, 2]"},
  };
  for (const auto& f : floats) {
    if (absl::Status s = CheckFloat(f.field, f.value, f.lo, f.lo_open, f.hi, f.range, names);
        !s.ok()) {
      return s;
    }
  }
  if (p.top_k < -1) return OutOfRange("top_k", names, "at least -1 (<= 0: off)", p.top_k);
  if (p.penalty_last_n < -1) {
    return OutOfRange("penalty_last_n", names, "at least -1 (-1: the whole history)",
                      p.penalty_last_n);
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return OutOfRange("top_logprobs", names, absl::StrCat("in [0, ", kMaxTopLogprobs, "]"),
                      p.top_logprobs);
  }
  if (p.logit_bias.size() > kMaxLogitBiasEntries) {
    return absl::InvalidArgumentError(absl::StrCat(Name("logit_bias", names), " has ",
                                                   p.logit_bias.size(), " entries, at most ",
                                                   kMaxLogitBiasEntries, " are allowed"));
  }
  for (const LogitBias& b : p.logit_bias) {
    if (vocab_size > 0 && (b.id < 0 || b.id >= vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(Name("logit_bias", names), ": token id ",
                                                     b.id, " outside the vocabulary [0, ",
                                                     vocab_size, ")"));
    }
    if (!(std::isfinite(b.bias) && std::fabs(b.bias) <= kMaxAbsLogitBias)) {
      return absl::InvalidArgumentError(absl::StrCat(Name("logit_bias", names),
                                                     ": the bias of token ", b.id,
                                                     " must be in [-100, 100], got ", b.bias));
    }
  }
  return absl::OkStatus();
}

void ApplyLogitBias(std::span<float> logits, std::span<const LogitBias> biases) {
  for (const LogitBias& b : biases) {
    if (b.id >= 0 && static_cast<size_t>(b.id) < logits.size()) logits[b.id] += b.bias;
  }
}

}  // namespace fucina
