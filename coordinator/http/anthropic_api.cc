// Anthropic dialect: POST /v1/messages (system, content blocks, stop_sequences, thinking
// blocks), JSON or the message_start .. message_stop event stream.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/http/api.h"
#include "coordinator/http/api_common.h"
#include "coordinator/http/reply_parser.h"
#include "coordinator/http/request_json.h"

namespace fucina {

using namespace http_api;  // NOLINT

namespace {

std::string StopReason(const Outcome& o, const ReplyParser& parser) {
  if (parser.tool_calls() > 0) return "tool_use";
  if (o.finish_reason == "length") return "max_tokens";
  return o.stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

// A parsed call as a tool_use block (its arguments as the input object).
json ToolUse(const ToolCall& call) {
  json input = json::parse(call.arguments, nullptr, false);
  if (!input.is_object()) input = json::object();
  return {{"type", "tool_use"}, {"id", RandomId("toolu_")}, {"name", call.name}, {"input", input}};
}

}  // namespace

void Api::Messages(const std::string& body, HttpExchange& ex) {
  const ApiDialect d = ApiDialect::kAnthropic;
  auto j = ParseBody(body);
  if (!j.ok()) return SendStatus(ex, d, j.status());
  if (absl::Status s = CheckModel(*j, c_); !s.ok()) return SendStatus(ex, d, s);
  GenerateJob job;
  RequestFields fields;
  fields.stop_field = "stop_sequences";
  fields.max_tokens_required = true;
  if (absl::Status s = ReadGenerationFields(*j, c_, std::move(fields), &job); !s.ok()) {
    return SendStatus(ex, d, s);
  }
  auto stream = OptBool(*j, "stream");
  if (!stream.ok()) return SendStatus(ex, d, stream.status());

  auto messages = ReadAnthropicMessages(*j);
  if (!messages.ok()) return SendStatus(ex, d, messages.status());
  ChatRenderOptions render;
  bool parse_tools = false;
  std::optional<std::string> forced_tool;
  auto tools = ReadAnthropicTools(*j, &parse_tools, &forced_tool);
  if (!tools.ok()) return SendStatus(ex, d, tools.status());
  render.tools = *tools;
  if (forced_tool.has_value()) {
    if (absl::Status s = ForceToolCall(c_, *tools, *forced_tool, &job); !s.ok()) {
      return SendStatus(ex, d, s);
    }
  }
  auto thinking_switch = ReadAnthropicThinking(*j);
  if (!thinking_switch.ok()) return SendStatus(ex, d, thinking_switch.status());
  render.enable_thinking = *thinking_switch;
  ThinkMode think;
  // The reply's id names the request in the logs too.
  const std::string id = RandomId("msg_");
  job.request_id = id;
  auto request = StartJob(c_, job, [&] { return RenderChat(c_, *messages, render, &think); });
  if (!request.ok()) return SendStatus(ex, d, request.status());

  ReplyParser parser(think.parse, think.open, parse_tools);
  if (!stream->value_or(false)) {
    std::string text, thinking;
    json calls = json::array();
    auto take = [&](const std::vector<ReplyEvent>& events) {
      for (const ReplyEvent& e : events) {
        if (e.kind == ReplyEvent::kToolCall) {
          calls.push_back(ToolUse(e.call));
        } else {
          (e.kind == ReplyEvent::kReasoning ? thinking : text) += e.text;
        }
      }
    };
    Outcome o = Relay(**request, ex, [&](const Delta& delta) {
      take(parser.Push(delta.text));
      return true;
    });
    if (!o.status.ok()) return SendStatus(ex, d, o.status);
    take(parser.Finish());
    json content = json::array();
    if (!thinking.empty()) {
      content.push_back({{"type", "thinking"}, {"thinking", thinking}, {"signature", ""}});
    }
    if (!text.empty() || calls.empty()) content.push_back({{"type", "text"}, {"text", text}});
    for (json& call : calls) content.push_back(std::move(call));
    ex.Respond(200, "application/json",
               Dump(json{{"id", id},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", c_.served_name()},
                    {"content", content},
                    {"stop_reason", StopReason(o, parser)},
                    {"stop_sequence", o.stop_sequence.empty() ? json(nullptr)
                                                              : json(o.stop_sequence)},
                    {"usage", {{"input_tokens", o.prompt_tokens},
                               {"output_tokens", o.completion_tokens},
                               {"cache_read_input_tokens", o.cached_tokens}}}}));
    return;
  }

  if (!ex.StartEvents()) return (*request)->Cancel();
  auto event = [&](const std::string& type, json data) {
    data["type"] = type;
    return ex.SendEvents(SseEvent(type, data));
  };
  event("message_start", {{"message", {{"id", id},
                                       {"type", "message"},
                                       {"role", "assistant"},
                                       {"model", c_.served_name()},
                                       {"content", json::array()},
                                       {"stop_reason", nullptr},
                                       {"stop_sequence", nullptr},
                                       {"usage", {{"input_tokens", (*request)->prompt_tokens()},
                                                  {"output_tokens", 0}}}}}});
  // Content blocks open on their first text; a kind change closes the open one.
  int index = -1;
  ReplyEvent::Kind open_kind = ReplyEvent::kContent;
  bool open = false;
  auto send = [&](const ReplyEvent& e) {
    if (e.kind == ReplyEvent::kToolCall) {
      // A whole block: start (input empty), the input as one JSON delta, stop.
      if (open) event("content_block_stop", {{"index", index}});
      open = false;
      json block = ToolUse(e.call);
      const std::string input = block["input"].dump();
      block["input"] = json::object();
      ++index;
      return event("content_block_start", {{"index", index}, {"content_block", block}}) &&
             event("content_block_delta",
                   {{"index", index},
                    {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}}) &&
             event("content_block_stop", {{"index", index}});
    }
    if (!open || e.kind != open_kind) {
      if (open) event("content_block_stop", {{"index", index}});
      ++index;
      open = true;
      open_kind = e.kind;
      event("content_block_start",
            {{"index", index},
             {"content_block", e.kind == ReplyEvent::kReasoning
                                   ? json{{"type", "thinking"}, {"thinking", ""}}
                                   : json{{"type", "text"}, {"text", ""}}}});
    }
    return event("content_block_delta",
                 {{"index", index},
                  {"delta", e.kind == ReplyEvent::kReasoning
                                ? json{{"type", "thinking_delta"}, {"thinking", e.text}}
                                : json{{"type", "text_delta"}, {"text", e.text}}}});
  };
  Outcome o = Relay(**request, ex, [&](const Delta& delta) {
    for (const ReplyEvent& e : parser.Push(delta.text)) {
      if (!send(e)) return false;
    }
    return true;
  });
  if (!o.status.ok()) {
    event("error", {{"error", {{"type", "api_error"}, {"message", std::string(o.status.message())}}}});
    return;
  }
  for (const ReplyEvent& e : parser.Finish()) send(e);
  if (index < 0) {
    // An empty reply still has one (empty) text block.
    event("content_block_start", {{"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}});
    index = 0;
    open = true;
  }
  if (open) event("content_block_stop", {{"index", index}});
  event("message_delta", {{"delta", {{"stop_reason", StopReason(o, parser)},
                                     {"stop_sequence", o.stop_sequence.empty()
                                                           ? json(nullptr)
                                                           : json(o.stop_sequence)}}},
                          {"usage", {{"output_tokens", o.completion_tokens}}}});
  event("message_stop", json::object());
}

}  // namespace fucina
