// The grammar engine on SmolLM2's real vocabulary: masks checked against a brute-force scan of
// every token's text, acceptance and the stopped state, errors with the engine's own words, the
// compile deadline, and constrained generation (plain and speculative) in a Session.
#include "models/grammar/grammar.h"

#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/engine/model.h"
#include "models/engine/session.h"
#include "tests/models/smollm2_fixture.h"

namespace fucina {
namespace {

using ::testing::HasSubstr;

class GrammarTest : public SmolLm2Test {
 protected:
  static void SetUpTestSuite() {
    SmolLm2Test::SetUpTestSuite();
    if (tokenizer_ == nullptr) return;
    auto vocab = GrammarVocab::Create(*tokenizer_);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    vocab_ = new std::shared_ptr<const GrammarVocab>(*std::move(vocab));
  }
  static void TearDownTestSuite() {
    delete vocab_;
    vocab_ = nullptr;
    SmolLm2Test::TearDownTestSuite();
  }
  static const GrammarVocab& vocab() { return **vocab_; }
  std::unique_ptr<GrammarMatcher> Compile(const GrammarSpec& spec) {
    auto m = vocab().Compile(spec);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }
  std::vector<uint32_t> MaskOf(GrammarMatcher& m) {
    std::vector<uint32_t> mask;
    EXPECT_TRUE(m.Mask(&mask).ok());
    return mask;
  }
  bool Text(int32_t id) {
    return (tokenizer_->TokenAttributes(id) &
            (kTokenAttrControl | kTokenAttrUnknown | kTokenAttrUnused)) == 0 &&
           !tokenizer_->TokenToPiece(id).empty();
  }

  static inline std::shared_ptr<const GrammarVocab>* vocab_ = nullptr;
};

// The allowed set of a finite language is exactly the tokens whose text is a non-empty prefix
// of one of its strings: checked over the whole vocabulary.
TEST_F(GrammarTest, MaskIsExactlyTheTokensThatCanStartTheLanguage) {
  auto m = Compile(GrammarSpec::Regex(R"( (yes|no)\.)"));
  const std::vector<uint32_t> mask = MaskOf(*m);
  int allowed = 0;
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    const std::string piece = tokenizer_->TokenToPiece(id);
    const bool fits = Text(id) && (std::string(" yes.").starts_with(piece) ||
                                   std::string(" no.").starts_with(piece));
    ASSERT_EQ(MaskAllows(mask, id), fits) << "token " << id << " '" << piece << "'";
    allowed += fits;
  }
  EXPECT_GE(allowed, 3);  // " ", " y", " yes", " n", " no", ...
  // No end of generation before the grammar may end.
  for (int32_t id : tokenizer_->end_of_generation_ids()) EXPECT_FALSE(MaskAllows(mask, id));
}

TEST_F(GrammarTest, AcceptingTheWholeStringStopsWithOnlyEndOfGenerationAllowed) {
  auto m = Compile(GrammarSpec::Regex(R"( (yes|no)\.)"));
  for (int32_t id : tokenizer_->Encode(" no.", false, false)) {
    EXPECT_FALSE(m->stopped());
    ASSERT_TRUE(m->Accept(id).ok()) << id;
  }
  EXPECT_TRUE(m->stopped());
  const std::vector<uint32_t> mask = MaskOf(*m);
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    EXPECT_EQ(MaskAllows(mask, id), tokenizer_->IsEndOfGeneration(id)) << id;
  }
}

TEST_F(GrammarTest, ARefusedTokenIsAnErrorAndValidateCountsWithoutAdvancing) {
  auto m = Compile(GrammarSpec::Regex(R"( (yes|no)\.)"));
  const std::vector<int32_t> yes = tokenizer_->Encode(" yes.", false, false);
  std::vector<int32_t> drafts = yes;
  drafts.push_back(yes.front());  // nothing may follow the full stop
  auto ok = m->Validate(drafts);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, yes.size());
  EXPECT_FALSE(m->stopped());  // not advanced
  const int32_t maybe = tokenizer_->Encode(" maybe", false, false).front();
  absl::Status s = m->Accept(maybe);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("not allowed"));
}

TEST_F(GrammarTest, CloneKeepsTheStateAndDivergesIndependently) {
  auto m = Compile(GrammarSpec::Regex("(ab|cd)"));
  const int32_t a = tokenizer_->Encode("a", false, false).front();
  ASSERT_TRUE(m->Accept(a).ok());
  auto copy = m->Clone();
  const std::vector<uint32_t> before = MaskOf(*m);
  EXPECT_EQ(MaskOf(*copy), before);
  const int32_t b = tokenizer_->Encode("b", false, false).front();
  ASSERT_TRUE(copy->Accept(b).ok());
  EXPECT_TRUE(copy->stopped());
  EXPECT_FALSE(m->stopped());
  EXPECT_EQ(MaskOf(*m), before);
}

TEST_F(GrammarTest, BadGrammarsAreRefusedWithTheEnginesMessage) {
  struct Case {
    GrammarSpec spec;
    const char* says;
  };
  for (const Case& c : {
           Case{GrammarSpec::Regex("(unclosed"), "regex"},
           Case{GrammarSpec::JsonSchema("{not json"), "not valid JSON"},
           Case{GrammarSpec::JsonSchema(R"({"type": "nonsense"})"), "nonsense"},
           Case{GrammarSpec::Lark("start: undefined_rule"), "undefined_rule"},
       }) {
    auto m = vocab().Compile(c.spec);
    ASSERT_FALSE(m.ok()) << c.spec.text;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr(c.says)) << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr(GrammarKindName(c.spec.kind)));
  }
}

TEST_F(GrammarTest, ACompileOverItsDeadlineIsRefused) {
  // A zero deadline: refused however fast the compile would be (decided before it starts, so
  // the answer does not depend on which thread runs first).
  auto m = vocab().Compile(GrammarSpec::Regex("[a-z]+"), std::chrono::milliseconds(0));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDeadlineExceeded) << m.status();
  EXPECT_THAT(m.status().message(), HasSubstr("took longer than 0 ms"));
}

// A schema reply from the real model, greedy and speculative: valid JSON with the schema's
// keys and enum, "stop" before max_tokens, and the same tokens either way.
TEST_F(GrammarTest, SessionRepliesFollowTheSchemaWithAndWithoutSpeculation) {
  const std::string schema = R"({"type":"object","properties":{
      "city":{"type":"string","maxLength":20},
      "size":{"enum":["small","large"]},
      "rank":{"type":"integer","minimum":1,"maximum":9}},
    "required":["city","size","rank"],"additionalProperties":false})";
  const std::vector<int32_t> prompt = tokenizer_->Encode(
      "<|im_start|>user\nDescribe Paris as JSON.<|im_end|>\n<|im_start|>assistant\n", true, true);
  std::vector<int32_t> tokens[2];
  for (int spec = 0; spec < 2; ++spec) {
    auto kv = model_->NewKvCache(512, GgmlType::kF32);
    ASSERT_TRUE(kv.ok());
    Session session(*model_, *tokenizer_, *std::move(kv));
    auto m = Compile(GrammarSpec::JsonSchema(schema));
    GenerationOptions o;
    o.max_tokens = 120;
    o.sampling.temperature = 0;
    o.speculative = spec == 1;
    o.constraint = m.get();
    auto r = session.Generate(prompt, o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->finish_reason, "stop") << r->text;
    const nlohmann::json j = nlohmann::json::parse(r->text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r->text;
    EXPECT_TRUE(j["city"].is_string()) << r->text;
    EXPECT_LE(j["city"].get<std::string>().size(), 20u);
    EXPECT_TRUE(j["size"] == "small" || j["size"] == "large") << r->text;
    EXPECT_TRUE(j["rank"].is_number_integer() && j["rank"] >= 1 && j["rank"] <= 9) << r->text;
    EXPECT_EQ(j.size(), 3u) << r->text;
    tokens[spec] = r->tokens;
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

}  // namespace
}  // namespace fucina
