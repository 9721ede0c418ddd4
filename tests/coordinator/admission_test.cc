// The admission queue on its own: places taken before tokenization, jobs checked against the
// model, cancelled requests leaving, and failing what is queued.
#include "coordinator/admission.h"

#include <gtest/gtest.h>

namespace fucina {
namespace {

GenerateJob Job(std::vector<int32_t> prompt, int64_t max_tokens = 4) {
  GenerateJob job;
  job.prompt = std::move(prompt);
  job.max_tokens = max_tokens;
  return job;
}

TEST(AdmissionQueueTest, AFullQueueRefusesNamingTheFlagAndAGivenBackPlaceIsFree) {
  int queued = 0;
  AdmissionQueue q(2, [&] { ++queued; });
  auto a = q.Reserve();
  auto b = q.Reserve();
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = q.Reserve();
  EXPECT_TRUE(absl::IsResourceExhausted(c.status()));
  EXPECT_NE(c.status().message().find("--max-queue 2"), std::string::npos);
  q.Unreserve();
  EXPECT_TRUE(q.Reserve().ok());
  EXPECT_EQ(q.waiting(), 2);
  EXPECT_EQ(queued, 0);
}

TEST(AdmissionQueueTest, JobsThatCannotRunAreRefusedAndGiveTheirPlaceBack) {
  AdmissionQueue q(8, nullptr);
  struct Case {
    GenerateJob job;
    const char* says;
  } cases[] = {{Job({}), "empty prompt"},
               {Job(std::vector<int32_t>(16, 1)), "does not fit the context of 16"},
               {Job({1}, 0), "max_tokens"},
               {Job({1, 300}), "token id 300 outside the vocabulary [0, 256)"},
               {Job({-1}), "token id -1"}};
  for (Case& c : cases) {
    auto r = q.Reserve();
    ASSERT_TRUE(r.ok());
    absl::Status s = q.Submit(*r, std::move(c.job), /*context=*/16, /*vocab=*/256);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_EQ(q.waiting(), 0);
  }
  EXPECT_TRUE(q.empty());
}

TEST(AdmissionQueueTest, RequestsLeaveInOrderAndCancelledOnesFinishWhereTheyStand) {
  int queued = 0;
  AdmissionQueue q(8, [&] { ++queued; });
  std::vector<std::shared_ptr<Request>> r;
  for (int i = 0; i < 3; ++i) {
    auto p = q.Reserve();
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE(q.Submit(*p, Job({1, 2}), 16, 256).ok());
    r.push_back(*p);
  }
  EXPECT_EQ(queued, 3);
  r[1]->Cancel();
  q.DropCancelled();
  ASSERT_TRUE(r[1]->done());
  EXPECT_TRUE(absl::IsCancelled(r[1]->outcome().status));
  EXPECT_EQ(q.waiting(), 2);
  EXPECT_EQ(q.Front(), r[0]);
  q.Pop();
  r[2]->Cancel();
  EXPECT_EQ(q.Front(), nullptr);  // the cancelled head finishes and leaves
  EXPECT_TRUE(r[2]->done());
  EXPECT_EQ(q.waiting(), 0);
}

TEST(AdmissionQueueTest, FailAllFinishesEveryQueuedRequestWithTheReason) {
  AdmissionQueue q(8, nullptr);
  auto p = q.Reserve();
  ASSERT_TRUE(q.Submit(*p, Job({3}), 16, 256).ok());
  q.FailAll(absl::UnavailableError("model not ready: no workers"));
  ASSERT_TRUE((*p)->done());
  EXPECT_EQ((*p)->outcome().status.message(), "model not ready: no workers");
  EXPECT_EQ(q.waiting(), 0);
  EXPECT_TRUE(q.empty());
}

}  // namespace
}  // namespace fucina
