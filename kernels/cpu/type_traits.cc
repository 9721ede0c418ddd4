#include "kernels/type_traits.h"

#include <array>
#include <cstring>

#include "kernels/cpu/gemm_isa.h"
#include "kernels/quant/k_quants.h"
#include "kernels/quant/legacy.h"

namespace fucina {
namespace {

constexpr int kNumTypeIds = 40;
using Table = std::array<CpuTypeTraits, kNumTypeIds>;

// Adapters from the typed kernel signatures to the table's void* ones.
template <typename Block, void (*F)(const Block*, float*, int64_t)>
void ToFloat(const void* x, float* y, int64_t n) {
  F(static_cast<const Block*>(x), y, n);
}
template <typename Block, void (*F)(const float*, Block*, int64_t)>
void FromFloat(const float* x, void* y, int64_t n) {
  F(x, static_cast<Block*>(y), n);
}
template <typename X, typename Y, float (*F)(int64_t, const X*, const Y*)>
float VecDot(int64_t n, const void* x, const void* y) {
  return F(n, static_cast<const X*>(x), static_cast<const Y*>(y));
}

void CopyF32(const void* x, float* y, int64_t n) { std::memcpy(y, x, n * sizeof(float)); }
void CopyF32From(const float* x, void* y, int64_t n) { std::memcpy(y, x, n * sizeof(float)); }

void Set(Table& t, GgmlType type, GgmlType dot_type, ToFloatFn to, FromFloatFn from,
         VecDotFn dot) {
  t[static_cast<uint32_t>(type)] = CpuTypeTraits{type, dot_type, to, from, dot, nullptr};
}

// The scalar table: every entry is a reference implementation.
Table ScalarTable() {
  using T = GgmlType;
  Table t{};
  Set(t, T::kF32, T::kF32, CopyF32, CopyF32From, VecDot<float, float, VecDotF32>);
  Set(t, T::kF16, T::kF32, ToFloat<f16_t, ConvertF16ToF32>, FromFloat<f16_t, ConvertF32ToF16>,
      VecDot<f16_t, float, VecDotF16F32>);
  Set(t, T::kBF16, T::kF32, ToFloat<bf16_t, ConvertBf16ToF32>,
      FromFloat<bf16_t, ConvertF32ToBf16>, VecDot<bf16_t, float, VecDotBf16F32>);
  Set(t, T::kQ4_0, T::kQ8_0, ToFloat<BlockQ4_0, DequantizeRowQ4_0>,
      FromFloat<BlockQ4_0, QuantizeRowQ4_0>, VecDot<BlockQ4_0, BlockQ8_0, VecDotQ4_0Q8_0>);
  Set(t, T::kQ4_1, T::kQ8_1, ToFloat<BlockQ4_1, DequantizeRowQ4_1>,
      FromFloat<BlockQ4_1, QuantizeRowQ4_1>, VecDot<BlockQ4_1, BlockQ8_1, VecDotQ4_1Q8_1>);
  Set(t, T::kQ5_0, T::kQ8_0, ToFloat<BlockQ5_0, DequantizeRowQ5_0>,
      FromFloat<BlockQ5_0, QuantizeRowQ5_0>, VecDot<BlockQ5_0, BlockQ8_0, VecDotQ5_0Q8_0>);
  Set(t, T::kQ5_1, T::kQ8_1, ToFloat<BlockQ5_1, DequantizeRowQ5_1>,
      FromFloat<BlockQ5_1, QuantizeRowQ5_1>, VecDot<BlockQ5_1, BlockQ8_1, VecDotQ5_1Q8_1>);
  Set(t, T::kQ8_0, T::kQ8_0, ToFloat<BlockQ8_0, DequantizeRowQ8_0>,
      FromFloat<BlockQ8_0, QuantizeRowQ8_0>, VecDot<BlockQ8_0, BlockQ8_0, VecDotQ8_0Q8_0>);
  // Q8_1 is an activation format only: no dequantizer in ggml either.
  Set(t, T::kQ8_1, T::kQ8_1, nullptr, FromFloat<BlockQ8_1, QuantizeRowQ8_1>, nullptr);
  Set(t, T::kQ4_K, T::kQ8_K, ToFloat<BlockQ4_K, DequantizeRowQ4_K>,
      FromFloat<BlockQ4_K, QuantizeRowQ4_K>, VecDot<BlockQ4_K, BlockQ8_K, VecDotQ4_KQ8_K>);
  Set(t, T::kQ5_K, T::kQ8_K, ToFloat<BlockQ5_K, DequantizeRowQ5_K>,
      FromFloat<BlockQ5_K, QuantizeRowQ5_K>, VecDot<BlockQ5_K, BlockQ8_K, VecDotQ5_KQ8_K>);
  Set(t, T::kQ6_K, T::kQ8_K, ToFloat<BlockQ6_K, DequantizeRowQ6_K>,
      FromFloat<BlockQ6_K, QuantizeRowQ6_K>, VecDot<BlockQ6_K, BlockQ8_K, VecDotQ6_KQ8_K>);
  Set(t, T::kQ8_K, T::kQ8_K, ToFloat<BlockQ8_K, DequantizeRowQ8_K>,
      FromFloat<BlockQ8_K, QuantizeRowQ8_K>, nullptr);
  return t;
}

// Overrides the hot entries (activation quantizers, dots, f16 conversion) with one ISA's
// versions; dequantizers and weight quantizers stay scalar (load-time only).
#define FUCINA_APPLY_ISA(ns)                                                                  \
  Table ns##Table() {                                                                         \
    using T = GgmlType;                                                                       \
    Table t = ScalarTable();                                                                  \
    auto& f16 = t[static_cast<uint32_t>(T::kF16)];                                            \
    f16.to_float = ToFloat<f16_t, ns::ConvertF16ToF32>;                                       \
    f16.from_float = FromFloat<f16_t, ns::ConvertF32ToF16>;                                   \
    f16.vec_dot = VecDot<f16_t, float, ns::VecDotF16F32>;                                     \
    t[static_cast<uint32_t>(T::kBF16)].to_float = ToFloat<bf16_t, ns::ConvertBf16ToF32>;      \
    t[static_cast<uint32_t>(T::kBF16)].vec_dot = VecDot<bf16_t, float, ns::VecDotBf16F32>;    \
    t[static_cast<uint32_t>(T::kF32)].vec_dot = VecDot<float, float, ns::VecDotF32>;          \
    t[static_cast<uint32_t>(T::kQ4_0)].vec_dot = VecDot<BlockQ4_0, BlockQ8_0, ns::VecDotQ4_0Q8_0>; \
    t[static_cast<uint32_t>(T::kQ4_1)].vec_dot = VecDot<BlockQ4_1, BlockQ8_1, ns::VecDotQ4_1Q8_1>; \
    t[static_cast<uint32_t>(T::kQ5_0)].vec_dot = VecDot<BlockQ5_0, BlockQ8_0, ns::VecDotQ5_0Q8_0>; \
    t[static_cast<uint32_t>(T::kQ5_1)].vec_dot = VecDot<BlockQ5_1, BlockQ8_1, ns::VecDotQ5_1Q8_1>; \
    t[static_cast<uint32_t>(T::kQ8_0)].vec_dot = VecDot<BlockQ8_0, BlockQ8_0, ns::VecDotQ8_0Q8_0>; \
    t[static_cast<uint32_t>(T::kQ8_0)].from_float = FromFloat<BlockQ8_0, ns::QuantizeRowQ8_0>; \
    t[static_cast<uint32_t>(T::kQ8_1)].from_float = FromFloat<BlockQ8_1, ns::QuantizeRowQ8_1>; \
    t[static_cast<uint32_t>(T::kQ8_K)].from_float = FromFloat<BlockQ8_K, ns::QuantizeRowQ8_K>; \
    t[static_cast<uint32_t>(T::kQ4_K)].vec_dot = VecDot<BlockQ4_K, BlockQ8_K, ns::VecDotQ4_KQ8_K>; \
    t[static_cast<uint32_t>(T::kQ5_K)].vec_dot = VecDot<BlockQ5_K, BlockQ8_K, ns::VecDotQ5_KQ8_K>; \
    t[static_cast<uint32_t>(T::kQ6_K)].vec_dot = VecDot<BlockQ6_K, BlockQ8_K, ns::VecDotQ6_KQ8_K>; \
    return t;                                                                                 \
  }
FUCINA_APPLY_ISA(avx2)
FUCINA_APPLY_ISA(avx512)
#undef FUCINA_APPLY_ISA

void SetGemm(Table& t, GgmlType type, GemmFn gemm) { t[static_cast<uint32_t>(type)].gemm = gemm; }

// Tiled kernels, where an ISA has them (the scalar table has none: MatMulRef stays per-dot).
Table Avx2TableWithGemm() {
  using T = GgmlType;
  Table t = avx2Table();
  SetGemm(t, T::kQ8_0, avx2::GemmQ8_0Q8_0);
  t[static_cast<uint32_t>(T::kQ8_0)].gemm_tiles16 = avx2::GemmTilesQ8_0Q8_0;
  SetGemm(t, T::kQ4_0, avx2::GemmQ4_0Q8_0);
  t[static_cast<uint32_t>(T::kQ4_0)].gemm_tiles16 = avx2::GemmTilesQ4_0Q8_0;
  SetGemm(t, T::kQ4_1, avx2::GemmQ4_1Q8_1);
  t[static_cast<uint32_t>(T::kQ4_1)].gemm_tiles16 = avx2::GemmTilesQ4_1Q8_1;
  SetGemm(t, T::kQ5_0, avx2::GemmQ5_0Q8_0);
  t[static_cast<uint32_t>(T::kQ5_0)].gemm_tiles16 = avx2::GemmTilesQ5_0Q8_0;
  SetGemm(t, T::kQ5_1, avx2::GemmQ5_1Q8_1);
  t[static_cast<uint32_t>(T::kQ5_1)].gemm_tiles16 = avx2::GemmTilesQ5_1Q8_1;
  SetGemm(t, T::kQ4_K, avx2::GemmQ4_KQ8_K);
  t[static_cast<uint32_t>(T::kQ4_K)].gemm_tiles16 = avx2::GemmTilesQ4_KQ8_K;
  SetGemm(t, T::kQ5_K, avx2::GemmQ5_KQ8_K);
  t[static_cast<uint32_t>(T::kQ5_K)].gemm_tiles16 = avx2::GemmTilesQ5_KQ8_K;
  SetGemm(t, T::kQ6_K, avx2::GemmQ6_KQ8_K);
  SetGemm(t, T::kF32, avx2::GemmF32F32);
  SetGemm(t, T::kF16, avx2::GemmF16F32);
  SetGemm(t, T::kBF16, avx2::GemmBf16F32);
  return t;
}

Table Avx512TableWithGemm() {
  using T = GgmlType;
  Table t = avx512Table();
  SetGemm(t, T::kQ8_0, avx512::GemmQ8_0Q8_0);
  SetGemm(t, T::kQ4_0, avx512::GemmQ4_0Q8_0);
  SetGemm(t, T::kQ4_1, avx512::GemmQ4_1Q8_1);
  SetGemm(t, T::kQ5_0, avx512::GemmQ5_0Q8_0);
  SetGemm(t, T::kQ5_1, avx512::GemmQ5_1Q8_1);
  t[static_cast<uint32_t>(T::kQ8_0)].gemm_tiles16 = avx512::GemmTilesQ8_0Q8_0;
  t[static_cast<uint32_t>(T::kQ4_0)].gemm_tiles16 = avx512::GemmTilesQ4_0Q8_0;
  t[static_cast<uint32_t>(T::kQ4_1)].gemm_tiles16 = avx512::GemmTilesQ4_1Q8_1;
  SetGemm(t, T::kQ4_K, avx512::GemmQ4_KQ8_K);
  t[static_cast<uint32_t>(T::kQ4_K)].gemm_tiles16 = avx512::GemmTilesQ4_KQ8_K;
  SetGemm(t, T::kQ5_K, avx512::GemmQ5_KQ8_K);
  t[static_cast<uint32_t>(T::kQ5_K)].gemm_tiles16 = avx512::GemmTilesQ5_KQ8_K;
  SetGemm(t, T::kQ6_K, avx512::GemmQ6_KQ8_K);
  t[static_cast<uint32_t>(T::kQ6_K)].gemm_tiles16 = avx512::GemmTilesQ6_KQ8_K;
  SetGemm(t, T::kF32, avx512::GemmF32F32);
  SetGemm(t, T::kF16, avx512::GemmF16F32);
  SetGemm(t, T::kBF16, avx512::GemmBf16F32);
  return t;
}

const Table& TableFor(Isa isa) {
  static const Table scalar = ScalarTable();
  static const Table avx2_table = Avx2TableWithGemm();
  static const Table avx512_table = Avx512TableWithGemm();
  switch (isa) {
    case Isa::kAvx512: return avx512_table;
    case Isa::kAvx2: return avx2_table;
    case Isa::kScalar: break;
  }
  return scalar;
}

}  // namespace

const CpuTypeTraits* GetCpuTraits(GgmlType type, Isa isa) {
  const uint32_t id = static_cast<uint32_t>(type);
  if (id >= kNumTypeIds) return nullptr;
  const CpuTypeTraits& t = TableFor(isa)[id];
  return t.from_float == nullptr && t.to_float == nullptr ? nullptr : &t;
}

const CpuTypeTraits* GetCpuTraits(GgmlType type) { return GetCpuTraits(type, ActiveIsa()); }

}  // namespace fucina
