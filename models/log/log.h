// One logger for the libraries, and progress reports the binary shows as it likes.
//
// A line has a severity, where it was written, an optional request id (every line of one
// request's life carries the same id, so `grep req-17` follows it) and a message:
//   FUCINA_LOG(kInfo).Request(id) << "finished: " << n << " tokens";
// By default lines go to stderr as `I1206 08:35:12.345678 scheduler.cc:125] [req-17] ...`
// (glog's layout); a binary or a test installs its own sink. The facade keeps absl logging's
// shape (a streamed message per line) so the libraries can move to absl/log where the system
// abseil has it (Debian 12's does not).
//
// Progress (a model loading, a file downloading) is reported, never drawn, by the libraries:
// the binary installs a progress sink (a bar on a terminal, nothing in a pod).
#ifndef FUCINA_MODELS_LOG_LOG_H_
#define FUCINA_MODELS_LOG_LOG_H_

#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace fucina {

enum class LogSeverity { kInfo, kWarning, kError };

struct LogLine {
  LogSeverity severity = LogSeverity::kInfo;
  std::string_view file;  // base name of the source file
  int line = 0;
  std::string_view request_id;  // empty: not about one request
  std::string_view message;
};

using LogSink = std::function<void(const LogLine&)>;

// Replaces the process's log sink (null: stderr) and returns the one before; lines written
// from any thread reach it one at a time.
LogSink SetLogSink(LogSink sink);

// The stderr sink's text for `line` (no trailing newline).
std::string FormatLogLine(const LogLine& line);

// One line, written when it goes out of scope (FUCINA_LOG).
class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;

  // The request this line is about.
  LogMessage& Request(std::string_view id) {
    request_id_ = id;
    return *this;
  }
  template <typename T>
  LogMessage& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }

 private:
  LogSeverity severity_;
  const char* file_;
  int line_;
  std::string request_id_;
  std::ostringstream stream_;
};

#define FUCINA_LOG(severity) ::fucina::LogMessage(::fucina::LogSeverity::severity, __FILE__, __LINE__)

// A long task's progress: `done` of `total` units (total 0: unknown), `bytes_per_second` when
// it moves bytes (0 otherwise). `finished` is set once, on the last report of the task.
struct Progress {
  std::string_view task;  // e.g. "loading", or the file being downloaded
  int64_t done = 0;
  int64_t total = 0;
  double bytes_per_second = 0;
  bool finished = false;
};

using ProgressSink = std::function<void(const Progress&)>;

// Replaces the process's progress sink (null: progress is not shown) and returns the one
// before.
ProgressSink SetProgressSink(ProgressSink sink);
// Hands `progress` to the sink, if any; from any thread, one report at a time.
void ReportProgress(const Progress& progress);

}  // namespace fucina

#endif  // FUCINA_MODELS_LOG_LOG_H_
