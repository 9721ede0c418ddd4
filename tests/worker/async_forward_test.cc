// WorkerClient::ForwardAsync through each implementation: the in-process actor and the gRPC
// client against a real WorkerService on 127.0.0.1 give the synchronous Forward's reply; a call
// to a peer that hangs is cut by CancelInFlight or by destroying the client; and the test
// double that holds calls lets a test choose the order of replies.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "tests/worker/fake_worker_client.h"
#include "tests/worker/fixture_model.h"
#include "worker/call_scope.h"
#include "worker/cluster_auth.h"
#include "worker/grpc_util.h"
#include "worker/sampling_wire.h"
#include "worker/worker_actor.h"
#include "worker/worker_service.h"

namespace fucina {
namespace {

constexpr char kToken[] = "async-forward-test-token-0123456789";
constexpr auto kBound = std::chrono::seconds(10);  // far past any reply, far short of a hang

using Reply = absl::StatusOr<wire::ForwardResponse>;

// A reply delivered through a callback, waited for with a bound; records the thread it came on.
struct Awaited {
  std::promise<Reply> promise;
  std::future<Reply> future = promise.get_future();
  std::thread::id thread;
  ForwardCallback Callback() {
    return [this](Reply r) {
      thread = std::this_thread::get_id();
      promise.set_value(std::move(r));
    };
  }
  bool Arrives(std::chrono::milliseconds within = kBound) {
    return future.wait_for(within) == std::future_status::ready;
  }
};

wire::Segment Greedy(uint64_t session, std::vector<int32_t> ids) {
  wire::Segment s;
  s.set_session_id(session);
  s.set_pos0(0);
  for (int32_t id : ids) s.add_token_ids(id);
  SamplingParams greedy;
  greedy.temperature = 0;
  *s.mutable_sampling() = SamplingToWire(greedy);
  return s;
}

wire::ForwardRequest Request(uint64_t session) {
  wire::ForwardRequest f;
  *f.add_segments() = Greedy(session, {3, 4, 5});
  return f;
}

// A worker serving gRPC on a free loopback port, in front of `worker`.
class Server {
 public:
  explicit Server(WorkerClient& worker)
      : gate_(CallGateOptions{.cluster_token = kToken}), service_(worker, gate_) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  ~Server() { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5)); }
  std::unique_ptr<WorkerClient> Client(const std::string& token = kToken) {
    return MakeGrpcWorkerClient(address_, MakeClusterCredentials(std::nullopt, token));
  }

 private:
  CallGate gate_;
  WorkerService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

// A worker whose Forward hangs (as a stopped process does) until released. Behind a Server,
// it counts the calls whose caller gave up (their CallScope was cancelled) while they hung.
class HangingWorker : public FakeWorkerClient {
 public:
  // Hangs on the calling thread (the service's handler), where the served call's scope is.
  void ForwardAsync(wire::ForwardRequest, ForwardCallback done) override {
    CallScope::Registration cut = CallScope::OnCancel([this] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++cut_;
      }
      cv_.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu_);
    ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return released_; });
    lock.unlock();
    done(wire::ForwardResponse());
  }
  bool WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kBound, [&] { return entered_ >= n; });
  }
  bool WaitCut(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kBound, [&] { return cut_ >= n; });
  }
  int cut() {
    std::lock_guard<std::mutex> lock(mu_);
    return cut_;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0;
  int cut_ = 0;
  bool released_ = false;
};

// An asynchronous Forward its peer hangs on, started; released at the end so the server can
// shut down.
struct HungCall {
  HungCall() { client->ForwardAsync(Request(1), reply.Callback()); }
  ~HungCall() { hung.Release(); }
  bool Started() { return hung.WaitEntered(1); }

  HangingWorker hung;
  Server server{hung};
  std::unique_ptr<WorkerClient> client = server.Client();
  Awaited reply;
};

class AsyncForwardTest : public FixtureModelTest {
 protected:
  static void SetUpTestSuite() { MakeModel("async_forward"); }
  static void TearDownTestSuite() { RemoveModel(); }
  static std::unique_ptr<WorkerActor> LoadedActor() {
    auto actor = std::make_unique<WorkerActor>(WorkerOptions{.threads = 1});
    EXPECT_TRUE(actor->LoadShard(Shard(0, 0, kLayers, true, true)).ok());
    return actor;
  }
};

TEST_F(AsyncForwardTest, TheActorRepliesOnItsExecutorWithForwardsResult) {
  auto actor = LoadedActor();
  auto sync = actor->Forward(Request(1));
  ASSERT_TRUE(sync.ok()) << sync.status();
  Awaited a;
  actor->ForwardAsync(Request(2), a.Callback());
  ASSERT_TRUE(a.Arrives());
  Reply r = a.future.get();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->results_size(), 1);
  EXPECT_EQ(r->results(0).token(), sync->results(0).token());
  EXPECT_EQ(r->results(0).logprob(), sync->results(0).logprob());
  EXPECT_NE(a.thread, std::this_thread::get_id());
  // Errors come back the same way: session 2 now holds 3 positions, so pos0 = 9 is refused
  // (the request's only segment failing: its error in the reply, the call itself succeeds).
  Awaited again;
  wire::ForwardRequest past_the_end = Request(2);
  past_the_end.mutable_segments(0)->set_pos0(9);
  actor->ForwardAsync(past_the_end, again.Callback());
  ASSERT_TRUE(again.Arrives());
  Reply e = again.future.get();
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ(e->errors_size(), 1);
  EXPECT_EQ(e->errors(0).code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(e->errors(0).message().find("session 2"), std::string::npos);
}

TEST_F(AsyncForwardTest, TheGrpcClientRepliesAsTheActorDoes) {
  auto actor = LoadedActor();
  auto reference = LoadedActor()->Forward(Request(1));
  ASSERT_TRUE(reference.ok()) << reference.status();
  Server server(*actor);
  auto client = server.Client();
  Awaited a;
  client->ForwardAsync(Request(1), a.Callback());
  ASSERT_TRUE(a.Arrives());
  Reply r = a.future.get();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->results_size(), 1);
  EXPECT_EQ(r->results(0).token(), reference->results(0).token());
  EXPECT_EQ(r->results(0).logprob(), reference->results(0).logprob());
  EXPECT_NE(a.thread, std::this_thread::get_id());
  // The join token travels with asynchronous calls too: a client without it is refused.
  auto stranger = server.Client("not-the-cluster-token-0123456789");
  Awaited refused;
  stranger->ForwardAsync(Request(3), refused.Callback());
  ASSERT_TRUE(refused.Arrives());
  EXPECT_TRUE(absl::IsUnauthenticated(refused.future.get().status()));
}

TEST_F(AsyncForwardTest, CancelInFlightCutsAnAsynchronousCallToAHungPeer) {
  HungCall call;
  ASSERT_TRUE(call.Started());
  EXPECT_FALSE(call.reply.Arrives(std::chrono::milliseconds(100)));  // it hangs
  const auto t0 = std::chrono::steady_clock::now();
  call.client->CancelInFlight();
  ASSERT_TRUE(call.reply.Arrives(std::chrono::seconds(2)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_TRUE(absl::IsCancelled(call.reply.future.get().status()));
}

TEST_F(AsyncForwardTest, DestroyingTheClientCutsItsCallsAndWaitsForTheirReplies) {
  HungCall call;
  ASSERT_TRUE(call.Started());
  call.client.reset();  // must not leave gRPC a callback into a dead client
  ASSERT_TRUE(call.reply.Arrives(std::chrono::milliseconds(0)));
  EXPECT_TRUE(absl::IsCancelled(call.reply.future.get().status()));
}

TEST_F(AsyncForwardTest, AClosedClientCutsItsCallsAndRefusesNewOnesAtOnce) {
  // What the coordinator does to a worker it declared dead: a re-plan loading a shard on it,
  // or any later call, must not wait for a deadline.
  HungCall call;
  ASSERT_TRUE(call.Started());
  call.client->Close();
  ASSERT_TRUE(call.reply.Arrives(std::chrono::seconds(2)));
  EXPECT_TRUE(absl::IsCancelled(call.reply.future.get().status()));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(absl::IsUnavailable(call.client->GetStats().status()));
  Awaited later;
  call.client->ForwardAsync(Request(2), later.Callback());
  ASSERT_TRUE(later.Arrives(std::chrono::milliseconds(0)));
  EXPECT_TRUE(absl::IsUnavailable(later.future.get().status()));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
}

// Cancelling one served call cuts the peer calls made for it and no other: two calls to a
// stage wait on its next stage, the caller of one gives up; that call's next-stage call is cut,
// and the other's runs on to the next stage's reply. (Every peer call of the stage used to be
// cut, so the other call failed too, naming the next stage.)
TEST_F(AsyncForwardTest, CancellingOneServedCallCutsOnlyItsOwnPeerCalls) {
  HangingWorker next;
  Server next_server(next);
  std::shared_ptr<WorkerClient> next_client = next_server.Client();
  WorkerActor stage({.threads = 1}, [&](const wire::Peer&) { return next_client; });
  wire::LoadShardRequest shard = Shard(0, 0, kLayers / 2, true, false);
  shard.mutable_next_stage()->set_worker_id("next");
  ASSERT_TRUE(stage.LoadShard(shard).ok());
  Server server(stage);
  std::unique_ptr<WorkerClient> a_caller = server.Client(), b_caller = server.Client();
  Awaited a, b;
  a_caller->ForwardAsync(Request(1), a.Callback());
  b_caller->ForwardAsync(Request(2), b.Callback());
  ASSERT_TRUE(next.WaitEntered(2));
  a_caller->CancelInFlight();
  ASSERT_TRUE(a.Arrives());
  EXPECT_TRUE(absl::IsCancelled(a.future.get().status()));
  // Within a poll of each server: the stage cuts A's next-stage call, and the next stage sees
  // that call's caller gone.
  ASSERT_TRUE(next.WaitCut(1));
  EXPECT_FALSE(b.Arrives(std::chrono::milliseconds(10 * WorkerService::kCancelPollMs)));
  EXPECT_EQ(next.cut(), 1);
  next.Release();
  ASSERT_TRUE(b.Arrives());
  Reply r = b.future.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_chain_failure()) << r->chain_failure().message();
}

TEST(HoldingWorkerClient, RepliesArriveInTheOrderTheTestReleasesThem) {
  HoldingWorkerClient w;
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) {
    wire::ForwardRequest f;
    f.set_stage(i);
    w.ForwardAsync(f, [&order, i](Reply r) {
      order.push_back(r.ok() ? i : -i - 1);
    });
  }
  ASSERT_TRUE(w.WaitForCalls(3));
  EXPECT_EQ(w.request(1).stage(), 1);
  EXPECT_TRUE(order.empty());
  EXPECT_TRUE(w.Release(2, wire::ForwardResponse()));
  EXPECT_TRUE(w.Release(0, wire::ForwardResponse()));
  EXPECT_FALSE(w.Release(0, wire::ForwardResponse()));  // answered once only
  w.CancelInFlight();                                   // the one still held fails
  EXPECT_EQ(order, (std::vector<int>{2, 0, -2}));
  // What the fake does not script is refused, naming the call.
  auto stats = w.GetStats();
  EXPECT_TRUE(absl::IsUnimplemented(stats.status()));
  EXPECT_NE(stats.status().message().find("GetStats"), std::string::npos);
}

}  // namespace
}  // namespace fucina
