#include "coordinator/slot_table.h"

#include <algorithm>

namespace fucina {
namespace {

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace

void SlotTable::Reset(int capacity) {
  slots_.clear();
  capacity_ = capacity;
}

void SlotTable::Erase(Slot* slot) {
  const uint64_t id = slot->id;
  std::erase_if(slots_, [slot](const std::unique_ptr<Slot>& s) { return s.get() == slot; });
  ops_.Release(id);
}

void SlotTable::Release(Slot* slot) {
  if (slot != nullptr) Erase(slot);
}

void SlotTable::Done(Slot* slot) {
  slot->busy = false;
  slot->last_used = ++clock_;
}

SlotTable::Slot* SlotTable::Acquire(const std::vector<int32_t>& prompt, int64_t* cached) {
  // The longest common prefix among resident slots, an idle one preferred on ties.
  Slot* best = nullptr;
  size_t best_len = 0;
  for (auto& s : slots_) {
    const size_t n = std::min(CommonPrefix(s->tokens, prompt), prompt.size() - 1);
    if (n > best_len || (n == best_len && best != nullptr && !s->busy && best->busy)) {
      best = s.get();
      best_len = n;
    }
  }
  if (best_len == 0) best = nullptr;

  Slot* slot = nullptr;
  if (best != nullptr && !best->busy) {
    slot = best;  // take the slot over, dropping what it holds past the common prefix
    if (slot->tokens.size() > best_len &&
        !ops_.Truncate(slot->id, static_cast<int64_t>(best_len)).ok()) {
      Erase(slot);
      slot = best = nullptr;
      best_len = 0;
    }
  }
  if (slot == nullptr) {
    // A fresh session: evict the least recently used idle slot when full.
    if (static_cast<int>(slots_.size()) >= capacity_) {
      Slot* lru = nullptr;
      for (auto& s : slots_) {
        if (!s->busy && s.get() != best && (lru == nullptr || s->last_used < lru->last_used)) {
          lru = s.get();
        }
      }
      if (lru == nullptr) return nullptr;  // every slot busy (or the one to copy from): wait
      Erase(lru);
    }
    auto fresh = std::make_unique<Slot>();
    fresh->id = next_id_++;
    slot = fresh.get();
    slots_.push_back(std::move(fresh));
    if (best != nullptr) {
      // Another request is using the prefix: copy its rows (the ones the table knows every
      // stage holds; a step in flight only appends after them).
      if (ops_.CopyPrefix(best->id, slot->id, static_cast<int64_t>(best_len)).ok()) {
        slot->tokens.assign(prompt.begin(), prompt.begin() + best_len);
      } else {
        // Stages that did copy hold rows the slot does not claim: start them all empty.
        ops_.Release(slot->id);
        best_len = 0;
      }
    }
  }
  slot->tokens.resize(best_len);
  slot->busy = true;
  slot->last_used = ++clock_;
  *cached = static_cast<int64_t>(best_len);
  return slot;
}

}  // namespace fucina
