// `fucina bench grammar MODEL`: constrained decoding against plain decoding in one process,
// measured in the same run.
//
//   compile   the grammar compile time of each test schema, regex and Lark grammar (median);
//   decode    a long JSON reply held to a schema (an array of 40 records), greedy, against plain
//             decoding of the same number of tokens from the same prompt: decode tokens/s of
//             each (median of --repeats, interleaved so drift hits both), their ratio;
//   mask      the reply's tokens replayed through a fresh matcher: the time of each step's mask
//             (mean, p99) and its share of a plain decode step.
//
// The mask is computed on the decode thread between the forward and the sample; the target is
// a constrained rate >= 0.95x the plain one.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_format.h"
#include "models/engine/session.h"
#include "models/grammar/grammar.h"
#include "bench/bench_model.h"
#include "tools/bench_stats.h"
#include "tools/command_status.h"
#include "tools/commands.h"

namespace fucina::cli {
namespace {

struct GrammarBenchArgs {
  std::string model;
  int gen = 400;
  int repeats = 5;
  int threads = 0;
};

using Clock = std::chrono::steady_clock;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Named {
  const char* name;
  GrammarSpec spec;
};

// The grammars of the HTTP tests (tests/http/structured_output_test.mjs), and the long one the
// decode runs use.
constexpr char kRecords[] =
    R"({"type":"array","minItems":40,"maxItems":40,"items":{"type":"object",)"
    R"("properties":{"id":{"type":"integer","minimum":0,"maximum":999},)"
    R"("name":{"type":"string","maxLength":12},"tags":{"type":"array","items":)"
    R"({"enum":["a","b","c"]},"maxItems":3}},"required":["id","name","tags"],)"
    R"("additionalProperties":false}})";

std::vector<Named> Grammars() {
  return {
      {"nested", GrammarSpec::JsonSchema(
                     R"({"type":"object","properties":{"city":{"type":"string","maxLength":24},)"
                     R"("country":{"type":"object","properties":{"name":{"type":"string",)"
                     R"("maxLength":24},"eu":{"type":"boolean"}},"required":["name","eu"],)"
                     R"("additionalProperties":false}},"required":["city","country"],)"
                     R"("additionalProperties":false})")},
      {"enums", GrammarSpec::JsonSchema(
                    R"({"type":"object","properties":{"size":{"enum":["small","medium","large"]},)"
                    R"("rank":{"type":"integer","minimum":1,"maximum":10}},)"
                    R"("required":["size","rank"],"additionalProperties":false})")},
      {"pattern", GrammarSpec::JsonSchema(
                      R"({"type":"object","properties":{"code":{"type":"string",)"
                      R"("pattern":"^[A-Z]{3}-[0-9]{2}$"}},"required":["code"]})")},
      {"records", GrammarSpec::JsonSchema(kRecords)},
      {"object", GrammarSpec::JsonObject()},
      {"regex", GrammarSpec::Regex("20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]")},
      {"lark", GrammarSpec::Lark("start: fruit (\", \" fruit)~2\nfruit: /[a-z]{1,12}/")},
  };
}

int RunGrammarBench(const GrammarBenchArgs& a) {
  auto loaded = LoadBenchModel(a.model, a.threads);
  if (!loaded.ok()) return Fail(loaded.status());
  const BenchModel& b = *loaded;
  std::printf("model: %s  threads: %d  gen: %d  repeats: %d  greedy\n", b.path.c_str(),
              b.pool->num_threads(), a.gen, a.repeats);

  auto t0 = Clock::now();
  auto vocab = GrammarVocab::Create(*b.tokenizer);
  if (!vocab.ok()) return Fail(vocab.status());
  std::printf("token table: %d tokens in %.1f ms\n", (*vocab)->vocab_size(), Ms(Clock::now() - t0));
  std::printf("%-8s %12s\n", "grammar", "compile ms");
  for (const Named& g : Grammars()) {
    std::vector<double> ms;
    for (int r = 0; r < a.repeats; ++r) {
      t0 = Clock::now();
      auto m = (*vocab)->Compile(g.spec);
      if (!m.ok()) return Fail(m.status());
      ms.push_back(Ms(Clock::now() - t0));
    }
    std::printf("%-8s %12.2f\n", g.name, Median(ms));
  }

  auto encoded = b.EncodeUserTurn("A JSON list of 40 users with ids, names and tags:");
  if (!encoded.ok()) return Fail(encoded.status());
  const std::vector<int32_t>& prompt = *encoded;
  auto records = (*vocab)->Compile(GrammarSpec::JsonSchema(kRecords));
  if (!records.ok()) return Fail(records.status());

  std::vector<double> plain_tps, constrained_tps;
  GenerationResult constrained;
  for (int r = 0; r < a.repeats; ++r) {
    for (bool constrain : {true, false}) {
      auto kv = b.model->NewKvCache(prompt.size() + a.gen + 8, GgmlType::kF16);
      if (!kv.ok()) return Fail(kv.status());
      Session session(*b.model, *b.tokenizer, *std::move(kv));
      GenerationOptions o;
      o.sampling.temperature = 0.0f;
      std::unique_ptr<GrammarMatcher> m;
      if (constrain) {
        m = (*records)->Clone();
        o.constraint = m.get();
        o.max_tokens = a.gen;
      } else {
        // As many tokens as the constrained reply took, whatever the model would say.
        o.max_tokens = static_cast<int64_t>(constrained.tokens.size());
        o.ignore_eos = true;
      }
      auto result = session.Generate(prompt, o);
      if (!result.ok()) return Fail(result.status());
      const double tps = static_cast<double>(result->tokens.size() - 1) /
                         std::max(result->decode_seconds, 1e-9);
      (constrain ? constrained_tps : plain_tps).push_back(tps);
      if (constrain) constrained = *std::move(result);
    }
  }
  const double plain = Median(plain_tps), held = Median(constrained_tps);
  std::printf("decode: %zu tokens (%s)  plain %.2f t/s  constrained %.2f t/s  ratio %.3fx "
              "(target >= 0.95x)\n",
              constrained.tokens.size(), constrained.finish_reason.c_str(), plain, held,
              held / plain);

  // The masks alone, replaying the reply.
  auto replay = (*records)->Clone();
  std::vector<double> us;
  std::vector<uint32_t> mask;
  double accept_us = 0;
  for (int32_t id : constrained.tokens) {
    t0 = Clock::now();
    if (absl::Status s = replay->Mask(&mask); !s.ok()) return Fail(s);
    const auto t1 = Clock::now();
    us.push_back(Ms(t1 - t0) * 1000.0);
    if (absl::Status s = replay->Accept(id); !s.ok()) return Fail(s);
    accept_us += Ms(Clock::now() - t1) * 1000.0;
  }
  accept_us /= static_cast<double>(constrained.tokens.size());
  double mean = 0;
  for (double x : us) mean += x;
  mean /= static_cast<double>(us.size());
  std::sort(us.begin(), us.end());
  const double p99 = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  std::printf("mask: mean %.1f us  p99 %.1f us; accept: mean %.1f us; together %.2f%% of a "
              "plain decode step (%.2f ms)\n",
              mean, p99, accept_us, 100.0 * (mean + accept_us) / (1e6 / plain), 1e3 / plain);
  return 0;
}

}  // namespace

void RegisterGrammarBench(CLI::App& bench, int* exit_code) {
  auto a = std::make_shared<GrammarBenchArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "grammar", "Constrained decoding (a JSON schema) vs plain decoding in one process; "
                 "compile and mask times");
  cmd->add_option("MODEL", a->model, "GGUF model")->required();
  cmd->add_option("--gen", a->gen, "Most tokens of the constrained reply")->capture_default_str();
  cmd->add_option("--repeats", a->repeats, "Runs per mode (median)")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Threads (default: all)");
  cmd->callback([a, exit_code] { *exit_code = RunGrammarBench(*a); });
}

}  // namespace fucina::cli
