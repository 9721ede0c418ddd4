#include "coordinator/http/api_common.h"

#include <chrono>
#include <limits>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/http/request_framing.h"

namespace fucina::http_api {
namespace {

absl::Status TypeError(const char* name, const char* want) {
  return absl::InvalidArgumentError(absl::StrCat("field '", name, "' must be ", want));
}

}  // namespace

absl::StatusOr<std::optional<std::string>> OptString(const json& j, const char* name) {
  if (!j.contains(name) || j[name].is_null()) return std::nullopt;
  if (!j[name].is_string()) return TypeError(name, "a string");
  return j[name].get<std::string>();
}

absl::StatusOr<std::optional<double>> OptNumber(const json& j, const char* name) {
  if (!j.contains(name) || j[name].is_null()) return std::nullopt;
  if (!j[name].is_number()) return TypeError(name, "a number");
  const double v = j[name].get<double>();
  if (!std::isfinite(v)) return TypeError(name, "a finite number");
  return v;
}

absl::StatusOr<std::optional<int64_t>> OptInt(const json& j, const char* name) {
  if (!j.contains(name) || j[name].is_null()) return std::nullopt;
  if (!j[name].is_number_integer()) return TypeError(name, "an integer");
  // nlohmann keeps integers above INT64_MAX as unsigned; get<int64_t> would wrap them.
  if (j[name].is_number_unsigned() &&
      j[name].get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return TypeError(name, "an integer of at most 9223372036854775807");
  }
  return j[name].get<int64_t>();
}

absl::StatusOr<std::optional<bool>> OptBool(const json& j, const char* name) {
  if (!j.contains(name) || j[name].is_null()) return std::nullopt;
  if (!j[name].is_boolean()) return TypeError(name, "a boolean");
  return j[name].get<bool>();
}

absl::StatusOr<json> ParseBody(const std::string& body) { return ParseJsonObject(body); }

int HttpStatusFor(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnimplemented:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kCancelled:
      return 499;
    default:
      return 500;
  }
}

void SendStatus(HttpExchange& ex, ApiDialect dialect, const absl::Status& status,
                const std::string& param) {
  const int code = HttpStatusFor(status);
  std::string error_code;
  if (absl::IsNotFound(status)) error_code = "model_not_found";
  // Messages about a field start "field 'NAME'": that is the param.
  std::string p = param;
  const std::string message(status.message());
  if (p.empty() && message.rfind("field '", 0) == 0) {
    const size_t end = message.find('\'', 7);
    if (end != std::string::npos) p = message.substr(7, end - 7);
  }
  if (p.empty() && absl::IsNotFound(status)) p = "model";
  SendError(ex, dialect, code, message, p, error_code);
}

absl::Status CheckModel(const json& j, const Coordinator& c) {
  auto model = OptString(j, "model");
  if (!model.ok()) return model.status();
  if (*model && !c.Serves(**model)) {
    return absl::NotFoundError(absl::StrCat("the model '", Echo(**model),
                                            "' does not exist (serving '", c.served_name(), "')"));
  }
  return absl::OkStatus();
}

absl::Status ReadGenerationFields(const json& j, const Coordinator& c, RequestFields f,
                                  GenerateJob* job) {
#define FUCINA_READ(getter, field, target) \
  {                                        \
    auto v = getter(j, field);             \
    if (!v.ok()) return v.status();        \
    if (*v) target = **v;                  \
  }
  FUCINA_READ(OptNumber, "temperature", f.temperature);
  FUCINA_READ(OptNumber, "top_p", f.top_p);
  FUCINA_READ(OptInt, "top_k", f.top_k);
  FUCINA_READ(OptNumber, "min_p", f.min_p);
  FUCINA_READ(OptNumber, "presence_penalty", f.presence_penalty);
  FUCINA_READ(OptNumber, "frequency_penalty", f.frequency_penalty);
  FUCINA_READ(OptNumber, "repetition_penalty", f.repetition_penalty);
  FUCINA_READ(OptBool, "ignore_eos", f.ignore_eos);
  FUCINA_READ(OptBool, "speculative", f.speculative);
  FUCINA_READ(OptInt, f.max_tokens_field.c_str(), f.max_tokens);
#undef FUCINA_READ
  if (j.contains("seed") && !j["seed"].is_null()) {
    // Any 64-bit integer, signed or not: a negative seed is its two's complement.
    if (j["seed"].is_number_unsigned()) {
      f.seed = j["seed"].get<uint64_t>();
    } else if (j["seed"].is_number_integer()) {
      f.seed = static_cast<uint64_t>(j["seed"].get<int64_t>());
    } else {
      return absl::InvalidArgumentError("field 'seed' must be an integer");
    }
  }
  if (j.contains("logit_bias") && !j["logit_bias"].is_null()) {
    // OpenAI's shape: {"<token id>": bias, ...}.
    const json& bias = j["logit_bias"];
    if (!bias.is_object()) {
      return absl::InvalidArgumentError(
          "field 'logit_bias' must be an object mapping token ids to biases");
    }
    for (const auto& [key, value] : bias.items()) {
      int64_t id;
      if (!absl::SimpleAtoi(key, &id)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "field 'logit_bias' must map token ids to biases; '", ValidUtf8(key),
            "' is not a token id"));
      }
      if (!value.is_number()) {
        return absl::InvalidArgumentError(
            absl::StrCat("field 'logit_bias': the bias of token ", id, " must be a number"));
      }
      f.logit_bias.emplace_back(id, value.get<double>());
    }
  }
  const std::string& stop_field = f.stop_field;
  if (j.contains(stop_field) && !j[stop_field].is_null()) {
    const json& stop = j[stop_field];
    const absl::Status bad = absl::InvalidArgumentError(
        absl::StrCat("field '", stop_field, "' must be a string or an array of strings"));
    if (stop.is_string()) {
      f.stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (const json& s : stop) {
        if (!s.is_string()) return bad;
        f.stop.push_back(s.get<std::string>());
      }
    } else {
      return bad;
    }
  }
  const CoordinatorOptions& o = c.options();
  return ResolveRequestFields(f, o.sampling, o.max_tokens, c.text().tokenizer().vocab_size(), job);
}

absl::Status RefuseUnsupported(const json& j, std::initializer_list<Unsupported> fields) {
  for (const Unsupported& u : fields) {
    if (!j.contains(u.name) || j[u.name].is_null() || j[u.name] == u.noop) continue;
    return absl::InvalidArgumentError(
        absl::StrCat("field '", u.name, "' is not supported: ", u.why));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Request>> StartJob(
    Coordinator& c, GenerateJob job,
    const std::function<absl::StatusOr<std::vector<int32_t>>()>& tokenize) {
  return StartRequest(c.scheduler(), [&]() -> absl::StatusOr<GenerateJob> {
    auto prompt = tokenize();
    if (!prompt.ok()) return prompt.status();
    job.prompt = *std::move(prompt);
    return std::move(job);
  });
}

Outcome Relay(Request& request, HttpExchange& ex,
              const std::function<bool(const Delta&)>& on_delta) {
  Outcome o = RelayRequest(request, [&ex] { return ex.ClientGone(); }, on_delta);
  if (!o.status.ok() && ex.Cut()) {
    // The reply is cancelled by shutdown, not by its client: say so (as an error event when
    // streaming, the headers being gone).
    o.status = absl::UnavailableError(
        "the server is shutting down: its drain deadline (--drain-timeout) passed before this "
        "reply was finished");
  }
  return o;
}

absl::StatusOr<std::vector<int32_t>> RenderChat(const Coordinator& c,
                                                const std::vector<ChatMessage>& messages,
                                                const ChatRenderOptions& options,
                                                ThinkMode* think) {
  std::string text;
  auto ids = c.text().EncodeChat(messages, options, &text);
  if (!ids.ok()) return ids.status();
  if (think != nullptr) {
    think->parse = c.text().chat_template().source().find("<think>") != std::string::npos;
    const size_t open = text.rfind("<think>");
    think->open = open != std::string::npos && text.find("</think>", open) == std::string::npos;
  }
  return ids;
}

void SetJsonWhitespace(json& schema, const std::string& pattern) {
  if (schema.is_object()) schema["x-guidance"] = {{"whitespace_pattern", pattern}};
}

namespace {

// A tool's parameters sit at `at` (a JSON pointer) in the call's schema, whose root is not
// theirs: their local references ("#/$defs/Color", what Pydantic writes, or "#" itself) are
// rewritten to point there. Values that are data (const, enum, default, examples) are left as
// they are. Iterative: the body's nesting limit bounds the depth, not the stack.
void RebaseLocalRefs(json& schema, const std::string& at) {
  std::vector<json*> todo = {&schema};
  while (!todo.empty()) {
    json* v = todo.back();
    todo.pop_back();
    if (v->is_array()) {
      for (json& item : *v) todo.push_back(&item);
      continue;
    }
    if (!v->is_object()) continue;
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string& key = it.key();
      if (key == "$ref") {
        if (it->is_string() && it->get_ref<const std::string&>().starts_with('#')) {
          *it = "#" + at + it->get_ref<const std::string&>().substr(1);
        }
      } else if (key != "const" && key != "enum" && key != "default" && key != "examples") {
        todo.push_back(&*it);
      }
    }
  }
}

}  // namespace

absl::Status ForceToolCall(const Coordinator& c, const json& tools, const std::string& name,
                           GenerateJob* job, const std::optional<std::string>& json_whitespace) {
  if (!job->grammar.empty()) {
    return absl::InvalidArgumentError(
        "tool_choice forces a tool call: the reply cannot also follow response_format or "
        "guided_*");
  }
  const bool think = c.text().chat_template().source().find("<think>") != std::string::npos;
  json calls = json::array();
  for (const json& t : tools) {
    const json& fn = t["function"];
    if (!name.empty() && fn["name"] != name) continue;
    json params = fn.contains("parameters") && fn["parameters"].is_object()
                      ? fn["parameters"]
                      : json{{"type", "object"}};
    params.erase("x-guidance");  // options apply to the whole schema, set below
    calls.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", fn["name"]}}}, {"arguments", params}}},
                     {"required", {"name", "arguments"}},
                     {"additionalProperties", false}});
  }
  // Where each tool's parameters end up: the references in them are rebased there.
  for (size_t i = 0; i < calls.size(); ++i) {
    RebaseLocalRefs(calls[i]["properties"]["arguments"],
                    (calls.size() == 1 ? std::string() : absl::StrCat("/anyOf/", i)) +
                        "/properties/arguments");
  }
  json schema = calls.size() == 1 ? calls[0] : json{{"anyOf", calls}};
  if (json_whitespace.has_value()) SetJsonWhitespace(schema, *json_whitespace);
  std::string lark = "start: ";
  if (think) lark += "(\"</think>\\n\\n\")? ";
  lark += "\"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json " + schema.dump() + "\n";
  job->grammar = GrammarSpec::Lark(std::move(lark));
  if (absl::Status s = c.text().CheckGrammar(job->grammar); !s.ok()) {
    // Busy compiling is not the schema's fault: kept so the client retries.
    if (absl::IsResourceExhausted(s)) return s;
    return absl::InvalidArgumentError(absl::StrCat("tools: a parameters schema: ", s.message()));
  }
  return absl::OkStatus();
}

std::string RandomId(const std::string& prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id.push_back(kHex[rng() % 16]);
  return id;
}

int64_t UnixTime() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string SseData(const json& j) { return "data: " + Dump(j) + "\n\n"; }

std::string SseEvent(const std::string& event, const json& j) {
  return "event: " + event + "\ndata: " + Dump(j) + "\n\n";
}

}  // namespace fucina::http_api
