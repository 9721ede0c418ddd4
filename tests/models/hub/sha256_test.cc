// SHA-256 against the FIPS 180-4 example vectors and lengths around the padding boundaries
// (expected digests from Python's hashlib), fed whole and in odd-sized pieces.
#include "models/hub/sha256.h"

#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/models/gguf/gguf_test_util.h"

namespace fucina {
namespace {

using ::testing::HasSubstr;

TEST(Sha256Test, FipsVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + 3) % 256);
  return s;
}

struct Vector {
  size_t length;
  const char* hex;
};

// 55 and 56 bytes straddle the point where the length no longer fits in the last block; 63, 64,
// 65, 119 and 120 the block boundaries.
constexpr Vector kPaddingVectors[] = {
    {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
    {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
    {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
    {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
    {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
    {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
    {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
    {1000, "1e9bc38cbf860b9ec31918b065f9b52476c549a782e0e7990bed8ce3868d2371"},
};

TEST(Sha256Test, LengthsAroundThePaddingBoundaries) {
  for (const Vector& v : kPaddingVectors) {
    EXPECT_EQ(Sha256Hex(Pattern(v.length)), v.hex) << v.length << " bytes";
  }
}

TEST(Sha256Test, PiecewiseUpdatesMatchAndFinishResets) {
  const std::string data = Pattern(1000);
  for (size_t piece : {1, 3, 63, 64, 65, 200}) {
    Sha256 hasher;
    for (size_t i = 0; i < data.size(); i += piece) {
      hasher.Update(std::string_view(data).substr(i, piece));
    }
    EXPECT_EQ(DigestHex(hasher.Finish()), kPaddingVectors[7].hex) << "pieces of " << piece;
    // Finish() leaves the hasher ready for a new message.
    hasher.Update("abc");
    EXPECT_EQ(DigestHex(hasher.Finish()),
              "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  }
}

TEST(Sha256Test, FileDigestAndMissingFile) {
  gguf::testing::ScratchDir dir;
  const std::string path = dir.File("data.bin");
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(1000000, 'a');
  }
  auto hex = Sha256FileHex(path);
  ASSERT_TRUE(hex.ok()) << hex.status();
  EXPECT_EQ(*hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  auto missing = Sha256FileHex(dir.File("missing.bin"));
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("missing.bin"));
}

}  // namespace
}  // namespace fucina
