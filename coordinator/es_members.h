// One generation's members over the replicas of an evolution-strategies train job: one queue,
// and each replica takes the next member as soon as it is free (one member per call), so a
// worker with more cores takes more members. Each reply starts its replica's next member from
// the reply's own callback: no thread waits on a call, however many replicas there are.
//
// A member whose worker failed goes back to the front of the queue (it runs again elsewhere,
// from its seed) and its replica takes no more members; any other failure, or a member that
// failed on `max_attempts` replicas, fails the generation.
#ifndef FUCINA_COORDINATOR_ES_MEMBERS_H_
#define FUCINA_COORDINATOR_ES_MEMBERS_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/worker_client.h"

namespace fucina {

// A member scored: its fitness, the worker's own seconds, and the call's wall seconds.
struct EsScored {
  float fitness = 0.0f;
  double worker_seconds = 0.0;
  double wall_seconds = 0.0;
};

class EsMemberQueue {
 public:
  // Starts member `member`'s scoring on `replica`; `done` runs once with the outcome.
  using Score = std::function<void(const std::string& replica, int member,
                                   Callback<EsScored> done)>;
  // What the driver counts per member, called from the callbacks (under no lock of ours).
  struct Hooks {
    std::function<void(const EsScored&)> on_member;
    std::function<void()> on_retried;
  };

  EsMemberQueue(int population, int max_attempts, int64_t generation, Hooks hooks);

  // Runs the queued members on `replicas` until the queue is empty, the generation fails, or
  // `stop` is set (checked between members); returns the replicas whose worker failed, with
  // the error (their members are queued again).
  std::vector<std::pair<std::string, absl::Status>> RunOn(const std::vector<std::string>& replicas,
                                                          const Score& score,
                                                          const std::atomic<bool>& stop);

  bool finished() const;  // every member scored
  absl::Status error() const;
  std::vector<float> fitness() const;
  int done() const;
  int retried() const;
  // Summed over members: call time not spent on the worker.
  double overhead() const;

 private:
  struct State;
  // Takes `replica`'s next member and starts it, or retires the replica.
  static void Next(const std::shared_ptr<State>& state, const std::string& replica);

  std::shared_ptr<State> state_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_ES_MEMBERS_H_
