// `fucina train es`: evolution-strategies fine-tuning in this process (models/train/es.h):
// full-parameter mode over the tensors --tensors selects, or LoRA adapters on --targets; the
// nll reward over a JSONL task file; one line per generation; the trained model written as
// GGUF (trained tensors f32, the rest as in the base file) or the adapters as an adapter GGUF.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <memory>
#include <regex>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/thread_pool.h"
#include "models/chat/chat_template.h"
#include "models/engine/lora.h"
#include "models/engine/model.h"
#include "models/gguf/writer.h"
#include "models/hub/pull.h"
#include "models/tokenizer/tokenizer.h"
#include "models/train/es.h"
#include "models/train/tasks.h"
#include "tools/command_status.h"
#include "tools/commands.h"

namespace fucina::cli {
namespace {

struct TrainArgs {
  std::string model, data, holdout, out, reward = "nll", mode = "full";
  std::string tensors = "blk\\.[0-9]+\\.(attn_q|attn_v|ffn_down)\\.weight";
  std::string targets = "q,v";
  int population = 16, iterations = 10, threads = 0, rank = 8;
  float sigma = 1e-3f, lr = 5e-4f, weight_decay = 0.0f, alpha = 16.0f;
  uint64_t seed = 0;
  bool raw = false;
};

// The base file's metadata and tensors, the trained ones replaced by their f32 values.
absl::Status WriteTrained(const gguf::File& base, const train::EsTrainer& trainer,
                          const std::string& path) {
  auto writer = gguf::Writer::Create(path, static_cast<uint32_t>(base.alignment()));
  if (!writer.ok()) return writer.status();
  for (const auto& [key, value] : base.metadata()) {
    if (!key.starts_with("split.")) (*writer)->SetValue(key, value);
  }
  const std::vector<std::string> names = trainer.tensor_names();
  for (const gguf::TensorInfo& t : base.tensors()) {
    const auto it = std::find(names.begin(), names.end(), t.name);
    absl::Status s;
    if (it == names.end()) {
      s = (*writer)->AddTensorBytes(t.name, t.dims, t.type, {t.data, t.nbytes});
    } else {
      const std::span<const float> v = trainer.values(it - names.begin());
      s = (*writer)->AddTensor(t.name, t.dims, GgmlType::kF32, [v](std::span<uint8_t> out) {
        std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
        return absl::OkStatus();
      });
    }
    if (!s.ok()) return s;
  }
  return (*writer)->Finish();
}

int RunTrain(const TrainArgs& a) {
  auto path = ResolveModel(a.model, isatty(STDERR_FILENO));
  if (!path.ok()) return Fail(path.status());
  std::regex pattern;
  try {
    pattern = std::regex(a.tensors);
  } catch (const std::regex_error& e) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--tensors: ", e.what())));
  }
  ThreadPool pool(a.threads > 0 ? a.threads : ThreadPool::Default().num_threads());
  LoadOptions load;
  const bool lora = a.mode == "lora";
  if (!lora) {
    load.f32_tensors = [&pattern](std::string_view name) {
      return std::regex_match(name.begin(), name.end(), pattern);
    };
  }
  auto model = Model::Load(*path, load, pool);
  if (!model.ok()) return Fail(model.status());
  if (lora) {
    auto targets = ParseLoraTargets(a.targets);
    if (!targets.ok()) return Fail(absl::InvalidArgumentError(
        absl::StrCat("--targets: ", targets.status().message())));
    if (absl::Status s = (*model)->AddLora(*targets, a.rank, a.alpha, a.seed); !s.ok()) {
      return Fail(absl::Status(s.code(), absl::StrCat("--rank: ", s.message())));
    }
  }
  auto tokenizer = Tokenizer::FromGguf((*model)->file());
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  std::optional<ChatTemplate> chat;
  if (!a.raw) {
    auto t = ChatTemplate::FromGguf((*model)->file());
    if (!t.ok()) return Fail(t.status());
    chat = *std::move(t);
  }
  auto tasks = train::LoadTasks(a.data, **tokenizer, chat ? &*chat : nullptr);
  if (!tasks.ok()) return Fail(tasks.status());
  std::vector<train::Task> held;
  if (!a.holdout.empty()) {
    auto h = train::LoadTasks(a.holdout, **tokenizer, chat ? &*chat : nullptr);
    if (!h.ok()) return Fail(h.status());
    held = *std::move(h);
  }
  auto report_holdout = [&](const char* when) -> absl::Status {
    if (held.empty()) return absl::OkStatus();
    auto r = train::MeanAnswerLogProb(**model, held);
    if (!r.ok()) return r.status();
    std::printf("held-out reward (%s): %.5f\n", when, *r);
    return absl::OkStatus();
  };

  train::EsOptions options;
  options.population = a.population;
  options.sigma = a.sigma;
  options.lr = a.lr;
  options.weight_decay = a.weight_decay;
  options.seed = a.seed;
  auto trainer = train::EsTrainer::Create(**model, options, pool);
  if (!trainer.ok()) {
    return Fail(absl::Status(trainer.status().code(),
                             absl::StrCat("--tensors '", a.tensors, "': ",
                                          trainer.status().message())));
  }
  std::printf("training %zu tensors (%lld values) on %zu tasks: population %d, sigma %g, lr %g\n",
              (*trainer)->tensor_names().size(), (long long)(*trainer)->num_values(),
              tasks->size(), a.population, a.sigma, a.lr);
  const train::FitnessFn fitness = [&](Model& m) { return train::MeanAnswerLogProb(m, *tasks); };
  auto start = fitness(**model);
  if (!start.ok()) return Fail(start.status());
  std::printf("generation 0: reward %.5f\n", *start);
  if (absl::Status s = report_holdout("before"); !s.ok()) return Fail(s);
  for (int g = 0; g < a.iterations; ++g) {
    auto values = (*trainer)->Step(g, fitness);
    if (!values.ok()) return Fail(values.status());
    float lo = (*values)[0], hi = (*values)[0], sum = 0;
    for (float v : *values) lo = std::min(lo, v), hi = std::max(hi, v), sum += v;
    auto now = fitness(**model);
    if (!now.ok()) return Fail(now.status());
    std::printf("generation %d: reward %.5f (members mean %.5f, min %.5f, max %.5f)\n", g + 1,
                *now, sum / values->size(), lo, hi);
    std::fflush(stdout);
  }
  if (absl::Status s = report_holdout("after"); !s.ok()) return Fail(s);
  std::printf("checksum %016llx\n", (unsigned long long)(*trainer)->Checksum());
  if (!a.out.empty()) {
    // The trainer writes its values into the model's adapters, so the model saves them.
    absl::Status s = lora ? (*model)->SaveLora(a.out)
                          : WriteTrained((*model)->file(), **trainer, a.out);
    if (!s.ok()) return Fail(s);
    std::printf("wrote %s\n", a.out.c_str());
  }
  return 0;
}

}  // namespace

void RegisterTrainCommands(CLI::App& app, int* exit_code) {
  CLI::App* train = app.add_subcommand("train", "Fine-tune a model");
  train->require_subcommand(1);
  auto a = std::make_shared<TrainArgs>();
  CLI::App* es = train->add_subcommand(
      "es", "Evolution strategies in this process (full-parameter mode, nll reward)");
  es->add_option("MODEL", a->model, "GGUF model file, or a reference to pull")->required();
  es->add_option("--data", a->data, "JSONL tasks: {\"prompt\": ..., \"answer\": ...} per line")
      ->required();
  es->add_option("--holdout", a->holdout, "JSONL tasks only scored, before and after training");
  es->add_option("--reward", a->reward, "nll: mean log-probability of the answer tokens")
      ->check(CLI::IsMember({"nll"}))
      ->capture_default_str();
  es->add_option("--mode", a->mode,
                 "full: the --tensors matrices, held as f32; lora: adapters on --targets")
      ->check(CLI::IsMember({"full", "lora"}))
      ->capture_default_str();
  es->add_option("--targets", a->targets, "lora: projections (q,k,v,o,gate,up,down)")
      ->capture_default_str();
  es->add_option("--rank", a->rank, "lora: adapter rank")->capture_default_str();
  es->add_option("--alpha", a->alpha, "lora: scale alpha / rank")->capture_default_str();
  es->add_option("--tensors", a->tensors, "Regex over tensor names: what full mode trains")
      ->capture_default_str();
  es->add_option("--population", a->population, "Members per generation (even)")
      ->capture_default_str();
  es->add_option("--sigma", a->sigma, "Noise scale")->capture_default_str();
  es->add_option("--lr", a->lr, "Step size")->capture_default_str();
  es->add_option("--weight-decay", a->weight_decay, "Pull toward the base weights")
      ->capture_default_str();
  es->add_option("--iterations", a->iterations, "Generations")->capture_default_str();
  es->add_option("--seed", a->seed, "Noise seed")->capture_default_str();
  es->add_option("--threads", a->threads, "Threads (default: all)")
      ->check(CLI::Range(0, kMaxThreads));
  es->add_flag("--raw", a->raw, "Use prompts as they are, without the chat template");
  es->add_option("--out", a->out,
                 "Write the trained model (full) or the adapters (lora, llama.cpp's format) here");
  es->callback([a, exit_code] { *exit_code = RunTrain(*a); });
}

}  // namespace fucina::cli
