// The KV slot table: which sessions every stage holds, with which tokens, and which are in use.
//
// The coordinator owns every session's lifetime; workers free a session only when told to.
// Finished conversations stay resident (LRU, at most `capacity`): a new request takes the
// resident slot sharing its longest token prefix (truncating it), or copies that prefix from a
// busy slot into a new one, and prefills only the rest. The table decides; the stages apply
// its decisions in order with the steps (SessionOpList), so deciding never waits on a worker.
// A failed operation fails the request whose session it changes, which then releases it.
// Scheduler thread only.
#ifndef FUCINA_COORDINATOR_SLOT_TABLE_H_
#define FUCINA_COORDINATOR_SLOT_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "worker/worker_client.h"

namespace fucina {

// The session operations the table decides, in order. The driver carries them to every stage
// in the next step of the micro-batch that uses the session (a step applies its operations
// before its rows), so they are ordered with that session's steps without a call of their own.
using SessionOpList = std::vector<wire::SessionOp>;

class SlotTable {
 public:
  struct Slot {
    uint64_t id = 0;              // the session id on every stage
    std::vector<int32_t> tokens;  // whose K/V rows every stage holds (or will, once the
                                  // operations given out for it are applied)
    bool busy = false;
    uint64_t last_used = 0;
    // Copies out of this slot given out and not yet answered: until they are, its rows may
    // not change (no truncation, no eviction) and a release waits for them.
    int readers = 0;
    // A copy into this slot is given out and not yet answered: another copy may not read it
    // (it could reach a stage first).
    bool copying = false;
  };

  // A new plan: the stages hold no session; at most `capacity` from now on.
  void Reset(int capacity);
  // A busy slot for a request with `prompt` (non-empty), holding the longest prefix of it found
  // resident (never the whole prompt: its last token is recomputed so its logits exist);
  // *cached is that prefix's length. The operations that make every stage hold that prefix
  // (an eviction, a truncation, a copy) are appended to `ops`. Null when every slot is busy
  // (the request waits); nothing is appended then.
  Slot* Acquire(const std::vector<int32_t>& prompt, int64_t* cached, SessionOpList* ops);
  // The request using `slot` ended well: the conversation stays resident for reuse.
  void Done(Slot* slot);
  // Frees the slot (a cancelled or failed request): its release is appended to `ops`, or
  // waits for the copies still reading it (CopyAnswered appends it then).
  void Release(Slot* slot, SessionOpList* ops);
  // Every stage has answered the step carrying the copy into session `to` (applied or failed):
  // its source is free to change again. A release the source waited for goes to `ops`.
  void CopyAnswered(uint64_t to, SessionOpList* ops);

  int resident() const { return static_cast<int>(slots_.size()); }
  int capacity() const { return capacity_; }

 private:
  // Forgets `slot`; its release goes to `ops` unless copies still read it.
  void Erase(Slot* slot, SessionOpList* ops);

  int capacity_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  // Released while copies read them: their releases wait for CopyAnswered.
  std::vector<std::unique_ptr<Slot>> draining_;
  absl::flat_hash_map<uint64_t, Slot*> copy_source_;  // by the session copied into
  uint64_t next_id_ = 1;  // never reused, across plans too
  uint64_t clock_ = 0;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_SLOT_TABLE_H_
