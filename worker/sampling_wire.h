// SamplingParams and a request's grammar <-> the internal protocol's wire::Sampling: the
// coordinator sends them to the last stage, which samples; and the last stage's verdict
// (Verified) -> wire::SegmentResult. One mapping for both directions, so a field added to one
// side cannot be forgotten on the other.
#ifndef FUCINA_WORKER_SAMPLING_WIRE_H_
#define FUCINA_WORKER_SAMPLING_WIRE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "models/grammar/grammar.h"
#include "models/sampler/sampler.h"
#include "models/speculative/verify.h"
#include "worker/worker_client.h"

namespace fucina {

wire::Sampling SamplingToWire(const SamplingParams& params);

// Checks the received values with the same ValidateSamplingParams the front ends use (ids
// against `vocab_size`): INVALID_ARGUMENT naming the field when one is out of range.
absl::StatusOr<SamplingParams> SamplingFromWire(const wire::Sampling& sampling,
                                                int32_t vocab_size);

// The grammar travels once, with the sampling (none: kind "").
inline constexpr size_t kMaxWireGrammarBytes = 4 << 20;
void GrammarToWire(const GrammarSpec& grammar, wire::Sampling* sampling);
// INVALID_ARGUMENT for an unknown kind, or a grammar over kMaxWireGrammarBytes.
absl::StatusOr<GrammarSpec> GrammarFromWire(const wire::Sampling& sampling);

// The accepted drafts (in `accepted`), then the sample that ended the check (`token`), each
// with its logprobs, and whether the grammar is complete.
void VerifiedToWire(const Verified& verified, wire::SegmentResult* result);

}  // namespace fucina

#endif  // FUCINA_WORKER_SAMPLING_WIRE_H_
