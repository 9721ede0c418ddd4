// The `fucina` binary: one entry point, one subcommand per job.
#include <CLI/CLI.hpp>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"fucina: serve and fine-tune GGUF language models on one machine or a cluster"};
  app.require_subcommand(1);
  int exit_code = 0;
  fucina::cli::RegisterRunCommand(app, &exit_code);
  fucina::cli::RegisterClusterCommands(app, &exit_code);
  fucina::cli::RegisterPullCommand(app, &exit_code);
  fucina::cli::RegisterGgufCommands(app, &exit_code);
  fucina::cli::RegisterBenchCommands(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
