// The scheduler's output stage on its own: what a client is shown of a stream of sampled tokens,
// over the real Qwen3 tokenizer ($FUCINA_QWEN3_TOKENIZER; skipped without it). Expected texts
// are the prompt strings the tokens were encoded from.
#include "coordinator/output_text.h"

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "coordinator/request.h"
#include "tests/coordinator/fixture_tokenizer.h"
#include "tests/coordinator/http/scripted_backend.h"

namespace fucina {
namespace {

class OutputTextTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* dir = std::getenv("FUCINA_QWEN3_TOKENIZER");
    if (dir == nullptr || *dir == '\0') return;
    auto tok = FixtureTokenizer(
        "output_text", [dir](const std::string& path) { return MakeTinyQwen3Fixture(path, dir); });
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = tok->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  void SetUp() override {
    if (tokenizer_ == nullptr) GTEST_SKIP() << "FUCINA_QWEN3_TOKENIZER not set";
  }

  std::vector<int32_t> Ids(const std::string& text) { return tokenizer_->Encode(text, false, false); }

  // Pushes every id of `ids`; returns each step.
  std::vector<OutputText::Step> Run(const GenerateJob& job, int64_t max_tokens,
                                    const std::vector<int32_t>& ids) {
    OutputText out(*tokenizer_, job, max_tokens);
    std::vector<OutputText::Step> steps;
    for (int32_t id : ids) {
      steps.push_back(out.Push(id));
      if (!steps.back().finish_reason.empty()) break;
    }
    return steps;
  }
  static std::string Shown(const std::vector<OutputText::Step>& steps) {
    std::string all;
    for (const auto& s : steps) all += s.text;
    return all;
  }

  static Tokenizer* tokenizer_;
};

Tokenizer* OutputTextTest::tokenizer_ = nullptr;

TEST_F(OutputTextTest, PlainTextComesOutWholeAndEndsOnTheBudget) {
  GenerateJob job;
  const std::vector<int32_t> ids = Ids("The quick brown fox jumps");
  auto steps = Run(job, static_cast<int64_t>(ids.size()), ids);
  ASSERT_EQ(steps.size(), ids.size());
  EXPECT_EQ(Shown(steps), "The quick brown fox jumps");
  EXPECT_EQ(steps.back().finish_reason, "length");
  for (size_t i = 0; i + 1 < steps.size(); ++i) EXPECT_EQ(steps[i].finish_reason, "");
}

TEST_F(OutputTextTest, AStopStringIsNeverShownEvenSplitAcrossTokens) {
  GenerateJob job;
  job.stop = {"brown fox"};
  const std::vector<int32_t> ids = Ids("The quick brown fox jumps");
  auto steps = Run(job, 100, ids);
  EXPECT_EQ(Shown(steps), "The quick ");
  EXPECT_EQ(steps.back().finish_reason, "stop");
  EXPECT_EQ(steps.back().stop_sequence, "brown fox");
  // While "brown" could still begin the stop string it is held back, not shown.
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    EXPECT_EQ(steps[i].text.find("brown"), std::string::npos) << i;
  }
}

TEST_F(OutputTextTest, AHeldTailIsReleasedOnceItCannotBeAStopString) {
  GenerateJob job;
  job.stop = {"brown bear"};
  const std::vector<int32_t> ids = Ids("The quick brown fox jumps");
  auto steps = Run(job, 100, ids);
  EXPECT_EQ(Shown(steps), "The quick brown fox jumps");  // the budget ends it, nothing lost
  EXPECT_EQ(steps.back().finish_reason, "");
}

TEST_F(OutputTextTest, EndOfGenerationAndStopTokenIdsEndTheReplyWithoutText) {
  const int32_t eos = *tokenizer_->TokenId("<|im_end|>");
  std::vector<int32_t> ids = Ids("Hi there");
  ids.push_back(eos);
  ids.push_back(Ids(" more")[0]);
  GenerateJob job;
  auto steps = Run(job, 100, ids);
  EXPECT_EQ(Shown(steps), "Hi there");
  EXPECT_EQ(steps.back().finish_reason, "stop");
  EXPECT_EQ(steps.size(), ids.size() - 1);
  // ignore_eos: the token is text like any other and the reply goes on.
  job.ignore_eos = true;
  steps = Run(job, 100, ids);
  EXPECT_EQ(steps.size(), ids.size());
  EXPECT_NE(Shown(steps).find("<|im_end|>"), std::string::npos);
  // A stop token id given by the request.
  GenerateJob by_id;
  by_id.stop_token_ids = {Ids(" there")[0]};
  steps = Run(by_id, 100, Ids("Hi there"));
  EXPECT_EQ(Shown(steps), "Hi");
  EXPECT_EQ(steps.back().finish_reason, "stop");
}

TEST_F(OutputTextTest, ACharacterSplitAcrossTokensIsShownOnlyWhole) {
  // Byte-level BPE spells rare characters as several byte tokens.
  std::string text;
  std::vector<int32_t> ids;
  for (const char* candidate : {"\xF0\x9F\xA6\x99", "\xE9\xBE\x98", "\xF0\x90\x8D\x88"}) {
    ids = Ids(candidate);
    if (ids.size() > 1) {
      text = candidate;
      break;
    }
  }
  ASSERT_GT(ids.size(), 1u) << "no candidate character splits into several tokens";
  GenerateJob job;
  auto steps = Run(job, 100, ids);
  for (size_t i = 0; i + 1 < steps.size(); ++i) EXPECT_EQ(steps[i].text, "") << i;
  EXPECT_EQ(Shown(steps), text);
  // Cut short by the budget: the broken character's bytes become U+FFFD (one per byte), never
  // raw bytes.
  steps = Run(job, 1, ids);
  const std::string shown = Shown(steps);
  ASSERT_FALSE(shown.empty());
  ASSERT_EQ(shown.size() % 3, 0u) << shown;
  for (size_t i = 0; i < shown.size(); i += 3) EXPECT_EQ(shown.substr(i, 3), "\xEF\xBF\xBD");
  EXPECT_EQ(steps.back().finish_reason, "length");
}

}  // namespace
}  // namespace fucina
