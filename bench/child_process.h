// Server processes the benchmarks start from this very binary: `fucina coordinator | worker |
// serve | run` children with stdout and stderr in files, stopped (SIGTERM, then SIGKILL after
// 10 s) and reaped on every path out, and killed with the bench (PR_SET_PDEATHSIG).
#ifndef FUCINA_BENCH_CHILD_PROCESS_H_
#define FUCINA_BENCH_CHILD_PROCESS_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fucina::cli {

// One process started from this binary, stdout and stderr to files in `dir`. Stopped and reaped
// by its destructor unless it exited and was reaped before.
class Child {
 public:
  using Clock = std::chrono::steady_clock;

  // `args` follow the program name; `env` is the child's whole environment; `index` names its
  // output files in `dir`.
  static absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::string& name,
                                                      const std::vector<std::string>& args,
                                                      const std::vector<std::string>& env,
                                                      const std::string& dir, int index);
  ~Child();

  const std::string& name() const { return name_; }

  // False when it has been reaped already (its pid may belong to someone else by now).
  bool Signal(int sig);
  // Reaps it if it has exited, within `wait`; true once reaped.
  bool WaitExit(std::chrono::milliseconds wait);

  // The exit code (128 + signal when killed) once reaped; -1 before.
  int exit_status() const { return exit_status_; }

  std::string Stdout() const;
  // The last lines of its stderr, for error messages.
  std::string StderrTail() const;
  absl::Status ExitedError() const;
  // Polls stdout for a line starting with `prefix` (the servers' `listening ...`).
  absl::StatusOr<std::string> WaitForLine(const std::string& prefix, Clock::time_point deadline);

 private:
  Child() = default;
  std::string name_, out_, err_;
  pid_t pid_ = 0;
  int exit_status_ = -1;
};

// This process's environment with FUCINA_CACHE=`cache` in place of its own: children started
// with it share the join token made there, and leave the user's cache alone.
std::vector<std::string> EnvironmentWithCache(const std::string& cache);

// A server's `listening grpc=HOST:PORT metrics=HOST:PORT ...` line, parsed.
struct Endpoints {
  std::string grpc, metrics;
};

absl::StatusOr<Endpoints> WaitListening(Child& c, Child::Clock::time_point deadline);

}  // namespace fucina::cli

#endif  // FUCINA_BENCH_CHILD_PROCESS_H_
