// Private: register-tiled matrix kernels (the GemmFn entries of kernels/type_traits.h).
//
// Contract of every Gemm* below (GemmFn): for r < rows, c < cols
//   y[c * y_stride + r] = dot(weight row r, activation row c) over k elements,
// where weight row r starts at w + r * w_stride (bytes, blocks of the weight type) and
// activation row c at x + c * x_stride (bytes, blocks of the weight type's vec_dot_type). k is a
// multiple of the block size; rows, cols >= 0. Results equal the per-type vec_dot up to float
// summation order (same integer block sums, same per-block scales).
//
// The kernels compute tiles of several weight rows x several activation rows (16 x 8 or 4 x 4
// on AVX-512, 4 x 6 for float weights; on AVX2 8 x 4 or 16 x 1 for the legacy formats and
// packed Q4_K, 1 x 8 for the other k-quants, 3 x 4 for float weights; docs/kernels.md), so each
// loaded block serves every row or column of the tile. Columns (activation rows) are the outer
// loop: a caller passing a block of weight rows keeps those rows in L2 while every activation
// tile streams past them.
#ifndef FUCINA_KERNELS_CPU_GEMM_ISA_H_
#define FUCINA_KERNELS_CPU_GEMM_ISA_H_

#include <cstddef>
#include <cstdint>

// For the tile kernels' helpers: a tile's accumulators stay in registers only when every step
// is inlined into its loop, which GCC's size heuristics would otherwise decline for the wider
// instantiations.
#define FUCINA_ALWAYS_INLINE inline __attribute__((always_inline))

namespace fucina {

#define FUCINA_GEMM_ONE_DECL(name)                                                          \
  void name(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,         \
            size_t x_stride, int64_t cols, float* y, size_t y_stride);

#define FUCINA_GEMM_LEGACY_DECLS   \
  FUCINA_GEMM_ONE_DECL(GemmQ8_0Q8_0) \
  FUCINA_GEMM_ONE_DECL(GemmQ4_0Q8_0) \
  FUCINA_GEMM_ONE_DECL(GemmQ4_1Q8_1) \
  FUCINA_GEMM_ONE_DECL(GemmQ5_0Q8_0) \
  FUCINA_GEMM_ONE_DECL(GemmQ5_1Q8_1)

// Float weights against f32 activations (gemm_float_{avx2,avx512}.cc).
#define FUCINA_GEMM_FLOAT_DECLS     \
  FUCINA_GEMM_ONE_DECL(GemmF32F32) \
  FUCINA_GEMM_ONE_DECL(GemmF16F32) \
  FUCINA_GEMM_ONE_DECL(GemmBf16F32)

// The k-quants against Q8_K activations (gemm_k_{avx2,avx512}.cc).
#define FUCINA_GEMM_K_DECLS          \
  FUCINA_GEMM_ONE_DECL(GemmQ4_KQ8_K) \
  FUCINA_GEMM_ONE_DECL(GemmQ5_KQ8_K) \
  FUCINA_GEMM_ONE_DECL(GemmQ6_KQ8_K)

// Only callable when ActiveIsa() is at least the namespace's level (kernels/cpu/isa.h).
namespace avx2 {
FUCINA_GEMM_LEGACY_DECLS
// Weights in WeightLayout::kTiles16 (kernels/tile_layout.h; gemm_tiles_avx2.cc).
FUCINA_GEMM_ONE_DECL(GemmTilesQ8_0Q8_0)
FUCINA_GEMM_ONE_DECL(GemmTilesQ4_0Q8_0)
FUCINA_GEMM_ONE_DECL(GemmTilesQ4_1Q8_1)
FUCINA_GEMM_ONE_DECL(GemmTilesQ4_KQ8_K)
FUCINA_GEMM_ONE_DECL(GemmTilesQ5_KQ8_K)
FUCINA_GEMM_ONE_DECL(GemmTilesQ5_0Q8_0)
FUCINA_GEMM_ONE_DECL(GemmTilesQ5_1Q8_1)
FUCINA_GEMM_FLOAT_DECLS
FUCINA_GEMM_K_DECLS
}  // namespace avx2
namespace avx512 {
FUCINA_GEMM_LEGACY_DECLS
// Weights in WeightLayout::kTiles16 (kernels/tile_layout.h).
FUCINA_GEMM_ONE_DECL(GemmTilesQ8_0Q8_0)
FUCINA_GEMM_ONE_DECL(GemmTilesQ4_0Q8_0)
FUCINA_GEMM_ONE_DECL(GemmTilesQ4_1Q8_1)
FUCINA_GEMM_ONE_DECL(GemmTilesQ4_KQ8_K)
FUCINA_GEMM_ONE_DECL(GemmTilesQ5_KQ8_K)
FUCINA_GEMM_ONE_DECL(GemmTilesQ6_KQ8_K)
FUCINA_GEMM_FLOAT_DECLS
FUCINA_GEMM_K_DECLS
}  // namespace avx512

}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_GEMM_ISA_H_
