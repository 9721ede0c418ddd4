// The HTTP request path without sockets or a model: the committed corpus (tests/data/http/) and
// deterministic mutants of it through FuzzHttpRequest (run under ASan/UBSan by scripts/test.sh),
// plus what the framing checks and the body parser must answer for known attacks.
//   FUCINA_FUZZ_ITERS=N overrides the 20000 mutants.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "coordinator/http/request_framing.h"
#include "coordinator/http/request_json.h"
#include "tests/fuzz/http_fuzz_target.h"

namespace fucina {
namespace {

namespace http = boost::beast::http;

std::vector<std::pair<std::string, std::string>> Seeds() {
  std::vector<std::pair<std::string, std::string>> seeds;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(FUCINA_TEST_DATA_DIR) + "/http")) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    seeds.emplace_back(entry.path().filename().string(), ss.str());
  }
  std::sort(seeds.begin(), seeds.end());
  return seeds;
}

std::string Replay(const std::string& input) {
  return FuzzHttpRequest(reinterpret_cast<const uint8_t*>(input.data()), input.size());
}

// Reads one request from `raw`; the error, if any.
std::optional<ReadError> ReadOne(const std::string& raw, HttpRequest* out = nullptr) {
  MemoryStream stream(raw, 7);
  boost::beast::flat_buffer buffer;
  http::request_parser<http::string_body> parser;
  auto err = ReadRequest(stream, buffer, parser, RequestLimits{});
  if (!err && out != nullptr) *out = parser.release();
  return err;
}

TEST(HttpFuzzReplay, SeedsHoldTheInvariants) {
  const auto seeds = Seeds();
  ASSERT_GE(seeds.size(), 10u) << "tests/data/http/ holds the corpus";
  for (const auto& [name, data] : seeds) {
    // Trailing bytes change the read size (1 + size % 32): three different splits of the input.
    for (const char* tail : {"", "\r\n", "\r\n\r\n\r\n"}) EXPECT_EQ(Replay(data + tail), "") << name;
  }
}

TEST(HttpFuzzReplay, MutantsHoldTheInvariants) {
  const auto seeds = Seeds();
  ASSERT_FALSE(seeds.empty());
  int iters = 20000;
  if (const char* env = std::getenv("FUCINA_FUZZ_ITERS")) iters = std::atoi(env);
  // Pieces that matter to the parser and the readers, spliced in at random places.
  const std::vector<std::string> dictionary = {
      "\r\n", "\r\n\r\n", "Transfer-Encoding: chunked\r\n", "Content-Length: 5\r\n",
      "Host: x\r\n", "0\r\n\r\n", "[", "{", "]", "}", "\"", "\\", "\xff", "\xc3", ",",
      "{\"type\":5}", "null", "[[[[[[[[[[[[[[[[", ": ", "chunked, identity"};
  std::mt19937 rng(20261201);
  for (int i = 0; i < iters; ++i) {
    std::string s = seeds[rng() % seeds.size()].second;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
      switch (rng() % 5) {
        case 0:
          if (!s.empty()) s[std::min(at, s.size() - 1)] ^= static_cast<char>(1 << (rng() % 8));
          break;
        case 1:
          s.insert(at, dictionary[rng() % dictionary.size()]);
          break;
        case 2:
          s.erase(at, rng() % 16);
          break;
        case 3: {  // duplicate a run (header lines, brackets)
          const size_t n = std::min<size_t>(rng() % 64, s.size() - std::min(at, s.size()));
          s.insert(at, s.substr(at, n));
          break;
        }
        default:  // splice in another seed's tail
          s = s.substr(0, at) + seeds[rng() % seeds.size()].second.substr(rng() % 32);
          break;
      }
    }
    const std::string err = Replay(s);
    ASSERT_EQ(err, "") << "mutant " << i << ": " << testing::PrintToString(s);
  }
}

TEST(HttpFraming, SmugglingAndAmbiguousFramingAreRefused) {
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: a\r\n";
  struct Case {
    std::string headers;
    int status;
  };
  const std::vector<Case> cases = {
      {"Transfer-Encoding: chunked, identity\r\nContent-Length: 4\r\n", 400},
      {"Transfer-Encoding: gzip\r\nContent-Length: 4\r\n", 400},
      {"Content-Length: 4\r\nTransfer-Encoding: gzip\r\n", 400},
      {"Transfer-Encoding: gzip, chunked\r\n", 501},
      {"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 501},
      {"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n", 400},
      {"Content-Length: 4\r\nContent-Length: 5\r\n", 400},
      {"Host: b\r\nContent-Length: 4\r\n", 400},
  };
  for (const Case& c : cases) {
    auto err = ReadOne(post + c.headers + "\r\n{}{}GET /health HTTP/1.1\r\nHost: a\r\n\r\n");
    ASSERT_TRUE(err.has_value()) << c.headers;
    EXPECT_EQ(err->status, c.status) << c.headers << " -> " << err->message;
  }
  // No Host on HTTP/1.1; Transfer-Encoding on HTTP/1.0.
  EXPECT_EQ(ReadOne("GET /health HTTP/1.1\r\n\r\n")->status, 400);
  EXPECT_EQ(ReadOne("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")->status, 400);
  // What stays accepted: plain chunked, a repeated identical Content-Length, HTTP/1.0 sans Host.
  HttpRequest req;
  EXPECT_FALSE(ReadOne(post + "Transfer-Encoding: Chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", &req));
  EXPECT_EQ(req.body(), "{}");
  EXPECT_FALSE(ReadOne(post + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}", &req));
  EXPECT_EQ(req.body(), "{}");
  EXPECT_FALSE(ReadOne("GET /health HTTP/1.0\r\n\r\n"));
}

TEST(HttpFraming, LimitsAnswer413And431) {
  RequestLimits limits;
  const std::string big = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: " +
                          std::to_string(limits.max_body_bytes + 1) + "\r\n\r\n";
  EXPECT_EQ(ReadOne(big)->status, 413);
  const std::string huge_header =
      "GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(limits.max_header_bytes, 'x') + "\r\n\r\n";
  EXPECT_EQ(ReadOne(huge_header)->status, 431);
}

TEST(HttpJson, NestingPastTheLimitIsRefusedBeforeParsing) {
  const auto nested = [](int depth, const std::string& open, const std::string& close) {
    std::string s = "{\"x\":";
    for (int i = 0; i < depth; ++i) s += open;
    for (int i = 0; i < depth; ++i) s += close;
    return s + "}";
  };
  EXPECT_TRUE(http_api::ParseJsonObject(nested(http_api::kMaxJsonDepth - 1, "[", "]")).ok());
  for (int depth : {http_api::kMaxJsonDepth, 50000, 1000000}) {
    auto j = http_api::ParseJsonObject(nested(depth, "[", "]"));
    ASSERT_FALSE(j.ok());
    EXPECT_TRUE(absl::IsInvalidArgument(j.status()));
    EXPECT_NE(j.status().message().find("64"), std::string::npos) << j.status();
  }
  // Brackets inside strings (escaped quotes included) are text, not nesting.
  const std::string in_string = "{\"x\":\"\\\"" + std::string(1000, '[') + "\"}";
  EXPECT_TRUE(http_api::ParseJsonObject(in_string).ok());
}

TEST(HttpJson, WrongTypesNameTheField) {
  using http_api::json;
  const auto message = [](const json& body, auto reader) {
    auto r = reader(body);
    EXPECT_FALSE(r.ok());
    return std::string(r.status().message());
  };
  EXPECT_EQ(message(json::parse(R"({"messages":[{"role":"user","content":[{"type":5}]}]})"),
                    http_api::ReadChatMessages),
            "messages[0].content[0].type must be a string, got a number");
  EXPECT_EQ(message(json::parse(R"({"max_tokens":4,"messages":[{"role":"user",
                                   "content":[{"type":5}]}]})"),
                    http_api::ReadAnthropicMessages),
            "messages[0].content[0].type must be a string, got a number");
  EXPECT_EQ(message(json::parse(R"({"thinking":{"type":7}})"), http_api::ReadAnthropicThinking),
            "thinking.type must be a string, got a number");
  EXPECT_EQ(message(json::parse(R"({"input":[{"role":"user","content":[{"type":[]}]}]})"),
                    http_api::ReadResponsesInput),
            "input[0].content[0].type must be a string, got an array");
  bool parse_tools = false;
  std::optional<std::string> forced_tool;
  auto tools = http_api::ReadTools(json::parse(R"({"tools":[{"type":5}]})"), &parse_tools,
                                   &forced_tool);
  ASSERT_FALSE(tools.ok());
  EXPECT_NE(tools.status().message().find("tools[0]"), std::string::npos);
  // Anthropic's shapes: a tool without its input_schema, a tool_choice of another type, a
  // named tool that is not declared, a forced choice with no tools.
  for (const auto& [body, says] :
       {std::pair{R"({"tools":[{"name":"f"}]})", "tools[0]"},
        std::pair{R"({"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"all"}})",
                  "type 'all'"},
        std::pair{R"({"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"g"}})",
                  "'g', which is not in 'tools'"},
        std::pair{R"({"tool_choice":{"type":"any"}})", "needs 'tools'"}}) {
    auto a = http_api::ReadAnthropicTools(json::parse(body), &parse_tools, &forced_tool);
    ASSERT_FALSE(a.ok()) << body;
    EXPECT_NE(a.status().message().find(says), std::string::npos) << a.status();
  }
  // Invalid UTF-8 (a path or Host echoed in an error) is replaced, never thrown.
  EXPECT_EQ(http_api::Dump(json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

}  // namespace
}  // namespace fucina
