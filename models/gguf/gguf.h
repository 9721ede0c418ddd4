// GGUF reader: memory-maps a model file (or every part of a split model) and exposes its
// metadata and tensor table with validated, in-bounds data pointers.
//
// Every structural property is checked before it is used: each count, length and offset is
// compared with the bytes actually remaining before anything is allocated or read, so a hostile
// file yields an InvalidArgument status naming the file and the offset / key / tensor at fault,
// never an out-of-bounds read or an allocation larger than a small multiple of the file size.
// Format: magic "GGUF", uint32 version (2 or 3; little-endian only), uint64 tensor count,
// uint64 KV count, KVs, tensor infos, padding to `general.alignment` (default 32), data.
#ifndef FUCINA_MODELS_GGUF_GGUF_H_
#define FUCINA_MODELS_GGUF_GGUF_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "kernels/ggml_type.h"
#include "models/gguf/gguf_value.h"

namespace fucina::gguf {

inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr int kMaxDims = 4;
// ggml tensor names are fixed 64-byte fields; the GGUF spec caps names at 64 bytes.
inline constexpr size_t kMaxTensorNameLength = 64;
inline constexpr size_t kMaxKeyLength = 65535;
// Arrays of arrays deeper than this are rejected (no real file nests at all).
inline constexpr int kMaxArrayDepth = 8;

inline constexpr std::string_view kKeyAlignment = "general.alignment";
inline constexpr std::string_view kKeyArchitecture = "general.architecture";
inline constexpr std::string_view kKeySplitNo = "split.no";  // 0-based index of this part.
inline constexpr std::string_view kKeySplitCount = "split.count";
inline constexpr std::string_view kKeySplitTensorsCount = "split.tensors.count";

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] = row length (ne0); 1..4 dims, all > 0.
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;   // Within its file's data section; a multiple of that file's alignment.
  uint32_t split = 0;    // Index of the split file holding the data (0 for single files).
  const uint8_t* data = nullptr;  // Into the mapping; nbytes readable bytes.
  uint64_t nbytes = 0;

  int64_t num_elements() const;
};

class File {
 public:
  // Memory-maps `path`. A name like "<prefix>-00001-of-00003.gguf", or split.count > 1 in the
  // file, makes it open every part "<prefix>-0000K-of-00003.gguf" in the same directory and merge
  // their tensors (metadata from the first part). NotFound if a file is missing.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path);
  // Parses a copy of `bytes` as one (non-split) file; `name` stands in for the path in messages.
  static absl::StatusOr<std::unique_ptr<File>> FromBytes(std::span<const uint8_t> bytes,
                                                         std::string name);

  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* Find(std::string_view key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;
  // Of the first (or only) part.
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  // Number of parts (1 unless split).
  size_t num_splits() const { return buffers_.size(); }
  // OK while every mapped part still has the size it was mapped with. A file truncated in place
  // while mapped turns any read past its new end into SIGBUS: callers check this before a pass
  // over the weights and fail with its DATA_LOSS error (naming the file and both sizes) instead.
  // (Replacing the file by renaming a new one over it is safe: the mapping keeps the old one.)
  absl::Status CheckMappedIntact() const;

  // Gives the whole pages of [p, p + n) that lie in a mapped part back to the page cache: for
  // tensor bytes the caller has copied and no longer reads in its hot path. They stay valid;
  // a later read maps them in again. Parts held as copies (FromBytes) are left as they are.
  void ReleasePages(const void* p, size_t n) const;

 private:
  // Bytes backing one part: a read-only mapping or an owned aligned copy.
  struct Buffer {
    const uint8_t* data = nullptr;
    uint64_t size = 0;
    bool mapped = false;
    int fd = -1;       // mapped: kept open to watch the file's size (CheckMappedIntact)
    std::string path;  // mapped: for messages
  };

  File() = default;
  // Maps `path` into a new File's buffers_ (parsing nothing yet).
  static absl::StatusOr<std::unique_ptr<File>> MapOne(const std::string& path);
  // Parses buffers_.back() as one file, filling everything else; tensors get `split`.
  absl::Status ParseLast(uint32_t split);
  // `first` is part 1 of `count`; maps, parses and merges parts 2..count.
  static absl::StatusOr<std::unique_ptr<File>> OpenSplits(std::unique_ptr<File> first,
                                                          std::string_view prefix,
                                                          uint32_t count);

  std::vector<Buffer> buffers_;  // Released in the destructor.
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  absl::flat_hash_map<std::string, size_t> metadata_index_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points above U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Parses "<prefix>-NNNNN-of-MMMMM.gguf": sets the prefix, 1-based part number and count.
bool ParseSplitPath(std::string_view path, std::string* prefix, uint32_t* part, uint32_t* count);
// "<prefix>-%05d-of-%05d.gguf" for 1-based `part`.
std::string SplitPath(std::string_view prefix, uint32_t part, uint32_t count);

}  // namespace fucina::gguf

#endif  // FUCINA_MODELS_GGUF_GGUF_H_
