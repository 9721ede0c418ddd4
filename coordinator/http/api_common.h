// Shared pieces of the HTTP API handlers: typed JSON field access with errors naming the field,
// the admission -> tokenization -> submission sequence, and relaying a request's output.
#ifndef FUCINA_COORDINATOR_HTTP_API_COMMON_H_
#define FUCINA_COORDINATOR_HTTP_API_COMMON_H_

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"
#include "coordinator/http/api.h"
#include "coordinator/http/request_json.h"
#include "coordinator/request_fields.h"
#include "nlohmann/json.hpp"

namespace fucina::http_api {

// Typed optional fields: absent or null -> nullopt; the wrong type -> INVALID_ARGUMENT naming
// `name`.
absl::StatusOr<std::optional<std::string>> OptString(const json& j, const char* name);
absl::StatusOr<std::optional<double>> OptNumber(const json& j, const char* name);
absl::StatusOr<std::optional<int64_t>> OptInt(const json& j, const char* name);
absl::StatusOr<std::optional<bool>> OptBool(const json& j, const char* name);

// Parses the body as a JSON object, refusing nesting deeper than kMaxJsonDepth before parsing
// (see request_json.h): every handler reads its body through here.
absl::StatusOr<json> ParseBody(const std::string& body);

// The HTTP status for an error status.
int HttpStatusFor(const absl::Status& status);

// Answers `status` in the dialect's error shape (503s carry Retry-After).
void SendStatus(HttpExchange& ex, ApiDialect dialect, const absl::Status& status,
                const std::string& param = "");

// The generation fields every endpoint shares (temperature, top_p, top_k, min_p, seed,
// penalties, logit_bias, ignore_eos, the stop strings under fields.stop_field, the reply length
// under fields.max_tokens_field) read into `fields` (which carries the endpoint's names and
// anything it read itself, such as top_logprobs), then resolved into `job` over the server's
// defaults by the one validation module (coordinator/request_fields.h).
absl::Status ReadGenerationFields(const json& j, const Coordinator& c, RequestFields fields,
                                  GenerateJob* job);

// A field this server does not implement, with the value that means "not used": absent, null or
// that value is fine; anything else is INVALID_ARGUMENT naming the field (never silently
// ignored).
struct Unsupported {
  const char* name;
  json noop;
  const char* why;
};
absl::Status RefuseUnsupported(const json& j, std::initializer_list<Unsupported> fields);

// The model field: absent means the served model; another name is NOT_FOUND.
absl::Status CheckModel(const json& j, const Coordinator& c);

// Admits (503 before any tokenization when the queue is full), builds the prompt with
// `tokenize`, submits. On error the status to answer.
absl::StatusOr<std::shared_ptr<Request>> StartJob(
    Coordinator& c, GenerateJob job,
    const std::function<absl::StatusOr<std::vector<int32_t>>()>& tokenize);

// Relays the request's output to `on_delta` until it finishes or the client goes away (then
// the request is cancelled). Returns the outcome; `on_delta` returning false also cancels. A
// request cut by the server's drain deadline (ex.Cut()) fails with UNAVAILABLE saying so.
Outcome Relay(Request& request, HttpExchange& ex, const std::function<bool(const Delta&)>& on_delta);

// Whether a reply may open with a think block (the template knows <think>) and whether the
// rendered prompt already opened one (the reply then starts inside it).
struct ThinkMode {
  bool parse = false;
  bool open = false;
};

// Renders chat messages with the model's template and tokenizes them; fills *think if given.
absl::StatusOr<std::vector<int32_t>> RenderChat(const Coordinator& c,
                                                const std::vector<ChatMessage>& messages,
                                                const ChatRenderOptions& options,
                                                ThinkMode* think = nullptr);

std::string RandomId(const std::string& prefix);

// tool_choice that forces a call (OpenAI required / named, Anthropic any / tool): holds the
// reply to a hermes `<tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>` block, N one
// of `tools` (OpenAI's shape) or `name` when not empty, its arguments to that tool's parameter
// schema; the reply parser then reads it as any call. A template with a think block may first
// close one the prompt opened. Local "$ref"s in a parameters schema (Pydantic's "#/$defs/...")
// are rebased to where it sits in the call's schema. `json_whitespace`: the request's
// guided_whitespace_pattern (else one space after ',' and ':' only). INVALID_ARGUMENT when a
// schema does not compile; RESOURCE_EXHAUSTED when too many grammars are compiling.
absl::Status ForceToolCall(const Coordinator& c, const json& tools, const std::string& name,
                           GenerateJob* job,
                           const std::optional<std::string>& json_whitespace = std::nullopt);
// Lets JSON output have whitespace matching `pattern` (a regex) between its tokens, as
// llguidance's "x-guidance" option in `schema` says (an object; anything else is left alone).
void SetJsonWhitespace(json& schema, const std::string& pattern);
int64_t UnixTime();
// Both serialize with Dump (invalid UTF-8 replaced, never thrown).
std::string SseData(const json& j);                          // "data: {...}\n\n"
std::string SseEvent(const std::string& event, const json& j);  // "event: E\ndata: {...}\n\n"

}  // namespace fucina::http_api

#endif  // FUCINA_COORDINATOR_HTTP_API_COMMON_H_
