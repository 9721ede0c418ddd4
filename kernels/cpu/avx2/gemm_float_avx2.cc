// AVX2 + FMA + F16C tile kernels for float weights (F32, F16, BF16) against f32 activations,
// for kernels/cpu/gemm_isa.h: the AVX-512 file's scheme (gemm_float_avx512.cc) at 8 lanes.
//
// A tile is 3 weight rows x up to 4 activation rows: 12 accumulators, the 3 widened weight
// vectors and one activation vector fill the 16 ymm registers. Per 8 elements of k: 3 weight
// loads (and conversions), 4 activation loads, 12 FMAs. Each accumulator's 8 lanes are summed
// once at the end. Products are exact f32 products (f16 and bf16 widen exactly); only the
// summation order differs from the per-row vec_dot. The elements past the last multiple of 8
// go through zero-padded copies. The walk over a call's tiles is kernels/cpu/gemm_float_loop.h.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/cpu/gemm_float_loop.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/fp16.h"

namespace fucina::avx2 {
namespace {

constexpr int kFRows = 3;          // weight rows per tile (short edges repeat the last row).
constexpr int kFCols = 4;          // activation rows per tile (1..4 instantiated).

// 8 weights at p as f32.
struct F32Row {
  using T = float;
  static FUCINA_ALWAYS_INLINE __m256 Load(const T* p) { return _mm256_loadu_ps(p); }
};
struct F16Row {
  using T = f16_t;
  static FUCINA_ALWAYS_INLINE __m256 Load(const T* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct Bf16Row {
  using T = bf16_t;
  // bf16 is the upper half of an f32: zero-extend to 32 bits and shift into place.
  static FUCINA_ALWAYS_INLINE __m256 Load(const T* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

// The one-column tile of the decode walk (pf.run set, rows back to back) for f32 weights:
// FloatTile's FMAs in its order, row by row, so the reads are one address-ordered stream (the
// AVX-512 file's FloatRowsInOrder says why). Not for f16/bf16: one 8-lane FMA chain covers
// only 16 bytes of them per FMA latency, and the row-by-row walk ran at half the tile's rate
// (f16 matvec of 1024 columns on a Zen 5 core: 34-36 -> 19 GB/s; f32: 34-35 -> 38-39).
template <typename L>
FUCINA_ALWAYS_INLINE void FloatRowsInOrder(int64_t n, const typename L::T* const* wr,
                                           const float* x, int rows, float* y, bool accumulate,
                                           const char* run) {
  using T = typename L::T;
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int r = 0; r < rows; ++r) {
    const T* w = wr[r];
    __m256 a = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      if (i % kLine == 0) PrefetchRowStep<T>(run, n, r, i);
      a = _mm256_fmadd_ps(L::Load(w + i), _mm256_loadu_ps(x + i), a);
    }
    if (i < n) {
      const size_t tail = static_cast<size_t>(n - i);
      T wpad[8] = {};
      std::memcpy(wpad, w + i, tail * sizeof(T));
      float xpad[8] = {};
      std::memcpy(xpad, x + i, tail * sizeof(float));
      a = _mm256_fmadd_ps(L::Load(wpad), _mm256_loadu_ps(xpad), a);
    }
    const float s = HorizontalSum(a);
    y[r] = accumulate ? y[r] + s : s;
  }
}

// y[c * y_stride + r] (+)= dot(wr[r][0..n), xc[c][0..n)) for r < rows, c < kRn. pf: the
// decode-shaped prefetch of the next tile (gemm_float_loop.h), one request per 64-byte line read.
template <typename L, int kRn>
FUCINA_ALWAYS_INLINE void FloatTile(int64_t n, const typename L::T* const* wr,
                                    const float* const* xc, int rows, float* y, size_t y_stride,
                                    bool accumulate, const TilePrefetch& pf) {
  if constexpr (kRn == 1 && sizeof(typename L::T) == 4) {
    if (pf.run != nullptr) {
      FloatRowsInOrder<L>(n, wr, xc[0], rows, y, accumulate, pf.run);
      return;
    }
  }
  using T = typename L::T;
  constexpr int64_t kLine = 64 / sizeof(T);
  __m256 acc[kFRows][kRn];
  for (int r = 0; r < kFRows; ++r) {
    for (int c = 0; c < kRn; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (i % kLine == 0) PrefetchStep<kFRows>(pf, wr, i);
    __m256 w[kFRows];
    for (int r = 0; r < kFRows; ++r) w[r] = L::Load(wr[r] + i);
    for (int c = 0; c < kRn; ++c) {
      const __m256 x = _mm256_loadu_ps(xc[c] + i);
      for (int r = 0; r < kFRows; ++r) acc[r][c] = _mm256_fmadd_ps(w[r], x, acc[r][c]);
    }
  }
  if (i < n) {
    const size_t tail = static_cast<size_t>(n - i);
    __m256 w[kFRows];
    for (int r = 0; r < kFRows; ++r) {
      T pad[8] = {};
      std::memcpy(pad, wr[r] + i, tail * sizeof(T));
      w[r] = L::Load(pad);
    }
    for (int c = 0; c < kRn; ++c) {
      float pad[8] = {};
      std::memcpy(pad, xc[c] + i, tail * sizeof(float));
      const __m256 x = _mm256_loadu_ps(pad);
      for (int r = 0; r < kFRows; ++r) acc[r][c] = _mm256_fmadd_ps(w[r], x, acc[r][c]);
    }
  }
  for (int c = 0; c < kRn; ++c) {
    float* yc = y + c * y_stride;
    for (int r = 0; r < rows; ++r) {
      const float s = HorizontalSum(acc[r][c]);
      yc[r] = accumulate ? yc[r] + s : s;
    }
  }
}

// The tile as FloatTileLoop (kernels/cpu/gemm_float_loop.h) drives it.
template <typename L>
struct FloatTiles {
  using T = typename L::T;
  static constexpr int kRows = kFRows;
  static constexpr int kCols = kFCols;
  template <int kRn>
  static FUCINA_ALWAYS_INLINE void Run(int64_t n, const T* const* wr, const float* const* xc,
                                       int rows, float* y, size_t y_stride, bool accumulate,
                                       const TilePrefetch& pf) {
    FloatTile<L, kRn>(n, wr, xc, rows, y, y_stride, accumulate, pf);
  }
};

template <typename L>
void GemmFloat(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
               size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  FloatTileLoop<FloatTiles<L>>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace

void GemmF32F32(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmFloat<F32Row>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmF16F32(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmFloat<F16Row>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmBf16F32(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                 size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmFloat<Bf16Row>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx2
