#include "coordinator/es_members.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace fucina {

// Shared with the callbacks in flight: the last to finish may outlive RunOn's frame.
struct EsMemberQueue::State {
  int max_attempts;
  int64_t generation;
  Hooks hooks;
  const Score* score = nullptr;             // RunOn's, while it runs
  const std::atomic<bool>* stop = nullptr;  // likewise
  mutable std::mutex mu;
  std::condition_variable idle;
  std::deque<int> queue;
  std::vector<float> fitness;
  std::vector<int> attempts;
  int done = 0;
  int retried = 0;
  double overhead = 0.0;
  absl::Status error;
  int active = 0;  // replicas with a member in flight
  std::vector<std::pair<std::string, absl::Status>> failed;

  // Under `mu`: the replica takes no more members.
  void Retire() {
    if (--active == 0) idle.notify_all();
  }
};

EsMemberQueue::EsMemberQueue(int population, int max_attempts, int64_t generation, Hooks hooks)
    : state_(std::make_shared<State>()) {
  state_->max_attempts = max_attempts;
  state_->generation = generation;
  state_->hooks = std::move(hooks);
  state_->fitness.assign(population, 0.0f);
  state_->attempts.assign(population, 0);
  for (int m = 0; m < population; ++m) state_->queue.push_back(m);
}

void EsMemberQueue::Next(const std::shared_ptr<State>& state, const std::string& replica) {
  int member;
  const Score* score;
  {
    std::lock_guard<std::mutex> lock(state->mu);
    // A stop takes effect between members: the generation is dropped, and the checkpoint
    // holds the one before.
    if (state->queue.empty() || !state->error.ok() || *state->stop) return state->Retire();
    member = state->queue.front();
    state->queue.pop_front();
    ++state->attempts[member];
    score = state->score;
  }
  (*score)(replica, member, [state, replica, member](absl::StatusOr<EsScored> scored) {
    if (scored.ok()) {
      if (state->hooks.on_member) state->hooks.on_member(*scored);
      {
        std::lock_guard<std::mutex> lock(state->mu);
        state->fitness[member] = scored->fitness;
        ++state->done;
        state->overhead += std::max(0.0, scored->wall_seconds - scored->worker_seconds);
      }
      return Next(state, replica);
    }
    const absl::Status& why = scored.status();
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (!IsWorkerFailure(why) || state->attempts[member] >= state->max_attempts) {
        if (state->error.ok()) {
          state->error = absl::Status(why.code(), absl::StrCat("member ", member,
                                                               " of generation ",
                                                               state->generation + 1, ": ",
                                                               why.message()));
        }
        return state->Retire();
      }
      // The worker is gone: the member runs again elsewhere, from its seed.
      state->queue.push_front(member);
      ++state->retried;
      state->failed.emplace_back(replica, why);
    }
    if (state->hooks.on_retried) state->hooks.on_retried();
    std::lock_guard<std::mutex> lock(state->mu);
    state->Retire();
  });
}

std::vector<std::pair<std::string, absl::Status>> EsMemberQueue::RunOn(
    const std::vector<std::string>& replicas, const Score& score,
    const std::atomic<bool>& stop) {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->score = &score;
    state_->stop = &stop;
    state_->active = static_cast<int>(replicas.size());
    state_->failed.clear();
  }
  for (const std::string& replica : replicas) Next(state_, replica);
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->idle.wait(lock, [&] { return state_->active == 0; });
  state_->score = nullptr;
  state_->stop = nullptr;
  return std::move(state_->failed);
}

bool EsMemberQueue::finished() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done == static_cast<int>(state_->fitness.size());
}
absl::Status EsMemberQueue::error() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->error;
}
std::vector<float> EsMemberQueue::fitness() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->fitness;
}
int EsMemberQueue::done() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}
int EsMemberQueue::retried() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->retried;
}
double EsMemberQueue::overhead() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->overhead;
}

}  // namespace fucina
