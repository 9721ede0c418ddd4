// Reading the HTTP API's JSON request bodies without a model: the body parser with its nesting
// limit, and the readers of messages, content parts, tools and Responses input that turn
// client JSON into template messages. Every reader checks each value's JSON type before it reads
// it, so a hostile body is a 400 naming the field, never an exception from nlohmann::json.
//
// Kept apart from the handlers (which need a Coordinator) so the fuzz harness in tests/fuzz/
// links only this, the request framing and the reply parser.
#ifndef FUCINA_COORDINATOR_HTTP_REQUEST_JSON_H_
#define FUCINA_COORDINATOR_HTTP_REQUEST_JSON_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/chat/chat_template.h"
#include "nlohmann/json.hpp"

namespace fucina::http_api {

using json = nlohmann::json;

// The deepest nesting of arrays and objects a request body may have. Parsing is iterative, but
// everything after it (copies into the template context, dump(), the Rust template engine whose
// JSON reader stops at 128) recurses once per level; real requests (tool schemas included) stay
// far below this.
inline constexpr int kMaxJsonDepth = 64;

// The deepest array/object nesting in `text` (brackets inside strings do not count), scanning
// no further than one level past `limit`: linear, no recursion, no allocation.
int JsonNestingDepth(std::string_view text, int limit);

// Parses a request body as a JSON object. INVALID_ARGUMENT when it is nested deeper than
// kMaxJsonDepth (checked before parsing), is not JSON, or is not an object.
absl::StatusOr<json> ParseJsonObject(std::string_view body);

// Serializes for a response: invalid UTF-8 (a request path or Host echoed in an error, a cut
// template message) becomes U+FFFD instead of throwing.
std::string Dump(const json& j);

// `obj[name]` when obj is an object holding a string there; nullopt when absent or null; the
// wrong type -> INVALID_ARGUMENT naming `where`.name.
absl::StatusOr<std::optional<std::string>> StringMember(const json& obj, const char* name,
                                                        const std::string& where);

// OpenAI chat `messages` (roles system/developer/user/assistant/tool; content a string, null or
// text parts; tool_calls an array of objects; reasoning_content, tool_call_id, name strings).
absl::StatusOr<std::vector<ChatMessage>> ReadChatMessages(const json& body);

// OpenAI `tools` / `tool_choice`: the tools to render (null when none or tool_choice is none);
// *parse_tools says whether replies are scanned for tool calls; *forced_tool is set for
// tool_choice `required` ("" : any declared tool) or a named function (its name, which must be
// declared), whose call the reply is then held to (constrained decoding).
absl::StatusOr<json> ReadTools(const json& body, bool* parse_tools,
                               std::optional<std::string>* forced_tool);
// Anthropic `tools` ({name, description, input_schema}) / `tool_choice` ({type: auto | any |
// tool | none, name}): the tools in OpenAI's shape, for the chat template, and the same
// outputs as ReadTools (any: forced_tool ""; tool: its name, which must be declared).
absl::StatusOr<json> ReadAnthropicTools(const json& body, bool* parse_tools,
                                        std::optional<std::string>* forced_tool);

// Responses API `instructions` + `input` (a string, or message items whose content is a string
// or input_text / output_text parts).
absl::StatusOr<std::vector<ChatMessage>> ReadResponsesInput(const json& body);

// Anthropic `system` + `messages` (content a string or blocks: text, or earlier turns' thinking
// which is dropped).
absl::StatusOr<std::vector<ChatMessage>> ReadAnthropicMessages(const json& body);

// Anthropic `thinking`: {"type": "enabled" | "disabled", ...} -> the template's switch.
absl::StatusOr<std::optional<bool>> ReadAnthropicThinking(const json& body);

// `chat_template_kwargs.enable_thinking` (a boolean) when given.
absl::StatusOr<std::optional<bool>> ReadEnableThinking(const json& body);

}  // namespace fucina::http_api

#endif  // FUCINA_COORDINATOR_HTTP_REQUEST_JSON_H_
