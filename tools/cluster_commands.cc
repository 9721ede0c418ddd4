// `fucina serve | coordinator | worker | client`: the cluster's processes and a gRPC client.
//
// Every server prints one line `listening grpc=HOST:PORT metrics=HOST:PORT` on stdout once its
// sockets are bound (port 0 picks a free one), then serves until SIGINT/SIGTERM, which drains
// in-flight calls. Readiness (model loaded) is reported through grpc.health.v1.Health.
//
// Security (worker/cluster_auth.h, docs/cluster.md): every gRPC call passes a CallGate; the
// cluster plane needs the join token, and TLS off loopback unless --insecure-cluster.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/grpc_services.h"
#include "coordinator/http/http_server.h"
#include "coordinator/model_source.h"
#include "fucina/cluster/v1/worker.grpc.pb.h"
#include "fucina/v1/generate.grpc.pb.h"
#include "models/engine/merge.h"
#include "models/hub/pull.h"
#include "tools/commands.h"
#include "tools/server_common.h"
#include "worker/cluster_auth.h"
#include "worker/grpc_util.h"
#include "worker/model_fetch.h"
#include "worker/worker_actor.h"
#include "worker/worker_service.h"

namespace fucina::cli {
namespace {

namespace api = ::fucina::v1;

// ---- serve / coordinator ----

struct ModelArgs {
  std::string model;
  std::string listen = "127.0.0.1:50051";
  std::string metrics = "127.0.0.1:9401";
  int workers = 1;
  int threads = 0;
  std::string memory_budget;
  std::string max_request_bytes = "16M";
  // SIGTERM: seconds in-flight HTTP and gRPC requests get to finish (a pod's termination grace
  // must cover it).
  double drain_timeout_s = 30;
  int grammar_timeout_ms = static_cast<int>(kDefaultGrammarCompileLimit.count());
  SecurityArgs security;
  CoordinatorOptions options;
  HttpOptions http;
  CallLimits call_limits;  // gRPC calls of the long-lived methods served at once
};

void AddModelFlags(CLI::App* cmd, ModelArgs* a) {
  CoordinatorOptions& o = a->options;
  cmd->add_option("--listen", a->listen, "gRPC address (port 0: any free port)")
      ->capture_default_str();
  cmd->add_option("--metrics", a->metrics, "Prometheus /metrics address")->capture_default_str();
  cmd->add_option("--http", a->http.listen,
                  "OpenAI/Anthropic-compatible HTTP address ('' to disable)")
      ->capture_default_str();
  cmd->add_option("--api-key", a->http.api_key,
                  "Require this key on HTTP (Bearer or x-api-key) and on the public gRPC API "
                  "(authorization: Bearer KEY); default $FUCINA_API_KEY");
  cmd->add_option("--max-request-bytes", a->max_request_bytes,
                  "Largest gRPC request message accepted, e.g. 16M (at most 512M)")
      ->capture_default_str();
  cmd->add_option("--allow-host", a->http.allow_hosts,
                  "Accept only these Host headers on HTTP (repeatable)");
  cmd->add_option("--max-body", a->http.max_body_bytes, "Largest HTTP request body in bytes")
      ->capture_default_str();
  cmd->add_option("--max-connections", a->http.max_connections,
                  "Open HTTP connections served at once (more get 503)")
      ->capture_default_str();
  cmd->add_option("--http-idle-timeout", a->http.idle_timeout_s,
                  "Seconds an HTTP connection may wait for its next request")
      ->capture_default_str();
  cmd->add_option("--http-request-timeout", a->http.request_timeout_s,
                  "Seconds an HTTP request (headers and body) may take to arrive, from its "
                  "first byte, plus 1 s per --http-min-rate bytes (slower: 408)")
      ->capture_default_str();
  cmd->add_option("--http-min-rate", a->http.min_request_rate,
                  "Bytes per second an HTTP request must average past --http-request-timeout")
      ->capture_default_str();
  cmd->add_option("--drain-timeout", a->drain_timeout_s,
                  "Seconds SIGINT/SIGTERM waits for in-flight HTTP and gRPC requests to finish "
                  "(no new ones are accepted meanwhile)")
      ->capture_default_str();
  cmd->add_option("--served-model-name", o.served_name,
                  "Model id clients use (default: the file's stem; general.name is an alias)");
  cmd->add_option("--system", o.system_prompt,
                  "System prompt for chat requests that have none ('' = the template's default)")
      ->capture_default_str();
  cmd->add_flag("--parse-special-in-content", o.parse_special_in_content,
                "Control-token text in user and tool messages becomes the control token (as "
                "llama-server does); by default it stays text");
  cmd->add_option("--adapter", o.adapter_path,
                  "LoRA adapter GGUF every stage applies, unmerged, or a train run's --out "
                  "folder (its adapters.gguf); each worker reads it at this path");
  cmd->add_option("--train-dir", o.train_dir,
                  "Folder under which train jobs (fucina.v1.Train) write checkpoints and resume "
                  "from them; their out_dir / resume_from name a folder in it (none: no "
                  "checkpoints)");
  cmd->add_option("--ctx", o.context, "Context (KV cache) length per session")
      ->capture_default_str();
  cmd->add_option("--cache-type", o.cache_type, "KV cache type: f32 | f16 | q8_0")
      ->capture_default_str();
  cmd->add_option("--activations", o.activation_type,
                  "Activations between stages: f32 | f16 | bf16")
      ->capture_default_str();
  cmd->add_option("--kv-slots", o.kv_slots, "Finished conversations kept resident for reuse")
      ->capture_default_str();
  cmd->add_option("--batch", o.scheduler.batch,
                  "Requests running at once (split across the micro-batches)")
      ->capture_default_str();
  cmd->add_option("--micro-batches", o.scheduler.micro_batches,
                  "Groups of running requests stepped independently, so that every stage "
                  "computes at once (0: one per pipeline stage)")
      ->capture_default_str();
  cmd->add_option("--max-step-tokens", o.scheduler.max_step_tokens,
                  "Tokens per step of a micro-batch: decode tokens first, then prompt chunks")
      ->capture_default_str();
  cmd->add_option("--max-queue", o.scheduler.max_queue, "Waiting requests before refusing")
      ->capture_default_str();
  cmd->add_flag("--spec", o.scheduler.speculative,
                "Speculative decoding without a draft model: drafts from suffix automata over "
                "each request's tokens, checked by one verify step through the pipeline (same "
                "output, fewer steps); a request may opt out (\"speculative\": false)");
  cmd->add_option("--grammar-timeout", a->grammar_timeout_ms,
                  "Milliseconds a request's grammar (response_format, guided_*, constraint) may "
                  "take to compile before the request is refused")
      ->capture_default_str();
  cmd->add_option("--spec-max", o.scheduler.max_draft, "Longest draft per verify step")
      ->capture_default_str();
  cmd->add_option("--expert-workers", o.expert_workers,
                  "MoE: workers dedicated to expert streams")
      ->capture_default_str();
  cmd->add_option("--gen", o.max_tokens, "Default maximum new tokens")->capture_default_str();
  cmd->add_option("--temp", o.sampling.temperature, "Default temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", o.sampling.top_k)->capture_default_str();
  cmd->add_option("--top-p", o.sampling.top_p)->capture_default_str();
  cmd->add_option("--min-p", o.sampling.min_p)->capture_default_str();
  cmd->add_option("--repeat-penalty", o.sampling.repetition_penalty)->capture_default_str();
  cmd->add_option("--presence-penalty", o.sampling.presence_penalty)->capture_default_str();
  cmd->add_option("--frequency-penalty", o.sampling.frequency_penalty)->capture_default_str();
  cmd->add_option("--seed", o.sampling.seed)->capture_default_str();
  cmd->add_option("--heartbeat-ms", o.heartbeat_ms, "Worker heartbeat interval")
      ->capture_default_str();
  cmd->add_option("--dead-after-ms", o.dead_after_ms, "Silence after which a worker is dead")
      ->capture_default_str();
  // Each call of these holds a gRPC thread while it runs; beyond its cap a method answers
  // RESOURCE_EXHAUSTED, so streams of one kind cannot take the threads the others need.
  cmd->add_option("--max-generate-calls", a->call_limits.generate,
                  "gRPC Generate calls served at once (GenerateStream has as many)")
      ->capture_default_str();
  cmd->add_option("--max-watch-streams", a->call_limits.watch_job,
                  "gRPC WatchJob streams served at once")
      ->capture_default_str();
}

// Flags that would start a server that cannot work (or abort it later) are refused up front.
absl::Status ValidateModelArgs(const ModelArgs& a, bool embedded) {
  const CoordinatorOptions& o = a.options;
  const auto& range = CheckFlagRange;
  for (absl::Status s : {
           range("--threads", embedded ? a.threads : o.threads, 0, kMaxThreads),
           range("--workers", a.workers, 1, 64),
           range("--ctx", o.context, 2, kMaxContext),
           range("--kv-slots", o.kv_slots, 1, 4096),
           range("--batch", o.scheduler.batch, 1, 1024),
           range("--micro-batches", o.scheduler.micro_batches, 0, 64),
           range("--max-step-tokens", o.scheduler.max_step_tokens, 1, kMaxContext),
           range("--spec-max", o.scheduler.max_draft, 1, 64),
           range("--grammar-timeout", a.grammar_timeout_ms, 1, 600'000),
           range("--max-queue", o.scheduler.max_queue, 1, 1 << 20),
           range("--expert-workers", o.expert_workers, 0, 1024),
           range("--gen", o.max_tokens, 1, kMaxContext),
           range("--heartbeat-ms", o.heartbeat_ms, 10, 60'000),
           range("--max-generate-calls", a.call_limits.generate, 1, 1 << 16),
           range("--max-watch-streams", a.call_limits.watch_job, 1, 1 << 16),
           range("--dead-after-ms", o.dead_after_ms, o.heartbeat_ms + 1, 3'600'000),
           range("--max-connections", a.http.max_connections, 1, 1 << 16),
           range("--max-body", static_cast<int64_t>(a.http.max_body_bytes), 1, int64_t{1} << 32),
       }) {
    if (!s.ok()) return s;
  }
  for (const auto& [flag, seconds] : {std::pair{"--http-idle-timeout", a.http.idle_timeout_s},
                                       std::pair{"--http-request-timeout",
                                                 a.http.request_timeout_s}}) {
    if (!(seconds > 0 && seconds <= 86400)) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " must be in (0, 86400] seconds, got ", seconds));
    }
  }
  if (!(a.drain_timeout_s >= 0 && a.drain_timeout_s <= 86400)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--drain-timeout must be in [0, 86400] seconds, got ", a.drain_timeout_s));
  }
  if (!(a.http.min_request_rate > 0 && std::isfinite(a.http.min_request_rate))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http-min-rate must be a positive number of bytes per second, got ",
        a.http.min_request_rate));
  }
  return ValidateSamplingParams(o.sampling, 0, SamplingFieldNames::kFlags);
}

int RunCoordinator(ModelArgs a, bool embedded) {
  BlockStopSignals();
  if (absl::Status s = ValidateModelArgs(a, embedded); !s.ok()) return Fail(s);
  if (a.model.empty()) {
    // The default model: FUCINA_DEFAULT_MODEL, else the SmolLM2 file scripts/serve.sh fetches
    // into the model cache.
    const char* def = std::getenv("FUCINA_DEFAULT_MODEL");
    if (def != nullptr && *def != '\0') {
      a.model = def;
    } else {
      auto dir = ModelCacheDir();
      if (!dir.ok()) return Fail(dir.status());
      a.model = *dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
      if (access(a.model.c_str(), R_OK) != 0) {
        return Fail(absl::NotFoundError("no MODEL given and the default " + a.model +
                                        " is missing (scripts/serve.sh fetches it)"));
      }
    }
  }
  auto path = ResolveModel(a.model, isatty(STDERR_FILENO));
  if (!path.ok()) return Fail(path.status());
  a.options.model_path = *path;
  if (!a.options.adapter_path.empty()) {
    auto file = AdapterFileAt(a.options.adapter_path);
    if (!file.ok()) return Fail(file.status());
    a.options.adapter_path = *file;
    // Workers started elsewhere read it at the path the coordinator sends them.
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(a.options.adapter_path, ec);
    if (!ec) a.options.adapter_path = absolute.string();
  }
  auto budget = ParseBytes(a.memory_budget, "--memory-budget");
  if (!budget.ok()) return Fail(budget.status());
  auto max_request = ParseBytes(a.max_request_bytes, "--max-request-bytes");
  if (!max_request.ok()) return Fail(max_request.status());
  if (*max_request < 1024 || *max_request > kMaxMessageBytes) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--max-request-bytes must be in [1K, 512M], got ", a.max_request_bytes)));
  }
  if (a.http.api_key.empty()) {
    if (const char* key = std::getenv("FUCINA_API_KEY")) a.http.api_key = key;
  }
  // The cluster plane (not embedded): TLS with a CA or loopback, and the join token.
  auto tls = LoadTls(a.security.tls, /*need_ca=*/!embedded);
  if (!tls.ok()) return FailUsage(tls.status());
  ClusterToken token;
  if (!embedded) {
    if (absl::Status s = CheckPlaintextAllowed(a.security, tls->has_value(),
                                               {{"--listen", a.listen}});
        !s.ok()) {
      return FailUsage(s);
    }
    auto loaded = LoadToken(a.security);
    if (!loaded.ok()) return Fail(loaded.status());
    token = *std::move(loaded);
  }
  const CallGate gate({.cluster_token = token.value,
                       .require_peer_certificate = tls->has_value(),
                       .api_key = a.http.api_key});

  auto registry = std::make_shared<prometheus::Registry>();
  a.options.grammar_timeout = std::chrono::milliseconds(a.grammar_timeout_ms);
  auto coordinator = Coordinator::Create(a.options, registry);
  if (!coordinator.ok()) return Fail(coordinator.status());
  Coordinator& c = **coordinator;
  CallLimits limits = a.call_limits;
  limits.generate_stream = limits.generate;
  GenerationService generation(c, gate, limits);
  TrainService train(c, gate, limits);
  RegistryService registry_service(c, gate, MakeClusterCredentials(*tls, token.value));
  std::vector<grpc::Service*> services = {&generation, &train};
  // Workers without the model file fetch their shards' tensors from here.
  std::unique_ptr<ModelSourceService> model_source;
  if (!embedded) {
    auto source = ModelSourceService::Create(a.options.model_path, gate);
    if (!source.ok()) return Fail(source.status());
    model_source = *std::move(source);
    services.push_back(&registry_service);
    services.push_back(model_source.get());
  }
  // Public clients need no certificate here; cluster calls are held to one by the gate.
  auto server = StartGrpc(a.listen, services,
                          MakeServerCredentials(*tls, ClientCertificates::kRequest),
                          tls->has_value(), static_cast<int>(*max_request));
  if (!server.ok()) return Fail(server.status());
  SetHealth(server->server.get(), false);
  c.SetReadyListener([s = server->server.get()](bool ready) { SetHealth(s, ready); });
  std::string metrics_address;
  auto exposer = StartMetrics(a.metrics, /*may_move=*/false, &metrics_address);
  if (!exposer.ok()) return Fail(exposer.status());
  (*exposer)->RegisterCollectable(registry);
  std::unique_ptr<HttpServer> http;
  if (!a.http.listen.empty()) {
    auto started = HttpServer::Start(c, registry, a.http);
    if (!started.ok()) return Fail(started.status());
    http = *std::move(started);
  }
  std::printf("listening grpc=%s metrics=%s%s\n", server->address.c_str(),
              metrics_address.c_str(), http ? (" http=" + http->address()).c_str() : "");
  std::fflush(stdout);

  // Embedded workers: in-process actors reached through the same interface as remote ones.
  std::vector<std::pair<WorkerInfo, std::shared_ptr<WorkerClient>>> actors;
  if (embedded) {
    const int total = a.threads > 0 ? a.threads : ThreadPool::Default().num_threads();
    for (int i = 0; i < a.workers; ++i) {
      WorkerOptions wo;
      wo.threads = std::max(1, total / a.workers);
      wo.memory_budget = *budget;
      auto actor = std::make_shared<WorkerActor>(
          wo, [&c](const wire::Peer& peer) { return c.ClientFor(peer.worker_id()); });
      WorkerInfo info;
      info.cores = wo.threads;
      info.memory_budget = wo.memory_budget;
      actors.emplace_back(info, std::move(actor));
    }
    c.AddWorkers(actors);
  }
  WaitForStop();
  {
    // Both front ends stop accepting at once and share one deadline for what they hold.
    const auto grace = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(a.drain_timeout_s));
    std::thread grpc_drain([&] {
      server->server->Shutdown(std::chrono::system_clock::now() + grace);
    });
    // Train jobs stop now and are cut at the same deadline (their watchers' streams end then).
    std::thread train_drain(
        [&] { c.train_jobs().Shutdown(std::chrono::steady_clock::now() + grace); });
    if (http) http->Drain(std::chrono::steady_clock::now() + grace);
    grpc_drain.join();
    train_drain.join();
  }
  http.reset();
  // Before the server goes: the coordinator's threads (heartbeat watcher, scheduler) call the
  // ready listener, which points at the server.
  coordinator->reset();
  return 0;
}

// ---- worker ----

struct WorkerArgs {
  std::string listen = "127.0.0.1:50052";
  std::string coordinator;
  std::string advertise;
  std::string metrics = "127.0.0.1:9402";
  bool metrics_given = false;  // --metrics on the command line: a taken port is an error
  std::string memory_budget;
  int threads = 0;
  std::string model_cache;       // empty: $FUCINA_CACHE/model-cache
  std::string model_fetch_rate;  // bytes per second, e.g. 100M; empty: unlimited
  SecurityArgs security;
};

// Where fetched models are kept: --model-cache, else $FUCINA_CACHE/model-cache (FUCINA_CACHE
// defaults to ~/.cache/fucina, as for the join token and pulled models).
absl::StatusOr<std::string> WorkerModelCache(const std::string& flag) {
  if (!flag.empty()) return flag;
  const char* cache = std::getenv("FUCINA_CACHE");
  if (cache != nullptr && *cache != '\0') return absl::StrCat(cache, "/model-cache");
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') {
    return absl::InvalidArgumentError(
        "no model cache: neither FUCINA_CACHE nor HOME is set (give --model-cache)");
  }
  return absl::StrCat(home, "/.cache/fucina/model-cache");
}

std::string ShardName(const wire::LoadShardRequest& r) {
  if (r.last_layer() < 0) return "whole model";  // a train job's replica
  return absl::StrCat(r.stage() < 0 ? "experts of layers [" : "layers [", r.first_layer(), ", ",
                      r.last_layer(), ")");
}

// The actor's stats for heartbeats, without waiting on the actor: GetStats queues behind the
// running task (a shard load takes minutes, a long prefill seconds), and heartbeats that waited
// would get the worker declared dead. Each beat sends the newest finished snapshot and starts
// the next; one fetch is in flight at a time.
class StatsSampler {
 public:
  explicit StatsSampler(WorkerActor& actor) : actor_(actor) {}

  // Waits at most `wait` for the fetch in flight. Nothing before the first one finishes.
  std::optional<wire::WorkerStats> Latest(std::chrono::milliseconds wait) {
    if (!pending_.valid()) {
      pending_ = std::async(std::launch::async, [this] { return actor_.GetStats(); });
    }
    if (pending_.wait_for(wait) == std::future_status::ready) {
      absl::StatusOr<wire::WorkerStats> stats = pending_.get();
      if (stats.ok()) latest_ = *std::move(stats);
    }
    return latest_;
  }

 private:
  WorkerActor& actor_;
  std::future<absl::StatusOr<wire::WorkerStats>> pending_;
  std::optional<wire::WorkerStats> latest_;
};

// Exposes the actor's stats at scrape time.
class WorkerCollectable : public prometheus::Collectable {
 public:
  WorkerCollectable(WorkerActor& actor, std::shared_ptr<prometheus::Registry> own)
      : actor_(actor), own_(std::move(own)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out = own_->Collect();
    auto stats = actor_.GetStats();
    if (!stats.ok()) return out;
    auto family = [&](const char* name, const char* help, prometheus::MetricType type) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      return f;
    };
    auto gauge = [&](const char* name, const char* help, double v) {
      auto f = family(name, help, prometheus::MetricType::Gauge);
      prometheus::ClientMetric m;
      m.gauge.value = v;
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    auto counter = [&](const char* name, const char* help, double v) {
      auto f = family(name, help, prometheus::MetricType::Counter);
      prometheus::ClientMetric m;
      m.counter.value = v;
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    gauge("fucina_worker_resident_sessions", "Sessions whose KV this worker holds.",
          stats->sessions());
    gauge("fucina_worker_kv_bytes", "Bytes of KV cache allocated.", stats->kv_bytes());
    gauge("fucina_worker_weight_bytes", "Bytes of weights in the shard.", stats->weight_bytes());
    gauge("fucina_worker_memory_budget_bytes", "Memory budget (0: unlimited).",
          stats->memory_budget());
    gauge("fucina_worker_queue_depth", "Calls waiting for the actor.", stats->queue_depth());
    counter("fucina_worker_forwarded_positions_total", "Rows run through this worker's layers.",
            stats->forwarded_positions());
    counter("fucina_worker_activation_bytes_received_total", "Activation bytes received.",
            stats->activation_bytes_in());
    counter("fucina_worker_activation_bytes_sent_total", "Activation bytes sent.",
            stats->activation_bytes_out());
    // The step breakdown (worker/step_times.h): seconds by kind of step and part, and the
    // steps they sum.
    auto steps = family("fucina_worker_steps_total", "Forward steps this worker ran, by kind.",
                        prometheus::MetricType::Counter);
    auto parts = family("fucina_worker_step_seconds_total",
                        "Seconds of this worker's forward steps, by kind and part (StepTimes).",
                        prometheus::MetricType::Counter);
    for (const auto& [kind, t] : {std::pair<const char*, const wire::StepTimes&>{
                                      "decode", stats->decode_step_times()},
                                  {"other", stats->other_step_times()}}) {
      prometheus::ClientMetric n;
      n.label.push_back({"kind", kind});
      n.counter.value = static_cast<double>(t.steps());
      steps.metric.push_back(n);
      const google::protobuf::Descriptor* d = t.GetDescriptor();
      for (int i = 0; i < d->field_count(); ++i) {
        const google::protobuf::FieldDescriptor* f = d->field(i);
        if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) continue;
        prometheus::ClientMetric m;
        m.label.push_back({"kind", kind});
        m.label.push_back({"part", f->name()});
        m.counter.value = t.GetReflection()->GetDouble(t, f);
        parts.metric.push_back(m);
      }
    }
    out.push_back(std::move(steps));
    out.push_back(std::move(parts));
    auto experts = family("fucina_worker_expert_tokens_total",
                          "Token rows computed per expert on this worker.",
                          prometheus::MetricType::Counter);
    for (int e = 0; e < stats->expert_token_counts_size(); ++e) {
      prometheus::ClientMetric m;
      m.label.push_back({"expert", std::to_string(e)});
      m.counter.value = static_cast<double>(stats->expert_token_counts(e));
      experts.metric.push_back(m);
    }
    if (!experts.metric.empty()) out.push_back(std::move(experts));
    return out;
  }

 private:
  WorkerActor& actor_;
  std::shared_ptr<prometheus::Registry> own_;
};

int RunWorker(const WorkerArgs& a) {
  BlockStopSignals();
  if (a.threads < 0 || a.threads > kMaxThreads) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--threads must be in [0, ", kMaxThreads, "], got ", a.threads)));
  }
  if (a.coordinator.empty()) return Fail(absl::InvalidArgumentError("--coordinator is required"));
  auto budget = ParseBytes(a.memory_budget, "--memory-budget");
  if (!budget.ok()) return Fail(budget.status());
  auto tls = LoadTls(a.security.tls, /*need_ca=*/true);
  if (!tls.ok()) return FailUsage(tls.status());
  if (absl::Status s = CheckPlaintextAllowed(
          a.security, tls->has_value(),
          {{"--listen", a.listen}, {"--coordinator", a.coordinator},
           {"--advertise", a.advertise}});
      !s.ok()) {
    return FailUsage(s);
  }
  auto token = LoadToken(a.security);
  if (!token.ok()) return Fail(token.status());
  const ClusterCredentials credentials = MakeClusterCredentials(*tls, token->value);
  auto model_cache = WorkerModelCache(a.model_cache);
  if (!model_cache.ok()) return FailUsage(model_cache.status());
  auto fetch_rate = ParseBytes(a.model_fetch_rate, "--model-fetch-rate");
  if (!fetch_rate.ok()) return FailUsage(fetch_rate.status());
  // The shard's model: the coordinator's path when this machine can read it (a shared
  // filesystem, or the same machine), else its tensors fetched from the coordinator.
  ModelFetcher fetcher(MakeModelSourceStub(a.coordinator, credentials), credentials,
                       {.cache_dir = *model_cache, .max_bytes_per_second = *fetch_rate});
  const CallGate gate({.cluster_token = token->value,
                       .require_peer_certificate = tls->has_value(),
                       .api_key = ""});
  auto registry = std::make_shared<prometheus::Registry>();
  auto& latency = prometheus::BuildHistogram()
                      .Name("fucina_worker_forward_latency_seconds")
                      .Help("Wall time of one forward step through this worker's stage.")
                      .Register(*registry)
                      .Add({}, prometheus::Histogram::BucketBoundaries{
                                   0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                   2.5, 5, 10});
  WorkerOptions wo;
  wo.threads = a.threads;
  // Without --memory-budget, the memory this process may actually use: a worker with no
  // budget at all would take any context or step it is sent until the kernel kills it.
  wo.memory_budget = *budget > 0 ? *budget : DefaultMemoryBudget();
  if (*budget <= 0) {
    std::fprintf(stderr, "memory budget %lld bytes (80%% of the memory available here; "
                 "--memory-budget sets it)\n", static_cast<long long>(wo.memory_budget));
  }
  wo.on_forward = [&latency](double s) { latency.Observe(s); };
  wo.locate_model = [&fetcher](const wire::LoadShardRequest& r) -> absl::StatusOr<std::string> {
    const std::string shard = ShardName(r);
    if (::access(r.model_path().c_str(), R_OK) == 0) {
      std::fprintf(stderr, "shard %s: model from the file %s, 0 bytes moved\n", shard.c_str(),
                   r.model_path().c_str());
      return r.model_path();
    }
    const int err = errno;
    std::fprintf(stderr, "shard %s: cannot read %s here (%s): fetching from the coordinator\n",
                 shard.c_str(), r.model_path().c_str(), std::strerror(err));
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<FetchReport> report = fetcher.Fetch(r);
    if (!report.ok()) {
      std::fprintf(stderr, "shard %s: model fetch failed: %s\n", shard.c_str(),
                   report.status().ToString().c_str());
      return report.status();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "shard %s: model %s\n", shard.c_str(),
                 DescribeFetch(*report, seconds).c_str());
    return report->path;
  };
  // Peers (the next stage, expert workers) are other workers: dialled with this worker's
  // certificate and token.
  WorkerActor actor(wo, [credentials](const wire::Peer& peer) {
    return std::shared_ptr<WorkerClient>(MakeGrpcWorkerClient(peer.address(), credentials));
  });
  WorkerService service(actor, gate);
  // A worker has no public clients: under TLS the handshake itself requires a certificate.
  auto server = StartGrpc(a.listen, {&service},
                          MakeServerCredentials(*tls, ClientCertificates::kRequire),
                          tls->has_value(), kMaxMessageBytes);
  if (!server.ok()) return Fail(server.status());
  SetHealth(server->server.get(), true);
  std::string metrics_address;
  auto exposer = StartMetrics(a.metrics, /*may_move=*/!a.metrics_given, &metrics_address);
  if (!exposer.ok()) return Fail(exposer.status());
  auto collectable = std::make_shared<WorkerCollectable>(actor, registry);
  (*exposer)->RegisterCollectable(collectable);
  std::printf("listening grpc=%s metrics=%s\n", server->address.c_str(), metrics_address.c_str());
  std::fflush(stdout);

  // Registration and heartbeats: register until it works, heartbeat every interval, register
  // again when the coordinator forgot us (it restarted or declared us dead).
  const std::string advertise =
      !a.advertise.empty() ? a.advertise
                           : absl::StrCat(Host(server->address) == "0.0.0.0"
                                              ? "127.0.0.1"
                                              : Host(server->address),
                                          ":", server->address.substr(server->address.rfind(':') + 1));
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread beat([&] {
    auto stub = wire::Registry::NewStub(
        grpc::CreateChannel(a.coordinator, credentials.ChannelCredentials()));
    StatsSampler sampler(actor);
    std::string id;
    int interval_ms = 1000;
    bool warned = false;
    int refused_ms = 0;  // back-off after a FAILED_PRECONDITION refusal
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      lock.unlock();
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      credentials.Prepare(&ctx);
      int wait_ms = interval_ms;
      if (id.empty()) {
        wire::RegisterRequest req;
        req.set_address(advertise);
        req.mutable_capabilities()->set_cores(actor.num_threads());
        req.mutable_capabilities()->set_memory_budget(actor.memory_budget());
        req.mutable_capabilities()->set_device("cpu");
        wire::RegisterResponse resp;
        grpc::Status s = stub->Register(&ctx, req, &resp);
        if (s.ok()) {
          id = resp.worker_id();
          refused_ms = 0;
          interval_ms = std::max(50, resp.heartbeat_interval_ms());
          std::fprintf(stderr, "registered with %s as %s\n", a.coordinator.c_str(), id.c_str());
          warned = false;
          wait_ms = interval_ms;
        } else if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
          // Refused for what this process is (its certificate does not name the address it
          // registers): retrying soon cannot help, so each try is logged and they back off.
          refused_ms = std::min(60'000, std::max(5'000, refused_ms * 2));
          std::fprintf(stderr, "cannot register with %s: %s (next try in %d s)\n",
                       a.coordinator.c_str(), s.error_message().c_str(), refused_ms / 1000);
          wait_ms = refused_ms;
        } else {
          if (!warned) {
            const std::string hint =
                s.error_code() == grpc::StatusCode::UNAUTHENTICATED
                    ? " (this worker's token is from " + token->source +
                          "; it must be the coordinator's)"
                    : "";
            std::fprintf(stderr, "cannot register with %s: %s%s (retrying)\n",
                         a.coordinator.c_str(), s.error_message().c_str(), hint.c_str());
          }
          warned = true;
          wait_ms = 500;
        }
      } else {
        wire::HeartbeatRequest req;
        req.set_worker_id(id);
        if (auto stats = sampler.Latest(std::chrono::milliseconds(100))) {
          *req.mutable_stats() = *std::move(stats);
        }
        wire::HeartbeatResponse resp;
        grpc::Status s = stub->Heartbeat(&ctx, req, &resp);
        if (s.ok() && !resp.known()) id.clear();
      }
      lock.lock();
      cv.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return stopping; });
    }
  });
  WaitForStop();
  {
    std::lock_guard<std::mutex> lock(mu);
    stopping = true;
  }
  cv.notify_all();
  beat.join();
  server->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return 0;
}

}  // namespace

void RegisterClusterCommands(CLI::App& app, int* exit_code) {
  {
    auto a = std::make_shared<ModelArgs>();
    CLI::App* cmd = app.add_subcommand(
        "serve", "Serve a model: coordinator + in-process workers (the one-machine default)");
    cmd->add_option("MODEL", a->model, "GGUF path or reference (default: the SmolLM2 model)");
    cmd->add_option("--workers", a->workers, "In-process worker actors (pipeline stages)")
        ->capture_default_str();
    cmd->add_option("--threads", a->threads, "Threads in all (split across workers)");
    cmd->add_option("--memory-budget", a->memory_budget, "Per-worker memory budget, e.g. 4G");
    AddModelFlags(cmd, a.get());
    AddSecurityFlags(cmd, &a->security, /*cluster=*/false);
    cmd->callback([a, exit_code] { *exit_code = RunCoordinator(*a, true); });
  }
  {
    auto a = std::make_shared<ModelArgs>();
    CLI::App* cmd = app.add_subcommand(
        "coordinator", "Coordinate workers that register over gRPC (fucina worker)");
    cmd->add_option("MODEL", a->model, "GGUF path or reference")->required();
    cmd->add_option("--threads", a->options.threads,
                    "Threads each shard uses, at most a worker's own --threads (default: all)");
    AddModelFlags(cmd, a.get());
    AddSecurityFlags(cmd, &a->security, /*cluster=*/true);
    cmd->callback([a, exit_code] { *exit_code = RunCoordinator(*a, false); });
  }
  {
    auto a = std::make_shared<WorkerArgs>();
    CLI::App* cmd = app.add_subcommand("worker", "A worker process: holds shards for a coordinator");
    cmd->add_option("--listen", a->listen, "gRPC address")->capture_default_str();
    cmd->add_option("--coordinator", a->coordinator, "Coordinator address")->required();
    cmd->add_option("--advertise", a->advertise, "Address registered (default: the bound one)");
    CLI::Option* metrics = cmd->add_option(
        "--metrics", a->metrics,
        "Prometheus /metrics address (when the default port is taken, e.g. by another worker "
        "on this machine, a free one is used and printed; a given port must be free)");
    metrics->capture_default_str();
    cmd->add_option("--memory-budget", a->memory_budget, "Bytes for weights + KV, e.g. 4G");
    cmd->add_option("--threads", a->threads, "Threads (default: all)");
    cmd->add_option("--model-cache", a->model_cache,
                    "Folder for models fetched from the coordinator when its model file cannot "
                    "be read here (default: $FUCINA_CACHE/model-cache)");
    cmd->add_option("--model-fetch-rate", a->model_fetch_rate,
                    "Bytes per second a model fetch may use, e.g. 100M (default: unlimited)");
    AddSecurityFlags(cmd, &a->security, /*cluster=*/true);
    cmd->callback([a, metrics, exit_code] {
      a->metrics_given = metrics->count() > 0;
      *exit_code = RunWorker(*a);
    });
  }
}

}  // namespace fucina::cli
