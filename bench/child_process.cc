#include "bench/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace fucina::cli {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Child>> Child::Spawn(const std::string& name,
                                                    const std::vector<std::string>& args,
                                                    const std::vector<std::string>& env,
                                                    const std::string& dir, int index) {
  auto c = std::unique_ptr<Child>(new Child);
  c->name_ = name;
  c->out_ = absl::StrCat(dir, "/", index, ".out");
  c->err_ = absl::StrCat(dir, "/", index, ".err");
  // Everything the child needs is built before fork: only async-signal-safe calls after it.
  std::vector<std::string> argv_s = {"fucina"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s = env;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  const int out = open(c->out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err = open(c->err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (out < 0 || err < 0 || in < 0) return absl::InternalError("cannot open " + c->out_);
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // the bench killed: its servers go too
    if (getppid() != parent) _exit(127);
    // The servers take SIGINT/SIGTERM with sigwait: a mask or an ignored disposition
    // inherited from here (a shell's background job ignores SIGINT) would hide them. Their own
    // process group keeps a Ctrl-C meant for the bench from reaching them before it.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    setpgid(0, 0);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  close(out);
  close(err);
  close(in);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork failed for ", name));
  c->pid_ = pid;
  return c;
}

Child::~Child() {
  Signal(SIGTERM);
  WaitExit(std::chrono::seconds(10));
  if (Signal(SIGKILL)) WaitExit(std::chrono::hours(1));
}

bool Child::Signal(int sig) {
  if (pid_ <= 0) return false;
  kill(pid_, sig);
  return true;
}

bool Child::WaitExit(std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  while (pid_ > 0) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pid_ == 0;
}

std::string Child::Stdout() const { return ReadFile(out_); }

std::string Child::StderrTail() const {
  std::string e = ReadFile(err_);
  if (e.size() > 1500) e = "..." + e.substr(e.size() - 1500);
  while (!e.empty() && e.back() == '\n') e.pop_back();
  return absl::StrReplaceAll(e, {{"\n", " | "}});
}

absl::Status Child::ExitedError() const {
  return absl::UnavailableError(absl::StrCat(name_, " exited with status ", exit_status_,
                                             ": ", StderrTail()));
}

absl::StatusOr<std::string> Child::WaitForLine(const std::string& prefix,
                                              Clock::time_point deadline) {
  while (true) {
    for (absl::string_view line : absl::StrSplit(Stdout(), '\n')) {
      if (absl::StartsWith(line, prefix)) return std::string(line);
    }
    if (WaitExit(std::chrono::milliseconds(0))) return ExitedError();
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " printed no '", prefix, "' line"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<std::string> EnvironmentWithCache(const std::string& cache) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "FUCINA_CACHE=")) env.push_back(*e);
  }
  env.push_back("FUCINA_CACHE=" + cache);
  return env;
}

absl::StatusOr<Endpoints> WaitListening(Child& c, Child::Clock::time_point deadline) {
  auto line = c.WaitForLine("listening ", deadline);
  if (!line.ok()) return line.status();
  Endpoints e;
  for (absl::string_view field : absl::StrSplit(*line, ' ')) {
    if (absl::ConsumePrefix(&field, "grpc=")) e.grpc = std::string(field);
    if (absl::ConsumePrefix(&field, "metrics=")) e.metrics = std::string(field);
  }
  if (e.grpc.empty()) return absl::InternalError("no grpc= in '" + *line + "'");
  return e;
}

}  // namespace fucina::cli
