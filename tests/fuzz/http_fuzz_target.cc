#include "tests/fuzz/http_fuzz_target.h"

#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/http/reply_parser.h"
#include "coordinator/http/request_framing.h"
#include "coordinator/http/request_json.h"

namespace fucina {
namespace {

namespace http = boost::beast::http;
using http_api::json;

// A reader's result must be a value or INVALID_ARGUMENT with a message (a 400 naming the field).
template <class T>
std::string CheckReader(const absl::StatusOr<T>& r, const char* name) {
  if (r.ok()) return "";
  if (!absl::IsInvalidArgument(r.status()) || r.status().message().empty()) {
    return absl::StrCat(name, ": ", r.status().ToString());
  }
  return "";
}

std::string CheckBody(std::string_view body) {
  auto j = http_api::ParseJsonObject(body);
  if (!j.ok()) return CheckReader(j, "ParseJsonObject");
  if (http_api::JsonNestingDepth(body, http_api::kMaxJsonDepth) > http_api::kMaxJsonDepth) {
    return "a body past the nesting limit was parsed";
  }
  std::string err;
  auto messages = http_api::ReadChatMessages(*j);
  err += CheckReader(messages, "ReadChatMessages");
  bool parse_tools = false;
  std::optional<std::string> forced_tool;
  auto tools = http_api::ReadTools(*j, &parse_tools, &forced_tool);
  err += CheckReader(tools, "ReadTools");
  err += CheckReader(http_api::ReadAnthropicTools(*j, &parse_tools, &forced_tool),
                     "ReadAnthropicTools");
  err += CheckReader(http_api::ReadResponsesInput(*j), "ReadResponsesInput");
  err += CheckReader(http_api::ReadAnthropicMessages(*j), "ReadAnthropicMessages");
  err += CheckReader(http_api::ReadAnthropicThinking(*j), "ReadAnthropicThinking");
  err += CheckReader(http_api::ReadEnableThinking(*j), "ReadEnableThinking");
  // What the template context and the responses do with the values: copies and dumps.
  if (messages.ok()) {
    for (const ChatMessage& m : *messages) {
      nlohmann::ordered_json calls = m.tool_calls;
      (void)calls.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
    }
  }
  if (tools.ok()) (void)http_api::Dump(*tools);
  (void)http_api::Dump(*j);
  return err;
}

// The body as a model's reply, in two pieces (tags split across pushes), tools on.
void ParseAsReply(std::string_view text) {
  for (bool think : {false, true}) {
    ReplyParser parser(true, think, true);
    const size_t half = text.size() / 2;
    for (const ReplyEvent& e : parser.Push(text.substr(0, half))) (void)e;
    for (const ReplyEvent& e : parser.Push(text.substr(half))) (void)e;
    for (const ReplyEvent& e : parser.Finish()) (void)e;
  }
}

}  // namespace

std::string FuzzHttpRequest(const uint8_t* data, size_t size) {
  MemoryStream stream(std::string_view(reinterpret_cast<const char*>(data), size), 1 + size % 32);
  const RequestLimits limits;  // the server's defaults
  boost::beast::flat_buffer buffer;
  // Pipelined requests, as a connection reads them, until the input ends or one is refused.
  for (int i = 0; i < 64; ++i) {
    http::request_parser<http::string_body> parser;
    const std::optional<ReadError> err = ReadRequest(stream, buffer, parser, limits);
    if (err) {
      for (int status : {0, 400, 408, 413, 431, 501}) {
        if (err->status == status) return "";
      }
      return absl::StrCat("unexpected read status ", err->status, ": ", err->message);
    }
    const HttpRequest& req = parser.get();
    if (req.body().size() > limits.max_body_bytes) return "a body past the limit was read";
    if (req.count(http::field::host) > 1) return "two Host headers were accepted";
    if (req.count(http::field::transfer_encoding) > 0 && !parser.chunked()) {
      return "a Transfer-Encoding not ending in chunked was accepted";
    }
    if (std::string err = CheckBody(req.body()); !err.empty()) return err;
    ParseAsReply(req.body());
    if (!req.keep_alive()) break;
  }
  return "";
}

}  // namespace fucina
