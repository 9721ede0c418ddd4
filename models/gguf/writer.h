// Streaming GGUF v3 writer.
//
// Metadata and tensor declarations are collected first; Finish() then writes header, KVs,
// tensor infos, padding and each tensor's bytes (aligned) in declaration order. Tensor bytes
// come from a fill callback invoked once per tensor during Finish with a buffer of exactly its
// size, so a quantizer can stream a model without holding every tensor in memory. Output goes to
// "<path>.tmp", renamed to `path` only on success: a crash never leaves a half-written model
// under the final name.
#ifndef FUCINA_MODELS_GGUF_WRITER_H_
#define FUCINA_MODELS_GGUF_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ggml_type.h"
#include "models/gguf/gguf_value.h"

namespace fucina::gguf {

class Writer {
 public:
  using FillFn = std::function<absl::Status(std::span<uint8_t>)>;

  // `alignment`: a power of two; written as general.alignment when not the default 32.
  static absl::StatusOr<std::unique_ptr<Writer>> Create(const std::string& path,
                                                        uint32_t alignment = 32);
  ~Writer();  // Removes the temporary file if Finish did not succeed.
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Keeps insertion order; setting an existing key replaces its value in place.
  void SetValue(std::string key, Value v);

  // Declares a tensor (dims in GGUF order, dims[0] = row length); `fill` is called once during
  // Finish with exactly RowBytes(type, dims[0]) * rows bytes. Errors: invalid or duplicate name,
  // bad dims, row length not a multiple of the block size.
  absl::Status AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type, FillFn fill);
  // Same with bytes the caller keeps alive until Finish; size must match exactly.
  absl::Status AddTensorBytes(std::string name, std::vector<int64_t> dims, GgmlType type,
                              std::span<const uint8_t> bytes);

  // Writes everything and renames into place. Call once.
  absl::Status Finish();

  uint32_t alignment() const { return alignment_; }

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GgmlType type;
    uint64_t nbytes;
    uint64_t offset;  // Within the data section.
    FillFn fill;
  };

  Writer(std::string path, uint32_t alignment, std::FILE* out)
      : path_(std::move(path)), alignment_(alignment), out_(out) {}
  absl::Status WriteAll();
  absl::Status Put(const void* p, size_t n);
  absl::Status PutValue(const Value& v);
  absl::Status PutString(const std::string& s);
  absl::Status PadTo(uint64_t alignment);

  std::string path_;
  uint32_t alignment_;
  std::FILE* out_;
  uint64_t written_ = 0;
  bool finished_ = false;
  std::vector<std::pair<std::string, Value>> kv_;
  absl::flat_hash_map<std::string, size_t> kv_index_;
  std::vector<Tensor> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
  uint64_t data_size_ = 0;
};

class File;

// The bytes of the file `write` writes at the path it is given: a fresh temporary file, removed
// afterwards. For writers that only write files (Writer, Model::SaveLora, ...) when the file is
// wanted in memory (sent over the wire). Errors: `write`'s, and reading the file back.
absl::StatusOr<std::string> FileBytes(
    const std::function<absl::Status(const std::string& path)>& write);

// Writes one GGUF at `path` holding every tensor of `parts` in order (bytes, types and dims as
// they are) under the metadata of the first part (its alignment and split keys aside): the
// files of a pipeline's stages, each with its own layers' tensors, as one. Errors: no parts, a
// tensor name in two parts, and the writer's.
absl::Status ConcatenateTensors(std::span<const File* const> parts, const std::string& path);

}  // namespace fucina::gguf

#endif  // FUCINA_MODELS_GGUF_WRITER_H_
