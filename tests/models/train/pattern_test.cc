// Client regexes (models/train/pattern.h): RE2 semantics, bounds, and errors that name the
// ECMAScript construct a client probably meant.
#include "models/train/pattern.h"

#include <chrono>
#include <string>

#include <gtest/gtest.h>

namespace fucina::train {
namespace {

TEST(PatternTest, MatchesWholeNamesAndSearchesText) {
  auto tensors = Pattern::Compile("blk\\.[0-9]+\\.(attn_q|attn_v)\\.weight", "tensors");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_TRUE(tensors->FullMatch("blk.12.attn_q.weight"));
  EXPECT_FALSE(tensors->FullMatch("blk.12.attn_q.weight.extra"));
  EXPECT_FALSE(tensors->FullMatch("xblk.1.attn_v.weight"));
  auto rule = Pattern::Compile("\\d+\\s*(apples|pears)", "rule");
  ASSERT_TRUE(rule.ok()) << rule.status();
  EXPECT_TRUE(rule->Search("I count 12 apples today"));
  EXPECT_FALSE(rule->Search("no fruit here"));
}

TEST(PatternTest, ConstructsRe2LacksAreNamed) {
  const struct {
    const char* pattern;
    const char* named;
  } cases[] = {{"(?=a)b", "lookahead (?=...)"},
               {"(?!a)b", "negative lookahead (?!...)"},
               {"x(?<=a)b", "lookbehind (?<=...)"},
               {"(?<!a)b", "negative lookbehind (?<!...)"},
               {"(a)b\\1", "backreference \\1"},
               {"(?<year>\\d+)", "named group (?<name>...)"}};
  for (const auto& c : cases) {
    auto p = Pattern::Compile(c.pattern, "rule");
    ASSERT_FALSE(p.ok()) << c.pattern;
    EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
    EXPECT_NE(p.status().message().find(c.named), std::string::npos) << p.status();
    EXPECT_EQ(p.status().message().rfind("rule: ", 0), 0u) << p.status();
  }
  auto bad = Pattern::Compile("([", "tensors");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tensors: not a valid RE2 regex"), std::string::npos)
      << bad.status();
}

TEST(PatternTest, SizeAndDepthAreBounded) {
  EXPECT_FALSE(Pattern::Compile("", "rule").ok());
  auto longest = Pattern::Compile(std::string(kMaxPatternBytes, 'a'), "rule");
  EXPECT_TRUE(longest.ok()) << longest.status();
  auto too_long = Pattern::Compile(std::string(kMaxPatternBytes + 1, 'a'), "rule");
  ASSERT_FALSE(too_long.ok());
  EXPECT_NE(too_long.status().message().find("4096"), std::string::npos);
  // Nesting to the length bound: compiles or is refused, never recurses off the stack.
  const std::string deep = std::string(2000, '(') + "a" + std::string(2000, ')');
  (void)Pattern::Compile(deep, "rule");
  // A program past the memory bound is refused, not built.
  auto huge = Pattern::Compile("\\pL{1000}", "rule");  // each letter class: many ranges
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("MiB"), std::string::npos) << huge.status();
}

TEST(PatternTest, BacktrackingBombsRunInLinearTime) {
  auto bomb = Pattern::Compile("(.|.|.)*Z", "rule");
  ASSERT_TRUE(bomb.ok()) << bomb.status();
  const std::string text(100'000, 'a');
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(bomb->Search(text));
  EXPECT_FALSE(bomb->FullMatch(text));
  // Generous: a backtracking engine would not finish this in the lifetime of the machine.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace fucina::train
