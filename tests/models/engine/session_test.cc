// Session: a second turn reuses the cached prefix, prefills only the new tokens and gives the
// same output as a cold session; limits and bad ids give clear errors.
#include "models/engine/session.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/models/smollm2_fixture.h"

namespace fucina {
namespace {

class SessionTest : public SmolLm2Test {
 protected:
  std::unique_ptr<Session> NewSession(int64_t ctx = 512) {
    auto kv = model_->NewKvCache(ctx, GgmlType::kF32);
    EXPECT_TRUE(kv.ok());
    return std::make_unique<Session>(*model_, *tokenizer_, *std::move(kv));
  }
  std::vector<int32_t> Encode(const std::string& s) { return tokenizer_->Encode(s, true, true); }
};

TEST_F(SessionTest, SecondTurnReusesThePrefixAndMatchesAColdRun) {
  GenerationOptions greedy;
  greedy.sampling.temperature = 0;
  greedy.max_tokens = 16;
  auto warm = NewSession();
  const std::vector<int32_t> turn1 =
      Encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n");
  auto r1 = warm->Generate(turn1, greedy);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->reused_tokens, 0);

  std::vector<int32_t> turn2 = warm->cached_tokens();
  const std::vector<int32_t> more = Encode("<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n"
                                           "<|im_start|>assistant\n");
  turn2.insert(turn2.end(), more.begin(), more.end());
  auto r2 = warm->Generate(turn2, greedy);
  ASSERT_TRUE(r2.ok()) << r2.status();
  // Everything the cache held is reused; only the new tokens are prefilled.
  EXPECT_EQ(r2->reused_tokens, static_cast<int64_t>(turn2.size() - more.size()));

  auto cold = NewSession();
  auto r3 = cold->Generate(turn2, greedy);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(r3->reused_tokens, 0);
  EXPECT_EQ(r2->tokens, r3->tokens);
}

TEST_F(SessionTest, DivergingPromptTruncatesToTheCommonPrefix) {
  GenerationOptions greedy;
  greedy.sampling.temperature = 0;
  greedy.max_tokens = 4;
  auto s = NewSession();
  const std::vector<int32_t> a = Encode("The capital of France is");
  const std::vector<int32_t> b = Encode("The capital of Spain is");
  ASSERT_TRUE(s->Generate(a, greedy).ok());
  auto rb = s->Generate(b, greedy);
  ASSERT_TRUE(rb.ok()) << rb.status();
  size_t common = 0;
  while (common < a.size() && a[common] == b[common]) ++common;
  EXPECT_EQ(rb->reused_tokens, static_cast<int64_t>(common));
  auto fresh = NewSession()->Generate(b, greedy);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(rb->tokens, fresh->tokens);
}

TEST_F(SessionTest, ErrorsNameTheProblem) {
  GenerationOptions options;
  options.max_tokens = 100;
  auto s = NewSession(/*ctx=*/32);
  auto too_long = s->Generate(Encode("hello there"), options);
  EXPECT_FALSE(too_long.ok());
  EXPECT_NE(std::string(too_long.status().message()).find("context"), std::string::npos);
  options.max_tokens = 2;
  const std::vector<int32_t> bad = {1, 1 << 30};
  auto bad_id = s->Generate(bad, options);
  EXPECT_FALSE(bad_id.ok());
  EXPECT_NE(std::string(bad_id.status().message()).find(std::to_string(1 << 30)),
            std::string::npos);
  EXPECT_FALSE(s->Generate({}, options).ok());
}

}  // namespace
}  // namespace fucina
