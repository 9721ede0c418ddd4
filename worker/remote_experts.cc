#include "worker/remote_experts.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace fucina {

absl::Status RemoteExperts::Forward(int64_t layer, const float* x, int64_t n,
                                    const int32_t* experts, const float* weights, int k,
                                    float* out) {
  const int64_t hidden = model_.config().hidden;
  slots_.resize(n * k * hidden);
  // Local pairs (owner -1) first. The buffers are members: this runs for every MoE layer of
  // every step.
  std::vector<int32_t>& rows = rows_;
  std::vector<int32_t>& ids = ids_;
  std::vector<int64_t>& where = where_;
  for (int p = -1; p < static_cast<int>(peers_.size()); ++p) {
    rows.clear();
    ids.clear();
    where.clear();
    for (int64_t i = 0; i < n * k; ++i) {
      const int32_t e = experts[i];
      const int o = e >= 0 && e < static_cast<int32_t>(owner_.size()) ? owner_[e] : -1;
      if (o != p) continue;
      rows.push_back(static_cast<int32_t>(i / k));
      ids.push_back(e);
      where.push_back(i);
    }
    if (rows.empty()) continue;
    if (p < 0) {
      for (int32_t e : ids) ++(*counts_)[e];
      out_.resize(rows.size() * hidden);
      absl::Status s = model_.ExpertOutputs(layer, x, rows, ids, out_.data());
      if (!s.ok()) return s;
    } else {
      // Send only the rows this peer needs, renumbered.
      wire::ExpertForwardRequest request;
      request.set_layer(layer);
      request.set_hidden(hidden);
      std::vector<int32_t>& remap = remap_;
      remap.assign(n, -1);
      std::string* xs = request.mutable_x();
      for (size_t q = 0; q < rows.size(); ++q) {
        int32_t& r = remap[rows[q]];
        if (r < 0) {
          r = static_cast<int32_t>(xs->size() / (hidden * sizeof(float)));
          xs->append(reinterpret_cast<const char*>(x + rows[q] * hidden),
                     hidden * sizeof(float));
        }
        request.add_pair_rows(r);
        request.add_pair_experts(ids[q]);
      }
      auto reply = peers_[p]->ExpertForward(request);
      if (!reply.ok()) {
        // ABORTED, not the peer's own code: a transport failure of the peer must not read as
        // this stage's (the coordinator would declare the wrong worker dead). The peer's
        // heartbeats tell the coordinator about the peer.
        return absl::AbortedError(absl::StrCat("expert worker ", names_[p], " failed: ",
                                               reply.status().ToString()));
      }
      if (reply->y().size() != rows.size() * hidden * sizeof(float)) {
        return absl::InternalError(absl::StrCat("expert peer returned ", reply->y().size(),
                                                " bytes for ", rows.size(), " pairs"));
      }
      out_.resize(rows.size() * hidden);
      std::memcpy(out_.data(), reply->y().data(), reply->y().size());
    }
    for (size_t q = 0; q < where.size(); ++q) {
      std::memcpy(&slots_[where[q] * hidden], &out_[q * hidden], hidden * sizeof(float));
    }
  }
  WeightedExpertSum(slots_.data(), weights, n, k, hidden, out);
  return absl::OkStatus();
}

}  // namespace fucina
