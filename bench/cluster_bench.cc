// `fucina bench cluster MODEL`: what the pipeline costs. Workers run in this process, reached
// either directly (the embedded mode) or through real gRPC servers on 127.0.0.1 (each stage one
// loopback round trip per step), so the difference is the transport; the single-process engine
// in the same run is the reference for the ratios.
//
// Reports decode t/s for 1..3 stages (in process and over loopback), the per-hop overhead
// (ms per token per stage call), lockstep batch 1 vs N, activation bytes per token per hop and
// the time to first token of a follow-up turn with and without KV reuse.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "models/engine/model.h"
#include "tools/bench_stats.h"
#include "tools/commands.h"
#include "worker/grpc_util.h"
#include "worker/worker_actor.h"
#include "worker/worker_service.h"

namespace fucina::cli {
namespace {

struct ClusterBenchArgs {
  std::string model;
  int threads = 0;
  int64_t gen = 64;
  int64_t prompt_tokens = 256;
  int batch = 8;
  int repeats = 3;
  int max_stages = 3;
  std::string cache_type = "f16";
  std::string activations = "f32";
};

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Workers in this process; with `grpc`, each behind its own loopback gRPC server.
struct BenchCluster {
  // The loopback servers take cluster calls with this token, as a worker process does.
  std::unique_ptr<CallGate> gate;
  ClusterCredentials credentials;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<Coordinator> coordinator;
  std::vector<std::shared_ptr<WorkerActor>> actors;
  std::vector<std::unique_ptr<WorkerService>> services;
  std::vector<std::unique_ptr<grpc::Server>> servers;

  ~BenchCluster() {
    coordinator.reset();
    for (auto& s : servers) s->Shutdown();
  }
};

absl::StatusOr<std::unique_ptr<BenchCluster>> Start(const ClusterBenchArgs& a, int stages,
                                                    bool grpc, int batch) {
  auto b = std::make_unique<BenchCluster>();
  CoordinatorOptions o;
  o.model_path = a.model;
  o.context = a.prompt_tokens + a.gen + 64;
  o.cache_type = a.cache_type;
  o.activation_type = a.activations;
  o.scheduler.batch = batch;
  o.scheduler.max_queue = 64;
  o.kv_slots = std::max(batch, 2);
  auto c = Coordinator::Create(o, b->registry);
  if (!c.ok()) return c.status();
  b->coordinator = *std::move(c);
  const int threads = a.threads > 0 ? a.threads : ThreadPool::Default().num_threads();
  std::vector<std::pair<WorkerInfo, std::shared_ptr<WorkerClient>>> workers;
  for (int i = 0; i < stages; ++i) {
    // One stream at a time: stages run one after another, so each may use every thread. A
    // stage reaches the next through the coordinator's client for it: in process, or the
    // loopback server.
    Coordinator* coordinator = b->coordinator.get();
    WorkerOptions options;
    options.threads = threads;
    auto actor = std::make_shared<WorkerActor>(options, [coordinator](const wire::Peer& peer) {
      return coordinator->ClientFor(peer.worker_id());
    });
    std::shared_ptr<WorkerClient> client = actor;
    if (grpc) {
      if (b->gate == nullptr) {
        auto token = NewRandomToken();
        if (!token.ok()) return token.status();
        b->gate = std::make_unique<CallGate>(CallGateOptions{
            .cluster_token = *token, .require_peer_certificate = false, .api_key = ""});
        b->credentials = MakeClusterCredentials(std::nullopt, *token);
      }
      auto service = std::make_unique<WorkerService>(*actor, *b->gate);
      grpc::ServerBuilder builder;
      int port = 0;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
      builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
      builder.SetMaxSendMessageSize(kMaxMessageBytes);
      builder.RegisterService(service.get());
      auto server = builder.BuildAndStart();
      if (server == nullptr) return absl::UnavailableError("cannot start a loopback server");
      client = MakeGrpcWorkerClient(absl::StrCat("127.0.0.1:", port), b->credentials);
      b->services.push_back(std::move(service));
      b->servers.push_back(std::move(server));
    }
    workers.emplace_back(WorkerInfo{"", 1, 0}, client);
    b->actors.push_back(std::move(actor));
  }
  b->coordinator->AddWorkers(workers);
  if (!b->coordinator->scheduler().WaitForPlans(1, 600000)) {
    return absl::UnavailableError(b->coordinator->scheduler().status());
  }
  return b;
}

std::vector<int32_t> Prompt(int64_t n, int salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(100 + (i * 37 + salt) % 900));
  return p;
}

// Runs `streams` greedy requests together; returns decode tokens/s (first token excluded) and
// the time to the first token of stream 0.
struct RunResult {
  double decode_tps = 0;
  double ttft = 0;
  int64_t cached = 0;
};

absl::StatusOr<RunResult> RunOnce(Coordinator& c, const std::vector<std::vector<int32_t>>& prompts,
                                  int64_t gen) {
  std::vector<std::shared_ptr<Request>> requests;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& p : prompts) {
    auto r = c.scheduler().Reserve();
    if (!r.ok()) return r.status();
    GenerateJob job;
    job.prompt = p;
    job.max_tokens = gen;
    job.sampling.temperature = 0;
    job.ignore_eos = true;
    if (absl::Status s = c.scheduler().Submit(*r, job); !s.ok()) return s;
    requests.push_back(*r);
  }
  // Read every stream as its tokens arrive. Decode throughput counts the tokens produced after
  // the last stream's first token (prefill done everywhere) until the last token.
  RunResult out;
  const size_t n = requests.size();
  std::vector<bool> started(n, false);
  size_t num_started = 0;
  std::chrono::steady_clock::time_point decode_start, last_token;
  int64_t decode_tokens = 0;
  bool all_done = false;
  while (!all_done) {
    all_done = true;
    for (size_t i = 0; i < n; ++i) {
      Request& r = *requests[i];
      if (r.done()) continue;
      all_done = false;
      auto d = r.Next(n == 1 ? 100 : 0);
      if (!d || d->ids.empty()) continue;
      const auto now = std::chrono::steady_clock::now();
      last_token = now;
      if (!started[i]) {
        started[i] = true;
        if (i == 0) out.ttft = Seconds(t0);
        if (++num_started == n) decode_start = now;
        continue;  // the first token closes the prefill
      }
      if (num_started == n) decode_tokens += static_cast<int64_t>(d->ids.size());
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Outcome o = requests[i]->outcome();
    if (!o.status.ok()) return o.status;
    if (i == 0) out.cached = o.cached_tokens;
  }
  out.decode_tps = decode_tokens /
                   std::max(std::chrono::duration<double>(last_token - decode_start).count(), 1e-9);
  return out;
}

// Decode t/s of `batch` streams, median over repeats (fresh prompts each time: no reuse).
absl::StatusOr<double> DecodeTps(Coordinator& c, const ClusterBenchArgs& a, int batch) {
  std::vector<double> tps;
  for (int rep = 0; rep < a.repeats; ++rep) {
    std::vector<std::vector<int32_t>> prompts;
    for (int s = 0; s < batch; ++s) prompts.push_back(Prompt(32, 1000 * rep + s + 1));
    auto r = RunOnce(c, prompts, a.gen);
    if (!r.ok()) return r.status();
    tps.push_back(r->decode_tps);
  }
  return Median(tps);
}

// The single-process engine's greedy decode t/s (ForwardStep loop), the reference.
absl::StatusOr<double> EngineTps(const ClusterBenchArgs& a) {
  ThreadPool pool(a.threads > 0 ? a.threads : ThreadPool::Default().num_threads());
  auto model = Model::Load(a.model, {}, pool);
  if (!model.ok()) return model.status();
  auto type = ParseKvCacheType(a.cache_type);
  if (!type.ok()) return type.status();
  std::vector<double> tps;
  for (int rep = 0; rep < a.repeats; ++rep) {
    auto kv = (*model)->NewKvCache(32 + a.gen + 8, *type);
    if (!kv.ok()) return kv.status();
    auto logits = (*model)->ForwardStep(**kv, Prompt(32, 1000 * rep + 1), 0);
    if (!logits.ok()) return logits.status();
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 1; i < a.gen; ++i) {
      const int32_t next[] = {static_cast<int32_t>(
          std::max_element(logits->begin(), logits->end()) - logits->begin())};
      logits = (*model)->ForwardStep(**kv, next, (*kv)->len());
      if (!logits.ok()) return logits.status();
    }
    tps.push_back((a.gen - 1) / Seconds(t0));
  }
  return Median(tps);
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
  return 1;
}

int RunClusterBench(const ClusterBenchArgs& a) {
  std::printf("model: %s  gen: %lld  threads: %d  activations: %s\n", a.model.c_str(),
              (long long)a.gen, a.threads > 0 ? a.threads : ThreadPool::Default().num_threads(),
              a.activations.c_str());
  auto engine = EngineTps(a);
  if (!engine.ok()) return Fail(engine.status());
  std::printf("engine (single process, reference): %.2f t/s\n\n", *engine);
  std::printf("%-8s %14s %14s %12s %18s\n", "stages", "in-process t/s", "loopback t/s",
              "vs engine", "per-hop ms/token");
  // In-process and loopback runs alternate on two live clusters, so drifts of the machine's
  // speed hit both alike; the per-hop cost is the median of the paired differences.
  ClusterBenchArgs one = a;
  one.repeats = 1;
  for (int stages = 1; stages <= a.max_stages; ++stages) {
    auto local = Start(a, stages, false, 1);
    if (!local.ok()) return Fail(local.status());
    auto remote = Start(a, stages, true, 1);
    if (!remote.ok()) return Fail(remote.status());
    std::vector<double> tl, tr, hop;
    for (int rep = 0; rep < a.repeats; ++rep) {
      auto x = DecodeTps(*(*local)->coordinator, one, 1);
      if (!x.ok()) return Fail(x.status());
      auto y = DecodeTps(*(*remote)->coordinator, one, 1);
      if (!y.ok()) return Fail(y.status());
      tl.push_back(*x);
      tr.push_back(*y);
      hop.push_back((1000.0 / *y - 1000.0 / *x) / stages);
    }
    if (stages == 2) {
      // Activation bytes per token per hop: what stage 0 sent per forwarded row.
      auto stats = (*remote)->actors[0]->GetStats();
      if (stats.ok() && stats->forwarded_positions() > 0) {
        std::printf("(2 stages: %.0f activation bytes per token per hop)\n",
                    static_cast<double>(stats->activation_bytes_out()) /
                        stats->forwarded_positions());
      }
    }
    std::printf("%-8d %14.2f %14.2f %11.2fx %18.3f\n", stages, Median(tl), Median(tr),
                Median(tr) / *engine, Median(hop));
  }

  std::printf("\nlockstep batch (2 stages, loopback):\n");
  for (int batch : {1, a.batch}) {
    auto cluster = Start(a, 2, true, batch);
    if (!cluster.ok()) return Fail(cluster.status());
    auto t = DecodeTps(*(*cluster)->coordinator, a, batch);
    if (!t.ok()) return Fail(t.status());
    std::printf("  batch %-3d %10.2f t/s total\n", batch, *t);
  }

  std::printf("\nfollow-up turn, %lld-token conversation + 16 new tokens (2 stages, loopback):\n",
              (long long)a.prompt_tokens);
  for (bool reuse : {false, true}) {
    std::vector<double> ttft;
    int64_t cached = 0;
    for (int rep = 0; rep < a.repeats; ++rep) {
      auto cluster = Start(a, 2, true, 1);
      if (!cluster.ok()) return Fail(cluster.status());
      Coordinator& c = *(*cluster)->coordinator;
      std::vector<int32_t> turn1 = Prompt(a.prompt_tokens, rep);
      if (reuse) {
        auto r = RunOnce(c, {turn1}, 8);
        if (!r.ok()) return Fail(r.status());
      }
      std::vector<int32_t> turn2 = turn1;
      const std::vector<int32_t> more = Prompt(16, 77 + rep);
      turn2.insert(turn2.end(), more.begin(), more.end());
      auto r = RunOnce(c, {turn2}, 4);
      if (!r.ok()) return Fail(r.status());
      ttft.push_back(r->ttft);
      cached = r->cached;
    }
    std::printf("  %-16s TTFT %8.1f ms (%lld cached tokens)\n",
                reuse ? "with KV reuse" : "without reuse", Median(ttft) * 1000, (long long)cached);
  }
  return 0;
}

}  // namespace

void RegisterClusterBench(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<ClusterBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "cluster", "Pipeline decode t/s (in process vs loopback gRPC), per-hop cost, batching, "
                 "KV reuse");
  cmd->add_option("MODEL", a->model, "GGUF model")->required();
  cmd->add_option("--threads", a->threads, "Threads per worker (default: all)");
  cmd->add_option("--gen", a->gen, "Tokens generated per measurement")->capture_default_str();
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "Conversation length for the TTFT test")
      ->capture_default_str();
  cmd->add_option("--batch", a->batch, "Streams of the batched measurement")
      ->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Median over this many runs")->capture_default_str();
  cmd->add_option("--max-stages", a->max_stages)->capture_default_str();
  cmd->add_option("--cache-type", a->cache_type)->capture_default_str();
  cmd->add_option("--activations", a->activations, "f32 | f16 | bf16")->capture_default_str();
  cmd->callback([a, exit_code] { *exit_code = RunClusterBench(*a); });
}

}  // namespace fucina::cli
