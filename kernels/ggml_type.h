// ggml tensor types as stored in GGUF files: ids, block geometry and names.
//
// Every type ggml has ever written is known here by its block size, even those with no kernel
// yet, so the GGUF reader can validate any file's tensor sizes. Ids are ggml's on-disk values.
#ifndef FUCINA_KERNELS_GGML_TYPE_H_
#define FUCINA_KERNELS_GGML_TYPE_H_

#include <cstdint>
#include <optional>
#include <string_view>

namespace fucina {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  // 4 and 5 (Q4_2, Q4_3) were removed from ggml before GGUF existed.
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  // 31..33 (Q4_0_4_4, Q4_0_4_8, Q4_0_8_8) and 36..38 (IQ4_NL_4_4/4_8/8_8) were
  // runtime repacking formats, removed from files.
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeInfo {
  std::string_view name;   // ggml's name, lower case: "q4_k", "bf16".
  int64_t block_size;      // elements per block (1 for plain scalar types).
  int64_t type_size;       // bytes per block.
};

// Info for a known type id; nullopt for ids no file may hold (removed or out of range).
std::optional<GgmlTypeInfo> LookupGgmlType(uint32_t id);

// Info for a valid enum value. Precondition: `type` is one of the enumerators above.
const GgmlTypeInfo& TypeInfo(GgmlType type);

static inline std::string_view TypeName(GgmlType type) { return TypeInfo(type).name; }

// Parses ggml's lower-case name ("q8_0"); nullopt if unknown.
std::optional<GgmlType> ParseGgmlType(std::string_view name);

// (static inline: see kernels/fp16.h on ISA-compiled objects.)
// Bytes needed for one row of `n` elements. Precondition: n % block_size == 0.
static inline int64_t RowBytes(GgmlType type, int64_t n) {
  const GgmlTypeInfo& info = TypeInfo(type);
  return n / info.block_size * info.type_size;
}

}  // namespace fucina

#endif  // FUCINA_KERNELS_GGML_TYPE_H_
