#include "worker/worker_service.h"

#include <chrono>
#include <mutex>

#include "absl/container/flat_hash_set.h"
#include "worker/grpc_util.h"

namespace fucina {
namespace {

constexpr char kWorkerMethod[] = "/fucina.cluster.v1.Worker/";

// The worker's side of an RPC client: one channel, one stub, a deadline and the join token per
// call.
class GrpcWorkerClient final : public WorkerClient {
 public:
  GrpcWorkerClient(const std::string& address, const ClusterCredentials& credentials,
                   const WorkerDeadlines& deadlines)
      : deadlines_(deadlines), credentials_(credentials) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    stub_ = wire::Worker::NewStub(
        grpc::CreateCustomChannel(address, credentials_.ChannelCredentials(), args));
  }

  absl::StatusOr<wire::LoadShardResponse> LoadShard(
      const wire::LoadShardRequest& request) override {
    return Call(&wire::Worker::Stub::LoadShard, request, deadlines_.load_ms);
  }
  absl::StatusOr<wire::ForwardResponse> Forward(
      const wire::ForwardRequest& request) override {
    return Call(&wire::Worker::Stub::Forward, request, deadlines_.forward_ms);
  }
  absl::StatusOr<wire::ExpertForwardResponse> ExpertForward(
      const wire::ExpertForwardRequest& request) override {
    return Call(&wire::Worker::Stub::ExpertForward, request, deadlines_.forward_ms);
  }
  absl::StatusOr<wire::SessionReply> TruncateSession(
      const wire::TruncateSessionRequest& request) override {
    return Call(&wire::Worker::Stub::TruncateSession, request, deadlines_.control_ms);
  }
  absl::StatusOr<wire::SessionReply> CopyPrefix(
      const wire::CopyPrefixRequest& request) override {
    return Call(&wire::Worker::Stub::CopyPrefix, request, deadlines_.control_ms);
  }
  absl::StatusOr<wire::SessionReply> ReleaseSession(
      const wire::ReleaseSessionRequest& request) override {
    return Call(&wire::Worker::Stub::ReleaseSession, request, deadlines_.control_ms);
  }
  absl::StatusOr<wire::WorkerStats> GetStats() override {
    return Call(&wire::Worker::Stub::GetStats, wire::StatsRequest(),
                deadlines_.control_ms);
  }
  void CancelInFlight() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }

 private:
  template <typename Request, typename Reply>
  absl::StatusOr<Reply> Call(grpc::Status (wire::Worker::Stub::*method)(
                                 grpc::ClientContext*, const Request&, Reply*),
                             const Request& request, int deadline_ms) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(deadline_ms));
    credentials_.Prepare(&context);
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.insert(&context);
    }
    Reply reply;
    grpc::Status status = (stub_.get()->*method)(&context, request, &reply);
    {
      // After this, CancelInFlight no longer reaches `context`, which is about to die.
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.erase(&context);
    }
    if (!status.ok()) return FromGrpc(status);
    return reply;
  }

  WorkerDeadlines deadlines_;
  ClusterCredentials credentials_;
  std::mutex mu_;  // in_flight_
  absl::flat_hash_set<grpc::ClientContext*> in_flight_;
  std::unique_ptr<wire::Worker::Stub> stub_;
};

}  // namespace

template <typename Reply, typename Run>
grpc::Status WorkerService::Serve(grpc::ServerContext* context, std::string_view method,
                                  Run run, Reply* response) {
  if (grpc::Status s = gate_.Admit(*context, std::string(kWorkerMethod) + std::string(method));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<Reply> result = run();
  if (!result.ok()) return ToGrpc(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status WorkerService::LoadShard(grpc::ServerContext* context,
                                      const wire::LoadShardRequest* request,
                                      wire::LoadShardResponse* response) {
  return Serve(context, "LoadShard", [&] { return worker_.LoadShard(*request); }, response);
}

grpc::Status WorkerService::Forward(grpc::ServerContext* context,
                                    const wire::ForwardRequest* request,
                                    wire::ForwardResponse* response) {
  return Serve(context, "Forward", [&] { return worker_.Forward(*request); }, response);
}

grpc::Status WorkerService::ExpertForward(grpc::ServerContext* context,
                                          const wire::ExpertForwardRequest* request,
                                          wire::ExpertForwardResponse* response) {
  return Serve(context, "ExpertForward", [&] { return worker_.ExpertForward(*request); }, response);
}

grpc::Status WorkerService::TruncateSession(grpc::ServerContext* context,
                                            const wire::TruncateSessionRequest* request,
                                            wire::SessionReply* response) {
  return Serve(
      context, "TruncateSession", [&] { return worker_.TruncateSession(*request); }, response);
}

grpc::Status WorkerService::CopyPrefix(grpc::ServerContext* context,
                                       const wire::CopyPrefixRequest* request,
                                       wire::SessionReply* response) {
  return Serve(context, "CopyPrefix", [&] { return worker_.CopyPrefix(*request); }, response);
}

grpc::Status WorkerService::ReleaseSession(grpc::ServerContext* context,
                                           const wire::ReleaseSessionRequest* request,
                                           wire::SessionReply* response) {
  return Serve(
      context, "ReleaseSession", [&] { return worker_.ReleaseSession(*request); }, response);
}

grpc::Status WorkerService::GetStats(grpc::ServerContext* context,
                                     const wire::StatsRequest*,
                                     wire::WorkerStats* response) {
  return Serve(context, "GetStats", [&] { return worker_.GetStats(); }, response);
}

std::unique_ptr<WorkerClient> MakeGrpcWorkerClient(const std::string& address,
                                                   const ClusterCredentials& credentials,
                                                   const WorkerDeadlines& deadlines) {
  return std::make_unique<GrpcWorkerClient>(address, credentials, deadlines);
}

}  // namespace fucina
