#include "worker/file_digest.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace fucina {

absl::StatusOr<Sha256::Digest> Sha256OfRange(int fd, uint64_t offset, uint64_t size,
                                             const std::string& what) {
  constexpr size_t kBlock = 1 << 20;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kBlock]);
  Sha256 hasher;
  uint64_t done = 0;
  while (done < size) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kBlock, size - done));
    const ssize_t got = ::pread(fd, buf.get(), want, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      return absl::ErrnoToStatus(err, absl::StrCat(what, ": read at ", offset + done));
    }
    if (got == 0) {
      return absl::DataLossError(absl::StrCat(what, ": the file ends at ", offset + done,
                                              ", inside [", offset, ", ", offset + size, ")"));
    }
    hasher.Update(buf.get(), static_cast<size_t>(got));
    done += static_cast<uint64_t>(got);
  }
  return hasher.Finish();
}

bool DigestFromHex(std::string_view text, Sha256::Digest* out) {
  if (text.size() != 2 * Sha256::kDigestSize) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < Sha256::kDigestSize; ++i) {
    const int hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

bool DigestFromBytes(std::string_view raw, Sha256::Digest* out) {
  if (raw.size() != Sha256::kDigestSize) return false;
  std::memcpy(out->data(), raw.data(), Sha256::kDigestSize);
  return true;
}

}  // namespace fucina
