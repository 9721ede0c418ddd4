// A scripted backend behind the real front ends, for tests of what the HTTP API and the request
// mapping do with a model's output or a client's fields: a Qwen3 fixture with the real Qwen3
// tokenizer and chat template ($FUCINA_QWEN3_TOKENIZER; tests skip without it), a real
// coordinator whose one worker "generates" given text (ScriptedWorker), and a real HTTP server
// on a free loopback port.
#ifndef FUCINA_TESTS_COORDINATOR_HTTP_SCRIPTED_BACKEND_H_
#define FUCINA_TESTS_COORDINATOR_HTTP_SCRIPTED_BACKEND_H_

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "coordinator/coordinator.h"
#include "coordinator/http/http_server.h"
#include "models/engine/fixture.h"
#include "nlohmann/json.hpp"
#include "tests/coordinator/scripted_worker.h"

namespace fucina {

struct HttpReply {
  int status = 0;
  std::string body;
};

// One POST of `body` (JSON) on a fresh connection.
inline HttpReply Post(const std::string& address, const std::string& target,
                      const std::string& body) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  using tcp = boost::asio::ip::tcp;
  boost::asio::io_context io;
  tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  const size_t colon = address.rfind(':');
  stream.connect(resolver.resolve(address.substr(0, colon), address.substr(colon + 1)));
  http::request<http::string_body> req{http::verb::post, target, 11};
  req.set(http::field::host, address);
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  http::read(stream, buffer, parser);
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return {static_cast<int>(parser.get().result_int()), parser.get().body()};
}

// The `data:` payloads of a server-sent event stream (except [DONE]).
inline std::vector<nlohmann::json> Events(const std::string& body) {
  std::vector<nlohmann::json> out;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::StartsWith(line, "data: ") || line == "data: [DONE]") continue;
    out.push_back(nlohmann::json::parse(std::string(line.substr(6))));
  }
  return out;
}

// The smallest Qwen3 fixture with the real Qwen3 tokenizer and chat template (from
// `tokenizer_dir`) at `path`: what tests of text handling need, with no weights worth running.
inline absl::Status MakeTinyQwen3Fixture(const std::string& path, const char* tokenizer_dir) {
  FixtureOptions o;
  o.arch = "qwen3";
  o.num_layers = 1;
  o.hidden = 32;
  o.ffn = 32;
  o.num_heads = 2;
  o.num_heads_kv = 1;
  o.tokenizer_dir = tokenizer_dir;
  ThreadPool pool(1);
  return MakeFixture(o, path, pool);
}

class ScriptedBackend : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* dir = std::getenv("FUCINA_QWEN3_TOKENIZER");
    if (dir == nullptr || *dir == '\0') return;
    path_ = new std::string(testing::TempDir() + "/scripted_qwen3_" + std::to_string(getpid()) +
                            ".gguf");
    ASSERT_TRUE(MakeTinyQwen3Fixture(*path_, dir).ok());
  }
  static void TearDownTestSuite() {
    if (path_ != nullptr) std::remove(path_->c_str());
    delete path_;
    path_ = nullptr;
  }

  void SetUp() override {
    if (path_ == nullptr) GTEST_SKIP() << "FUCINA_QWEN3_TOKENIZER not set";
  }

  // A coordinator (`options` with the fixture as its model) whose one worker replies with
  // `reply` (tokenized with the model's tokenizer), and an HTTP server in front of it.
  void Start(const std::string& reply, CoordinatorOptions options = Defaults()) {
    options.model_path = *path_;
    auto c = Coordinator::Create(options, registry_);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
    const Tokenizer& tok = coordinator_->text().tokenizer();
    worker_ = std::make_shared<ScriptedWorker>(tok.Encode(reply, false, true),
                                               *tok.TokenId("<|im_end|>"));
    coordinator_->AddWorker("", WorkerInfo{"", 1, 0}, worker_);
    ASSERT_TRUE(coordinator_->scheduler().WaitForPlans(1, 30000));
    HttpOptions h;
    h.listen = "127.0.0.1:0";
    h.idle_timeout_s = 0.5;
    auto server = HttpServer::Start(*coordinator_, registry_, h);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  static CoordinatorOptions Defaults() {
    CoordinatorOptions o;
    o.context = 2048;
    return o;
  }

  // The prompt the worker was last given, as text.
  std::string Rendered() { return coordinator_->text().tokenizer().Decode(worker_->prompt()); }

  inline static std::string* path_ = nullptr;
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<Coordinator> coordinator_;
  std::shared_ptr<ScriptedWorker> worker_;
  std::unique_ptr<HttpServer> server_;
};

}  // namespace fucina

#endif  // FUCINA_TESTS_COORDINATOR_HTTP_SCRIPTED_BACKEND_H_
