// `fucina gguf info|make-fixture|quantize|export`.
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/thread_pool.h"
#include "models/engine/fixture.h"
#include "models/engine/merge.h"
#include "models/engine/model.h"
#include "models/gguf/gguf.h"
#include "models/gguf/quantize.h"
#include "tools/commands.h"

namespace fucina::cli {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return 1;
}

struct InfoArgs {
  std::string path;
  size_t max_items = 8;
  bool tensors = true;
};

int RunInfo(const InfoArgs& args) {
  auto file_or = gguf::File::Open(args.path);
  if (!file_or.ok()) return Fail(file_or.status());
  const gguf::File& file = **file_or;
  std::printf("file: %s\n", file.path().c_str());
  std::printf("version: %u  alignment: %" PRIu64 "  data offset: %" PRIu64 "  size: %" PRIu64
              " bytes\n",
              file.version(), file.alignment(), file.data_offset(), file.file_size());
  std::printf("metadata: %zu keys\n", file.metadata().size());
  for (const auto& [key, value] : file.metadata()) {
    std::string type(gguf::ValueTypeName(value.type()));
    if (const auto* arr = value.AsArray()) {
      type = "array<" + std::string(gguf::ValueTypeName(arr->elem_type)) + ">";
    }
    std::printf("  %-44s %-16s %s\n", key.c_str(), type.c_str(),
                value.ToDisplayString(args.max_items).c_str());
  }
  int64_t params = 0;
  uint64_t bytes = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    params += t.num_elements();
    bytes += t.nbytes;
  }
  std::printf("tensors: %zu  parameters: %" PRId64 "  data: %.2f MiB\n", file.tensors().size(),
              params, bytes / 1048576.0);
  if (!args.tensors) return 0;
  std::printf("  %-5s %-40s %-8s %-24s %12s %12s\n", "#", "name", "type", "dims", "offset",
              "bytes");
  int index = 0;
  for (const gguf::TensorInfo& t : file.tensors()) {
    std::printf("  %-5d %-40s %-8s %-24s %12" PRIu64 " %12" PRIu64 "\n", index++,
                t.name.c_str(), std::string(TypeName(t.type)).c_str(),
                absl::StrJoin(t.dims, " x ").c_str(), t.offset, t.nbytes);
  }
  return 0;
}

struct QuantizeArgs {
  std::string in, out, type;
  bool pure = false;
  int threads = 0;
};

int RunQuantize(const QuantizeArgs& args) {
  auto target = gguf::ParseQuantTarget(args.type);
  if (!target.ok()) return Fail(target.status());
  auto file = gguf::File::Open(args.in);
  if (!file.ok()) return Fail(file.status());
  ThreadPool pool(args.threads > 0 ? args.threads : ThreadPool::Default().num_threads());
  gguf::QuantizeOptions options;
  options.pure = args.pure;
  // The family's table says which matrices stay as they are (routers); a file of an unknown
  // family falls back to the name rules.
  std::set<std::string> keep;
  if (auto table = ModelTensorTable(**file); table.ok()) {
    for (const TensorSpec& t : *table) {
      if (!t.quantize) keep.insert(t.name);
    }
    options.keep = [&keep](std::string_view name) { return keep.contains(std::string(name)); };
  }
  absl::Status s = gguf::QuantizeModel(**file, args.out, *target, options, pool, stderr);
  if (!s.ok()) return Fail(s);
  std::printf("wrote %s (%s)\n", args.out.c_str(), args.type.c_str());
  return 0;
}

struct ExportArgs {
  std::string base, out, type;
  std::vector<std::string> adapters;
  int threads = 0;
};

int RunExport(const ExportArgs& args) {
  MergeOptions options;
  if (!args.type.empty()) {
    auto target = gguf::ParseQuantTarget(args.type);
    if (!target.ok()) return Fail(target.status());
    options.type = *std::move(target);
  }
  std::vector<std::string> trained;
  for (const std::string& path : args.adapters) {
    auto files = TrainedFilesAt(path);
    if (!files.ok()) return Fail(files.status());
    trained.insert(trained.end(), files->begin(), files->end());
  }
  options.log = stderr;
  ThreadPool pool(args.threads > 0 ? args.threads : ThreadPool::Default().num_threads());
  if (absl::Status s = MergeModel(args.base, trained, args.out, options, pool); !s.ok()) {
    return Fail(s);
  }
  std::printf("wrote %s (%s merged)\n", args.out.c_str(), absl::StrJoin(trained, ", ").c_str());
  return 0;
}

int RunMakeFixture(const FixtureOptions& options, const std::string& out, int threads) {
  ThreadPool pool(threads > 0 ? threads : ThreadPool::Default().num_threads());
  absl::Status s = MakeFixture(options, out, pool);
  if (!s.ok()) return Fail(s);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

}  // namespace

void RegisterGgufCommands(CLI::App& app, int* exit_code) {
  CLI::App* gguf =
      app.add_subcommand("gguf", "Inspect, create, quantize and export GGUF files");
  gguf->require_subcommand(1);

  auto info_args = std::make_shared<InfoArgs>();
  CLI::App* info = gguf->add_subcommand("info", "Print a GGUF file's metadata and tensor table");
  info->add_option("FILE", info_args->path, "GGUF file (first part of a split model)")->required();
  info->add_option("--max-items", info_args->max_items, "Array elements shown per key");
  info->add_flag("!--no-tensors", info_args->tensors, "Omit the tensor table");
  info->callback([info_args, exit_code] { *exit_code = RunInfo(*info_args); });

  auto q_args = std::make_shared<QuantizeArgs>();
  CLI::App* quantize = gguf->add_subcommand("quantize", "Convert a model's weights to a type");
  quantize->add_option("IN", q_args->in, "Input GGUF")->required();
  quantize->add_option("OUT", q_args->out, "Output GGUF")->required();
  quantize->add_option("--type", q_args->type,
                       "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k|q4_k_m")
      ->required();
  quantize->add_flag("--pure", q_args->pure, "Same type for every matrix (no llama.cpp mix)");
  quantize->add_option("--threads", q_args->threads, "Threads (default: all)");
  quantize->callback([q_args, exit_code] { *exit_code = RunQuantize(*q_args); });

  auto e_args = std::make_shared<ExportArgs>();
  CLI::App* exp = gguf->add_subcommand(
      "export", "Merge trained LoRA adapters and/or tensors into a dense GGUF");
  exp->add_option("BASE", e_args->base, "The base model GGUF the training started from")
      ->required();
  exp->add_option("--adapters", e_args->adapters,
                  "An adapter GGUF (general.type adapter: LoRA, W + alpha/rank * B A), a "
                  "tensors GGUF (general.type tensors: replacements), or a training output "
                  "directory holding adapters.gguf and/or tensors.gguf (repeatable)")
      ->required()
      ->allow_extra_args(false);  // one path per flag: BASE may follow
  exp->add_option("--out", e_args->out, "Output GGUF")->required();
  exp->add_option("--type", e_args->type,
                  "Write every tensor as gguf quantize --type would (default: merged tensors "
                  "re-quantized to their own type, the rest copied)");
  exp->add_option("--threads", e_args->threads, "Threads (default: all)")
      ->check(CLI::Range(0, kMaxThreads));
  exp->callback([e_args, exit_code] { *exit_code = RunExport(*e_args); });

  auto f = std::make_shared<FixtureOptions>();
  auto f_out = std::make_shared<std::string>();
  auto f_threads = std::make_shared<int>(0);
  CLI::App* fix = gguf->add_subcommand(
      "make-fixture",
      "Write a random-weight qwen3/qwen3moe/llama/gemma4 model (see models/engine/fixture.h)");
  fix->add_option("OUT", *f_out, "Output GGUF")->required();
  fix->add_option("--arch", f->arch, "qwen3 | qwen3moe | llama | gemma4")->capture_default_str();
  fix->add_option("--name", f->name, "general.name");
  fix->add_option("--layers", f->num_layers)->capture_default_str();
  fix->add_option("--hidden", f->hidden)->capture_default_str();
  fix->add_option("--ffn", f->ffn, "Dense FFN width")->capture_default_str();
  fix->add_option("--heads", f->num_heads)->capture_default_str();
  fix->add_option("--kv-heads", f->num_heads_kv)->capture_default_str();
  fix->add_option("--head-dim", f->head_dim, "qwen3 only; llama uses hidden/heads")
      ->capture_default_str();
  fix->add_option("--vocab", f->vocab, "Vocabulary size (minimum, with --tokenizer)")
      ->capture_default_str();
  fix->add_option("--experts", f->num_experts)->capture_default_str();
  fix->add_option("--experts-used", f->num_experts_used)->capture_default_str();
  fix->add_option("--expert-ffn", f->expert_ffn)->capture_default_str();
  fix->add_option("--ctx", f->context_length, "context_length key")->capture_default_str();
  fix->add_option("--rope-base", f->rope_base)->capture_default_str();
  fix->add_option("--rms-eps", f->rms_eps)->capture_default_str();
  fix->add_flag("!--untied", f->tied, "Write a separate output.weight");
  fix->add_flag("--peaked", f->peaked, "Scale embeddings/output for clear next-token winners");
  fix->add_flag("--rope-freqs", f->rope_freqs, "llama: write rope_freqs.weight");
  fix->add_option("--init-std", f->init_std)->capture_default_str();
  // gemma4's per-layer geometry.
  fix->add_option("--sliding-window", f->sliding_window, "gemma4: sliding-window size")
      ->capture_default_str();
  fix->add_option("--global-every", f->global_every,
                  "gemma4: every Nth layer is global, the rest sliding (0: all sliding)")
      ->capture_default_str();
  fix->add_option("--head-dim-global", f->head_dim_global, "gemma4: global layers' head size")
      ->capture_default_str();
  fix->add_option("--kv-heads-global", f->kv_heads_global,
                  "gemma4: global layers' KV heads (0: as --kv-heads)")
      ->capture_default_str();
  fix->add_option("--shared-kv-layers", f->shared_kv_layers,
                  "gemma4: trailing layers that read an earlier layer's K/V")
      ->capture_default_str();
  fix->add_option("--per-layer-input", f->per_layer_input,
                  "gemma4: per-layer embedding width (0: none)")
      ->capture_default_str();
  fix->add_option("--rope-base-swa", f->rope_base_swa, "gemma4: sliding layers' RoPE base")
      ->capture_default_str();
  fix->add_option("--softcap", f->final_logit_softcap, "gemma4: final logit softcapping")
      ->capture_default_str();
  fix->add_flag("--moe", f->moe, "gemma4: routed experts beside the dense FFN");
  fix->add_option("--seed", f->seed)->capture_default_str();
  fix->add_option("--type", f->type, "Weight type, as gguf quantize --type")->capture_default_str();
  fix->add_option("--tokenizer", f->tokenizer_dir,
                  "Folder with an HF tokenizer.json (+ tokenizer_config.json)");
  fix->add_option("--pre", f->pre,
                  "tokenizer.ggml.pre to record for a byte-level BPE --tokenizer; SentencePiece "
                  "ones (byte_fallback) ignore it and record \"default\", except \"gemma4\", "
                  "which writes them as a Gemma 4 \"gemma4\" BPE vocabulary")
      ->capture_default_str();
  fix->add_option("--threads", *f_threads, "Threads (default: all)");
  fix->callback([f, f_out, f_threads, exit_code] {
    *exit_code = RunMakeFixture(*f, *f_out, *f_threads);
  });
}

}  // namespace fucina::cli
