// How commands report a failure: "error: MESSAGE" on stderr, and the exit code. Shared by
// `run` and the server commands, so a flag is refused the same way by all of them.
#ifndef FUCINA_TOOLS_COMMAND_STATUS_H_
#define FUCINA_TOOLS_COMMAND_STATUS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fucina::cli {

// Exit code 2 for what the command line got wrong (INVALID_ARGUMENT), 1 for everything else.
inline int Fail(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
  return absl::IsInvalidArgument(status) ? 2 : 1;
}

// Flags that cannot work together: exit status 2, as for a usage error, whatever the status.
inline int FailUsage(const absl::Status& status) {
  Fail(status);
  return 2;
}

// INVALID_ARGUMENT naming `flag` unless lo <= value <= hi.
inline absl::Status CheckFlagRange(const char* flag, int64_t value, int64_t lo, int64_t hi) {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " must be in [", lo, ", ", hi, "], got ", value));
}

}  // namespace fucina::cli

#endif  // FUCINA_TOOLS_COMMAND_STATUS_H_
