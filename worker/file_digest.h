// SHA-256 over byte ranges of files, for moving model files between cluster processes
// (coordinator/model_source.h serves them, worker/model_fetch.h checks and caches them).
//
// OpenSSL's libcrypto rather than models/hub/sha256.h: the transfer hashes every byte it moves
// and every cached byte it reuses (gigabytes per load), and libcrypto's SHA-NI / AVX2 paths are
// several times faster. gRPC already links libcrypto.
#ifndef FUCINA_WORKER_FILE_DIGEST_H_
#define FUCINA_WORKER_FILE_DIGEST_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fucina {

inline constexpr size_t kSha256Size = 32;
using Sha256Digest = std::array<uint8_t, kSha256Size>;

// Incremental SHA-256: Update any number of times, then Finish once.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(const void* data, size_t size);
  Sha256Digest Finish();

 private:
  void* ctx_;  // EVP_MD_CTX
};

// SHA-256 of bytes [offset, offset + size) of the open file `fd`, read with pread (not mapped:
// a file truncated meanwhile is an error here, not SIGBUS). DATA_LOSS naming `what` when the
// file ends before the range does.
absl::StatusOr<Sha256Digest> Sha256OfRange(int fd, uint64_t offset, uint64_t size,
                                           const std::string& what);

// Lowercase hex of a digest (64 characters).
std::string DigestToHex(const Sha256Digest& digest);
// The digest whose hex (or raw 32 bytes, `raw`) is `text`; false when it is not one.
bool DigestFromHex(std::string_view text, Sha256Digest* out);
bool DigestFromBytes(std::string_view raw, Sha256Digest* out);

}  // namespace fucina

#endif  // FUCINA_WORKER_FILE_DIGEST_H_
