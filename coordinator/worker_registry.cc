#include "coordinator/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "models/log/log.h"

namespace fucina {

WorkerRegistry::WorkerRegistry(int heartbeat_ms, int dead_after_ms, Metrics* metrics,
                               SilentHook on_silent)
    : heartbeat_ms_(heartbeat_ms),
      dead_after_ms_(dead_after_ms),
      metrics_(metrics),
      on_silent_(std::move(on_silent)),
      watcher_([this] { Watch(); }) {}

WorkerRegistry::~WorkerRegistry() { Stop(); }

void WorkerRegistry::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

std::string WorkerRegistry::Enroll(const std::string& address, const WorkerInfo& info,
                                   std::shared_ptr<WorkerClient> client,
                                   const std::string& device) {
  std::lock_guard<std::mutex> lock(mu_);
  // A worker restarted at the same address replaces its dead (or stale) record.
  if (!address.empty()) {
    std::erase_if(workers_, [&](const WorkerRecord& w) { return w.address == address; });
  }
  WorkerRecord w;
  w.id = absl::StrCat("w", next_id_++);
  w.address = address;
  w.info = info;
  w.info.id = w.id;
  w.device = device;
  w.client = std::move(client);
  w.last_seen = std::chrono::steady_clock::now();
  std::string id = w.id;
  workers_.push_back(std::move(w));
  CountWorkers();
  return id;
}

void WorkerRegistry::CountWorkers() {
  int alive = 0;
  for (const WorkerRecord& w : workers_) alive += w.alive;
  if (metrics_) metrics_->SetWorkers(alive, static_cast<int>(workers_.size()) - alive);
}

bool WorkerRegistry::Heartbeat(const std::string& worker_id, const wire::WorkerStats* stats) {
  std::lock_guard<std::mutex> lock(mu_);
  for (WorkerRecord& w : workers_) {
    if (w.id == worker_id && w.alive) {
      w.last_seen = std::chrono::steady_clock::now();
      if (stats != nullptr) {
        // Only the totals are kept: the per-session and per-expert lists grow with the load.
        w.stats = *stats;
        w.stats->clear_session_ids();
        w.stats->clear_session_lengths();
        w.stats->clear_expert_token_counts();
        w.stats_at = w.last_seen;
      }
      return true;
    }
  }
  return false;
}

bool WorkerRegistry::Forget(const std::string& worker_id, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  bool changed = false;
  for (WorkerRecord& w : workers_) {
    if (w.id == worker_id && w.alive) {
      w.alive = false;
      changed = true;
      last_failure_ = absl::StrCat("worker ", w.id, " failed: ", why.message());
      FUCINA_LOG(kWarning) << "worker " << w.id << " (" << w.address
                           << ") marked dead: " << why.message();
    }
  }
  CountWorkers();
  return changed;
}

std::shared_ptr<WorkerClient> WorkerRegistry::ClientFor(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const WorkerRecord& w : workers_) {
    if (w.id == worker_id) return w.client;
  }
  return nullptr;
}

std::string WorkerRegistry::AddressOf(const std::string& worker_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const WorkerRecord& w : workers_) {
    if (w.id == worker_id) return w.address;
  }
  return "";
}

std::vector<WorkerRecord> WorkerRegistry::Workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_;
}

std::vector<WorkerRecord> WorkerRegistry::Alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerRecord> alive;
  for (const WorkerRecord& w : workers_) {
    if (w.alive) alive.push_back(w);
  }
  return alive;
}

std::string WorkerRegistry::last_failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_failure_;
}

void WorkerRegistry::Watch() {
  const auto period = std::chrono::milliseconds(std::max(50, heartbeat_ms_ / 2));
  std::unique_lock<std::mutex> lock(mu_);
  auto last_pass = std::chrono::steady_clock::now();
  while (!stopping_) {
    cv_.wait_for(lock, period);
    if (stopping_) break;
    const auto now = std::chrono::steady_clock::now();
    // Liveness counts only the time this process ran: a pass far later than its period means
    // the coordinator itself did not run (stopped, suspended, starved), and the heartbeats of
    // that time could not be read. The gap beyond two periods is forgiven to every worker, so
    // on waking it does not declare dead the workers it was the one not listening to.
    const auto stalled = now - last_pass - 2 * period;
    last_pass = now;
    if (stalled > std::chrono::steady_clock::duration::zero()) {
      for (WorkerRecord& w : workers_) w.last_seen = std::min(now, w.last_seen + stalled);
      FUCINA_LOG(kWarning)
          << "heartbeat watcher: this process did not run for "
          << std::chrono::duration_cast<std::chrono::milliseconds>(stalled).count()
          << " ms; workers' silence of that time is not counted";
    }
    std::vector<std::string> silent;
    for (const WorkerRecord& w : workers_) {
      if (w.alive && !w.address.empty() &&
          now - w.last_seen > std::chrono::milliseconds(dead_after_ms_)) {
        silent.push_back(w.id);
      }
    }
    lock.unlock();
    for (const std::string& id : silent) {
      on_silent_(id, absl::DeadlineExceededError("no heartbeat"));
    }
    lock.lock();
  }
}

}  // namespace fucina
