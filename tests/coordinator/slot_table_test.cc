// The KV slot table on its own, with the session operations it gives out recorded: prefix
// reuse, truncation, copies from busy slots, LRU eviction, and the order a copy imposes on its
// source.
#include "coordinator/slot_table.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

// The operations as text, in order: "truncate S L", "copy F T L", "release S".
std::vector<std::string> Describe(const SessionOpList& ops) {
  std::vector<std::string> out;
  for (const wire::SessionOp& op : ops) {
    if (op.has_truncate()) {
      out.push_back(absl::StrCat("truncate ", op.truncate().session_id(), " ",
                                 op.truncate().length()));
    } else if (op.has_copy_prefix()) {
      const wire::CopyPrefix& c = op.copy_prefix();
      out.push_back(absl::StrCat("copy ", c.from_session(), " ", c.to_session(), " ", c.length()));
    } else if (op.has_release()) {
      out.push_back(absl::StrCat("release ", op.release().session_id()));
    }
  }
  return out;
}

class SlotTableTest : public testing::Test {
 protected:
  // A slot whose stages now hold `tokens` (the driver appends as steps complete).
  SlotTable::Slot* Run(const std::vector<int32_t>& prompt, int64_t* cached) {
    SlotTable::Slot* s = table_.Acquire(prompt, cached, &ops_);
    if (s != nullptr) s->tokens = prompt;
    return s;
  }
  std::vector<std::string> calls() const { return Describe(ops_); }

  SessionOpList ops_;
  SlotTable table_;
};

TEST_F(SlotTableTest, AFollowUpTurnReusesTheConversationsSlot) {
  table_.Reset(4);
  int64_t cached = -1;
  SlotTable::Slot* first = Run({1, 2, 3, 4}, &cached);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(cached, 0);
  table_.Done(first);
  SlotTable::Slot* again = table_.Acquire({1, 2, 3, 4, 5, 6}, &cached, &ops_);
  EXPECT_EQ(again, first);
  EXPECT_EQ(cached, 4);
  EXPECT_TRUE(ops_.empty());
}

TEST_F(SlotTableTest, TheLastPromptTokenIsAlwaysRecomputed) {
  table_.Reset(4);
  int64_t cached = -1;
  table_.Done(Run({1, 2, 3}, &cached));
  SlotTable::Slot* s = table_.Acquire({1, 2, 3}, &cached, &ops_);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(cached, 2);
  EXPECT_EQ(calls(), std::vector<std::string>({absl::StrCat("truncate ", s->id, " 2")}));
  EXPECT_EQ(s->tokens.size(), 2u);
}

TEST_F(SlotTableTest, ABusySlotsPrefixIsCopiedIntoANewSession) {
  table_.Reset(4);
  int64_t cached = -1;
  SlotTable::Slot* busy = Run({7, 8, 9, 10}, &cached);
  SlotTable::Slot* copy = table_.Acquire({7, 8, 9, 11}, &cached, &ops_);
  ASSERT_NE(copy, nullptr);
  EXPECT_NE(copy, busy);
  EXPECT_EQ(cached, 3);
  EXPECT_EQ(calls(),
            std::vector<std::string>({absl::StrCat("copy ", busy->id, " ", copy->id, " 3")}));
  EXPECT_EQ(copy->tokens, std::vector<int32_t>({7, 8, 9}));
}

TEST_F(SlotTableTest, ACopysSourceStaysPutUntilTheCopyIsAnswered) {
  // The copy rides in the new request's step, the source's release in its own group's: until
  // every stage has answered the copy, the source is neither truncated, evicted nor released.
  table_.Reset(3);
  int64_t cached = -1;
  SlotTable::Slot* source = Run({7, 8, 9, 10}, &cached);
  const uint64_t source_id = source->id;
  SlotTable::Slot* copy = table_.Acquire({7, 8, 9, 11}, &cached, &ops_);
  ASSERT_NE(copy, nullptr);
  const uint64_t copy_id = copy->id;
  ops_.clear();
  // A copy still filling is no source itself: a third request copies from the first.
  SlotTable::Slot* third = table_.Acquire({7, 8, 9, 12}, &cached, &ops_);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(calls(), std::vector<std::string>(
                         {absl::StrCat("copy ", source_id, " ", third->id, " 3")}));
  ops_.clear();
  // The source's request fails: its release waits for both copies.
  table_.Release(source, &ops_);
  EXPECT_TRUE(ops_.empty());
  EXPECT_EQ(table_.Acquire({1, 2}, &cached, &ops_), nullptr);  // the stages hold 3 sessions
  table_.CopyAnswered(copy_id, &ops_);
  EXPECT_TRUE(ops_.empty());
  table_.CopyAnswered(third->id, &ops_);
  EXPECT_EQ(calls(), std::vector<std::string>({absl::StrCat("release ", source_id)}));
  ops_.clear();
  EXPECT_NE(table_.Acquire({1, 2}, &cached, &ops_), nullptr);
}

TEST_F(SlotTableTest, AnIdleSourceIsCopiedNotTruncatedWhileACopyReadsIt) {
  table_.Reset(4);
  int64_t cached = -1;
  SlotTable::Slot* source = Run({7, 8, 9, 10}, &cached);
  SlotTable::Slot* copy = table_.Acquire({7, 8, 9, 11}, &cached, &ops_);
  table_.Done(source);
  ops_.clear();
  // Taking the idle source over would truncate it under the copy still reading it.
  SlotTable::Slot* next = table_.Acquire({7, 8, 5}, &cached, &ops_);
  ASSERT_NE(next, nullptr);
  EXPECT_NE(next, source);
  EXPECT_EQ(cached, 2);
  EXPECT_EQ(calls(), std::vector<std::string>(
                         {absl::StrCat("copy ", source->id, " ", next->id, " 2")}));
  table_.CopyAnswered(copy->id, &ops_);
  table_.CopyAnswered(next->id, &ops_);
  table_.Done(next);
  ops_.clear();
  SlotTable::Slot* again = table_.Acquire({7, 8, 9, 10, 1}, &cached, &ops_);
  EXPECT_EQ(again, source);  // read by no copy now: taken over, nothing to truncate
  EXPECT_TRUE(ops_.empty());
}

TEST_F(SlotTableTest, AFullTableEvictsTheLeastRecentlyUsedIdleSlotOrWaits) {
  table_.Reset(2);
  int64_t cached = -1;
  SlotTable::Slot* a = Run({1, 1}, &cached);
  SlotTable::Slot* b = Run({2, 2}, &cached);
  EXPECT_EQ(table_.Acquire({3, 3}, &cached, &ops_), nullptr);  // both busy: wait
  const uint64_t a_id = a->id;
  table_.Done(a);
  table_.Done(b);
  SlotTable::Slot* c = Run({3, 3}, &cached);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(calls(), std::vector<std::string>({absl::StrCat("release ", a_id)}));
  EXPECT_EQ(table_.resident(), 2);
}

TEST_F(SlotTableTest, ReleaseFreesTheSessionAndResetForgetsEverySlot) {
  table_.Reset(3);
  int64_t cached = -1;
  SlotTable::Slot* a = Run({1, 2}, &cached);
  const uint64_t id = a->id;
  table_.Release(a, &ops_);
  EXPECT_EQ(calls(), std::vector<std::string>({absl::StrCat("release ", id)}));
  EXPECT_EQ(table_.resident(), 0);
  table_.Done(Run({4, 5}, &cached));
  table_.Reset(3);
  EXPECT_EQ(table_.resident(), 0);
  SlotTable::Slot* fresh = table_.Acquire({4, 5, 6}, &cached, &ops_);
  EXPECT_EQ(cached, 0);
  EXPECT_GT(fresh->id, id);  // session ids are never reused
}

}  // namespace
}  // namespace fucina
