// gRPC front ends of the coordinator: the public fucina.v1.Generation service and the
// fucina.cluster.v1.Registry service workers register with. Handlers run on gRPC's threads:
// they admit, tokenize and hand requests to the scheduler, then relay its output.
#ifndef FUCINA_COORDINATOR_GRPC_SERVICES_H_
#define FUCINA_COORDINATOR_GRPC_SERVICES_H_

#include "coordinator/coordinator.h"
#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "fucina/v1/generate.grpc.pb.h"

namespace fucina {

class GenerationService final : public ::fucina::v1::Generation::Service {
 public:
  explicit GenerationService(Coordinator& coordinator) : c_(coordinator) {}

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

  Coordinator& c_;
};

class RegistryService final : public ::fucina::cluster::v1::Registry::Service {
 public:
  explicit RegistryService(Coordinator& coordinator) : c_(coordinator) {}

  grpc::Status Register(grpc::ServerContext* context,
                        const ::fucina::cluster::v1::RegisterRequest* request,
                        ::fucina::cluster::v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context,
                         const ::fucina::cluster::v1::HeartbeatRequest* request,
                         ::fucina::cluster::v1::HeartbeatResponse* response) override;

 private:
  Coordinator& c_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_GRPC_SERVICES_H_
