// gRPC face of a worker: the fucina.cluster.v1.Worker service over any WorkerClient (the
// actor). Handlers run on gRPC's threads; each passes the call through the gate (join token,
// peer certificate) and only then hands the request to the actor, which runs it on its own
// executor.
#ifndef FUCINA_WORKER_WORKER_SERVICE_H_
#define FUCINA_WORKER_WORKER_SERVICE_H_

#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "worker/cluster_auth.h"
#include "worker/worker_client.h"

namespace fucina {

class WorkerService final : public wire::Worker::Service {
 public:
  // Borrows both; they outlive the server.
  WorkerService(WorkerClient& worker, const CallGate& gate) : worker_(worker), gate_(gate) {}

  grpc::Status LoadShard(grpc::ServerContext* context, const wire::LoadShardRequest* request,
                         wire::LoadShardResponse* response) override;
  grpc::Status Forward(grpc::ServerContext* context, const wire::ForwardRequest* request,
                       wire::ForwardResponse* response) override;
  grpc::Status ExpertForward(grpc::ServerContext* context,
                             const wire::ExpertForwardRequest* request,
                             wire::ExpertForwardResponse* response) override;
  grpc::Status TruncateSession(grpc::ServerContext* context,
                               const wire::TruncateSessionRequest* request,
                               wire::SessionReply* response) override;
  grpc::Status CopyPrefix(grpc::ServerContext* context, const wire::CopyPrefixRequest* request,
                          wire::SessionReply* response) override;
  grpc::Status ReleaseSession(grpc::ServerContext* context,
                              const wire::ReleaseSessionRequest* request,
                              wire::SessionReply* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const wire::StatsRequest* request,
                        wire::WorkerStats* response) override;

 private:
  // Admits the call (`method` is its full name), then answers with `run`'s result.
  template <typename Reply, typename Run>
  grpc::Status Serve(grpc::ServerContext* context, std::string_view method, Run run,
                     Reply* response);

  WorkerClient& worker_;
  const CallGate& gate_;
};

}  // namespace fucina

#endif  // FUCINA_WORKER_WORKER_SERVICE_H_
