// gRPC face of a worker: the fucina.cluster.v1.Worker service over any WorkerClient (the
// actor). Handlers run on gRPC's threads; each passes the call through the gate (join token,
// peer certificate) and only then hands the request to the actor, which runs it on its own
// executor. A call its client gives up on (cancelled, past its deadline) is noticed within
// kCancelPollMs and its CallScope cancelled: the peer calls made for it (a hung expert, the
// next stage) are cut, and those of the other calls in flight run on.
#ifndef FUCINA_WORKER_WORKER_SERVICE_H_
#define FUCINA_WORKER_WORKER_SERVICE_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "worker/call_scope.h"
#include "worker/cluster_auth.h"
#include "worker/worker_client.h"

namespace fucina {

class WorkerService final : public wire::Worker::Service {
 public:
  static constexpr int kCancelPollMs = 50;

  // Borrows both; they outlive the server.
  WorkerService(WorkerClient& worker, const CallGate& gate);
  ~WorkerService() override;

  grpc::Status LoadShard(grpc::ServerContext* context, const wire::LoadShardRequest* request,
                         wire::LoadShardResponse* response) override;
  grpc::Status Forward(grpc::ServerContext* context, const wire::ForwardRequest* request,
                       wire::ForwardResponse* response) override;
  grpc::Status ExpertForward(grpc::ServerContext* context,
                             const wire::ExpertForwardRequest* request,
                             wire::ExpertForwardResponse* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const wire::StatsRequest* request,
                        wire::WorkerStats* response) override;
  grpc::Status EsLoad(grpc::ServerContext* context, const wire::EsJob* request,
                      wire::EsState* response) override;
  grpc::Status EsEvaluate(grpc::ServerContext* context, const wire::EsEvaluateRequest* request,
                          wire::EsEvaluateResponse* response) override;
  grpc::Status EsUpdate(grpc::ServerContext* context, const wire::EsUpdateRequest* request,
                        wire::EsState* response) override;
  grpc::Status EsRelease(grpc::ServerContext* context, const wire::EsReleaseRequest* request,
                         wire::EsState* response) override;
  grpc::Status EsForward(grpc::ServerContext* context, const wire::EsForwardRequest* request,
                         wire::EsForwardResponse* response) override;
  grpc::Status EsSnapshot(grpc::ServerContext* context, const wire::EsSnapshotRequest* request,
                          grpc::ServerWriter<wire::EsSnapshotChunk>* writer) override;

 private:
  // Admits the call (`method` is its full name), then answers with `run`'s result.
  template <typename Reply, typename Run>
  grpc::Status Serve(grpc::ServerContext* context, std::string_view method, Run run,
                     Reply* response);

  // Polls the calls being served and cancels the scope of each one found cancelled.
  void WatchCancellations();

  WorkerClient& worker_;
  const CallGate& gate_;
  std::mutex mu_;  // serving_, stopping_
  std::condition_variable cv_;
  absl::flat_hash_map<grpc::ServerContext*, std::shared_ptr<CallScope>> serving_;
  bool stopping_ = false;
  std::thread watcher_;  // last
};

}  // namespace fucina

#endif  // FUCINA_WORKER_WORKER_SERVICE_H_
