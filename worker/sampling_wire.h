// SamplingParams <-> the internal protocol's wire::Sampling: the coordinator sends a request's
// sampling to the last stage, which samples. One mapping for both directions, so a field added
// to one side cannot be forgotten on the other.
#ifndef FUCINA_WORKER_SAMPLING_WIRE_H_
#define FUCINA_WORKER_SAMPLING_WIRE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "models/sampler/sampler.h"
#include "worker/worker_client.h"

namespace fucina {

wire::Sampling SamplingToWire(const SamplingParams& params);

// Checks the received values with the same ValidateSamplingParams the front ends use (ids
// against `vocab_size`): INVALID_ARGUMENT naming the field when one is out of range.
absl::StatusOr<SamplingParams> SamplingFromWire(const wire::Sampling& sampling,
                                                int32_t vocab_size);

}  // namespace fucina

#endif  // FUCINA_WORKER_SAMPLING_WIRE_H_
