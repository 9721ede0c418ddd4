// Private to the float tile kernels (kernels/cpu/avx2/gemm_float_avx2.cc and
// kernels/cpu/avx512/gemm_float_avx512.cc): the walk over one GemmFn call's tiles, the same at
// every ISA; only the tile differs.
//
// Activation rows go in groups of Tile::kCols (the outer loop), then k in chunks of kKChunk,
// then weight rows in tiles of Tile::kRows: one chunk of the group's activation rows stays in
// L1 while every row tile of the call (the caller passes ~256 KiB of weight rows, kept in L2)
// passes over it, and partial sums are added into y from the second chunk on. Short edges
// repeat the last row / activation row (their results are never stored).
//
// Decode-shaped calls (one group) read each weight once, so the tile also requests the next
// row tile (TilePrefetch). Where rows lie back to back the walk is row tiles outer, chunks
// inner, and the requests are one address-ordered run through the next tile, into L1: a
// tile's 3-4 interleaved row streams, requested per row into L2, kept too few lines in flight
// (on a Zen 5 core, f16 matvecs of 1024 and 3072 columns: 91% -> 97% and 79% -> 85% of the
// read bandwidth). Each row's chunk sums are still added into y in k order, so the results
// are the same bits. A one-column tile then reads its rows one after another (the tiles'
// FloatRowsInOrder), so the call is a single address-ordered stream.
//
// Internal linkage (anonymous namespace): the including files are compiled with ISA flags.
#ifndef FUCINA_KERNELS_CPU_GEMM_FLOAT_LOOP_H_
#define FUCINA_KERNELS_CPU_GEMM_FLOAT_LOOP_H_

#include <cstddef>
#include <cstdint>

namespace fucina {
namespace {

constexpr int64_t kFloatKChunk = 1024;  // elements of k per pass over the row tiles.

// Where a decode-shaped tile requests the next row tile while it reads its own. `run`: this
// pass's share of the next tile (its n elements of every row, rows back to back), requested
// in address order, kRows lines per 64 bytes of a row read; else `ahead` > 0: the same
// elements of each row, `ahead` bytes on, into L2; else nothing.
struct TilePrefetch {
  const char* run = nullptr;
  size_t ahead = 0;
};

// pf's requests while a tile of kRows rows reads the 64-byte line of each row from element i
// of its pass on (i a multiple of 64 / sizeof(T)). __builtin_prefetch locality 3 and 2 are
// prefetcht0 and prefetcht1 on x86.
template <int kRows, typename T>
inline void PrefetchStep(const TilePrefetch& pf, const T* const* wr, int64_t i) {
  if (pf.run != nullptr) {
    const char* run = pf.run + i * static_cast<int64_t>(sizeof(T)) * kRows;
    for (int r = 0; r < kRows; ++r) __builtin_prefetch(run + 64 * r, 0, 3);
  } else if (pf.ahead != 0) {
    for (int r = 0; r < kRows; ++r) {
      __builtin_prefetch(reinterpret_cast<const char*>(wr[r] + i) + pf.ahead, 0, 2);
    }
  }
}

// The same run requested by a one-column tile that reads its rows one after another (the
// tiles' FloatRowsInOrder): row r's share of the run, one line per line read from element i.
template <typename T>
inline void PrefetchRowStep(const char* run, int64_t n, int r, int64_t i) {
  __builtin_prefetch(run + (r * n + i) * static_cast<int64_t>(sizeof(T)), 0, 3);
}

// Tile::Run<kRn>(n, wr, xc, rows, y, y_stride, accumulate, pf) for kRn = nc.
template <typename Tile, int kRn>
inline void RunFloatTile(int nc, int64_t n, const typename Tile::T* const* wr,
                         const float* const* xc, int rows, float* y, size_t y_stride,
                         bool accumulate, const TilePrefetch& pf) {
  if constexpr (kRn > 1) {
    if (nc < kRn) {
      RunFloatTile<Tile, kRn - 1>(nc, n, wr, xc, rows, y, y_stride, accumulate, pf);
      return;
    }
  }
  Tile::template Run<kRn>(n, wr, xc, rows, y, y_stride, accumulate, pf);
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
  // Tile (r0, k0): its row pointers from k0 on, and its activation rows' chunk.
  auto tile = [&](int64_t c0, int nc, int64_t k0, int64_t r0, const TilePrefetch& pf) {
    const int64_t n = k - k0 < kFloatKChunk ? k - k0 : kFloatKChunk;
    const float* xc[kCols];
    for (int c = 0; c < kCols; ++c) {
      xc[c] = reinterpret_cast<const float*>(xb + (c0 + (c < nc ? c : 0)) * x_stride) + k0;
    }
    const int nr = static_cast<int>(rows - r0 < kRows ? rows - r0 : kRows);
    const T* wr[kRows];
    for (int r = 0; r < kRows; ++r) {
      wr[r] = reinterpret_cast<const T*>(wb + (r0 + (r < nr ? r : nr - 1)) * w_stride) + k0;
    }
    RunFloatTile<Tile, kCols>(nc, n, wr, xc, nr, y + c0 * y_stride + r0, y_stride, k0 > 0, pf);
  };
  const int nc0 = static_cast<int>(cols < kCols ? cols : kCols);
  if (cols <= kCols && w_stride == static_cast<size_t>(k) * sizeof(T)) {
    for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
      const auto* next = reinterpret_cast<const char*>(wb + (r0 + kRows) * w_stride);
      for (int64_t k0 = 0; k0 < k; k0 += kFloatKChunk) {
        tile(0, nc0, k0, r0, {next + k0 * static_cast<int64_t>(sizeof(T)) * kRows, 0});
      }
    }
    return;
  }
  const TilePrefetch pf{nullptr, cols <= kCols ? kRows * w_stride : 0};
  for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
    const int nc = static_cast<int>(cols - c0 < kCols ? cols - c0 : kCols);
    for (int64_t k0 = 0; k0 < k; k0 += kFloatKChunk) {
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) tile(c0, nc, k0, r0, pf);
    }
  }
}

}  // namespace
}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_GEMM_FLOAT_LOOP_H_
