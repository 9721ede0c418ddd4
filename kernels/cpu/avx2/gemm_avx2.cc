// AVX2 + FMA + F16C tile kernels for kernels/cpu/gemm_isa.h (legacy 32-element formats).
//
// A tile is 4 weight rows x up to 2 activation rows (8 float accumulators of one block each:
// with 16 ymm registers a wider tile spills). Per block, each weight row is unpacked once and
// each activation block loaded once; a pair then costs one u8 x s8 multiply-add chain, a
// convert, a scale product and an FMA, and the horizontal sums happen once per tile.
// Unsigned weights (nibbles, plus 16 for the 5-bit formats) use _mm256_maddubs_epi16 directly
// (|u| <= 31 and |y| <= 128 cannot saturate the int16 pair sums) and subtract the format's
// offset as c * sum(y), computed once per activation block. Q8_0 weights are signed and use
// the |x| * (y * sign(x)) identity, which needs y in [-127, 127] as the Q8 quantizers give.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina::avx2 {
namespace {

constexpr int kRm = 4;     // weight rows per tile (fixed; short edges repeat the last row).
constexpr int kMaxRn = 2;  // activation rows per tile (1..2 instantiated).

// Lane i = horizontal sum of v[i].
FUCINA_ALWAYS_INLINE __m128 Reduce4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256 s01 = _mm256_hadd_ps(v0, v1);  // per 128-bit half: [v0 pairs, v1 pairs]
  const __m256 s23 = _mm256_hadd_ps(v2, v3);
  const __m256 s = _mm256_hadd_ps(s01, s23);  // per half: [v0, v1, v2, v3] partials
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

FUCINA_ALWAYS_INLINE void StoreRows(float* y, int rows, __m128 v) {
  if (rows == kRm) {
    _mm_storeu_ps(y, v);
    return;
  }
  alignas(16) float t[4];
  _mm_store_ps(t, v);
  for (int r = 0; r < rows; ++r) y[r] = t[r];
}

// 0x10 in byte j where bit j of the little-endian qh is set, else 0.
FUCINA_ALWAYS_INLINE __m256i HighBits(const uint8_t qh[4]) {
  return _mm256_and_si256(BytesFromBits(qh), _mm256_set1_epi8(0x10));
}

// The block's leading f16 fields as 32 bits: d only, or d | (m or s) << 16 when kTwo.
template <bool kTwo>
FUCINA_ALWAYS_INLINE int HalfFields(const void* block) {
  uint32_t u = 0;
  std::memcpy(&u, block, kTwo ? 4 : 2);
  return static_cast<int>(u);
}

// kOffset: unsigned quants, c * sum(y) subtracted back; 0 with !kSigned: unsigned, no offset;
// kSigned: signed quants (Q8_0).
struct Q8_0Policy {
  using W = BlockQ8_0;
  using X = BlockQ8_0;
  static constexpr bool kSigned = true;
  static constexpr char kOffset = 0;
  static constexpr bool kHasMin = false;
  static FUCINA_ALWAYS_INLINE __m256i Quants(const W& b) { return Load32(b.qs); }
};
struct Q4_0Policy {
  using W = BlockQ4_0;
  using X = BlockQ8_0;
  static constexpr bool kSigned = false;
  static constexpr char kOffset = 8;
  static constexpr bool kHasMin = false;
  static FUCINA_ALWAYS_INLINE __m256i Quants(const W& b) { return UnpackNibbles(b.qs); }
};
struct Q4_1Policy {
  using W = BlockQ4_1;
  using X = BlockQ8_1;
  static constexpr bool kSigned = false;
  static constexpr char kOffset = 0;
  static constexpr bool kHasMin = true;
  static FUCINA_ALWAYS_INLINE __m256i Quants(const W& b) { return UnpackNibbles(b.qs); }
};
struct Q5_0Policy {
  using W = BlockQ5_0;
  using X = BlockQ8_0;
  static constexpr bool kSigned = false;
  static constexpr char kOffset = 16;
  static constexpr bool kHasMin = false;
  static FUCINA_ALWAYS_INLINE __m256i Quants(const W& b) {
    return _mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh));
  }
};
struct Q5_1Policy {
  using W = BlockQ5_1;
  using X = BlockQ8_1;
  static constexpr bool kSigned = false;
  static constexpr char kOffset = 0;
  static constexpr bool kHasMin = true;
  static FUCINA_ALWAYS_INLINE __m256i Quants(const W& b) {
    return _mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh));
  }
};

// The 4 weight rows' f16 scales (and mins, kHasMin) as floats: lane r of *d (and *m).
template <typename P>
FUCINA_ALWAYS_INLINE void RowScales(const typename P::W* const* wr, int64_t i, __m128* d,
                                    __m128* m) {
  if constexpr (P::kHasMin) {
    // [d_0, m_0, d_1, m_1, ...] -> [d_0..d_3, m_0..m_3].
    const auto f = [&](int r) { return static_cast<uint32_t>(HalfFields<true>(&wr[r][i])); };
    const __m256 fw = _mm256_permutevar8x32_ps(
        _mm256_cvtph_ps(_mm_set_epi64x(static_cast<int64_t>(f(2) | uint64_t{f(3)} << 32),
                                       static_cast<int64_t>(f(0) | uint64_t{f(1)} << 32))),
        _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    *d = _mm256_castps256_ps128(fw);
    *m = _mm256_extractf128_ps(fw, 1);
  } else {
    // The four halves packed in a general register: one move into the vector unit.
    uint64_t u = 0;
    for (int r = 0; r < kRm; ++r) {
      u |= static_cast<uint64_t>(static_cast<uint16_t>(HalfFields<false>(&wr[r][i]))) << (16 * r);
    }
    *d = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(u)));
  }
}

template <typename P, int kRn>
struct LegacyTile {
  using W = typename P::W;
  using X = typename P::X;

  __m256 acc[kRm][kRn];
  __m256 offs;  // kHasMin: lane 4c + r accumulates m_w * s_y of pair (r, c).

  FUCINA_ALWAYS_INLINE void Step(const W* const* wr, const X* const* xc, int64_t i) {
    const __m256i ones = _mm256_set1_epi16(1);
    // The scale d_w * d_x of every pair, in memory: each pair broadcasts its own with a load.
    // (Broadcasting lanes of a register instead kept Zen 3's one shuffle port busiest.)
    alignas(16) float scale[kRn][kRm];
    __m128 dw, mw;
    RowScales<P>(wr, i, &dw, &mw);
    uint64_t xu = 0;  // the columns' leading fields: [d_0, d_1] or [d_0, s_0, d_1, s_1]
    for (int c = 0; c < kRn; ++c) {
      xu |= static_cast<uint64_t>(static_cast<uint32_t>(HalfFields<P::kHasMin>(&xc[c][i])))
            << ((P::kHasMin ? 32 : 16) * c);
    }
    const __m128 fx = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(xu)));
    for (int c = 0; c < kRn; ++c) {
      const int lane = P::kHasMin ? 2 * c : c;
      const __m128 dx = _mm_permutevar_ps(fx, _mm_set1_epi32(lane));
      _mm_store_ps(scale[c], _mm_mul_ps(dw, dx));
    }
    __m256i q[kRm], sign[kRm];
    for (int r = 0; r < kRm; ++r) {
      q[r] = P::Quants(wr[r][i]);
      if constexpr (P::kSigned) {
        sign[r] = q[r];
        q[r] = _mm256_sign_epi8(q[r], q[r]);
      }
    }
    for (int c = 0; c < kRn; ++c) {
      const __m256i yq = Load32(xc[c][i].qs);
      __m256i corr = _mm256_setzero_si256();
      if constexpr (P::kOffset != 0) {
        corr = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(P::kOffset), yq), ones);
      }
      for (int r = 0; r < kRm; ++r) {
        const __m256i y_signed = P::kSigned ? _mm256_sign_epi8(yq, sign[r]) : yq;
        __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], y_signed), ones);
        if constexpr (P::kOffset != 0) sum = _mm256_sub_epi32(sum, corr);
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ss(&scale[c][r]),
                                    acc[r][c]);
      }
    }
    if constexpr (P::kHasMin) {
      // Lane 4c + r: m_r times s_c (lane 2c + 1 of fx).
      const __m256 m = _mm256_set_m128(mw, mw);
      const __m256 s = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(fx),
                                                _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
      offs = _mm256_fmadd_ps(m, s, offs);
    }
  }

  // ahead != 0 (decode-shaped calls, which read each weight byte once): while this tile runs,
  // the same bytes `ahead` further on (the next tile's rows) are requested into L2, one request
  // per 64-byte line. Four rows read side by side are four short streams to the hardware
  // prefetchers, which then keep too few lines in flight.
  void Run(int64_t nb, const uint8_t* w, size_t w_stride, int rows, const uint8_t* x,
           size_t x_stride, float* y, size_t y_stride, size_t ahead) {
    const W* wr[kRm];
    for (int r = 0; r < kRm; ++r) {
      wr[r] = reinterpret_cast<const W*>(w + (r < rows ? r : rows - 1) * w_stride);
    }
    const X* xc[kRn];
    for (int c = 0; c < kRn; ++c) xc[c] = reinterpret_cast<const X*>(x + c * x_stride);
    for (int r = 0; r < kRm; ++r) {
      for (int c = 0; c < kRn; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    offs = _mm256_setzero_ps();
    if (ahead != 0) {
      constexpr int64_t kEvery = 64 / sizeof(W) > 0 ? 64 / sizeof(W) : 1;
      for (int64_t i = 0; i < nb; i += kEvery) {
        for (int r = 0; r < kRm; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(wr[r] + i) + ahead, _MM_HINT_T1);
        }
        const int64_t end = i + kEvery < nb ? i + kEvery : nb;
        for (int64_t j = i; j < end; ++j) Step(wr, xc, j);
      }
    } else {
      for (int64_t i = 0; i < nb; ++i) Step(wr, xc, i);
    }
    alignas(32) float o[8];
    if constexpr (P::kHasMin) _mm256_store_ps(o, offs);
    for (int c = 0; c < kRn; ++c) {
      __m128 s = Reduce4(acc[0][c], acc[1][c], acc[2][c], acc[3][c]);
      if constexpr (P::kHasMin) s = _mm_add_ps(s, _mm_load_ps(o + 4 * c));
      StoreRows(y + c * y_stride, rows, s);
    }
  }
};

template <typename P>
void GemmLegacy(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  const int64_t nb = k / 32;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  // One pass over the weights (a decode-shaped call) reads each byte once: prefetch the next
  // tile's rows.
  const size_t ahead = cols <= kMaxRn ? kRm * w_stride : 0;
  for (int64_t c0 = 0; c0 < cols; c0 += kMaxRn) {
    const int64_t nc = cols - c0 < kMaxRn ? cols - c0 : kMaxRn;
    const uint8_t* xt = xb + c0 * x_stride;
    for (int64_t r0 = 0; r0 < rows; r0 += kRm) {
      const int nr = static_cast<int>(rows - r0 < kRm ? rows - r0 : kRm);
      const uint8_t* wt = wb + r0 * w_stride;
      float* yt = y + c0 * y_stride + r0;
      if (nc == 2) {
        LegacyTile<P, 2>().Run(nb, wt, w_stride, nr, xt, x_stride, yt, y_stride, ahead);
      } else {
        LegacyTile<P, 1>().Run(nb, wt, w_stride, nr, xt, x_stride, yt, y_stride, ahead);
      }
    }
  }
}

}  // namespace

void GemmQ8_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q8_0Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ4_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q4_0Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ4_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q4_1Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q5_0Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q5_1Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx2
