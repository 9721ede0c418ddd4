// Taking one member out of a zip archive: archives written here byte by byte (so each field can
// be made to lie), deflated with zlib; the member read back must match, and every lie must end
// in an error that names it. Python's zipfile writes the archives of the end-to-end test
// (tests/tools/pull_cli_test.py), an independent writer.
#include "models/hub/zip_member.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fucina {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct Member {
  std::string name;
  std::string data;          // uncompressed
  uint16_t method = 0;       // 0 stored, 8 deflate, anything else written as stored bytes
  uint16_t flags = 0;
  // Overrides of what the central directory records.
  std::optional<uint32_t> crc = {}, compressed = {}, uncompressed = {}, local_offset = {};
  // Replaces the compressed bytes written.
  std::optional<std::string> payload = {};
};

void Put16(std::string* s, uint32_t v) {
  s->push_back(static_cast<char>(v & 0xff));
  s->push_back(static_cast<char>(v >> 8 & 0xff));
}
void Put32(std::string* s, uint32_t v) {
  Put16(s, v & 0xffff);
  Put16(s, v >> 16);
}

std::string Deflate(const std::string& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

uint32_t Crc(const std::string& data) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
}

// A single-disk zip: local headers and data, the central directory, the end record.
std::string BuildZip(const std::vector<Member>& members, std::string comment = "") {
  std::string zip, central;
  for (const Member& m : members) {
    const std::string payload = m.payload ? *m.payload
                                : m.method == 8 ? Deflate(m.data)
                                                : m.data;
    const uint32_t crc = m.crc.value_or(Crc(m.data));
    const uint32_t csize = m.compressed.value_or(static_cast<uint32_t>(payload.size()));
    const uint32_t usize = m.uncompressed.value_or(static_cast<uint32_t>(m.data.size()));
    const uint32_t offset = m.local_offset.value_or(static_cast<uint32_t>(zip.size()));
    Put32(&zip, 0x04034b50);
    Put16(&zip, 20);
    Put16(&zip, m.flags);
    Put16(&zip, m.method);
    Put32(&zip, 0);  // time, date
    Put32(&zip, crc);
    Put32(&zip, csize);
    Put32(&zip, usize);
    Put16(&zip, static_cast<uint32_t>(m.name.size()));
    Put16(&zip, 0);
    zip += m.name + payload;

    Put32(&central, 0x02014b50);
    Put16(&central, 20);
    Put16(&central, 20);
    Put16(&central, m.flags);
    Put16(&central, m.method);
    Put32(&central, 0);
    Put32(&central, crc);
    Put32(&central, csize);
    Put32(&central, usize);
    Put16(&central, static_cast<uint32_t>(m.name.size()));
    Put32(&central, 0);  // extra and comment lengths
    Put32(&central, 0);  // disk, internal attributes
    Put32(&central, 0);  // external attributes
    Put32(&central, offset);
    central += m.name;
  }
  const uint32_t central_offset = static_cast<uint32_t>(zip.size());
  zip += central;
  Put32(&zip, 0x06054b50);
  Put32(&zip, 0);  // disks
  Put16(&zip, static_cast<uint32_t>(members.size()));
  Put16(&zip, static_cast<uint32_t>(members.size()));
  Put32(&zip, static_cast<uint32_t>(central.size()));
  Put32(&zip, central_offset);
  Put16(&zip, static_cast<uint32_t>(comment.size()));
  return zip + comment;
}

std::string Random(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(size, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class ZipMemberTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("zip_member_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Writes `zip`, extracts `member`; on success returns the member's bytes.
  absl::StatusOr<std::string> Extract(const std::string& zip, const std::string& member) {
    const std::string zip_path = (dir_ / "a.whl").string();
    const std::string out_path = (dir_ / "out").string();
    std::ofstream(zip_path, std::ios::binary | std::ios::trunc) << zip;
    const int fd = ::open(out_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    EXPECT_GE(fd, 0);
    auto n = ExtractZipMember(zip_path, member, fd);
    ::close(fd);
    if (!n.ok()) return n.status();
    std::ifstream in(out_path, std::ios::binary);
    std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(static_cast<int64_t>(out.size()), *n);
    return out;
  }

  std::filesystem::path dir_;
};

TEST_F(ZipMemberTest, StoredAndDeflatedMembersComeOutWhole) {
  // Larger than the 1 MiB read and inflate buffers, half compressible, so chunks cross.
  std::string big = Random(1 << 20, 1) + std::string(2 << 20, 'x') + Random(12345, 2);
  const std::string small = "hello";
  const std::string zip = BuildZip({{.name = "pkg/__init__.py", .data = small},
                                    {.name = "pkg/model.gguf", .data = big, .method = 8},
                                    {.name = "pkg/raw.bin", .data = big}},
                                   "a comment at the end");
  EXPECT_EQ(Extract(zip, "pkg/model.gguf").value_or(""), big);
  EXPECT_EQ(Extract(zip, "pkg/raw.bin").value_or(""), big);
  EXPECT_EQ(Extract(zip, "pkg/__init__.py").value_or(""), small);
  EXPECT_EQ(Extract(BuildZip({{.name = "empty", .data = "", .method = 8}}), "empty").value_or("?"),
            "");
}

TEST_F(ZipMemberTest, AMissingMemberNamesSomeThatExist) {
  auto out = Extract(BuildZip({{.name = "a/one", .data = "1"}, {.name = "a/two", .data = "2"}}),
                     "a/three");
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(out.status().message(),
              AllOf(HasSubstr("no member 'a/three'"), HasSubstr("2 members"),
                    HasSubstr("'a/one', 'a/two'")));
}

TEST_F(ZipMemberTest, DamagedDataIsCaughtBySizeAndCrc) {
  const std::string data = Random(100000, 3);
  auto bad_crc = Extract(BuildZip({{.name = "m", .data = data, .crc = Crc(data) ^ 1}}), "m");
  EXPECT_EQ(bad_crc.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad_crc.status().message(), HasSubstr("CRC-32 mismatch"));

  std::string deflated = Deflate(data);
  auto truncated = Extract(
      BuildZip({{.name = "m", .data = data, .method = 8, .payload = deflated.substr(0, 5000)}}),
      "m");
  EXPECT_THAT(truncated.status().message(), HasSubstr("ends before the end of its stream"));

  deflated[deflated.size() / 2] ^= 0x55;
  auto garbled = Extract(BuildZip({{.name = "m", .data = data, .method = 8, .payload = deflated}}),
                         "m");
  EXPECT_EQ(garbled.status().code(), absl::StatusCode::kDataLoss);

  // More output than recorded stops at the recorded size instead of writing on.
  auto longer = Extract(
      BuildZip({{.name = "m", .data = std::string(5000, 'a'), .method = 8, .uncompressed = 10}}),
      "m");
  EXPECT_THAT(longer.status().message(), HasSubstr("inflates to more than its recorded 10 bytes"));
}

TEST_F(ZipMemberTest, AbsurdSizesAndOffsetsAreRejectedBeforeReading) {
  auto expand = Extract(BuildZip({{.name = "m", .data = "abc", .method = 8,
                                   .uncompressed = 0xfffffff0u}}),
                        "m");
  EXPECT_THAT(expand.status().message(), HasSubstr("more than deflate can expand to"));

  auto overrun = Extract(BuildZip({{.name = "m", .data = "abc", .compressed = 1000000,
                                    .uncompressed = 1000000}}),
                         "m");
  EXPECT_THAT(overrun.status().message(), HasSubstr("run into the central directory"));

  auto stored_sizes = Extract(BuildZip({{.name = "m", .data = "abc", .uncompressed = 4}}), "m");
  EXPECT_THAT(stored_sizes.status().message(), HasSubstr("stored, yet its sizes differ"));

  auto offset = Extract(BuildZip({{.name = "m", .data = "abc", .local_offset = 999999}}), "m");
  EXPECT_THAT(offset.status().message(), HasSubstr("is past the central directory"));

  auto zip64 = Extract(BuildZip({{.name = "m", .data = "abc", .compressed = 0xffffffffu}}), "m");
  EXPECT_EQ(zip64.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(zip64.status().message(), HasSubstr("Zip64"));

  // An end record pointing its central directory past itself.
  std::string zip = BuildZip({{.name = "m", .data = "abc"}});
  zip[zip.size() - 6] = static_cast<char>(0x7f);  // the directory offset's low byte
  EXPECT_THAT(Extract(zip, "m").status().message(), HasSubstr("runs past its end record"));
}

TEST_F(ZipMemberTest, UnsupportedMembersAndNonZipsAreClearErrors) {
  auto method = Extract(BuildZip({{.name = "m", .data = "abc", .method = 12}}), "m");
  EXPECT_EQ(method.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(method.status().message(),
              AllOf(HasSubstr("member 'm'"), HasSubstr("compression method 12")));

  auto encrypted = Extract(BuildZip({{.name = "m", .data = "abc", .flags = 1}}), "m");
  EXPECT_THAT(encrypted.status().message(), HasSubstr("encrypted"));

  EXPECT_THAT(Extract("not a zip at all, just some text long enough", "m").status().message(),
              HasSubstr("no end of central directory record"));
  EXPECT_THAT(Extract("PK", "m").status().message(), HasSubstr("too short"));
}

}  // namespace
}  // namespace fucina
