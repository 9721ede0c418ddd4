#include "tools/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace fucina::cli {

std::string ProgressLine(const Progress& p) {
  constexpr int kWidth = 30;
  std::string line(p.task);
  if (p.total > 0) {
    const double fraction = std::min(1.0, static_cast<double>(p.done) / p.total);
    const int fill = static_cast<int>(fraction * kWidth);
    absl::StrAppendFormat(&line, " [%s%s] %5.1f%%", std::string(fill, '#'),
                          std::string(kWidth - fill, ' '), 100.0 * fraction);
  }
  if (p.bytes_per_second > 0) {
    if (p.total > 0) {
      absl::StrAppendFormat(&line, " %.1f/%.1f MiB", p.done / 1048576.0, p.total / 1048576.0);
    } else {
      absl::StrAppendFormat(&line, " %.1f MiB", p.done / 1048576.0);
    }
    absl::StrAppendFormat(&line, " %.1f MiB/s", p.bytes_per_second / 1048576.0);
  }
  return line;
}

void InstallTerminalProgress() {
  if (!isatty(STDERR_FILENO)) return;
  SetProgressSink([](const Progress& p) {
    if (p.finished) {
      std::fprintf(stderr, "\r\033[K");
    } else {
      std::fprintf(stderr, "\r\033[K%s", ProgressLine(p).c_str());
    }
    std::fflush(stderr);
  });
}

}  // namespace fucina::cli
