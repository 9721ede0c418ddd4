// Request fields are validated once (coordinator/request_fields.h over the sampler's ranges):
// the resolver's own cases, then the same hostile values sent through the HTTP API and the gRPC
// request mapping, which must accept or refuse them alike and name the same field. A scripted
// worker behind a real coordinator and HTTP server records what reaches the last stage.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "coordinator/coordinator.h"
#include "coordinator/grpc_services.h"
#include "coordinator/request_fields.h"
#include "nlohmann/json.hpp"
#include "tests/coordinator/http/scripted_backend.h"

namespace fucina {
namespace {

using json = nlohmann::json;

constexpr int32_t kVocab = 1000;

absl::Status Resolve(const RequestFields& f, GenerateJob* job = nullptr) {
  GenerateJob scratch;
  return ResolveRequestFields(f, SamplingParams(), 128, kVocab, job ? job : &scratch);
}

// The field a refusal names ("field 'NAME' ..."), or "" for anything else.
std::string NamedField(const std::string& message) {
  if (message.rfind("field '", 0) != 0) return "";
  return message.substr(7, message.find('\'', 7) - 7);
}

TEST(ResolveRequestFields, DefaultsApplyWhenNothingIsSent) {
  SamplingParams defaults;
  defaults.temperature = 0.3f;
  GenerateJob job;
  ASSERT_TRUE(ResolveRequestFields(RequestFields(), defaults, 77, kVocab, &job).ok());
  EXPECT_EQ(job.sampling.temperature, 0.3f);
  EXPECT_EQ(job.max_tokens, 77);
  EXPECT_TRUE(job.stop.empty());
  EXPECT_FALSE(job.ignore_eos);
}

TEST(ResolveRequestFields, RefusesOutOfRangeSamplingNamingTheField) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::function<void(RequestFields&)> set;
    const char* field;
  } cases[] = {
      {[&](RequestFields& f) { f.temperature = -0.5; }, "temperature"},
      {[&](RequestFields& f) { f.temperature = nan; }, "temperature"},
      {[&](RequestFields& f) { f.temperature = 1e300; }, "temperature"},
      {[&](RequestFields& f) { f.top_p = -1; }, "top_p"},
      {[&](RequestFields& f) { f.top_p = 0; }, "top_p"},
      {[&](RequestFields& f) { f.top_p = 1.5; }, "top_p"},
      {[&](RequestFields& f) { f.min_p = 5; }, "min_p"},
      {[&](RequestFields& f) { f.repetition_penalty = 0; }, "repetition_penalty"},
      {[&](RequestFields& f) { f.repetition_penalty = -3; }, "repetition_penalty"},
      {[&](RequestFields& f) { f.presence_penalty = nan; }, "presence_penalty"},
      {[&](RequestFields& f) { f.frequency_penalty = inf; }, "frequency_penalty"},
      {[&](RequestFields& f) { f.frequency_penalty = -2.5; }, "frequency_penalty"},
      {[&](RequestFields& f) { f.top_k = -2; }, "top_k"},
      {[&](RequestFields& f) { f.penalty_last_n = -7; }, "penalty_last_n"},
      {[&](RequestFields& f) { f.top_logprobs = 21; }, "top_logprobs"},
      {[&](RequestFields& f) { f.logit_bias = {{5, 101}}; }, "logit_bias"},
      {[&](RequestFields& f) { f.logit_bias = {{5, nan}}; }, "logit_bias"},
      {[&](RequestFields& f) { f.logit_bias = {{kVocab, 1}}; }, "logit_bias"},
      {[&](RequestFields& f) { f.logit_bias = {{-1, 1}}; }, "logit_bias"},
      {[&](RequestFields& f) { f.max_tokens = 0; }, "max_tokens"},
      {[&](RequestFields& f) { f.stop = std::vector<std::string>(65, "x"); }, "stop"},
      {[&](RequestFields& f) { f.stop = {std::string(1025, 'x')}; }, "stop"},
      {[&](RequestFields& f) { f.stop_token_ids = {kVocab}; }, "stop_token_ids"},
  };
  for (const Case& c : cases) {
    RequestFields f;
    c.set(f);
    const absl::Status s = Resolve(f);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.field << ": " << s;
    EXPECT_EQ(NamedField(std::string(s.message())), c.field) << s;
  }
}

TEST(ResolveRequestFields, NamesTheFieldAsTheClientSpelledIt) {
  RequestFields f;
  f.max_tokens_field = "max_output_tokens";
  f.max_tokens = -1;
  EXPECT_EQ(NamedField(std::string(Resolve(f).message())), "max_output_tokens");
  RequestFields g;
  g.max_tokens_field = "max_tokens";
  g.max_tokens_required = true;  // Anthropic
  EXPECT_EQ(NamedField(std::string(Resolve(g).message())), "max_tokens");
  RequestFields h;
  h.stop_field = "stop_sequences";
  h.stop = std::vector<std::string>(100, "s");
  EXPECT_EQ(NamedField(std::string(Resolve(h).message())), "stop_sequences");
}

TEST(ResolveRequestFields, WideCountsAreClampedNeverWrapped) {
  // 2^32 + 1 once wrapped to top_k = 1 (greedy in disguise); past the vocabulary it means all.
  RequestFields f;
  f.top_k = (int64_t{1} << 32) + 1;
  f.penalty_last_n = int64_t{1} << 40;
  f.max_tokens = std::numeric_limits<int64_t>::max();
  GenerateJob job;
  ASSERT_TRUE(Resolve(f, &job).ok());
  EXPECT_EQ(job.sampling.top_k, std::numeric_limits<int32_t>::max());
  EXPECT_EQ(job.sampling.penalty_last_n, std::numeric_limits<int32_t>::max());
  EXPECT_EQ(job.max_tokens, std::numeric_limits<int64_t>::max());
}

TEST(ResolveRequestFields, KeepsAcceptedValues) {
  RequestFields f;
  f.temperature = 0;
  f.top_p = 1;
  f.min_p = 0;
  f.top_k = -1;
  f.presence_penalty = -2;
  f.frequency_penalty = 2;
  f.seed = static_cast<uint64_t>(int64_t{-1});
  f.logit_bias = {{3, -100}, {999, 100}};
  f.stop = {"\n\n", "END"};
  f.stop_token_ids = {0, 999};
  f.ignore_eos = true;
  GenerateJob job;
  ASSERT_TRUE(Resolve(f, &job).ok());
  EXPECT_EQ(job.sampling.seed, ~uint64_t{0});
  ASSERT_EQ(job.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(job.sampling.logit_bias[1].id, 999);
  EXPECT_EQ(job.sampling.logit_bias[1].bias, 100.0f);
  EXPECT_EQ(job.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(job.stop_token_ids, (std::vector<int32_t>{0, 999}));
  EXPECT_TRUE(job.ignore_eos);
}

TEST(NormalizeChatRole, DeveloperIsTheSystemRoleAndStrangersAreRefused) {
  EXPECT_EQ(*NormalizeChatRole("developer", "messages[0]"), "system");
  for (const char* r : {"system", "user", "assistant", "tool"}) {
    EXPECT_EQ(*NormalizeChatRole(r, ""), r);
  }
  const absl::Status s = NormalizeChatRole("root", "messages[2]").status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("messages[2].role 'root'"), std::string::npos) << s;
}

// ---- Both front ends ----

struct JsonReply {
  int status = 0;
  json body;
};

JsonReply PostJson(const std::string& address, const std::string& target, const json& body) {
  const HttpReply r = Post(address, target, body.dump());
  return {r.status, json::parse(r.body, nullptr, false)};
}

class FrontEndValidationTest : public ScriptedBackend {
 protected:
  void SetUp() override {
    ScriptedBackend::SetUp();
    if (IsSkipped()) return;
    CoordinatorOptions o = Defaults();
    o.context = 512;
    o.served_name = "validation-test";
    Start("ok", o);
  }

  // The same request through both front ends: HTTP chat completions with `extra` merged into
  // the body, and gRPC's mapping with `grpc` applied. Returns (HTTP status, HTTP param,
  // gRPC status).
  struct Both {
    int http_status;
    std::string http_param;
    absl::Status grpc;
  };
  Both Send(const json& extra, const std::function<void(v1::GenerateRequest&)>& grpc) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}};
    body.update(extra);
    const JsonReply r = PostJson(server_->address(), "/v1/chat/completions", body);
    std::string param;
    if (r.status != 200 && r.body.contains("error") && r.body["error"]["param"].is_string()) {
      param = r.body["error"]["param"];
    }
    v1::GenerateRequest req;
    auto* m = req.mutable_messages()->add_messages();
    m->set_role("user");
    m->set_content("hi");
    req.set_max_tokens(2);
    grpc(req);
    return {r.status, param, JobFromRequest(*coordinator_, req).status()};
  }

};

TEST_F(FrontEndValidationTest, HttpAndGrpcRefuseTheSameValuesNamingTheSameField) {
  const float nan = std::nanf("");
  struct Case {
    json http;
    std::function<void(v1::GenerateRequest&)> grpc;
    const char* field;  // "" : accepted by both
  } cases[] = {
      {{{"temperature", -1}}, [](auto& r) { r.mutable_sampling()->set_temperature(-1); },
       "temperature"},
      {{{"presence_penalty", 3}}, [&](auto& r) { r.mutable_sampling()->set_presence_penalty(nan); },
       "presence_penalty"},
      {{{"frequency_penalty", -9}},
       [](auto& r) { r.mutable_sampling()->set_frequency_penalty(-9); }, "frequency_penalty"},
      {{{"top_p", -1}}, [](auto& r) { r.mutable_sampling()->set_top_p(-1); }, "top_p"},
      {{{"min_p", 5}}, [](auto& r) { r.mutable_sampling()->set_min_p(5); }, "min_p"},
      {{{"repetition_penalty", 0}},
       [](auto& r) { r.mutable_sampling()->set_repetition_penalty(0); }, "repetition_penalty"},
      {{{"top_k", -3}}, [](auto& r) { r.mutable_sampling()->set_top_k(-3); }, "top_k"},
      {{{"max_tokens", 0}}, [](auto& r) { r.set_max_tokens(0); }, "max_tokens"},
      {{{"logit_bias", {{"7", 250}}}},
       [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[7] = 250; }, "logit_bias"},
      {{{"logit_bias", {{"99999999", 1}}}},
       [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[99999999] = 1; },
       "logit_bias"},
      {{{"top_logprobs", 21}, {"logprobs", true}}, [](auto& r) { r.set_top_logprobs(21); },
       "top_logprobs"},
      // Accepted alike.
      {{{"temperature", 0}, {"top_k", 4294967297}},
       [](auto& r) {
         r.mutable_sampling()->set_temperature(0);
         r.mutable_sampling()->set_top_k(std::numeric_limits<int32_t>::max());
       },
       ""},
      {{{"logit_bias", {{"7", -100}, {"8", 100}}}},
       [](auto& r) {
         (*r.mutable_sampling()->mutable_logit_bias())[7] = -100;
         (*r.mutable_sampling()->mutable_logit_bias())[8] = 100;
       },
       ""},
  };
  for (const Case& c : cases) {
    const Both b = Send(c.http, c.grpc);
    if (*c.field == '\0') {
      EXPECT_EQ(b.http_status, 200) << c.http;
      EXPECT_TRUE(b.grpc.ok()) << c.http << ": " << b.grpc;
      continue;
    }
    EXPECT_EQ(b.http_status, 400) << c.http;
    EXPECT_EQ(b.http_param, c.field) << c.http;
    EXPECT_TRUE(absl::IsInvalidArgument(b.grpc)) << c.http << ": " << b.grpc;
    EXPECT_EQ(NamedField(std::string(b.grpc.message())), c.field) << b.grpc;
  }
}

TEST_F(FrontEndValidationTest, DeveloperRoleIsTheSystemRoleOnBothFrontEnds) {
  const Both b = Send({{"messages", {{{"role", "developer"}, {"content", "Be brief."}},
                                     {{"role", "user"}, {"content", "hi"}}}}},
                      [](v1::GenerateRequest& r) {
                        auto* m = r.mutable_messages()->mutable_messages();
                        m->Clear();
                        auto* d = m->Add();
                        d->set_role("developer");
                        d->set_content("Be brief.");
                        auto* u = m->Add();
                        u->set_role("user");
                        u->set_content("hi");
                      });
  EXPECT_EQ(b.http_status, 200);
  EXPECT_TRUE(b.grpc.ok()) << b.grpc;
}

TEST_F(FrontEndValidationTest, LogitBiasReachesTheSamplingStage) {
  const JsonReply r = PostJson(server_->address(), "/v1/completions",
                               {{"prompt", "hi"}, {"max_tokens", 1},
                                {"logit_bias", {{"12", -100}, {"5", 2.5}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  const wire::Sampling s = worker_->sampling();
  ASSERT_EQ(s.logit_bias_size(), 2);
  // In the order sent: the sampler adds each to its token, so order is immaterial.
  EXPECT_EQ(s.logit_bias(0).id(), 12);
  EXPECT_EQ(s.logit_bias(0).bias(), -100.0f);
  EXPECT_EQ(s.logit_bias(1).id(), 5);
  EXPECT_EQ(s.logit_bias(1).bias(), 2.5f);
}

TEST_F(FrontEndValidationTest, UnsupportedCompletionFieldsAreRefusedNotIgnored) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"echo", true}, {"best_of", 3}, {"suffix", "tail"}}) {
    const JsonReply r = PostJson(server_->address(), "/v1/completions",
                                 {{"prompt", "hi"}, {"max_tokens", 1}, {field, value}});
    EXPECT_EQ(r.status, 400) << field;
    EXPECT_EQ(r.body["error"]["param"], field) << r.body;
  }
  // Their no-op values are fine.
  const JsonReply ok = PostJson(server_->address(), "/v1/completions",
                                {{"prompt", "hi"}, {"max_tokens", 1}, {"echo", false},
                                 {"best_of", 1}, {"suffix", nullptr}});
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(FrontEndValidationTest, HugeIntegersAreRefusedNotWrapped) {
  const JsonReply r = PostJson(server_->address(), "/v1/chat/completions",
                               json::parse(R"({"messages": [{"role": "user", "content": "hi"}],
                                               "max_tokens": 18446744073709551615})"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "max_tokens");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("at most"), std::string::npos)
      << r.body;
}

TEST_F(FrontEndValidationTest, APromptThatCannotFitIsRefusedBeforeTokenization) {
  // 512 positions of at most max_token_bytes() bytes each: anything longer cannot fit.
  const size_t bytes = 513 * (coordinator_->text().max_token_bytes() + 1) + 1000;
  const JsonReply r = PostJson(server_->address(), "/v1/completions",
                               {{"prompt", std::string(bytes, 'a')}, {"max_tokens", 1}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("cannot fit the context"),
            std::string::npos)
      << r.body;
  v1::GenerateRequest req;
  req.set_prompt(std::string(bytes, 'a'));
  EXPECT_TRUE(absl::IsInvalidArgument(JobFromRequest(*coordinator_, req).status()));
}

TEST_F(FrontEndValidationTest, ChatWithoutASystemMessageGetsTheServersDefault) {
  ASSERT_EQ(PostJson(server_->address(), "/v1/chat/completions",
                     {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 1}})
                .status,
            200);
  const std::string rendered = coordinator_->text().tokenizer().Decode(worker_->prompt());
  EXPECT_NE(rendered.find("<|im_start|>system\nYou are a helpful assistant."), std::string::npos)
      << rendered;
  // A request's own system message replaces it.
  ASSERT_EQ(PostJson(server_->address(), "/v1/chat/completions",
                     {{"messages", {{{"role", "system"}, {"content", "Answer in French."}},
                                    {{"role", "user"}, {"content", "hi"}}}},
                      {"max_tokens", 1}})
                .status,
            200);
  const std::string own = coordinator_->text().tokenizer().Decode(worker_->prompt());
  EXPECT_EQ(own.find("You are a helpful assistant."), std::string::npos) << own;
  EXPECT_NE(own.find("Answer in French."), std::string::npos) << own;
}

TEST_F(FrontEndValidationTest, ModelIdIsTheServedNameWithGeneralNameAsAnAlias) {
  EXPECT_TRUE(coordinator_->Serves("validation-test"));
  EXPECT_TRUE(coordinator_->Serves(coordinator_->config().name));  // "qwen3-fixture"
  EXPECT_TRUE(coordinator_->Serves(""));
  EXPECT_FALSE(coordinator_->Serves("gpt-4o"));
  const JsonReply r = PostJson(server_->address(), "/v1/chat/completions",
                               {{"model", coordinator_->config().name},
                                {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                {"max_tokens", 1}});
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body["model"], "validation-test");
}

}  // namespace
}  // namespace fucina
