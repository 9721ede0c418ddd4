// The last stage's side of the internal protocol: a request's grammar on the wire (both
// directions, and hostile fields refused naming the problem) and a verify verdict as a
// SegmentResult.
#include "worker/sampling_wire.h"

#include <string>

#include <gtest/gtest.h>

namespace fucina {
namespace {

TEST(GrammarWire, EveryKindRoundTripsAndNoneStaysNone) {
  for (const GrammarSpec& g : {GrammarSpec::JsonSchema(R"({"type":"object"})"),
                               GrammarSpec::Regex("(yes|no)"), GrammarSpec::Lark("start: \"a\"")}) {
    wire::Sampling s;
    GrammarToWire(g, &s);
    auto back = GrammarFromWire(s);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->kind, g.kind);
    EXPECT_EQ(back->text, g.text);
  }
  wire::Sampling none;
  GrammarToWire(GrammarSpec(), &none);
  EXPECT_TRUE(none.grammar_kind().empty());
  auto back = GrammarFromWire(none);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->empty());
}

TEST(GrammarWire, HostileFieldsAreRefusedNamingThem) {
  wire::Sampling s;
  s.set_grammar_kind("gbnf");
  s.set_grammar("root ::= \"a\"");
  auto r = GrammarFromWire(s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("unknown grammar kind 'gbnf'"), std::string::npos);
  s.set_grammar_kind("regex");
  s.set_grammar(std::string(kMaxWireGrammarBytes + 1, 'a'));
  r = GrammarFromWire(s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("at most"), std::string::npos) << r.status();
}

TEST(VerifiedWire, AcceptedDraftsThenTheEndingSampleWithLogprobs) {
  Verified v;
  v.tokens = {7, 8, 9};
  v.samples = {{7, -0.5f, {{7, -0.5f}}}, {8, -0.25f, {}}, {9, -1.0f, {{9, -1.0f}, {3, -2.0f}}}};
  v.accepted = 2;
  v.stopped = true;
  wire::SegmentResult r;
  VerifiedToWire(v, &r);
  ASSERT_EQ(r.accepted_size(), 2);
  EXPECT_EQ(r.accepted(0).id(), 7);
  EXPECT_FLOAT_EQ(r.accepted(0).logprob(), -0.5f);
  ASSERT_EQ(r.accepted(0).top_size(), 1);
  EXPECT_EQ(r.accepted(1).id(), 8);
  EXPECT_EQ(r.token(), 9);
  EXPECT_FLOAT_EQ(r.logprob(), -1.0f);
  ASSERT_EQ(r.top_size(), 2);
  EXPECT_EQ(r.top(1).id(), 3);
  EXPECT_TRUE(r.grammar_done());
}

}  // namespace
}  // namespace fucina
