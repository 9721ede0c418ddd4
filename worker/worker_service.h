// gRPC face of a worker: the fucina.cluster.v1.Worker service over any WorkerClient (the
// actor). Handlers run on gRPC's threads and only hand the request to the actor, which runs it
// on its own executor.
#ifndef FUCINA_WORKER_WORKER_SERVICE_H_
#define FUCINA_WORKER_WORKER_SERVICE_H_

#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "worker/worker_client.h"

namespace fucina {

class WorkerService final : public wire::Worker::Service {
 public:
  explicit WorkerService(WorkerClient& worker) : worker_(worker) {}

  grpc::Status LoadShard(grpc::ServerContext*, const wire::LoadShardRequest* request,
                         wire::LoadShardResponse* response) override;
  grpc::Status Forward(grpc::ServerContext*, const wire::ForwardRequest* request,
                       wire::ForwardResponse* response) override;
  grpc::Status ExpertForward(grpc::ServerContext*, const wire::ExpertForwardRequest* request,
                             wire::ExpertForwardResponse* response) override;
  grpc::Status TruncateSession(grpc::ServerContext*,
                               const wire::TruncateSessionRequest* request,
                               wire::SessionReply* response) override;
  grpc::Status CopyPrefix(grpc::ServerContext*, const wire::CopyPrefixRequest* request,
                          wire::SessionReply* response) override;
  grpc::Status ReleaseSession(grpc::ServerContext*, const wire::ReleaseSessionRequest* request,
                              wire::SessionReply* response) override;
  grpc::Status GetStats(grpc::ServerContext*, const wire::StatsRequest* request,
                        wire::WorkerStats* response) override;

 private:
  WorkerClient& worker_;
};

}  // namespace fucina

#endif  // FUCINA_WORKER_WORKER_SERVICE_H_
