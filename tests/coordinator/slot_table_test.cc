// The KV slot table on its own, with the stages' session calls recorded: prefix reuse,
// truncation, copies from busy slots, LRU eviction and what a failed session call leaves.
#include "coordinator/slot_table.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

class Recorder : public SessionOps {
 public:
  absl::Status Truncate(uint64_t session, int64_t length) override {
    calls.push_back(absl::StrCat("truncate ", session, " ", length));
    return fail_next ? absl::UnavailableError("gone") : absl::OkStatus();
  }
  absl::Status CopyPrefix(uint64_t from, uint64_t to, int64_t length) override {
    calls.push_back(absl::StrCat("copy ", from, " ", to, " ", length));
    return fail_next ? absl::UnavailableError("gone") : absl::OkStatus();
  }
  void Release(uint64_t session) override { calls.push_back(absl::StrCat("release ", session)); }

  std::vector<std::string> calls;
  bool fail_next = false;
};

class SlotTableTest : public testing::Test {
 protected:
  // A slot whose stages now hold `tokens` (the driver appends as steps complete).
  SlotTable::Slot* Run(const std::vector<int32_t>& prompt, int64_t* cached) {
    SlotTable::Slot* s = table_.Acquire(prompt, cached);
    if (s != nullptr) s->tokens = prompt;
    return s;
  }

  Recorder ops_;
  SlotTable table_{ops_};
};

TEST_F(SlotTableTest, AFollowUpTurnReusesTheConversationsSlot) {
  table_.Reset(4);
  int64_t cached = -1;
  SlotTable::Slot* first = Run({1, 2, 3, 4}, &cached);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(cached, 0);
  table_.Done(first);
  SlotTable::Slot* again = table_.Acquire({1, 2, 3, 4, 5, 6}, &cached);
  EXPECT_EQ(again, first);
  EXPECT_EQ(cached, 4);
  EXPECT_TRUE(ops_.calls.empty());
}

TEST_F(SlotTableTest, TheLastPromptTokenIsAlwaysRecomputed) {
  table_.Reset(4);
  int64_t cached = -1;
  table_.Done(Run({1, 2, 3}, &cached));
  SlotTable::Slot* s = table_.Acquire({1, 2, 3}, &cached);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(cached, 2);
  EXPECT_EQ(ops_.calls, std::vector<std::string>({absl::StrCat("truncate ", s->id, " 2")}));
  EXPECT_EQ(s->tokens.size(), 2u);
}

TEST_F(SlotTableTest, ABusySlotsPrefixIsCopiedIntoANewSession) {
  table_.Reset(4);
  int64_t cached = -1;
  SlotTable::Slot* busy = Run({7, 8, 9, 10}, &cached);
  SlotTable::Slot* copy = table_.Acquire({7, 8, 9, 11}, &cached);
  ASSERT_NE(copy, nullptr);
  EXPECT_NE(copy, busy);
  EXPECT_EQ(cached, 3);
  EXPECT_EQ(ops_.calls,
            std::vector<std::string>({absl::StrCat("copy ", busy->id, " ", copy->id, " 3")}));
  EXPECT_EQ(copy->tokens, std::vector<int32_t>({7, 8, 9}));
}

TEST_F(SlotTableTest, AFailedCopyStartsTheNewSessionEmpty) {
  table_.Reset(4);
  int64_t cached = -1;
  SlotTable::Slot* busy = Run({7, 8, 9, 10}, &cached);
  ops_.fail_next = true;
  SlotTable::Slot* s = table_.Acquire({7, 8, 9, 11}, &cached);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(cached, 0);
  EXPECT_TRUE(s->tokens.empty());
  EXPECT_EQ(ops_.calls, std::vector<std::string>({absl::StrCat("copy ", busy->id, " ", s->id, " 3"),
                                                   absl::StrCat("release ", s->id)}));
}

TEST_F(SlotTableTest, AFullTableEvictsTheLeastRecentlyUsedIdleSlotOrWaits) {
  table_.Reset(2);
  int64_t cached = -1;
  SlotTable::Slot* a = Run({1, 1}, &cached);
  SlotTable::Slot* b = Run({2, 2}, &cached);
  EXPECT_EQ(table_.Acquire({3, 3}, &cached), nullptr);  // both busy: wait
  const uint64_t a_id = a->id;
  table_.Done(a);
  table_.Done(b);
  SlotTable::Slot* c = Run({3, 3}, &cached);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(ops_.calls, std::vector<std::string>({absl::StrCat("release ", a_id)}));
  EXPECT_EQ(table_.resident(), 2);
}

TEST_F(SlotTableTest, ReleaseFreesTheSessionAndResetForgetsEverySlot) {
  table_.Reset(3);
  int64_t cached = -1;
  SlotTable::Slot* a = Run({1, 2}, &cached);
  const uint64_t id = a->id;
  table_.Release(a);
  EXPECT_EQ(ops_.calls, std::vector<std::string>({absl::StrCat("release ", id)}));
  EXPECT_EQ(table_.resident(), 0);
  table_.Done(Run({4, 5}, &cached));
  table_.Reset(3);
  EXPECT_EQ(table_.resident(), 0);
  SlotTable::Slot* fresh = table_.Acquire({4, 5, 6}, &cached);
  EXPECT_EQ(cached, 0);
  EXPECT_GT(fresh->id, id);  // session ids are never reused
}

}  // namespace
}  // namespace fucina
