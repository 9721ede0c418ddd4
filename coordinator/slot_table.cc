#include "coordinator/slot_table.h"

#include <algorithm>

namespace fucina {
namespace {

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

void AddRelease(uint64_t session, SessionOpList* ops) {
  ops->emplace_back().mutable_release()->set_session_id(session);
}

}  // namespace

void SlotTable::Reset(int capacity) {
  slots_.clear();
  draining_.clear();
  copy_source_.clear();
  capacity_ = capacity;
}

void SlotTable::Erase(Slot* slot, SessionOpList* ops) {
  auto it = std::find_if(slots_.begin(), slots_.end(),
                         [slot](const std::unique_ptr<Slot>& s) { return s.get() == slot; });
  std::unique_ptr<Slot> owned = std::move(*it);
  slots_.erase(it);
  if (owned->readers > 0) {
    draining_.push_back(std::move(owned));  // released once the copies reading it are answered
  } else {
    AddRelease(owned->id, ops);
  }
}

void SlotTable::Release(Slot* slot, SessionOpList* ops) {
  if (slot != nullptr) Erase(slot, ops);
}

void SlotTable::Done(Slot* slot) {
  slot->busy = false;
  slot->last_used = ++clock_;
}

void SlotTable::CopyAnswered(uint64_t to, SessionOpList* ops) {
  auto source = copy_source_.find(to);
  if (source == copy_source_.end()) return;
  Slot* from = source->second;
  copy_source_.erase(source);
  for (auto& s : slots_) {
    if (s->id == to) s->copying = false;
  }
  if (--from->readers > 0) return;
  auto draining = std::find_if(draining_.begin(), draining_.end(),
                               [from](const std::unique_ptr<Slot>& s) { return s.get() == from; });
  if (draining != draining_.end()) {
    AddRelease(from->id, ops);
    draining_.erase(draining);
  }
}

SlotTable::Slot* SlotTable::Acquire(const std::vector<int32_t>& prompt, int64_t* cached,
                                    SessionOpList* ops) {
  // The longest common prefix among resident slots, an idle one preferred on ties. A slot a
  // copy is still filling is no source: the copy out of it could reach a stage first.
  Slot* best = nullptr;
  size_t best_len = 0;
  for (auto& s : slots_) {
    if (s->copying) continue;
    const size_t n = std::min(CommonPrefix(s->tokens, prompt), prompt.size() - 1);
    if (n > best_len || (n == best_len && best != nullptr && !s->busy && best->busy)) {
      best = s.get();
      best_len = n;
    }
  }
  if (best_len == 0) best = nullptr;

  Slot* slot = nullptr;
  if (best != nullptr && !best->busy && best->readers == 0) {
    slot = best;  // take the slot over, dropping what it holds past the common prefix
    if (slot->tokens.size() > best_len) {
      wire::TruncateSession* t = ops->emplace_back().mutable_truncate();
      t->set_session_id(slot->id);
      t->set_length(static_cast<int64_t>(best_len));
    }
  } else {
    // A fresh session: evict the least recently used idle slot when full (the released ones
    // that copies still read count: the stages hold them).
    if (static_cast<int>(slots_.size() + draining_.size()) >= capacity_) {
      Slot* lru = nullptr;
      for (auto& s : slots_) {
        if (!s->busy && s->readers == 0 && s.get() != best &&
            (lru == nullptr || s->last_used < lru->last_used)) {
          lru = s.get();
        }
      }
      if (lru == nullptr) return nullptr;  // every slot busy or read (or the source): wait
      Erase(lru, ops);
    }
    auto fresh = std::make_unique<Slot>();
    fresh->id = next_id_++;
    slot = fresh.get();
    slots_.push_back(std::move(fresh));
    if (best != nullptr) {
      // Another request is using the prefix (or a copy reads it): copy its rows, the ones the
      // table knows every stage holds; a step in flight only appends after them.
      wire::CopyPrefix* copy = ops->emplace_back().mutable_copy_prefix();
      copy->set_from_session(best->id);
      copy->set_to_session(slot->id);
      copy->set_length(static_cast<int64_t>(best_len));
      ++best->readers;
      copy_source_[slot->id] = best;
      slot->copying = true;
      slot->tokens.assign(prompt.begin(), prompt.begin() + best_len);
    }
  }
  slot->tokens.resize(best_len);
  slot->busy = true;
  slot->last_used = ++clock_;
  *cached = static_cast<int64_t>(best_len);
  return slot;
}

}  // namespace fucina
