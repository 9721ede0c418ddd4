#include "coordinator/http/api_common.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"

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
  if (*model && !(*model)->empty() && **model != c.served_name()) {
    return absl::NotFoundError(absl::StrCat("the model '", **model, "' does not exist (serving '",
                                            c.served_name(), "')"));
  }
  return absl::OkStatus();
}

absl::Status ReadSampling(const json& j, const Coordinator& c, GenerateJob* job,
                          const char* stop_field) {
  const CoordinatorOptions& o = c.options();
  job->sampling = o.sampling;
  job->max_tokens = o.max_tokens;
#define FUCINA_READ(getter, field, target)                   \
  {                                                          \
    auto v = getter(j, field);                               \
    if (!v.ok()) return v.status();                          \
    if (*v) target = static_cast<decltype(target)>(**v);     \
  }
  FUCINA_READ(OptNumber, "temperature", job->sampling.temperature);
  FUCINA_READ(OptNumber, "top_p", job->sampling.top_p);
  FUCINA_READ(OptInt, "top_k", job->sampling.top_k);
  FUCINA_READ(OptNumber, "min_p", job->sampling.min_p);
  FUCINA_READ(OptNumber, "presence_penalty", job->sampling.presence_penalty);
  FUCINA_READ(OptNumber, "frequency_penalty", job->sampling.frequency_penalty);
  FUCINA_READ(OptNumber, "repetition_penalty", job->sampling.repetition_penalty);
  FUCINA_READ(OptInt, "seed", job->sampling.seed);
  FUCINA_READ(OptBool, "ignore_eos", job->ignore_eos);
#undef FUCINA_READ
  if (job->sampling.temperature < 0) {
    return absl::InvalidArgumentError("field 'temperature' must be >= 0");
  }
  if (j.contains(stop_field) && !j[stop_field].is_null()) {
    const json& stop = j[stop_field];
    if (stop.is_string()) {
      job->stop.push_back(stop.get<std::string>());
    } else if (stop.is_array()) {
      for (const json& s : stop) {
        if (!s.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat("field '", stop_field, "' must be a string or an array of strings"));
        }
        job->stop.push_back(s.get<std::string>());
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("field '", stop_field, "' must be a string or an array of strings"));
    }
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
  return RelayRequest(request, [&ex] { return ex.ClientGone(); }, on_delta);
}

absl::StatusOr<std::vector<int32_t>> RenderChat(const Coordinator& c,
                                                const std::vector<ChatMessage>& messages,
                                                const ChatRenderOptions& options,
                                                ThinkMode* think) {
  auto text = c.chat_template().Render(messages, options);
  if (!text.ok()) return text.status();
  if (think != nullptr) {
    think->parse = c.chat_template().source().find("<think>") != std::string::npos;
    const size_t open = text->rfind("<think>");
    think->open = open != std::string::npos && text->find("</think>", open) == std::string::npos;
  }
  return c.tokenizer().Encode(*text, true, true);
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
