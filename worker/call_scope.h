// The peer calls a worker makes for one call it serves, so that cancelling that call (its
// client gave up, or its deadline passed) cuts those calls and no other call's: two
// micro-batches in flight on a stage each hold a next-stage call, and the caller giving up on
// one must leave the other's running.
//
// A served call's scope is current on the thread that handles it (CallScope::Enter); the
// actor's SerialExecutor carries the poster's scope into each task, so a peer call started on
// the call's behalf, on whichever thread, registers how to cut it (OnCancel) until it ends.
#ifndef FUCINA_WORKER_CALL_SCOPE_H_
#define FUCINA_WORKER_CALL_SCOPE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"

namespace fucina {

class CallScope {
 public:
  // The scope current on this thread; null outside any served call.
  static const std::shared_ptr<CallScope>& Current();

  // Makes `scope` current on this thread for the object's lifetime (null: none).
  class Enter {
   public:
    explicit Enter(std::shared_ptr<CallScope> scope);
    ~Enter();
    Enter(const Enter&) = delete;
    Enter& operator=(const Enter&) = delete;

   private:
    std::shared_ptr<CallScope> previous_;
  };

  // An action registered by OnCancel. Destroying or resetting it unregisters the action, which
  // then never runs; if Cancel is running it, Reset waits for it to finish, so the action may
  // use what the registration's owner frees right after.
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    ~Registration() { Reset(); }
    void Reset();

   private:
    friend class CallScope;
    Registration(std::shared_ptr<CallScope> scope, uint64_t id)
        : scope_(std::move(scope)), id_(id) {}
    std::shared_ptr<CallScope> scope_;
    uint64_t id_ = 0;
  };

  // Registers `cancel` with the current scope, if there is one. Runs it at once (and registers
  // nothing) when that scope is already cancelled. Actions run under the scope's lock: they
  // must be quick and must not call into the scope (a gRPC TryCancel qualifies).
  static Registration OnCancel(std::function<void()> cancel);

  // Runs every registered action once; actions registered later run at once.
  void Cancel();
  bool cancelled() const;

 private:
  mutable std::mutex mu_;  // cancelled_, next_id_, actions_
  bool cancelled_ = false;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, std::function<void()>> actions_;
};

}  // namespace fucina

#endif  // FUCINA_WORKER_CALL_SCOPE_H_
