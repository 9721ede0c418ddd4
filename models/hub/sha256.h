// SHA-256 (FIPS 180-4), used to verify downloaded model files.
//
// Our own small implementation rather than OpenSSL's: the build does not otherwise need the
// OpenSSL development headers, and a checksum over a local file is all that is required here
// (no constant-time or hardware-accelerated paths are needed for that).
#ifndef FUCINA_MODELS_HUB_SHA256_H_
#define FUCINA_MODELS_HUB_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace fucina {

// Incremental hasher: Update() any number of times, then Finish() once.
class Sha256 {
 public:
  static constexpr size_t kDigestSize = 32;
  using Digest = std::array<uint8_t, kDigestSize>;

  Sha256();
  void Update(const void* data, size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  // Pads, returns the digest and resets the hasher to its initial state.
  Digest Finish();

 private:
  void Compress(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lowercase hexadecimal of a digest.
std::string DigestHex(const Sha256::Digest& digest);
// Lowercase hexadecimal SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);
// Lowercase hexadecimal SHA-256 of the file's whole content; an error names the file.
absl::StatusOr<std::string> Sha256FileHex(const std::string& path);

}  // namespace fucina

#endif  // FUCINA_MODELS_HUB_SHA256_H_
