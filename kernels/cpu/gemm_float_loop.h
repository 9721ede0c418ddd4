// Private to the float tile kernels (kernels/cpu/avx2/gemm_float_avx2.cc and
// kernels/cpu/avx512/gemm_float_avx512.cc): the walk over one GemmFn call's tiles, the same at
// every ISA; only the tile differs.
//
// Activation rows go in groups of Tile::kCols (the outer loop), then k in chunks of kKChunk,
// then weight rows in tiles of Tile::kRows: one chunk of the group's activation rows stays in
// L1 while every row tile of the call (the caller passes ~256 KiB of weight rows, kept in L2)
// passes over it, and partial sums are added into y from the second chunk on. Short edges
// repeat the last row / activation row (their results are never stored). Decode-shaped calls
// (one group) pass the tile the distance to the next row tile, for its prefetch.
//
// Internal linkage (anonymous namespace): the including files are compiled with ISA flags.
#ifndef FUCINA_KERNELS_CPU_GEMM_FLOAT_LOOP_H_
#define FUCINA_KERNELS_CPU_GEMM_FLOAT_LOOP_H_

#include <cstddef>
#include <cstdint>

namespace fucina {
namespace {

constexpr int64_t kFloatKChunk = 1024;  // elements of k per pass over the row tiles.

// Tile::Run<kRn>(n, wr, xc, rows, y, y_stride, accumulate, ahead) for kRn = nc.
template <typename Tile, int kRn>
inline void RunFloatTile(int nc, int64_t n, const typename Tile::T* const* wr,
                         const float* const* xc, int rows, float* y, size_t y_stride,
                         bool accumulate, size_t ahead) {
  if constexpr (kRn > 1) {
    if (nc < kRn) {
      RunFloatTile<Tile, kRn - 1>(nc, n, wr, xc, rows, y, y_stride, accumulate, ahead);
      return;
    }
  }
  Tile::template Run<kRn>(n, wr, xc, rows, y, y_stride, accumulate, ahead);
}

// The GemmFn contract (kernels/cpu/gemm_isa.h) for weights of Tile::T against f32 rows.
template <typename Tile>
void FloatTileLoop(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                   size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  using T = typename Tile::T;
  constexpr int kRows = Tile::kRows;
  constexpr int kCols = Tile::kCols;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  const size_t ahead = cols <= kCols ? kRows * w_stride : 0;
  for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
    const int nc = static_cast<int>(cols - c0 < kCols ? cols - c0 : kCols);
    for (int64_t k0 = 0; k0 < k; k0 += kFloatKChunk) {
      const int64_t n = k - k0 < kFloatKChunk ? k - k0 : kFloatKChunk;
      const float* xc[kCols];
      for (int c = 0; c < kCols; ++c) {
        xc[c] = reinterpret_cast<const float*>(xb + (c0 + (c < nc ? c : 0)) * x_stride) + k0;
      }
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        const int nr = static_cast<int>(rows - r0 < kRows ? rows - r0 : kRows);
        const T* wr[kRows];
        for (int r = 0; r < kRows; ++r) {
          wr[r] = reinterpret_cast<const T*>(wb + (r0 + (r < nr ? r : nr - 1)) * w_stride) + k0;
        }
        RunFloatTile<Tile, kCols>(nc, n, wr, xc, nr, y + c0 * y_stride + r0, y_stride, k0 > 0,
                                  ahead);
      }
    }
  }
}

}  // namespace
}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_GEMM_FLOAT_LOOP_H_
