// gRPC front ends of the coordinator: the public fucina.v1.Generation service and the
// fucina.cluster.v1.Registry service workers register with. Handlers run on gRPC's threads:
// each first passes the call through the gate (API key; join token and peer certificate), then
// they admit, tokenize and hand requests to the scheduler, then relay its output.
#ifndef FUCINA_COORDINATOR_GRPC_SERVICES_H_
#define FUCINA_COORDINATOR_GRPC_SERVICES_H_

#include <atomic>
#include <string>

#include "coordinator/coordinator.h"
#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "fucina/v1/generate.grpc.pb.h"
#include "fucina/v1/train.grpc.pb.h"
#include "worker/cluster_auth.h"

namespace fucina {

// Fills a scheduler job from a public request, applying the server's defaults; renders chat
// messages with the model's template. Errors are INVALID_ARGUMENT naming the field.
absl::StatusOr<GenerateJob> JobFromRequest(const Coordinator& coordinator,
                                           const ::fucina::v1::GenerateRequest& request);

// How many calls of each long-lived method are served at once. gRPC's synchronous server gives
// every call a thread for as long as it runs: without a bound, a client opening streams (a
// WatchJob stays open while its job runs) makes a thread each, and a single quota of threads
// would let those streams take every thread and starve Generate. Beyond its cap a method
// answers RESOURCE_EXHAUSTED at once, naming the cap; the other methods are unaffected.
struct CallLimits {
  int generate = 512;         // unary Generate calls (each runs its whole generation)
  int generate_stream = 512;  // GenerateStream calls
  int watch_job = 64;         // WatchJob streams
};

// One method's cap: Take() holds a place until the returned hold is destroyed.
class CallCap {
 public:
  CallCap(std::string method, int limit) : method_(std::move(method)), limit_(limit) {}

  class Hold {
   public:
    Hold() = default;
    explicit Hold(CallCap* cap) : cap_(cap) {}
    Hold(Hold&& other) noexcept : cap_(other.cap_) { other.cap_ = nullptr; }
    Hold& operator=(Hold&& other) noexcept {
      if (this != &other) {
        if (cap_ != nullptr) cap_->in_use_.fetch_sub(1);
        cap_ = other.cap_;
        other.cap_ = nullptr;
      }
      return *this;
    }
    ~Hold() {
      if (cap_ != nullptr) cap_->in_use_.fetch_sub(1);
    }

   private:
    CallCap* cap_ = nullptr;
  };

  // A place, or RESOURCE_EXHAUSTED when `limit` calls of this method are being served.
  absl::StatusOr<Hold> Take();
  int in_use() const { return in_use_.load(); }

 private:
  const std::string method_;
  const int limit_;
  std::atomic<int> in_use_{0};
};

class GenerationService final : public ::fucina::v1::Generation::Service {
 public:
  // Borrows both; they outlive the server.
  GenerationService(Coordinator& coordinator, const CallGate& gate,
                    const CallLimits& limits = {})
      : c_(coordinator),
        gate_(gate),
        generate_cap_("Generate", limits.generate),
        stream_cap_("GenerateStream", limits.generate_stream) {}

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
  CallCap generate_cap_;
  CallCap stream_cap_;
};

// fucina.v1.Train over the coordinator's train jobs (coordinator/train_jobs.h).
class TrainService final : public ::fucina::v1::Train::Service {
 public:
  // Borrows both; they outlive the server.
  TrainService(Coordinator& coordinator, const CallGate& gate, const CallLimits& limits = {})
      : c_(coordinator), gate_(gate), watch_cap_("WatchJob", limits.watch_job) {}

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
  CallCap watch_cap_;
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
  // Under TLS, dials a registering worker at its address: FAILED_PRECONDITION naming the host
  // its certificate lacks when TLS refuses it; OK otherwise (a worker merely slow to answer is
  // accepted, as before).
  grpc::Status ProbeWorker(const std::string& address) const;

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
