#include "models/hub/zip_member.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

// Record layouts (PKWARE APPNOTE 4.3): fixed sizes and signatures.
constexpr uint32_t kEndSignature = 0x06054b50;      // end of central directory
constexpr uint32_t kCentralSignature = 0x02014b50;  // central directory file header
constexpr uint32_t kLocalSignature = 0x04034b50;    // local file header
constexpr int64_t kEndSize = 22;
constexpr int64_t kCentralSize = 46;
constexpr int64_t kLocalSize = 30;
constexpr int64_t kMaxComment = 0xffff;
// Deflate cannot expand a byte to more than about 1032 (258-byte matches in 2-bit codes); a
// member claiming more is lying about its size.
constexpr int64_t kMaxDeflateRatio = 1032;
constexpr size_t kChunk = 1 << 20;

uint16_t U16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t U32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

class Reader {
 public:
  Reader(std::string path, std::string member) : path_(std::move(path)), member_(member) {}

  absl::Status Open() {
    fd_.fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd_.fd < 0 || ::fstat(fd_.fd, &st) != 0) {
      return absl::NotFoundError(absl::StrCat("cannot open ", path_, ": ", std::strerror(errno)));
    }
    size_ = st.st_size;
    return absl::OkStatus();
  }

  // Reads exactly `n` bytes at `offset`, which the caller has checked lie inside the file.
  absl::Status ReadAt(int64_t offset, void* out, size_t n) {
    auto* p = static_cast<uint8_t*>(out);
    while (n > 0) {
      const ssize_t r = ::pread(fd_.fd, p, n, offset);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return Corrupt(absl::StrCat("cannot read at offset ", offset));
      p += r, offset += r, n -= static_cast<size_t>(r);
    }
    return absl::OkStatus();
  }

  absl::Status Corrupt(const std::string& why) const {
    return absl::DataLossError(absl::StrCat("zip archive ", path_, ": ", why));
  }
  absl::Status Unsupported(const std::string& why) const {
    return absl::UnimplementedError(
        absl::StrCat("zip archive ", path_, ", member '", member_, "': ", why));
  }
  absl::Status BadMember(const std::string& why) const {
    return absl::DataLossError(
        absl::StrCat("zip archive ", path_, ", member '", member_, "': ", why));
  }

  const std::string& path() const { return path_; }
  const std::string& member() const { return member_; }
  int64_t size() const { return size_; }
  int fd() const { return fd_.fd; }

 private:
  std::string path_;
  std::string member_;
  Fd fd_;
  int64_t size_ = 0;
};

struct Entry {
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  int64_t compressed = 0;
  int64_t uncompressed = 0;
  int64_t local_offset = 0;
};

struct Directory {
  int64_t offset = 0;  // where the central directory starts: every member's data lies before
  std::vector<uint8_t> bytes;
  uint16_t count = 0;
};

absl::StatusOr<Directory> ReadDirectory(Reader& r) {
  if (r.size() < kEndSize) return r.Corrupt("too short to be a zip file");
  // The end record sits at the end of the file, followed only by its comment.
  const int64_t tail_size = std::min(r.size(), kEndSize + kMaxComment);
  std::vector<uint8_t> tail(static_cast<size_t>(tail_size));
  if (absl::Status s = r.ReadAt(r.size() - tail_size, tail.data(), tail.size()); !s.ok()) {
    return s;
  }
  int64_t end = -1;
  for (int64_t i = tail_size - kEndSize; i >= 0 && end < 0; --i) {
    const uint8_t* p = tail.data() + i;
    if (U32(p) == kEndSignature && i + kEndSize + U16(p + 20) == tail_size) end = i;
  }
  if (end < 0) return r.Corrupt("no end of central directory record (not a zip file?)");
  const uint8_t* p = tail.data() + end;
  const int64_t end_offset = r.size() - tail_size + end;
  const uint16_t disk = U16(p + 4), directory_disk = U16(p + 6);
  const uint16_t disk_count = U16(p + 8), count = U16(p + 10);
  const uint32_t size = U32(p + 12), offset = U32(p + 16);
  if (count == 0xffff || size == 0xffffffff || offset == 0xffffffff) {
    return absl::UnimplementedError(
        absl::StrCat("zip archive ", r.path(), " is a Zip64 archive, which is not supported"));
  }
  if (disk != 0 || directory_disk != 0 || disk_count != count) {
    return absl::UnimplementedError(absl::StrCat(
        "zip archive ", r.path(), " spans several disks, which is not supported"));
  }
  if (static_cast<int64_t>(offset) + size > end_offset) {
    return r.Corrupt(absl::StrCat("the central directory (", size, " bytes at offset ", offset,
                                  ") runs past its end record at ", end_offset));
  }
  if (size > kMaxZipCentralDirectory) {
    return r.Corrupt(absl::StrCat("the central directory has ", size, " bytes, more than the ",
                                  kMaxZipCentralDirectory, " accepted"));
  }
  if (static_cast<int64_t>(count) * kCentralSize > size) {
    return r.Corrupt(absl::StrCat(count, " entries cannot fit a central directory of ", size,
                                  " bytes"));
  }
  Directory d;
  d.offset = offset;
  d.count = count;
  d.bytes.resize(size);
  if (absl::Status s = r.ReadAt(offset, d.bytes.data(), size); !s.ok()) return s;
  return d;
}

absl::StatusOr<Entry> FindEntry(Reader& r, const Directory& d) {
  std::vector<std::string> names;  // a few, for the error when the member is missing
  size_t pos = 0;
  for (uint16_t i = 0; i < d.count; ++i) {
    if (pos + kCentralSize > d.bytes.size() || U32(d.bytes.data() + pos) != kCentralSignature) {
      return r.Corrupt(absl::StrCat("central directory entry ", i, " is damaged"));
    }
    const uint8_t* p = d.bytes.data() + pos;
    const size_t name_size = U16(p + 28);
    const size_t next = pos + kCentralSize + name_size + U16(p + 30) + U16(p + 32);
    if (next > d.bytes.size()) {
      return r.Corrupt(absl::StrCat("central directory entry ", i, " runs past its end"));
    }
    const std::string_view name(reinterpret_cast<const char*>(p + kCentralSize), name_size);
    if (name == r.member()) {
      Entry e;
      e.flags = U16(p + 8);
      e.method = U16(p + 10);
      e.crc = U32(p + 16);
      e.compressed = U32(p + 20);
      e.uncompressed = U32(p + 24);
      e.local_offset = U32(p + 42);
      if (e.compressed == 0xffffffff || e.uncompressed == 0xffffffff ||
          e.local_offset == 0xffffffff) {
        return r.Unsupported("Zip64 sizes are not supported");
      }
      return e;
    }
    if (names.size() < 5) names.emplace_back(name);
    pos = next;
  }
  std::string some;
  for (const std::string& n : names) absl::StrAppend(&some, some.empty() ? "" : ", ", "'", n, "'");
  return absl::NotFoundError(absl::StrCat(
      "zip archive ", r.path(), " has no member '", r.member(), "' (", d.count,
      " members", names.empty() ? "" : ", e.g. ", some, ")"));
}

absl::Status Write(int fd, const uint8_t* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return absl::InternalError(absl::StrCat("cannot write: ", std::strerror(errno)));
    data += w, n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

// Copies or inflates `e`'s data at `start` to `out_fd`; the caller checked its bounds.
absl::StatusOr<int64_t> Copy(Reader& r, const Entry& e, int64_t start, int out_fd) {
  std::vector<uint8_t> in(kChunk), out(kChunk);
  z_stream z{};
  const bool deflate = e.method == 8;
  if (deflate && inflateInit2(&z, -MAX_WBITS) != Z_OK) {  // raw deflate: no zlib header
    return absl::InternalError("inflateInit2 failed");
  }
  struct End {
    z_stream* z;
    bool on;
    ~End() {
      if (on) inflateEnd(z);
    }
  } end{&z, deflate};
  uLong crc = crc32(0, nullptr, 0);
  int64_t read = 0, written = 0;
  bool stream_end = false;  // deflate only
  auto emit = [&](const uint8_t* data, size_t n) -> absl::Status {
    if (written + static_cast<int64_t>(n) > e.uncompressed) {
      return r.BadMember(absl::StrCat("inflates to more than its recorded ", e.uncompressed,
                                      " bytes"));
    }
    crc = crc32(crc, data, static_cast<uInt>(n));
    written += static_cast<int64_t>(n);
    return Write(out_fd, data, n);
  };
  while (read < e.compressed && !stream_end) {
    const size_t n = static_cast<size_t>(std::min<int64_t>(kChunk, e.compressed - read));
    if (absl::Status s = r.ReadAt(start + read, in.data(), n); !s.ok()) return s;
    read += static_cast<int64_t>(n);
    if (!deflate) {
      if (absl::Status s = emit(in.data(), n); !s.ok()) return s;
      continue;
    }
    z.next_in = in.data();
    z.avail_in = static_cast<uInt>(n);
    do {  // zlib's own loop: a full output buffer may hold back more output
      z.next_out = out.data();
      z.avail_out = static_cast<uInt>(out.size());
      const int rc = inflate(&z, Z_NO_FLUSH);
      if (rc == Z_BUF_ERROR) break;  // no progress without more input
      if (rc != Z_OK && rc != Z_STREAM_END) {
        return r.BadMember(absl::StrCat("deflate data is damaged (",
                                        z.msg != nullptr ? z.msg : "zlib error", ")"));
      }
      if (absl::Status s = emit(out.data(), out.size() - z.avail_out); !s.ok()) return s;
      stream_end = rc == Z_STREAM_END;
    } while (z.avail_out == 0 && !stream_end);
    if (stream_end) break;
  }
  if (deflate && !stream_end) return r.BadMember("deflate data ends before the end of its stream");
  if (written != e.uncompressed) {
    return r.BadMember(absl::StrCat("holds ", written, " bytes but its recorded size is ",
                                    e.uncompressed));
  }
  if (crc != e.crc) {
    return r.BadMember(absl::StrCat("CRC-32 mismatch: recorded ", e.crc, ", data has ", crc));
  }
  return written;
}

}  // namespace

absl::StatusOr<int64_t> ExtractZipMember(const std::string& zip_path, std::string_view member,
                                         int out_fd) {
  Reader r(zip_path, std::string(member));
  if (absl::Status s = r.Open(); !s.ok()) return s;
  auto directory = ReadDirectory(r);
  if (!directory.ok()) return directory.status();
  auto entry = FindEntry(r, *directory);
  if (!entry.ok()) return entry.status();
  const Entry& e = *entry;
  if (e.flags & 1) return r.Unsupported("encrypted members are not supported");
  if (e.method != 0 && e.method != 8) {
    return r.Unsupported(absl::StrCat("compression method ", e.method,
                                      " is not supported (only stored and deflate)"));
  }
  if (e.method == 0 && e.compressed != e.uncompressed) {
    return r.BadMember(absl::StrCat("stored, yet its sizes differ (", e.compressed, " and ",
                                    e.uncompressed, ")"));
  }
  if (e.method == 8 && e.uncompressed > e.compressed * kMaxDeflateRatio + 1024) {
    return r.BadMember(absl::StrCat("claims ", e.uncompressed, " bytes from ", e.compressed,
                                    " compressed, more than deflate can expand to"));
  }
  // Member data lies between its local header and the central directory.
  if (e.local_offset + kLocalSize > directory->offset) {
    return r.BadMember(absl::StrCat("local header offset ", e.local_offset,
                                    " is past the central directory at ", directory->offset));
  }
  uint8_t local[kLocalSize];
  if (absl::Status s = r.ReadAt(e.local_offset, local, sizeof(local)); !s.ok()) return s;
  if (U32(local) != kLocalSignature) {
    return r.BadMember(absl::StrCat("no local header at offset ", e.local_offset));
  }
  const int64_t start = e.local_offset + kLocalSize + U16(local + 26) + U16(local + 28);
  if (start + e.compressed > directory->offset) {
    return r.BadMember(absl::StrCat(e.compressed, " bytes of data at offset ", start,
                                    " run into the central directory at ", directory->offset));
  }
  return Copy(r, e, start, out_fd);
}

}  // namespace fucina
