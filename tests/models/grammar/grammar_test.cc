// The grammar engine on SmolLM2's real vocabulary: masks checked against a brute-force scan of
// every token's text, acceptance and the stopped state, errors with the engine's own words, the
// compile deadline, and constrained generation (plain and speculative) in a Session.
#include "models/grammar/grammar.h"

#include <cstdlib>
#include <latch>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

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
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("could not be held to its grammar at token ",
                                                   maybe)));
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

// Grammars whose compile recursed past the thread's stack (and killed the process) are refused
// before compiling, naming the limit; the same shapes within the limits compile.
TEST_F(GrammarTest, DeepGrammarsAreRefusedNamingTheLimit) {
  auto chain = [](int rules) {
    std::string g = "start: r0\n";
    for (int i = 0; i < rules; ++i) absl::StrAppend(&g, "r", i, ": r", i + 1, " | \"x\"\n");
    absl::StrAppend(&g, "r", rules, ": \"y\"\n");
    return g;
  };
  auto refs = [](int links) {
    nlohmann::json defs = nlohmann::json::object();
    for (int i = 0; i < links; ++i) {
      defs[absl::StrCat("d", i)] = {
          {"type", "object"},
          {"properties", {{"n", {{"$ref", absl::StrCat("#/$defs/d", i + 1)}}}}}};
    }
    defs[absl::StrCat("d", links)] = {{"type", "string"}};
    return nlohmann::json{{"$ref", "#/$defs/d0"}, {"$defs", defs}}.dump();
  };
  struct Case {
    GrammarSpec spec;
    const char* says;
  };
  for (const Case& c : {
           Case{GrammarSpec::Lark(chain(5000)), "at most 2000 are allowed"},
           Case{GrammarSpec::JsonSchema(refs(1000)), "at most 2000 are allowed"},
           Case{GrammarSpec::Regex(std::string(1 << 20, 'a') + "b"), "at most 1048576 are allowed"},
       }) {
    auto m = vocab().Compile(c.spec);
    ASSERT_FALSE(m.ok()) << c.spec.text.size();
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_THAT(m.status().message(), HasSubstr(c.says));
  }
  EXPECT_NE(Compile(GrammarSpec::Lark(chain(1500))), nullptr);
  EXPECT_NE(Compile(GrammarSpec::JsonSchema(refs(400))), nullptr);
}

// Compiles cannot be stopped, so they are counted until they end, late ones included; past the
// most at once a new one is refused (RESOURCE_EXHAUSTED: the caller retries), not queued behind
// a thread of its own.
TEST_F(GrammarTest, CompilesInFlightAreBoundedAndRefusedWhenFull) {
  // ~9,000 literals: within the limits, a compile of some tens of milliseconds at least.
  std::string slow = "start: \"c0\"";
  for (int i = 1; i < 9000; ++i) slow += " | \"choice " + std::to_string(i) + "\"";
  const int n = MaxGrammarCompilesInFlight() + 8;
  std::vector<absl::Status> got(n);
  std::latch start(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      got[i] = vocab().Compile(GrammarSpec::Lark(slow), std::chrono::seconds(60)).status();
    });
  }
  for (std::thread& t : threads) t.join();
  int refused = 0;
  for (const absl::Status& s : got) {
    if (absl::IsResourceExhausted(s)) {
      ++refused;
      EXPECT_THAT(s.message(), HasSubstr("try again")) << s;
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
  EXPECT_GE(refused, 1);
  // One refused at its deadline still counts while it runs (or, not yet taken up by a thread,
  // is withdrawn and never runs), then the count drains.
  auto late = vocab().Compile(GrammarSpec::Lark(slow), std::chrono::milliseconds(1));
  EXPECT_TRUE(absl::IsDeadlineExceeded(late.status()) || absl::IsResourceExhausted(late.status()))
      << late.status();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (GrammarCompilesInFlight() > 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(GrammarCompilesInFlight(), 0);
}

// JSON has one space after ',' and ':' and no other whitespace, so a reply cannot run on in
// newlines until max_tokens; a schema's own "x-guidance" options win.
TEST_F(GrammarTest, JsonWhitespaceIsFixedUnlessTheSchemaAsksOtherwise) {
  const std::string schema =
      R"({"type":"object","properties":{"steps":{"type":"array","items":{"type":"string"}}}})";
  const int32_t newline = tokenizer_->Encode("\n", false, false).front();
  const int32_t space = tokenizer_->Encode(" ", false, false).front();
  auto after = [&](const GrammarSpec& spec, const std::string& prefix) {
    auto m = Compile(spec);
    for (int32_t id : tokenizer_->Encode(prefix, false, false)) EXPECT_TRUE(m->Accept(id).ok()) << prefix;
    return MaskOf(*m);
  };
  const std::string lark = "start: \"> \" %json " + schema + "\n";
  for (const GrammarSpec& spec : {GrammarSpec::JsonSchema(schema), GrammarSpec::Lark(lark)}) {
    const std::string lead = spec.kind == GrammarSpec::Kind::kLark ? "> " : "";
    for (const std::string prefix : {"{", "{\"steps\":", "{\"steps\": [\"tea\"", "{\"steps\": [\"tea\","}) {
      const std::vector<uint32_t> mask = after(spec, lead + prefix);
      EXPECT_FALSE(MaskAllows(mask, newline)) << GrammarKindName(spec.kind) << " after " << prefix;
      EXPECT_EQ(MaskAllows(mask, space), prefix.back() == ':' || prefix.back() == ',')
          << GrammarKindName(spec.kind) << " after " << prefix;
    }
  }
  const std::string own = R"({"x-guidance":{"whitespace_flexible":true},"type":"object"})";
  EXPECT_TRUE(MaskAllows(after(GrammarSpec::JsonSchema(own), "{"), newline));
}

// A grammar whose lexer outgrows the engine's per-token limits mid-reply: the error a client
// reads says so in plain words, without the engine's prefixes or its state dump.
TEST_F(GrammarTest, AGrammarFailingMidReplySaysWhyInPlainWords) {
  auto m = Compile(GrammarSpec::Regex("(a{1,1000}){1,1000}(b{1,1000}){1,1000}"));
  const int32_t a = tokenizer_->Encode("a", false, false).front();
  absl::Status failed;
  std::vector<uint32_t> mask;
  for (int step = 0; step < 200 && failed.ok(); ++step) {
    failed = m->Mask(&mask);
    if (failed.ok()) failed = m->Accept(a);
  }
  ASSERT_FALSE(failed.ok()) << "the lexer never outgrew its limits";
  EXPECT_THAT(failed.message(), HasSubstr("could not be held to its grammar")) << failed;
  for (const char* internal : {"grammar mask", "lexer error:", "parser error:", "<state>", "\n"}) {
    EXPECT_THAT(failed.message(), ::testing::Not(HasSubstr(internal))) << failed;
  }
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
