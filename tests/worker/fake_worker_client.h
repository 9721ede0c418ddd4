// Test doubles of WorkerClient.
//
// FakeWorkerClient answers UNIMPLEMENTED (naming the call) to everything, so a fake scripts only
// the calls its test needs. ForwardingWorkerClient passes everything to a real actor, so a fake
// intercepts only the calls its test needs. HoldingWorkerClient holds every ForwardAsync until the test releases
// it: the test decides when and in which order replies arrive, so overlap and failure orderings
// are tested deterministically rather than with sleeps.
#ifndef FUCINA_TESTS_WORKER_FAKE_WORKER_CLIENT_H_
#define FUCINA_TESTS_WORKER_FAKE_WORKER_CLIENT_H_

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "worker/worker_client.h"

namespace fucina {

class FakeWorkerClient : public WorkerClient {
 public:
  void LoadShardAsync(wire::LoadShardRequest, LoadShardCallback done) override {
    done(Unscripted("LoadShard"));
  }
  void ForwardAsync(wire::ForwardRequest, ForwardCallback done) override {
    done(Unscripted("Forward"));
  }
  void ExpertForwardAsync(wire::ExpertForwardRequest,
                          Callback<wire::ExpertForwardResponse> done) override {
    done(Unscripted("ExpertForward"));
  }
  void GetStatsAsync(Callback<wire::WorkerStats> done) override { done(Unscripted("GetStats")); }

 protected:
  static absl::Status Unscripted(const std::string& call) {
    return absl::UnimplementedError("the fake worker does not script " + call);
  }
};

// Passes every call to `target` (a real actor, usually): a fake overrides the calls it
// intercepts and calls these for the rest.
class ForwardingWorkerClient : public WorkerClient {
 public:
  explicit ForwardingWorkerClient(std::shared_ptr<WorkerClient> target)
      : target_(std::move(target)) {}
  void LoadShardAsync(wire::LoadShardRequest r, LoadShardCallback done) override {
    target_->LoadShardAsync(std::move(r), std::move(done));
  }
  void ForwardAsync(wire::ForwardRequest r, ForwardCallback done) override {
    target_->ForwardAsync(std::move(r), std::move(done));
  }
  void ExpertForwardAsync(wire::ExpertForwardRequest r,
                          Callback<wire::ExpertForwardResponse> done) override {
    target_->ExpertForwardAsync(std::move(r), std::move(done));
  }
  void GetStatsAsync(Callback<wire::WorkerStats> done) override {
    target_->GetStatsAsync(std::move(done));
  }
  void EsLoadAsync(wire::EsJob job, Callback<wire::EsState> done) override {
    target_->EsLoadAsync(std::move(job), std::move(done));
  }
  void EsEvaluateAsync(wire::EsEvaluateRequest r,
                       Callback<wire::EsEvaluateResponse> done) override {
    target_->EsEvaluateAsync(std::move(r), std::move(done));
  }
  void EsUpdateAsync(wire::EsUpdateRequest r, Callback<wire::EsState> done) override {
    target_->EsUpdateAsync(std::move(r), std::move(done));
  }
  void EsSnapshotAsync(wire::EsSnapshotRequest r,
                       Callback<wire::EsSnapshotChunk> done) override {
    target_->EsSnapshotAsync(std::move(r), std::move(done));
  }
  void EsReleaseAsync(wire::EsReleaseRequest r, Callback<wire::EsState> done) override {
    target_->EsReleaseAsync(std::move(r), std::move(done));
  }
  void EsForwardAsync(wire::EsForwardRequest r, Callback<wire::EsForwardResponse> done) override {
    target_->EsForwardAsync(std::move(r), std::move(done));
  }
  void CancelInFlight() override { target_->CancelInFlight(); }

 protected:
  const std::shared_ptr<WorkerClient>& target() const { return target_; }

 private:
  std::shared_ptr<WorkerClient> target_;
};

class HoldingWorkerClient : public FakeWorkerClient {
 public:
  void ForwardAsync(wire::ForwardRequest request, ForwardCallback done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back({std::move(request), std::move(done)});
    }
    cv_.notify_all();
  }
  // Held calls fail with CANCELLED, as a real client's do.
  void CancelInFlight() override {
    std::vector<Held> cut;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Held& h : held_) {
        if (h.done) cut.push_back(std::move(h));
        h.done = nullptr;
      }
    }
    for (Held& h : cut) h.done(absl::CancelledError("cancelled"));
  }

  // Waits up to `timeout` until `n` calls have arrived in all; false if they did not.
  bool WaitForCalls(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return held_.size() >= n; });
  }
  // The request of the i-th call to arrive (0-based).
  wire::ForwardRequest request(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.at(i).request;
  }
  size_t calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }
  // Answers the i-th call (each at most once; false if it was answered or cancelled already).
  // `done` runs on this thread.
  bool Release(size_t i, absl::StatusOr<wire::ForwardResponse> reply) {
    ForwardCallback done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = std::move(held_.at(i).done);
      held_.at(i).done = nullptr;
    }
    if (!done) return false;
    done(std::move(reply));
    return true;
  }

 private:
  struct Held {
    wire::ForwardRequest request;
    ForwardCallback done;  // null once answered
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Held> held_;
};

}  // namespace fucina

#endif  // FUCINA_TESTS_WORKER_FAKE_WORKER_CLIENT_H_
