// Per-dtype CPU kernels in one table: the only place that switches on GgmlType.
//
// A matvec with weights of type T quantizes its f32 activations once into T's vec_dot_type
// (Q8_0, Q8_1, Q8_K, or F32 for the float types) and then calls T's vec_dot per weight row,
// exactly as llama.cpp does, so our numerics follow the reference implementation.
#ifndef FUCINA_KERNELS_TYPE_TRAITS_H_
#define FUCINA_KERNELS_TYPE_TRAITS_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/ggml_type.h"

namespace fucina {

// n is always a multiple of the type's block size.
using ToFloatFn = void (*)(const void* x, float* y, int64_t n);
using FromFloatFn = void (*)(const float* x, void* y, int64_t n);
// Dot of one row of this type (x) with one row of vec_dot_type (y), n elements.
using VecDotFn = float (*)(int64_t n, const void* x, const void* y);
// Many dots at once, register-tiled (kernels/cpu/gemm_isa.h): for r < rows, c < cols,
//   y[c * y_stride + r] = vec_dot(k, w + r * w_stride, x + c * x_stride)
// up to float summation order. Strides of w and x are in bytes, y_stride in floats.
using GemmFn = void (*)(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                        size_t x_stride, int64_t cols, float* y, size_t y_stride);

struct CpuTypeTraits {
  GgmlType type;
  GgmlType vec_dot_type;
  ToFloatFn to_float = nullptr;      // null: no dequantizer for this type.
  FromFloatFn from_float = nullptr;  // reference quantizer (weights and activations).
  VecDotFn vec_dot = nullptr;        // null: no matvec for this type.
  GemmFn gemm = nullptr;             // optional tiled vec_dot; null: MatMul uses vec_dot.
  // The same for weights in WeightLayout::kTiles16 (w: the first row's tile, rows a multiple
  // of 16, w_stride the row-major row stride); null: the type has no such layout here.
  GemmFn gemm_tiles16 = nullptr;
};

// Kernels for `type` at the active ISA (kernels/cpu/isa.h). Null for types with no CPU
// kernels (IQ*, TQ*, MXFP4, Q2_K, Q3_K for now).
const CpuTypeTraits* GetCpuTraits(GgmlType type);
// The same at an explicit ISA level (for tests and benchmarks). Precondition: isa <= DetectedIsa().
const CpuTypeTraits* GetCpuTraits(GgmlType type, Isa isa);

// Whether weights of `type` can be used in a matvec (has vec_dot).
inline bool HasMatVec(GgmlType type) {
  const CpuTypeTraits* t = GetCpuTraits(type);
  return t != nullptr && t->vec_dot != nullptr;
}

}  // namespace fucina

#endif  // FUCINA_KERNELS_TYPE_TRAITS_H_
