// The HTTP API handlers: request JSON -> scheduler job -> response JSON or server-sent events,
// in the OpenAI (chat completions, completions, responses, models) and Anthropic (messages)
// dialects, plus vLLM/llama.cpp-style /tokenize and /detokenize.
#ifndef FUCINA_COORDINATOR_HTTP_API_H_
#define FUCINA_COORDINATOR_HTTP_API_H_

#include <string>

#include "coordinator/coordinator.h"
#include "coordinator/http/http_server.h"

namespace fucina {

enum class ApiDialect { kOpenAi, kAnthropic };

// Writes an error in the dialect's shape: OpenAI {"error": {message, type, param, code}},
// Anthropic {"type": "error", "error": {type, message}}. 503s carry Retry-After; `allow` is the
// Allow header of a 405.
void SendError(HttpExchange& exchange, ApiDialect dialect, int status, const std::string& message,
               const std::string& param = "", const std::string& code = "",
               const std::string& allow = "");

class Api {
 public:
  explicit Api(Coordinator& coordinator) : c_(coordinator) {}

  void ChatCompletions(const std::string& body, HttpExchange& exchange);
  void Completions(const std::string& body, HttpExchange& exchange);
  void Responses(const std::string& body, HttpExchange& exchange);
  void Messages(const std::string& body, HttpExchange& exchange);
  void Models(HttpExchange& exchange);
  void Tokenize(const std::string& body, HttpExchange& exchange);
  void Detokenize(const std::string& body, HttpExchange& exchange);

 private:
  Coordinator& c_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_HTTP_API_H_
