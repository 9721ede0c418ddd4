// OpenAI Responses API (stateless): POST /v1/responses, JSON or typed server-sent events
// ending with response.completed. A think block (Qwen3) becomes a `reasoning` output item ahead
// of the `message` item, as OpenAI reports reasoning for open-weight models: its text in
// content[] as `reasoning_text`, streamed as response.reasoning_text.delta events.
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/http/api.h"
#include "coordinator/http/api_common.h"
#include "coordinator/http/reply_parser.h"

namespace fucina {

using namespace http_api;  // NOLINT

namespace {

// The response's output items, built from reply events in order: one item per run of a kind
// (reasoning, message), each opened on its first text and closed when the other kind starts or
// the reply ends. With an `emit` function, the items' stream events are sent as they happen.
class OutputItems {
 public:
  // emit(type, data) sends one event; false when the client is gone.
  using Emit = std::function<bool(const std::string&, json)>;
  explicit OutputItems(Emit emit) : emit_(std::move(emit)) {}

  bool Add(const ReplyEvent& e) {
    const bool reasoning = e.kind == ReplyEvent::kReasoning;
    if (e.text.empty()) return true;
    if (!open_ || open_reasoning_ != reasoning) {
      if (open_ && !Close(false)) return false;
      if (!Open(reasoning)) return false;
    }
    text_ += e.text;
    if (reasoning) reasoning_ += e.text;
    return Send(reasoning ? "response.reasoning_text.delta" : "response.output_text.delta",
                {{"item_id", id_},
                 {"output_index", items_.size()},
                 {"content_index", 0},
                 {"delta", e.text},
                 {"logprobs", json::array()}},
                reasoning);
  }

  // Closes the open item (`incomplete`: cut by max_output_tokens); a reply with no message text
  // still gets its (empty) message item.
  void Finish(bool incomplete) {
    if (open_ && open_reasoning_) Close(false);
    if (!open_) Open(false);
    Close(incomplete);
  }

  const json& items() const { return items_; }
  const std::string& reasoning() const { return reasoning_; }

 private:
  json Part(bool reasoning, const std::string& text) const {
    if (reasoning) return {{"type", "reasoning_text"}, {"text", text}};
    return {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}};
  }

  json Item(bool reasoning, const std::string& status, json content) const {
    if (reasoning) {
      return {{"type", "reasoning"}, {"id", id_}, {"summary", json::array()},
              {"content", std::move(content)}, {"status", status}};
    }
    return {{"type", "message"}, {"id", id_}, {"status", status}, {"role", "assistant"},
            {"content", std::move(content)}};
  }

  // Reasoning deltas carry no logprobs member in OpenAI's events.
  bool Send(const std::string& type, json data, bool reasoning = false) {
    if (reasoning) data.erase("logprobs");
    return !emit_ || emit_(type, std::move(data));
  }

  bool Open(bool reasoning) {
    open_ = true;
    open_reasoning_ = reasoning;
    id_ = RandomId(reasoning ? "rs_" : "msg_");
    text_.clear();
    const size_t index = items_.size();
    json item = Item(reasoning, "in_progress", json::array());
    return Send("response.output_item.added", {{"output_index", index}, {"item", item}}) &&
           Send("response.content_part.added", {{"item_id", id_},
                                                {"output_index", index},
                                                {"content_index", 0},
                                                {"part", Part(reasoning, "")}});
  }

  bool Close(bool incomplete) {
    open_ = false;
    const size_t index = items_.size();
    const bool reasoning = open_reasoning_;
    json part = Part(reasoning, text_);
    json item = Item(reasoning, incomplete ? "incomplete" : "completed", json::array({part}));
    items_.push_back(item);
    json done = {{"item_id", id_}, {"output_index", index}, {"content_index", 0}, {"text", text_},
                 {"logprobs", json::array()}};
    return Send(reasoning ? "response.reasoning_text.done" : "response.output_text.done",
                std::move(done), reasoning) &&
           Send("response.content_part.done", {{"item_id", id_},
                                               {"output_index", index},
                                               {"content_index", 0},
                                               {"part", std::move(part)}}) &&
           Send("response.output_item.done", {{"output_index", index}, {"item", std::move(item)}});
  }

  Emit emit_;
  json items_ = json::array();
  bool open_ = false;
  bool open_reasoning_ = false;
  std::string id_;
  std::string text_;  // the open item's
  std::string reasoning_;  // all reasoning text, for the usage count
};

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
  auto messages = ReadResponsesInput(*j);
  if (!messages.ok()) return SendStatus(ex, d, messages.status(), "input");
  ThinkMode think;
  // The reply's id names the request in the logs too.
  const std::string id = RandomId("resp_");
  job.request_id = id;
  auto request = StartJob(c_, job, [&] {
    return RenderChat(c_, *messages, ChatRenderOptions(), &think);
  });
  if (!request.ok()) return SendStatus(ex, d, request.status());

  const int64_t created = UnixTime();
  ReplyParser parser(think.parse, think.open, /*parse_tools=*/false);
  auto response = [&](const std::string& status, const OutputItems* items, const Outcome* o) {
    json r = {{"id", id},
              {"object", "response"},
              {"created_at", created},
              {"status", status},
              {"model", c_.served_name()},
              {"output", items != nullptr ? items->items() : json::array()},
              {"parallel_tool_calls", false},
              {"tool_choice", "auto"},
              {"tools", json::array()}};
    if (o != nullptr) {
      // The think block's share of the output, counted by re-tokenizing its text.
      const std::string& reasoning = items->reasoning();
      const int64_t reasoning_tokens =
          reasoning.empty() ? 0
                            : std::min<int64_t>(o->completion_tokens,
                                                c_.text().tokenizer().Encode(reasoning, false, false).size());
      r["usage"] = {{"input_tokens", o->prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", o->cached_tokens}}},
                    {"output_tokens", o->completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
                    {"total_tokens", o->prompt_tokens + o->completion_tokens}};
      if (o->finish_reason == "length") {
        r["status"] = "incomplete";
        r["incomplete_details"] = {{"reason", "max_output_tokens"}};
      }
    }
    return r;
  };
  if (!stream->value_or(false)) {
    OutputItems items(nullptr);
    Outcome o = Relay(**request, ex, [&](const Delta& delta) {
      for (const ReplyEvent& e : parser.Push(delta.text)) items.Add(e);
      return true;
    });
    if (!o.status.ok()) return SendStatus(ex, d, o.status);
    for (const ReplyEvent& e : parser.Finish()) items.Add(e);
    items.Finish(o.finish_reason == "length");
    ex.Respond(200, "application/json", Dump(response("completed", &items, &o)));
    return;
  }
  if (!ex.StartEvents()) return (*request)->Cancel();
  int sequence = 0;
  auto event = [&](const std::string& type, json data) {
    data["type"] = type;
    data["sequence_number"] = sequence++;
    return ex.SendEvents(SseEvent(type, data));
  };
  event("response.created", {{"response", response("in_progress", nullptr, nullptr)}});
  event("response.in_progress", {{"response", response("in_progress", nullptr, nullptr)}});
  OutputItems items(event);
  Outcome o = Relay(**request, ex, [&](const Delta& delta) {
    for (const ReplyEvent& e : parser.Push(delta.text)) {
      if (!items.Add(e)) return false;
    }
    return true;
  });
  if (!o.status.ok()) {
    event("error", {{"code", HttpStatusFor(o.status)},
                    {"message", std::string(o.status.message())},
                    {"param", nullptr}});
    return;
  }
  for (const ReplyEvent& e : parser.Finish()) items.Add(e);
  const bool incomplete = o.finish_reason == "length";
  items.Finish(incomplete);
  // Cut by max_output_tokens: OpenAI ends such a stream with response.incomplete.
  event(incomplete ? "response.incomplete" : "response.completed",
        {{"response", response("completed", &items, &o)}});
}

}  // namespace fucina
