// How a coordinator (or a stage computing MoE layers) reaches a worker: one interface with an
// in-process implementation (embedded mode, unit tests) and a gRPC one (separate processes).
//
// Calls are thread-safe; the messages are the internal protocol's
// (proto/fucina/cluster/v1/worker.proto), so both implementations carry exactly the same data.
// Errors are the worker's status, or UNAVAILABLE / DEADLINE_EXCEEDED when the peer is gone;
// FailureOriginOf tells which (the worker, the transport, or the request).
#ifndef FUCINA_WORKER_WORKER_CLIENT_H_
#define FUCINA_WORKER_WORKER_CLIENT_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "fucina/cluster/v1/worker.pb.h"
#include "worker/cluster_auth.h"

namespace fucina {

namespace wire = ::fucina::cluster::v1;  // the internal protocol's messages

// Where a failed call's error arose. Only the first two mean the worker is gone, stuck or
// broken (the coordinator declares it dead and re-plans); a request-level failure ends the
// requests (or train job step) it was about and leaves the worker serving.
//   kTransport: the call got no answer from the worker's handler (connection refused or reset,
//               deadline, cancelled, a closed client). Set by the gRPC client.
//   kWorker:    the worker answered that it cannot serve: its model file broke under it
//               (DATA_LOSS), it lost or never loaded the shard the plan gave it, a computation
//               failed. Declared by the worker with WorkerDeclaredFailure().
//   kRequest:   about what was asked (a bad segment, a grammar that failed, a rollback a
//               sliding-window ring refuses, an expert peer that failed, a non-finite fitness):
//               declared with RequestFailure(), whatever its status code.
// The origin rides on the status as a payload (kFailureOriginPayload), so it survives copies
// and StatusOr, and over gRPC in the trailing metadata key kFailureOriginMetadata (the worker's
// service sends it, the gRPC client restores it). A Forward whose segments all fail for
// request-level reasons is not a failed call: it succeeds with one SegmentError per segment.
//
// A status nobody marked (code older than the marks, test fakes) is classified by its code as
// before: UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, UNKNOWN read as transport; INTERNAL,
// FAILED_PRECONDITION, DATA_LOSS as worker; everything else as request. Mark statuses to say
// otherwise, e.g. a train replica whose member fitness is not finite:
//   return RequestFailure(absl::InvalidArgumentError("the member's fitness is not finite"));
enum class FailureOrigin { kTransport, kWorker, kRequest };

inline constexpr char kFailureOriginPayload[] = "type.fucina.dev/fucina.FailureOrigin";
inline constexpr char kFailureOriginMetadata[] = "fucina-failure-origin";

inline const char* FailureOriginName(FailureOrigin origin) {
  switch (origin) {
    case FailureOrigin::kTransport: return "transport";
    case FailureOrigin::kWorker: return "worker";
    case FailureOrigin::kRequest: return "request";
  }
  return "";
}

inline std::optional<FailureOrigin> FailureOriginFromName(std::string_view name) {
  for (FailureOrigin o :
       {FailureOrigin::kTransport, FailureOrigin::kWorker, FailureOrigin::kRequest}) {
    if (name == FailureOriginName(o)) return o;
  }
  return std::nullopt;
}

// `status` (not OK) marked as arising at `origin`; an OK status is returned as it is.
inline absl::Status WithFailureOrigin(absl::Status status, FailureOrigin origin) {
  if (!status.ok()) status.SetPayload(kFailureOriginPayload, absl::Cord(FailureOriginName(origin)));
  return status;
}
// A failure about the request (or job step) only: never a reason to declare the worker dead.
inline absl::Status RequestFailure(absl::Status status) {
  return WithFailureOrigin(std::move(status), FailureOrigin::kRequest);
}
// The worker itself cannot serve (its state, not the request, is wrong).
inline absl::Status WorkerDeclaredFailure(absl::Status status) {
  return WithFailureOrigin(std::move(status), FailureOrigin::kWorker);
}

// The origin `status` was marked with, if any.
inline std::optional<FailureOrigin> MarkedFailureOrigin(const absl::Status& status) {
  auto payload = status.GetPayload(kFailureOriginPayload);
  if (!payload.has_value()) return std::nullopt;
  return FailureOriginFromName(std::string(*payload));
}

// Where a failed call's error arose: its mark, else (unmarked) by its code as described above.
inline FailureOrigin FailureOriginOf(const absl::Status& status) {
  if (std::optional<FailureOrigin> marked = MarkedFailureOrigin(status)) return *marked;
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status) ||
      absl::IsCancelled(status) || absl::IsUnknown(status)) {
    return FailureOrigin::kTransport;
  }
  if (absl::IsInternal(status) || absl::IsFailedPrecondition(status) ||
      absl::IsDataLoss(status)) {
    return FailureOrigin::kWorker;
  }
  return FailureOrigin::kRequest;
}

// Whether a call's failure means the worker itself is gone, stuck or broken (a transport or a
// worker-declared failure), rather than something about the request.
inline bool IsWorkerFailure(const absl::Status& status) {
  return !status.ok() && FailureOriginOf(status) != FailureOrigin::kRequest;
}

// The reply to an asynchronous call: runs exactly once, with the reply or the error.
template <typename Reply>
using Callback = std::function<void(absl::StatusOr<Reply>)>;
using ForwardCallback = Callback<wire::ForwardResponse>;
using LoadShardCallback = Callback<wire::LoadShardResponse>;

// Every call is asynchronous: it starts and returns, and its `done` runs exactly once with the
// reply or the error, never inside the call except when the client is closed (UNAVAILABLE at
// once) or the answer needs no wait (a fake's script, an UNIMPLEMENTED default). The gRPC
// client runs `done` on a gRPC thread, the in-process actor on its executor (or, for the train
// calls that drive the executor from outside it, on a thread of the call's own). `done` must
// not block for long: the next reply may need its thread. A caller keeps many calls in flight
// with no thread per call (a pipeline's micro-batches, a plan's loads, a train job's
// members); the synchronous forms below wait for the reply on the calling thread, which must
// then not be one a reply needs (a `done`, the actor's executor). Fakes implement the
// asynchronous forms and may hold any call (tests/worker/fake_worker_client.h).
class WorkerClient {
 public:
  virtual ~WorkerClient() = default;

  virtual void LoadShardAsync(wire::LoadShardRequest request, LoadShardCallback done) = 0;
  // CancelInFlight reaches these calls too.
  virtual void ForwardAsync(wire::ForwardRequest request, ForwardCallback done) = 0;
  virtual void ExpertForwardAsync(wire::ExpertForwardRequest request,
                                  Callback<wire::ExpertForwardResponse> done) = 0;
  virtual void GetStatsAsync(Callback<wire::WorkerStats> done) = 0;

  // Evolution-strategies train jobs (worker/es_replica.h). Clients of workers that take no
  // train jobs (test fakes) keep these defaults: UNIMPLEMENTED.
  virtual void EsLoadAsync(wire::EsJob job, Callback<wire::EsState> done) {
    done(Unimplemented("EsLoad"));
  }
  virtual void EsEvaluateAsync(wire::EsEvaluateRequest request,
                               Callback<wire::EsEvaluateResponse> done) {
    done(Unimplemented("EsEvaluate"));
  }
  virtual void EsUpdateAsync(wire::EsUpdateRequest request, Callback<wire::EsState> done) {
    done(Unimplemented("EsUpdate"));
  }
  // The whole snapshot file in one message (the gRPC stream's chunks joined).
  virtual void EsSnapshotAsync(wire::EsSnapshotRequest request,
                               Callback<wire::EsSnapshotChunk> done) {
    done(Unimplemented("EsSnapshot"));
  }
  virtual void EsReleaseAsync(wire::EsReleaseRequest request, Callback<wire::EsState> done) {
    done(Unimplemented("EsRelease"));
  }
  virtual void EsForwardAsync(wire::EsForwardRequest request,
                              Callback<wire::EsForwardResponse> done) {
    done(Unimplemented("EsForward"));
  }

  // Makes the calls in flight return CANCELLED now (a remote peer that hangs would otherwise
  // hold them until their deadline); later calls are not affected. In-process clients, whose
  // calls cannot hang on a peer, need not do anything.
  virtual void CancelInFlight() {}
  // The worker was declared dead: cancels the calls in flight and fails every later call at
  // once with UNAVAILABLE (`done` then runs inside the call). A worker that registers again
  // gets a new client. In-process clients need not do anything.
  virtual void Close() {}

  // ---- The synchronous forms: each starts its call and waits for the reply. ----
  absl::StatusOr<wire::LoadShardResponse> LoadShard(const wire::LoadShardRequest& request) {
    return Wait<wire::LoadShardResponse>(
        [&](LoadShardCallback done) { LoadShardAsync(request, std::move(done)); });
  }
  absl::StatusOr<wire::ForwardResponse> Forward(const wire::ForwardRequest& request) {
    return Wait<wire::ForwardResponse>(
        [&](ForwardCallback done) { ForwardAsync(request, std::move(done)); });
  }
  absl::StatusOr<wire::ExpertForwardResponse> ExpertForward(
      const wire::ExpertForwardRequest& request) {
    return Wait<wire::ExpertForwardResponse>([&](Callback<wire::ExpertForwardResponse> done) {
      ExpertForwardAsync(request, std::move(done));
    });
  }
  absl::StatusOr<wire::WorkerStats> GetStats() {
    return Wait<wire::WorkerStats>(
        [&](Callback<wire::WorkerStats> done) { GetStatsAsync(std::move(done)); });
  }
  absl::StatusOr<wire::EsState> EsLoad(const wire::EsJob& job) {
    return Wait<wire::EsState>(
        [&](Callback<wire::EsState> done) { EsLoadAsync(job, std::move(done)); });
  }
  absl::StatusOr<wire::EsEvaluateResponse> EsEvaluate(const wire::EsEvaluateRequest& request) {
    return Wait<wire::EsEvaluateResponse>([&](Callback<wire::EsEvaluateResponse> done) {
      EsEvaluateAsync(request, std::move(done));
    });
  }
  absl::StatusOr<wire::EsState> EsUpdate(const wire::EsUpdateRequest& request) {
    return Wait<wire::EsState>(
        [&](Callback<wire::EsState> done) { EsUpdateAsync(request, std::move(done)); });
  }
  absl::StatusOr<wire::EsSnapshotChunk> EsSnapshot(const wire::EsSnapshotRequest& request) {
    return Wait<wire::EsSnapshotChunk>([&](Callback<wire::EsSnapshotChunk> done) {
      EsSnapshotAsync(request, std::move(done));
    });
  }
  absl::StatusOr<wire::EsState> EsRelease(const wire::EsReleaseRequest& request) {
    return Wait<wire::EsState>(
        [&](Callback<wire::EsState> done) { EsReleaseAsync(request, std::move(done)); });
  }
  absl::StatusOr<wire::EsForwardResponse> EsForward(const wire::EsForwardRequest& request) {
    return Wait<wire::EsForwardResponse>([&](Callback<wire::EsForwardResponse> done) {
      EsForwardAsync(request, std::move(done));
    });
  }

  // Starts a call through `start` (given the callback) and waits for its reply.
  template <typename Reply, typename Start>
  static absl::StatusOr<Reply> Wait(Start start);

 private:
  static absl::Status Unimplemented(const char* method) {
    return absl::UnimplementedError(std::string(method) + ": this worker takes no train jobs");
  }
};

// Calls `start(i, done)` for every i in [0, n) at once, then waits until every `done` has run;
// the replies in index order. A fan-out over workers with no thread per call.
template <typename Reply>
std::vector<absl::StatusOr<Reply>> CallAll(
    size_t n, const std::function<void(size_t i, Callback<Reply> done)>& start) {
  struct Replies {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<absl::StatusOr<Reply>> replies;
    size_t left;
  };
  auto all = std::make_shared<Replies>();
  all->replies.assign(n, absl::StatusOr<Reply>(absl::UnknownError("no reply")));
  all->left = n;
  for (size_t i = 0; i < n; ++i) {
    start(i, [all, i](absl::StatusOr<Reply> reply) {
      std::lock_guard<std::mutex> lock(all->mu);
      all->replies[i] = std::move(reply);
      if (--all->left == 0) all->cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(all->mu);
  all->cv.wait(lock, [&] { return all->left == 0; });
  return std::move(all->replies);
}

template <typename Reply, typename Start>
absl::StatusOr<Reply> WorkerClient::Wait(Start start) {
  return std::move(
      CallAll<Reply>(1, [&](size_t, Callback<Reply> done) { start(std::move(done)); })[0]);
}

// Deadlines of the gRPC client, per call kind. Loading maps and fuses a shard; a forward of a
// long prefill chunk on a slow machine can take seconds. A hung worker is found by its
// heartbeats.
struct WorkerDeadlines {
  int load_ms = 600'000;
  int forward_ms = 120'000;
  // Train jobs: loading a replica maps and copies a whole model; evaluating members runs the
  // reward's forward passes, one member after another, between serving steps.
  int es_load_ms = 600'000;
  int es_evaluate_ms = 600'000;
  int es_release_ms = 120'000;  // queues behind the forward steps in flight
  int stats_ms = 10'000;
};

// A client for the worker serving gRPC at `address` (host:port), dialled with `credentials`
// (TLS with this process's certificate or plaintext; the join token on every call). Message
// size limits are set for the largest forward reply (all-position logits of a prefill chunk).
std::unique_ptr<WorkerClient> MakeGrpcWorkerClient(const std::string& address,
                                                   const ClusterCredentials& credentials,
                                                   const WorkerDeadlines& deadlines = {});

}  // namespace fucina

#endif  // FUCINA_WORKER_WORKER_CLIENT_H_
