// `fucina bench es MODEL`: evolution-strategies training across worker processes. Every process
// is started from this binary on 127.0.0.1 with ephemeral ports (FUCINA_CACHE in a temporary
// folder, so a coordinator and its workers share a fresh join token), as in
// `fucina bench cluster-aggregate`. It measures:
//
//   1. member evaluations per second of one job (LoRA on q,v, nll reward, raw prompts from
//      --data), started and watched through the public API (fucina.v1.Train StartJob and
//      WatchJob) on `fucina coordinator` + 1 and + 2 `fucina worker --threads 1` processes:
//      members_done / evaluate_seconds summed over generations. The ceiling, measured in the
//      same run: two independent `fucina train es --workers 1 --threads 1` processes at once,
//      their rates (population * generations / evaluate seconds, from their generation lines)
//      summed. Generation 1 is left out as warm-up when there are 3 or more.
//   2. the 2-worker run's generation time split into evaluate, update and communicate.
//   3. bytes per generation against the count of trainable values: embedded `fucina train es`
//      runs of 2 generations in full mode on one attn_v tensor, on every attn_q/attn_v/ffn_down,
//      and in LoRA mode. The driver sends seeds' coordinates and fitness scalars only, so the
//      bytes depend on the population, not on the parameters.
//
// Every child is stopped (SIGTERM, then SIGKILL) and reaped on every path out, and dies with the
// bench (PR_SET_PDEATHSIG).
#include <signal.h>
#include <stdlib.h>  // mkdtemp
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/child_process.h"
#include "fucina/v1/generate.grpc.pb.h"
#include "fucina/v1/train.grpc.pb.h"
#include "models/hub/pull.h"
#include "models/train/tasks.h"
#include "tools/command_status.h"
#include "tools/commands.h"
#include "worker/grpc_util.h"

namespace fucina::cli {
namespace {

namespace api = ::fucina::v1;
using Clock = std::chrono::steady_clock;

constexpr char kDefaultData[] = "tests/data/train/digits.jsonl";
// The full-mode tensor sets of the bytes measurement.
constexpr char kOneTensor[] = "blk\\.0\\.attn_v\\.weight";
constexpr char kManyTensors[] = "blk\\.[0-9]+\\.(attn_q|attn_v|ffn_down)\\.weight";

struct EsBenchArgs {
  std::string model, data, json;
  int population = 16;
  int iterations = 3;
  uint64_t seed = 1;
  int timeout_s = 600;  // start-up and each run
};

// One generation as the job reported it (a JobEvent, or a `fucina train es` line).
struct Generation {
  int64_t generation = 0;
  int members = 0;
  int workers = 0;
  double seconds = 0, evaluate = 0, update = 0, communicate = 0;
  int64_t sent = 0, received = 0;
};

// A finished job: its generations, final checksum and (embedded runs) trainable values.
struct JobRun {
  std::vector<Generation> generations;
  uint64_t checksum = 0;
  int64_t values = 0;
};

// The generations a figure is taken over: all, less the first (warm-up) when there are >= 3.
struct Summary {
  int64_t first = 0, last = 0;  // generation numbers, inclusive
  int count = 0;
  double members = 0, evaluate = 0, update = 0, communicate = 0, seconds = 0;
  double sent = 0, received = 0;
  int min_workers = 0;

  double Rate() const { return evaluate > 0 ? members / evaluate : 0; }
  double Mean(double sum) const { return count > 0 ? sum / count : 0; }
};

Summary Summarize(const std::vector<Generation>& gens) {
  Summary s;
  const size_t skip = gens.size() >= 3 ? 1 : 0;
  for (size_t i = skip; i < gens.size(); ++i) {
    const Generation& g = gens[i];
    if (s.count == 0) s.first = g.generation, s.min_workers = g.workers;
    s.last = g.generation;
    ++s.count;
    s.members += g.members;
    s.evaluate += g.evaluate;
    s.update += g.update;
    s.communicate += g.communicate;
    s.seconds += g.seconds;
    s.sent += static_cast<double>(g.sent);
    s.received += static_cast<double>(g.received);
    s.min_workers = std::min(s.min_workers, g.workers);
  }
  return s;
}

// "generation 1" or "generations 2-3".
std::string Range(const Summary& s) {
  return s.first == s.last ? absl::StrCat("generation ", s.first)
                           : absl::StrCat("generations ", s.first, "-", s.last);
}

// `fucina train es` output (tools/train_command.cc): "trainable values: N", one
// "generation g/N: members mean ...; W workers, S s (evaluate E, update U, communicate C);
// X B sent, Y B received" line per generation and "checksum HEX" at the end.
absl::StatusOr<JobRun> ParseTrainOutput(const std::string& out, int population) {
  JobRun run;
  bool finished = false;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    const std::string text(line);
    if (absl::ConsumePrefix(&line, "trainable values: ")) {
      if (!absl::SimpleAtoi(line, &run.values)) {
        return absl::InternalError("cannot parse '" + text + "'");
      }
      continue;
    }
    if (absl::ConsumePrefix(&line, "checksum ")) {
      finished = absl::SimpleHexAtoi(line, &run.checksum);
      continue;
    }
    if (!absl::StartsWith(line, "generation ")) continue;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || line.substr(0, colon).find('/') == line.npos) {
      continue;  // "generation 0: reward ...", the scores of the unperturbed parameters
    }
    Generation g;
    g.members = population;
    long long generation = 0, sent = 0, received = 0;
    const size_t workers = text.find("; ");
    const size_t split = text.find("(evaluate ");
    if (std::sscanf(text.c_str(), "generation %lld/", &generation) != 1 ||
        workers == std::string::npos || split == std::string::npos ||
        std::sscanf(text.c_str() + workers, "; %d workers, %lf s", &g.workers, &g.seconds) != 2 ||
        std::sscanf(text.c_str() + split,
                    "(evaluate %lf, update %lf, communicate %lf); %lld B sent, %lld B received",
                    &g.evaluate, &g.update, &g.communicate, &sent, &received) != 5) {
      return absl::InternalError("cannot parse '" + text + "'");
    }
    g.generation = generation;
    g.sent = sent;
    g.received = received;
    run.generations.push_back(g);
  }
  if (!finished) return absl::InternalError("no final checksum line");
  return run;
}

// The tasks without --data: tests/data/train/digits.jsonl under the current folder or under the
// source tree the binary was built in (SOURCE/build/tools/fucina); "" when neither has it.
std::string FindDefaultData() {
  std::error_code ec;
  if (std::filesystem::is_regular_file(kDefaultData, ec)) return kDefaultData;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::filesystem::path in_tree =
      exe.parent_path().parent_path().parent_path() / kDefaultData;
  return std::filesystem::is_regular_file(in_tree, ec) ? in_tree.string() : "";
}

class Bench {
 public:
  Bench(const EsBenchArgs& a, std::string model, std::string data, std::string dir,
        api::StartJobRequest request)
      : a_(a),
        model_(std::move(model)),
        data_(std::move(data)),
        dir_(std::move(dir)),
        request_(std::move(request)),
        env_(EnvironmentWithCache(dir_ + "/cache")) {}

  // The job's flags for `fucina train es`, as request_ describes it.
  std::vector<std::string> TrainArgs(int iterations) const {
    return {"train", "es", model_, "--data", data_, "--raw", "--reward", "nll",
            "--population", absl::StrCat(a_.population), "--iterations",
            absl::StrCat(iterations), "--seed", absl::StrCat(a_.seed), "--workers", "1",
            "--threads", "1"};
  }

  // Two independent single-thread `fucina train es` processes at once.
  absl::StatusOr<std::vector<JobRun>> Ceiling() {
    std::vector<std::unique_ptr<Child>> runs;
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> args = TrainArgs(a_.iterations);
      args.insert(args.end(), {"--mode", "lora", "--targets", "q,v"});
      auto c = Spawn(absl::StrCat("fucina train es ", i + 1), args);
      if (!c.ok()) return c.status();
      runs.push_back(*std::move(c));
    }
    std::vector<JobRun> out;
    for (auto& c : runs) {
      auto run = Finish(*c);
      if (!run.ok()) return run.status();
      out.push_back(*std::move(run));
    }
    return out;
  }

  // One embedded run of `extra` flags (mode, tensors) over 2 generations.
  absl::StatusOr<JobRun> Embedded(const std::vector<std::string>& extra) {
    std::vector<std::string> args = TrainArgs(2);
    args.insert(args.end(), extra.begin(), extra.end());
    auto c = Spawn("fucina train es", args);
    if (!c.ok()) return c.status();
    return Finish(**c);
  }

  // The job on `fucina coordinator` + `workers` worker processes, through fucina.v1.Train.
  absl::StatusOr<JobRun> OnCluster(int workers) {
    const auto deadline = Clock::now() + std::chrono::seconds(a_.timeout_s);
    Cluster cl;
    auto coordinator = Spawn("fucina coordinator",
                             {"coordinator", model_, "--listen", "127.0.0.1:0", "--metrics",
                              "127.0.0.1:0", "--http", ""});
    if (!coordinator.ok()) return coordinator.status();
    cl.children.push_back(*std::move(coordinator));
    auto ep = WaitListening(*cl.children[0], deadline);
    if (!ep.ok()) return ep.status();
    for (int w = 0; w < workers; ++w) {
      auto worker = Spawn(absl::StrCat("fucina worker ", w + 1),
                          {"worker", "--coordinator", ep->grpc, "--listen", "127.0.0.1:0",
                           "--metrics", "127.0.0.1:0", "--threads", "1"});
      if (!worker.ok()) return worker.status();
      cl.children.push_back(*std::move(worker));
    }
    grpc::ChannelArguments channel_args;
    channel_args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    auto channel =
        grpc::CreateCustomChannel(ep->grpc, grpc::InsecureChannelCredentials(), channel_args);
    auto generation = api::Generation::NewStub(channel);
    auto train = api::Train::NewStub(channel);
    // Every worker registered and serving: the driver gives the job to the workers alive when
    // it starts, and a shard placed later would load during the measurement.
    if (absl::Status s = WaitReady(*generation, workers, cl.children, deadline); !s.ok()) {
      return s;
    }

    grpc::ClientContext start_ctx;
    Prepare(&start_ctx, deadline);
    api::Job job;
    grpc::Status s = train->StartJob(&start_ctx, request_, &job);
    if (!s.ok()) return ToStatus("StartJob", s);
    grpc::ClientContext watch_ctx;
    Prepare(&watch_ctx, Clock::now() + std::chrono::seconds(a_.timeout_s));
    api::WatchJobRequest watch;
    watch.set_job_id(job.job_id());
    auto reader = train->WatchJob(&watch_ctx, watch);
    JobRun run;
    api::JobEvent e, last;
    while (reader->Read(&e)) {
      last = e;
      if (e.state() != api::JOB_STATE_RUNNING || e.has_train_reward()) continue;
      run.generations.push_back({.generation = e.generation(),
                                 .members = e.members_done(),
                                 .workers = e.workers(),
                                 .seconds = e.seconds(),
                                 .evaluate = e.evaluate_seconds(),
                                 .update = e.update_seconds(),
                                 .communicate = e.communicate_seconds(),
                                 .sent = e.bytes_sent(),
                                 .received = e.bytes_received()});
    }
    s = reader->Finish();
    if (!s.ok()) return ToStatus("WatchJob", s);
    if (last.state() != api::JOB_STATE_SUCCEEDED) {
      return absl::InternalError(absl::StrCat("the job ended in state ", last.state(), ": ",
                                              last.error()));
    }
    run.checksum = last.checksum();
    return run;
  }

 private:
  // A coordinator ([0]) and its workers: SIGTERM to all first, so they stop in parallel; the
  // Child destructors reap.
  struct Cluster {
    std::vector<std::unique_ptr<Child>> children;
    ~Cluster() {
      for (auto& c : children) c->Signal(SIGTERM);
    }
  };

  void Prepare(grpc::ClientContext* ctx, Clock::time_point deadline) const {
    ctx->set_deadline(std::chrono::system_clock::now() + (deadline - Clock::now()));
    if (const char* key = std::getenv("FUCINA_API_KEY")) {
      ctx->AddMetadata("authorization", absl::StrCat("Bearer ", key));
    }
  }

  static absl::Status ToStatus(const char* call, const grpc::Status& s) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat(call, ": ", s.error_message()));
  }

  // Polls GetPlacement until the model is ready on `workers` stages and that many workers are
  // alive; fails early when a process exits.
  absl::Status WaitReady(api::Generation::Stub& stub, int workers,
                         const std::vector<std::unique_ptr<Child>>& children,
                         Clock::time_point deadline) const {
    while (true) {
      grpc::ClientContext ctx;
      Prepare(&ctx, std::min(deadline, Clock::now() + std::chrono::seconds(5)));
      api::Placement p;
      grpc::Status s = stub.GetPlacement(&ctx, api::GetPlacementRequest(), &p);
      int alive = 0;
      for (const api::WorkerState& w : p.workers()) alive += w.alive() ? 1 : 0;
      if (s.ok() && p.ready() && p.stages_size() == workers && alive == workers) {
        return absl::OkStatus();
      }
      for (const auto& c : children) {
        if (c->WaitExit(std::chrono::milliseconds(0))) return c->ExitedError();
      }
      if (Clock::now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "not ready with ", workers, " worker(s): ",
            s.ok() ? absl::StrCat(alive, " alive, ", p.stages_size(), " stage(s), ", p.status())
                   : s.error_message()));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Waits for an embedded run to exit and parses its output.
  absl::StatusOr<JobRun> Finish(Child& c) {
    if (!c.WaitExit(std::chrono::seconds(a_.timeout_s))) {
      return absl::DeadlineExceededError(
          absl::StrCat(c.name(), " did not finish within ", a_.timeout_s, " s"));
    }
    if (c.exit_status() != 0) return c.ExitedError();
    auto run = ParseTrainOutput(c.Stdout(), a_.population);
    if (!run.ok()) {
      return absl::InternalError(absl::StrCat(c.name(), ": ", run.status().message()));
    }
    return run;
  }

  absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::string& name,
                                               const std::vector<std::string>& args) {
    return Child::Spawn(name, args, env_, dir_, next_child_++);
  }

  const EsBenchArgs& a_;
  std::string model_, data_, dir_;
  api::StartJobRequest request_;
  std::vector<std::string> env_;
  int next_child_ = 0;
};

nlohmann::json GenerationsJson(const std::vector<Generation>& gens) {
  nlohmann::json out = nlohmann::json::array();
  for (const Generation& g : gens) {
    out.push_back({{"generation", g.generation},
                   {"members", g.members},
                   {"workers", g.workers},
                   {"seconds", g.seconds},
                   {"evaluate_seconds", g.evaluate},
                   {"update_seconds", g.update},
                   {"communicate_seconds", g.communicate},
                   {"bytes_sent", g.sent},
                   {"bytes_received", g.received}});
  }
  return out;
}

// "93.2%", or "n/a" without a reference (a ceiling too fast for its lines' 10 ms resolution).
std::string Percent(double value, double reference) {
  return reference > 0 ? absl::StrFormat("%.1f%%", 100 * value / reference) : "n/a";
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

nlohmann::json RunJson(const JobRun& run, double rate) {
  return {{"members_per_second", rate},
          {"checksum", absl::StrFormat("%016x", run.checksum)},
          {"generations", GenerationsJson(run.generations)}};
}

// Sections 1 and 2: members/s of the ceiling and of coordinator + 1 and + 2 workers, then the
// 2-worker run's time split. Returns the exit code (1 when a measurement failed).
int ReportThroughput(Bench& bench, nlohmann::json& json) {
  std::fprintf(stderr, "measuring the ceiling: 2 x fucina train es --threads 1 at once\n");
  auto ceiling = bench.Ceiling();
  std::fprintf(stderr, "measuring coordinator + 1 worker\n");
  auto one = bench.OnCluster(1);
  std::fprintf(stderr, "measuring coordinator + 2 workers\n");
  auto two = bench.OnCluster(2);

  int rc = 0;
  double ceiling_rate = 0;
  std::vector<uint64_t> checksums;
  std::printf("member evaluations per second (LoRA q,v rank 8, nll reward):\n");
  std::printf("  %-46s %9s %9s %7s  %s\n", "configuration", "members/s", "/ceiling", "workers",
              "measured over");
  if (ceiling.ok()) {
    const Summary s0 = Summarize((*ceiling)[0].generations);
    const Summary s1 = Summarize((*ceiling)[1].generations);
    ceiling_rate = s0.Rate() + s1.Rate();
    std::printf("  %-46s %9.3f %9s %7d  %s (%.3f + %.3f)\n",
                "ceiling: 2 x train es --workers 1 --threads 1", ceiling_rate,
                Percent(ceiling_rate, ceiling_rate).c_str(), 2, Range(s0).c_str(), s0.Rate(),
                s1.Rate());
    json["ceiling"] = {{"members_per_second", ceiling_rate},
                       {"processes", {RunJson((*ceiling)[0], s0.Rate()),
                                      RunJson((*ceiling)[1], s1.Rate())}}};
    checksums = {(*ceiling)[0].checksum, (*ceiling)[1].checksum};
  } else {
    std::printf("  %-46s failed: %s\n", "ceiling", Message(ceiling.status()).c_str());
    json["ceiling"] = {{"error", Message(ceiling.status())}};
    rc = 1;
  }
  struct Config {
    const char* name;
    const char* key;
    const absl::StatusOr<JobRun>* run;
  };
  const Config configs[] = {{"coordinator + 1 worker x 1 thread", "coordinator_1_worker", &one},
                            {"coordinator + 2 workers x 1 thread", "coordinator_2_workers", &two}};
  for (const Config& c : configs) {
    if (!c.run->ok()) {
      std::printf("  %-46s failed: %s\n", c.name, Message(c.run->status()).c_str());
      json[c.key] = {{"error", Message(c.run->status())}};
      rc = 1;
      continue;
    }
    const Summary s = Summarize((*c.run)->generations);
    std::printf("  %-46s %9.3f %9s %7d  %s\n", c.name, s.Rate(),
                Percent(s.Rate(), ceiling_rate).c_str(), s.min_workers, Range(s).c_str());
    json[c.key] = RunJson(**c.run, s.Rate());
    if (ceiling_rate > 0) json[c.key]["ratio_to_ceiling"] = s.Rate() / ceiling_rate;
    checksums.push_back((*c.run)->checksum);
  }
  if (two.ok() && ceiling_rate > 0) {
    const double ratio = Summarize(two->generations).Rate() / ceiling_rate;
    std::printf("  target, 2 workers x 1 thread: >= 90%% of the ceiling: %.1f%% %s\n",
                ratio * 100, ratio >= 0.9 ? "met" : "NOT met");
    json["target_met"] = ratio >= 0.9;
  }
  // The same job from the same seed: every run ends with the same values.
  if (checksums.size() > 1) {
    bool agree = true;
    for (uint64_t c : checksums) agree = agree && c == checksums.front();
    std::printf("  final checksums %s (%016llx)\n", agree ? "agree" : "DIFFER",
                static_cast<unsigned long long>(checksums.front()));
    json["checksums_agree"] = agree;
  }

  if (two.ok()) {
    const Summary s = Summarize(two->generations);
    std::printf("\ntime per generation, coordinator + 2 workers (mean over %s):\n",
                Range(s).c_str());
    std::printf("  evaluate %.3f s, update %.3f s, communicate %.3f s (part of both); total "
                "%.3f s; %.0f B sent, %.0f B received\n",
                s.Mean(s.evaluate), s.Mean(s.update), s.Mean(s.communicate), s.Mean(s.seconds),
                s.Mean(s.sent), s.Mean(s.received));
    json["time_split_2_workers"] = {{"first_generation", s.first},
                                    {"last_generation", s.last},
                                    {"evaluate_seconds", s.Mean(s.evaluate)},
                                    {"update_seconds", s.Mean(s.update)},
                                    {"communicate_seconds", s.Mean(s.communicate)},
                                    {"seconds", s.Mean(s.seconds)}};
  }
  std::printf("\n");
  std::fflush(stdout);
  return rc;
}

// Section 3: bytes per generation of embedded runs over small and large full-mode tensor sets
// and LoRA. Returns the exit code.
int ReportBytes(Bench& bench, nlohmann::json& json) {
  struct Params {
    const char* name;
    std::vector<std::string> flags;
  };
  const Params params[] = {
      {"full: one attn_v tensor", {"--mode", "full", "--tensors", kOneTensor}},
      {"full: every attn_q, attn_v, ffn_down", {"--mode", "full", "--tensors", kManyTensors}},
      {"lora: q,v rank 8", {"--mode", "lora", "--targets", "q,v"}}};
  std::printf("bytes per generation vs trainable values (embedded train es, 1 worker, "
              "2 generations, means):\n");
  std::printf("  %-38s %12s %10s %10s %10s\n", "parameters", "values", "sent", "received",
              "total");
  std::fflush(stdout);
  int rc = 0;
  json["bytes_per_generation"] = nlohmann::json::array();
  for (const Params& p : params) {
    std::fprintf(stderr, "measuring bytes, %s\n", p.name);
    auto run = bench.Embedded(p.flags);
    if (!run.ok()) {
      std::printf("  %-38s failed: %s\n", p.name, Message(run.status()).c_str());
      json["bytes_per_generation"].push_back(
          {{"parameters", p.name}, {"error", Message(run.status())}});
      rc = 1;
      continue;
    }
    const Summary s = Summarize(run->generations);
    const double sent = s.Mean(s.sent), received = s.Mean(s.received);
    std::printf("  %-38s %12lld %10.0f %10.0f %10.0f\n", p.name,
                static_cast<long long>(run->values), sent, received, sent + received);
    json["bytes_per_generation"].push_back({{"parameters", p.name},
                                            {"flags", p.flags},
                                            {"values", run->values},
                                            {"bytes_sent", sent},
                                            {"bytes_received", received},
                                            {"bytes", sent + received},
                                            {"generations", GenerationsJson(run->generations)}});
    std::fflush(stdout);
  }
  return rc;
}

int RunEsBench(const EsBenchArgs& a) {
  for (absl::Status s : {CheckFlagRange("--population", a.population, 2, 4096),
                         CheckFlagRange("--iterations", a.iterations, 1, 1000),
                         CheckFlagRange("--timeout", a.timeout_s, 1, 86400)}) {
    if (!s.ok()) return Fail(s);
  }
  if (a.population % 2 != 0) {
    return Fail(absl::InvalidArgumentError("--population must be even (antithetic pairs)"));
  }
  auto model = ResolveModel(a.model, isatty(STDERR_FILENO));
  if (!model.ok()) return Fail(model.status());
  const std::string data = a.data.empty() ? FindDefaultData() : a.data;
  if (data.empty()) {
    return FailUsage(absl::InvalidArgumentError(absl::StrCat(
        "--data is required: ", kDefaultData, " is neither here nor in the source tree")));
  }
  auto tasks = train::ReadTaskTexts(data);
  if (!tasks.ok()) return Fail(tasks.status());
  // The throughput job, as `fucina train es --raw` builds it from the same flags.
  api::StartJobRequest request;
  for (const train::TaskText& t : *tasks) {
    api::TrainTask* task = request.add_tasks();
    task->set_prompt(t.prompt);
    task->set_answer(t.answer);
  }
  request.set_reward("nll");
  request.set_mode("lora");
  request.add_lora_targets("q");
  request.add_lora_targets("v");
  request.set_population(a.population);
  request.set_iterations(a.iterations);
  request.set_seed(a.seed);
  request.set_raw(true);
  request.set_threads(1);

  char dir_template[] = "/tmp/fucina-bench-es-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) return Fail(absl::InternalError("mkdtemp failed"));
  const std::string dir = dir_template;
  std::filesystem::create_directory(dir + "/cache");
  nlohmann::json json = {{"model", *model},
                         {"data", data},
                         {"tasks", tasks->size()},
                         {"population", a.population},
                         {"iterations", a.iterations},
                         {"seed", a.seed},
                         // Rates and means are over generations from this one on (warm-up).
                         {"measured_from_generation", a.iterations >= 3 ? 2 : 1}};
  std::printf("model: %s\ndata: %s (%zu tasks, raw prompts)  population: %d  generations: %d  "
              "seed: %llu\n",
              model->c_str(), data.c_str(), tasks->size(), a.population, a.iterations,
              static_cast<unsigned long long>(a.seed));
  std::printf("members/s = members evaluated / evaluate seconds, summed over generations%s\n\n",
              a.iterations >= 3 ? " 2 and up (generation 1 is warm-up)" : "");
  std::fflush(stdout);
  int rc = 0;
  {
    Bench bench(a, *model, data, dir, request);
    rc = ReportThroughput(bench, json);
    rc = std::max(rc, ReportBytes(bench, json));
  }
  std::filesystem::remove_all(dir);
  if (!a.json.empty()) {
    std::ofstream out(a.json);
    out << json.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "error: cannot write %s\n", a.json.c_str());
      return 1;
    }
  }
  return rc;
}

}  // namespace

void RegisterEsBench(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<EsBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "es",
      "Evolution-strategies member evaluations/s on coordinator + 1 and 2 worker processes "
      "against two single-thread `train es` at once; bytes per generation vs trainable values; "
      "the generation time split");
  cmd->add_option("MODEL", a->model, "GGUF model")->required();
  cmd->add_option("--data", a->data,
                  absl::StrCat("JSONL tasks, used as raw prompts (default: ", kDefaultData,
                               " here or in the source tree)"));
  cmd->add_option("--population", a->population, "Members per generation (even)")
      ->capture_default_str();
  cmd->add_option("--iterations", a->iterations,
                  "Generations of the throughput runs (generation 1 is left out from 3 on)")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Noise seed")->capture_default_str();
  cmd->add_option("--json", a->json, "Also write every figure to this file");
  cmd->add_option("--timeout", a->timeout_s, "Seconds for start-up and for each run")
      ->capture_default_str();
  cmd->callback([a, exit_code] { *exit_code = RunEsBench(*a); });
}

}  // namespace fucina::cli
