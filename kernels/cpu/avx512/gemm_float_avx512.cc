// AVX-512 tile kernels for float weights (F32, F16, BF16) against f32 activations, for
// kernels/cpu/gemm_isa.h.
//
// Both operands are contiguous along k, so a tile is a block of dot products: 4 weight rows x
// up to 6 activation rows, 24 accumulators of 16 lanes. Per 16 elements of k the tile loads
// (and widens to f32 in registers) one vector of each weight row and one of each activation
// row, and issues 24 FMAs: 10 loads and 4 conversions for 24 FMAs, so the two FMA ports stay
// the bottleneck. The 16 lanes of each accumulator are summed once at the end (Reduce4).
//
// Numerics: every product is an exact f32 product of the weight (f16 and bf16 widen exactly)
// and the f32 activation, as in the per-row vec_dot; only the summation order differs (16
// lane partial sums, then a tree).
//
// The walk over a call's tiles (activation groups, 1024-element k chunks kept in L1, row tiles
// from L2) is kernels/cpu/gemm_float_loop.h, shared with the AVX2 file.
#include "kernels/cpu/avx512/undefined_vectors.h"  // before any intrinsics: GCC bug 105593

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/avx512/tile_avx512.h"
#include "kernels/cpu/gemm_float_loop.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/fp16.h"

namespace fucina::avx512 {
namespace {

constexpr int kFRows = 4;       // weight rows per tile (short edges repeat the last row).
constexpr int kFCols = 6;       // activation rows per tile (1..6 instantiated).

// 16 weights at p as f32; the masked forms read only the lanes of `m`, the rest are zero.
struct F32Row {
  using T = float;
  static FUCINA_ALWAYS_INLINE __m512 Load(const T* p) { return _mm512_loadu_ps(p); }
  static FUCINA_ALWAYS_INLINE __m512 Load(const T* p, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, p);
  }
};
struct F16Row {
  using T = f16_t;
  static FUCINA_ALWAYS_INLINE __m512 Load(const T* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static FUCINA_ALWAYS_INLINE __m512 Load(const T* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};
struct Bf16Row {
  using T = bf16_t;
  // bf16 is the upper half of an f32: zero-extend to 32 bits and shift into place.
  static FUCINA_ALWAYS_INLINE __m512 Widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static FUCINA_ALWAYS_INLINE __m512 Load(const T* p) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static FUCINA_ALWAYS_INLINE __m512 Load(const T* p, __mmask16 m) {
    return Widen(_mm256_maskz_loadu_epi16(m, p));
  }
};

// The one-column tile of the decode walk (pf.run set, rows back to back): the same FMAs into
// the same accumulators in the same order as FloatTile below, so the same bits, but row by
// row: the tile's reads become one address-ordered stream instead of kFRows streams 2 KiB
// apart, and the out-of-order core overlaps one row's FMA chain with the next row's loads.
// On a Zen 5 core, f16 matvec of 1024 columns: 33 -> 39 GB/s, 94% -> 112% of a plain read.
//
// The stream is requested as the quantized tiles' are, PrefetchStream<kFloatFarRequests> from
// the line being read (into L2, each line 5 times, the farthest 48 KiB on), not pf.run's one
// prefetcht0 per line through the next tile: Qwen3-0.6B-shape BF16 decode on a Zen 4 core,
// alternated runs, 1 thread 21.0-21.3 -> 23.7-24.6 t/s, 2 threads 24.5-26.3 -> 25.7-27.5;
// F16 1 thread 20.0-20.9 -> 24.0-24.5, 2 threads the same (25.7-26.7).
// Where k is chunked (k > kFloatKChunk) the tile's reads are not in address order, but every
// line of the matrix is still requested from the lines before it.
constexpr int kFloatFarRequests = 2;
template <typename L>
FUCINA_ALWAYS_INLINE void FloatRowsInOrder(int64_t n, const typename L::T* const* wr,
                                           const float* x, int rows, float* y,
                                           bool accumulate) {
  using T = typename L::T;
  constexpr int64_t kLine = 64 / sizeof(T);  // elements per cache line.
  __m512 acc[kFRows];
  for (int r = 0; r < kFRows; ++r) acc[r] = _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    const T* w = wr[r];
    __m512 a = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      if (i % kLine == 0) {
        PrefetchStream<kFloatFarRequests>(reinterpret_cast<const uint8_t*>(w + i), 64,
                                          kStreamAhead);
      }
      a = _mm512_fmadd_ps(L::Load(w + i), _mm512_loadu_ps(x + i), a);
    }
    if (i < n) {
      const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
      a = _mm512_fmadd_ps(L::Load(w + i, m), _mm512_maskz_loadu_ps(m, x + i), a);
    }
    acc[r] = a;
  }
  StoreRows(y, rows, Reduce4(acc[0], acc[1], acc[2], acc[3]), accumulate);
}

// y[c * y_stride + r] (+)= dot(wr[r][0..n), xc[c][0..n)) for r < rows, c < kRn.
// pf: the decode-shaped prefetch of the next tile (gemm_float_loop.h), one request per
// 64-byte line read.
template <typename L, int kRn>
FUCINA_ALWAYS_INLINE void FloatTile(int64_t n, const typename L::T* const* wr,
                                    const float* const* xc, int rows, float* y, size_t y_stride,
                                    bool accumulate, const TilePrefetch& pf) {
  if constexpr (kRn == 1) {
    if (pf.run != nullptr) {
      FloatRowsInOrder<L>(n, wr, xc[0], rows, y, accumulate);
      return;
    }
  }
  using T = typename L::T;
  constexpr int64_t kLine = 64 / sizeof(T);  // elements per cache line.
  __m512 acc[kFRows][kRn];
  for (int r = 0; r < kFRows; ++r) {
    for (int c = 0; c < kRn; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    if (i % kLine == 0) PrefetchStep<kFRows>(pf, wr, i);
    __m512 w[kFRows];
    for (int r = 0; r < kFRows; ++r) w[r] = L::Load(wr[r] + i);
    for (int c = 0; c < kRn; ++c) {
      const __m512 x = _mm512_loadu_ps(xc[c] + i);
      for (int r = 0; r < kFRows; ++r) acc[r][c] = _mm512_fmadd_ps(w[r], x, acc[r][c]);
    }
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 w[kFRows];
    for (int r = 0; r < kFRows; ++r) w[r] = L::Load(wr[r] + i, m);
    for (int c = 0; c < kRn; ++c) {
      const __m512 x = _mm512_maskz_loadu_ps(m, xc[c] + i);
      for (int r = 0; r < kFRows; ++r) acc[r][c] = _mm512_fmadd_ps(w[r], x, acc[r][c]);
    }
  }
  for (int c = 0; c < kRn; ++c) {
    StoreRows(y + c * y_stride, rows, Reduce4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]),
              accumulate);
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

// Prefill-shaped calls with f16/bf16 weights widen the call's rows to f32 once, into
// per-thread scratch (the caller passes ~256 KiB of weight rows: 512 KiB widened, in L2), and
// run the f32 tiles over the copy: in the tile loop, 4 conversions (2 uops each) per 24 FMAs
// competed with the FMAs for the same two ports. The values are the same, so the results are.
template <typename L>
bool GemmWidened(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                 size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  using T = typename L::T;
  const size_t row_floats = static_cast<size_t>((k + 15) & ~int64_t{15});
  auto* wide = static_cast<float*>(TileScratch(rows * row_floats * sizeof(float)));
  if (wide == nullptr) return false;
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int64_t r = 0; r < rows; ++r) {
    const T* src = reinterpret_cast<const T*>(wb + r * w_stride);
    float* dst = wide + r * row_floats;
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) _mm512_store_ps(dst + i, L::Load(src + i));
    if (i < k) {
      const __mmask16 m = static_cast<__mmask16>((1u << (k - i)) - 1);
      _mm512_mask_storeu_ps(dst + i, m, L::Load(src + i, m));
    }
  }
  FloatTileLoop<FloatTiles<F32Row>>(k, wide, row_floats * sizeof(float), rows, x, x_stride, cols,
                                    y, y_stride);
  return true;
}

template <typename L>
void GemmFloat(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
               size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  if constexpr (!std::is_same_v<L, F32Row>) {
    if (cols > kFCols && GemmWidened<L>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride)) {
      return;
    }
  }
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

}  // namespace fucina::avx512
