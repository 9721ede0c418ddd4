// The reply parser: think blocks, hermes tool calls, tags split across pushes.
#include "coordinator/http/reply_parser.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fucina {
namespace {

struct Parsed {
  std::string reasoning, content;
  std::vector<ToolCall> calls;
};

Parsed Collect(const std::vector<ReplyEvent>& events, Parsed p = {}) {
  for (const ReplyEvent& e : events) {
    if (e.kind == ReplyEvent::kReasoning) p.reasoning += e.text;
    if (e.kind == ReplyEvent::kContent) p.content += e.text;
    if (e.kind == ReplyEvent::kToolCall) p.calls.push_back(e.call);
  }
  return p;
}

// Feeds `text` in pieces of `step` bytes.
Parsed Parse(const std::string& text, size_t step, bool think, bool in_think, bool tools) {
  ReplyParser parser(think, in_think, tools);
  Parsed p;
  for (size_t i = 0; i < text.size(); i += step) p = Collect(parser.Push(text.substr(i, step)), p);
  return Collect(parser.Finish(), p);
}

const std::string kReply =
    "<think>\nThe user wants weather.\n</think>\n\nLet me check. <tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";

TEST(ReplyParser, SplitsThinkContentAndToolCallsWhateverThePieces) {
  for (size_t step : {1u, 2u, 3u, 7u, 1000u}) {
    Parsed p = Parse(kReply, step, true, false, true);
    EXPECT_EQ(p.reasoning, "The user wants weather.") << step;
    EXPECT_EQ(p.content, "Let me check. ") << step;
    ASSERT_EQ(p.calls.size(), 2u) << step;
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","days":2})");
    EXPECT_EQ(p.calls[1].name, "get_time");
    EXPECT_EQ(p.calls[1].arguments, "{}");
  }
}

TEST(ReplyParser, WithoutToolsTheTagsStayContent) {
  Parsed p = Parse(kReply, 5, true, false, false);
  EXPECT_EQ(p.reasoning, "The user wants weather.");
  EXPECT_NE(p.content.find("<tool_call>"), std::string::npos);
  EXPECT_TRUE(p.calls.empty());
}

TEST(ReplyParser, NoThinkBlockIsAllContent) {
  Parsed p = Parse("Paris is the capital. <thinking> is not a tag", 4, true, false, true);
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "Paris is the capital. <thinking> is not a tag");
}

TEST(ReplyParser, PromptOpenedThinkBlock) {
  Parsed p = Parse("step one\n</think>\n\nanswer", 3, true, true, false);
  EXPECT_EQ(p.reasoning, "step one");
  EXPECT_EQ(p.content, "answer");
}

TEST(ReplyParser, UnterminatedThinkIsReasoning) {
  Parsed p = Parse("<think>still going", 2, true, false, false);
  EXPECT_EQ(p.reasoning, "still going");
  EXPECT_EQ(p.content, "");
}

TEST(ReplyParser, MalformedOrUnterminatedToolCallsStayContent) {
  Parsed bad = Parse("a <tool_call>not json</tool_call> b", 3, false, false, true);
  EXPECT_TRUE(bad.calls.empty());
  EXPECT_EQ(bad.content, "a <tool_call>not json</tool_call> b");
  Parsed open = Parse("a <tool_call>{\"name\": \"x\"", 3, false, false, true);
  EXPECT_TRUE(open.calls.empty());
  EXPECT_EQ(open.content, "a <tool_call>{\"name\": \"x\"");
}

TEST(ReplyParser, PartialTagAtTheEndIsReleasedOnFinish) {
  Parsed p = Parse("ends with <tool_ca", 100, false, false, true);
  EXPECT_EQ(p.content, "ends with <tool_ca");
}

TEST(ReplyParser, StringArgumentsPassThrough) {
  Parsed p = Parse("<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>", 4,
                   false, false, true);
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].arguments, "{\"a\": 1}");
}

}  // namespace
}  // namespace fucina
