// OpenAI dialect: /v1/chat/completions, /v1/completions, /v1/responses, /v1/models, and the
// /tokenize + /detokenize extensions.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/http/api.h"
#include "coordinator/http/api_common.h"
#include "coordinator/http/reply_parser.h"

namespace fucina {

using namespace http_api;  // NOLINT: the handlers' shared vocabulary

void SendError(HttpExchange& ex, ApiDialect dialect, int status, const std::string& message,
               const std::string& param, const std::string& code, const std::string& allow) {
  std::map<std::string, std::string> headers;
  if (status == 503) headers.emplace("Retry-After", "1");
  if (!allow.empty()) headers.emplace("Allow", allow);
  json body;
  if (dialect == ApiDialect::kAnthropic) {
    const char* type = status == 401   ? "authentication_error"
                       : status == 403 ? "permission_error"
                       : status == 404 ? "not_found_error"
                       : status == 413 ? "request_too_large"
                       : status == 503 ? "overloaded_error"
                       : status >= 500 ? "api_error"
                                       : "invalid_request_error";
    body = {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
  } else {
    const char* type = status == 401   ? "authentication_error"
                       : status == 503 ? "server_error"
                       : status >= 500 ? "api_error"
                                       : "invalid_request_error";
    body = {{"error",
             {{"message", message},
              {"type", type},
              {"param", param.empty() ? json(nullptr) : json(param)},
              {"code", code.empty() ? json(nullptr) : json(code)}}}};
  }
  ex.Respond(status, "application/json", Dump(body), headers);
}

namespace {

// The most guided_choice strings (10,000 compile in ~0.2 s on one core).
constexpr size_t kMaxGuidedChoices = 10'000;

// `text` as a regular expression that matches it literally (regex_syntax's metacharacters
// escaped).
std::string RegexLiteral(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (std::string_view("\\.+*?()|[]{}^$#&-~").find(ch) != std::string_view::npos) out += '\\';
    out += ch;
  }
  return out;
}

// The reply's grammar: OpenAI's response_format (json_object; json_schema with its schema,
// enforced whatever `strict` says) or vLLM's extensions guided_json, guided_regex,
// guided_grammar (a Lark grammar) and guided_choice. At most one of them. JSON output has one
// space after ',' and ':' and no other whitespace unless `json_whitespace` (vLLM's
// guided_whitespace_pattern) gives a pattern for the whitespace allowed between its tokens.
absl::StatusOr<GrammarSpec> ReadGrammar(const json& j,
                                        const std::optional<std::string>& json_whitespace) {
  GrammarSpec spec;
  std::string from;
  auto set = [&](const char* field, GrammarSpec g) -> absl::Status {
    if (!from.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("fields '", from, "' and '", field,
                                                     "' both constrain the reply: give one"));
    }
    from = field;
    spec = std::move(g);
    return absl::OkStatus();
  };
  if (j.contains("response_format") && !j["response_format"].is_null()) {
    const json& f = j["response_format"];
    if (!f.is_object() || !f.contains("type") || !f["type"].is_string()) {
      return absl::InvalidArgumentError("field 'response_format' must be an object with a 'type'");
    }
    const std::string type = f["type"].get<std::string>();
    if (type == "json_object") {
      if (absl::Status s = set("response_format", GrammarSpec::JsonObject()); !s.ok()) return s;
    } else if (type == "json_schema") {
      const auto js = f.find("json_schema");
      if (js == f.end() || !js->is_object() || !js->contains("schema") ||
          !(*js)["schema"].is_object()) {
        return absl::InvalidArgumentError(
            "response_format.json_schema must be an object whose 'schema' is the JSON schema");
      }
      if (js->contains("strict") && !(*js)["strict"].is_null() && !(*js)["strict"].is_boolean()) {
        return absl::InvalidArgumentError("response_format.json_schema.strict must be a boolean");
      }
      if (absl::Status s = set("response_format", GrammarSpec::JsonSchema((*js)["schema"].dump()));
          !s.ok()) {
        return s;
      }
    } else if (type != "text") {
      return absl::InvalidArgumentError("response_format.type '" + type +
                                        "' is not one of text, json_object, json_schema");
    }
  }
  if (const auto g = j.find("guided_json"); g != j.end() && !g->is_null()) {
    if (!g->is_object() && !g->is_string()) {
      return absl::InvalidArgumentError("field 'guided_json' must be a JSON schema (an object or its text)");
    }
    if (absl::Status s = set("guided_json", GrammarSpec::JsonSchema(
                                                g->is_string() ? g->get<std::string>() : g->dump()));
        !s.ok()) {
      return s;
    }
  }
  for (const auto& [field, kind] : {std::pair{"guided_regex", GrammarSpec::Kind::kRegex},
                                    std::pair{"guided_grammar", GrammarSpec::Kind::kLark}}) {
    const auto g = j.find(field);
    if (g == j.end() || g->is_null()) continue;
    if (!g->is_string()) return absl::InvalidArgumentError(absl::StrCat("field '", field, "' must be a string"));
    if (absl::Status s = set(field, GrammarSpec{kind, g->get<std::string>()}); !s.ok()) return s;
  }
  if (const auto g = j.find("guided_choice"); g != j.end() && !g->is_null()) {
    if (!g->is_array() || g->empty()) {
      return absl::InvalidArgumentError("field 'guided_choice' must be a non-empty array of strings");
    }
    if (g->size() > kMaxGuidedChoices) {
      return absl::InvalidArgumentError(absl::StrCat("field 'guided_choice' has ", g->size(),
                                                     " choices; at most ", kMaxGuidedChoices,
                                                     " are allowed"));
    }
    // One regular expression, the choices as its alternatives: a single lexeme. As a Lark rule
    // of literals, each choice was a lexeme of its own (compile time quadratic in their number)
    // and an item of the parser's row (past 2,000 the reply failed at its first token).
    std::string regex;
    for (size_t i = 0; i < g->size(); ++i) {
      if (!(*g)[i].is_string()) {
        return absl::InvalidArgumentError("field 'guided_choice' must be a non-empty array of strings");
      }
      regex += (i > 0 ? "|" : "") + RegexLiteral((*g)[i].get<std::string>());
    }
    if (absl::Status s = set("guided_choice", GrammarSpec::Regex(regex)); !s.ok()) return s;
  }
  if (json_whitespace.has_value() && !spec.empty()) {
    if (spec.kind != GrammarSpec::Kind::kJsonSchema) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'guided_whitespace_pattern' applies to JSON output, not to '", from, "'"));
    }
    json schema = json::parse(spec.text, nullptr, false);
    // Text that is not JSON is left for the grammar engine to refuse with its own message.
    if (!schema.is_discarded()) {
      SetJsonWhitespace(schema, *json_whitespace);
      spec.text = schema.dump();
    }
  }
  return spec;
}

json LogprobJson(const Tokenizer& tok, int32_t id, float logprob) {
  // `token` must be valid UTF-8 (JSON); `bytes` keeps the raw piece, as OpenAI's does.
  const std::string raw = tok.TokenToPiece(id);
  json bytes = json::array();
  for (unsigned char ch : raw) bytes.push_back(static_cast<int>(ch));
  return {{"token", ValidUtf8(raw)}, {"logprob", logprob}, {"bytes", bytes}};
}

json ChatLogprobs(const Tokenizer& tok, const Delta& d) {
  json content = json::array();
  for (size_t i = 0; i < d.ids.size(); ++i) {
    // The end-of-turn token ends the reply; it is not part of the content.
    if (tok.IsEndOfGeneration(d.ids[i])) continue;
    json e = LogprobJson(tok, d.ids[i], d.samples[i].logprob);
    json top = json::array();
    for (const TokenLogprob& t : d.samples[i].top) top.push_back(LogprobJson(tok, t.id, t.logprob));
    e["top_logprobs"] = top;
    content.push_back(e);
  }
  return content;
}

json UsageJson(const Outcome& o) {
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.prompt_tokens + o.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}}};
}

struct CommonRequest {
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
  std::optional<std::string> json_whitespace;  // guided_whitespace_pattern
};

absl::Status ReadCommon(const json& j, const Coordinator& c, GenerateJob* job, CommonRequest* r,
                        bool chat) {
  if (absl::Status s = CheckModel(j, c); !s.ok()) return s;
  RequestFields fields;
  // Chat: max_completion_tokens replaced max_tokens; either is accepted, the newer one wins.
  if (chat && j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null()) {
    fields.max_tokens_field = "max_completion_tokens";
  }
  auto n = OptInt(j, "n");
  if (!n.ok()) return n.status();
  if (*n && **n != 1) return absl::InvalidArgumentError("field 'n': only n=1 is supported");
  auto stream = OptBool(j, "stream");
  if (!stream.ok()) return stream.status();
  r->stream = stream->value_or(false);
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    if (!j["stream_options"].is_object()) {
      return absl::InvalidArgumentError("field 'stream_options' must be an object");
    }
    auto u = OptBool(j["stream_options"], "include_usage");
    if (!u.ok()) return u.status();
    r->include_usage = u->value_or(false);
  }
  // Chat: logprobs is a boolean + top_logprobs; completions: logprobs is the count.
  if (chat) {
    auto lp = OptBool(j, "logprobs");
    if (!lp.ok()) return lp.status();
    r->logprobs = lp->value_or(false);
    auto top = OptInt(j, "top_logprobs");
    if (!top.ok()) return top.status();
    fields.top_logprobs = *top;
  } else {
    auto lp = OptInt(j, "logprobs");
    if (!lp.ok()) return lp.status();
    if (*lp) {
      if (**lp < 0 || **lp > kMaxTopLogprobs) {
        return absl::InvalidArgumentError(
            absl::StrCat("field 'logprobs' must be in [0, ", kMaxTopLogprobs, "]"));
      }
      r->logprobs = true;
      fields.top_logprobs = *lp;
    }
    if (absl::Status s = RefuseUnsupported(
            j, {{"echo", false, "the prompt is not echoed back"},
                {"best_of", 1, "only one completion is generated (best_of 1)"},
                {"suffix", "", "insertion (text after the completion) is not supported"}});
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = ReadGenerationFields(j, c, std::move(fields), job); !s.ok()) return s;
  auto whitespace = OptString(j, "guided_whitespace_pattern");
  if (!whitespace.ok()) return whitespace.status();
  r->json_whitespace = *std::move(whitespace);
  auto grammar = ReadGrammar(j, r->json_whitespace);
  if (!grammar.ok()) return grammar.status();
  job->grammar = *std::move(grammar);
  return c.text().CheckGrammar(job->grammar);
}

}  // namespace

void Api::ChatCompletions(const std::string& body, HttpExchange& ex) {
  const ApiDialect d = ApiDialect::kOpenAi;
  auto j = ParseBody(body);
  if (!j.ok()) return SendStatus(ex, d, j.status());
  GenerateJob job;
  CommonRequest r;
  if (absl::Status s = ReadCommon(*j, c_, &job, &r, true); !s.ok()) return SendStatus(ex, d, s);
  auto messages = ReadChatMessages(*j);
  if (!messages.ok()) return SendStatus(ex, d, messages.status(), "messages");
  bool parse_tools = false;
  std::optional<std::string> forced_tool;
  auto tools = ReadTools(*j, &parse_tools, &forced_tool);
  if (!tools.ok()) return SendStatus(ex, d, tools.status());
  if (forced_tool.has_value()) {
    if (absl::Status s = ForceToolCall(c_, *tools, *forced_tool, &job, r.json_whitespace);
        !s.ok()) {
      return SendStatus(ex, d, s);
    }
  }
  ChatRenderOptions render;
  render.tools = *tools;
  auto enable_thinking = ReadEnableThinking(*j);
  if (!enable_thinking.ok()) return SendStatus(ex, d, enable_thinking.status());
  render.enable_thinking = *enable_thinking;
  ThinkMode think;
  // The reply's id names the request in the logs too.
  const std::string id = RandomId("chatcmpl-");
  job.request_id = id;
  auto request = StartJob(c_, job, [&] { return RenderChat(c_, *messages, render, &think); });
  if (!request.ok()) return SendStatus(ex, d, request.status());

  const int64_t created = UnixTime();
  ReplyParser parser(think.parse, think.open, parse_tools);
  const Tokenizer& tok = c_.text().tokenizer();
  auto chunk = [&](json delta, json finish, json logprobs) {
    return SseData({{"id", id},
                    {"object", "chat.completion.chunk"},
                    {"created", created},
                    {"model", c_.served_name()},
                    {"choices",
                     json::array({{{"index", 0},
                                   {"delta", std::move(delta)},
                                   {"logprobs", std::move(logprobs)},
                                   {"finish_reason", std::move(finish)}}})}});
  };
  std::string content, reasoning;
  json tool_calls = json::array();
  json logprobs = json::array();
  // One reply event -> a streamed delta (or the accumulated message).
  auto delta_of = [&](const ReplyEvent& e) -> json {
    if (e.kind == ReplyEvent::kContent) {
      content += e.text;
      return {{"content", e.text}};
    }
    if (e.kind == ReplyEvent::kReasoning) {
      reasoning += e.text;
      return {{"reasoning_content", e.text}};
    }
    json call = {{"id", RandomId("call_")},
                 {"type", "function"},
                 {"function", {{"name", e.call.name}, {"arguments", e.call.arguments}}}};
    tool_calls.push_back(call);
    call["index"] = tool_calls.size() - 1;
    return {{"tool_calls", json::array({call})}};
  };

  if (r.stream) {
    if (!ex.StartEvents()) return (*request)->Cancel();
    ex.SendEvents(chunk({{"role", "assistant"}, {"content", ""}}, nullptr, nullptr));
    Outcome o = Relay(**request, ex, [&](const Delta& delta) {
      json lp = r.logprobs ? json{{"content", ChatLogprobs(tok, delta)}} : json(nullptr);
      bool sent_lp = false;
      for (const ReplyEvent& e : parser.Push(delta.text)) {
        if (!ex.SendEvents(chunk(delta_of(e), nullptr, sent_lp ? json(nullptr) : lp))) {
          return false;
        }
        sent_lp = true;
      }
      if (!sent_lp && r.logprobs && !lp["content"].empty()) {
        return ex.SendEvents(chunk(json::object(), nullptr, lp));
      }
      return true;
    });
    if (!o.status.ok()) {
      // Headers are gone: the error travels as an event.
      ex.SendEvents(SseData({{"error", {{"message", std::string(o.status.message())},
                                        {"type", "server_error"},
                                        {"code", HttpStatusFor(o.status)}}}}));
      ex.SendEvents("data: [DONE]\n\n");
      return;
    }
    for (const ReplyEvent& e : parser.Finish()) ex.SendEvents(chunk(delta_of(e), nullptr, nullptr));
    const std::string finish = parser.tool_calls() > 0 ? "tool_calls" : o.finish_reason;
    ex.SendEvents(chunk(json::object(), finish, nullptr));
    if (r.include_usage) {
      ex.SendEvents(SseData({{"id", id},
                             {"object", "chat.completion.chunk"},
                             {"created", created},
                             {"model", c_.served_name()},
                             {"choices", json::array()},
                             {"usage", UsageJson(o)}}));
    }
    ex.SendEvents("data: [DONE]\n\n");
    return;
  }

  Outcome o = Relay(**request, ex, [&](const Delta& delta) {
    for (const ReplyEvent& e : parser.Push(delta.text)) delta_of(e);
    if (r.logprobs) {
      for (json& e : ChatLogprobs(tok, delta)) logprobs.push_back(std::move(e));
    }
    return true;
  });
  if (!o.status.ok()) return SendStatus(ex, d, o.status);
  for (const ReplyEvent& e : parser.Finish()) delta_of(e);
  json message = {{"role", "assistant"}, {"content", content}};
  if (!reasoning.empty()) message["reasoning_content"] = reasoning;
  if (!tool_calls.empty()) {
    message["tool_calls"] = tool_calls;
    if (content.empty()) message["content"] = nullptr;
  }
  json response = {
      {"id", id},
      {"object", "chat.completion"},
      {"created", created},
      {"model", c_.served_name()},
      {"choices", json::array({{{"index", 0},
                                {"message", message},
                                {"logprobs", r.logprobs ? json{{"content", logprobs}}
                                                        : json(nullptr)},
                                {"finish_reason",
                                 tool_calls.empty() ? o.finish_reason : "tool_calls"}}})},
      {"usage", UsageJson(o)}};
  ex.Respond(200, "application/json", Dump(response));
}

void Api::Completions(const std::string& body, HttpExchange& ex) {
  const ApiDialect d = ApiDialect::kOpenAi;
  auto j = ParseBody(body);
  if (!j.ok()) return SendStatus(ex, d, j.status());
  GenerateJob job;
  CommonRequest r;
  if (absl::Status s = ReadCommon(*j, c_, &job, &r, false); !s.ok()) return SendStatus(ex, d, s);
  if (!j->contains("prompt")) return SendStatus(ex, d, absl::InvalidArgumentError("field 'prompt' is required"), "prompt");
  json prompt = (*j)["prompt"];
  // A one-element batch is the prompt itself.
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    prompt = prompt[0];
  }
  std::vector<int32_t> ids;
  bool text_prompt = prompt.is_string();
  if (!text_prompt) {
    if (!prompt.is_array() || prompt.empty()) {
      return SendStatus(ex, d, absl::InvalidArgumentError(
                                   "field 'prompt' must be a string or an array of token ids"),
                        "prompt");
    }
    for (const json& t : prompt) {
      if (!t.is_number_integer()) {
        return SendStatus(ex, d, absl::InvalidArgumentError(
                                     "field 'prompt' must be a string or an array of token ids"),
                          "prompt");
      }
      // Checked as 64-bit so a huge id is refused rather than wrapped into the vocabulary.
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id >= c_.text().tokenizer().vocab_size()) {
        return SendStatus(ex, d, absl::InvalidArgumentError(absl::StrCat(
                                     "token id ", Dump(t), " outside the vocabulary [0, ",
                                     c_.text().tokenizer().vocab_size(), ")")),
                          "prompt");
      }
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  // The reply's id names the request in the logs too.
  const std::string id = RandomId("cmpl-");
  job.request_id = id;
  auto request = StartJob(c_, job, [&]() -> absl::StatusOr<std::vector<int32_t>> {
    if (text_prompt) return c_.text().Encode(prompt.get<std::string>(), true);
    return ids;
  });
  if (!request.ok()) return SendStatus(ex, d, request.status());
  const int64_t created = UnixTime();
  const Tokenizer& tok = c_.text().tokenizer();
  auto logprobs_of = [&](const Delta& delta) {
    json tokens = json::array(), lps = json::array(), tops = json::array();
    for (size_t i = 0; i < delta.ids.size(); ++i) {
      if (tok.IsEndOfGeneration(delta.ids[i])) continue;
      tokens.push_back(ValidUtf8(tok.TokenToPiece(delta.ids[i])));
      lps.push_back(delta.samples[i].logprob);
      json top = json::object();
      for (const TokenLogprob& t : delta.samples[i].top) {
        top[ValidUtf8(tok.TokenToPiece(t.id))] = t.logprob;
      }
      tops.push_back(top);
    }
    return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}};
  };
  auto choice = [&](const std::string& text, json finish, json lp) {
    return json{{"index", 0}, {"text", text}, {"logprobs", lp}, {"finish_reason", finish}};
  };
  if (r.stream) {
    if (!ex.StartEvents()) return (*request)->Cancel();
    Outcome o = Relay(**request, ex, [&](const Delta& delta) {
      return ex.SendEvents(SseData({{"id", id},
                                    {"object", "text_completion"},
                                    {"created", created},
                                    {"model", c_.served_name()},
                                    {"choices", json::array({choice(
                                                    delta.text, nullptr,
                                                    r.logprobs ? logprobs_of(delta)
                                                               : json(nullptr))})}}));
    });
    if (o.status.ok()) {
      ex.SendEvents(SseData({{"id", id},
                             {"object", "text_completion"},
                             {"created", created},
                             {"model", c_.served_name()},
                             {"choices", json::array({choice("", o.finish_reason, nullptr)})}}));
      if (r.include_usage) {
        ex.SendEvents(SseData({{"id", id},
                               {"object", "text_completion"},
                               {"created", created},
                               {"model", c_.served_name()},
                               {"choices", json::array()},
                               {"usage", UsageJson(o)}}));
      }
    } else {
      ex.SendEvents(SseData({{"error", {{"message", std::string(o.status.message())},
                                        {"type", "server_error"}}}}));
    }
    ex.SendEvents("data: [DONE]\n\n");
    return;
  }
  std::string text;
  json lp_all = {{"tokens", json::array()}, {"token_logprobs", json::array()},
                 {"top_logprobs", json::array()}};
  Outcome o = Relay(**request, ex, [&](const Delta& delta) {
    text += delta.text;
    if (r.logprobs) {
      json lp = logprobs_of(delta);
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs"}) {
        for (json& v : lp[k]) lp_all[k].push_back(std::move(v));
      }
    }
    return true;
  });
  if (!o.status.ok()) return SendStatus(ex, d, o.status);
  ex.Respond(200, "application/json",
             Dump(json{{"id", id},
                  {"object", "text_completion"},
                  {"created", created},
                  {"model", c_.served_name()},
                  {"choices", json::array({choice(text, o.finish_reason,
                                                  r.logprobs ? lp_all : json(nullptr))})},
                  {"usage", UsageJson(o)}}));
}

void Api::Models(HttpExchange& ex) {
  json model = {{"id", c_.served_name()},
                {"object", "model"},
                {"created", UnixTime()},
                {"owned_by", "fucina"},
                {"max_model_len", c_.options().context}};
  ex.Respond(200, "application/json",
             Dump(json{{"object", "list"}, {"data", json::array({model})}}));
}

void Api::Tokenize(const std::string& body, HttpExchange& ex) {
  const ApiDialect d = ApiDialect::kOpenAi;
  auto j = ParseBody(body);
  if (!j.ok()) return SendStatus(ex, d, j.status());
  if (absl::Status s = CheckModel(*j, c_); !s.ok()) return SendStatus(ex, d, s, "model");
  // vLLM names the text `prompt`, llama.cpp `content`.
  auto prompt = OptString(*j, "prompt");
  if (!prompt.ok()) return SendStatus(ex, d, prompt.status(), "prompt");
  auto content = OptString(*j, "content");
  if (!content.ok()) return SendStatus(ex, d, content.status(), "content");
  if (!*prompt && !*content) {
    return SendStatus(ex, d, absl::InvalidArgumentError("field 'prompt' (or 'content') is required"),
                      "prompt");
  }
  auto add_special = OptBool(*j, "add_special_tokens");
  if (!add_special.ok()) return SendStatus(ex, d, add_special.status());
  auto add_special2 = OptBool(*j, "add_special");
  if (!add_special2.ok()) return SendStatus(ex, d, add_special2.status());
  const bool add = add_special->value_or(add_special2->value_or(true));
  const std::vector<int32_t> ids = c_.text().tokenizer().Encode(*prompt ? **prompt : **content, add, true);
  ex.Respond(200, "application/json",
             Dump(json{{"tokens", ids},
                       {"count", ids.size()},
                       {"max_model_len", c_.options().context}}));
}

void Api::Detokenize(const std::string& body, HttpExchange& ex) {
  const ApiDialect d = ApiDialect::kOpenAi;
  auto j = ParseBody(body);
  if (!j.ok()) return SendStatus(ex, d, j.status());
  if (absl::Status s = CheckModel(*j, c_); !s.ok()) return SendStatus(ex, d, s, "model");
  if (!j->contains("tokens") || !(*j)["tokens"].is_array()) {
    return SendStatus(ex, d, absl::InvalidArgumentError("field 'tokens' must be an array of token ids"),
                      "tokens");
  }
  std::vector<int32_t> ids;
  for (const json& t : (*j)["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= c_.text().tokenizer().vocab_size()) {
      return SendStatus(ex, d, absl::InvalidArgumentError(absl::StrCat(
                                   "field 'tokens' must hold token ids in [0, ",
                                   c_.text().tokenizer().vocab_size(), ")")),
                        "tokens");
    }
    ids.push_back(t.get<int32_t>());
  }
  const std::string text = ValidUtf8(c_.text().tokenizer().Decode(ids));
  ex.Respond(200, "application/json", Dump(json{{"prompt", text}, {"content", text}}));
}

}  // namespace fucina
