// SHA-256 over byte ranges of files, for moving model files between cluster processes
// (coordinator/model_source.h serves them, worker/model_fetch.h checks and caches them), on the
// project's one hasher (models/hub/sha256.h).
#ifndef FUCINA_WORKER_FILE_DIGEST_H_
#define FUCINA_WORKER_FILE_DIGEST_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "models/hub/sha256.h"

namespace fucina {

// SHA-256 of bytes [offset, offset + size) of the open file `fd`, read with pread (not mapped:
// a file truncated meanwhile is an error here, not SIGBUS). DATA_LOSS naming `what` when the
// file ends before the range does.
absl::StatusOr<Sha256::Digest> Sha256OfRange(int fd, uint64_t offset, uint64_t size,
                                             const std::string& what);

// The digest whose lowercase hex (DigestHex's) or raw 32 bytes is `text`; false when it is not
// one.
bool DigestFromHex(std::string_view text, Sha256::Digest* out);
bool DigestFromBytes(std::string_view raw, Sha256::Digest* out);

}  // namespace fucina

#endif  // FUCINA_WORKER_FILE_DIGEST_H_
