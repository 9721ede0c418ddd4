// The worker registry on its own: ids, heartbeats and their load, a restarted worker replacing
// its record, the last failure, and the watcher declaring a silent remote worker dead.
#include "coordinator/worker_registry.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/worker/fake_worker_client.h"

namespace fucina {
namespace {

TEST(WorkerRegistryTest, WorkersJoinHeartbeatAndAreForgotten) {
  WorkerRegistry registry(/*heartbeat_ms=*/60'000, /*dead_after_ms=*/60'000, nullptr,
                          [](const std::string&, const absl::Status&) {});
  auto client = std::make_shared<FakeWorkerClient>();
  const std::string a = registry.Enroll("10.0.0.1:7000", WorkerInfo{"", 4, 0}, client, "cpu");
  const std::string b = registry.Enroll("", WorkerInfo{"", 2, 0}, client, "cuda");
  EXPECT_EQ(a, "w0");
  EXPECT_EQ(b, "w1");
  EXPECT_EQ(registry.ClientFor(a), client);
  EXPECT_EQ(registry.AddressOf(a), "10.0.0.1:7000");
  wire::WorkerStats stats;
  stats.set_sessions(3);
  stats.add_session_ids(7);  // per-session lists are not kept
  EXPECT_TRUE(registry.Heartbeat(a, &stats));
  EXPECT_FALSE(registry.Heartbeat("w9", nullptr));
  std::vector<WorkerRecord> workers = registry.Workers();
  ASSERT_EQ(workers.size(), 2u);
  ASSERT_TRUE(workers[0].stats.has_value());
  EXPECT_EQ(workers[0].stats->sessions(), 3);
  EXPECT_EQ(workers[0].stats->session_ids_size(), 0);
  EXPECT_EQ(workers[1].device, "cuda");

  EXPECT_TRUE(registry.Forget(a, absl::UnavailableError("connection refused")));
  EXPECT_FALSE(registry.Forget(a, absl::UnavailableError("again")));  // already dead
  EXPECT_FALSE(registry.Heartbeat(a, nullptr));  // it must register again
  EXPECT_EQ(registry.last_failure(), "worker w0 failed: connection refused");
  ASSERT_EQ(registry.Alive().size(), 1u);
  EXPECT_EQ(registry.Alive()[0].id, b);
  // Registering again at the same address replaces the dead record under a new id.
  const std::string again = registry.Enroll("10.0.0.1:7000", WorkerInfo{"", 4, 0}, client, "cpu");
  EXPECT_EQ(again, "w2");
  EXPECT_EQ(registry.Workers().size(), 2u);
  EXPECT_EQ(registry.Alive().size(), 2u);
}

TEST(WorkerRegistryTest, TheWatcherReportsARemoteWorkerThatStopsHeartbeating) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> silent;
  WorkerRegistry registry(/*heartbeat_ms=*/100, /*dead_after_ms=*/200, nullptr,
                          [&](const std::string& id, const absl::Status& why) {
                            EXPECT_TRUE(absl::IsDeadlineExceeded(why)) << why;
                            std::lock_guard<std::mutex> lock(mu);
                            silent.push_back(id);
                            cv.notify_all();
                          });
  auto client = std::make_shared<FakeWorkerClient>();
  const std::string remote = registry.Enroll("10.0.0.2:7000", WorkerInfo{"", 1, 0}, client, "cpu");
  registry.Enroll("", WorkerInfo{"", 1, 0}, client, "cpu");  // in process: never silent
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return !silent.empty(); }));
  // Reported on every pass until someone forgets it; only the remote one.
  for (const std::string& id : silent) EXPECT_EQ(id, remote);
}

}  // namespace
}  // namespace fucina
