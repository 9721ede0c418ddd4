// The fields of a generation request as every front end receives them (HTTP's OpenAI and
// Anthropic dialects, gRPC's fucina.v1.GenerateRequest): each present or absent, in the widest
// type a client can send, before any narrowing. ResolveRequestFields is the one place that
// validates them and maps them onto a GenerateJob, so a value is accepted or refused the same
// way whichever front end it came through (the range checks themselves are the sampler's
// ValidateSamplingParams, which the CLI's flags and the worker use too). Errors are
// INVALID_ARGUMENT starting "field 'NAME'" with the name the client used.
#ifndef FUCINA_COORDINATOR_REQUEST_FIELDS_H_
#define FUCINA_COORDINATOR_REQUEST_FIELDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/scheduler.h"
#include "models/sampler/sampler.h"

namespace fucina {

// At most this many stop strings, each at most kMaxStopBytes long: every generated token is
// checked against all of them.
inline constexpr size_t kMaxStopStrings = 64;
inline constexpr size_t kMaxStopBytes = 1024;

struct RequestFields {
  std::optional<double> temperature, top_p, min_p;
  std::optional<double> repetition_penalty, presence_penalty, frequency_penalty;
  std::optional<int64_t> top_k, penalty_last_n, top_logprobs;
  std::optional<uint64_t> seed;  // a negative seed arrives as its two's complement
  std::vector<std::pair<int64_t, double>> logit_bias;  // (token id, bias), as sent

  std::optional<int64_t> max_tokens;
  std::string max_tokens_field = "max_tokens";  // max_completion_tokens, max_output_tokens
  bool max_tokens_required = false;             // Anthropic: the client must say

  std::vector<std::string> stop;
  std::string stop_field = "stop";  // stop_sequences
  std::vector<int64_t> stop_token_ids;
  std::optional<bool> ignore_eos;
  std::optional<bool> speculative;  // unset: the server's --spec
};

// Fills job->sampling, max_tokens, stop, stop_token_ids and ignore_eos from `fields` over the
// server's defaults (`sampling`, `max_tokens`: its flags). Leaves job->prompt alone.
absl::Status ResolveRequestFields(const RequestFields& fields, const SamplingParams& sampling,
                                  int64_t max_tokens, int32_t vocab_size, GenerateJob* job);

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_REQUEST_FIELDS_H_
