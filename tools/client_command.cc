// `fucina client generate`: one generation from a coordinator's public gRPC API, printed as
// it comes (--stream) or whole. `client train ...` is added by train_command.cc.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "fucina/v1/generate.grpc.pb.h"
#include "tools/command_status.h"
#include "tools/commands.h"
#include "tools/server_common.h"

namespace fucina::cli {
namespace {

namespace api = ::fucina::v1;

struct ClientArgs {
  std::string addr = "127.0.0.1:50051";
  std::string prompt;
  std::string chat;
  std::string model;
  int64_t gen = -1;
  float temp = -1;
  int64_t seed = -1;
  int top_k = -1;
  float top_p = -1, min_p = -1;
  float repeat_penalty = -1, presence_penalty = 0, frequency_penalty = 0;
  bool stream = false;
  int timeout_s = 600;
  std::string api_key;  // empty: $FUCINA_API_KEY
  std::string tls_ca;   // empty: plaintext
};

int RunClient(const ClientArgs& a) {
  if (a.prompt.empty() == a.chat.empty()) {
    return Fail(absl::InvalidArgumentError("give exactly one of --prompt or --chat"));
  }
  auto channel = DialCoordinator(a.addr, a.tls_ca);
  if (!channel.ok()) return FailUsage(channel.status());
  auto stub = api::Generation::NewStub(*channel);
  api::GenerateRequest req;
  req.set_model(a.model);
  if (!a.prompt.empty()) {
    req.set_prompt(a.prompt);
  } else {
    auto* m = req.mutable_messages()->add_messages();
    m->set_role("user");
    m->set_content(a.chat);
  }
  if (a.gen > 0) req.set_max_tokens(static_cast<int32_t>(a.gen));
  if (a.temp >= 0) req.mutable_sampling()->set_temperature(a.temp);
  if (a.seed >= 0) req.mutable_sampling()->set_seed(static_cast<uint64_t>(a.seed));
  if (a.top_k >= 0) req.mutable_sampling()->set_top_k(a.top_k);
  if (a.top_p >= 0) req.mutable_sampling()->set_top_p(a.top_p);
  if (a.min_p >= 0) req.mutable_sampling()->set_min_p(a.min_p);
  if (a.repeat_penalty >= 0) req.mutable_sampling()->set_repetition_penalty(a.repeat_penalty);
  if (a.presence_penalty != 0) req.mutable_sampling()->set_presence_penalty(a.presence_penalty);
  if (a.frequency_penalty != 0) {
    req.mutable_sampling()->set_frequency_penalty(a.frequency_penalty);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(a.timeout_s));
  AddApiKey(&ctx, a.api_key);
  grpc::Status status;
  if (a.stream) {
    auto reader = stub->GenerateStream(&ctx, req);
    api::GenerateResponse chunk;
    while (reader->Read(&chunk)) {
      std::fwrite(chunk.text().data(), 1, chunk.text().size(), stdout);
      std::fflush(stdout);
    }
    status = reader->Finish();
  } else {
    api::GenerateResponse resp;
    status = stub->Generate(&ctx, req, &resp);
    if (status.ok()) std::fwrite(resp.text().data(), 1, resp.text().size(), stdout);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "\nerror: %s: %s\n",
                 absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
                     .c_str(),
                 status.error_message().c_str());
    return 1;
  }
  std::printf("\n");
  return 0;
}

}  // namespace

void RegisterClientCommand(CLI::App& app, int* exit_code) {
  CLI::App* client = app.add_subcommand("client", "gRPC client of a coordinator");
  client->require_subcommand(1);
  auto a = std::make_shared<ClientArgs>();
  CLI::App* gen = client->add_subcommand("generate", "Generate text and print it");
  gen->add_option("--addr", a->addr, "Coordinator address")->capture_default_str();
  gen->add_option("--prompt", a->prompt, "Raw prompt text");
  gen->add_option("--chat", a->chat, "One user message, rendered with the chat template");
  gen->add_option("--model", a->model, "Model name (default: the served one)");
  gen->add_option("--gen", a->gen, "Maximum new tokens (default: the server's)");
  gen->add_option("--temp", a->temp, "Temperature (default: the server's)");
  gen->add_option("--seed", a->seed, "Sampling seed");
  gen->add_option("--top-k", a->top_k);
  gen->add_option("--top-p", a->top_p);
  gen->add_option("--min-p", a->min_p);
  gen->add_option("--repeat-penalty", a->repeat_penalty);
  gen->add_option("--presence-penalty", a->presence_penalty);
  gen->add_option("--frequency-penalty", a->frequency_penalty);
  gen->add_flag("--stream", a->stream, "Print text as it is generated");
  gen->add_option("--timeout", a->timeout_s, "Deadline in seconds")->capture_default_str();
  gen->add_option("--api-key", a->api_key,
                  "Sent as authorization: Bearer KEY; default $FUCINA_API_KEY");
  gen->add_option("--tls-ca", a->tls_ca,
                  "PEM CA that signed the server's certificate: connect over TLS");
  gen->callback([a, exit_code] { *exit_code = RunClient(*a); });
}

}  // namespace fucina::cli
