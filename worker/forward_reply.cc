#include "worker/forward_reply.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace fucina {

uint64_t SessionOpTarget(const wire::SessionOp& op) {
  switch (op.kind_case()) {
    case wire::SessionOp::kTruncate: return op.truncate().session_id();
    case wire::SessionOp::kCopyPrefix: return op.copy_prefix().to_session();
    case wire::SessionOp::kRelease: return op.release().session_id();
    case wire::SessionOp::KIND_NOT_SET: break;
  }
  return 0;
}

void AddSegmentError(int index, const absl::Status& status, wire::ForwardResponse* response) {
  wire::SegmentError* e = response->add_errors();
  e->set_index(index);
  e->set_code(static_cast<int>(status.code()));
  e->set_message(std::string(status.message()));
}

absl::StatusOr<wire::ForwardResponse> MergeChainReply(
    wire::ForwardResponse own, const std::vector<int>& index, const std::string& next_worker,
    absl::StatusOr<wire::ForwardResponse> later) {
  if (!later.ok()) {
    if (!IsWorkerFailure(later.status())) return later.status();  // about the request
    wire::ForwardResponse failure;
    wire::ChainFailure* f = failure.mutable_chain_failure();
    f->set_worker_id(next_worker);
    f->set_code(static_cast<int>(later.status().code()));
    f->set_message(std::string(later.status().message()));
    return failure;
  }
  if (later->has_chain_failure()) return later;  // names a stage further on
  wire::ForwardResponse merged;
  *merged.mutable_errors() = std::move(*own.mutable_errors());
  for (wire::SegmentError& e : *later->mutable_errors()) {
    if (e.index() < 0 || e.index() >= static_cast<int>(index.size())) {
      return absl::InternalError(absl::StrCat("stage ", next_worker, " reported segment ",
                                              e.index(), " of ", index.size()));
    }
    e.set_index(index[e.index()]);
    *merged.add_errors() = std::move(e);
  }
  *merged.mutable_results() = std::move(*later->mutable_results());
  // Every stage got every operation: the indexes need no mapping, only the stage's name.
  *merged.mutable_op_errors() = std::move(*own.mutable_op_errors());
  for (wire::SessionOpError& e : *later->mutable_op_errors()) {
    if (e.worker_id().empty()) e.set_worker_id(next_worker);
    *merged.add_op_errors() = std::move(e);
  }
  return merged;
}

}  // namespace fucina
