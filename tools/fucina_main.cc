// The `fucina` binary: one entry point, one subcommand per job.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>

#include <CLI/CLI.hpp>

#include "tools/commands.h"
#include "tools/progress_bar.h"

namespace {

// Model files are memory-mapped: one truncated or rewritten in place while in use turns the next
// read of a lost page into SIGBUS. Workers check the file's size before every pass over the
// weights (gguf::File::CheckMappedIntact) and fail the request instead; this handler covers the
// window inside a pass, saying what happened before the default action ends the process.
void OnBusError(int sig) {
  static const char kMessage[] =
      "fucina: SIGBUS reading a memory-mapped file: a model file was most likely truncated or "
      "overwritten in place while in use (replace model files by renaming a new file over "
      "them)\n";
  ssize_t ignored = ::write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
  (void)ignored;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction bus;
  std::memset(&bus, 0, sizeof(bus));
  bus.sa_handler = OnBusError;
  sigaction(SIGBUS, &bus, nullptr);

  // Loading and downloads report their progress; on a terminal it is drawn as a bar.
  fucina::cli::InstallTerminalProgress();

  CLI::App app{"fucina: serve and fine-tune GGUF language models on one machine or a cluster"};
  app.require_subcommand(1);
  int exit_code = 0;
  fucina::cli::RegisterRunCommand(app, &exit_code);
  fucina::cli::RegisterClusterCommands(app, &exit_code);
  fucina::cli::RegisterClientCommand(app, &exit_code);
  fucina::cli::RegisterPullCommand(app, &exit_code);
  fucina::cli::RegisterTrainCommands(app, &exit_code);
  fucina::cli::RegisterGgufCommands(app, &exit_code);
  fucina::cli::RegisterBenchCommands(app, &exit_code);
  try {
    CLI11_PARSE(app, argc, argv);
  } catch (const std::exception& e) {
    // A last resort: every expected failure is a Status turned into a message already.
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
