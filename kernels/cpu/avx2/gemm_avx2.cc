// AVX2 + FMA + F16C tile kernels for kernels/cpu/gemm_isa.h: the legacy 32-element formats
// with 5-bit quants, Q5_0 and Q5_1 (Q8_0, Q4_0 and Q4_1 are in gemm_tiles_avx2.cc).
//
// A tile is kR weight rows x kC activation rows (kR * kC <= 8 pairs, one float accumulator of
// 8 lanes each). Per block, each weight row is unpacked once and each activation block loaded
// once; a pair then costs one u8 x s8 multiply-add chain, a convert and an FMA with its scale,
// and the horizontal sums happen once per tile. Every pair does the same operations in the
// same order whatever the tile's shape, so all shapes (and decode against prefill) agree bit
// for bit. Decode takes 4 x 1 (four independent FMA chains per block, four rows streamed
// together); prefill and lockstep batches take 1 x 8 (ColumnTile), which unpacks a weight row
// once for 8 activation rows, repacked once per call so that each step reads them through
// one pointer and loads their 8 scales at once.
//
// Unsigned weights (nibbles plus 16) go into _mm256_maddubs_epi16 as they are (|u| <= 31 and
// |y| <= 127 cannot saturate the int16 pair sums). ColumnTile takes Q5_0 signed (its offset of
// 16 subtracted as bytes) through the |x| * (y * sign(x)) identity, which needs y in
// [-127, 127] as the Q8 quantizers give.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina::avx2 {
namespace {

constexpr int kDecodeRows = 4;  // the decode tile's weight rows (short edges repeat the last)
constexpr int kMaxCols = 8;     // the widest tile's activation rows

// Lane i = horizontal sum of v[i].
FUCINA_ALWAYS_INLINE __m128 Reduce4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256 s01 = _mm256_hadd_ps(v0, v1);  // per 128-bit half: [v0 pairs, v1 pairs]
  const __m256 s23 = _mm256_hadd_ps(v2, v3);
  const __m256 s = _mm256_hadd_ps(s01, s23);  // per half: [v0, v1, v2, v3] partials
  return _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
}

// 0x10 in byte j where bit j of the little-endian qh is set, else 0.
FUCINA_ALWAYS_INLINE __m256i HighBits(const uint8_t qh[4]) {
  return _mm256_and_si256(BytesFromBits(qh), _mm256_set1_epi8(0x10));
}

// The block's leading f16 fields as 32 bits: d only, or d | (m or s) << 16 when kTwo.
template <bool kTwo>
FUCINA_ALWAYS_INLINE uint32_t HalfFields(const void* block) {
  uint32_t u = 0;
  std::memcpy(&u, block, kTwo ? 4 : 2);
  return u;
}

// The leading f16 fields of block i of kN <= 8 rows, as floats: lane n of d is row n's d and,
// kTwo, lane n of e its second field (m or s). The halves are packed in general registers and
// moved into the vector unit once per field.
template <bool kTwo, int kN, typename B>
FUCINA_ALWAYS_INLINE void Fields(const B* const* rows, int64_t i, __m256* d, __m256* e) {
  static_assert(kN <= 8);
  uint64_t dw[2] = {0, 0}, ew[2] = {0, 0};
  for (int n = 0; n < kN; ++n) {
    const uint32_t u = HalfFields<kTwo>(&rows[n][i]);
    dw[n / 4] |= static_cast<uint64_t>(u & 0xFFFF) << (16 * (n % 4));
    if constexpr (kTwo) ew[n / 4] |= static_cast<uint64_t>(u >> 16) << (16 * (n % 4));
  }
  const auto convert = [](const uint64_t* w) {
    if constexpr (kN <= 4) {  // one 64-bit move; lanes 4..7 are zero
      return _mm256_zextps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(w[0]))));
    } else {
      return _mm256_cvtph_ps(
          _mm_set_epi64x(static_cast<int64_t>(w[1]), static_cast<int64_t>(w[0])));
    }
  };
  *d = convert(dw);
  if constexpr (kTwo) *e = convert(ew);
}

// Quants gives unsigned values, from which the format's kOffset is to be subtracted (Q5_0) or
// to which, kHasMin, the block's m (weights) times s (activations) is added (Q5_1).
struct Q5_0Policy {
  using W = BlockQ5_0;
  using X = BlockQ8_0;
  static constexpr char kOffset = 16;
  static constexpr bool kHasMin = false;
  static FUCINA_ALWAYS_INLINE __m256i Quants(const W& b) {
    return _mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh));
  }
};
struct Q5_1Policy {
  using W = BlockQ5_1;
  using X = BlockQ8_1;
  static constexpr char kOffset = 0;
  static constexpr bool kHasMin = true;
  static FUCINA_ALWAYS_INLINE __m256i Quants(const W& b) {
    return _mm256_or_si256(UnpackNibbles(b.qs), HighBits(b.qh));
  }
};

template <typename P, int kR, int kC>
struct LegacyTile {
  using W = typename P::W;
  using X = typename P::X;
  // Pair p = c * kR + r of weight row r and activation row c.
  static constexpr int kPairs = kR * kC;
  static_assert(kPairs <= 8);

  // Lane p of the permutation that spreads a per-row (or, `column`, per-column) vector of
  // Fields over the pairs.
  static FUCINA_ALWAYS_INLINE __m256i PairLanes(bool column) {
    int lane[8] = {};
    for (int p = 0; p < kPairs; ++p) lane[p] = column ? p / kR : p % kR;
    return _mm256_setr_epi32(lane[0], lane[1], lane[2], lane[3], lane[4], lane[5], lane[6],
                             lane[7]);
  }

  __m256 acc[kPairs];
  __m256 offs;  // kHasMin: lane p accumulates m_w * s_y of pair p.

  FUCINA_ALWAYS_INLINE void Step(const W* const* wr, const X* const* xc, int64_t i) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 dw, mw, dx, sx;
    Fields<P::kHasMin, kR>(wr, i, &dw, &mw);
    Fields<P::kHasMin, kC>(xc, i, &dx, &sx);
    // The scale d_w * d_x of every pair, in memory: each pair broadcasts its own with a load.
    // (Broadcasting lanes of a register instead kept Zen 3's one shuffle port busiest.)
    const auto per_pair = [](__m256 v, bool column) {
      // A tile of one row (or one column) needs no spreading: lane p is already the column's.
      if ((column && kR == 1) || (!column && kC == 1)) return v;
      return _mm256_permutevar8x32_ps(v, PairLanes(column));
    };
    // Stored as 128-bit halves: a broadcast load forwarded from part of a 256-bit store
    // measured ~15% slower decode on Zen 3.
    alignas(32) float scale[8];
    const __m256 products = _mm256_mul_ps(per_pair(dw, false), per_pair(dx, true));
    _mm_store_ps(scale, _mm256_castps256_ps128(products));
    if constexpr (kPairs > 4) _mm_store_ps(scale + 4, _mm256_extractf128_ps(products, 1));
    if constexpr (P::kHasMin) {
      offs = _mm256_fmadd_ps(per_pair(mw, false), per_pair(sx, true), offs);
    }
    // The offset formats subtract c * sum(y) once per activation block, shared by the tile's
    // rows (ColumnTile, with one row, takes the weights as signed q - c instead). Integer sums
    // are exact either way.
    __m256i q[kR];
    for (int r = 0; r < kR; ++r) q[r] = P::Quants(wr[r][i]);
    for (int c = 0; c < kC; ++c) {
      const __m256i yq = Load32(xc[c][i].qs);
      __m256i corr = _mm256_setzero_si256();
      if constexpr (P::kOffset != 0) {
        corr = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(P::kOffset), yq), ones);
      }
      for (int r = 0; r < kR; ++r) {
        __m256i sum = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], yq), ones);
        if constexpr (P::kOffset != 0) sum = _mm256_sub_epi32(sum, corr);
        const int p = c * kR + r;
        acc[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ss(&scale[p]), acc[p]);
      }
    }
  }

  // ahead != 0 (a single pass over the weights, which reads each byte once): while this tile
  // runs, the same bytes `ahead` further on (the next tile's rows) are requested into L2, one
  // request per 64-byte line. Rows read side by side are short streams to the hardware
  // prefetchers, which then keep too few lines in flight.
  void Run(int64_t nb, const uint8_t* w, size_t w_stride, int rows, const uint8_t* x,
           size_t x_stride, float* y, size_t y_stride, size_t ahead) {
    const W* wr[kR];
    for (int r = 0; r < kR; ++r) {
      wr[r] = reinterpret_cast<const W*>(w + (r < rows ? r : rows - 1) * w_stride);
    }
    const X* xc[kC];
    for (int c = 0; c < kC; ++c) xc[c] = reinterpret_cast<const X*>(x + c * x_stride);
    for (int p = 0; p < kPairs; ++p) acc[p] = _mm256_setzero_ps();
    offs = _mm256_setzero_ps();
    if (ahead != 0) {
      constexpr int64_t kEvery = 64 / sizeof(W) > 0 ? 64 / sizeof(W) : 1;
      for (int64_t i = 0; i < nb; i += kEvery) {
        for (int r = 0; r < kR; ++r) {
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
    for (int p0 = 0; p0 < kPairs; p0 += 4) {
      const auto pick = [&](int p) { return acc[p < kPairs ? p : p0]; };
      __m128 s = Reduce4(pick(p0), pick(p0 + 1), pick(p0 + 2), pick(p0 + 3));
      if constexpr (P::kHasMin) s = _mm_add_ps(s, _mm_load_ps(o + p0));
      alignas(16) float t[4];
      _mm_store_ps(t, s);
      for (int j = 0; j < 4 && p0 + j < kPairs; ++j) {
        const int r = (p0 + j) % kR, c = (p0 + j) / kR;
        if (r < rows) y[c * y_stride + r] = t[j];
      }
    }
  }
};

// A group of nc <= kMaxCols activation rows repacked for the 1 x kC tiles, once per call: for
// block i, the rows' quants side by side (qs[i * nc + c]) and their f16 fields converted, lane c
// of d[i] (and, for Q8_1, of s[i]). One pointer walks each and a step loads all the group's
// scales at once, where gathering 8 f16 fields per step cost ~30 instructions in general
// registers (the loop was bound by instruction issue, not by its vector pipes).
struct PackedCols {
  const __m256i* qs;
  const __m256* d;
  const __m256* s;
};

// False if the per-thread scratch cannot be had.
template <typename X>
bool Pack(int64_t nb, const uint8_t* x, size_t x_stride, int nc, PackedCols* out) {
  constexpr bool kSums = std::is_same_v<X, BlockQ8_1>;
  const size_t need = static_cast<size_t>(nb) * (nc + (kSums ? 2 : 1)) * sizeof(__m256i);
  auto* qs = static_cast<__m256i*>(ThreadScratch(need));
  if (qs == nullptr) return false;
  auto* d = reinterpret_cast<__m256*>(qs + nb * nc);
  auto* s = kSums ? d + nb : nullptr;
  for (int64_t i = 0; i < nb; ++i) {
    alignas(32) float fd[8] = {}, fs[8] = {};
    for (int c = 0; c < nc; ++c) {
      const X& b = reinterpret_cast<const X*>(x + c * x_stride)[i];
      qs[i * nc + c] = Load32(b.qs);
      fd[c] = _cvtsh_ss(b.d);
      if constexpr (kSums) fs[c] = _cvtsh_ss(b.s);
    }
    d[i] = _mm256_load_ps(fd);
    if constexpr (kSums) s[i] = _mm256_load_ps(fs);
  }
  *out = {qs, d, s};
  return true;
}

// One weight row against kC packed activation rows. Each pair does what LegacyTile's pairs do,
// in the same order (the same d_w * d_x product, the same integer chain, one FMA), so results
// match the decode tile bit for bit. The offset formats take their quants signed (q - 8,
// q - 16): with one row, the c * sum(y) correction would otherwise be paid by every pair.
template <typename P, int kC>
struct ColumnTile {
  using W = typename P::W;
  static constexpr bool kSignedPath = P::kOffset != 0;

  __m256 acc[kC];
  __m256 offs;  // kHasMin: lane c accumulates m_w * s_y of column c.

  FUCINA_ALWAYS_INLINE void Step(const W& w, const PackedCols& x, int64_t i) {
    const uint32_t fields = HalfFields<P::kHasMin>(&w);
    const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(fields & 0xFFFF)));
    // Stored as 128-bit halves for the pairs' broadcast loads (see LegacyTile::Step).
    alignas(32) float scale[8];
    const __m256 products = _mm256_mul_ps(dw, x.d[i]);
    _mm_store_ps(scale, _mm256_castps256_ps128(products));
    if constexpr (kC > 4) _mm_store_ps(scale + 4, _mm256_extractf128_ps(products, 1));
    if constexpr (P::kHasMin) {
      const __m256 mw = _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(fields >> 16)));
      offs = _mm256_fmadd_ps(mw, x.s[i], offs);
    }
    __m256i q = P::Quants(w);
    if constexpr (kSignedPath) q = _mm256_sub_epi8(q, _mm256_set1_epi8(P::kOffset));
    const __m256i magnitude = kSignedPath ? _mm256_sign_epi8(q, q) : q;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = 0; c < kC; ++c) {
      const __m256i yq = x.qs[i * kC + c];
      const __m256i pairs = kSignedPath
                                ? _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(yq, q))
                                : _mm256_maddubs_epi16(q, yq);
      const __m256i sum = _mm256_madd_epi16(pairs, ones);
      acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_broadcast_ss(&scale[c]), acc[c]);
    }
  }

  // ahead != 0: prefetch the weight row `ahead` bytes on, as LegacyTile::Run does.
  void Run(int64_t nb, const uint8_t* w, const PackedCols& x, float* y, size_t y_stride,
           size_t ahead) {
    const W* wr = reinterpret_cast<const W*>(w);
    for (int c = 0; c < kC; ++c) acc[c] = _mm256_setzero_ps();
    offs = _mm256_setzero_ps();
    if (ahead != 0) {
      constexpr int64_t kEvery = 64 / sizeof(W) > 0 ? 64 / sizeof(W) : 1;
      for (int64_t i = 0; i < nb; i += kEvery) {
        _mm_prefetch(reinterpret_cast<const char*>(wr + i) + ahead, _MM_HINT_T1);
        const int64_t end = i + kEvery < nb ? i + kEvery : nb;
        for (int64_t j = i; j < end; ++j) Step(wr[j], x, j);
      }
    } else {
      for (int64_t i = 0; i < nb; ++i) Step(wr[i], x, i);
    }
    alignas(32) float o[8];
    if constexpr (P::kHasMin) _mm256_store_ps(o, offs);
    for (int c0 = 0; c0 < kC; c0 += 4) {
      const auto pick = [&](int c) { return acc[c < kC ? c : c0]; };
      __m128 s = Reduce4(pick(c0), pick(c0 + 1), pick(c0 + 2), pick(c0 + 3));
      if constexpr (P::kHasMin) s = _mm_add_ps(s, _mm_load_ps(o + c0));
      alignas(16) float t[4];
      _mm_store_ps(t, s);
      for (int j = 0; j < 4 && c0 + j < kC; ++j) y[(c0 + j) * y_stride] = t[j];
    }
  }
};

// A packed group of nc <= kC columns: the narrowest instantiation that holds them.
template <typename P, int kC>
FUCINA_ALWAYS_INLINE void RunCols(int nc, int64_t nb, const uint8_t* w, const PackedCols& x,
                                  float* y, size_t y_stride, size_t ahead) {
  if constexpr (kC > 1) {
    if (nc < kC) {
      RunCols<P, kC - 1>(nc, nb, w, x, y, y_stride, ahead);
      return;
    }
  }
  ColumnTile<P, kC>().Run(nb, w, x, y, y_stride, ahead);
}

// One activation row through the decode tile.
template <typename P>
void DecodeColumn(int64_t nb, const uint8_t* wb, size_t w_stride, int64_t rows,
                  const uint8_t* x, float* y) {
  for (int64_t r0 = 0; r0 < rows; r0 += kDecodeRows) {
    const int nr = static_cast<int>(rows - r0 < kDecodeRows ? rows - r0 : kDecodeRows);
    LegacyTile<P, kDecodeRows, 1>().Run(nb, wb + r0 * w_stride, w_stride, nr, x, 0, y + r0, 1,
                                        kDecodeRows * w_stride);
  }
}

// The caller (kernels/cpu/matmul.cc) hands over ~256 KiB of weight rows at a time, so the
// column groups outside pass over weights held in L2. A call with one column group is a
// single pass: it prefetches the next tile's rows. Where the per-thread scratch for the packed
// columns cannot be had, the columns go one at a time through the decode tile (same bits).
template <typename P>
void GemmLegacy(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  const int64_t nb = k / 32;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  if (cols == 1) {
    DecodeColumn<P>(nb, wb, w_stride, rows, xb, y);
    return;
  }
  const size_t ahead = cols <= kMaxCols ? w_stride : 0;
  for (int64_t c0 = 0; c0 < cols; c0 += kMaxCols) {
    const int nc = static_cast<int>(cols - c0 < kMaxCols ? cols - c0 : kMaxCols);
    PackedCols packed;
    if (!Pack<typename P::X>(nb, xb + c0 * x_stride, x_stride, nc, &packed)) {
      for (int c = 0; c < nc; ++c) {
        DecodeColumn<P>(nb, wb, w_stride, rows, xb + (c0 + c) * x_stride, y + (c0 + c) * y_stride);
      }
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) {
      RunCols<P, kMaxCols>(nc, nb, wb + r * w_stride, packed, y + c0 * y_stride + r, y_stride,
                           ahead);
    }
  }
}

}  // namespace

void GemmQ5_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q5_0Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q5_1Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx2
