// GGUF metadata values: the 13 on-disk value types and an owning Value (scalar, string or array).
//
// Arrays carry their element type and may nest (an array of arrays lists each inner array's own
// element type). A Value built with the factories is well formed except possibly for arrays
// whose items disagree with the declared element type: IsWellFormed() checks that, and the
// writer refuses such values.
#ifndef FUCINA_MODELS_GGUF_GGUF_VALUE_H_
#define FUCINA_MODELS_GGUF_GGUF_VALUE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace fucina::gguf {

// On-disk ids (uint32 in the file).
enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

inline constexpr uint32_t kNumValueTypes = 13;

// "uint8", "string", "array", ...; "invalid" for ids outside the enum.
std::string_view ValueTypeName(ValueType type);

// Bytes a scalar of this type occupies on disk; 0 for string and array (variable size) and for
// invalid ids.
size_t ScalarSize(ValueType type);

inline bool IsValidValueType(uint32_t id) { return id < kNumValueTypes; }
bool IsIntegerType(ValueType type);
bool IsSignedIntegerType(ValueType type);

class Value;

// Items all have type `elem_type` (checked by Value::IsWellFormed, guaranteed by the reader).
struct Array {
  ValueType elem_type = ValueType::kUint8;
  std::vector<Value> items;
};

class Value {
 public:
  Value() : type_(ValueType::kUint8), data_(uint64_t{0}) {}

  static Value U8(uint8_t v) { return Value(ValueType::kUint8, uint64_t{v}); }
  static Value I8(int8_t v) { return Value(ValueType::kInt8, int64_t{v}); }
  static Value U16(uint16_t v) { return Value(ValueType::kUint16, uint64_t{v}); }
  static Value I16(int16_t v) { return Value(ValueType::kInt16, int64_t{v}); }
  static Value U32(uint32_t v) { return Value(ValueType::kUint32, uint64_t{v}); }
  static Value I32(int32_t v) { return Value(ValueType::kInt32, int64_t{v}); }
  static Value U64(uint64_t v) { return Value(ValueType::kUint64, v); }
  static Value I64(int64_t v) { return Value(ValueType::kInt64, v); }
  static Value F32(float v) { return Value(ValueType::kFloat32, double{v}); }
  static Value F64(double v) { return Value(ValueType::kFloat64, v); }
  static Value Bool(bool v) { return Value(ValueType::kBool, v); }
  static Value Str(std::string v) { return Value(ValueType::kString, std::move(v)); }
  static Value Array(ValueType elem, std::vector<Value> items);
  static Value StrArray(std::vector<std::string> items);
  static Value F32Array(const std::vector<float>& items);
  static Value I32Array(const std::vector<int32_t>& items);

  ValueType type() const { return type_; }
  bool is_integer() const { return IsIntegerType(type_); }

  // Any integer type holding a value >= 0.
  std::optional<uint64_t> AsUint() const;
  // Any integer type whose value fits int64 (uint64 above INT64_MAX does not).
  std::optional<int64_t> AsInt() const;
  // Float types, and integer types converted (possibly rounding).
  std::optional<double> AsFloat() const;
  std::optional<bool> AsBool() const;
  // Null unless the value is a string / an array.
  const std::string* AsString() const;
  const gguf::Array* AsArray() const;

  // Arrays: every item has the element type, recursively; nesting at most `max_depth` levels.
  bool IsWellFormed(int max_depth = 8) const;

  // Human-readable form for listings: strings quoted and cut at 64 bytes; arrays abbreviated as
  // "[a, b, ... (N items)]" when longer than max_items.
  std::string ToDisplayString(size_t max_items = 8) const;

  bool operator==(const Value& other) const;
  bool operator!=(const Value& other) const { return !(*this == other); }

 private:
  // Integers are widened to uint64/int64 by signedness and floats to double (float32 values are
  // exactly representable); the type keeps the on-disk width.
  using Data = std::variant<uint64_t, int64_t, double, bool, std::string, gguf::Array>;
  // Constructs the alternative in place (a temporary variant trips GCC 12's
  // -Wmaybe-uninitialized in std::variant's move).
  template <typename T>
  Value(ValueType type, T value) : type_(type), data_(std::in_place_type<T>, std::move(value)) {}

  ValueType type_;
  Data data_;
};

}  // namespace fucina::gguf

#endif  // FUCINA_MODELS_GGUF_GGUF_VALUE_H_
