// CallScope: what a served call's cancellation reaches. Actions registered in a scope run once
// on Cancel; one registered after runs at once; one unregistered never runs; the current scope
// nests and follows a task posted to a SerialExecutor.
#include "worker/call_scope.h"

#include <future>
#include <memory>

#include <gtest/gtest.h>

#include "worker/serial_executor.h"

namespace fucina {
namespace {

TEST(CallScopeTest, CancelRunsEachRegisteredActionOnceAndLaterOnesAtOnce) {
  auto scope = std::make_shared<CallScope>();
  CallScope::Enter enter(scope);
  int first = 0, dropped = 0, late = 0;
  CallScope::Registration a = CallScope::OnCancel([&] { ++first; });
  CallScope::Registration b = CallScope::OnCancel([&] { ++dropped; });
  b.Reset();  // the call ended: its action must never run
  EXPECT_FALSE(scope->cancelled());
  scope->Cancel();
  scope->Cancel();
  EXPECT_TRUE(scope->cancelled());
  EXPECT_EQ(first, 1);
  EXPECT_EQ(dropped, 0);
  CallScope::Registration c = CallScope::OnCancel([&] { ++late; });  // a call started after
  EXPECT_EQ(late, 1);
}

TEST(CallScopeTest, OutsideAnyScopeNothingIsRegistered) {
  ASSERT_EQ(CallScope::Current(), nullptr);
  int ran = 0;
  CallScope::Registration r = CallScope::OnCancel([&] { ++ran; });
  EXPECT_EQ(ran, 0);
}

TEST(CallScopeTest, ScopesNestAndFollowPostedTasks) {
  auto outer = std::make_shared<CallScope>(), inner = std::make_shared<CallScope>();
  SerialExecutor executor;
  std::promise<CallScope*> seen;
  {
    CallScope::Enter a(outer);
    {
      CallScope::Enter b(inner);
      EXPECT_EQ(CallScope::Current(), inner);
      executor.Post([&] { seen.set_value(CallScope::Current().get()); });
    }
    EXPECT_EQ(CallScope::Current(), outer);
  }
  EXPECT_EQ(CallScope::Current(), nullptr);
  EXPECT_EQ(seen.get_future().get(), inner.get());
  // The executor's thread is left in no scope once the task is done.
  std::promise<CallScope*> after;
  executor.Post([&] { after.set_value(CallScope::Current().get()); });
  EXPECT_EQ(after.get_future().get(), nullptr);
}

}  // namespace
}  // namespace fucina
