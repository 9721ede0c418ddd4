#include "models/gguf/writer.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gguf/gguf.h"

namespace fucina::gguf {

absl::StatusOr<std::unique_ptr<Writer>> Writer::Create(const std::string& path,
                                                       uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: alignment %d is not a nonzero power of two", path, alignment));
  }
  const std::string tmp = path + ".tmp";
  std::FILE* out = std::fopen(tmp.c_str(), "wb");
  if (out == nullptr) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrFormat("%s: cannot create", tmp));
  }
  return std::unique_ptr<Writer>(new Writer(path, alignment, out));
}

Writer::~Writer() {
  if (out_ != nullptr) std::fclose(out_);
  if (!finished_) std::remove((path_ + ".tmp").c_str());
}

void Writer::SetValue(std::string key, Value v) {
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kv_[it->second].second = std::move(v);
    return;
  }
  kv_index_.emplace(key, kv_.size());
  kv_.emplace_back(std::move(key), std::move(v));
}

absl::Status Writer::AddTensor(std::string name, std::vector<int64_t> dims, GgmlType type,
                               FillFn fill) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: tensor '%s': %s", path_, name, why));
  };
  if (finished_) return bad("added after Finish");
  if (name.empty() || name.size() > kMaxTensorNameLength || !IsValidUtf8(name) ||
      name.find('\0') != std::string::npos) {
    return bad(absl::StrFormat("name must be 1..%d bytes of UTF-8", kMaxTensorNameLength));
  }
  if (tensor_index_.contains(name)) return bad("duplicate name");
  if (!LookupGgmlType(static_cast<uint32_t>(type))) return bad("unknown type");
  if (dims.empty() || dims.size() > static_cast<size_t>(kMaxDims)) return bad("needs 1..4 dims");
  int64_t ne = 1;
  for (int64_t d : dims) {
    if (d <= 0) return bad("dims must be positive");
    if (__builtin_mul_overflow(ne, d, &ne)) return bad("element count overflows");
  }
  const GgmlTypeInfo& info = TypeInfo(type);
  if (dims[0] % info.block_size != 0) {
    return bad(absl::StrFormat("row length %d is not a multiple of %s's block size %d", dims[0],
                               info.name, info.block_size));
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(ne / info.block_size, info.type_size, &nbytes)) {
    return bad("byte size overflows");
  }
  const uint64_t offset = (data_size_ + alignment_ - 1) / alignment_ * alignment_;
  data_size_ = offset + static_cast<uint64_t>(nbytes);
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back(Tensor{std::move(name), std::move(dims), type, static_cast<uint64_t>(nbytes),
                            offset, std::move(fill)});
  return absl::OkStatus();
}

absl::Status Writer::AddTensorBytes(std::string name, std::vector<int64_t> dims, GgmlType type,
                                    std::span<const uint8_t> bytes) {
  const std::string label = name;
  FillFn fill = [bytes, label, this](std::span<uint8_t> dst) -> absl::Status {
    if (dst.size() != bytes.size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: tensor '%s': %d bytes given, %d needed", path_, label, bytes.size(), dst.size()));
    }
    std::memcpy(dst.data(), bytes.data(), bytes.size());
    return absl::OkStatus();
  };
  // Check the size now too, so a mismatch is reported where the tensor is declared.
  const size_t before = tensors_.size();
  absl::Status added = AddTensor(std::move(name), std::move(dims), type, std::move(fill));
  if (!added.ok()) return added;
  if (tensors_[before].nbytes != bytes.size()) {
    const Tensor t = std::move(tensors_.back());
    tensors_.pop_back();
    tensor_index_.erase(t.name);
    data_size_ = t.offset;
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tensor '%s': %d bytes given, its shape needs %d", path_, t.name, bytes.size(),
        t.nbytes));
  }
  return absl::OkStatus();
}

absl::Status Writer::Put(const void* p, size_t n) {
  if (n > 0 && std::fwrite(p, 1, n, out_) != n) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrFormat("%s.tmp: write failed", path_));
  }
  written_ += n;
  return absl::OkStatus();
}

absl::Status Writer::PutString(const std::string& s) {
  const uint64_t n = s.size();
  if (absl::Status st = Put(&n, sizeof(n)); !st.ok()) return st;
  return Put(s.data(), s.size());
}

absl::Status Writer::PadTo(uint64_t alignment) {
  static constexpr uint8_t kZeros[64] = {};
  uint64_t pad = (alignment - written_ % alignment) % alignment;
  while (pad > 0) {
    const size_t n = std::min<uint64_t>(pad, sizeof(kZeros));
    if (absl::Status s = Put(kZeros, n); !s.ok()) return s;
    pad -= n;
  }
  return absl::OkStatus();
}

absl::Status Writer::PutValue(const Value& v) {
  auto put = [&](auto x) { return Put(&x, sizeof(x)); };
  switch (v.type()) {
    case ValueType::kUint8: return put(static_cast<uint8_t>(*v.AsUint()));
    case ValueType::kInt8: return put(static_cast<int8_t>(*v.AsInt()));
    case ValueType::kUint16: return put(static_cast<uint16_t>(*v.AsUint()));
    case ValueType::kInt16: return put(static_cast<int16_t>(*v.AsInt()));
    case ValueType::kUint32: return put(static_cast<uint32_t>(*v.AsUint()));
    case ValueType::kInt32: return put(static_cast<int32_t>(*v.AsInt()));
    case ValueType::kUint64: return put(*v.AsUint());
    case ValueType::kInt64: return put(*v.AsInt());
    case ValueType::kFloat32: return put(static_cast<float>(*v.AsFloat()));
    case ValueType::kFloat64: return put(*v.AsFloat());
    case ValueType::kBool: return put(static_cast<uint8_t>(*v.AsBool() ? 1 : 0));
    case ValueType::kString: return PutString(*v.AsString());
    case ValueType::kArray: {
      const Array& arr = *v.AsArray();
      if (absl::Status s = put(static_cast<uint32_t>(arr.elem_type)); !s.ok()) return s;
      if (absl::Status s = put(static_cast<uint64_t>(arr.items.size())); !s.ok()) return s;
      for (const Value& item : arr.items) {
        if (absl::Status s = PutValue(item); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unreachable value type");
}

absl::Status Writer::Finish() {
  if (finished_ || out_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat("%s: Finish called twice", path_));
  }
  absl::Status s = WriteAll();
  const bool closed = std::fclose(out_) == 0;
  out_ = nullptr;
  if (s.ok() && !closed) {
    s = absl::ErrnoToStatus(errno, absl::StrFormat("%s.tmp: close failed", path_));
  }
  if (s.ok() && std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) {
    s = absl::ErrnoToStatus(errno, absl::StrFormat("%s: rename from .tmp failed", path_));
  }
  if (s.ok()) finished_ = true;  // Otherwise the destructor removes the temporary.
  return s;
}

absl::Status Writer::WriteAll() {
  // Validate before writing a byte.
  const std::string alignment_key(kKeyAlignment);
  if (const Value* a = kv_index_.contains(alignment_key)
                           ? &kv_[kv_index_.at(alignment_key)].second
                           : nullptr) {
    if (a->type() != ValueType::kUint32 || *a->AsUint() != alignment_) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: general.alignment is set to %s but the writer aligns to %d", path_,
          a->ToDisplayString(), alignment_));
    }
  } else if (alignment_ != kDefaultAlignment) {
    SetValue(alignment_key, Value::U32(alignment_));
  }
  for (const auto& [key, value] : kv_) {
    if (key.empty() || key.size() > kMaxKeyLength || !IsValidUtf8(key)) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: invalid key '%s'", path_, key));
    }
    if (!value.IsWellFormed(kMaxArrayDepth)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: key '%s': array items do not match the element type (or nest deeper than %d)",
          path_, key, kMaxArrayDepth));
    }
  }

  const char magic[4] = {'G', 'G', 'U', 'F'};
  const uint32_t version = 3;
  const uint64_t n_tensors = tensors_.size();
  const uint64_t n_kv = kv_.size();
  if (absl::Status s = Put(magic, 4); !s.ok()) return s;
  if (absl::Status s = Put(&version, 4); !s.ok()) return s;
  if (absl::Status s = Put(&n_tensors, 8); !s.ok()) return s;
  if (absl::Status s = Put(&n_kv, 8); !s.ok()) return s;
  for (const auto& [key, value] : kv_) {
    const uint32_t type = static_cast<uint32_t>(value.type());
    if (absl::Status s = PutString(key); !s.ok()) return s;
    if (absl::Status s = Put(&type, 4); !s.ok()) return s;
    if (absl::Status s = PutValue(value); !s.ok()) return s;
  }
  for (const Tensor& t : tensors_) {
    const uint32_t n_dims = static_cast<uint32_t>(t.dims.size());
    const uint32_t type = static_cast<uint32_t>(t.type);
    if (absl::Status s = PutString(t.name); !s.ok()) return s;
    if (absl::Status s = Put(&n_dims, 4); !s.ok()) return s;
    if (absl::Status s = Put(t.dims.data(), t.dims.size() * sizeof(int64_t)); !s.ok()) return s;
    if (absl::Status s = Put(&type, 4); !s.ok()) return s;
    if (absl::Status s = Put(&t.offset, 8); !s.ok()) return s;
  }
  if (absl::Status s = PadTo(alignment_); !s.ok()) return s;

  const uint64_t data_start = written_;
  std::vector<uint8_t> buffer;
  for (Tensor& t : tensors_) {
    if (absl::Status s = PadTo(alignment_); !s.ok()) return s;
    if (written_ - data_start != t.offset) {
      return absl::InternalError(absl::StrFormat("%s: tensor '%s' offset mismatch", path_, t.name));
    }
    buffer.assign(t.nbytes, 0);
    if (absl::Status s = t.fill(std::span<uint8_t>(buffer)); !s.ok()) return s;
    if (absl::Status s = Put(buffer.data(), buffer.size()); !s.ok()) return s;
    t.fill = nullptr;  // Release whatever the callback captured.
  }
  return absl::OkStatus();
}

absl::Status ConcatenateTensors(std::span<const File* const> parts, const std::string& path) {
  if (parts.empty()) return absl::InvalidArgumentError("no files to concatenate");
  auto writer = Writer::Create(path);
  if (!writer.ok()) return writer.status();
  for (const auto& [key, value] : parts.front()->metadata()) {
    if (key == kKeyAlignment || key.starts_with("split.")) continue;
    (*writer)->SetValue(key, value);
  }
  for (const File* part : parts) {
    for (const TensorInfo& t : part->tensors()) {
      // AddTensorBytes refuses a name declared twice.
      if (absl::Status s = (*writer)->AddTensorBytes(t.name, t.dims, t.type, {t.data, t.nbytes});
          !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(part->path(), ": ", s.message()));
      }
    }
  }
  return (*writer)->Finish();
}

absl::StatusOr<std::string> FileBytes(
    const std::function<absl::Status(const std::string& path)>& write) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = (std::filesystem::temp_directory_path() /
                            absl::StrCat("fucina-", getpid(), "-", counter++, ".gguf"))
                               .string();
  absl::Status written = write(path);
  std::string bytes;
  bool read = false;
  if (written.ok()) {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
    read = static_cast<bool>(in) || in.eof();
  }
  std::remove(path.c_str());
  if (!written.ok()) return written;
  if (!read) return absl::InternalError(absl::StrCat(path, ": cannot read the file back"));
  return bytes;
}

}  // namespace fucina::gguf
