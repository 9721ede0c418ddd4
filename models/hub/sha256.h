// SHA-256 (FIPS 180-4): the one hasher of the project. It verifies downloaded model files
// (`fucina pull`) and every byte of model moved to or cached by a worker (worker/model_fetch.h).
//
// OpenSSL's libcrypto underneath (gRPC links it already): its SHA-NI / AVX2 paths hash several
// times faster than portable code, which counts when a worker re-checks gigabytes of cache on
// every load.
#ifndef FUCINA_MODELS_HUB_SHA256_H_
#define FUCINA_MODELS_HUB_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
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
  ~Sha256();
  void Update(const void* data, size_t size);
  void Update(std::string_view data) { Update(data.data(), data.size()); }
  // Pads, returns the digest and resets the hasher to its initial state.
  Digest Finish();

 private:
  struct Context;
  std::unique_ptr<Context> context_;
};

// Lowercase hexadecimal of a digest.
std::string DigestHex(const Sha256::Digest& digest);
// Lowercase hexadecimal SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);
// Lowercase hexadecimal SHA-256 of the file's whole content; an error names the file.
absl::StatusOr<std::string> Sha256FileHex(const std::string& path);

}  // namespace fucina

#endif  // FUCINA_MODELS_HUB_SHA256_H_
