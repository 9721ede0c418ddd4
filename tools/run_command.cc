// `fucina run MODEL`: one process, one model: completion, chat, REPL, tokenization, benchmark.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "models/chat/chat_template.h"
#include "models/engine/merge.h"
#include "models/engine/model.h"
#include "models/engine/session.h"
#include "models/grammar/grammar.h"
#include "models/hub/pull.h"
#include "models/sampler/sampler.h"
#include "models/tokenizer/tokenizer.h"
#include "tools/bench_stats.h"
#include "tools/command_status.h"
#include "tools/commands.h"

namespace fucina::cli {
namespace {

struct RunArgs {
  std::string model;
  std::string ids;  // positional comma-separated token ids
  std::string prompt;
  std::string chat;
  // Small chat models answer far better with a plain system prompt than with the long default
  // some templates insert (SmolLM2-135M's makes it miss "capital of France"); --system ""
  // restores the template's own default.
  std::string system = "You are a helpful assistant.";
  bool no_think = false;
  bool repl = false;
  int64_t gen = 128;
  int64_t ctx = 4096;
  std::string cache_type = "f16";
  std::string adapter;
  int threads = 0;
  std::string tokenize_file;
  bool print_ids = false;
  bool info = false;
  int bench = 0;
  int streams = 1;
  std::string bench_prompts;
  SamplingParams sampling;
  bool spec = false;
  std::string spec_ref;
  int spec_max = 8;
  // Constrained decoding: at most one of these (TEXT, or @FILE for a file's content).
  std::string json_schema, regex, lark;
  int grammar_timeout_ms = static_cast<int>(kDefaultGrammarCompileLimit.count());
};

// The grammar the flags ask for (none when no flag is given); "@FILE" reads FILE.
absl::StatusOr<GrammarSpec> GrammarFromFlags(const RunArgs& a) {
  GrammarSpec spec;
  int given = 0;
  for (const auto& [flag, value, kind] :
       {std::tuple{"--json-schema", &a.json_schema, GrammarSpec::Kind::kJsonSchema},
        std::tuple{"--regex", &a.regex, GrammarSpec::Kind::kRegex},
        std::tuple{"--lark", &a.lark, GrammarSpec::Kind::kLark}}) {
    if (value->empty()) continue;
    if (++given > 1) {
      return absl::InvalidArgumentError("give at most one of --json-schema, --regex, --lark");
    }
    spec.kind = kind;
    spec.text = *value;
    if (kind != GrammarSpec::Kind::kRegex && value->front() == '@') {
      std::ifstream in(value->substr(1), std::ios::binary);
      if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot open ", value->substr(1)));
      std::stringstream text;
      text << in.rdbuf();
      spec.text = text.str();
    }
  }
  return spec;
}

absl::Status ValidateRunArgs(const RunArgs& a) {
  const auto& range = CheckFlagRange;
  for (absl::Status s : {range("--threads", a.threads, 0, kMaxThreads),
                         range("--ctx", a.ctx, 2, kMaxContext),
                         range("--gen", a.gen, 1, kMaxContext),
                         range("--streams", a.streams, 1, 1024),
                         range("--bench", a.bench, 0, 1000),
                         range("--spec-max", a.spec_max, 1, 64),
                         range("--grammar-timeout", a.grammar_timeout_ms, 1, 600'000)}) {
    if (!s.ok()) return s;
  }
  return ValidateSamplingParams(a.sampling, 0, SamplingFieldNames::kFlags);
}

absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  for (const std::string& part : std::vector<std::string>(absl::StrSplit(text, ','))) {
    int32_t id;
    if (!absl::SimpleAtoi(std::string(absl::StripAsciiWhitespace(part)), &id)) {
      return absl::InvalidArgumentError("token ids must be comma-separated integers, got '" +
                                        part + "'");
    }
    ids.push_back(id);
  }
  return ids;
}

ChatMessage Message(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

// Prefill, then `gen` greedy decode steps on `streams` lockstep streams, repeated
// `repeats` times; prints the median throughputs. Stream s prefills prompts[s % size]. With
// `served_sampler`, each row is sampled as a server samples it (the Sampler's greedy path, its
// logprob included) rather than by a bare argmax.
int RunBench(Model& model, const std::vector<std::vector<int32_t>>& prompts, const RunArgs& args,
             GgmlType cache_type, bool served_sampler) {
  std::vector<double> prefill, decode;
  std::string breakdown;
  SamplingParams greedy;
  greedy.temperature = 0;
  Sampler sampler(greedy);
  const int64_t vocab = model.config().vocab_size;
  for (int rep = 0; rep < args.bench; ++rep) {
    std::vector<std::unique_ptr<KvCache>> caches;
    std::vector<KvCache*> ptrs;
    std::vector<std::vector<int32_t>> history(args.streams);
    std::vector<int32_t> next;
    int64_t prompt_tokens = 0;
    auto pick = [&](int s, const float* row) {
      if (served_sampler) {
        next[s] = sampler.Sample({row, static_cast<size_t>(vocab)}, history[s]).id;
      } else {
        next[s] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      }
      history[s].push_back(next[s]);
    };
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < args.streams; ++s) {
      const std::vector<int32_t>& prompt = prompts[s % prompts.size()];
      auto kv = model.NewKvCache(static_cast<int64_t>(prompt.size()) + args.gen, cache_type);
      if (!kv.ok()) return Fail(kv.status());
      auto logits = model.ForwardStep(**kv, prompt, 0);
      if (!logits.ok()) return Fail(logits.status());
      history[s] = prompt;
      next.push_back(0);
      pick(s, logits->data());
      prompt_tokens += static_cast<int64_t>(prompt.size());
      ptrs.push_back(kv->get());
      caches.push_back(*std::move(kv));
    }
    const auto t1 = std::chrono::steady_clock::now();
    const double attention0 = model.attention_seconds();
    double sampling = 0;
    std::vector<float> logits;  // [streams, vocab], reused every step
    for (int64_t i = 0; i < args.gen; ++i) {
      if (absl::Status st = model.ForwardStepBatch(ptrs, next, logits); !st.ok()) return Fail(st);
      const auto s0 = std::chrono::steady_clock::now();
      for (int s = 0; s < args.streams; ++s) pick(s, logits.data() + s * vocab);
      sampling += std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
    }
    const auto t2 = std::chrono::steady_clock::now();
    // Where a decode step's time went, as a server's step breakdown reports it (the last
    // repeat's): attention over the caches, sampling, and the rest (the layers' other kernels,
    // the head, the pass's own work).
    const double steps = static_cast<double>(args.gen);
    const double step_ms = 1000 * std::chrono::duration<double>(t2 - t1).count() / steps;
    const double attention_ms = 1000 * (model.attention_seconds() - attention0) / steps;
    const double sampling_ms = 1000 * sampling / steps;
    breakdown = absl::StrFormat(
        "decode step: %.3f ms (attention %.3f, sampling %.3f, kernels and head %.3f)", step_ms,
        attention_ms, sampling_ms, step_ms - attention_ms - sampling_ms);
    prefill.push_back(prompt_tokens / std::chrono::duration<double>(t1 - t0).count());
    decode.push_back(args.streams * args.gen / std::chrono::duration<double>(t2 - t1).count());
  }
  std::printf("prefill: %.2f t/s\n", Median(prefill));
  std::printf("decode: %.2f t/s\n", Median(decode));
  std::printf("%s\n", breakdown.c_str());
  return 0;
}

// --bench-prompts FILE: one prompt of comma-separated token ids per line (blank lines skipped).
absl::StatusOr<std::vector<std::vector<int32_t>>> ReadBenchPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("--bench-prompts: cannot open " + path);
  std::vector<std::vector<int32_t>> prompts;
  for (std::string line; std::getline(in, line);) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    auto ids = ParseIds(line);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--bench-prompts: line ", prompts.size() + 1,
                                                     ": ", ids.status().message()));
    }
    prompts.push_back(*std::move(ids));
  }
  if (prompts.empty()) return absl::InvalidArgumentError("--bench-prompts: no prompt in " + path);
  return prompts;
}

// --bench with --spec: prefill + `gen` greedy tokens through Session with speculation (the
// path `--spec` decodes with), repeated; prints median rates and the last repeat's passes. The
// decode rate counts the tokens the decode passes produce (all but the first, which the
// prefill's logits give), as the plain bench does. `fucina bench spec` compares it with plain
// decoding on fixed prompts.
int RunSpecBench(Model& model, const Tokenizer& tokenizer, const std::vector<int32_t>& prompt,
                 const RunArgs& args, GgmlType cache_type,
                 const std::vector<int32_t>& spec_reference) {
  if (args.streams != 1) {
    return Fail(absl::InvalidArgumentError(
        "--bench --spec measures one stream: --streams runs lockstep plain decoding"));
  }
  GenerationOptions options;
  options.max_tokens = args.gen;
  options.sampling.temperature = 0;  // greedy, as the plain bench
  options.ignore_eos = true;         // exactly `gen` tokens
  options.speculative = true;
  options.drafter.max_draft = args.spec_max;
  options.spec_reference = spec_reference;
  std::vector<double> prefill, decode;
  GenerationResult last;
  for (int rep = 0; rep < args.bench; ++rep) {
    auto kv = model.NewKvCache(static_cast<int64_t>(prompt.size()) + args.gen, cache_type);
    if (!kv.ok()) return Fail(kv.status());
    Session session(model, tokenizer, *std::move(kv));
    auto r = session.Generate(prompt, options, nullptr);
    if (!r.ok()) return Fail(r.status());
    prefill.push_back(prompt.size() / std::max(r->prefill_seconds, 1e-9));
    decode.push_back((r->tokens.size() - 1) / std::max(r->decode_seconds, 1e-9));
    last = *std::move(r);
  }
  std::printf("prefill: %.2f t/s\n", Median(prefill));
  std::printf("decode: %.2f t/s\n", Median(decode));
  std::printf("spec: %lld decode passes for %zu tokens; %lld drafts of %lld tokens, %lld "
              "accepted\n",
              (long long)last.forward_passes, last.tokens.size(), (long long)last.draft_passes,
              (long long)last.draft_tokens, (long long)last.accepted_tokens);
  return 0;
}

int RunModel(RunArgs args) {
  if (absl::Status s = ValidateRunArgs(args); !s.ok()) return Fail(s);
  auto cache_type = ParseKvCacheType(args.cache_type);
  if (!cache_type.ok()) return Fail(cache_type.status());
  auto model_path = ResolveModel(args.model, isatty(STDERR_FILENO));
  if (!model_path.ok()) return Fail(model_path.status());
  ThreadPool pool(args.threads > 0 ? args.threads : ThreadPool::Default().num_threads());
  auto model = Model::Load(*model_path, {}, pool);
  if (!model.ok()) return Fail(model.status());
  if (!args.adapter.empty()) {
    auto file = AdapterFileAt(args.adapter);
    if (!file.ok()) return Fail(file.status());
    if (absl::Status s = (*model)->LoadLora(*file); !s.ok()) return Fail(s);
  }
  auto tokenizer = Tokenizer::FromGguf((*model)->file());
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  const ModelConfig& c = (*model)->config();

  if (args.info) {
    std::printf("arch: %s  name: %s\nlayers: %lld  hidden: %lld  heads: %lld/%lld  head_dim: %lld"
                "  ffn: %lld  vocab: %lld  experts: %lld (used %lld)\n",
                c.arch.c_str(), c.name.c_str(), (long long)c.num_layers, (long long)c.hidden,
                (long long)c.num_heads, (long long)c.num_heads_kv, (long long)c.head_dim,
                (long long)c.ffn, (long long)c.vocab_size, (long long)c.num_experts,
                (long long)c.num_experts_used);
    // Per-layer geometry, when the layers differ (gemma4): one line per layer.
    bool uniform = true;
    for (const LayerSpec& l : c.layers) {
      uniform &= l.attention == AttentionKind::kGlobal && l.kv_source < 0 &&
                 l.head_dim == c.head_dim && l.num_heads_kv == c.num_heads_kv;
    }
    if (!uniform || c.per_layer_input > 0 || c.final_logit_softcap != 0.0f) {
      std::printf("per-layer embeddings: %lld  final logit softcap: %g\n",
                  (long long)c.per_layer_input, c.final_logit_softcap);
      for (size_t i = 0; i < c.layers.size(); ++i) {
        const LayerSpec& l = c.layers[i];
        std::printf("  layer %zu: %s", i,
                    l.attention == AttentionKind::kSliding
                        ? absl::StrCat("sliding ", l.window).c_str()
                        : "global");
        std::printf("  heads %lld/%lld x %lld  rope %g/%lld  ffn %lld%s", (long long)l.num_heads,
                    (long long)l.num_heads_kv, (long long)l.head_dim, l.rope_base,
                    (long long)l.rope_dims, (long long)l.ffn, l.moe ? " + experts" : "");
        if (l.kv_source >= 0) std::printf("  K/V of layer %lld", (long long)l.kv_source);
        std::printf("\n");
      }
    }
    return 0;
  }
  if (!args.tokenize_file.empty()) {
    std::ifstream in(args.tokenize_file, std::ios::binary);
    if (!in) return Fail(absl::NotFoundError("cannot open " + args.tokenize_file));
    std::stringstream buf;
    buf << in.rdbuf();
    std::printf("%s\n", absl::StrJoin((*tokenizer)->Encode(buf.str(), true, true), ",").c_str());
    return 0;
  }

  std::vector<int32_t> prompt;
  if (!args.ids.empty()) {
    auto ids = ParseIds(args.ids);
    if (!ids.ok()) return Fail(ids.status());
    prompt = *ids;
  } else if (!args.prompt.empty()) {
    prompt = (*tokenizer)->Encode(args.prompt, true, true);
  }
  const bool speculative = args.spec || !args.spec_ref.empty();
  std::vector<int32_t> spec_reference;
  if (!args.spec_ref.empty()) {
    std::ifstream in(args.spec_ref, std::ios::binary);
    if (!in) return Fail(absl::NotFoundError("--spec-ref: cannot open " + args.spec_ref));
    std::stringstream text;
    text << in.rdbuf();
    spec_reference = (*tokenizer)->Encode(text.str(), false, false);
  }
  if (args.bench > 0) {
    if (!args.bench_prompts.empty()) {
      if (speculative) {
        return Fail(absl::InvalidArgumentError("--bench-prompts runs plain decoding, not --spec"));
      }
      auto prompts = ReadBenchPrompts(args.bench_prompts);
      if (!prompts.ok()) return Fail(prompts.status());
      const int64_t vocab = (*model)->config().vocab_size;
      for (const auto& p : *prompts) {
        for (int32_t id : p) {
          if (id < 0 || id >= vocab) {
            return Fail(absl::InvalidArgumentError(absl::StrCat(
                "--bench-prompts: token id ", id, " outside the vocabulary [0, ", vocab, ")")));
          }
        }
      }
      return RunBench(**model, *prompts, args, *cache_type, /*served_sampler=*/true);
    }
    if (prompt.empty()) return Fail(absl::InvalidArgumentError("--bench needs a prompt"));
    if (speculative) {
      return RunSpecBench(**model, **tokenizer, prompt, args, *cache_type, spec_reference);
    }
    return RunBench(**model, {prompt}, args, *cache_type, /*served_sampler=*/false);
  }

  auto kv = (*model)->NewKvCache(args.ctx, *cache_type);
  if (!kv.ok()) return Fail(kv.status());
  Session session(**model, **tokenizer, *std::move(kv));
  GenerationOptions options;
  options.max_tokens = args.gen;
  options.sampling = args.sampling;
  options.speculative = speculative;
  options.drafter.max_draft = args.spec_max;
  options.spec_reference = std::move(spec_reference);
  // The grammar compiles once; each reply starts from a copy of its initial state.
  std::unique_ptr<GrammarMatcher> grammar, reply_grammar;
  {
    auto spec = GrammarFromFlags(args);
    if (!spec.ok()) return Fail(spec.status());
    if (!spec->empty()) {
      auto vocab = GrammarVocab::Create(**tokenizer);
      if (!vocab.ok()) return Fail(vocab.status());
      auto compiled =
          (*vocab)->Compile(*spec, std::chrono::milliseconds(args.grammar_timeout_ms));
      if (!compiled.ok()) return Fail(compiled.status());
      grammar = *std::move(compiled);
    }
  }
  auto generate = [&](std::span<const int32_t> ids, const TokenCallback& on_token) {
    if (grammar != nullptr) {
      reply_grammar = grammar->Clone();
      options.constraint = reply_grammar.get();
    }
    return session.Generate(ids, options, on_token);
  };
  const bool tty = isatty(STDOUT_FILENO);
  auto print = [](int32_t, std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  };
  auto finish = [&](const GenerationResult& r) {
    std::printf("\n");
    if (args.print_ids) std::printf("ids: %s\n", absl::StrJoin(r.tokens, ",").c_str());
    if (tty) {
      std::fprintf(stderr, "[%lld prompt tokens (%lld reused), %zu generated, %.1f t/s]\n",
                   (long long)r.prompt_tokens, (long long)r.reused_tokens, r.tokens.size(),
                   r.tokens.size() / std::max(r.decode_seconds, 1e-9));
    }
    if (options.speculative) {
      std::fprintf(stderr,
                   "[spec: %lld decode passes for %zu tokens; %lld drafts of %lld tokens, %lld "
                   "accepted (%.2f per draft); %.1f t/s]\n",
                   (long long)r.forward_passes, r.tokens.size(), (long long)r.draft_passes,
                   (long long)r.draft_tokens, (long long)r.accepted_tokens,
                   r.draft_passes > 0 ? double(r.accepted_tokens) / double(r.draft_passes) : 0.0,
                   r.tokens.size() / std::max(r.decode_seconds, 1e-9));
    }
  };

  if (!prompt.empty() && args.chat.empty() && !args.repl) {
    auto r = generate(prompt, print);
    if (!r.ok()) return Fail(r.status());
    finish(*r);
    return 0;
  }
  if (args.chat.empty() && !args.repl) {
    return Fail(absl::InvalidArgumentError(
        "nothing to do: give --prompt, token ids, --chat, --repl, --tokenize, --info or --bench"));
  }
  auto chat_template = ChatTemplate::FromGguf((*model)->file());
  if (!chat_template.ok()) return Fail(chat_template.status());
  std::vector<ChatMessage> messages;
  if (!args.system.empty()) messages.push_back(Message("system", args.system));
  ChatRenderOptions render;
  if (args.no_think) render.enable_thinking = false;

  auto turn = [&](const std::string& user) -> int {
    messages.push_back(Message("user", user));
    auto text = chat_template->Render(messages, render);
    if (!text.ok()) return Fail(text.status());
    const std::vector<int32_t> ids = (*tokenizer)->Encode(*text, true, true);
    auto r = generate(ids, print);
    if (!r.ok()) return Fail(r.status());
    finish(*r);
    messages.push_back(Message("assistant", r->text));
    return 0;
  };
  if (!args.chat.empty()) {
    if (int rc = turn(args.chat); rc != 0) return rc;
  }
  if (args.repl) {
    std::string line;
    while (true) {
      if (isatty(STDIN_FILENO)) std::fprintf(stderr, "> ");
      if (!std::getline(std::cin, line)) break;
      if (line.empty()) continue;
      if (int rc = turn(line); rc != 0) return rc;
    }
  }
  return 0;
}

}  // namespace

void RegisterRunCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<RunArgs>();
  CLI::App* run = app.add_subcommand("run", "Run a model in this process: complete, chat, bench");
  run->add_option("MODEL", a->model, "GGUF model file, or a reference to pull (see `fucina pull`)")
      ->required();
  run->add_option("IDS", a->ids, "Prompt as comma-separated token ids");
  run->add_option("--prompt", a->prompt, "Prompt text (raw completion)");
  run->add_option("--chat", a->chat, "One chat turn, rendered with the model's chat template");
  run->add_option("--system", a->system, "System prompt for --chat / --repl ('' = template default)")
      ->capture_default_str();
  run->add_flag("--no-think", a->no_think, "Qwen3: render the empty think block");
  run->add_flag("--repl", a->repl, "Chat turns read from standard input, one per line");
  run->add_option("--gen", a->gen, "Maximum new tokens")->capture_default_str();
  run->add_option("--ctx", a->ctx, "Context (KV cache) length")->capture_default_str();
  run->add_option("--adapter", a->adapter,
                  "LoRA adapter GGUF applied without merging, or a train run's --out folder "
                  "(its adapters.gguf)");
  run->add_option("--cache-type", a->cache_type, "KV cache type: f32 | f16 | q8_0")
      ->capture_default_str();
  run->add_option("--threads", a->threads, "Threads (default: all)");
  run->add_option("--temp", a->sampling.temperature, "Temperature (0: greedy)")
      ->capture_default_str();
  run->add_option("--top-k", a->sampling.top_k)->capture_default_str();
  run->add_option("--top-p", a->sampling.top_p)->capture_default_str();
  run->add_option("--min-p", a->sampling.min_p)->capture_default_str();
  run->add_option("--repeat-penalty", a->sampling.repetition_penalty)->capture_default_str();
  run->add_option("--presence-penalty", a->sampling.presence_penalty)->capture_default_str();
  run->add_option("--frequency-penalty", a->sampling.frequency_penalty)->capture_default_str();
  run->add_option("--seed", a->sampling.seed)->capture_default_str();
  run->add_option("--tokenize", a->tokenize_file,
                  "Print the token ids of FILE's whole content, comma-separated");
  run->add_flag("--print-ids", a->print_ids, "Print generated ids as 'ids: a,b,c'");
  run->add_flag("--info", a->info, "Print the model's configuration");
  run->add_option("--bench", a->bench,
                  "Repeat prefill + --gen greedy decode N times; print medians (with --spec: "
                  "speculative decoding, and its passes)");
  run->add_option("--streams", a->streams, "Lockstep streams for --bench")->capture_default_str();
  run->add_option("--bench-prompts", a->bench_prompts,
                  "For --bench: a file of token-id prompts, one comma-separated line each; stream "
                  "s prefills line s (mod the count) and every row is sampled as a server "
                  "samples it (greedy): the engine side of `bench cluster-aggregate`");
  run->add_flag("--spec", a->spec,
                "Speculative decoding without a draft model: suffix-automaton and token-recycling "
                "drafts, each checked by one pass (same output, fewer passes)");
  run->add_option("--spec-ref", a->spec_ref,
                  "A document the output may copy from (drafts continue its text); implies --spec");
  run->add_option("--spec-max", a->spec_max, "Longest draft per pass")->capture_default_str();
  run->add_option("--json-schema", a->json_schema,
                  "Constrain the reply to this JSON schema (JSON text, or @FILE)");
  run->add_option("--regex", a->regex, "Constrain the reply to this regular expression");
  run->add_option("--lark", a->lark,
                  "Constrain the reply to this Lark grammar (llguidance's dialect; text or @FILE)");
  run->add_option("--grammar-timeout", a->grammar_timeout_ms,
                  "Milliseconds a grammar may take to compile before it is refused")
      ->capture_default_str();
  run->callback([a, exit_code] { *exit_code = RunModel(*a); });
}

}  // namespace fucina::cli
