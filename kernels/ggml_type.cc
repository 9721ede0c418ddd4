#include "kernels/ggml_type.h"

#include <array>

namespace fucina {
namespace {

// Indexed by ggml id; empty name = no such type. Block geometry from ggml's type_traits.
constexpr int kNumIds = 40;
constexpr std::array<GgmlTypeInfo, kNumIds> kTypes = {{
    {"f32", 1, 4},        // 0
    {"f16", 1, 2},        // 1
    {"q4_0", 32, 18},     // 2
    {"q4_1", 32, 20},     // 3
    {"", 0, 0},           // 4 removed
    {"", 0, 0},           // 5 removed
    {"q5_0", 32, 22},     // 6
    {"q5_1", 32, 24},     // 7
    {"q8_0", 32, 34},     // 8
    {"q8_1", 32, 36},     // 9
    {"q2_k", 256, 84},    // 10
    {"q3_k", 256, 110},   // 11
    {"q4_k", 256, 144},   // 12
    {"q5_k", 256, 176},   // 13
    {"q6_k", 256, 210},   // 14
    {"q8_k", 256, 292},   // 15
    {"iq2_xxs", 256, 66}, // 16
    {"iq2_xs", 256, 74},  // 17
    {"iq3_xxs", 256, 98}, // 18
    {"iq1_s", 256, 50},   // 19
    {"iq4_nl", 32, 18},   // 20
    {"iq3_s", 256, 110},  // 21
    {"iq2_s", 256, 82},   // 22
    {"iq4_xs", 256, 136}, // 23
    {"i8", 1, 1},         // 24
    {"i16", 1, 2},        // 25
    {"i32", 1, 4},        // 26
    {"i64", 1, 8},        // 27
    {"f64", 1, 8},        // 28
    {"iq1_m", 256, 56},   // 29
    {"bf16", 1, 2},       // 30
    {"", 0, 0},           // 31 removed
    {"", 0, 0},           // 32 removed
    {"", 0, 0},           // 33 removed
    {"tq1_0", 256, 54},   // 34
    {"tq2_0", 256, 66},   // 35
    {"", 0, 0},           // 36 removed
    {"", 0, 0},           // 37 removed
    {"", 0, 0},           // 38 removed
    {"mxfp4", 32, 17},    // 39
}};

}  // namespace

std::optional<GgmlTypeInfo> LookupGgmlType(uint32_t id) {
  if (id >= kNumIds || kTypes[id].block_size == 0) return std::nullopt;
  return kTypes[id];
}

const GgmlTypeInfo& TypeInfo(GgmlType type) { return kTypes[static_cast<uint32_t>(type)]; }

std::optional<GgmlType> ParseGgmlType(std::string_view name) {
  for (uint32_t id = 0; id < kNumIds; ++id) {
    if (kTypes[id].block_size != 0 && kTypes[id].name == name) return static_cast<GgmlType>(id);
  }
  return std::nullopt;
}

}  // namespace fucina
