// Subcommands of the `fucina` binary. Each Register* adds its subcommand (and flags) to the
// CLI app and binds a callback that runs it; the callback sets *exit_code.
#ifndef FUCINA_TOOLS_COMMANDS_H_
#define FUCINA_TOOLS_COMMANDS_H_

namespace CLI {
class App;
}

namespace fucina::cli {

// The most threads any command accepts for --threads (0 there means all hardware threads).
inline constexpr int kMaxThreads = 1024;

void RegisterGgufCommands(CLI::App& app, int* exit_code);
void RegisterBenchCommands(CLI::App& app, int* exit_code);
void RegisterRunCommand(CLI::App& app, int* exit_code);
void RegisterClusterCommands(CLI::App& app, int* exit_code);
// `fucina client generate`; `client train` (RegisterTrainCommands) adds itself under it, so this
// is registered first.
void RegisterClientCommand(CLI::App& app, int* exit_code);
void RegisterPullCommand(CLI::App& app, int* exit_code);
void RegisterTrainCommands(CLI::App& app, int* exit_code);
// `fucina bench cluster` (bench/cluster_bench.cc), added under the `bench` subcommand.
void RegisterClusterBench(CLI::App& bench, int* exit_code);
// `fucina bench cluster-aggregate` (bench/cluster_aggregate_bench.cc): real processes, many
// streams, against two single-thread `fucina run` at once.
void RegisterClusterAggregateBench(CLI::App& bench, int* exit_code);
// `fucina bench es` (bench/es_bench.cc): ES member evaluations/s on worker processes against
// two single-thread `train es` at once, and bytes per generation against the parameter count.
void RegisterEsBench(CLI::App& bench, int* exit_code);
void RegisterSpecBench(CLI::App& bench, int* exit_code);
void RegisterGrammarBench(CLI::App& bench, int* exit_code);

}  // namespace fucina::cli

#endif  // FUCINA_TOOLS_COMMANDS_H_
