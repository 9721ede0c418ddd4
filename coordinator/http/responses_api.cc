// OpenAI Responses API (stateless): POST /v1/responses, JSON or typed server-sent events
// ending with response.completed.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/http/api.h"
#include "coordinator/http/api_common.h"

namespace fucina {

using namespace http_api;  // NOLINT

namespace {

// `input`: a string, or items {role, content} / {type: "message", role, content} whose content
// is a string or parts of type input_text / output_text.
absl::StatusOr<std::vector<ChatMessage>> ReadInput(const json& j) {
  std::vector<ChatMessage> out;
  auto instructions = OptString(j, "instructions");
  if (!instructions.ok()) return instructions.status();
  if (*instructions) out.push_back({"system", **instructions});
  if (!j.contains("input")) return absl::InvalidArgumentError("field 'input' is required");
  const json& input = j["input"];
  if (input.is_string()) {
    out.push_back({"user", input.get<std::string>()});
    return out;
  }
  if (!input.is_array()) {
    return absl::InvalidArgumentError("field 'input' must be a string or an array of items");
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string where = absl::StrCat("input[", i, "]");
    if (!item.is_object() || !item.contains("role") || !item["role"].is_string()) {
      return absl::InvalidArgumentError(where + " must be a message with a role");
    }
    ChatMessage m;
    m.role = item["role"].get<std::string>();
    if (m.role == "developer") m.role = "system";
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(where + ".role '" + m.role + "' is not supported");
    }
    const json content = item.contains("content") ? item["content"] : json(nullptr);
    if (content.is_string()) {
      m.content = content.get<std::string>();
    } else if (content.is_array()) {
      for (const json& part : content) {
        const std::string type = part.is_object() ? part.value("type", "") : "";
        if ((type != "input_text" && type != "output_text") || !part.contains("text") ||
            !part["text"].is_string()) {
          return absl::InvalidArgumentError(where +
                                            ".content parts must be input_text or output_text");
        }
        m.content += part["text"].get<std::string>();
      }
    } else {
      return absl::InvalidArgumentError(where + ".content must be a string or an array of parts");
    }
    out.push_back(std::move(m));
  }
  if (out.empty()) return absl::InvalidArgumentError("field 'input' must not be empty");
  return out;
}

}  // namespace

void Api::Responses(const std::string& body, HttpExchange& ex) {
  const ApiDialect d = ApiDialect::kOpenAi;
  auto j = ParseBody(body);
  if (!j.ok()) return SendStatus(ex, d, j.status());
  if (absl::Status s = CheckModel(*j, c_); !s.ok()) return SendStatus(ex, d, s, "model");
  GenerateJob job;
  RequestFields fields;
  fields.max_tokens_field = "max_output_tokens";
  if (absl::Status s = ReadGenerationFields(*j, c_, std::move(fields), &job); !s.ok()) {
    return SendStatus(ex, d, s);
  }
  auto stream = OptBool(*j, "stream");
  if (!stream.ok()) return SendStatus(ex, d, stream.status(), "stream");
  auto messages = ReadInput(*j);
  if (!messages.ok()) return SendStatus(ex, d, messages.status(), "input");
  auto request = StartJob(c_, job, [&] { return RenderChat(c_, *messages, ChatRenderOptions()); });
  if (!request.ok()) return SendStatus(ex, d, request.status());

  const std::string id = RandomId("resp_");
  const std::string item_id = RandomId("msg_");
  const int64_t created = UnixTime();
  auto response = [&](const std::string& status, const std::string& text, const Outcome* o) {
    json r = {{"id", id},
              {"object", "response"},
              {"created_at", created},
              {"status", status},
              {"model", c_.served_name()},
              {"output", json::array()},
              {"parallel_tool_calls", false},
              {"tool_choice", "auto"},
              {"tools", json::array()}};
    if (o != nullptr) {
      r["output"].push_back({{"type", "message"},
                             {"id", item_id},
                             {"status", o->finish_reason == "length" ? "incomplete" : "completed"},
                             {"role", "assistant"},
                             {"content", json::array({{{"type", "output_text"},
                                                       {"text", text},
                                                       {"annotations", json::array()}}})}});
      r["usage"] = {{"input_tokens", o->prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", o->cached_tokens}}},
                    {"output_tokens", o->completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", 0}}},
                    {"total_tokens", o->prompt_tokens + o->completion_tokens}};
      if (o->finish_reason == "length") {
        r["status"] = "incomplete";
        r["incomplete_details"] = {{"reason", "max_output_tokens"}};
      }
    }
    return r;
  };
  if (!stream->value_or(false)) {
    std::string text;
    Outcome o = Relay(**request, ex, [&](const Delta& delta) {
      text += delta.text;
      return true;
    });
    if (!o.status.ok()) return SendStatus(ex, d, o.status);
    ex.Respond(200, "application/json", response("completed", text, &o).dump());
    return;
  }
  if (!ex.StartEvents()) return (*request)->Cancel();
  int sequence = 0;
  auto event = [&](const std::string& type, json data) {
    data["type"] = type;
    data["sequence_number"] = sequence++;
    return ex.SendEvents(SseEvent(type, data));
  };
  event("response.created", {{"response", response("in_progress", "", nullptr)}});
  event("response.in_progress", {{"response", response("in_progress", "", nullptr)}});
  json item = {{"type", "message"}, {"id", item_id}, {"status", "in_progress"},
               {"role", "assistant"}, {"content", json::array()}};
  event("response.output_item.added", {{"output_index", 0}, {"item", item}});
  json part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}};
  event("response.content_part.added",
        {{"item_id", item_id}, {"output_index", 0}, {"content_index", 0}, {"part", part}});
  std::string text;
  Outcome o = Relay(**request, ex, [&](const Delta& delta) {
    if (delta.text.empty()) return true;
    text += delta.text;
    return event("response.output_text.delta", {{"item_id", item_id},
                                                {"output_index", 0},
                                                {"content_index", 0},
                                                {"delta", delta.text},
                                                {"logprobs", json::array()}});
  });
  if (!o.status.ok()) {
    event("error", {{"code", HttpStatusFor(o.status)},
                    {"message", std::string(o.status.message())},
                    {"param", nullptr}});
    return;
  }
  event("response.output_text.done", {{"item_id", item_id},
                                      {"output_index", 0},
                                      {"content_index", 0},
                                      {"text", text},
                                      {"logprobs", json::array()}});
  part["text"] = text;
  event("response.content_part.done",
        {{"item_id", item_id}, {"output_index", 0}, {"content_index", 0}, {"part", part}});
  const bool incomplete = o.finish_reason == "length";
  item["status"] = incomplete ? "incomplete" : "completed";
  item["content"] = json::array({part});
  event("response.output_item.done", {{"output_index", 0}, {"item", item}});
  // Cut by max_output_tokens: OpenAI ends such a stream with response.incomplete.
  event(incomplete ? "response.incomplete" : "response.completed",
        {{"response", response("completed", text, &o)}});
}

}  // namespace fucina
