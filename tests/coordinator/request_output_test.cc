// A running request's output side on its own: each sampled token reaches the client with its
// sample, the reply ends on its budget, and the request metrics count what happened.
#include "coordinator/request_output.h"

#include <memory>
#include <string>

#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "tests/coordinator/fixture_tokenizer.h"

namespace fucina {
namespace {

class RequestOutputTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = FixtureTokenizer("request_output");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }

  std::shared_ptr<Request> NewRequest(std::vector<int32_t> prompt, int64_t max_tokens) {
    auto r = std::make_shared<Request>();
    GenerateJob job;
    job.prompt = std::move(prompt);
    job.max_tokens = max_tokens;
    job.ignore_eos = true;
    r->set_job(std::move(job));
    return r;
  }

  static wire::SegmentResult Sample(int32_t id, float logprob) {
    wire::SegmentResult s;
    s.set_token(id);
    s.set_logprob(logprob);
    wire::TokenLogprob* top = s.add_top();
    top->set_id(id);
    top->set_logprob(logprob);
    return s;
  }

  // The value of a metric line that starts with `prefix` in the exposition text.
  std::string Line(const std::string& prefix) {
    const std::string text = prometheus::TextSerializer().Serialize(registry_->Collect());
    const size_t at = text.find("\n" + prefix);
    if (at == std::string::npos) return "";
    const size_t end = text.find('\n', at + 1);
    return text.substr(at + 1, end - at - 1);
  }

  static Tokenizer* tokenizer_;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  Metrics metrics_{registry_, "m"};
};

Tokenizer* RequestOutputTest::tokenizer_ = nullptr;

TEST_F(RequestOutputTest, TokensReachTheClientWithTheirSamplesAndTheBudgetEndsTheReply) {
  auto r = NewRequest({10, 11, 12}, 2);
  RequestOutput out(r, *tokenizer_, 4096, /*cached=*/2, &metrics_);
  EXPECT_FALSE(out.Deliver(Sample('h', -0.5f)));
  EXPECT_TRUE(out.Deliver(Sample('i', -0.25f)));  // the second of two: the reply is complete
  out.Complete();
  std::string text;
  std::vector<int32_t> ids;
  while (auto d = r->Next(0)) {
    text += d->text;
    ids.insert(ids.end(), d->ids.begin(), d->ids.end());
    ASSERT_EQ(d->samples.size(), d->ids.size());
    EXPECT_EQ(d->samples[0].top.size(), 1u);
  }
  EXPECT_EQ(ids, std::vector<int32_t>({'h', 'i'}));
  EXPECT_EQ(text, "hi");
  ASSERT_TRUE(r->done());
  const Outcome o = r->outcome();
  EXPECT_TRUE(o.status.ok());
  EXPECT_EQ(o.finish_reason, "length");
  EXPECT_EQ(o.prompt_tokens, 3);
  EXPECT_EQ(o.completion_tokens, 2);
  EXPECT_EQ(o.cached_tokens, 2);
  EXPECT_EQ(Line("fucina_generation_tokens_total"),
            "fucina_generation_tokens_total{model_name=\"m\"} 2");
  EXPECT_EQ(Line("fucina_prefix_cache_hits_total"),
            "fucina_prefix_cache_hits_total{model_name=\"m\"} 2");
  EXPECT_EQ(Line("fucina_time_to_first_token_seconds_count"),
            "fucina_time_to_first_token_seconds_count{model_name=\"m\"} 1");
  EXPECT_EQ(Line("fucina_inter_token_latency_seconds_count"),
            "fucina_inter_token_latency_seconds_count{model_name=\"m\"} 1");
}

TEST_F(RequestOutputTest, TheContextLeftCapsTheBudget) {
  auto r = NewRequest({1, 2, 3, 4, 5, 6}, 100);
  RequestOutput out(r, *tokenizer_, /*context=*/8, 0, nullptr);
  EXPECT_FALSE(out.Deliver(Sample('a', 0)));
  EXPECT_TRUE(out.Deliver(Sample('b', 0)));  // 6 + 2 = the context
}

TEST_F(RequestOutputTest, AFailureIsPublishedOnceAndCountedAsOne) {
  auto r = NewRequest({1}, 4);
  RequestOutput out(r, *tokenizer_, 4096, 0, &metrics_);
  out.Fail(absl::UnavailableError("worker w1 failed"));
  out.Fail(absl::CancelledError("later"));
  ASSERT_TRUE(r->done());
  EXPECT_EQ(r->outcome().status.message(), "worker w1 failed");
  EXPECT_EQ(Line("fucina_request_failure_total"),
            "fucina_request_failure_total{model_name=\"m\"} 1");
}

}  // namespace
}  // namespace fucina
