// The expert FFN of a stage whose MoE experts live partly on other workers (a worker actor's
// shard with expert peers): pairs (token, slot) are grouped by owner, each peer gets one
// ExpertForward per layer step with the rows it needs, and the weighted sum runs in slot order
// as the local path does. Runs on the owning actor's executor.
#ifndef FUCINA_WORKER_REMOTE_EXPERTS_H_
#define FUCINA_WORKER_REMOTE_EXPERTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "models/engine/blocks.h"
#include "models/engine/model.h"
#include "worker/worker_client.h"

namespace fucina {

class RemoteExperts : public ExpertFfn {
 public:
  RemoteExperts(Model& model, std::vector<std::shared_ptr<WorkerClient>> peers,
                std::vector<std::string> names, std::vector<int> owner,
                std::vector<int64_t>* counts)
      : model_(model),
        peers_(std::move(peers)),
        names_(std::move(names)),
        owner_(std::move(owner)),
        counts_(counts) {}

  // Pairs owned by a peer that fails end the call with ABORTED naming the peer (its own
  // heartbeats tell the coordinator about it, not this stage's error).
  absl::Status Forward(int64_t layer, const float* x, int64_t n, const int32_t* experts,
                       const float* weights, int k, float* out) override;

 private:
  Model& model_;
  std::vector<std::shared_ptr<WorkerClient>> peers_;
  std::vector<std::string> names_;  // per peer, for errors
  std::vector<int> owner_;  // [num_experts]: index into peers_, -1 local
  std::vector<int64_t>* counts_;  // the actor's per-expert counts
  std::vector<float> slots_, out_;
  std::vector<int32_t> rows_, ids_, remap_;
  std::vector<int64_t> where_;
};

}  // namespace fucina

#endif  // FUCINA_WORKER_REMOTE_EXPERTS_H_
