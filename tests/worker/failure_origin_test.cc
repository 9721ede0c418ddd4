// Where a failed call's error arose (worker/worker_client.h: FailureOrigin): a request-level
// failure on the last stage ends only its request and never reads as a worker's failure, in
// process and over gRPC, whatever its status code; transport failures and the failures a worker
// declares do.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "tests/worker/fake_worker_client.h"
#include "models/engine/fixture.h"
#include "tests/worker/fixture_model.h"
#include "worker/cluster_auth.h"
#include "worker/forward_reply.h"
#include "worker/worker_actor.h"
#include "worker/worker_service.h"

namespace fucina {
namespace {

constexpr char kToken[] = "failure-origin-test-token-0123456789";

class FailureOriginTest : public FixtureModelTest {
 protected:
  static void SetUpTestSuite() { MakeModel("failure_origin"); }
  static void TearDownTestSuite() { RemoveModel(); }

  // A sampled segment whose grammar the last stage cannot compile (an unbalanced regex).
  static wire::Segment BadGrammar(uint64_t session) {
    wire::Segment s = Seg(session, 0, {5, 6, 7});
    s.mutable_sampling()->set_grammar_kind("regex");
    s.mutable_sampling()->set_grammar("([a-z");
    return s;
  }
};

TEST(FailureOriginMarks, SurviveCopiesAndOverrideTheCode) {
  const absl::Status request = RequestFailure(absl::FailedPreconditionError("ring refuses"));
  absl::StatusOr<int> carried = request;
  EXPECT_EQ(FailureOriginOf(carried.status()), FailureOrigin::kRequest);
  EXPECT_FALSE(IsWorkerFailure(carried.status()));
  EXPECT_TRUE(IsWorkerFailure(WorkerDeclaredFailure(absl::InvalidArgumentError("lost shard"))));
  EXPECT_EQ(FailureOriginOf(WithFailureOrigin(absl::AbortedError("x"), FailureOrigin::kTransport)),
            FailureOrigin::kTransport);
  // A non-finite fitness, as a train replica should report it.
  EXPECT_FALSE(IsWorkerFailure(RequestFailure(absl::InternalError("fitness is not finite"))));
  // Unmarked: by code, as before the marks.
  EXPECT_EQ(FailureOriginOf(absl::UnavailableError("gone")), FailureOrigin::kTransport);
  EXPECT_EQ(FailureOriginOf(absl::DataLossError("file")), FailureOrigin::kWorker);
  EXPECT_EQ(FailureOriginOf(absl::InvalidArgumentError("bad")), FailureOrigin::kRequest);
  EXPECT_FALSE(IsWorkerFailure(absl::OkStatus()));
  EXPECT_TRUE(RequestFailure(absl::OkStatus()).ok());
}

TEST_F(FailureOriginTest, AGrammarFailingOnTheLastStageFailsOnlyItsRequest) {
  std::shared_ptr<WorkerActor> last;
  WorkerActor first({.threads = 1}, [&](const wire::Peer&) { return last; });
  last = std::make_shared<WorkerActor>(WorkerOptions{.threads = 1});
  {
    wire::LoadShardRequest with_next = Shard(0, 0, 2, true, false);
    with_next.mutable_next_stage()->set_worker_id("s1");
    ASSERT_TRUE(first.LoadShard(with_next).ok());
  }
  ASSERT_TRUE(last->LoadShard(Shard(1, 2, 4, false, true)).ok());

  // Every segment of the step fails on the last stage: the call succeeds with one error per
  // segment and no chain failure (which would make the coordinator declare the stage dead).
  wire::ForwardRequest all_bad;
  *all_bad.add_segments() = BadGrammar(1);
  *all_bad.add_segments() = BadGrammar(2);
  auto reply = first.Forward(all_bad);
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(reply->has_chain_failure()) << reply->DebugString();
  ASSERT_EQ(reply->errors_size(), 2) << reply->DebugString();
  EXPECT_EQ(reply->errors(0).index(), 0);
  EXPECT_EQ(reply->errors(1).index(), 1);
  // The grammar's own message, as the client will read it: no session id, no engine prefix.
  EXPECT_NE(reply->errors(0).message().find("regex"), std::string::npos)
      << reply->errors(0).message();
  EXPECT_EQ(reply->errors(0).message().find("session"), std::string::npos)
      << reply->errors(0).message();
  EXPECT_EQ(reply->results_size(), 0);

  // The same on the last stage alone, as its own caller sees it.
  wire::ForwardRequest direct;
  direct.set_stage(1);
  *direct.add_segments() = BadGrammar(3);
  wire::ForwardRequest embed;
  *embed.add_segments() = BadGrammar(3);
  {
    // Rows for the last stage: the first stage's output of the same tokens.
    WorkerActor alone({.threads = 1});
    ASSERT_TRUE(alone.LoadShard(Shard(0, 0, 2, true, false)).ok());
    auto rows = alone.Forward(embed);
    ASSERT_TRUE(rows.ok()) << rows.status();
    *direct.mutable_activations() = rows->activations();
  }
  auto own = last->Forward(direct);
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_EQ(own->errors_size(), 1);

  // The stages still serve: a good request next to a bad one gets its sample.
  wire::ForwardRequest mixed;
  *mixed.add_segments() = BadGrammar(4);
  *mixed.add_segments() = Seg(5, 0, {8, 9});
  auto later = first.Forward(mixed);
  ASSERT_TRUE(later.ok()) << later.status();
  ASSERT_EQ(later->errors_size(), 1);
  EXPECT_EQ(later->errors(0).index(), 0);
  ASSERT_EQ(later->results_size(), 1);
  EXPECT_EQ(later->results(0).session_id(), 5u);
}

TEST_F(FailureOriginTest, ARollbackTheRingRefusesFailsOnlyItsRequest) {
  // A sliding-window model: a session past its window cannot drop back to its start.
  const std::string path = testing::TempDir() + "/failure_origin_swa_" +
                           std::to_string(getpid()) + ".gguf";
  FixtureOptions o;
  o.arch = "gemma4";
  o.num_layers = 3;
  o.sliding_window = 16;
  {
    ThreadPool pool(1);
    ASSERT_TRUE(MakeFixture(o, path, pool).ok());
  }
  WorkerActor w({.threads = 1});
  wire::LoadShardRequest shard = Shard(0, 0, 3, true, true);
  shard.set_model_path(path);
  shard.set_context(256);  // past the ring (window + kSlidingSlack rows)
  ASSERT_TRUE(w.LoadShard(shard).ok());
  std::vector<int32_t> ids(200, 7);
  wire::ForwardRequest fill;
  *fill.add_segments() = Seg(1, 0, ids);
  ASSERT_TRUE(w.Forward(fill).ok());
  wire::ForwardRequest back;
  *back.add_segments() = Seg(1, 2, {9});
  auto reply = w.Forward(back);
  std::remove(path.c_str());
  // Not a failed call (FAILED_PRECONDITION as the call's status read as the worker's failure).
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->errors_size(), 1);
  EXPECT_EQ(reply->errors(0).code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_NE(reply->errors(0).message().find("sliding-window"), std::string::npos);
}

// A worker answering every call with a scripted failure.
class FailingWorker : public FakeWorkerClient {
 public:
  void ForwardAsync(wire::ForwardRequest, ForwardCallback done) override {
    done(RequestFailure(absl::FailedPreconditionError("the token table is not ready")));
  }
  void ExpertForwardAsync(wire::ExpertForwardRequest,
                          Callback<wire::ExpertForwardResponse> done) override {
    done(WorkerDeclaredFailure(absl::InvalidArgumentError("this worker lost its shard")));
  }
  void GetStatsAsync(Callback<wire::WorkerStats> done) override {
    done(absl::InternalError("unmarked"));
  }
};

// `worker` behind a real WorkerService on an ephemeral loopback port (0 if it failed to start),
// admitting the cluster token kToken.
struct Served {
  explicit Served(WorkerClient& worker)
      : gate(CallGateOptions{.cluster_token = kToken}), service(worker, gate) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Served() {
    if (server == nullptr) return;
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
  std::unique_ptr<WorkerClient> Client() const {
    return MakeGrpcWorkerClient("127.0.0.1:" + std::to_string(port),
                                MakeClusterCredentials(std::nullopt, kToken));
  }

  CallGate gate;
  WorkerService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(FailureOriginOverGrpc, TheWorkersMarkTravelsAndTransportFailuresAreTheWorkers) {
  FailingWorker worker;
  Served served(worker);
  ASSERT_NE(served.port, 0);
  const int port = served.port;
  std::unique_ptr<grpc::Server>& server = served.server;
  auto client = served.Client();

  auto forward = client->Forward(wire::ForwardRequest());
  EXPECT_TRUE(absl::IsFailedPrecondition(forward.status())) << forward.status();
  EXPECT_EQ(FailureOriginOf(forward.status()), FailureOrigin::kRequest);
  EXPECT_FALSE(IsWorkerFailure(forward.status()));
  // The chained path: a stage before this one passes a request failure on, not a chain failure.
  auto merged = MergeChainReply(wire::ForwardResponse(), {0}, "s1", forward.status());
  EXPECT_FALSE(merged.ok());
  EXPECT_FALSE(IsWorkerFailure(merged.status()));

  auto experts = client->ExpertForward(wire::ExpertForwardRequest());
  EXPECT_TRUE(absl::IsInvalidArgument(experts.status())) << experts.status();
  EXPECT_EQ(FailureOriginOf(experts.status()), FailureOrigin::kWorker);

  auto stats = client->GetStats();
  EXPECT_EQ(FailureOriginOf(stats.status()), FailureOrigin::kWorker) << stats.status();

  // Refused by the gate (a wrong token): about the caller, not the worker.
  auto refused = MakeGrpcWorkerClient("127.0.0.1:" + std::to_string(port),
                                      MakeClusterCredentials(std::nullopt, "wrong"))
                     ->Forward(wire::ForwardRequest());
  EXPECT_FALSE(IsWorkerFailure(refused.status())) << refused.status();

  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server.reset();
  auto gone = client->Forward(wire::ForwardRequest());
  EXPECT_TRUE(absl::IsUnavailable(gone.status())) << gone.status();
  EXPECT_EQ(FailureOriginOf(gone.status()), FailureOrigin::kTransport);
}

// A worker whose train snapshot is `data` (2.5 MiB: three chunks of the stream), or NOT_FOUND
// for another job.
class SnapshotWorker : public FakeWorkerClient {
 public:
  explicit SnapshotWorker(std::string data) : data_(std::move(data)) {}
  void EsSnapshotAsync(wire::EsSnapshotRequest request,
                       Callback<wire::EsSnapshotChunk> done) override {
    if (request.job_id() != "job") return done(absl::NotFoundError("no train job"));
    wire::EsSnapshotChunk whole;
    whole.set_file_name("adapters.gguf");
    whole.set_generation(7);
    whole.set_data(data_);
    done(std::move(whole));
  }

 private:
  const std::string data_;
};

TEST(SnapshotOverGrpc, ChunksAreJoinedAndMoreThanTheBoundIsRefused) {
  std::string data(5 << 19, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 % 251);
  SnapshotWorker worker(data);
  Served served(worker);
  ASSERT_NE(served.port, 0);
  auto client = served.Client();
  wire::EsSnapshotRequest request;
  request.set_job_id("job");
  request.set_max_bytes(static_cast<int64_t>(data.size()));
  auto whole = client->EsSnapshot(request);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->file_name(), "adapters.gguf");
  EXPECT_EQ(whole->generation(), 7);
  EXPECT_TRUE(whole->data() == data);
  // A worker sending more than the values' size: refused naming the bound, not buffered.
  request.set_max_bytes(static_cast<int64_t>(data.size()) - 1);
  auto big = client->EsSnapshot(request);
  EXPECT_TRUE(absl::IsResourceExhausted(big.status())) << big.status();
  EXPECT_NE(big.status().message().find(std::to_string(data.size() - 1)), std::string::npos)
      << big.status();
  request.set_job_id("other");
  auto missing = client->EsSnapshot(request);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
}

}  // namespace
}  // namespace fucina
