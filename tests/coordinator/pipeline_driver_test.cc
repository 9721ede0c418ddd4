// The pipeline driver against a stage 0 that holds every call until the test answers it: which
// steps are in flight at once, what each step carries under the token budget, and how replies,
// segment errors and worker failures end the requests. The test thread is the owner thread: it
// runs what the driver posts.
#include "coordinator/pipeline_driver.h"

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/coordinator/fixture_tokenizer.h"
#include "tests/worker/fake_worker_client.h"

namespace fucina {
namespace {

// The sessions a step releases, in order.
std::vector<uint64_t> Released(const wire::ForwardRequest& step) {
  std::vector<uint64_t> ids;
  for (const wire::SessionOp& op : step.session_ops()) {
    if (op.has_release()) ids.push_back(op.release().session_id());
  }
  return ids;
}

class PipelineDriverTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = FixtureTokenizer("pipeline_driver");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  void SetUp() override {
    slots_.Reset(16);
    driver_ = std::make_unique<PipelineDriver>(
        slots_, nullptr,
        PipelineDriver::Hooks{
            .post = [this](std::function<void()> fn) { posted_.push_back(std::move(fn)); },
            .worker_failed =
                [this](const std::string& id, const absl::Status& why) {
                  failed_worker_ = id;
                  return absl::UnavailableError("worker " + id + " failed: " +
                                                std::string(why.message()));
                },
            .counts_changed = [] {}});
  }

  void Start(int groups, int64_t budget) {
    driver_->Reset(entry_, "w0", {.micro_batches = groups, .max_step_tokens = budget});
  }

  // A running request with a prompt of `n` tokens that generates up to `max_tokens`.
  std::shared_ptr<Request> Add(int n, int64_t max_tokens = 8) {
    // Each prompt starts with its own token: no prefix is shared between requests.
    std::vector<int32_t> prompt = {next_first_++};
    for (int i = 1; i < n; ++i) prompt.push_back(65 + i % 26);
    return AddPrompt(std::move(prompt), max_tokens);
  }
  std::shared_ptr<Request> AddPrompt(std::vector<int32_t> prompt, int64_t max_tokens = 8) {
    auto request = std::make_shared<Request>();
    GenerateJob job;
    job.prompt = std::move(prompt);
    job.max_tokens = max_tokens;
    job.ignore_eos = true;
    job.sampling.temperature = 0;
    request->set_job(std::move(job));
    int64_t cached = 0;
    SessionOpList ops;
    SlotTable::Slot* slot = slots_.Acquire(request->job().prompt, &cached, &ops);
    EXPECT_NE(slot, nullptr);
    driver_->Add(std::make_unique<RequestOutput>(request, *tokenizer_, 4096, cached, nullptr),
                 slot, std::move(ops));
    return request;
  }

  void RunPosted() {
    while (!posted_.empty()) {
      auto fn = std::move(posted_.front());
      posted_.pop_front();
      fn();
    }
  }

  // Answers call `i` with a sample of `token` for every segment that expects one.
  void Answer(size_t i, int32_t token) {
    const wire::ForwardRequest request = entry_->request(i);
    wire::ForwardResponse reply;
    for (const wire::Segment& seg : request.segments()) {
      if (seg.prefill_only()) continue;
      wire::SegmentResult* r = reply.add_results();
      r->set_session_id(seg.session_id());
      r->set_token(token);
    }
    ASSERT_TRUE(entry_->Release(i, reply));
    RunPosted();
  }

  // Reads the request's output to its end; its outcome.
  static Outcome Drain(Request& r) {
    while (r.Next(0).has_value()) {
    }
    EXPECT_TRUE(r.done());
    return r.outcome();
  }

  static std::vector<int> TokensPerSegment(const wire::ForwardRequest& request) {
    std::vector<int> n;
    for (const wire::Segment& seg : request.segments()) n.push_back(seg.token_ids_size());
    return n;
  }

  static Tokenizer* tokenizer_;
  SlotTable slots_;
  std::shared_ptr<HoldingWorkerClient> entry_ = std::make_shared<HoldingWorkerClient>();
  std::deque<std::function<void()>> posted_;
  std::string failed_worker_;
  int32_t next_first_ = 1;
  std::unique_ptr<PipelineDriver> driver_;
};

Tokenizer* PipelineDriverTest::tokenizer_ = nullptr;

TEST_F(PipelineDriverTest, TwoGroupsAreInFlightAtOnceAndEachStepsOnItsOwnReply) {
  Start(/*groups=*/2, 512);
  auto a = Add(3);
  auto b = Add(5);
  driver_->Launch();
  // Both groups' first steps are out before either reply: stage 0 may take the second while
  // the first moves on.
  ASSERT_EQ(entry_->calls(), 2u);
  EXPECT_EQ(driver_->in_flight(), 2);
  EXPECT_EQ(TokensPerSegment(entry_->request(0)), std::vector<int>({3}));
  EXPECT_EQ(TokensPerSegment(entry_->request(1)), std::vector<int>({5}));

  // Group B's reply comes first: B steps again at once, A still waits for its own.
  Answer(1, 42);
  driver_->Launch();
  ASSERT_EQ(entry_->calls(), 3u);
  const wire::ForwardRequest next_b = entry_->request(2);
  ASSERT_EQ(next_b.segments_size(), 1);
  EXPECT_EQ(next_b.segments(0).pos0(), 5);
  EXPECT_EQ(next_b.segments(0).token_ids(0), 42);
  EXPECT_EQ(driver_->in_flight(), 2);

  Answer(0, 7);
  driver_->Launch();
  ASSERT_EQ(entry_->calls(), 4u);
  EXPECT_EQ(entry_->request(3).segments(0).pos0(), 3);
  EXPECT_EQ(entry_->request(3).segments(0).token_ids(0), 7);
  auto delta = a->Next(0);
  ASSERT_TRUE(delta.has_value());
  EXPECT_EQ(delta->ids, std::vector<int32_t>({7}));
}

TEST_F(PipelineDriverTest, DecodeTokensComeFirstAndPromptChunksShareTheRestOfTheBudget) {
  Start(/*groups=*/1, /*budget=*/16);
  Add(2);
  Add(3);
  driver_->Launch();
  Answer(0, 9);  // both prompts done in one step: both decode from now on
  auto long_prompt = Add(40);
  driver_->Launch();
  ASSERT_EQ(entry_->calls(), 2u);
  // Two decode tokens, then 14 of the long prompt's 40: the budget of 16.
  wire::ForwardRequest step = entry_->request(1);
  EXPECT_EQ(TokensPerSegment(step), std::vector<int>({1, 1, 14}));
  EXPECT_TRUE(step.segments(2).prefill_only());
  EXPECT_FALSE(step.segments(2).has_sampling());
  Answer(1, 9);
  driver_->Launch();
  step = entry_->request(2);
  EXPECT_EQ(TokensPerSegment(step), std::vector<int>({1, 1, 14}));
  EXPECT_EQ(step.segments(2).pos0(), 14);
  Answer(2, 9);
  driver_->Launch();
  // The last 12 prompt tokens: the chunk that samples.
  step = entry_->request(3);
  EXPECT_EQ(TokensPerSegment(step), std::vector<int>({1, 1, 12}));
  EXPECT_TRUE(step.segments(2).has_sampling());
  Answer(3, 11);
  auto delta = long_prompt->Next(0);
  ASSERT_TRUE(delta.has_value());
  EXPECT_EQ(delta->ids, std::vector<int32_t>({11}));
}

TEST_F(PipelineDriverTest, AShortPromptIsNotKeptWaitingBehindALongOne) {
  Start(/*groups=*/1, /*budget=*/16);
  Add(100);
  driver_->Launch();
  EXPECT_EQ(TokensPerSegment(entry_->request(0)), std::vector<int>({16}));
  auto quick = Add(5);
  Answer(0, 9);
  driver_->Launch();
  // An equal share (8 each, the short prompt needing 5), then the rest to the older one.
  const wire::ForwardRequest step = entry_->request(1);
  EXPECT_EQ(TokensPerSegment(step), std::vector<int>({11, 5}));
  EXPECT_TRUE(step.segments(0).prefill_only());
  EXPECT_TRUE(step.segments(1).has_sampling());
  Answer(1, 12);
  auto delta = quick->Next(0);
  ASSERT_TRUE(delta.has_value());
  EXPECT_EQ(delta->ids, std::vector<int32_t>({12}));
}

TEST_F(PipelineDriverTest, ARequestFinishesAfterItsBudgetAndKeepsItsSessionResident) {
  Start(1, 512);
  auto r = Add(4, /*max_tokens=*/2);
  driver_->Launch();
  Answer(0, 30);
  driver_->Launch();
  Answer(1, 31);
  const Outcome o = Drain(*r);
  EXPECT_TRUE(o.status.ok()) << o.status;
  EXPECT_EQ(o.finish_reason, "length");
  EXPECT_EQ(o.completion_tokens, 2);
  EXPECT_EQ(driver_->running(), 0);
  EXPECT_EQ(driver_->Launch(), 0);
  ASSERT_EQ(entry_->calls(), 2u);  // nothing to release: no step of operations follows
  for (size_t i = 0; i < entry_->calls(); ++i) EXPECT_EQ(entry_->request(i).session_ops_size(), 0);
  EXPECT_EQ(slots_.resident(), 1);
}

TEST_F(PipelineDriverTest, ASegmentErrorEndsOnlyItsRequestAndFreesItsSession) {
  Start(1, 512);
  auto a = Add(3);
  auto b = Add(3);
  driver_->Launch();
  const wire::ForwardRequest step = entry_->request(0);
  wire::ForwardResponse reply;
  wire::SegmentError* e = reply.add_errors();
  e->set_index(0);
  e->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  e->set_message("no memory for a new session");
  wire::SegmentResult* ok = reply.add_results();
  ok->set_session_id(step.segments(1).session_id());
  ok->set_token(5);
  ASSERT_TRUE(entry_->Release(0, reply));
  RunPosted();
  ASSERT_TRUE(a->done());
  EXPECT_TRUE(absl::IsResourceExhausted(a->outcome().status)) << a->outcome().status;
  EXPECT_FALSE(b->done());
  EXPECT_EQ(driver_->running(), 1);
  EXPECT_TRUE(failed_worker_.empty());
  // Its session is freed on every stage by the group's next step, before b's row.
  driver_->Launch();
  ASSERT_EQ(entry_->calls(), 2u);
  EXPECT_EQ(Released(entry_->request(1)),
            std::vector<uint64_t>({step.segments(0).session_id()}));
  EXPECT_EQ(entry_->request(1).segments_size(), 1);
}

TEST_F(PipelineDriverTest, ARequestLevelFailureIsNoWorkerFailureWhateverItsCode) {
  // A grammar the last stage could not use, as a call's status: FAILED_PRECONDITION read by its
  // code as the worker's failure, which declared a healthy stage dead and re-planned.
  Start(1, 512);
  auto a = Add(3);
  driver_->Launch();
  ASSERT_TRUE(entry_->Release(
      0, RequestFailure(absl::FailedPreconditionError("grammar: the token table is not ready"))));
  RunPosted();
  ASSERT_TRUE(a->done());
  EXPECT_TRUE(absl::IsFailedPrecondition(a->outcome().status)) << a->outcome().status;
  EXPECT_TRUE(failed_worker_.empty()) << "re-planned around " << failed_worker_;
  // The same code declared by the worker is its failure.
  auto b = Add(3);
  driver_->Launch();
  ASSERT_TRUE(entry_->Release(
      1, WorkerDeclaredFailure(absl::InvalidArgumentError("this worker lost its shard"))));
  RunPosted();
  EXPECT_EQ(failed_worker_, "w0");
}

TEST_F(PipelineDriverTest, AChainFailureIsLaidToTheWorkerItNamesAndFailsEveryRequest) {
  Start(2, 512);
  auto a = Add(3);
  auto b = Add(3);
  driver_->Launch();
  wire::ForwardResponse reply;
  reply.mutable_chain_failure()->set_worker_id("w2");
  reply.mutable_chain_failure()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  reply.mutable_chain_failure()->set_message("connection refused");
  ASSERT_TRUE(entry_->Release(0, reply));
  RunPosted();
  EXPECT_EQ(failed_worker_, "w2");
  ASSERT_TRUE(a->done());
  ASSERT_TRUE(b->done());
  EXPECT_TRUE(absl::IsUnavailable(a->outcome().status));
  EXPECT_NE(a->outcome().status.message().find("worker w2"), std::string::npos);
  EXPECT_EQ(driver_->running(), 0);
  // Group B's reply, arriving after the failure, is dropped.
  ASSERT_TRUE(entry_->Release(1, wire::ForwardResponse()));
  RunPosted();
  EXPECT_EQ(driver_->in_flight(), 0);
}

TEST_F(PipelineDriverTest, ATransportErrorOfStageZeroIsLaidToStageZero) {
  Start(1, 512);
  auto a = Add(3);
  driver_->Launch();
  ASSERT_TRUE(entry_->Release(0, absl::UnavailableError("socket closed")));
  RunPosted();
  EXPECT_EQ(failed_worker_, "w0");
  ASSERT_TRUE(a->done());
  EXPECT_TRUE(absl::IsUnavailable(a->outcome().status));
}

TEST_F(PipelineDriverTest, ACancelledRequestLeavesAtItsGroupsNextStep) {
  Start(1, 512);
  auto a = Add(3);
  auto b = Add(3);
  driver_->Launch();
  a->Cancel();
  Answer(0, 5);
  EXPECT_EQ(driver_->running(), 2);  // its step was in flight: it leaves at the next one
  driver_->Launch();
  EXPECT_TRUE(absl::IsCancelled(Drain(*a).status));
  ASSERT_EQ(entry_->calls(), 2u);
  EXPECT_EQ(entry_->request(1).segments_size(), 1);  // b alone, after a's release
  EXPECT_EQ(Released(entry_->request(1)),
            std::vector<uint64_t>({entry_->request(0).segments(0).session_id()}));
}

TEST_F(PipelineDriverTest, TheLastRequestsReleaseGoesOutInAStepOfOperationsOnly) {
  Start(1, 512);
  auto a = Add(3);
  driver_->Launch();
  a->Cancel();
  Answer(0, 5);
  driver_->Launch();
  EXPECT_TRUE(absl::IsCancelled(Drain(*a).status));
  ASSERT_EQ(entry_->calls(), 2u);
  const wire::ForwardRequest ops = entry_->request(1);
  EXPECT_EQ(ops.segments_size(), 0);
  EXPECT_EQ(Released(ops), std::vector<uint64_t>({entry_->request(0).segments(0).session_id()}));
  ASSERT_TRUE(entry_->Release(1, wire::ForwardResponse()));
  RunPosted();
  EXPECT_EQ(driver_->in_flight(), 0);
  EXPECT_EQ(driver_->Launch(), 0);
  EXPECT_EQ(entry_->calls(), 2u);  // nothing left to send
}

TEST_F(PipelineDriverTest, ACopyRidesInItsRequestsStepAndItsSourcesReleaseWaitsForIt) {
  Start(/*groups=*/2, 512);
  const std::vector<int32_t> shared = {90, 91, 92, 93};
  auto a = AddPrompt(shared);
  driver_->Launch();
  Answer(0, 5);  // a's prompt is on every stage; a decodes
  std::vector<int32_t> longer = shared;
  longer.push_back(94);
  auto b = AddPrompt(longer);  // copies a's 4 positions, in the other group
  driver_->Launch();
  ASSERT_EQ(entry_->calls(), 3u);
  const wire::ForwardRequest a_step = entry_->request(1), b_step = entry_->request(2);
  const uint64_t a_id = a_step.segments(0).session_id(), b_id = b_step.segments(0).session_id();
  EXPECT_EQ(a_step.session_ops_size(), 0);
  ASSERT_EQ(b_step.session_ops_size(), 1);
  EXPECT_EQ(b_step.session_ops(0).copy_prefix().from_session(), a_id);
  EXPECT_EQ(b_step.session_ops(0).copy_prefix().to_session(), b_id);
  EXPECT_EQ(b_step.session_ops(0).copy_prefix().length(), 4);
  EXPECT_EQ(b_step.segments(0).pos0(), 4);

  // a fails while the copy is in flight: its release must not overtake the copy.
  wire::ForwardResponse a_failed;
  wire::SegmentError* e = a_failed.add_errors();
  e->set_index(0);
  e->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  e->set_message("a's grammar failed");
  ASSERT_TRUE(entry_->Release(1, a_failed));
  RunPosted();
  EXPECT_TRUE(absl::IsInvalidArgument(Drain(*a).status));
  driver_->Launch();
  EXPECT_EQ(entry_->calls(), 3u);
  Answer(2, 7);
  driver_->Launch();
  ASSERT_EQ(entry_->calls(), 4u);
  EXPECT_EQ(Released(entry_->request(3)), std::vector<uint64_t>({a_id}));
  EXPECT_EQ(entry_->request(3).segments(0).session_id(), b_id);
  EXPECT_FALSE(b->done());
}

TEST_F(PipelineDriverTest, AFailedSessionOperationFailsOnlyItsRequest) {
  Start(1, 512);
  const std::vector<int32_t> shared = {90, 91, 92, 93};
  auto a = AddPrompt(shared);
  driver_->Launch();
  Answer(0, 5);
  auto b = AddPrompt({90, 91, 92, 95});  // copies 3 positions of a
  driver_->Launch();
  ASSERT_EQ(entry_->calls(), 2u);
  const wire::ForwardRequest step = entry_->request(1);
  ASSERT_EQ(step.session_ops_size(), 1);
  ASSERT_EQ(step.segments_size(), 2);
  // The last stage had no memory for the copy; b's segment failed with it there.
  wire::ForwardResponse reply;
  wire::SessionOpError* oe = reply.add_op_errors();
  oe->set_index(0);
  oe->set_code(static_cast<int>(absl::StatusCode::kResourceExhausted));
  oe->set_message("copy: no memory for a new session");
  oe->set_worker_id("w1");
  wire::SegmentError* se = reply.add_errors();
  se->set_index(1);
  se->set_code(oe->code());
  se->set_message(oe->message());
  wire::SegmentResult* ok = reply.add_results();
  ok->set_session_id(step.segments(0).session_id());
  ok->set_token(6);
  ASSERT_TRUE(entry_->Release(1, reply));
  RunPosted();
  ASSERT_TRUE(b->done());
  EXPECT_TRUE(absl::IsResourceExhausted(b->outcome().status)) << b->outcome().status;
  EXPECT_NE(b->outcome().status.message().find("on w1"), std::string::npos)
      << b->outcome().status;
  EXPECT_FALSE(a->done());
  EXPECT_TRUE(failed_worker_.empty());
  driver_->Launch();
  EXPECT_EQ(Released(entry_->request(2)),
            std::vector<uint64_t>({step.session_ops(0).copy_prefix().to_session()}));
}

}  // namespace
}  // namespace fucina
