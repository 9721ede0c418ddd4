// A stage's ForwardResponse as it is assembled: segment errors (a failed segment leaves the
// others running) and, on a stage that chains, the next stage's reply merged into its own.
#ifndef FUCINA_WORKER_FORWARD_REPLY_H_
#define FUCINA_WORKER_FORWARD_REPLY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/worker_client.h"

namespace fucina {

// The session a session operation changes (0 for a kind without one).
uint64_t SessionOpTarget(const wire::SessionOp& op);

// Segment `index` of the request failed with `status`; the other segments run on.
void AddSegmentError(int index, const absl::Status& status, wire::ForwardResponse* response);

// A chained Forward's reply: what this stage found (`own`: its segment and session-operation
// errors) merged with the next stage's reply to the segments it was given (next's segment j is
// this call's index[j]) and to the same session operations.
// A worker failure of the next stage (or one it reports further on) becomes a chain_failure
// naming that stage, so the caller does not blame this one; other errors pass through.
absl::StatusOr<wire::ForwardResponse> MergeChainReply(
    wire::ForwardResponse own, const std::vector<int>& index, const std::string& next_worker,
    absl::StatusOr<wire::ForwardResponse> later);

}  // namespace fucina

#endif  // FUCINA_WORKER_FORWARD_REPLY_H_
