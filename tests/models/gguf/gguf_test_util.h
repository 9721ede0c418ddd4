// Test helpers: a little-endian byte builder for handcrafted (often malformed) GGUF files, and a
// scratch directory.
#ifndef FUCINA_TESTS_MODELS_GGUF_GGUF_TEST_UTIL_H_
#define FUCINA_TESTS_MODELS_GGUF_GGUF_TEST_UTIL_H_

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fucina::gguf::testing {

class ByteBuilder {
 public:
  template <typename T>
  ByteBuilder& Put(T v) {
    const size_t at = bytes_.size();
    bytes_.resize(at + sizeof(T));
    std::memcpy(bytes_.data() + at, &v, sizeof(T));
    return *this;
  }
  ByteBuilder& U8(uint8_t v) { return Put(v); }
  ByteBuilder& U32(uint32_t v) { return Put(v); }
  ByteBuilder& I32(int32_t v) { return Put(v); }
  ByteBuilder& U64(uint64_t v) { return Put(v); }
  ByteBuilder& I64(int64_t v) { return Put(v); }
  ByteBuilder& F32(float v) { return Put(v); }
  ByteBuilder& Raw(const std::string& s) {
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  // GGUF string: uint64 length + bytes.
  ByteBuilder& Str(const std::string& s) { return U64(s.size()).Raw(s); }
  // Magic, version, tensor count, KV count.
  ByteBuilder& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return Raw("GGUF").U32(version).U64(n_tensors).U64(n_kv);
  }
  // Key + type id; the caller appends the value.
  ByteBuilder& Key(const std::string& key, uint32_t type) { return Str(key).U32(type); }
  ByteBuilder& KvU32(const std::string& key, uint32_t v) { return Key(key, 4).U32(v); }
  ByteBuilder& KvStr(const std::string& key, const std::string& v) { return Key(key, 8).Str(v); }
  ByteBuilder& Tensor(const std::string& name, const std::vector<int64_t>& dims, uint32_t type,
                      uint64_t offset) {
    Str(name).U32(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) I64(d);
    return U32(type).U64(offset);
  }
  ByteBuilder& PadTo(size_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
    return *this;
  }
  ByteBuilder& Fill(size_t n, uint8_t v = 0) {
    bytes_.insert(bytes_.end(), n, v);
    return *this;
  }
  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

// A fresh directory under the system temp dir, removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "fucina_gguf_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace fucina::gguf::testing

#endif  // FUCINA_TESTS_MODELS_GGUF_GGUF_TEST_UTIL_H_
