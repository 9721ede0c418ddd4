// absl::Status <-> grpc::Status, shared by every gRPC service and client here. The codes are
// the same numbers in both (both follow google.rpc.Code).
#ifndef FUCINA_WORKER_GRPC_UTIL_H_
#define FUCINA_WORKER_GRPC_UTIL_H_

#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"

namespace fucina {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Message size limit for every channel and server: a prefill chunk's all-position logits
// ([512, 152k] f32 = 311 MB) is the largest message; activations are [rows, hidden].
inline constexpr int kMaxMessageBytes = 512 << 20;

}  // namespace fucina

#endif  // FUCINA_WORKER_GRPC_UTIL_H_
