// Anthropic dialect: POST /v1/messages (system, content blocks, stop_sequences, thinking
// blocks), JSON or the message_start .. message_stop event stream.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/http/api.h"
#include "coordinator/http/api_common.h"
#include "coordinator/http/reply_parser.h"

namespace fucina {

using namespace http_api;  // NOLINT

namespace {

// A content field: a string, or blocks of which only text is supported.
absl::StatusOr<std::string> ReadText(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    return absl::InvalidArgumentError(where + " must be a string or an array of content blocks");
  }
  std::string text;
  for (const json& block : content) {
    const std::string type = block.is_object() ? block.value("type", "") : "";
    if (type == "thinking") continue;  // earlier turns' thinking is not re-sent to the model
    if (type != "text" || !block.contains("text") || !block["text"].is_string()) {
      return absl::InvalidArgumentError(where + ": only text blocks are supported, got '" +
                                        type + "'");
    }
    text += block["text"].get<std::string>();
  }
  return text;
}

std::string StopReason(const Outcome& o) {
  if (o.finish_reason == "length") return "max_tokens";
  return o.stop_sequence.empty() ? "end_turn" : "stop_sequence";
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

  std::vector<ChatMessage> messages;
  if (j->contains("system") && !(*j)["system"].is_null()) {
    auto system = ReadText((*j)["system"], "system");
    if (!system.ok()) return SendStatus(ex, d, system.status());
    messages.push_back({"system", *system});
  }
  if (!j->contains("messages") || !(*j)["messages"].is_array() || (*j)["messages"].empty()) {
    return SendStatus(ex, d, absl::InvalidArgumentError("field 'messages' must be a non-empty "
                                                        "array"));
  }
  for (size_t i = 0; i < (*j)["messages"].size(); ++i) {
    const json& m = (*j)["messages"][i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
        (m["role"] != "user" && m["role"] != "assistant")) {
      return SendStatus(ex, d, absl::InvalidArgumentError(where + ".role must be user or "
                                                          "assistant"));
    }
    auto text = ReadText(m.contains("content") ? m["content"] : json(nullptr), where + ".content");
    if (!text.ok()) return SendStatus(ex, d, text.status());
    messages.push_back({m["role"].get<std::string>(), *text});
  }
  ChatRenderOptions render;
  if (j->contains("thinking") && (*j)["thinking"].is_object()) {
    render.enable_thinking = (*j)["thinking"].value("type", "") == "enabled";
  }
  ThinkMode think;
  auto request = StartJob(c_, job, [&] { return RenderChat(c_, messages, render, &think); });
  if (!request.ok()) return SendStatus(ex, d, request.status());

  const std::string id = RandomId("msg_");
  ReplyParser parser(think.parse, think.open, /*parse_tools=*/false);
  if (!stream->value_or(false)) {
    std::string text, thinking;
    auto take = [&](const std::vector<ReplyEvent>& events) {
      for (const ReplyEvent& e : events) (e.kind == ReplyEvent::kReasoning ? thinking : text) += e.text;
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
    content.push_back({{"type", "text"}, {"text", text}});
    ex.Respond(200, "application/json",
               json{{"id", id},
                    {"type", "message"},
                    {"role", "assistant"},
                    {"model", c_.served_name()},
                    {"content", content},
                    {"stop_reason", StopReason(o)},
                    {"stop_sequence", o.stop_sequence.empty() ? json(nullptr)
                                                              : json(o.stop_sequence)},
                    {"usage", {{"input_tokens", o.prompt_tokens},
                               {"output_tokens", o.completion_tokens},
                               {"cache_read_input_tokens", o.cached_tokens}}}}
                   .dump());
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
  if (!open) {
    // An empty reply still has one (empty) text block.
    event("content_block_start", {{"index", 0}, {"content_block", {{"type", "text"}, {"text", ""}}}});
    index = 0;
    open = true;
  }
  event("content_block_stop", {{"index", index}});
  event("message_delta", {{"delta", {{"stop_reason", StopReason(o)},
                                     {"stop_sequence", o.stop_sequence.empty()
                                                           ? json(nullptr)
                                                           : json(o.stop_sequence)}}},
                          {"usage", {{"output_tokens", o.completion_tokens}}}});
  event("message_stop", json::object());
}

}  // namespace fucina
