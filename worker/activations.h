// Activations on the wire: [rows, hidden] in f32 (exact), f16 or bf16 (half the bytes).
#ifndef FUCINA_WORKER_ACTIVATIONS_H_
#define FUCINA_WORKER_ACTIVATIONS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "fucina/cluster/v1/worker.pb.h"
#include "worker/worker_client.h"

namespace fucina {

// Bytes of one row, or -1 for an unknown type.
int64_t ActivationRowBytes(wire::ActivationType type, int64_t hidden);

// Encodes x[rows, hidden] into `out` (type, rows, hidden, data).
void EncodeActivations(const float* x, int64_t rows, int64_t hidden,
                       wire::ActivationType type,
                       wire::Activations* out);

// Checks `in` holds [rows, hidden] of a known type (errors name what differs) and decodes it
// into x[rows, hidden].
absl::Status DecodeActivations(const wire::Activations& in, int64_t rows,
                               int64_t hidden, float* x);

// Parses "f32" | "f16" | "bf16" (the --activations flag).
absl::Status ParseActivationType(const std::string& name,
                                 wire::ActivationType* type);

}  // namespace fucina

#endif  // FUCINA_WORKER_ACTIVATIONS_H_
