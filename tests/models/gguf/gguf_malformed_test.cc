// One test per class of malformed GGUF file (covering every handcrafted class of llama.cpp's
// tests/test-gguf.cpp and more): each must be rejected with InvalidArgument and a message naming
// the file and the offset, key or tensor at fault.
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/gguf/gguf.h"
#include "tests/models/gguf/gguf_test_util.h"

namespace fucina::gguf {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::ByteBuilder;

constexpr char kName[] = "handmade.gguf";
constexpr uint32_t kU32 = 4, kI32 = 5, kString = 8, kArray = 9, kBool = 7;
constexpr uint32_t kF32Type = 0, kQ4_0Type = 2, kI8Type = 24, kI64Type = 27;

absl::StatusOr<std::unique_ptr<File>> Parse(const ByteBuilder& b) {
  return File::FromBytes(b.bytes(), kName);
}

// Rejected with InvalidArgument, the file name and every fragment in `parts`.
void ExpectRejected(const ByteBuilder& b, const std::vector<std::string>& parts) {
  absl::StatusOr<std::unique_ptr<File>> f = Parse(b);
  ASSERT_FALSE(f.ok()) << "accepted a malformed file";
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(kName));
  for (const std::string& p : parts) {
    EXPECT_THAT(std::string(f.status().message()), HasSubstr(p));
  }
}

// A valid file: 2 KVs, 2 tensors (f32 [4, 2] = 32 bytes, q4_0 [32] = 18 bytes), data.
ByteBuilder ValidFile() {
  ByteBuilder b;
  b.Header(2, 2).KvStr("general.architecture", "llama").KvU32("llama.block_count", 2);
  b.Tensor("a", {4, 2}, kF32Type, 0).Tensor("b", {32}, kQ4_0Type, 32).PadTo(32);
  for (int i = 0; i < 32 + 18; ++i) b.U8(static_cast<uint8_t>(i));
  return b;
}

TEST(GgufMalformed, ValidBaselineParses) {
  absl::StatusOr<std::unique_ptr<File>> f = Parse(ValidFile());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const TensorInfo* b = (*f)->FindTensor("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->nbytes, 18u);
  EXPECT_EQ(b->data[0], 32);  // Data bytes are their own index within the data section.
  EXPECT_EQ((*f)->data_offset() % 32, 0u);
}

TEST(GgufMalformed, EveryTruncationIsRejected) {
  const std::vector<uint8_t> full = ValidFile().bytes();
  for (size_t n = 0; n < full.size(); ++n) {
    absl::StatusOr<std::unique_ptr<File>> f =
        File::FromBytes(std::span<const uint8_t>(full.data(), n), kName);
    ASSERT_FALSE(f.ok()) << "prefix of " << n << " bytes accepted";
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(f.status().message()), AllOf(HasSubstr(kName), HasSubstr("offset")));
  }
}

TEST(GgufMalformed, EmptyFile) { ExpectRejected(ByteBuilder(), {"truncated", "magic"}); }

TEST(GgufMalformed, HeaderOnlyIsValid) {
  ByteBuilder b;
  b.Header(0, 0);
  ASSERT_TRUE(Parse(b).ok());
}

TEST(GgufMalformed, BadMagic) {
  ByteBuilder b;
  b.Raw("FUGG").U32(3).U64(0).U64(0);
  ExpectRejected(b, {"bad magic", "offset 0"});
}

TEST(GgufMalformed, Version0) { ExpectRejected(ByteBuilder().Header(0, 0, 0), {"version 0"}); }
TEST(GgufMalformed, Version1) {
  ExpectRejected(ByteBuilder().Header(0, 0, 1), {"version 1 is not supported"});
}
TEST(GgufMalformed, FutureVersion) {
  ExpectRejected(ByteBuilder().Header(0, 0, 4), {"unsupported GGUF version 4"});
}
TEST(GgufMalformed, BigEndian) {
  ExpectRejected(ByteBuilder().Header(0, 0, 0x03000000u), {"big-endian", "offset 4"});
}
TEST(GgufMalformed, Version2Accepted) { EXPECT_TRUE(Parse(ByteBuilder().Header(0, 0, 2)).ok()); }

TEST(GgufMalformed, TensorCountHuge) {
  ExpectRejected(ByteBuilder().Header(UINT64_MAX, 0), {"tensor count", "offset 8"});
}
TEST(GgufMalformed, KvCountHuge) {
  ExpectRejected(ByteBuilder().Header(0, UINT64_MAX), {"metadata count", "offset 16"});
}
TEST(GgufMalformed, KvCountBeyondRemainingBytes) {
  ByteBuilder b;
  b.Header(0, 1000).KvU32("a.b", 1);
  ExpectRejected(b, {"metadata count 1000 cannot fit"});
}

TEST(GgufMalformed, KeySizeHuge) {
  ByteBuilder b;
  b.Header(0, 1).U64(UINT64_MAX).Raw("x").U32(kU32).U32(0);
  ExpectRejected(b, {"key of metadata entry 0", "offset 24"});
}
TEST(GgufMalformed, KeyLongerThanLimit) {
  ByteBuilder b;
  b.Header(0, 1).KvU32(std::string(kMaxKeyLength + 1, 'k'), 1);
  ExpectRejected(b, {"exceeds the limit of 65535"});
}
TEST(GgufMalformed, EmptyKey) {
  ByteBuilder b;
  b.Header(0, 1).KvU32("", 1);
  ExpectRejected(b, {"empty key"});
}
TEST(GgufMalformed, NonUtf8Key) {
  ByteBuilder b;
  b.Header(0, 1).KvU32("bad\xC3\x28key", 1);
  ExpectRejected(b, {"UTF-8"});
}
TEST(GgufMalformed, InvalidValueType) {
  ByteBuilder b;
  b.Header(0, 1).Key("k.x", 13).U8(0);
  ExpectRejected(b, {"key 'k.x': invalid value type 13", "offset 35"});
}
TEST(GgufMalformed, InvalidArrayElementType) {
  ByteBuilder b;
  b.Header(0, 1).Key("k.arr", kArray).U32(99).U64(1).U8(0);
  ExpectRejected(b, {"k.arr", "invalid array element type 99"});
}
TEST(GgufMalformed, InvalidNestedArrayElementType) {
  ByteBuilder b;
  b.Header(0, 1).Key("k.nest", kArray).U32(kArray).U64(1).U32(77).U64(0);
  ExpectRejected(b, {"k.nest", "invalid array element type 77"});
}
TEST(GgufMalformed, StringLengthAbsurd) {
  ByteBuilder b;
  b.Header(0, 1).Key("k.s", kString).U64(uint64_t{1} << 60).Raw("abc");
  ExpectRejected(b, {"k.s", "exceeds the 3 bytes remaining"});
}
TEST(GgufMalformed, ArrayLengthBeyondRemainingBytes) {
  ByteBuilder b;
  b.Header(0, 1).Key("k.a", kArray).U32(kU32).U64(uint64_t{1} << 62).U32(1).U32(2);
  ExpectRejected(b, {"k.a", "array of 4611686018427387904 uint32 elements cannot fit"});
}
TEST(GgufMalformed, ArrayLengthOverflowsByteCount) {
  // count * 8 wraps to 8 in 64-bit arithmetic: must still be rejected.
  ByteBuilder b;
  b.Header(0, 1).Key("k.a", kArray).U32(10).U64((uint64_t{1} << 61) + 1).U64(5);
  ExpectRejected(b, {"k.a", "cannot fit"});
}
TEST(GgufMalformed, StringArrayTruncatedInside) {
  ByteBuilder b;
  b.Header(0, 1).Key("k.toks", kArray).U32(kString).U64(2).Str("ok").U64(50).Raw("short");
  ExpectRejected(b, {"k.toks", "length 50 exceeds"});
}
TEST(GgufMalformed, ArrayDepthBomb) {
  ByteBuilder b;
  b.Header(0, 1).Key("k.bomb", kArray);
  for (int i = 0; i < 64; ++i) b.U32(kArray).U64(1);
  b.U32(kU32).U64(0);
  ExpectRejected(b, {"k.bomb", "nested deeper than 8"});
}
TEST(GgufMalformed, BoolNotZeroOrOne) {
  ByteBuilder b;
  b.Header(0, 1).Key("k.flag", kBool).U8(2);
  ExpectRejected(b, {"k.flag", "bool byte is 2"});
}
TEST(GgufMalformed, DuplicateKey) {
  ByteBuilder b;
  b.Header(0, 2).KvU32("k.dup", 1).KvU32("k.dup", 2);
  ExpectRejected(b, {"duplicate key 'k.dup'"});
}
TEST(GgufMalformed, AlignmentNotPowerOfTwo) {
  ByteBuilder b;
  b.Header(0, 1).KvU32("general.alignment", 13);
  ExpectRejected(b, {"general.alignment", "13, not a nonzero power of two"});
}
TEST(GgufMalformed, AlignmentZero) {
  ByteBuilder b;
  b.Header(0, 1).KvU32("general.alignment", 0);
  ExpectRejected(b, {"general.alignment", "not a nonzero power of two"});
}
TEST(GgufMalformed, AlignmentWrongType) {
  ByteBuilder b;
  b.Header(0, 1).Key("general.alignment", kI32).I32(32);
  ExpectRejected(b, {"general.alignment", "type int32, expected uint32"});
}

// Tensor-info classes: one tensor of `dims`/`type` at `offset`, 64 bytes of data.
ByteBuilder OneTensor(const std::string& name, const std::vector<int64_t>& dims, uint32_t type,
                      uint64_t offset = 0) {
  ByteBuilder b;
  b.Header(1, 0).Tensor(name, dims, type, offset).PadTo(32).Fill(64);
  return b;
}

TEST(GgufMalformed, TensorNameTooLong) {
  ExpectRejected(OneTensor(std::string(65, 't'), {4}, kF32Type), {"tensor 0 name is 65 bytes"});
}
TEST(GgufMalformed, TensorNameMaxLengthOk) {
  EXPECT_TRUE(Parse(OneTensor(std::string(64, 't'), {4}, kF32Type)).ok());
}
TEST(GgufMalformed, TensorNameEmpty) {
  ExpectRejected(OneTensor("", {4}, kF32Type), {"empty name of tensor 0"});
}
TEST(GgufMalformed, TensorNameNonUtf8) {
  ExpectRejected(OneTensor("w\xFF", {4}, kF32Type), {"name of tensor 0", "UTF-8"});
}
TEST(GgufMalformed, TensorNameSizeHuge) {
  ByteBuilder b;
  b.Header(1, 0).U64(UINT64_MAX).Raw("x").U32(1).I64(4).U32(0).U64(0).PadTo(32).Fill(32);
  ExpectRejected(b, {"name of tensor 0", "offset 24"});
}
TEST(GgufMalformed, NDimsZero) {
  ByteBuilder b;
  b.Header(1, 0).Str("w").U32(0).U32(0).U64(0).U64(0).PadTo(32).Fill(32);
  ExpectRejected(b, {"tensor 'w'", "n_dims 0"});
}
TEST(GgufMalformed, NDimsFive) {
  ExpectRejected(OneTensor("w", {1, 1, 1, 1, 1}, kF32Type), {"tensor 'w'", "n_dims 5 outside"});
}
TEST(GgufMalformed, NegativeDim) {
  ExpectRejected(OneTensor("w", {4, -1}, kF32Type), {"tensor 'w'", "dim 1 is -1"});
}
TEST(GgufMalformed, ZeroDim) {
  ExpectRejected(OneTensor("w", {4, 0}, kF32Type), {"tensor 'w'", "dim 1 is 0"});
}
TEST(GgufMalformed, ElementCountOverflow) {
  const int64_t big = 4 * int64_t{INT32_MAX};
  ExpectRejected(OneTensor("w", {big, big, big}, kF32Type), {"tensor 'w'", "overflows int64"});
}
TEST(GgufMalformed, ByteSizeOverflow) {
  // 2^61 i64 elements fit int64 as a count but not as bytes.
  ExpectRejected(OneTensor("w", {int64_t{1} << 31, int64_t{1} << 30}, kI64Type),
                 {"tensor 'w'", "byte size overflows"});
}
TEST(GgufMalformed, UnknownTypeId) {
  ExpectRejected(OneTensor("w", {32}, 40), {"tensor 'w'", "unknown or removed ggml type 40"});
}
TEST(GgufMalformed, RemovedTypeIds) {
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u}) {
    ExpectRejected(OneTensor("w", {256}, id), {"unknown or removed ggml type"});
  }
}
TEST(GgufMalformed, RowNotMultipleOfBlock) {
  ExpectRejected(OneTensor("w", {33}, kQ4_0Type), {"tensor 'w'", "row length 33", "q4_0"});
}
TEST(GgufMalformed, OffsetHuge) {
  ExpectRejected(OneTensor("w", {4}, kF32Type, UINT64_MAX), {"tensor 'w'", "not a multiple"});
}
TEST(GgufMalformed, OffsetAlignedButOutsideData) {
  ExpectRejected(OneTensor("w", {4}, kF32Type, uint64_t{1} << 63),
                 {"tensor 'w'", "outside the 64-byte data section"});
}
TEST(GgufMalformed, OffsetMisaligned) {
  ExpectRejected(OneTensor("w", {4}, kF32Type, 8), {"tensor 'w'", "offset 8 is not a multiple"});
}
TEST(GgufMalformed, InconsistentAlignment) {
  // general.alignment 64 but offsets laid out for 32.
  ByteBuilder b;
  b.Header(2, 1).KvU32("general.alignment", 64);
  b.Tensor("a", {4}, kF32Type, 0).Tensor("b", {4}, kF32Type, 32).PadTo(64).Fill(128);
  ExpectRejected(b, {"tensor 'b'", "alignment 64"});
}
TEST(GgufMalformed, CustomAlignmentOneAccepted) {
  ByteBuilder b;
  b.Header(2, 1).KvU32("general.alignment", 1);
  b.Tensor("a", {3}, kI8Type, 0).Tensor("b", {5}, kI8Type, 3).Fill(8);
  absl::StatusOr<std::unique_ptr<File>> f = Parse(b);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->alignment(), 1u);
  EXPECT_EQ((*f)->FindTensor("b")->data, (*f)->FindTensor("a")->data + 3);
}
TEST(GgufMalformed, DuplicateTensorName) {
  ByteBuilder b;
  b.Header(2, 0).Tensor("w", {4}, kF32Type, 0).Tensor("w", {4}, kF32Type, 32).PadTo(32).Fill(64);
  ExpectRejected(b, {"duplicate tensor name 'w'"});
}
TEST(GgufMalformed, OverlappingTensors) {
  ByteBuilder b;
  b.Header(2, 0).Tensor("a", {16}, kF32Type, 0).Tensor("b", {4}, kF32Type, 32).PadTo(32).Fill(96);
  ExpectRejected(b, {"tensor 'b' data at 32 overlaps tensor 'a' [0, 64)"});
}
TEST(GgufMalformed, NotEnoughData) {
  ByteBuilder b;
  b.Header(1, 0).Tensor("w", {8}, kF32Type, 0).PadTo(32).Fill(31);
  ExpectRejected(b, {"tensor 'w'", "[0, 32) lies outside the 31-byte data section"});
}
TEST(GgufMalformed, DataSectionStartsPastEnd) {
  ByteBuilder b;
  b.Header(1, 0).Tensor("w", {8}, kF32Type, 0);  // No padding, no data.
  ExpectRejected(b, {"data section would start"});
}
TEST(GgufMalformed, MemSizeOverflow) {
  // Two tensors whose sizes each fit but whose sum wraps a naive size accumulator.
  const int64_t big = 0x7FFFFFFFFFFFFFC0;
  ByteBuilder b;
  b.Header(2, 0).Tensor("a", {big}, kI8Type, 0).Tensor("b", {big}, kI8Type, uint64_t(big));
  b.PadTo(32).Fill(32);
  ExpectRejected(b, {"tensor 'a'", "outside the 32-byte data section"});
}

TEST(GgufMalformed, MissingFileIsNotFound) {
  absl::StatusOr<std::unique_ptr<File>> f = File::Open("/nonexistent-dir/none.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("none.gguf"));
}

TEST(GgufMalformed, Utf8Validator) {
  EXPECT_TRUE(IsValidUtf8("plain.ascii"));
  EXPECT_TRUE(IsValidUtf8("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // Overlong '/'.
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));      // Surrogate.
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // Above U+10FFFF.
  EXPECT_FALSE(IsValidUtf8("\xE2\x82"));          // Cut short.
  EXPECT_FALSE(IsValidUtf8("\x80"));
}

}  // namespace
}  // namespace fucina::gguf
