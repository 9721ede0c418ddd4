// The KV slot table: which sessions every stage holds, with which tokens, and which are in use.
//
// The coordinator owns every session's lifetime; workers free a session only when told to.
// Finished conversations stay resident (LRU, at most `capacity`): a new request takes the
// resident slot sharing its longest token prefix (truncating it), or copies that prefix from a
// busy slot into a new one, and prefills only the rest. Scheduler thread only.
#ifndef FUCINA_COORDINATOR_SLOT_TABLE_H_
#define FUCINA_COORDINATOR_SLOT_TABLE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace fucina {

// What the table asks of every stage holding sessions. A failure leaves the sessions involved
// in an unknown state on some stages; the table then stops relying on them.
class SessionOps {
 public:
  virtual ~SessionOps() = default;
  virtual absl::Status Truncate(uint64_t session, int64_t length) = 0;
  virtual absl::Status CopyPrefix(uint64_t from, uint64_t to, int64_t length) = 0;
  // Best effort: a stage that lost the session (it died) has nothing to free.
  virtual void Release(uint64_t session) = 0;
};

class SlotTable {
 public:
  struct Slot {
    uint64_t id = 0;              // the session id on every stage
    std::vector<int32_t> tokens;  // whose K/V rows every stage holds
    bool busy = false;
    uint64_t last_used = 0;
  };

  explicit SlotTable(SessionOps& ops) : ops_(ops) {}

  // A new plan: the stages hold no session; at most `capacity` from now on.
  void Reset(int capacity);
  // A busy slot for a request with `prompt` (non-empty), holding the longest prefix of it found
  // resident (never the whole prompt: its last token is recomputed so its logits exist);
  // *cached is that prefix's length. Null when every slot is busy (the request waits).
  Slot* Acquire(const std::vector<int32_t>& prompt, int64_t* cached);
  // The request using `slot` ended well: the conversation stays resident for reuse.
  void Done(Slot* slot);
  // Frees the slot's session on every stage (a cancelled or failed request).
  void Release(Slot* slot);

  int resident() const { return static_cast<int>(slots_.size()); }
  int capacity() const { return capacity_; }

 private:
  void Erase(Slot* slot);  // forgets it and releases it on every stage

  SessionOps& ops_;
  int capacity_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  uint64_t next_id_ = 1;  // never reused, across plans too
  uint64_t clock_ = 0;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_SLOT_TABLE_H_
