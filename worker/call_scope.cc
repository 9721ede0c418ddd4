#include "worker/call_scope.h"

#include <utility>

namespace fucina {
namespace {

thread_local std::shared_ptr<CallScope> current_scope;

}  // namespace

const std::shared_ptr<CallScope>& CallScope::Current() { return current_scope; }

CallScope::Enter::Enter(std::shared_ptr<CallScope> scope)
    : previous_(std::exchange(current_scope, std::move(scope))) {}

CallScope::Enter::~Enter() { current_scope = std::move(previous_); }

CallScope::Registration::Registration(Registration&& other) noexcept
    : scope_(std::move(other.scope_)), id_(std::exchange(other.id_, 0)) {}

CallScope::Registration& CallScope::Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    Reset();
    scope_ = std::move(other.scope_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void CallScope::Registration::Reset() {
  if (scope_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(scope_->mu_);  // waits out a Cancel running the action
    scope_->actions_.erase(id_);
  }
  scope_.reset();
  id_ = 0;
}

CallScope::Registration CallScope::OnCancel(std::function<void()> cancel) {
  const std::shared_ptr<CallScope>& scope = Current();
  if (scope == nullptr) return Registration();
  {
    std::lock_guard<std::mutex> lock(scope->mu_);
    if (!scope->cancelled_) {
      const uint64_t id = scope->next_id_++;
      scope->actions_.emplace(id, std::move(cancel));
      return Registration(scope, id);
    }
  }
  cancel();
  return Registration();
}

void CallScope::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return;
  cancelled_ = true;
  for (auto& [id, cancel] : actions_) cancel();
  actions_.clear();
}

bool CallScope::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

}  // namespace fucina
