// Splits a model's streamed reply into reasoning, content and tool calls, as OpenAI-style APIs
// report them: Qwen3's `<think>...</think>` block becomes reasoning, hermes-style
// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks become tool calls.
//
// Text is fed as it is generated; what Push returns is final (a tag split across pushes is held
// back until it is decided), so streaming and one-shot parsing give the same events.
#ifndef FUCINA_COORDINATOR_HTTP_REPLY_PARSER_H_
#define FUCINA_COORDINATOR_HTTP_REPLY_PARSER_H_

#include <string>
#include <string_view>
#include <vector>

namespace fucina {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, serialized
};

struct ReplyEvent {
  enum Kind { kReasoning, kContent, kToolCall };
  Kind kind;
  std::string text;  // reasoning / content
  ToolCall call;     // tool call
};

class ReplyParser {
 public:
  // parse_think: a reply opening with <think> starts with reasoning. in_think: the prompt
  // already opened the think block. parse_tools: the request declared tools.
  ReplyParser(bool parse_think, bool in_think, bool parse_tools);

  std::vector<ReplyEvent> Push(std::string_view text);
  // The end of the reply: held text is released (an unterminated tool call as content).
  std::vector<ReplyEvent> Finish();

  int tool_calls() const { return tool_calls_; }

 private:
  enum State { kStart, kThink, kAfterThink, kContent, kTool };
  void Emit(ReplyEvent::Kind kind, std::string text, std::vector<ReplyEvent>* out);
  // Releases pending_ up to (not including) any suffix that could begin `tag`.
  void EmitUpToPartial(ReplyEvent::Kind kind, const std::string& tag,
                       std::vector<ReplyEvent>* out);

  State state_;
  bool parse_tools_;
  bool think_leading_;  // at the start of the think block
  std::string pending_;
  int tool_calls_ = 0;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_HTTP_REPLY_PARSER_H_
