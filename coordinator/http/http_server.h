// The coordinator's HTTP front end: OpenAI- and Anthropic-compatible endpoints, /tokenize,
// /detokenize, /health and /metrics, on Boost.Beast.
//
// Threading: one accept thread and one thread per connection (at most max_connections), which
// reads requests and writes responses synchronously. Generation runs on the scheduler; a
// connection thread only relays its request's buffered output, so a slow or stalled client holds
// its own thread and nothing else. A request must arrive whole within its read deadline, so slow
// senders cannot hold every slot either. While every slot is taken, the accept thread itself
// answers further connections (non-blocking, a few at a time, each under a short deadline):
// /health and /metrics as usual, anything else 503 with Retry-After.
// A client that disconnects has its request cancelled (its KV freed) within one poll interval; a
// client that only half-closes (shutdown(SHUT_WR) after its request) still gets its response.
// Drain (SIGTERM, a pod being stopped) stops accepting, lets every request already received run
// to its last byte until the drain deadline, and closes idle keep-alive connections at once; a
// reply still running at the deadline ends with an error, never mid-stream in silence.
#ifndef FUCINA_COORDINATOR_HTTP_HTTP_SERVER_H_
#define FUCINA_COORDINATOR_HTTP_HTTP_SERVER_H_

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "coordinator/coordinator.h"

namespace fucina {

struct HttpOptions {
  std::string listen = "127.0.0.1:8080";  // port 0: any free port
  std::string api_key;                    // empty: no authentication
  std::vector<std::string> allow_hosts;   // Host header allowlist (empty: any)
  size_t max_body_bytes = 8 << 20;
  int max_connections = 256;
  // A connection waiting this long for its next request is closed (its first: at most
  // request_timeout_s).
  double idle_timeout_s = 60;
  // A request (headers and body) must have arrived within request_timeout_s of its first byte
  // plus one second per min_request_rate bytes received: a sender slower than that on average
  // gets 408 and is closed. Only reading is timed, never a response being written or streamed.
  double request_timeout_s = 10;
  double min_request_rate = 16 << 10;  // bytes per second
};

// One request/response as the API handlers see it.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual void Respond(int status, const std::string& content_type, std::string body,
                       const std::map<std::string, std::string>& headers = {}) = 0;
  // Starts a text/event-stream response; false when the client is gone.
  virtual bool StartEvents() = 0;
  // Sends bytes of the event stream; false when the client is gone.
  virtual bool SendEvents(const std::string& data) = 0;
  // True once the client is gone: a reset or a closed socket, not a half-close (the client may
  // still read). Polled while a request waits for output. Also true once the server stops
  // waiting for this request (Cut()), so the request is cancelled the same way.
  virtual bool ClientGone() = 0;
  // True once the server's drain deadline has passed with this request unfinished: its reply is
  // to end with an error the client can read (an error event in a stream) rather than be cut.
  virtual bool Cut() const { return false; }
};

class HttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      Coordinator& coordinator, std::shared_ptr<prometheus::Registry> registry,
      const HttpOptions& options);
  ~HttpServer();

  // Stops accepting connections and waits until every request already being read or answered
  // has finished, or until `deadline`; connections idle between requests close at once. At the
  // deadline, requests still running are cancelled and their replies end with a 503 error (an
  // error event, then `data: [DONE]` for OpenAI streams), for which it waits up to
  // kCutGrace more; the destructor then closes whatever is left.
  static constexpr std::chrono::milliseconds kCutGrace{2000};
  void Drain(std::chrono::steady_clock::time_point deadline);

  const std::string& address() const;  // host:bound-port

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_HTTP_HTTP_SERVER_H_
