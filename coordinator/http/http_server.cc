#include "coordinator/http/http_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <prometheus/text_serializer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/http/api.h"
#include "coordinator/http/request_framing.h"
#include "coordinator/http/request_json.h"
#include "worker/cluster_auth.h"

namespace fucina {

// docs/openapi.json, embedded at build time (openapi_json.cc is generated from it).
extern const char kOpenApiJson[];

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

int MillisUntil(Clock::time_point t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 60 * 60 * 1000));
}

// A blocking socket read under the request's deadline: the request's first byte time plus
// request_timeout_s, plus 1 s per min_rate bytes read so far. Beast's synchronous reads have no
// timeout of their own (and asio retries through SO_RCVTIMEO), hence the poll before each read.
class DeadlineSocket {
 public:
  DeadlineSocket(tcp::socket& socket, double timeout_s, double min_rate)
      : socket_(socket),
        start_(Clock::now()),
        timeout_s_(timeout_s),
        min_rate_(std::max(1.0, min_rate)) {}

  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers, beast::error_code& ec) {
    const double allowed = timeout_s_ + static_cast<double>(received_) / min_rate_;
    const auto deadline = start_ + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(allowed));
    pollfd p{socket_.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, MillisUntil(deadline)) <= 0) {
      ec = beast::error::timeout;
      return 0;
    }
    const size_t n = socket_.read_some(buffers, ec);
    received_ += n;
    return n;
  }
  template <class MutableBuffers>
  size_t read_some(const MutableBuffers& buffers) {
    beast::error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  template <class ConstBuffers>
  size_t write_some(const ConstBuffers& buffers, beast::error_code& ec) {
    return socket_.write_some(buffers, ec);
  }
  template <class ConstBuffers>
  size_t write_some(const ConstBuffers& buffers) {
    return socket_.write_some(buffers);
  }

 private:
  tcp::socket& socket_;
  Clock::time_point start_;
  double timeout_s_;
  double min_rate_;
  size_t received_ = 0;
};

http::response<http::string_body> MakeResponse(int status, unsigned version, bool keep_alive,
                                               const std::string& content_type,
                                               std::string body,
                                               const std::map<std::string, std::string>& headers) {
  http::response<http::string_body> res{static_cast<http::status>(status), version};
  res.set(http::field::server, "fucina");
  res.set(http::field::content_type, content_type);
  for (const auto& [k, v] : headers) res.set(k, v);
  res.keep_alive(keep_alive);
  res.body() = std::move(body);
  res.prepare_payload();
  return res;
}

// A connection's exchange: synchronous writes on its socket. For HEAD, responses carry their
// headers (Content-Length included) and no body.
class BeastExchange : public HttpExchange {
 public:
  // `cut`: set once the server's drain deadline has passed (see Cut()).
  BeastExchange(tcp::socket& socket, unsigned version, bool keep_alive, bool head,
                const std::atomic<bool>* cut = nullptr)
      : socket_(socket), version_(version), keep_alive_(keep_alive), head_(head), cut_(cut) {}

  void Respond(int status, const std::string& content_type, std::string body,
               const std::map<std::string, std::string>& headers) override {
    auto res = MakeResponse(status, version_, keep_alive_, content_type, std::move(body), headers);
    beast::error_code ec;
    if (head_) {
      http::response_serializer<http::string_body> sr{res};
      http::write_header(socket_, sr, ec);
    } else {
      http::write(socket_, res, ec);
    }
    if (ec) gone_ = true;
    responded_ = true;
  }

  bool StartEvents() override {
    http::response<http::empty_body> res{http::status::ok, version_};
    res.set(http::field::server, "fucina");
    res.set(http::field::content_type, "text/event-stream");
    res.set(http::field::cache_control, "no-cache");
    res.chunked(true);
    res.keep_alive(keep_alive_);
    http::response_serializer<http::empty_body> sr{res};
    beast::error_code ec;
    http::write_header(socket_, sr, ec);
    streaming_ = true;
    responded_ = true;
    if (ec) gone_ = true;
    return !gone_;
  }

  bool SendEvents(const std::string& data) override {
    if (gone_) return false;
    beast::error_code ec;
    asio::write(socket_, http::make_chunk(asio::buffer(data)), ec);
    if (ec) gone_ = true;
    return !gone_;
  }

  // Only a reset or fully closed socket counts as gone. A client that half-closed
  // (shutdown(SHUT_WR) after sending its request, as `nc -N` does) reads on, and reading alone
  // cannot tell the two apart: both just show end of stream. So the first time it is seen,
  // something the client must ignore is written: before the response an interim
  // `100 Continue` (any HTTP/1.1 client skips unexpected 1xx responses; RFC 9110 15.2), in an
  // event stream an SSE comment line. A half-closed client reads past it; a closed one answers
  // with a reset, which the next poll sees. (Without the probe, a streamed request still queued
  // would keep its place until its first event.) HTTP/1.0 gets no probe: a closed client is
  // then noticed at the response's first write.
  bool ClientGone() override {
    if (gone_ || Cut()) return true;
    pollfd p{socket_.native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLHUP | POLLERR)) {
      gone_ = true;
      return true;
    }
    bool eof = (p.revents & POLLRDHUP) != 0;
    if (!eof && (p.revents & POLLIN)) {
      char c;
      eof = ::recv(socket_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
    }
    if (eof && !probed_ && (streaming_ || (!responded_ && version_ >= 11))) {
      probed_ = true;
      if (streaming_) {
        SendEvents(": client input ended\n\n");
      } else {
        static constexpr char kProbe[] = "HTTP/1.1 100 Continue\r\n\r\n";
        beast::error_code ec;
        asio::write(socket_, asio::buffer(kProbe, sizeof(kProbe) - 1), ec);
        if (ec) gone_ = true;
      }
    }
    return gone_;
  }

  bool Cut() const override { return cut_ != nullptr && cut_->load(); }

  // Ends a chunked event stream.
  void Finish() {
    if (!streaming_ || gone_) return;
    beast::error_code ec;
    asio::write(socket_, http::make_chunk_last(), ec);
    if (ec) gone_ = true;
  }

  bool responded() const { return responded_; }
  bool gone() const { return gone_; }

 private:
  tcp::socket& socket_;
  unsigned version_;
  bool keep_alive_;
  bool head_;
  const std::atomic<bool>* cut_;
  bool streaming_ = false;
  bool responded_ = false;
  bool probed_ = false;
  bool gone_ = false;
};

// An exchange that keeps the serialized response in memory (connections answered by the accept
// thread while every slot is taken). No event streams: the routes it serves have none.
class BufferExchange : public HttpExchange {
 public:
  BufferExchange(unsigned version, bool head) : version_(version), head_(head) {}

  void Respond(int status, const std::string& content_type, std::string body,
               const std::map<std::string, std::string>& headers) override {
    auto res = MakeResponse(status, version_, false, content_type, std::move(body), headers);
    std::ostringstream os;
    if (head_) {
      os << res.base();
    } else {
      os << res;
    }
    out_ = os.str();
  }
  bool StartEvents() override { return false; }
  bool SendEvents(const std::string&) override { return false; }
  bool ClientGone() override { return false; }

  std::string& out() { return out_; }

 private:
  unsigned version_;
  bool head_;
  std::string out_;
};

std::string HostOnly(std::string host) {
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    return close == std::string::npos ? host : host.substr(1, close - 1);
  }
  const size_t colon = host.rfind(':');
  if (colon != std::string::npos) host.resize(colon);
  return absl::AsciiStrToLower(host);
}

// Closes a connection without losing what was just written: a close() with unread input makes
// the kernel send a reset, which can destroy the response before the client reads it. So the
// sending side is shut down first, and input is read and dropped until the client closes too,
// for at most `linger_ms`.
void LingeringClose(tcp::socket& socket, int linger_ms) {
  beast::error_code ec;
  socket.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) return;
  const auto deadline = Clock::now() + std::chrono::milliseconds(linger_ms);
  char scratch[4096];
  for (size_t dropped = 0; dropped < (1u << 20);) {
    pollfd p{socket.native_handle(), POLLIN, 0};
    if (::poll(&p, 1, MillisUntil(deadline)) <= 0) break;
    const ssize_t n = ::recv(socket.native_handle(), scratch, sizeof(scratch), MSG_DONTWAIT);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

// Connections the accept thread answers itself while every slot is taken: this many at once at
// most (the oldest is dropped for a new one), each within this long.
constexpr size_t kMaxOverflow = 64;
constexpr auto kOverflowDeadline = std::chrono::seconds(2);
constexpr size_t kOverflowMaxHeader = 8 << 10;

}  // namespace

struct HttpServer::Impl {
  Coordinator& coordinator;
  std::shared_ptr<prometheus::Registry> registry;
  HttpOptions options;
  Api api;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::string address;
  std::atomic<bool> stopping{false};
  // Set when Drain's deadline passes: exchanges still running report Cut().
  std::atomic<bool> cut{false};
  // Readable once draining: wakes connections idle between requests (never read, so it stays
  // readable).
  int drain_fd = ::eventfd(0, EFD_CLOEXEC);
  std::thread accept_thread;
  std::mutex mu;                     // connections, and Connection::done under it
  std::condition_variable finished;  // a connection's thread is done
  struct Connection {
    tcp::socket socket;
    std::thread thread;
    std::atomic<bool> done{false};
    explicit Connection(tcp::socket s) : socket(std::move(s)) {}
  };
  std::list<std::unique_ptr<Connection>> connections;

  // A connection accepted while every slot was taken, answered by the accept thread (which
  // alone touches these): its request header is read without blocking, the response written
  // without blocking, then input is drained until the client closes or the deadline passes.
  struct Overflow {
    tcp::socket socket;
    Clock::time_point deadline;
    std::string in;
    std::string out;
    size_t written = 0;
    bool draining = false;
    explicit Overflow(tcp::socket s)
        : socket(std::move(s)), deadline(Clock::now() + kOverflowDeadline) {}
  };
  std::list<Overflow> overflow;

  Impl(Coordinator& c, std::shared_ptr<prometheus::Registry> r, const HttpOptions& o)
      : coordinator(c), registry(std::move(r)), options(o), api(c) {}

  void AcceptLoop();
  void AcceptReady();
  // Advances one overflow connection; false when it is finished (to be closed).
  bool StepOverflow(Overflow& o, short revents);
  void Serve(Connection& conn);
  // `overflow`: only /health and /metrics are served, anything else is 503.
  void Route(const HttpRequest& req, HttpExchange& ex, bool overflow);
  void Reap();
  // Ends the accept thread and closes the listening socket (idempotent).
  void StopAccepting();
};

void HttpServer::Impl::Reap() {
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = connections.begin(); it != connections.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = connections.erase(it);
    } else {
      ++it;
    }
  }
}

void HttpServer::Impl::AcceptLoop() {
  beast::error_code ec;
  acceptor.non_blocking(true, ec);
  std::vector<pollfd> fds;
  while (!stopping) {
    fds.clear();
    fds.push_back({acceptor.native_handle(), POLLIN, 0});
    auto wake = Clock::time_point::max();
    for (Overflow& o : overflow) {
      const bool writing = o.written < o.out.size();
      fds.push_back({o.socket.native_handle(), static_cast<short>(writing ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, o.deadline);
    }
    const int timeout = overflow.empty() ? -1 : MillisUntil(wake) + 1;
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) break;
    if (stopping) break;
    size_t i = 1;
    const auto now = Clock::now();
    for (auto it = overflow.begin(); it != overflow.end(); ++i) {
      const bool alive = now < it->deadline && StepOverflow(*it, fds[i].revents);
      if (alive) {
        ++it;
      } else {
        it->socket.close(ec);
        it = overflow.erase(it);
      }
    }
    if (fds[0].revents & POLLIN) AcceptReady();
  }
}

void HttpServer::Impl::AcceptReady() {
  while (!stopping) {
    beast::error_code ec;
    tcp::socket socket(io);
    acceptor.accept(socket, ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return;
    if (ec) {
      // Out of descriptors (EMFILE) or memory: the listening socket stays readable, so back off
      // rather than spin on it.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    Reap();
    std::lock_guard<std::mutex> lock(mu);
    if (static_cast<int>(connections.size()) >= options.max_connections) {
      if (overflow.size() >= kMaxOverflow) {
        overflow.front().socket.close(ec);
        overflow.pop_front();
      }
      socket.non_blocking(true, ec);
      overflow.emplace_back(std::move(socket));
      continue;
    }
    socket.non_blocking(false, ec);
    auto conn = std::make_unique<Connection>(std::move(socket));
    Connection* raw = conn.get();
    try {
      conn->thread = std::thread([this, raw] {
        Serve(*raw);
        {
          std::lock_guard<std::mutex> done_lock(mu);
          raw->done = true;
        }
        finished.notify_all();
      });
    } catch (const std::system_error&) {
      continue;  // no thread to be had: the connection is closed, the server goes on
    }
    connections.push_back(std::move(conn));
  }
}

bool HttpServer::Impl::StepOverflow(Overflow& o, short revents) {
  const int fd = o.socket.native_handle();
  if (revents & (POLLERR | POLLNVAL)) return false;
  if (o.written < o.out.size()) {
    if (!(revents & POLLOUT)) return true;
    const ssize_t n = ::send(fd, o.out.data() + o.written, o.out.size() - o.written,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    o.written += static_cast<size_t>(n);
    if (o.written == o.out.size()) {
      ::shutdown(fd, SHUT_WR);
      o.draining = true;
      o.deadline = std::min(o.deadline, Clock::now() + std::chrono::seconds(1));
    }
    return true;
  }
  if (!(revents & (POLLIN | POLLHUP))) return true;
  char scratch[4096];
  const ssize_t n = ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT);
  if (n == 0) return false;
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
  if (o.draining) return true;
  o.in.append(scratch, static_cast<size_t>(n));
  if (o.in.find("\r\n\r\n") == std::string::npos) {
    return o.in.size() <= kOverflowMaxHeader;  // an oversized header is not worth an answer
  }
  http::request_parser<http::empty_body> parser;
  parser.header_limit(kOverflowMaxHeader);
  beast::error_code ec;
  parser.put(asio::buffer(o.in), ec);
  const bool head = !ec && parser.is_header_done() && parser.get().method() == http::verb::head;
  BufferExchange ex(ec || !parser.is_header_done() ? 11 : parser.get().version(), head);
  if (ec || !parser.is_header_done()) {
    SendError(ex, ApiDialect::kOpenAi, 400, "malformed HTTP request: " + ec.message());
  } else if (absl::Status s = CheckFraming(parser.get()); !s.ok()) {
    SendError(ex, ApiDialect::kOpenAi, absl::IsUnimplemented(s) ? 501 : 400,
              std::string(s.message()));
  } else {
    const HttpRequest req(parser.get().base());
    try {
      Route(req, ex, /*overflow=*/true);
    } catch (const std::exception& e) {
      SendError(ex, ApiDialect::kOpenAi, 500, e.what());
    }
  }
  o.out = std::move(ex.out());
  o.in.clear();
  return true;
}

void HttpServer::Impl::Serve(Connection& conn) {
  beast::flat_buffer buffer;
  const RequestLimits limits{options.max_body_bytes, 64 << 10};
  for (bool first = true; !stopping; first = false) {
    // An idle keep-alive connection gives its thread back after idle_timeout_s, so idle clients
    // cannot hold every connection place; a new connection gets no longer than a request would
    // to start its first one (a silent connect is a slot taken for nothing). Once a request's
    // first byte is in, the read deadline takes over.
    if (buffer.size() == 0) {
      const double wait_s = first ? std::min(options.idle_timeout_s, options.request_timeout_s)
                                  : options.idle_timeout_s;
      pollfd p[2] = {{conn.socket.native_handle(), POLLIN, 0}, {drain_fd, POLLIN, 0}};
      if (::poll(p, 2, static_cast<int>(wait_s * 1000)) <= 0 || p[1].revents != 0) break;
    }
    DeadlineSocket stream(conn.socket, options.request_timeout_s, options.min_request_rate);
    http::request_parser<http::string_body> parser;
    if (std::optional<ReadError> err = ReadRequest(stream, buffer, parser, limits)) {
      if (err->status != 0) {
        // In the dialect of the route, when the header got that far (a 413 on /v1/messages).
        const std::string target =
            parser.is_header_done() ? std::string(parser.get().target()) : "";
        const bool anthropic = target.substr(0, target.find('?')) == "/v1/messages";
        BeastExchange ex(conn.socket, 11, false, false);
        SendError(ex, anthropic ? ApiDialect::kAnthropic : ApiDialect::kOpenAi, err->status,
                  err->message);
      }
      break;
    }
    const HttpRequest& req = parser.get();
    BeastExchange ex(conn.socket, req.version(), req.keep_alive(),
                     req.method() == http::verb::head, &cut);
    try {
      Route(req, ex, /*overflow=*/false);
    } catch (const std::exception& e) {
      // A bug must not take the process down with it: answer 500 if nothing was sent yet.
      if (!ex.responded()) SendError(ex, ApiDialect::kOpenAi, 500, e.what());
      break;
    }
    ex.Finish();
    if (ex.gone() || !req.keep_alive()) break;
  }
  LingeringClose(conn.socket, 1000);
}

void HttpServer::Impl::Route(const HttpRequest& req, HttpExchange& ex, bool overflow) {
  std::string path(req.target());
  if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
  const bool anthropic = path == "/v1/messages";
  const ApiDialect dialect = anthropic ? ApiDialect::kAnthropic : ApiDialect::kOpenAi;
  // HEAD is GET without the body (BeastExchange drops it).
  const bool get = req.method() == http::verb::get || req.method() == http::verb::head;
  const bool post = req.method() == http::verb::post;

  // Probes and scrapes (health, metrics) come by pod address: the allowlist and the key guard
  // the API. The API description is public too.
  const bool open = path == "/health" || path == "/metrics" || path == "/openapi.json";
  if (overflow && !(open && get)) {
    SendError(ex, dialect, 503, "too many connections");
    return;
  }
  if (!open && !options.allow_hosts.empty()) {
    const std::string host = HostOnly(std::string(req[http::field::host]));
    if (std::find(options.allow_hosts.begin(), options.allow_hosts.end(), host) ==
        options.allow_hosts.end()) {
      SendError(ex, dialect, 403, "host '" + Echo(host) + "' is not allowed (--allow-host)");
      return;
    }
  }
  if (!open && !options.api_key.empty()) {
    // Compared in constant time, as the gRPC planes' secrets are (a timing side channel must
    // not reveal how much of a guessed key was right).
    const std::string auth(req[http::field::authorization]);
    std::string_view bearer = auth;
    const std::string key(req["x-api-key"]);
    const bool ok = (ConsumeBearer(&bearer) && ConstantTimeEquals(bearer, options.api_key)) ||
                    ConstantTimeEquals(key, options.api_key);
    if (!ok) {
      SendError(ex, dialect, 401, "invalid or missing API key", "", "invalid_api_key");
      return;
    }
  }
  const std::string& body = req.body();
  if (path == "/health" && get) {
    const bool ready = coordinator.scheduler().ready();
    std::map<std::string, std::string> headers;
    if (!ready) headers["Retry-After"] = "1";
    ex.Respond(ready ? 200 : 503, "application/json",
               ready ? R"({"status":"ok"})"
                     : http_api::Dump({{"status", "loading"},
                                       {"detail", coordinator.scheduler().status()}}),
               headers);
  } else if (path == "/metrics" && get) {
    prometheus::TextSerializer serializer;
    ex.Respond(200, "text/plain; version=0.0.4", serializer.Serialize(registry->Collect()));
  } else if (path == "/openapi.json" && get) {
    ex.Respond(200, "application/json", kOpenApiJson);
  } else if (path == "/v1/models" && get) {
    api.Models(ex);
  } else if (path == "/v1/chat/completions" && post) {
    api.ChatCompletions(body, ex);
  } else if (path == "/v1/completions" && post) {
    api.Completions(body, ex);
  } else if (path == "/v1/responses" && post) {
    api.Responses(body, ex);
  } else if (path == "/v1/messages" && post) {
    api.Messages(body, ex);
  } else if (path == "/tokenize" && post) {
    api.Tokenize(body, ex);
  } else if (path == "/detokenize" && post) {
    api.Detokenize(body, ex);
  } else if (open || path == "/v1/models" || path == "/v1/chat/completions" ||
             path == "/v1/completions" || path == "/v1/responses" || path == "/v1/messages" ||
             path == "/tokenize" || path == "/detokenize") {
    const bool gettable = open || path == "/v1/models";
    SendError(ex, dialect, 405,
              absl::StrCat(Echo(std::string(req.method_string())), " is not allowed on ", path),
              "", "", gettable ? "GET, HEAD" : "POST");
  } else {
    SendError(ex, dialect, 404,
              absl::StrCat("no route for ", Echo(std::string(req.method_string())), " ",
                           Echo(path)));
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    Coordinator& coordinator, std::shared_ptr<prometheus::Registry> registry,
    const HttpOptions& options) {
  if (!(options.request_timeout_s > 0) || !(options.min_request_rate > 0) ||
      !(options.idle_timeout_s > 0) || options.max_connections < 1) {
    return absl::InvalidArgumentError(
        "--http-request-timeout, --http-min-rate, --http-idle-timeout and --max-connections "
        "must be positive");
  }
  auto impl = std::make_unique<Impl>(coordinator, std::move(registry), options);
  const size_t colon = options.listen.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError("--http must be HOST:PORT, got '" + options.listen + "'");
  }
  beast::error_code ec;
  const auto addr = asio::ip::make_address(options.listen.substr(0, colon), ec);
  int port = 0;
  if (ec || !absl::SimpleAtoi(options.listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError("--http must be HOST:PORT, got '" + options.listen + "'");
  }
  tcp::endpoint endpoint(addr, static_cast<unsigned short>(port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError("cannot listen on " + options.listen + " (HTTP): " +
                                  ec.message());
  }
  impl->address = absl::StrCat(options.listen.substr(0, colon), ":",
                               impl->acceptor.local_endpoint().port());
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->AcceptLoop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void HttpServer::Impl::StopAccepting() {
  stopping = true;
  if (!accept_thread.joinable()) return;
  beast::error_code ec;
  // Wake the accept thread's poll with a connection to ourselves, then close.
  {
    tcp::socket wake(io);
    wake.connect(acceptor.local_endpoint(), ec);
  }
  accept_thread.join();
  acceptor.close(ec);
  for (auto& o : overflow) o.socket.close(ec);
  overflow.clear();
}

void HttpServer::Drain(std::chrono::steady_clock::time_point deadline) {
  impl_->StopAccepting();
  const uint64_t one = 1;
  // Should the write fail, idle connections still close at their idle timeout or the deadline.
  if (impl_->drain_fd >= 0) (void)!::write(impl_->drain_fd, &one, sizeof(one));
  std::unique_lock<std::mutex> lock(impl_->mu);
  const auto all_done = [&] {
    return std::all_of(impl_->connections.begin(), impl_->connections.end(),
                       [](const auto& c) { return c->done.load(); });
  };
  if (impl_->finished.wait_until(lock, deadline, all_done)) return;
  // Requests still running are cancelled (their exchanges say Cut()); each reply then ends with
  // an error its client can read, and the connection closes.
  impl_->cut = true;
  impl_->finished.wait_for(lock, kCutGrace, all_done);
}

HttpServer::~HttpServer() {
  impl_->StopAccepting();
  beast::error_code ec;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto& c : impl_->connections) c->socket.shutdown(tcp::socket::shutdown_both, ec);
  }
  // Unlocked: a finishing connection thread takes mu to mark itself done.
  for (auto& c : impl_->connections) c->thread.join();
  if (impl_->drain_fd >= 0) ::close(impl_->drain_fd);
}

const std::string& HttpServer::address() const { return impl_->address; }

}  // namespace fucina
