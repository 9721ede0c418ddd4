// gRPC front ends of the coordinator: the public fucina.v1.Generation service and the
// fucina.cluster.v1.Registry service workers register with. Handlers run on gRPC's threads:
// each first passes the call through the gate (API key; join token and peer certificate), then
// they admit, tokenize and hand requests to the scheduler, then relay its output.
#ifndef FUCINA_COORDINATOR_GRPC_SERVICES_H_
#define FUCINA_COORDINATOR_GRPC_SERVICES_H_

#include "coordinator/coordinator.h"
#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "fucina/v1/generate.grpc.pb.h"
#include "fucina/v1/train.grpc.pb.h"
#include "worker/cluster_auth.h"

namespace fucina {

class GenerationService final : public ::fucina::v1::Generation::Service {
 public:
  // Borrows both; they outlive the server.
  GenerationService(Coordinator& coordinator, const CallGate& gate)
      : c_(coordinator), gate_(gate) {}

  grpc::Status Generate(grpc::ServerContext* context, const ::fucina::v1::GenerateRequest* request,
                        ::fucina::v1::GenerateResponse* response) override;
  grpc::Status GenerateStream(grpc::ServerContext* context,
                              const ::fucina::v1::GenerateRequest* request,
                              grpc::ServerWriter<::fucina::v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const ::fucina::v1::TokenizeRequest* request,
                        ::fucina::v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context,
                          const ::fucina::v1::DetokenizeRequest* request,
                          ::fucina::v1::DetokenizeResponse* response) override;
  grpc::Status ListModels(grpc::ServerContext* context,
                          const ::fucina::v1::ListModelsRequest* request,
                          ::fucina::v1::ListModelsResponse* response) override;
  grpc::Status GetPlacement(grpc::ServerContext* context,
                            const ::fucina::v1::GetPlacementRequest* request,
                            ::fucina::v1::Placement* response) override;

 private:
  // Admits and submits; OK with the running request or the error to answer.
  absl::StatusOr<std::shared_ptr<Request>> Start(const ::fucina::v1::GenerateRequest& request);
  grpc::Status CheckModel(const std::string& model) const;
  grpc::Status Admit(const grpc::ServerContext* context, std::string_view method) const;

  Coordinator& c_;
  const CallGate& gate_;
};

// fucina.v1.Train over the coordinator's train jobs (coordinator/train_jobs.h).
class TrainService final : public ::fucina::v1::Train::Service {
 public:
  // Borrows both; they outlive the server.
  TrainService(Coordinator& coordinator, const CallGate& gate) : c_(coordinator), gate_(gate) {}

  grpc::Status StartJob(grpc::ServerContext* context, const ::fucina::v1::StartJobRequest* request,
                        ::fucina::v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const ::fucina::v1::GetJobRequest* request,
                      ::fucina::v1::Job* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context,
                        const ::fucina::v1::WatchJobRequest* request,
                        grpc::ServerWriter<::fucina::v1::JobEvent>* writer) override;
  grpc::Status StopJob(grpc::ServerContext* context, const ::fucina::v1::StopJobRequest* request,
                       ::fucina::v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const ::fucina::v1::ListJobsRequest* request,
                        ::fucina::v1::ListJobsResponse* response) override;

 private:
  grpc::Status Admit(const grpc::ServerContext* context, std::string_view method) const;

  Coordinator& c_;
  const CallGate& gate_;
};

class RegistryService final : public ::fucina::cluster::v1::Registry::Service {
 public:
  // Registered workers are dialled with `worker_credentials`. Borrows the coordinator and the
  // gate; they outlive the server.
  RegistryService(Coordinator& coordinator, const CallGate& gate,
                  ClusterCredentials worker_credentials)
      : c_(coordinator), gate_(gate), worker_credentials_(std::move(worker_credentials)) {}

  grpc::Status Register(grpc::ServerContext* context,
                        const ::fucina::cluster::v1::RegisterRequest* request,
                        ::fucina::cluster::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const ::fucina::cluster::v1::HeartbeatRequest* request,
                         ::fucina::cluster::v1::HeartbeatResponse* response) override;

 private:
  Coordinator& c_;
  const CallGate& gate_;
  const ClusterCredentials worker_credentials_;
};

// What a worker claims at Register, checked before it can take any part of the plan: an
// address host:port, cores in [1, 4096], a memory budget in [0, 2^50) bytes, a known device
// ("" means cpu). INVALID_ARGUMENT naming the field otherwise.
absl::Status ValidateRegistration(const ::fucina::cluster::v1::RegisterRequest& request);

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_GRPC_SERVICES_H_
