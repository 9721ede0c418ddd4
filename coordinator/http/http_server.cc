#include "coordinator/http/http_server.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <thread>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <prometheus/text_serializer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "nlohmann/json.hpp"
#include "absl/strings/str_cat.h"
#include "coordinator/http/api.h"

namespace fucina {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

// A connection's exchange: synchronous writes on its socket.
class BeastExchange : public HttpExchange {
 public:
  BeastExchange(tcp::socket& socket, unsigned version, bool keep_alive)
      : socket_(socket), version_(version), keep_alive_(keep_alive) {}

  void Respond(int status, const std::string& content_type, std::string body,
               const std::map<std::string, std::string>& headers) override {
    http::response<http::string_body> res{static_cast<http::status>(status), version_};
    res.set(http::field::server, "fucina");
    res.set(http::field::content_type, content_type);
    for (const auto& [k, v] : headers) res.set(k, v);
    res.keep_alive(keep_alive_);
    res.body() = std::move(body);
    res.prepare_payload();
    beast::error_code ec;
    http::write(socket_, res, ec);
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

  bool ClientGone() override {
    if (gone_) return true;
    pollfd p{socket_.native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0) {
      if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) {
        gone_ = true;
      } else if (p.revents & POLLIN) {
        char c;
        if (::recv(socket_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) gone_ = true;
      }
    }
    return gone_;
  }

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
  bool streaming_ = false;
  bool responded_ = false;
  bool gone_ = false;
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
  std::thread accept_thread;
  std::mutex mu;  // connections
  struct Connection {
    tcp::socket socket;
    std::thread thread;
    std::atomic<bool> done{false};
    explicit Connection(tcp::socket s) : socket(std::move(s)) {}
  };
  std::list<std::unique_ptr<Connection>> connections;

  Impl(Coordinator& c, std::shared_ptr<prometheus::Registry> r, const HttpOptions& o)
      : coordinator(c), registry(std::move(r)), options(o), api(c) {}

  void AcceptLoop();
  void Serve(Connection& conn);
  void Route(const http::request<http::string_body>& req, HttpExchange& ex);
  void Reap();
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
  while (!stopping) {
    beast::error_code ec;
    tcp::socket socket(io);
    acceptor.accept(socket, ec);
    if (stopping) break;
    if (ec) continue;
    Reap();
    std::lock_guard<std::mutex> lock(mu);
    if (static_cast<int>(connections.size()) >= options.max_connections) {
      // Over capacity: answer 503 on this thread and close.
      http::response<http::string_body> res{http::status::service_unavailable, 11};
      res.set(http::field::content_type, "application/json");
      res.set(http::field::retry_after, "1");
      res.body() = R"({"error":{"message":"too many connections","type":"server_error","param":null,"code":null}})";
      res.prepare_payload();
      res.keep_alive(false);
      http::write(socket, res, ec);
      socket.shutdown(tcp::socket::shutdown_both, ec);
      continue;
    }
    auto conn = std::make_unique<Connection>(std::move(socket));
    Connection* raw = conn.get();
    conn->thread = std::thread([this, raw] {
      Serve(*raw);
      raw->done = true;
    });
    connections.push_back(std::move(conn));
  }
}

void HttpServer::Impl::Serve(Connection& conn) {
  beast::flat_buffer buffer;
  while (!stopping) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(options.max_body_bytes);
    parser.header_limit(64 * 1024);
    // An idle keep-alive connection gives its thread back after idle_timeout_s, so idle clients
    // cannot hold every connection place. (asio's blocking reads retry through SO_RCVTIMEO,
    // hence the poll.)
    if (buffer.size() == 0) {
      pollfd p{conn.socket.native_handle(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(options.idle_timeout_s * 1000)) <= 0) break;
    }
    beast::error_code ec;
    http::read_header(conn.socket, buffer, parser, ec);
    if (!ec && beast::iequals(parser.get()[http::field::expect], "100-continue")) {
      // Clients that wait for a go-ahead before sending the body (curl does above 1 KiB).
      http::response<http::empty_body> go{http::status::continue_, parser.get().version()};
      http::write(conn.socket, go, ec);
    }
    if (!ec) http::read(conn.socket, buffer, parser, ec);
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      break;
    }
    if (ec) {
      BeastExchange ex(conn.socket, 11, false);
      if (ec == http::error::body_limit) {
        SendError(ex, ApiDialect::kOpenAi, 413,
                  absl::StrCat("request body exceeds ", options.max_body_bytes, " bytes"));
      } else {
        SendError(ex, ApiDialect::kOpenAi, 400, "malformed HTTP request: " + ec.message());
      }
      break;
    }
    const http::request<http::string_body>& req = parser.get();
    BeastExchange ex(conn.socket, req.version(), req.keep_alive());
    try {
      Route(req, ex);
    } catch (const std::exception& e) {
      // A bug must not take the process down with it: answer 500 if nothing was sent yet.
      if (!ex.responded()) SendError(ex, ApiDialect::kOpenAi, 500, e.what());
      break;
    }
    ex.Finish();
    if (ex.gone() || !req.keep_alive()) break;
  }
  beast::error_code ec;
  conn.socket.shutdown(tcp::socket::shutdown_both, ec);
}

void HttpServer::Impl::Route(const http::request<http::string_body>& req, HttpExchange& ex) {
  std::string path(req.target());
  if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
  const bool anthropic = path == "/v1/messages";
  const ApiDialect dialect = anthropic ? ApiDialect::kAnthropic : ApiDialect::kOpenAi;

  const bool open = path == "/health" || path == "/metrics";
  // Probes and scrapes (health, metrics) come by pod address: the allowlist guards the API.
  if (!open && !options.allow_hosts.empty()) {
    const std::string host = HostOnly(std::string(req[http::field::host]));
    if (std::find(options.allow_hosts.begin(), options.allow_hosts.end(), host) ==
        options.allow_hosts.end()) {
      SendError(ex, dialect, 403, "host '" + host + "' is not allowed (--allow-host)");
      return;
    }
  }
  if (!open && !options.api_key.empty()) {
    const std::string auth(req[http::field::authorization]);
    const std::string key(req["x-api-key"]);
    const bool ok = auth == "Bearer " + options.api_key || key == options.api_key;
    if (!ok) {
      SendError(ex, dialect, 401, "invalid or missing API key", "", "invalid_api_key");
      return;
    }
  }
  const bool get = req.method() == http::verb::get;
  const bool post = req.method() == http::verb::post;
  const std::string& body = req.body();
  if (path == "/health" && get) {
    const bool ready = coordinator.scheduler().ready();
    ex.Respond(ready ? 200 : 503, "application/json",
               ready ? R"({"status":"ok"})"
                     : nlohmann::json{{"status", "loading"},
                                      {"detail", coordinator.scheduler().status()}}
                           .dump());
  } else if (path == "/metrics" && get) {
    prometheus::TextSerializer serializer;
    ex.Respond(200, "text/plain; version=0.0.4", serializer.Serialize(registry->Collect()));
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
  } else if (path == "/health" || path == "/metrics" || path == "/v1/models" ||
             path == "/v1/chat/completions" || path == "/v1/completions" ||
             path == "/v1/responses" || path == "/v1/messages" || path == "/tokenize" ||
             path == "/detokenize") {
    SendError(ex, dialect, 405,
              absl::StrCat(std::string(req.method_string()), " is not allowed on ", path));
  } else {
    SendError(ex, dialect, 404,
              absl::StrCat("no route for ", std::string(req.method_string()), " ", path));
  }
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    Coordinator& coordinator, std::shared_ptr<prometheus::Registry> registry,
    const HttpOptions& options) {
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

HttpServer::~HttpServer() {
  impl_->stopping = true;
  beast::error_code ec;
  // Unblock accept() with a connection to ourselves, then close.
  {
    tcp::socket wake(impl_->io);
    wake.connect(impl_->acceptor.local_endpoint(), ec);
  }
  impl_->accept_thread.join();
  impl_->acceptor.close(ec);
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& c : impl_->connections) c->socket.shutdown(tcp::socket::shutdown_both, ec);
  for (auto& c : impl_->connections) c->thread.join();
}

const std::string& HttpServer::address() const { return impl_->address; }

}  // namespace fucina
