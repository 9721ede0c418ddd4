#include "tests/fuzz/gguf_mutator.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_format.h"

namespace fucina::gguf::fuzz {
namespace {

// splitmix64: tiny, and identical on every platform (std distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform-enough in [0, n); n > 0.
  uint64_t Below(uint64_t n) { return Next() % n; }
  bool OneIn(uint64_t n) { return Below(n) == 0; }

 private:
  uint64_t state_;
};

uint64_t Load(const uint8_t* p, size_t width) {
  uint64_t v = 0;
  std::memcpy(&v, p, width);
  return v;
}
void Store(uint8_t* p, size_t width, uint64_t v) { std::memcpy(p, &v, width); }

// Walks the structure like the reader but records fields instead of validating them.
class LayoutParser {
 public:
  explicit LayoutParser(std::span<const uint8_t> b) : b_(b) {}

  Layout Run() {
    if (b_.size() < 24 || std::memcmp(b_.data(), "GGUF", 4) != 0) return out_;
    Add(FieldKind::kVersion, 4, 4);
    Add(FieldKind::kTensorCount, 8, 8);
    Add(FieldKind::kKvCount, 16, 8);
    const uint64_t n_tensors = Load(&b_[8], 8);
    const uint64_t n_kv = Load(&b_[16], 8);
    pos_ = 24;
    for (uint64_t i = 0; i < n_kv; ++i) {
      const size_t begin = pos_;
      if (!String(FieldKind::kKeyLength, /*is_name=*/true)) return out_;
      uint64_t type = 0;
      if (!Take(FieldKind::kValueType, 4, &type) || !Value(type, 0)) return out_;
      out_.kvs.push_back({begin, pos_});
    }
    for (uint64_t i = 0; i < n_tensors; ++i) {
      const size_t begin = pos_;
      uint64_t n_dims = 0;
      if (!String(FieldKind::kNameLength, true) || !Take(FieldKind::kNDims, 4, &n_dims) ||
          n_dims > 8) {
        return out_;
      }
      for (uint64_t d = 0; d < n_dims; ++d) {
        if (!Take(FieldKind::kDim, 8, nullptr)) return out_;
      }
      if (!Take(FieldKind::kTensorType, 4, nullptr) ||
          !Take(FieldKind::kTensorOffset, 8, nullptr)) {
        return out_;
      }
      out_.tensor_infos.push_back({begin, pos_});
      out_.infos_end = pos_;
    }
    out_.infos_end = pos_;
    out_.complete = true;
    return out_;
  }

 private:
  void Add(FieldKind kind, size_t offset, size_t width) {
    out_.fields.push_back({kind, offset, width});
  }
  bool Take(FieldKind kind, size_t width, uint64_t* value) {
    if (b_.size() - pos_ < width) return false;
    Add(kind, pos_, width);
    if (value != nullptr) *value = Load(&b_[pos_], width);
    pos_ += width;
    return true;
  }
  bool String(FieldKind kind, bool is_name) {
    uint64_t len = 0;
    if (!Take(kind, 8, &len) || len > b_.size() - pos_) return false;
    if (is_name) out_.names.push_back({pos_, pos_ + len});
    pos_ += len;
    return true;
  }
  bool Value(uint64_t type, int depth) {
    if (depth > 8) return false;
    switch (type) {
      case 0: case 1: case 7: return Take(FieldKind::kScalar, 1, nullptr);
      case 2: case 3: return Take(FieldKind::kScalar, 2, nullptr);
      case 4: case 5: case 6: return Take(FieldKind::kScalar, 4, nullptr);
      case 10: case 11: case 12: return Take(FieldKind::kScalar, 8, nullptr);
      case 8: return String(FieldKind::kStringLength, false);
      case 9: {
        uint64_t elem = 0, count = 0;
        if (!Take(FieldKind::kArrayType, 4, &elem) || !Take(FieldKind::kArrayLength, 8, &count)) {
          return false;
        }
        // Scalar arrays: skip in one step rather than recording every element.
        const size_t scalar = elem <= 1 || elem == 7 ? 1 : elem <= 3 ? 2 : elem <= 6 ? 4
                              : elem >= 10 && elem <= 12 ? 8 : 0;
        if (scalar != 0) {
          if (count > (b_.size() - pos_) / scalar) return false;
          pos_ += count * scalar;
          return true;
        }
        for (uint64_t i = 0; i < count; ++i) {
          if (!Value(elem, depth + 1)) return false;
        }
        return true;
      }
      default: return false;
    }
  }

  std::span<const uint8_t> b_;
  size_t pos_ = 0;
  Layout out_;
};

// Boundary values worth trying for a field of this kind whose current value is `v`.
uint64_t Interesting(FieldKind kind, size_t width, uint64_t v, uint64_t size, Rng& rng) {
  switch (kind) {
    case FieldKind::kVersion: {
      static constexpr uint32_t kV[] = {0, 1, 2, 3, 4, 0x03000000, 0x02000000, 0xFFFFFFFF};
      return kV[rng.Below(std::size(kV))];
    }
    case FieldKind::kValueType:
    case FieldKind::kArrayType: return rng.OneIn(8) ? rng.Next() : rng.Below(14);
    case FieldKind::kTensorType: return rng.OneIn(8) ? rng.Next() : rng.Below(42);
    case FieldKind::kNDims: return rng.Below(7);
    default: break;
  }
  const uint64_t mask = width == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * width)) - 1;
  const uint64_t choices[] = {0,
                              1,
                              2,
                              v + 1,
                              v - 1,
                              v * 2,
                              v / 2,
                              v + 32,
                              v + 31,
                              mask,
                              mask >> 1,
                              (mask >> 1) + 1,
                              uint64_t{1} << 31,
                              uint64_t{1} << 32,
                              uint64_t{1} << 62,
                              size,
                              size - v,
                              rng.Below(size + 1),
                              rng.Next(),
                              0x7FFFFFFFFFFFFFC0ull,
                              0 - v};  // Two's-complement negation.
  return choices[rng.Below(std::size(choices))] & mask;
}

void MutateOnce(std::vector<uint8_t>& b, Rng& rng, size_t max_size) {
  const Layout layout = LayoutParser(b).Run();
  const uint64_t op = rng.Below(100);
  if (op < 55 && !layout.fields.empty()) {
    // Pick a kind first so the few header/tensor fields are not drowned by string lengths.
    std::vector<const Field*> of_kind;
    // Scalar values are favoured: most of their mutants stay valid and reach the tensor checks.
    const FieldKind kind =
        rng.OneIn(3) ? FieldKind::kScalar
                     : static_cast<FieldKind>(rng.Below(static_cast<int>(FieldKind::kNumKinds)));
    for (const Field& f : layout.fields) {
      if (f.kind == kind) of_kind.push_back(&f);
    }
    const Field& f = of_kind.empty() ? layout.fields[rng.Below(layout.fields.size())]
                                     : *of_kind[rng.Below(of_kind.size())];
    const uint64_t v = Load(&b[f.offset], f.width);
    Store(&b[f.offset], f.width, Interesting(f.kind, f.width, v, b.size(), rng));
    return;
  }
  if (op < 65 && (!layout.kvs.empty() || !layout.tensor_infos.empty())) {
    // Duplicate an entry in place and bump its count: duplicate keys / names, shifted offsets.
    const bool kv = layout.tensor_infos.empty() || (!layout.kvs.empty() && rng.OneIn(2));
    const std::vector<Range>& ranges = kv ? layout.kvs : layout.tensor_infos;
    const Range r = ranges[rng.Below(ranges.size())];
    if (b.size() + (r.end - r.begin) > max_size) return;
    std::vector<uint8_t> copy(b.begin() + r.begin, b.begin() + r.end);
    b.insert(b.begin() + r.end, copy.begin(), copy.end());
    const size_t count_at = kv ? 16 : 8;
    Store(&b[count_at], 8, Load(&b[count_at], 8) + 1);
    return;
  }
  if (op < 72 && !layout.names.empty()) {
    // Corrupt a key or tensor name: invalid UTF-8, NUL, or a different character.
    const Range r = layout.names[rng.Below(layout.names.size())];
    if (r.end > r.begin) {
      // Half valid ASCII (new distinct keys / names), half invalid UTF-8 or NUL.
      static constexpr uint8_t kBad[] = {0xFF, 0xC0, 0x80, 0x00, 'x', '.', 'Z', '_'};
      b[r.begin + rng.Below(r.end - r.begin)] = kBad[rng.Below(std::size(kBad))];
    }
    return;
  }
  if (op < 80 && !b.empty()) {
    // Truncate, biased toward the structured region.
    const size_t limit = layout.infos_end > 0 && rng.OneIn(2) ? layout.infos_end + 64 : b.size();
    b.resize(rng.Below(std::min(limit, b.size())));
    return;
  }
  if (op < 85) {
    // Append or insert random bytes.
    const size_t n = 1 + rng.Below(64);
    if (b.size() + n > max_size) return;
    const size_t at = rng.Below(b.size() + 1);
    std::vector<uint8_t> junk(n);
    for (uint8_t& x : junk) x = static_cast<uint8_t>(rng.Next());
    b.insert(b.begin() + at, junk.begin(), junk.end());
    return;
  }
  if (b.empty()) return;
  // Random byte writes / bit flips, biased toward the header region.
  const size_t limit = layout.infos_end > 0 && !rng.OneIn(4) ? std::min(b.size(), layout.infos_end)
                                                             : b.size();
  const int n = 1 + static_cast<int>(rng.Below(4));
  for (int i = 0; i < n && limit > 0; ++i) {
    uint8_t& x = b[rng.Below(limit)];
    x = rng.OneIn(2) ? static_cast<uint8_t>(x ^ (1u << rng.Below(8)))
                     : static_cast<uint8_t>(rng.Next());
  }
}

}  // namespace

Layout ParseLayout(std::span<const uint8_t> bytes) { return LayoutParser(bytes).Run(); }

std::vector<uint8_t> Mutate(std::span<const uint8_t> input, uint64_t seed) {
  std::vector<uint8_t> b(input.begin(), input.end());
  const size_t max_size = std::max<size_t>(input.size(), 64) + 4096;
  Rng rng(seed);
  const int n = 1 + static_cast<int>(rng.Below(4));
  for (int i = 0; i < n; ++i) MutateOnce(b, rng, max_size);
  return b;
}

size_t MutateInPlace(uint8_t* data, size_t size, size_t max_size, uint64_t seed) {
  std::vector<uint8_t> b(data, data + size);
  Rng rng(seed);
  const int n = 1 + static_cast<int>(rng.Below(4));
  for (int i = 0; i < n; ++i) MutateOnce(b, rng, max_size);
  const size_t out = std::min(b.size(), max_size);
  std::memcpy(data, b.data(), out);
  return out;
}

std::string CheckParsedFile(const File& file, uint64_t buffer_size) {
  if (file.file_size() != buffer_size) return "file_size differs from the input size";
  const uint64_t a = file.alignment();
  if (a == 0 || (a & (a - 1)) != 0) return absl::StrFormat("alignment %d", a);
  if (file.version() != 2 && file.version() != 3) return "bad version accepted";
  std::set<std::string> keys;
  size_t touched = 0;
  for (const auto& [key, value] : file.metadata()) {
    if (key.empty() || !keys.insert(key).second) return absl::StrFormat("key '%s' repeated", key);
    if (file.Find(key) != &value) return absl::StrFormat("Find('%s') mismatch", key);
    if (!value.IsWellFormed(kMaxArrayDepth)) return absl::StrFormat("key '%s' malformed", key);
    touched += value.ToDisplayString(4).size();
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  const uint8_t* base = nullptr;
  uint64_t checksum = 0;
  for (const TensorInfo& t : file.tensors()) {
    if (file.FindTensor(t.name) != &t) return absl::StrFormat("FindTensor('%s')", t.name);
    if (t.name.empty() || t.name.size() > kMaxTensorNameLength) return "bad name accepted";
    if (t.dims.empty() || t.dims.size() > kMaxDims) return "bad n_dims accepted";
    int64_t ne = 1;
    for (int64_t d : t.dims) {
      if (d <= 0 || __builtin_mul_overflow(ne, d, &ne)) return "bad dims accepted";
    }
    const std::optional<GgmlTypeInfo> info = LookupGgmlType(static_cast<uint32_t>(t.type));
    if (!info || t.dims[0] % info->block_size != 0) return "bad type/block accepted";
    if (t.nbytes != static_cast<uint64_t>(ne / info->block_size * info->type_size)) {
      return absl::StrFormat("tensor '%s' nbytes does not match its shape", t.name);
    }
    if (t.offset % a != 0) return "misaligned offset accepted";
    if (file.data_offset() > buffer_size || t.offset > buffer_size - file.data_offset() ||
        t.nbytes > buffer_size - file.data_offset() - t.offset) {
      return absl::StrFormat("tensor '%s' outside the buffer", t.name);
    }
    if (base == nullptr) base = t.data - t.offset;
    if (t.data != base + t.offset) return "data pointers disagree on the data section base";
    for (uint64_t i = 0; i < t.nbytes; ++i) checksum += t.data[i];
    ranges.emplace_back(t.offset, t.offset + t.nbytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i - 1].second > ranges[i].first) return "overlapping tensors accepted";
  }
  // Keep the reads observable so they are not optimized away.
  if (touched == SIZE_MAX && checksum == 1) return "unreachable";
  return "";
}

}  // namespace fucina::gguf::fuzz
