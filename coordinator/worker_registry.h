// The workers a coordinator knows: who joined (in process, or at an address), who is alive,
// the load their heartbeats report, and the watcher that declares dead a worker silent for
// longer than `dead_after_ms`. It knows nothing of plans: the coordinator asks it who is alive
// and tells it who failed.
//
// Threading: every method may be called from any thread; `on_silent` runs on the watcher's
// thread, outside the registry's lock.
#ifndef FUCINA_COORDINATOR_WORKER_REGISTRY_H_
#define FUCINA_COORDINATOR_WORKER_REGISTRY_H_

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/metrics.h"
#include "coordinator/placement.h"
#include "worker/worker_client.h"

namespace fucina {

struct WorkerRecord {
  std::string id;
  std::string address;  // empty: in process
  WorkerInfo info;
  std::string device = "cpu";  // as registered: cpu | cuda
  std::shared_ptr<WorkerClient> client;
  bool alive = true;
  std::chrono::steady_clock::time_point last_seen;
  // The load its last heartbeat reported (per-session lists dropped); none before the first.
  std::optional<wire::WorkerStats> stats;
  std::chrono::steady_clock::time_point stats_at;
};

class WorkerRegistry {
 public:
  using SilentHook = std::function<void(const std::string& worker_id, const absl::Status& why)>;

  // `metrics` (may be null) gets the alive and dead counts. The watcher starts at once.
  WorkerRegistry(int heartbeat_ms, int dead_after_ms, Metrics* metrics, SilentHook on_silent);
  ~WorkerRegistry();
  // Joins the watcher; `on_silent` is not called afterwards.
  void Stop();

  // A worker joins; returns its id (w0, w1, ...). A worker at the address of an earlier one
  // (restarted) replaces its record.
  std::string Enroll(const std::string& address, const WorkerInfo& info,
                     std::shared_ptr<WorkerClient> client, const std::string& device);
  // False when the id is unknown or was declared dead (the worker should register again).
  // `stats` (optional) is the worker's load.
  bool Heartbeat(const std::string& worker_id, const wire::WorkerStats* stats);
  // Marks a worker dead; true if it was alive. `why` becomes the last failure.
  bool Forget(const std::string& worker_id, const absl::Status& why);

  std::shared_ptr<WorkerClient> ClientFor(const std::string& worker_id) const;
  std::string AddressOf(const std::string& worker_id) const;
  std::vector<WorkerRecord> Workers() const;
  std::vector<WorkerRecord> Alive() const;
  // Why the last worker was declared dead ("" before any).
  std::string last_failure() const;

 private:
  void CountWorkers();  // under mu_
  void Watch();

  const int heartbeat_ms_;
  const int dead_after_ms_;
  Metrics* metrics_;
  SilentHook on_silent_;
  mutable std::mutex mu_;  // everything below
  std::condition_variable cv_;
  std::vector<WorkerRecord> workers_;
  std::string last_failure_;
  int next_id_ = 0;
  bool stopping_ = false;
  std::thread watcher_;  // last
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_WORKER_REGISTRY_H_
