#include "models/gguf/gguf_value.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fucina::gguf {

std::string_view ValueTypeName(ValueType type) {
  switch (type) {
    case ValueType::kUint8: return "uint8";
    case ValueType::kInt8: return "int8";
    case ValueType::kUint16: return "uint16";
    case ValueType::kInt16: return "int16";
    case ValueType::kUint32: return "uint32";
    case ValueType::kInt32: return "int32";
    case ValueType::kFloat32: return "float32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "uint64";
    case ValueType::kInt64: return "int64";
    case ValueType::kFloat64: return "float64";
  }
  return "invalid";
}

size_t ScalarSize(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool: return 1;
    case ValueType::kUint16:
    case ValueType::kInt16: return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32: return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64: return 8;
    case ValueType::kString:
    case ValueType::kArray: return 0;
  }
  return 0;
}

bool IsIntegerType(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64: return true;
    default: return false;
  }
}

bool IsSignedIntegerType(ValueType type) {
  return type == ValueType::kInt8 || type == ValueType::kInt16 || type == ValueType::kInt32 ||
         type == ValueType::kInt64;
}

Value Value::Array(ValueType elem, std::vector<Value> items) {
  return Value(ValueType::kArray, gguf::Array{elem, std::move(items)});
}

Value Value::StrArray(std::vector<std::string> items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (std::string& s : items) values.push_back(Str(std::move(s)));
  return Array(ValueType::kString, std::move(values));
}

Value Value::F32Array(const std::vector<float>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (float f : items) values.push_back(F32(f));
  return Array(ValueType::kFloat32, std::move(values));
}

Value Value::I32Array(const std::vector<int32_t>& items) {
  std::vector<Value> values;
  values.reserve(items.size());
  for (int32_t v : items) values.push_back(I32(v));
  return Array(ValueType::kInt32, std::move(values));
}

std::optional<uint64_t> Value::AsUint() const {
  if (!is_integer()) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&data_)) return *u;
  const int64_t i = std::get<int64_t>(data_);
  if (i < 0) return std::nullopt;
  return static_cast<uint64_t>(i);
}

std::optional<int64_t> Value::AsInt() const {
  if (!is_integer()) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&data_)) return *i;
  const uint64_t u = std::get<uint64_t>(data_);
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(u);
}

std::optional<double> Value::AsFloat() const {
  if (const auto* d = std::get_if<double>(&data_)) return *d;
  if (!is_integer()) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&data_)) return static_cast<double>(*u);
  return static_cast<double>(std::get<int64_t>(data_));
}

std::optional<bool> Value::AsBool() const {
  if (const auto* b = std::get_if<bool>(&data_)) return *b;
  return std::nullopt;
}

const std::string* Value::AsString() const { return std::get_if<std::string>(&data_); }

const gguf::Array* Value::AsArray() const { return std::get_if<gguf::Array>(&data_); }

bool Value::IsWellFormed(int max_depth) const {
  const gguf::Array* arr = AsArray();
  if (arr == nullptr) return true;
  if (max_depth <= 0 || !IsValidValueType(static_cast<uint32_t>(arr->elem_type))) return false;
  for (const Value& item : arr->items) {
    if (item.type() != arr->elem_type || !item.IsWellFormed(max_depth - 1)) return false;
  }
  return true;
}

namespace {

// Quoted, with control characters escaped; long strings cut (on a byte boundary: listings only).
std::string QuoteForDisplay(const std::string& s) {
  constexpr size_t kMaxShown = 64;
  std::string out = "\"";
  const size_t shown = std::min(s.size(), kMaxShown);
  for (size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  if (shown < s.size()) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

}  // namespace

std::string Value::ToDisplayString(size_t max_items) const {
  switch (type_) {
    case ValueType::kBool: return std::get<bool>(data_) ? "true" : "false";
    case ValueType::kString: return QuoteForDisplay(std::get<std::string>(data_));
    case ValueType::kFloat32:
    case ValueType::kFloat64: return absl::StrFormat("%g", std::get<double>(data_));
    case ValueType::kArray: {
      const gguf::Array& arr = std::get<gguf::Array>(data_);
      std::string out = "[";
      const size_t shown = std::min(arr.items.size(), max_items);
      for (size_t i = 0; i < shown; ++i) {
        if (i > 0) out += ", ";
        out += arr.items[i].ToDisplayString(max_items);
      }
      if (shown < arr.items.size()) {
        absl::StrAppend(&out, shown > 0 ? ", " : "", "... (", arr.items.size(), " items)");
      }
      out += "]";
      return out;
    }
    default:
      if (const auto* u = std::get_if<uint64_t>(&data_)) return absl::StrCat(*u);
      return absl::StrCat(std::get<int64_t>(data_));
  }
}

bool Value::operator==(const Value& other) const {
  if (type_ != other.type_) return false;
  if (const auto* a = AsArray()) {
    const gguf::Array* b = other.AsArray();
    return a->elem_type == b->elem_type && a->items == b->items;
  }
  // Floats compare bitwise so NaN payloads round-trip checks work.
  if (const auto* d = std::get_if<double>(&data_)) {
    const double e = std::get<double>(other.data_);
    return std::memcmp(d, &e, sizeof(double)) == 0;
  }
  if (data_.index() != other.data_.index()) return false;
  if (const auto* u = std::get_if<uint64_t>(&data_)) return *u == std::get<uint64_t>(other.data_);
  if (const auto* i = std::get_if<int64_t>(&data_)) return *i == std::get<int64_t>(other.data_);
  if (const auto* b = std::get_if<bool>(&data_)) return *b == std::get<bool>(other.data_);
  return std::get<std::string>(data_) == std::get<std::string>(other.data_);
}

}  // namespace fucina::gguf
