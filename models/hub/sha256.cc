#include "models/hub/sha256.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <openssl/evp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fucina {

// An EVP digest context; freed with the hasher.
struct Sha256::Context {
  struct Free {
    void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> ctx{EVP_MD_CTX_new()};
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  EVP_DigestInit_ex(context_->ctx.get(), EVP_sha256(), nullptr);
}

Sha256::~Sha256() = default;

void Sha256::Update(const void* data, size_t size) {
  EVP_DigestUpdate(context_->ctx.get(), data, size);
}

Sha256::Digest Sha256::Finish() {
  Digest digest{};
  unsigned int size = 0;
  EVP_DigestFinal_ex(context_->ctx.get(), digest.data(), &size);
  EVP_DigestInit_ex(context_->ctx.get(), EVP_sha256(), nullptr);
  return digest;
}

std::string DigestHex(const Sha256::Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * digest.size());
  for (uint8_t byte : digest) {
    hex.push_back(kHex[byte >> 4]);
    hex.push_back(kHex[byte & 15]);
  }
  return hex;
}

std::string Sha256Hex(std::string_view data) {
  Sha256 hasher;
  hasher.Update(data);
  return DigestHex(hasher.Finish());
}

absl::StatusOr<std::string> Sha256FileHex(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  Sha256 hasher;
  std::vector<uint8_t> chunk(1 << 20);
  while (true) {
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(err)));
    }
    hasher.Update(chunk.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  return DigestHex(hasher.Finish());
}

}  // namespace fucina
