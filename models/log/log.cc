#include "models/log/log.h"

#include <sys/time.h>

#include <cstdio>
#include <ctime>
#include <mutex>
#include <utility>

#include "absl/strings/str_format.h"

namespace fucina {
namespace {

std::mutex& SinkMutex() {
  static std::mutex mu;
  return mu;
}

LogSink& Sink() {
  static LogSink sink;
  return sink;
}

std::mutex& ProgressMutex() {
  static std::mutex mu;
  return mu;
}

ProgressSink& ProgressSinkRef() {
  static ProgressSink sink;
  return sink;
}

std::string_view BaseName(const char* path) {
  std::string_view p(path);
  const size_t slash = p.rfind('/');
  return slash == std::string_view::npos ? p : p.substr(slash + 1);
}

}  // namespace

LogSink SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(SinkMutex());
  return std::exchange(Sink(), std::move(sink));
}

std::string FormatLogLine(const LogLine& line) {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  std::tm tm{};
  localtime_r(&tv.tv_sec, &tm);
  const char level = line.severity == LogSeverity::kError     ? 'E'
                     : line.severity == LogSeverity::kWarning ? 'W'
                                                              : 'I';
  std::string out = absl::StrFormat("%c%02d%02d %02d:%02d:%02d.%06d %s:%d] ", level,
                                    tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                                    tm.tm_sec, static_cast<int>(tv.tv_usec), line.file,
                                    line.line);
  if (!line.request_id.empty()) absl::StrAppendFormat(&out, "[%s] ", line.request_id);
  out.append(line.message);
  return out;
}

LogMessage::LogMessage(LogSeverity severity, const char* file, int line)
    : severity_(severity), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  const std::string message = stream_.str();
  const LogLine line{.severity = severity_,
                     .file = BaseName(file_),
                     .line = line_,
                     .request_id = request_id_,
                     .message = message};
  std::lock_guard<std::mutex> lock(SinkMutex());
  if (Sink()) {
    Sink()(line);
    return;
  }
  const std::string text = FormatLogLine(line);
  std::fprintf(stderr, "%s\n", text.c_str());
}

ProgressSink SetProgressSink(ProgressSink sink) {
  std::lock_guard<std::mutex> lock(ProgressMutex());
  return std::exchange(ProgressSinkRef(), std::move(sink));
}

void ReportProgress(const Progress& progress) {
  std::lock_guard<std::mutex> lock(ProgressMutex());
  if (ProgressSinkRef()) ProgressSinkRef()(progress);
}

}  // namespace fucina
