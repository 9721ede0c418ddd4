// The progress sink of the fucina binary on a terminal: one line per task on stderr, redrawn
// in place (models/log/log.h's ReportProgress); nothing where stderr is not a terminal.
#ifndef FUCINA_TOOLS_PROGRESS_BAR_H_
#define FUCINA_TOOLS_PROGRESS_BAR_H_

#include <string>

#include "models/log/log.h"

namespace fucina::cli {

// The line drawn for `p` (without the leading carriage return and clear).
std::string ProgressLine(const Progress& p);

// Installs the terminal bar as the progress sink when stderr is a terminal.
void InstallTerminalProgress();

}  // namespace fucina::cli

#endif  // FUCINA_TOOLS_PROGRESS_BAR_H_
