#include "worker/worker_service.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "worker/grpc_util.h"

namespace fucina {
namespace {

constexpr char kWorkerMethod[] = "/fucina.cluster.v1.Worker/";

// A failed call's status on this side, with the origin the worker's trailing metadata names.
// None: the worker's handler did not answer (the transport, the deadline, a cancel), and the
// transport's codes say so; a status the handler sent unmarked keeps the classification by code.
absl::Status FromWorkerCall(const grpc::Status& status, const grpc::ClientContext& context) {
  absl::Status s = FromGrpc(status);
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find(kFailureOriginMetadata); it != trailers.end()) {
    const std::string_view name(it->second.data(), it->second.size());
    if (std::optional<FailureOrigin> origin = FailureOriginFromName(name)) {
      return WithFailureOrigin(std::move(s), *origin);
    }
    return s;  // answered by the handler, unmarked
  }
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s) || absl::IsCancelled(s) ||
      absl::IsUnknown(s) || absl::IsInternal(s)) {
    return WithFailureOrigin(std::move(s), FailureOrigin::kTransport);
  }
  return s;  // refused before the handler (the gate, a message over the size limit)
}

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

  void LoadShardAsync(wire::LoadShardRequest request, LoadShardCallback done) override {
    CallAsync(&Async::LoadShard, std::move(request), deadlines_.load_ms, std::move(done));
  }
  void ForwardAsync(wire::ForwardRequest request, ForwardCallback done) override {
    CallAsync(&Async::Forward, std::move(request), deadlines_.forward_ms, std::move(done));
  }
  void ExpertForwardAsync(wire::ExpertForwardRequest request,
                          Callback<wire::ExpertForwardResponse> done) override {
    CallAsync(&Async::ExpertForward, std::move(request), deadlines_.forward_ms,
              std::move(done));
  }
  void GetStatsAsync(Callback<wire::WorkerStats> done) override {
    CallAsync(&Async::GetStats, wire::StatsRequest(), deadlines_.stats_ms, std::move(done));
  }
  void EsLoadAsync(wire::EsJob job, Callback<wire::EsState> done) override {
    CallAsync(&Async::EsLoad, std::move(job), deadlines_.es_load_ms, std::move(done));
  }
  void EsEvaluateAsync(wire::EsEvaluateRequest request,
                       Callback<wire::EsEvaluateResponse> done) override {
    CallAsync(&Async::EsEvaluate, std::move(request), deadlines_.es_evaluate_ms,
              std::move(done));
  }
  void EsUpdateAsync(wire::EsUpdateRequest request, Callback<wire::EsState> done) override {
    CallAsync(&Async::EsUpdate, std::move(request), deadlines_.es_load_ms, std::move(done));
  }
  void EsReleaseAsync(wire::EsReleaseRequest request, Callback<wire::EsState> done) override {
    CallAsync(&Async::EsRelease, std::move(request), deadlines_.es_release_ms,
              std::move(done));
  }
  void EsForwardAsync(wire::EsForwardRequest request,
                      Callback<wire::EsForwardResponse> done) override {
    CallAsync(&Async::EsForward, std::move(request), deadlines_.es_evaluate_ms,
              std::move(done));
  }
  // The stream's chunks joined as they arrive, on gRPC's threads.
  void EsSnapshotAsync(wire::EsSnapshotRequest request,
                       Callback<wire::EsSnapshotChunk> done) override {
    auto* reader = new SnapshotReader(this, std::move(request), std::move(done));
    if (!Begin(&reader->context, deadlines_.es_load_ms, &reader->scoped, &reader->done)) {
      delete reader;
      return;
    }
    stub_->async()->EsSnapshot(&reader->context, &reader->request, reader);
    reader->StartRead(&reader->chunk);
    reader->StartCall();
  }

  void CancelInFlight() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (grpc::ClientContext* context : in_flight_) context->TryCancel();
  }
  void Close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
    }
    CancelInFlight();
  }

  // Asynchronous calls still running reach back into this client: they are cancelled and
  // waited for (their `done` must not destroy the client).
  ~GrpcWorkerClient() override {
    CancelInFlight();
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return async_calls_ == 0; });
  }

 private:
  // Every call's context: its deadline and the join token, a place in in_flight_ (where
  // CancelInFlight reaches it) and, when it is made for a served call, in that call's scope
  // (`scoped`: the served call being cancelled cuts this one) until Finish.
  // UNAVAILABLE (and nothing registered) once the client is closed.
  absl::Status Start(grpc::ClientContext* context, int deadline_ms,
                     CallScope::Registration* scoped) {
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(deadline_ms));
    credentials_.Prepare(context);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) {
        return absl::UnavailableError("the worker was declared dead (its client is closed)");
      }
      in_flight_.insert(context);
    }
    *scoped = CallScope::OnCancel([context] { context->TryCancel(); });
    return absl::OkStatus();
  }
  // After this, neither CancelInFlight nor the scope reaches `context`, which is about to die.
  void Finish(grpc::ClientContext* context, CallScope::Registration* scoped) {
    scoped->Reset();
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.erase(context);
  }

  using Async = class wire::Worker::Stub::async;  // "class": the stub also has a method async()
  // A unary method of the stub's callback interface.
  template <typename Request, typename Reply>
  using AsyncMethod = void (Async::*)(grpc::ClientContext*, const Request*, Reply*,
                                      std::function<void(grpc::Status)>);

  // An asynchronous unary call of `method`; `done` runs once, on a gRPC thread (or here, when
  // the client is closed), with the reply or the error.
  template <typename Request, typename Reply>
  void CallAsync(AsyncMethod<Request, Reply> method, Request request, int deadline_ms,
                 Callback<Reply> done) {
    // Owns what the call needs until gRPC's callback is done with it.
    struct AsyncCall {
      grpc::ClientContext context;
      CallScope::Registration scoped;
      Request request;
      Reply reply;
      Callback<Reply> done;
    };
    auto* call = new AsyncCall;
    call->request = std::move(request);
    call->done = std::move(done);
    if (!Begin(&call->context, deadline_ms, &call->scoped, &call->done)) {
      delete call;
      return;
    }
    (stub_->async()->*method)(&call->context, &call->request, &call->reply,
                              [this, call](grpc::Status status) {
      absl::StatusOr<Reply> result =
          status.ok() ? absl::StatusOr<Reply>(std::move(call->reply))
                      : absl::StatusOr<Reply>(FromWorkerCall(status, call->context));
      End(&call->context, &call->scoped, std::move(call->done), std::move(result),
          [call] { delete call; });
    });
  }

  // An asynchronous call's start: counted (the destructor waits for it) and started as
  // Start does. False when the client is closed: `done` has then run with the error.
  template <typename Reply>
  bool Begin(grpc::ClientContext* context, int deadline_ms, CallScope::Registration* scoped,
             std::function<void(absl::StatusOr<Reply>)>* done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++async_calls_;
    }
    if (absl::Status closed = Start(context, deadline_ms, scoped); !closed.ok()) {
      auto reply = std::move(*done);
      reply(closed);
      std::lock_guard<std::mutex> lock(mu_);
      if (--async_calls_ == 0) idle_.notify_all();
      return false;
    }
    return true;
  }
  // An asynchronous call's end, on a gRPC thread: `free` deletes what holds the context (while
  // the channel is alive), then `done` gets the result, and only then is the call uncounted
  // (the destructor may free everything from there on).
  template <typename Reply, typename Free>
  void End(grpc::ClientContext* context, CallScope::Registration* scoped,
           std::function<void(absl::StatusOr<Reply>)> done, absl::StatusOr<Reply> result,
           Free free) {
    Finish(context, scoped);
    free();
    done(std::move(result));
    std::lock_guard<std::mutex> lock(mu_);
    if (--async_calls_ == 0) idle_.notify_all();
  }

  // EsSnapshot's reader: appends each chunk, cuts a worker sending more than max_bytes.
  struct SnapshotReader : grpc::ClientReadReactor<wire::EsSnapshotChunk> {
    SnapshotReader(GrpcWorkerClient* client, wire::EsSnapshotRequest request,
                   Callback<wire::EsSnapshotChunk> done)
        : client(client), request(std::move(request)), done(std::move(done)) {}
    void OnReadDone(bool ok) override {
      if (!ok) return;  // the stream ended: OnDone follows
      if (first) {
        whole.set_file_name(chunk.file_name());
        whole.set_generation(chunk.generation());
        first = false;
      }
      if (request.max_bytes() > 0 &&
          static_cast<int64_t>(whole.data().size() + chunk.data().size()) > request.max_bytes()) {
        too_big = true;  // what a worker sends beyond the values' size is not buffered
        context.TryCancel();
        return;
      }
      whole.mutable_data()->append(chunk.data());
      StartRead(&chunk);
    }
    void OnDone(const grpc::Status& status) override {
      absl::StatusOr<wire::EsSnapshotChunk> result =
          too_big ? absl::StatusOr<wire::EsSnapshotChunk>(absl::ResourceExhaustedError(
                        absl::StrCat("EsSnapshot: the worker sent more than ",
                                     request.max_bytes(), " bytes")))
          : !status.ok() ? absl::StatusOr<wire::EsSnapshotChunk>(FromWorkerCall(status, context))
                         : absl::StatusOr<wire::EsSnapshotChunk>(std::move(whole));
      client->End(&context, &scoped, std::move(done), std::move(result), [this] { delete this; });
    }

    GrpcWorkerClient* client;
    grpc::ClientContext context;
    CallScope::Registration scoped;
    wire::EsSnapshotRequest request;
    Callback<wire::EsSnapshotChunk> done;
    wire::EsSnapshotChunk chunk, whole;
    bool first = true;
    bool too_big = false;
  };

  WorkerDeadlines deadlines_;
  ClusterCredentials credentials_;
  std::mutex mu_;  // in_flight_, async_calls_, closed_
  std::condition_variable idle_;  // async_calls_ reached 0
  absl::flat_hash_set<grpc::ClientContext*> in_flight_;
  int async_calls_ = 0;  // asynchronous calls whose callback has not finished
  bool closed_ = false;
  std::unique_ptr<wire::Worker::Stub> stub_;
};

}  // namespace

WorkerService::WorkerService(WorkerClient& worker, const CallGate& gate)
    : worker_(worker), gate_(gate), watcher_([this] { WatchCancellations(); }) {}

WorkerService::~WorkerService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watcher_.join();
}

void WorkerService::WatchCancellations() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Polls only while calls are being served: an idle worker's watcher does not wake.
    cv_.wait(lock, [this] { return stopping_ || !serving_.empty(); });
    cv_.wait_for(lock, std::chrono::milliseconds(kCancelPollMs));
    std::vector<std::shared_ptr<CallScope>> cancelled;
    for (const auto& [context, scope] : serving_) {
      if (context->IsCancelled() && !scope->cancelled()) cancelled.push_back(scope);
    }
    if (cancelled.empty()) continue;
    lock.unlock();
    // The peer calls made for these calls only: another call's (a concurrent micro-batch's
    // next-stage call) runs on.
    for (const auto& scope : cancelled) scope->Cancel();
    lock.lock();
  }
}

template <typename Reply, typename Run>
grpc::Status WorkerService::Serve(grpc::ServerContext* context, std::string_view method,
                                  Run run, Reply* response) {
  if (grpc::Status s = gate_.Admit(*context, std::string(kWorkerMethod) + std::string(method));
      !s.ok()) {
    return s;
  }
  bool first = false;
  auto scope = std::make_shared<CallScope>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = serving_.empty();
    serving_.emplace(context, scope);
  }
  if (first) cv_.notify_all();  // the watcher sleeps while nothing is served
  absl::StatusOr<Reply> result = [&] {
    CallScope::Enter enter(scope);
    return run();
  }();
  {
    std::lock_guard<std::mutex> lock(mu_);
    serving_.erase(context);
  }
  cv_.notify_all();
  if (!result.ok()) {
    // Where the failure arose travels with it: the caller's client restores it, so a
    // request-level error never reads as this worker's, whatever its code.
    std::optional<FailureOrigin> origin = MarkedFailureOrigin(result.status());
    context->AddTrailingMetadata(kFailureOriginMetadata,
                                 origin.has_value() ? FailureOriginName(*origin) : "unmarked");
    return ToGrpc(result.status());
  }
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

grpc::Status WorkerService::GetStats(grpc::ServerContext* context,
                                     const wire::StatsRequest*,
                                     wire::WorkerStats* response) {
  return Serve(context, "GetStats", [&] { return worker_.GetStats(); }, response);
}

grpc::Status WorkerService::EsLoad(grpc::ServerContext* context, const wire::EsJob* request,
                                   wire::EsState* response) {
  return Serve(context, "EsLoad", [&] { return worker_.EsLoad(*request); }, response);
}

grpc::Status WorkerService::EsEvaluate(grpc::ServerContext* context,
                                       const wire::EsEvaluateRequest* request,
                                       wire::EsEvaluateResponse* response) {
  return Serve(context, "EsEvaluate", [&] { return worker_.EsEvaluate(*request); }, response);
}

grpc::Status WorkerService::EsUpdate(grpc::ServerContext* context,
                                     const wire::EsUpdateRequest* request,
                                     wire::EsState* response) {
  return Serve(context, "EsUpdate", [&] { return worker_.EsUpdate(*request); }, response);
}

grpc::Status WorkerService::EsRelease(grpc::ServerContext* context,
                                      const wire::EsReleaseRequest* request,
                                      wire::EsState* response) {
  return Serve(context, "EsRelease", [&] { return worker_.EsRelease(*request); }, response);
}

grpc::Status WorkerService::EsForward(grpc::ServerContext* context,
                                      const wire::EsForwardRequest* request,
                                      wire::EsForwardResponse* response) {
  return Serve(context, "EsForward", [&] { return worker_.EsForward(*request); }, response);
}

grpc::Status WorkerService::EsSnapshot(grpc::ServerContext* context,
                                       const wire::EsSnapshotRequest* request,
                                       grpc::ServerWriter<wire::EsSnapshotChunk>* writer) {
  wire::EsSnapshotChunk whole;
  if (grpc::Status s = Serve(context, "EsSnapshot", [&] { return worker_.EsSnapshot(*request); },
                             &whole);
      !s.ok()) {
    return s;
  }
  // Chunks of at most 1 MiB: a full-mode snapshot can exceed any message limit.
  constexpr size_t kChunk = 1 << 20;
  const std::string& data = whole.data();
  for (size_t at = 0; at == 0 || at < data.size(); at += kChunk) {
    wire::EsSnapshotChunk chunk;
    if (at == 0) {
      chunk.set_file_name(whole.file_name());
      chunk.set_generation(whole.generation());
    }
    chunk.set_data(data.substr(at, kChunk));
    if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "reader gone");
  }
  return grpc::Status::OK;
}

std::unique_ptr<WorkerClient> MakeGrpcWorkerClient(const std::string& address,
                                                   const ClusterCredentials& credentials,
                                                   const WorkerDeadlines& deadlines) {
  return std::make_unique<GrpcWorkerClient>(address, credentials, deadlines);
}

}  // namespace fucina
