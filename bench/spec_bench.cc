// `fucina bench spec MODEL`: speculative decoding without a draft model in one process, against
// plain decoding measured in the same run. Three workloads, each a chat turn (the model's
// template) decoded greedily:
//
//   copy   a document given in the prompt, to be repeated (most drafts come from the prompt);
//   code   a short program to continue (repetitive structure);
//   chat   free text (drafts rarely land: the cost of trying).
//
// With --stages N the same runs go through an embedded pipeline (a coordinator and N in-process
// stage workers, the threads split between them, as `serve --workers N`): the coordinator
// drafts, the last stage verifies, and every accepted token also saves a trip through every
// stage. Rates there are decode tokens per second after the first token.
//
// For each: decode tokens/s with and without --spec (median of --repeats runs, each on a cold
// session, plain and speculative interleaved so drift hits both alike), their ratio, the mean
// tokens accepted per draft pass and per decode pass, and whether the tokens are identical
// (they must be: the check is part of the bench).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <prometheus/registry.h>

#include "absl/strings/str_format.h"
#include "coordinator/coordinator.h"
#include "models/engine/session.h"
#include "bench/bench_model.h"
#include "tools/bench_stats.h"
#include "tools/command_status.h"
#include "tools/commands.h"
#include "worker/worker_actor.h"

namespace fucina::cli {
namespace {

struct SpecBenchArgs {
  std::string model;
  int gen = 128;
  int repeats = 5;
  int threads = 0;
  int spec_max = 8;
  int stages = 0;  // 0: one process (Session); N: an embedded pipeline of N stages
};

constexpr char kDocument[] =
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the wick, "
    "polished the great lens until it shone, and wound the clockwork that turned the light. "
    "Ships passing the rocky point at night looked for its slow white flash, three seconds on "
    "and seven seconds dark, and knew where they were. In winter storms he stayed awake until "
    "dawn, listening to the waves break against the cliffs below, writing the weather in a "
    "leather logbook: wind from the north-east, rain, visibility poor, light kept burning.";

struct Workload {
  const char* name;
  std::string prompt;
};

std::vector<Workload> Workloads() {
  return {
      {"copy", std::string("Repeat the following text exactly, word for word:\n\n") + kDocument},
      {"code",
       "Continue this Python code with the same pattern for the numbers six to twelve:\n\n"
       "def one():\n    return 1\n\ndef two():\n    return 2\n\ndef three():\n    return 3\n\n"
       "def four():\n    return 4\n\ndef five():\n    return 5\n"},
      {"chat", "Tell me a short story about a robot who learns to paint."},
  };
}

struct Run {
  double tokens_per_second = 0;
  GenerationResult result;
};

// One greedy request through an embedded pipeline: its tokens and decode rate.
absl::StatusOr<Run> RunPipelined(Coordinator& c, const std::vector<int32_t>& prompt, int gen,
                                 bool speculative) {
  auto request = c.scheduler().Reserve();
  if (!request.ok()) return request.status();
  GenerateJob job;
  job.prompt = prompt;
  job.max_tokens = gen;
  job.sampling.temperature = 0.0f;
  job.speculative = speculative;
  if (absl::Status s = c.scheduler().Submit(*request, std::move(job)); !s.ok()) return s;
  Run run;
  std::chrono::steady_clock::time_point first, last;
  while (!(*request)->done()) {
    std::optional<Delta> d = (*request)->Next(1000);
    if (!d || d->ids.empty()) continue;
    last = std::chrono::steady_clock::now();
    if (run.result.tokens.empty()) first = last;
    run.result.tokens.insert(run.result.tokens.end(), d->ids.begin(), d->ids.end());
  }
  if (!(*request)->outcome().status.ok()) return (*request)->outcome().status;
  run.tokens_per_second = static_cast<double>(run.result.tokens.size() - 1) /
                          std::max(std::chrono::duration<double>(last - first).count(), 1e-9);
  return run;
}

int RunSpecBench(const SpecBenchArgs& a) {
  auto loaded = LoadBenchModel(a.model, a.threads);
  if (!loaded.ok()) return Fail(loaded.status());
  const BenchModel& b = *loaded;
  std::printf("model: %s  threads: %d  gen: %d  repeats: %d  spec-max: %d  greedy  %s\n",
              b.path.c_str(), b.pool->num_threads(), a.gen, a.repeats, a.spec_max,
              a.stages > 0 ? absl::StrFormat("embedded pipeline of %d stages", a.stages).c_str()
                           : "one process");
  std::unique_ptr<Coordinator> coordinator;
  if (a.stages > 0) {
    CoordinatorOptions o;
    o.model_path = b.path;
    o.context = 2048;
    o.scheduler.max_draft = a.spec_max;
    auto c = Coordinator::Create(o, std::make_shared<prometheus::Registry>());
    if (!c.ok()) return Fail(c.status());
    coordinator = *std::move(c);
    Coordinator* self = coordinator.get();
    std::vector<std::pair<WorkerInfo, std::shared_ptr<WorkerClient>>> workers;
    for (int i = 0; i < a.stages; ++i) {
      WorkerOptions wo;
      wo.threads = std::max(1, b.pool->num_threads() / a.stages);
      workers.emplace_back(WorkerInfo{"", wo.threads, 0},
                           std::make_shared<WorkerActor>(wo, [self](const wire::Peer& p) {
                             return self->ClientFor(p.worker_id());
                           }));
    }
    coordinator->AddWorkers(workers);
    if (!coordinator->scheduler().WaitForPlans(1, 120000) || !coordinator->scheduler().ready()) {
      return Fail(absl::UnavailableError("the embedded pipeline did not start: " +
                                         coordinator->scheduler().status()));
    }
  }
  std::printf("%-6s %12s %12s %8s %14s %14s %10s\n", "work", "plain t/s", "spec t/s", "ratio",
              "accepted/draft", "tokens/pass", "identical");
  bool all_identical = true;
  for (const Workload& w : Workloads()) {
    auto encoded = b.EncodeUserTurn(w.prompt);
    if (!encoded.ok()) return Fail(encoded.status());
    const std::vector<int32_t>& prompt = *encoded;
    GenerationOptions o;
    o.max_tokens = a.gen;
    o.sampling.temperature = 0.0f;
    o.drafter.max_draft = a.spec_max;
    std::vector<double> plain_tps, spec_tps;
    GenerationResult plain, spec;
    for (int r = 0; r < a.repeats; ++r) {
      for (bool speculative : {false, true}) {
        if (coordinator != nullptr) {
          auto run = RunPipelined(*coordinator, prompt, a.gen, speculative);
          if (!run.ok()) return Fail(run.status());
          (speculative ? spec_tps : plain_tps).push_back(run->tokens_per_second);
          (speculative ? spec : plain) = std::move(run->result);
          continue;
        }
        auto kv = b.model->NewKvCache(static_cast<int64_t>(prompt.size()) + a.gen + 8,
                                       GgmlType::kF16);
        if (!kv.ok()) return Fail(kv.status());
        Session session(*b.model, *b.tokenizer, *std::move(kv));
        o.speculative = speculative;
        auto result = session.Generate(prompt, o);
        if (!result.ok()) return Fail(result.status());
        const double tps = static_cast<double>(result->tokens.size()) /
                           std::max(result->decode_seconds, 1e-9);
        (speculative ? spec_tps : plain_tps).push_back(tps);
        (speculative ? spec : plain) = *std::move(result);
      }
    }
    const bool identical = plain.tokens == spec.tokens;
    all_identical &= identical;
    const double p = Median(plain_tps), s = Median(spec_tps);
    const bool passes = coordinator == nullptr;  // the pipeline's are in its metrics
    const std::string per_draft =
        passes && spec.draft_passes > 0
            ? absl::StrFormat("%.2f", static_cast<double>(spec.accepted_tokens) /
                                          static_cast<double>(spec.draft_passes))
            : "-";
    const std::string per_pass =
        passes ? absl::StrFormat("%.2f", static_cast<double>(spec.tokens.size()) /
                                             static_cast<double>(spec.forward_passes + 1))
               : "-";
    std::printf("%-6s %12.2f %12.2f %7.2fx %14s %14s %10s\n", w.name, p, s, s / p,
                per_draft.c_str(), per_pass.c_str(), identical ? "yes" : "NO");
    std::fflush(stdout);
  }
  std::printf("targets: copy >= 1.8x (one process), more across stages; chat >= 0.97x\n");
  return all_identical ? 0 : 1;
}

}  // namespace

void RegisterSpecBench(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<SpecBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "spec", "Speculative decoding (--spec) vs plain decoding in one process: copy, code, chat");
  cmd->add_option("MODEL", a->model, "GGUF model")->required();
  cmd->add_option("--gen", a->gen, "Tokens per run")->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Runs per workload and mode (median)")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "Threads (default: all)");
  cmd->add_option("--spec-max", a->spec_max, "Longest draft")->capture_default_str();
  cmd->add_option("--stages", a->stages,
                  "Through an embedded pipeline of this many stages (0: one process)")
      ->check(CLI::Range(0, 16));
  cmd->callback([a, exit_code] { *exit_code = RunSpecBench(*a); });
}

}  // namespace fucina::cli
