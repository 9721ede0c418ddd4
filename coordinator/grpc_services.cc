#include "coordinator/grpc_services.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/request_fields.h"
#include "models/log/log.h"
#include "worker/grpc_util.h"

namespace fucina {

absl::StatusOr<GenerateJob> JobFromRequest(const Coordinator& c,
                                           const ::fucina::v1::GenerateRequest& request) {
  const CoordinatorOptions& o = c.options();
  // The fields as sent; the one validation module maps and checks them (request_fields.h).
  RequestFields fields;
  const ::fucina::v1::Sampling& s = request.sampling();
  if (s.has_temperature()) fields.temperature = s.temperature();
  if (s.has_top_k()) fields.top_k = s.top_k();
  if (s.has_top_p()) fields.top_p = s.top_p();
  if (s.has_min_p()) fields.min_p = s.min_p();
  if (s.has_repetition_penalty()) fields.repetition_penalty = s.repetition_penalty();
  if (s.has_presence_penalty()) fields.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) fields.frequency_penalty = s.frequency_penalty();
  if (s.has_penalty_last_n()) fields.penalty_last_n = s.penalty_last_n();
  if (s.has_seed()) fields.seed = s.seed();
  // Sorted by id: a proto map's order is unspecified, the sampler's result must not depend on it.
  std::map<int32_t, float> bias(s.logit_bias().begin(), s.logit_bias().end());
  for (const auto& [id, b] : bias) fields.logit_bias.emplace_back(id, b);
  if (request.has_max_tokens()) fields.max_tokens = request.max_tokens();
  fields.top_logprobs = request.top_logprobs();
  fields.stop.assign(request.stop().begin(), request.stop().end());
  fields.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  fields.ignore_eos = request.ignore_eos();
  if (request.has_speculative()) fields.speculative = request.speculative();
  GenerateJob job;
  if (absl::Status st = ResolveRequestFields(fields, o.sampling, o.max_tokens,
                                             c.text().tokenizer().vocab_size(), &job);
      !st.ok()) {
    return st;
  }
  const ::fucina::v1::Constraint& k = s.constraint();
  switch (k.kind_case()) {
    case ::fucina::v1::Constraint::kJsonSchema:
      job.grammar = GrammarSpec::JsonSchema(k.json_schema());
      break;
    case ::fucina::v1::Constraint::kJsonObject:
      if (k.json_object()) job.grammar = GrammarSpec::JsonObject();
      break;
    case ::fucina::v1::Constraint::kRegex:
      job.grammar = GrammarSpec::Regex(k.regex());
      break;
    case ::fucina::v1::Constraint::kLark:
      job.grammar = GrammarSpec::Lark(k.lark());
      break;
    case ::fucina::v1::Constraint::KIND_NOT_SET:
      break;
  }
  if (absl::Status st = c.text().CheckGrammar(job.grammar); !st.ok()) {
    // Compiles full (RESOURCE_EXHAUSTED) is the server's state, not the grammar's fault: the
    // client may retry as it is.
    return absl::Status(absl::IsResourceExhausted(st) ? st.code()
                                                      : absl::StatusCode::kInvalidArgument,
                        absl::StrCat("sampling.constraint: ", st.message()));
  }
  absl::StatusOr<std::vector<int32_t>> prompt;
  switch (request.input_case()) {
    case ::fucina::v1::GenerateRequest::kPrompt:
      prompt = c.text().Encode(request.prompt(), true);
      break;
    case ::fucina::v1::GenerateRequest::kTokenIds:
      prompt = std::vector<int32_t>(request.token_ids().ids().begin(),
                                    request.token_ids().ids().end());
      break;
    case ::fucina::v1::GenerateRequest::kMessages: {
      std::vector<ChatMessage> messages;
      for (int i = 0; i < request.messages().messages_size(); ++i) {
        const auto& m = request.messages().messages(i);
        auto role = NormalizeChatRole(m.role(), absl::StrCat("messages[", i, "]"));
        if (!role.ok()) return role.status();
        ChatMessage msg;
        msg.role = *std::move(role);
        msg.content = m.content();
        messages.push_back(std::move(msg));
      }
      if (messages.empty()) return absl::InvalidArgumentError("field 'messages' is empty");
      ChatRenderOptions render;
      if (request.messages().has_enable_thinking()) {
        render.enable_thinking = request.messages().enable_thinking();
      }
      prompt = c.text().EncodeChat(std::move(messages), render);
      break;
    }
    default:
      return absl::InvalidArgumentError("one of prompt, token_ids or messages is required");
  }
  if (!prompt.ok()) return prompt.status();
  job.prompt = *std::move(prompt);
  if (job.prompt.empty()) return absl::InvalidArgumentError("the prompt has no tokens");
  return job;
}

namespace {

namespace api = ::fucina::v1;

// Bounds of what a worker may claim at Register (beyond them a claim is a bug or a lie).
constexpr int kMaxWorkerCores = 4096;
constexpr int64_t kMaxWorkerMemory = int64_t{1} << 50;

void AppendDelta(const Tokenizer& tokenizer, const Delta& d, bool logprobs,
                 api::GenerateResponse* out) {
  out->mutable_text()->append(d.text);
  for (size_t i = 0; i < d.ids.size(); ++i) {
    out->add_token_ids(d.ids[i]);
    if (!logprobs) continue;
    api::LogprobEntry* e = out->add_logprobs();
    e->mutable_token()->set_id(d.ids[i]);
    e->mutable_token()->set_text(ValidUtf8(tokenizer.TokenToPiece(d.ids[i])));
    e->mutable_token()->set_logprob(d.samples[i].logprob);
    for (const TokenLogprob& t : d.samples[i].top) {
      api::TokenLogprob* top = e->add_top();
      top->set_id(t.id);
      top->set_text(ValidUtf8(tokenizer.TokenToPiece(t.id)));
      top->set_logprob(t.logprob);
    }
  }
}

void SetFinal(const Outcome& o, api::GenerateResponse* out) {
  out->set_finish_reason(o.finish_reason);
  out->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(o.prompt_tokens));
  out->mutable_usage()->set_completion_tokens(static_cast<int32_t>(o.completion_tokens));
  out->mutable_usage()->set_cached_tokens(static_cast<int32_t>(o.cached_tokens));
}

}  // namespace

absl::StatusOr<CallCap::Hold> CallCap::Take() {
  if (in_use_.fetch_add(1) >= limit_) {
    in_use_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        limit_, " ", method_, " calls are being served, the most this server takes at once; "
        "try again later"));
  }
  return Hold(this);
}

grpc::Status GenerationService::Admit(const grpc::ServerContext* context,
                                      std::string_view method) const {
  return gate_.Admit(*context, "/fucina.v1.Generation/" + std::string(method));
}

grpc::Status GenerationService::CheckModel(const std::string& model) const {
  if (c_.Serves(model)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::NOT_FOUND,
                      absl::StrCat("model '", model, "' is not served here (serving '",
                                   c_.served_name(), "')"));
}

absl::StatusOr<std::shared_ptr<Request>> GenerationService::Start(
    const api::GenerateRequest& request) {
  if (grpc::Status s = CheckModel(request.model()); !s.ok()) return FromGrpc(s);
  return StartRequest(c_.scheduler(), [&] { return JobFromRequest(c_, request); });
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context,
                                         const api::GenerateRequest* request,
                                         api::GenerateResponse* response) {
  if (grpc::Status s = Admit(context, "Generate"); !s.ok()) return s;
  auto hold = generate_cap_.Take();
  if (!hold.ok()) return ToGrpc(hold.status());
  auto running = Start(*request);
  if (!running.ok()) return ToGrpc(running.status());
  const Outcome o = RelayRequest(
      **running, [context] { return context->IsCancelled(); },
      [&](const Delta& d) {
        AppendDelta(c_.text().tokenizer(), d, request->logprobs(), response);
        return true;
      });
  if (!o.status.ok()) return ToGrpc(o.status);
  SetFinal(o, response);
  return grpc::Status::OK;
}

grpc::Status GenerationService::GenerateStream(grpc::ServerContext* context,
                                               const api::GenerateRequest* request,
                                               grpc::ServerWriter<api::GenerateResponse>* writer) {
  if (grpc::Status s = Admit(context, "GenerateStream"); !s.ok()) return s;
  auto hold = stream_cap_.Take();
  if (!hold.ok()) return ToGrpc(hold.status());
  auto running = Start(*request);
  if (!running.ok()) return ToGrpc(running.status());
  const Outcome o = RelayRequest(
      **running, [context] { return context->IsCancelled(); },
      [&](const Delta& d) {
        api::GenerateResponse chunk;
        AppendDelta(c_.text().tokenizer(), d, request->logprobs(), &chunk);
        return writer->Write(chunk);  // false: the client went away
      });
  if (!o.status.ok()) return ToGrpc(o.status);
  api::GenerateResponse last;
  SetFinal(o, &last);
  writer->Write(last);
  return grpc::Status::OK;
}

grpc::Status GenerationService::Tokenize(grpc::ServerContext* context,
                                         const api::TokenizeRequest* request,
                                         api::TokenizeResponse* response) {
  if (grpc::Status s = Admit(context, "Tokenize"); !s.ok()) return s;
  if (grpc::Status s = CheckModel(request->model()); !s.ok()) return s;
  const bool add_special = !request->has_add_special() || request->add_special();
  for (int32_t id : c_.text().tokenizer().Encode(request->text(), add_special, true)) {
    response->add_ids(id);
  }
  return grpc::Status::OK;
}

grpc::Status GenerationService::Detokenize(grpc::ServerContext* context,
                                           const api::DetokenizeRequest* request,
                                           api::DetokenizeResponse* response) {
  if (grpc::Status s = Admit(context, "Detokenize"); !s.ok()) return s;
  if (grpc::Status s = CheckModel(request->model()); !s.ok()) return s;
  const int32_t vocab = c_.text().tokenizer().vocab_size();
  for (int32_t id : request->ids()) {
    if (id < 0 || id >= vocab) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("token id ", id, " outside the vocabulary [0, ", vocab,
                                       ")"));
    }
  }
  std::vector<int32_t> ids(request->ids().begin(), request->ids().end());
  response->set_text(ValidUtf8(c_.text().tokenizer().Decode(ids)));
  return grpc::Status::OK;
}

grpc::Status GenerationService::ListModels(grpc::ServerContext* context,
                                           const api::ListModelsRequest*,
                                           api::ListModelsResponse* response) {
  if (grpc::Status s = Admit(context, "ListModels"); !s.ok()) return s;
  api::ModelInfo* m = response->add_models();
  m->set_name(c_.served_name());
  m->set_arch(c_.config().arch);
  m->set_context_length(c_.options().context);
  m->set_ready(c_.scheduler().ready());
  m->set_status(c_.scheduler().status());
  return grpc::Status::OK;
}

grpc::Status GenerationService::GetPlacement(grpc::ServerContext* context,
                                             const api::GetPlacementRequest* request,
                                             api::Placement* response) {
  if (grpc::Status s = Admit(context, "GetPlacement"); !s.ok()) return s;
  if (grpc::Status s = CheckModel(request->model()); !s.ok()) return s;
  *response = c_.placement();
  return grpc::Status::OK;
}

grpc::Status TrainService::Admit(const grpc::ServerContext* context,
                                 std::string_view method) const {
  return gate_.Admit(*context, "/fucina.v1.Train/" + std::string(method));
}

grpc::Status TrainService::StartJob(grpc::ServerContext* context,
                                    const ::fucina::v1::StartJobRequest* request,
                                    ::fucina::v1::Job* response) {
  if (grpc::Status s = Admit(context, "StartJob"); !s.ok()) return s;
  if (!c_.Serves(request->model())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("model '", ValidUtf8(request->model().substr(0, 80)),
                                     "' is not served here (", c_.served_name(), " is)"));
  }
  auto job = c_.train_jobs().Start(*request);
  if (!job.ok()) return ToGrpc(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status TrainService::GetJob(grpc::ServerContext* context,
                                  const ::fucina::v1::GetJobRequest* request,
                                  ::fucina::v1::Job* response) {
  if (grpc::Status s = Admit(context, "GetJob"); !s.ok()) return s;
  auto job = c_.train_jobs().Get(request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status TrainService::WatchJob(grpc::ServerContext* context,
                                    const ::fucina::v1::WatchJobRequest* request,
                                    grpc::ServerWriter<::fucina::v1::JobEvent>* writer) {
  if (grpc::Status s = Admit(context, "WatchJob"); !s.ok()) return s;
  auto hold = watch_cap_.Take();
  if (!hold.ok()) return ToGrpc(hold.status());
  absl::Status s = c_.train_jobs().Watch(
      request->job_id(), [&](const ::fucina::v1::JobEvent& e) { return writer->Write(e); },
      [&] { return context->IsCancelled(); });
  return ToGrpc(s);
}

grpc::Status TrainService::StopJob(grpc::ServerContext* context,
                                   const ::fucina::v1::StopJobRequest* request,
                                   ::fucina::v1::Job* response) {
  if (grpc::Status s = Admit(context, "StopJob"); !s.ok()) return s;
  auto job = c_.train_jobs().Stop(request->job_id());
  if (!job.ok()) return ToGrpc(job.status());
  *response = *std::move(job);
  return grpc::Status::OK;
}

grpc::Status TrainService::ListJobs(grpc::ServerContext* context,
                                    const ::fucina::v1::ListJobsRequest*,
                                    ::fucina::v1::ListJobsResponse* response) {
  if (grpc::Status s = Admit(context, "ListJobs"); !s.ok()) return s;
  for (::fucina::v1::Job& job : c_.train_jobs().List()) *response->add_jobs() = std::move(job);
  return grpc::Status::OK;
}

absl::Status ValidateRegistration(const wire::RegisterRequest& request) {
  const std::string& address = request.address();
  const size_t colon = address.rfind(':');
  int port = 0;
  if (address.empty() || address.size() > 300 || colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535 ||
      std::any_of(address.begin(), address.end(), [](char ch) { return ch <= ' ' || ch > '~'; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: address must be host:port with a port in [1, 65535], got '",
        ValidUtf8(address.substr(0, 80)), "'"));
  }
  const wire::Capabilities& c = request.capabilities();
  if (c.cores() < 1 || c.cores() > kMaxWorkerCores) {
    return absl::InvalidArgumentError(absl::StrCat(
        "register: capabilities.cores must be in [1, ", kMaxWorkerCores, "], got ", c.cores()));
  }
  if (c.memory_budget() < 0 || c.memory_budget() > kMaxWorkerMemory) {
    return absl::InvalidArgumentError(
        absl::StrCat("register: capabilities.memory_budget must be in [0, 2^50] bytes, got ",
                     c.memory_budget()));
  }
  if (!c.device().empty() && c.device() != "cpu" && c.device() != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("register: capabilities.device must be cpu or cuda, got '",
                     ValidUtf8(c.device().substr(0, 32)), c.device().size() > 32 ? "..." : "",
                     "'"));
  }
  return absl::OkStatus();
}

namespace {

// Whether a failed dial is TLS refusing the peer (its certificate does not name the address
// dialled, or another CA signed it): gRPC reports it only in the message.
bool IsTlsRefusal(const absl::Status& s) {
  const std::string m = absl::AsciiStrToLower(s.message());
  for (const char* sign : {"ssl", "handshake", "certificate", "tsi_", "peer name"}) {
    if (m.find(sign) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

grpc::Status RegistryService::ProbeWorker(const std::string& address) const {
  if (worker_credentials_.channel == nullptr) return grpc::Status::OK;  // plaintext: no names
  // Under TLS the coordinator dials the worker at the address it registers, and the worker's
  // certificate must name that host. One that does not would be accepted here, fail its first
  // LoadShard, be forgotten and register again, in a loop: refused once, clearly, instead.
  WorkerDeadlines probe;
  probe.stats_ms = 1500;  // inside the worker's own deadline for Register
  absl::StatusOr<wire::WorkerStats> stats =
      MakeGrpcWorkerClient(address, worker_credentials_, probe)->GetStats();
  if (stats.ok() || !IsTlsRefusal(stats.status())) return grpc::Status::OK;
  const std::string host = address.substr(0, address.rfind(':'));
  const std::string why = absl::StrCat(
      "the coordinator cannot verify this worker's TLS certificate when dialling it at ",
      address, ": the certificate must name ", host,
      " (a subject alternative name; scripts/make-cluster-certs.sh DIR ... ", host,
      ") and be signed by the cluster CA; or register another address with --advertise (",
      stats.status().message().substr(0, 300), ")");
  FUCINA_LOG(kWarning) << "register refused: " << why;
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, why);
}

grpc::Status RegistryService::Register(grpc::ServerContext* context,
                                       const wire::RegisterRequest* request,
                                       wire::RegisterResponse* response) {
  if (grpc::Status s = gate_.Admit(*context, "/fucina.cluster.v1.Registry/Register"); !s.ok()) {
    return s;
  }
  if (absl::Status s = ValidateRegistration(*request); !s.ok()) return ToGrpc(s);
  if (grpc::Status s = ProbeWorker(request->address()); !s.ok()) return s;
  WorkerInfo info;
  info.cores = request->capabilities().cores();
  info.memory_budget = request->capabilities().memory_budget();
  const std::string device =
      request->capabilities().device().empty() ? "cpu" : request->capabilities().device();
  response->set_worker_id(c_.AddWorker(
      request->address(), info, MakeGrpcWorkerClient(request->address(), worker_credentials_),
      device));
  response->set_heartbeat_interval_ms(c_.options().heartbeat_ms);
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* context,
                                        const wire::HeartbeatRequest* request,
                                        wire::HeartbeatResponse* response) {
  if (grpc::Status s = gate_.Admit(*context, "/fucina.cluster.v1.Registry/Heartbeat");
      !s.ok()) {
    return s;
  }
  response->set_known(c_.Heartbeat(request->worker_id(),
                                   request->has_stats() ? &request->stats() : nullptr));
  return grpc::Status::OK;
}

}  // namespace fucina
