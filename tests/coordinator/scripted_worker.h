// A fake last stage for coordinator tests: "generates" a given token script, so front-end
// behaviour that needs particular model output (tool calls, think blocks, SPM pieces) is tested
// without a model that would produce it.
#ifndef FUCINA_TESTS_COORDINATOR_SCRIPTED_WORKER_H_
#define FUCINA_TESTS_COORDINATOR_SCRIPTED_WORKER_H_

#include <map>
#include <mutex>
#include <vector>

#include "tests/worker/fake_worker_client.h"

namespace fucina {

// A last stage that answers every step with the next token of its script (then end-of-turn) and
// remembers the prompt it was given.
class ScriptedWorker : public FakeWorkerClient {
 public:
  ScriptedWorker(std::vector<int32_t> script, int32_t eos) : script_(std::move(script)), eos_(eos) {}

  void LoadShardAsync(wire::LoadShardRequest, LoadShardCallback done) override {
    done(wire::LoadShardResponse());
  }
  void ForwardAsync(wire::ForwardRequest request, ForwardCallback done) override {
    done(Step(request));
  }
  wire::ForwardResponse Step(const wire::ForwardRequest& request) {
    std::lock_guard<std::mutex> lock(mu_);
    wire::ForwardResponse response;
    for (const wire::Segment& seg : request.segments()) {
      // Prompt chunks are the prefill-only ones and the last, which brings the sampling; a
      // chunk after a reused prefix (pos0 > 0) extends what the last prompt shared with it.
      const bool prompt_chunk = seg.prefill_only() || seg.has_sampling();
      if (prompt_chunk && static_cast<size_t>(seg.pos0()) <= prompt_.size()) {
        prompt_.resize(seg.pos0());
        prompt_.insert(prompt_.end(), seg.token_ids().begin(), seg.token_ids().end());
      }
      // Sampling parameters come with a request's last prompt chunk: its reply starts over.
      if (seg.has_sampling()) {
        next_[seg.session_id()] = 0;
        sampling_ = seg.sampling();
      }
      if (seg.prefill_only()) continue;
      size_t& i = next_[seg.session_id()];
      wire::SegmentResult* r = response.add_results();
      r->set_session_id(seg.session_id());
      r->set_token(i < script_.size() ? script_[i] : eos_);
      r->set_logprob(-0.5f);
      ++i;
    }
    return response;
  }
  void GetStatsAsync(Callback<wire::WorkerStats> done) override { done(wire::WorkerStats()); }

  std::vector<int32_t> prompt() {
    std::lock_guard<std::mutex> lock(mu_);
    return prompt_;
  }
  // The sampling parameters of the last request that started.
  wire::Sampling sampling() {
    std::lock_guard<std::mutex> lock(mu_);
    return sampling_;
  }

 private:
  std::mutex mu_;
  std::vector<int32_t> script_;
  int32_t eos_;
  std::map<uint64_t, size_t> next_;
  std::vector<int32_t> prompt_;
  wire::Sampling sampling_;
};

}  // namespace fucina

#endif  // FUCINA_TESTS_COORDINATOR_SCRIPTED_WORKER_H_
