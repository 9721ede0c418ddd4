// The HTTP API's rendering, parsing and streaming of Qwen3 think blocks and hermes tool calls.
// SmolLM2 never emits them, so a scripted backend (a fake worker that "generates" given text) plays
// the model behind a real coordinator and HTTP server, on a Qwen3 fixture with the real Qwen3
// tokenizer and chat template ($FUCINA_QWEN3_TOKENIZER).
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "tests/coordinator/http/scripted_backend.h"

namespace fucina {
namespace {

using json = nlohmann::json;
using tcp = boost::asio::ip::tcp;
using ScriptedBackendTest = ScriptedBackend;

const char kReply[] =
    "<think>\nThe user asks about the weather.\n</think>\n\nChecking. <tool_call>\n"
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

const json kTools = json::array({{{"type", "function"},
                                  {"function",
                                   {{"name", "get_weather"},
                                    {"description", "Current weather"},
                                    {"parameters",
                                     {{"type", "object"},
                                      {"properties", {{"city", {{"type", "string"}}}}}}}}}}});

TEST_F(ScriptedBackendTest, ToolsRenderIntoThePromptAndCallsAreParsed) {
  Start(kReply);
  json req = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
              {"tools", kTools}};
  HttpReply r = Post(server_->address(), "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  // Qwen3's template lists the tools in the system turn.
  const std::string prompt = Rendered();
  EXPECT_NE(prompt.find("<tools>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("get_weather"), std::string::npos) << prompt;
  const json j = json::parse(r.body);
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["reasoning_content"], "The user asks about the weather.");
  EXPECT_EQ(choice["message"]["content"], "Checking. ");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_TRUE(call["id"].is_string());
}

TEST_F(ScriptedBackendTest, ToolCallsAndReasoningStreamAsDeltas) {
  Start(kReply);
  json req = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
              {"tools", kTools},
              {"stream", true}};
  HttpReply r = Post(server_->address(), "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::string reasoning, content;
  json calls = json::array();
  std::vector<std::string> finishes;
  for (const json& e : Events(r.body)) {
    const json& choice = e["choices"][0];
    const json& delta = choice["delta"];
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("tool_calls")) {
      for (const json& c : delta["tool_calls"]) calls.push_back(c);
    }
    if (!choice["finish_reason"].is_null()) finishes.push_back(choice["finish_reason"]);
  }
  EXPECT_EQ(reasoning, "The user asks about the weather.");
  EXPECT_EQ(content, "Checking. ");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(finishes, std::vector<std::string>{"tool_calls"});
  EXPECT_EQ(r.body.substr(r.body.size() - 14), "data: [DONE]\n\n");
}

TEST_F(ScriptedBackendTest, WithoutToolsTheCallIsPlainContent) {
  Start(kReply);
  json req = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
  HttpReply r = Post(server_->address(), "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_NE(j["choices"][0]["message"]["content"].get<std::string>().find("<tool_call>"),
            std::string::npos);
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
}

TEST_F(ScriptedBackendTest, ThinkingBecomesAnAnthropicThinkingBlock) {
  Start("<think>\nShort thought.\n</think>\n\nThe answer.");
  json req = {{"max_tokens", 64}, {"messages", {{{"role", "user"}, {"content", "Q?"}}}}};
  HttpReply r = Post(server_->address(), "/v1/messages", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  ASSERT_EQ(j["content"].size(), 2u) << r.body;
  EXPECT_EQ(j["content"][0]["type"], "thinking");
  EXPECT_EQ(j["content"][0]["thinking"], "Short thought.");
  EXPECT_EQ(j["content"][1]["type"], "text");
  EXPECT_EQ(j["content"][1]["text"], "The answer.");
  EXPECT_EQ(j["stop_reason"], "end_turn");

  req["stream"] = true;
  r = Post(server_->address(), "/v1/messages", req.dump());
  ASSERT_EQ(r.status, 200);
  std::vector<std::string> types;
  std::string thinking, text;
  for (const json& e : Events(r.body)) {
    types.push_back(e["type"]);
    if (e["type"] == "content_block_delta") {
      if (e["delta"]["type"] == "thinking_delta") thinking += e["delta"]["thinking"].get<std::string>();
      if (e["delta"]["type"] == "text_delta") text += e["delta"]["text"].get<std::string>();
    }
  }
  EXPECT_EQ(thinking, "Short thought.");
  EXPECT_EQ(text, "The answer.");
  ASSERT_GE(types.size(), 7u);
  EXPECT_EQ(types.front(), "message_start");
  EXPECT_EQ(types[1], "content_block_start");
  EXPECT_EQ(types[types.size() - 3], "content_block_stop");
  EXPECT_EQ(types[types.size() - 2], "message_delta");
  EXPECT_EQ(types.back(), "message_stop");
}

// The Responses API reports a think block as a `reasoning` output item ahead of the message,
// never inside output_text; streamed, as response.reasoning_text.* events on their own item.
TEST_F(ScriptedBackendTest, ThinkingBecomesAResponsesReasoningItem) {
  Start("<think>\nShort thought.\n</think>\n\nThe answer.");
  json req = {{"input", "Q?"}};
  HttpReply r = Post(server_->address(), "/v1/responses", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json whole = json::parse(r.body);
  const json& output = whole["output"];
  ASSERT_EQ(output.size(), 2u) << r.body;
  EXPECT_EQ(output[0]["type"], "reasoning");
  EXPECT_TRUE(absl::StartsWith(output[0]["id"].get<std::string>(), "rs_"));
  EXPECT_EQ(output[0]["summary"], json::array());
  ASSERT_EQ(output[0]["content"].size(), 1u);
  EXPECT_EQ(output[0]["content"][0]["type"], "reasoning_text");
  EXPECT_EQ(output[0]["content"][0]["text"], "Short thought.");
  EXPECT_EQ(output[1]["type"], "message");
  ASSERT_EQ(output[1]["content"].size(), 1u);
  EXPECT_EQ(output[1]["content"][0]["type"], "output_text");
  EXPECT_EQ(output[1]["content"][0]["text"], "The answer.");
  EXPECT_EQ(whole["status"], "completed");
  const int reasoning_tokens = whole["usage"]["output_tokens_details"]["reasoning_tokens"];
  EXPECT_GT(reasoning_tokens, 0);
  EXPECT_LT(reasoning_tokens, whole["usage"]["output_tokens"].get<int>());

  req["stream"] = true;
  r = Post(server_->address(), "/v1/responses", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> types;
  std::string reasoning, text;
  json completed;
  int sequence = 0;
  for (const json& e : Events(r.body)) {
    EXPECT_EQ(e["sequence_number"], sequence++);
    const std::string type = e["type"];
    // Consecutive deltas of one kind collapse into one entry, so the order reads as a grammar.
    if (types.empty() || types.back() != type || !absl::EndsWith(type, ".delta")) {
      types.push_back(type);
    }
    if (type == "response.reasoning_text.delta") {
      EXPECT_EQ(e["output_index"], 0);
      EXPECT_FALSE(e.contains("logprobs"));
      reasoning += e["delta"].get<std::string>();
    }
    if (type == "response.output_text.delta") {
      EXPECT_EQ(e["output_index"], 1);
      text += e["delta"].get<std::string>();
    }
    if (type == "response.reasoning_text.done") {
      EXPECT_EQ(e["text"], "Short thought.");
    }
    if (type == "response.output_item.added") {
      EXPECT_EQ(e["item"]["type"], e["output_index"] == 0 ? "reasoning" : "message");
    }
    if (type == "response.completed") completed = e["response"];
  }
  EXPECT_EQ(reasoning, "Short thought.");
  EXPECT_EQ(text, "The answer.");
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added",
      "response.reasoning_text.delta", "response.reasoning_text.done",
      "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done",
      "response.completed"};
  EXPECT_EQ(types, want);
  ASSERT_EQ(completed["output"].size(), 2u);
  EXPECT_EQ(completed["output"][0]["content"], output[0]["content"]);
  EXPECT_EQ(completed["output"][1]["content"], output[1]["content"]);
}

TEST_F(ScriptedBackendTest, IdleConnectionsAreClosed) {
  Start("Hi.");
  boost::asio::io_context io;
  tcp::resolver resolver(io);
  tcp::socket socket(io);
  const std::string address = server_->address();
  const size_t colon = address.rfind(':');
  boost::asio::connect(socket, resolver.resolve(address.substr(0, colon), address.substr(colon + 1)));
  // The server closes its side after the idle timeout (0.5 s here): the read ends with EOF.
  const auto t0 = std::chrono::steady_clock::now();
  char byte;
  boost::beast::error_code ec;
  socket.read_some(boost::asio::buffer(&byte, 1), ec);
  EXPECT_EQ(ec, boost::asio::error::eof);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST_F(ScriptedBackendTest, DisabledThinkingRendersTheEmptyThinkBlock) {
  Start("Plain answer.");
  json req = {{"messages", {{{"role", "user"}, {"content", "Q?"}}}},
              {"chat_template_kwargs", {{"enable_thinking", false}}}};
  HttpReply r = Post(server_->address(), "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(Rendered().find("<think>\n\n</think>"), std::string::npos) << Rendered();
  EXPECT_EQ(json::parse(r.body)["choices"][0]["message"]["content"], "Plain answer.");
}

}  // namespace
}  // namespace fucina
