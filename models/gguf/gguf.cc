#include "models/gguf/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fucina::gguf {
namespace {

constexpr std::align_val_t kCopyAlignment{64};

// Smallest encodings, used to reject counts before allocating: a KV is a key length (8), a
// 1-byte key, a type (4) and at least a 1-byte value; a tensor info is a name length (8), a
// 1-byte name, n_dims (4), one dim (8), a type (4) and an offset (8).
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

// Smallest on-disk size of one array element of `type` (a nested array is type + count).
uint64_t MinElementBytes(ValueType type) {
  if (type == ValueType::kString) return 8;
  if (type == ValueType::kArray) return 12;
  return ScalarSize(type);
}

// Bounds-checked little-endian reads over [base, base + size); errors name the file and offset.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& name)
      : base_(base), size_(size), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Error(uint64_t at, std::string_view msg) const {
    return absl::InvalidArgumentError(absl::StrFormat("%s: offset %d: %s", name_, at, msg));
  }
  absl::Status Truncated(uint64_t need, std::string_view what) const {
    return Error(pos_, absl::StrFormat("file truncated: %s needs %d bytes, %d remain", what, need,
                                       remaining()));
  }

  template <typename T>
  absl::Status Read(T* out, std::string_view what) {
    if (remaining() < sizeof(T)) return Truncated(sizeof(T), what);
    std::memcpy(out, base_ + pos_, sizeof(T));  // Files are little-endian, as is every host.
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  // A uint64 length then that many bytes; the length is checked against what remains first.
  absl::Status ReadString(std::string* out, std::string_view what, uint64_t max_len) {
    const uint64_t at = pos_;
    uint64_t len = 0;
    if (absl::Status s = Read(&len, what); !s.ok()) return s;
    if (len > max_len) {
      return Error(at, absl::StrFormat("%s length %d exceeds the limit of %d", what, len, max_len));
    }
    if (len > remaining()) {
      return Error(at, absl::StrFormat("%s length %d exceeds the %d bytes remaining in the file",
                                       what, len, remaining()));
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

  absl::Status ReadValue(ValueType type, int depth, std::string_view key, Value* out);

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

absl::Status Cursor::ReadValue(ValueType type, int depth, std::string_view key, Value* out) {
  const uint64_t at = pos_;
  auto read_scalar = [&](auto tag, auto make) -> absl::Status {
    decltype(tag) v{};
    if (absl::Status s = Read(&v, absl::StrFormat("value of key '%s'", key)); !s.ok()) return s;
    *out = make(v);
    return absl::OkStatus();
  };
  switch (type) {
    case ValueType::kUint8: return read_scalar(uint8_t{}, Value::U8);
    case ValueType::kInt8: return read_scalar(int8_t{}, Value::I8);
    case ValueType::kUint16: return read_scalar(uint16_t{}, Value::U16);
    case ValueType::kInt16: return read_scalar(int16_t{}, Value::I16);
    case ValueType::kUint32: return read_scalar(uint32_t{}, Value::U32);
    case ValueType::kInt32: return read_scalar(int32_t{}, Value::I32);
    case ValueType::kUint64: return read_scalar(uint64_t{}, Value::U64);
    case ValueType::kInt64: return read_scalar(int64_t{}, Value::I64);
    case ValueType::kFloat32: return read_scalar(float{}, Value::F32);
    case ValueType::kFloat64: return read_scalar(double{}, Value::F64);
    case ValueType::kBool: {
      uint8_t b = 0;
      if (absl::Status s = Read(&b, absl::StrFormat("value of key '%s'", key)); !s.ok()) return s;
      if (b > 1) return Error(at, absl::StrFormat("key '%s': bool byte is %d, not 0 or 1", key, b));
      *out = Value::Bool(b != 0);
      return absl::OkStatus();
    }
    case ValueType::kString: {
      std::string str;
      if (absl::Status s = ReadString(&str, absl::StrFormat("string value of key '%s'", key),
                                      UINT64_MAX);
          !s.ok()) {
        return s;
      }
      *out = Value::Str(std::move(str));
      return absl::OkStatus();
    }
    case ValueType::kArray: {
      if (depth >= kMaxArrayDepth) {
        return Error(at, absl::StrFormat("key '%s': arrays nested deeper than %d levels", key,
                                         kMaxArrayDepth));
      }
      uint32_t elem_id = 0;
      uint64_t count = 0;
      const std::string type_what = absl::StrFormat("array type of key '%s'", key);
      if (absl::Status s = Read(&elem_id, type_what); !s.ok()) return s;
      if (!IsValidValueType(elem_id)) {
        return Error(at, absl::StrFormat("key '%s': invalid array element type %d", key, elem_id));
      }
      const ValueType elem = static_cast<ValueType>(elem_id);
      const uint64_t count_at = pos_;
      const std::string count_what = absl::StrFormat("array length of key '%s'", key);
      if (absl::Status s = Read(&count, count_what); !s.ok()) return s;
      if (count > remaining() / MinElementBytes(elem)) {
        return Error(count_at,
                     absl::StrFormat("key '%s': array of %d %s elements cannot fit in the %d "
                                     "bytes remaining",
                                     key, count, ValueTypeName(elem), remaining()));
      }
      std::vector<Value> items;
      items.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        // A nested array item is itself "type, count, items", read one level deeper.
        Value item;
        if (absl::Status s = ReadValue(elem, depth + 1, key, &item); !s.ok()) return s;
        items.push_back(std::move(item));
      }
      *out = Value::Array(elem, std::move(items));
      return absl::OkStatus();
    }
  }
  return Error(at, absl::StrFormat("key '%s': invalid value type %d", key,
                                   static_cast<uint32_t>(type)));
}

absl::Status CheckName(const Cursor& c, uint64_t at, std::string_view kind, const std::string& s) {
  if (s.empty()) return c.Error(at, absl::StrFormat("empty %s", kind));
  if (!IsValidUtf8(s) || s.find('\0') != std::string::npos) {
    return c.Error(at, absl::StrFormat("%s is not valid UTF-8 text (or contains NUL)", kind));
  }
  return absl::OkStatus();
}

uint64_t AlignUp(uint64_t x, uint64_t alignment, bool* overflow) {
  const uint64_t rem = x % alignment;
  if (rem == 0) return x;
  const uint64_t pad = alignment - rem;
  *overflow = x > UINT64_MAX - pad;
  return x + pad;
}

}  // namespace

int64_t TensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // The reader guarantees no overflow.
  return n;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0;
    uint32_t min_cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min_cp = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min_cp = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min_cp = 0x10000;
    } else {
      return false;
    }
    if (s.size() - i < static_cast<size_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      const uint8_t cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

bool ParseSplitPath(std::string_view path, std::string* prefix, uint32_t* part, uint32_t* count) {
  // "-NNNNN-of-MMMMM.gguf" is 20 characters.
  constexpr std::string_view kSuffix = ".gguf";
  if (path.size() < 20 + 1 || path.substr(path.size() - kSuffix.size()) != kSuffix) return false;
  const std::string_view tail = path.substr(path.size() - 20, 15);  // "-NNNNN-of-MMMMM"
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-") return false;
  auto digits = [](std::string_view d, uint32_t* v) {
    *v = 0;
    for (char ch : d) {
      if (ch < '0' || ch > '9') return false;
      *v = *v * 10 + static_cast<uint32_t>(ch - '0');
    }
    return true;
  };
  if (!digits(tail.substr(1, 5), part) || !digits(tail.substr(10, 5), count)) return false;
  if (*part == 0 || *count == 0 || *part > *count) return false;
  *prefix = std::string(path.substr(0, path.size() - 20));
  return true;
}

std::string SplitPath(std::string_view prefix, uint32_t part, uint32_t count) {
  return absl::StrFormat("%s-%05d-of-%05d.gguf", prefix, part, count);
}

File::~File() {
  for (const Buffer& b : buffers_) {
    if (b.data == nullptr) continue;
    if (b.mapped) {
      munmap(const_cast<uint8_t*>(b.data), b.size);
      ::close(b.fd);
    } else {
      ::operator delete(const_cast<uint8_t*>(b.data), kCopyAlignment);
    }
  }
}

void File::ReleasePages(const void* p, size_t n) const {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto lo = reinterpret_cast<uintptr_t>(p);
  for (const Buffer& b : buffers_) {
    const auto base = reinterpret_cast<uintptr_t>(b.data);
    if (!b.mapped || lo < base || lo + n > base + b.size) continue;
    // Whole pages only: the bytes around the range may belong to tensors still read here.
    const uintptr_t first = (lo + page - 1) / page * page;
    const uintptr_t end = (lo + n) / page * page;
    // A private read-only mapping: dropping its pages loses nothing (no private copies).
    if (end > first) ::madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);
    return;
  }
}

absl::Status File::CheckMappedIntact() const {
  for (const Buffer& b : buffers_) {
    if (!b.mapped) continue;
    struct stat st;
    if (::fstat(b.fd, &st) != 0) {
      const int err = errno;
      return absl::ErrnoToStatus(err, absl::StrCat(b.path, ": cannot stat the mapped file"));
    }
    if (static_cast<uint64_t>(st.st_size) < b.size) {
      return absl::DataLossError(absl::StrCat(
          b.path, " was truncated from ", b.size, " to ", st.st_size,
          " bytes while mapped; restart with an intact file (replace model files by renaming a "
          "new file over them, never by writing into them)"));
    }
  }
  return absl::OkStatus();
}

const Value* File::Find(std::string_view key) const {
  auto it = metadata_index_.find(absl::string_view(key.data(), key.size()));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* File::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::unique_ptr<File>> File::FromBytes(std::span<const uint8_t> bytes,
                                                      std::string name) {
  std::unique_ptr<File> file(new File());
  file->path_ = std::move(name);
  Buffer buf;
  buf.size = bytes.size();
  if (!bytes.empty()) {
    auto* copy = static_cast<uint8_t*>(::operator new(bytes.size(), kCopyAlignment));
    std::memcpy(copy, bytes.data(), bytes.size());
    buf.data = copy;
  }
  file->buffers_.push_back(buf);
  if (absl::Status s = file->ParseLast(0); !s.ok()) return s;
  return file;
}

absl::StatusOr<std::unique_ptr<File>> File::MapOne(const std::string& path) {
  std::unique_ptr<File> file(new File());
  file->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": cannot open"));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  Buffer buf;
  buf.size = static_cast<uint64_t>(st.st_size);
  if (buf.size > 0) {
    void* p = ::mmap(nullptr, buf.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat(path, ": mmap failed"));
    }
    // Weights read straight from the mapping (f16, bf16, k-quants) are streamed whole every
    // decode step, as the engine's own copies are (kernels/cpu/streamed_memory.h). Where the
    // filesystem caches files in large folios (ext4, xfs on recent kernels) this lets pages
    // read from now on come in, and be mapped, as 2 MiB pages; elsewhere it changes nothing.
    ::madvise(p, buf.size, MADV_HUGEPAGE);
    buf.data = static_cast<const uint8_t*>(p);
    buf.mapped = true;
    buf.fd = fd;  // the mapping needs no descriptor; CheckMappedIntact does
    buf.path = path;
  } else {
    ::close(fd);
  }
  file->buffers_.push_back(buf);
  return file;
}

absl::Status File::ParseLast(uint32_t split) {
  const Buffer& buf = buffers_.back();
  Cursor c(buf.data, buf.size, path_);
  file_size_ = buf.size;

  char magic[4];
  if (absl::Status s = c.Read(&magic, "magic"); !s.ok()) return s;
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    const auto* m = reinterpret_cast<const uint8_t*>(magic);
    return c.Error(0, absl::StrFormat("bad magic %02x %02x %02x %02x (expected \"GGUF\"): not a "
                                      "GGUF file",
                                      m[0], m[1], m[2], m[3]));
  }
  uint32_t version = 0;
  if (absl::Status s = c.Read(&version, "version"); !s.ok()) return s;
  if (version == 1) {
    return c.Error(4, "GGUF version 1 is not supported (32-bit counts; only versions 2 and 3 are)");
  }
  if ((version & 0xFFFF) == 0 && version != 0) {
    const uint32_t swapped = __builtin_bswap32(version);
    if (swapped >= 1 && swapped <= 3) {
      return c.Error(4, absl::StrFormat("big-endian GGUF (version %d byte-swapped) is not "
                                        "supported",
                                        swapped));
    }
  }
  if (version != 2 && version != 3) {
    return c.Error(4, absl::StrFormat("unsupported GGUF version %d (supported: 2, 3)", version));
  }
  version_ = version;

  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  if (absl::Status s = c.Read(&n_tensors, "tensor count"); !s.ok()) return s;
  if (absl::Status s = c.Read(&n_kv, "metadata count"); !s.ok()) return s;
  if (n_kv > c.remaining() / kMinKvBytes) {
    return c.Error(16, absl::StrFormat("metadata count %d cannot fit in the %d bytes remaining",
                                       n_kv, c.remaining()));
  }
  if (n_tensors > (c.remaining() - n_kv * kMinKvBytes) / kMinTensorInfoBytes) {
    return c.Error(8, absl::StrFormat("tensor count %d cannot fit in the %d bytes remaining",
                                      n_tensors, c.remaining()));
  }

  metadata_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t key_at = c.pos();
    std::string key;
    if (absl::Status s = c.ReadString(&key, absl::StrFormat("key of metadata entry %d", i),
                                      kMaxKeyLength);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckName(c, key_at, absl::StrFormat("key of metadata entry %d", i), key);
        !s.ok()) {
      return s;
    }
    if (metadata_index_.contains(key)) {
      return c.Error(key_at, absl::StrFormat("duplicate key '%s'", key));
    }
    const uint64_t type_at = c.pos();
    uint32_t type_id = 0;
    if (absl::Status s = c.Read(&type_id, absl::StrCat("type of key '", key, "'")); !s.ok()) {
      return s;
    }
    if (!IsValidValueType(type_id)) {
      return c.Error(type_at, absl::StrFormat("key '%s': invalid value type %d", key, type_id));
    }
    Value value;
    if (absl::Status s = c.ReadValue(static_cast<ValueType>(type_id), 0, key, &value); !s.ok()) {
      return s;
    }
    if (key == kKeyAlignment) {
      // ggml reads it as uint32 only; any other type is a malformed file, not a hint.
      if (value.type() != ValueType::kUint32) {
        return c.Error(type_at, absl::StrFormat("'%s' has type %s, expected uint32", key,
                                                ValueTypeName(value.type())));
      }
      const uint64_t a = *value.AsUint();
      if (a == 0 || (a & (a - 1)) != 0) {
        return c.Error(type_at, absl::StrFormat("'%s' is %d, not a nonzero power of two", key, a));
      }
      alignment_ = a;
    }
    metadata_index_.emplace(key, metadata_.size());
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  // Tensor infos: everything about a tensor except where its data lies is checked here.
  std::vector<TensorInfo> infos;
  std::vector<uint64_t> info_at;  // Offset of each info, for later messages.
  infos.reserve(n_tensors);
  absl::flat_hash_map<std::string, size_t> index;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    const uint64_t at = c.pos();
    const std::string what = absl::StrFormat("name of tensor %d", i);
    if (absl::Status s = c.ReadString(&t.name, what, UINT64_MAX); !s.ok()) return s;
    if (t.name.size() > kMaxTensorNameLength) {
      return c.Error(at, absl::StrFormat("tensor %d name is %d bytes, longer than %d", i,
                                         t.name.size(), kMaxTensorNameLength));
    }
    if (absl::Status s = CheckName(c, at, what, t.name); !s.ok()) return s;
    if (index.contains(t.name)) {
      return c.Error(at, absl::StrFormat("duplicate tensor name '%s'", t.name));
    }
    const std::string ctx = absl::StrCat("tensor '", t.name, "'");
    uint32_t n_dims = 0;
    const uint64_t dims_at = c.pos();
    if (absl::Status s = c.Read(&n_dims, absl::StrCat(ctx, " n_dims")); !s.ok()) return s;
    if (n_dims == 0 || n_dims > kMaxDims) {
      return c.Error(dims_at,
                     absl::StrFormat("%s: n_dims %d outside 1..%d", ctx, n_dims, kMaxDims));
    }
    int64_t ne = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      int64_t dim = 0;
      const uint64_t dim_at = c.pos();
      if (absl::Status s = c.Read(&dim, absl::StrCat(ctx, " dims")); !s.ok()) return s;
      if (dim <= 0) {
        return c.Error(dim_at, absl::StrFormat("%s: dim %d is %d, must be positive", ctx, d, dim));
      }
      if (__builtin_mul_overflow(ne, dim, &ne)) {
        return c.Error(dim_at, absl::StrFormat("%s: element count overflows int64", ctx));
      }
      t.dims.push_back(dim);
    }
    uint32_t type_id = 0;
    const uint64_t type_at = c.pos();
    if (absl::Status s = c.Read(&type_id, absl::StrCat(ctx, " type")); !s.ok()) return s;
    const std::optional<GgmlTypeInfo> type_info = LookupGgmlType(type_id);
    if (!type_info) {
      return c.Error(type_at, absl::StrFormat("%s: unknown or removed ggml type %d", ctx, type_id));
    }
    t.type = static_cast<GgmlType>(type_id);
    if (t.dims[0] % type_info->block_size != 0) {
      return c.Error(dims_at, absl::StrFormat("%s: row length %d is not a multiple of %s's block "
                                              "size %d",
                                              ctx, t.dims[0], type_info->name,
                                              type_info->block_size));
    }
    int64_t nbytes = 0;
    if (__builtin_mul_overflow(ne / type_info->block_size, type_info->type_size, &nbytes)) {
      return c.Error(dims_at, absl::StrFormat("%s: byte size overflows int64", ctx));
    }
    t.nbytes = static_cast<uint64_t>(nbytes);
    const uint64_t offset_at = c.pos();
    if (absl::Status s = c.Read(&t.offset, absl::StrCat(ctx, " offset")); !s.ok()) return s;
    if (t.offset % alignment_ != 0) {
      return c.Error(offset_at, absl::StrFormat("%s: data offset %d is not a multiple of the "
                                                "alignment %d",
                                                ctx, t.offset, alignment_));
    }
    t.split = split;
    index.emplace(t.name, infos.size());
    infos.push_back(std::move(t));
    info_at.push_back(at);
  }

  bool overflow = false;
  data_offset_ = AlignUp(c.pos(), alignment_, &overflow);
  if (!infos.empty() && (overflow || data_offset_ > buf.size)) {
    return c.Error(c.pos(), absl::StrFormat("file truncated: data section would start at %d, past "
                                            "the end of the file (%d bytes)",
                                            data_offset_, buf.size));
  }
  const uint64_t data_size = data_offset_ <= buf.size ? buf.size - data_offset_ : 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    TensorInfo& t = infos[i];
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      return c.Error(info_at[i],
                     absl::StrFormat("tensor '%s': data [%d, %d) lies outside the %d-byte data "
                                     "section (file truncated or offset corrupt)",
                                     t.name, t.offset, t.offset + t.nbytes, data_size));
    }
    t.data = buf.data + data_offset_ + t.offset;
  }
  // Overlap: sorted by offset, each tensor must end before the next begins.
  std::vector<size_t> order(infos.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return infos[a].offset < infos[b].offset; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorInfo& prev = infos[order[k - 1]];
    const TensorInfo& cur = infos[order[k]];
    if (prev.offset + prev.nbytes > cur.offset) {
      return c.Error(info_at[order[k]],
                     absl::StrFormat("tensor '%s' data at %d overlaps tensor '%s' [%d, %d)",
                                     cur.name, cur.offset, prev.name, prev.offset,
                                     prev.offset + prev.nbytes));
    }
  }
  tensors_ = std::move(infos);
  tensor_index_ = std::move(index);
  return absl::OkStatus();
}

namespace {

// Reads an optional split key as a non-negative integer; errors name the key and file.
absl::StatusOr<std::optional<uint64_t>> SplitKey(const File& f, std::string_view key) {
  const Value* v = f.Find(key);
  if (v == nullptr) return std::nullopt;
  const std::optional<uint64_t> u = v->AsUint();
  if (!u) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: key '%s' has type %s, expected a non-negative integer", f.path(), key,
        ValueTypeName(v->type())));
  }
  return u;
}

}  // namespace

absl::StatusOr<std::unique_ptr<File>> File::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<File>> first = MapOne(path);
  if (!first.ok()) return first.status();
  if (absl::Status s = (*first)->ParseLast(0); !s.ok()) return s;

  std::string prefix;
  uint32_t name_part = 1, name_count = 1;
  const bool named = ParseSplitPath(path, &prefix, &name_part, &name_count);
  absl::StatusOr<std::optional<uint64_t>> meta_count = SplitKey(**first, kKeySplitCount);
  if (!meta_count.ok()) return meta_count.status();
  const uint64_t count = meta_count->value_or(1);
  if (count <= 1 && (!named || name_count == 1)) return first;
  if (!named) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: split.count is %d but the name does not end in -NNNNN-of-MMMMM.gguf, so the other "
        "parts cannot be found",
        path, count));
  }
  if (count != name_count) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: split.count is %s but the file name says %d parts", path,
        meta_count->has_value() ? absl::StrCat(count) : "missing", name_count));
  }
  if (name_part != 1) {
    // Metadata lives in the first part: start there whichever part was named.
    first = MapOne(SplitPath(prefix, 1, name_count));
    if (!first.ok()) return first.status();
    if (absl::Status s = (*first)->ParseLast(0); !s.ok()) return s;
  }
  return OpenSplits(*std::move(first), prefix, name_count);
}

absl::StatusOr<std::unique_ptr<File>> File::OpenSplits(std::unique_ptr<File> first,
                                                       std::string_view prefix, uint32_t count) {
  for (uint32_t k = 0; k < count; ++k) {
    std::unique_ptr<File> part;
    File* f = first.get();
    if (k > 0) {
      absl::StatusOr<std::unique_ptr<File>> mapped = MapOne(SplitPath(prefix, k + 1, count));
      if (!mapped.ok()) return mapped.status();
      part = *std::move(mapped);
      if (absl::Status s = part->ParseLast(k); !s.ok()) return s;
      f = part.get();
    }
    absl::StatusOr<std::optional<uint64_t>> no = SplitKey(*f, kKeySplitNo);
    if (!no.ok()) return no.status();
    absl::StatusOr<std::optional<uint64_t>> n = SplitKey(*f, kKeySplitCount);
    if (!n.ok()) return n.status();
    if (!no->has_value() || **no != k) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: key 'split.no' is %s, expected %d for part %d of %d", f->path(),
          no->has_value() ? absl::StrCat(**no) : "missing", k, k + 1, count));
    }
    if (!n->has_value() || **n != count) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: key 'split.count' is %s, expected %d", f->path(),
          n->has_value() ? absl::StrCat(**n) : "missing", count));
    }
    if (k == 0) continue;
    for (TensorInfo& t : part->tensors_) {
      if (first->tensor_index_.contains(t.name)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: tensor '%s' also appears in an earlier part", part->path(), t.name));
      }
      first->tensor_index_.emplace(t.name, first->tensors_.size());
      first->tensors_.push_back(std::move(t));
    }
    // The data pointers now in first->tensors_ point into this buffer: hand it over.
    first->buffers_.push_back(part->buffers_.back());
    part->buffers_.clear();
  }
  absl::StatusOr<std::optional<uint64_t>> total = SplitKey(*first, kKeySplitTensorsCount);
  if (!total.ok()) return total.status();
  if (total->has_value() && **total != first->tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: split.tensors.count is %d but the %d parts hold %d tensors", first->path(), **total,
        count, first->tensors_.size()));
  }
  return first;
}

}  // namespace fucina::gguf
