// AVX2 k-quant dots (Q4_K, Q5_K, Q6_K against Q8_K) and their tile kernels for
// kernels/cpu/gemm_isa.h.
//
// The weights are unpacked in registers and multiplied as bytes: _mm256_maddubs_epi16 (u8
// weight x s8 activation, pairs summed to s16; never saturates: |15*127*2|, |31*127*2|,
// |63*128*2| all fit) then _mm256_madd_epi16 with the sub-block scale into int32, summed over
// the super-block. Integer sums are exact, so the only difference from the scalar reference is
// the order of the float accumulation.
//
// A tile is one weight row x up to kMaxRn activation rows. The row's quants are unpacked once
// per super-block and every column then does exactly the float operations of the one-pair
// dot, in the same order, into its own accumulators: the vec_dot entries are the 1 x 1 tile,
// and a tile equals the dots of its pairs bit for bit (prefill, decode and the per-dot path
// agree exactly). Unpacking is what the tile saves: per dot it costs about as much as the
// multiplies. One weight row by 8 columns measured fastest of 4x2, 2x2, 2x3, 2x4 and 1x2..1x8
// on Zen 3 (the 8 int32 column sums, the unpacked quants and the scales fill the 16
// registers; more weight rows spill).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/cpu/k_scales.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/k_quants.h"

namespace fucina::avx2 {
namespace {

// Activation rows of the widest tile (see above).
constexpr int kMaxRn = 8;
// A one-column tile (decode) prefetches its row's stream this far ahead. The rows follow each
// other in memory, but the hardware prefetchers alone kept too few lines in flight: Q6_K
// decode on 1024-wide rows read 11-13 GB/s without, 17-19 with (2, 4 and 8 KiB alike) on a
// 20 GB/s Zen 3 core.
constexpr size_t kAhead = 4096;

// `scales` holds the 8 sub-block scales as s16 in both 128-bit lanes; returns scale k in all
// 16 lanes (k is a constant after unrolling, so the control vector is too).
FUCINA_ALWAYS_INLINE __m256i BroadcastScale(__m256i scales, int k) {
  return _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * k)));
}

// The Q4_K/Q5_K min term mins[j/2] * bsums[j] as 8 int32 partial sums. `sm` holds the mins in
// bytes 8..15; each is duplicated to meet the two 16-element bsums of its 32-element sub-block.
FUCINA_ALWAYS_INLINE __m256i MinTerm(__m128i sm, const int16_t* bsums) {
  const __m128i dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
  return _mm256_madd_epi16(mins16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)));
}

// Per column of a tile: d * sum_b cvt(isum_b) and, for Q4_K/Q5_K, the min term
// dmin * sum_b cvt(MinTerm_b), each as 8 partial float sums (lanes of positions).
template <int kRn>
struct LaneAccumulators {
  __m256 acc[kRn];
  __m256 acc_min[kRn];

  FUCINA_ALWAYS_INLINE void Zero() {
    for (int c = 0; c < kRn; ++c) acc[c] = acc_min[c] = _mm256_setzero_ps();
  }
  // Super-block i's integer sums for column c: d * isum (and dmin * the min term).
  template <bool kHasMin>
  FUCINA_ALWAYS_INLINE void Add(int c, __m256i isum, __m256i min_term, float d, float dmin) {
    if constexpr (kHasMin) {
      acc_min[c] = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_term), acc_min[c]);
    }
    acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc[c]);
  }
  FUCINA_ALWAYS_INLINE void EndBlock(int64_t, int64_t) {}
  // y[c * y_stride] for each column c.
  FUCINA_ALWAYS_INLINE void Store(bool has_min, float* y, size_t y_stride) const {
    for (int c = 0; c < kRn; ++c) {
      y[c * y_stride] = has_min ? HorizontalSum(acc[c]) - HorizontalSum(acc_min[c])
                                : HorizontalSum(acc[c]);
    }
  }
};

// Q4_K's and Q5_K's arithmetic, shared with their kTiles16 kernel (gemm_tiles_avx2.cc): per
// super-block the exact integer sums into one float per pair (KDotStep, avx2_util.h), so the
// row-major tile, the dot and the packed kernel agree bit for bit.
template <int kRn>
struct BlockAccumulators {
  float chunk[kRn];
  float total[kRn];

  FUCINA_ALWAYS_INLINE void Zero() {
    for (int c = 0; c < kRn; ++c) chunk[c] = total[c] = 0.0f;
  }
  template <bool>
  FUCINA_ALWAYS_INLINE void Add(int c, __m256i isum, __m256i min_term, float d, float dmin) {
    chunk[c] = KDotStep(chunk[c], HorizontalSum(isum), HorizontalSum(min_term), d, dmin);
  }
  FUCINA_ALWAYS_INLINE void EndBlock(int64_t i, int64_t nb) {
    if ((i + 1) % kKDotChunk != 0 && i + 1 != nb) return;
    for (int c = 0; c < kRn; ++c) {
      total[c] = i < kKDotChunk ? chunk[c] : total[c] + chunk[c];
      chunk[c] = 0.0f;
    }
  }
  FUCINA_ALWAYS_INLINE void Store(bool, float* y, size_t y_stride) const {
    for (int c = 0; c < kRn; ++c) y[c * y_stride] = total[c];
  }
};

// ---------------------------------------------------------------------------------------------
// Q4_K and Q5_K (kHigh) differ only in the 5th bit. Per super-block:
//   d * sum_j scale_j * <q_j, q8_j>  -  dmin * sum_j min_j * (sum of q8 over sub-block j).

template <bool kHigh>
struct QxK {
  using Block = std::conditional_t<kHigh, BlockQ5_K, BlockQ4_K>;
  static constexpr bool kHasMin = true;
  template <int kRn>  // the sums are exact per super-block (see BlockAccumulators)
  using Accumulators = BlockAccumulators<kRn>;

  // Super-block i of weight row w against kRn activation rows.
  template <int kRn, typename A>
  static FUCINA_ALWAYS_INLINE void Step(const Block& w, const BlockQ8_K* const* xc, int64_t i,
                                        A* t) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m128i sm = UnpackScalesMins(w.scales);
    const __m256i scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    __m256i isum[kRn];
    for (int c = 0; c < kRn; ++c) isum[c] = _mm256_setzero_si256();
    for (int j = 0; j < kQK_K / 64; ++j) {
      const __m256i q4 = Load32(w.qs + 32 * j);
      __m256i lo = _mm256_and_si256(q4, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
      if constexpr (kHigh) {
        // Sub-block 2j takes bit 2j of qh, sub-block 2j+1 bit 2j+1; set bits add 16.
        const __m256i hbits = Load32(w.qh);
        const __m256i bit_lo = _mm256_set1_epi8(static_cast<char>(1 << (2 * j)));
        const __m256i bit_hi = _mm256_set1_epi8(static_cast<char>(2 << (2 * j)));
        const __m256i k16 = _mm256_set1_epi8(16);
        lo = _mm256_or_si256(
            lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit_lo), bit_lo), k16));
        hi = _mm256_or_si256(
            hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit_hi), bit_hi), k16));
      }
      const __m256i sl = BroadcastScale(scales16, 2 * j);
      const __m256i sh = BroadcastScale(scales16, 2 * j + 1);
      for (int c = 0; c < kRn; ++c) {
        const int8_t* q8 = xc[c][i].qs + 64 * j;
        const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, Load32(q8)), sl);
        const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, Load32(q8 + 32)), sh);
        isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(pl, ph));
        asm("" : "+x"(isum[c]));  // as in Q6K::Step: keep the column chains
      }
    }
    const float d_w = _cvtsh_ss(w.d);
    const float dmin_w = _cvtsh_ss(w.dmin);
    for (int c = 0; c < kRn; ++c) {
      t->template Add<true>(c, isum[c], MinTerm(sm, xc[c][i].bsums), d_w * xc[c][i].d,
                            dmin_w * xc[c][i].d);
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Q6_K. Per super-block: d * sum_j sc_j * <q_j - 32, q8_j> over 16 sub-blocks of 16. The -32
// offset is folded out with the activations' block sums: <q - 32, q8> = <q, q8> - 32 * bsum,
// so the byte products stay unsigned x signed for maddubs.

struct Q6K {
  using Block = BlockQ6_K;
  static constexpr bool kHasMin = false;
  template <int kRn>
  using Accumulators = LaneAccumulators<kRn>;

  template <int kRn, typename A>
  static FUCINA_ALWAYS_INLINE void Step(const Block& w, const BlockQ8_K* const* xc, int64_t i,
                                        A* t) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i high2 = _mm256_set1_epi8(0x30);
    const __m128i raw_scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scales));
    const __m256i sc16 = _mm256_cvtepi8_epi16(raw_scales);  // the 16 scales as s16
    // The even scales as s16 in the low 128-bit lane, the odd ones in the high lane: chunk
    // `pair` (sub-blocks 2 pair, 2 pair + 1 in its two lanes) takes its scales with one
    // vpshufb (BroadcastScale).
    const __m256i sc_split = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
        raw_scales, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)));
    __m256i isum[kRn];
    for (int c = 0; c < kRn; ++c) {
      const __m256i bsums = Load32(xc[c][i].bsums);
      isum[c] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                 _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5));
    }
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w.ql + 64 * half;
      const __m256i l0 = Load32(ql);
      const __m256i l1 = Load32(ql + 32);
      const __m256i h = Load32(w.qh + 32 * half);
      // Unrolled whole: k picks the registers and BroadcastScale's control vector.
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        // Elements 32k..32k+31 of this half: the low nibbles of l0 (k even) or l1 (k odd),
        // then their high ones, with qh bits 2k..2k+1 moved to bits 4..5. (16-bit shifts: the
        // bits a byte takes from its neighbour are masked off.) Unpacked where used: the four
        // of a half held at once beside 8 columns' sums outlived the 16 registers.
        const __m256i l = k % 2 == 0 ? l0 : l1;
        const __m256i lo = k < 2 ? l : _mm256_srli_epi16(l, 4);
        const __m256i hi = k == 0 ? _mm256_slli_epi16(h, 4)
                           : k == 1 ? _mm256_slli_epi16(h, 2)
                           : k == 2 ? h
                                    : _mm256_srli_epi16(h, 2);
        const __m256i q = _mm256_or_si256(_mm256_and_si256(lo, low4), _mm256_and_si256(hi, high2));
        const __m256i scale = BroadcastScale(sc_split, 4 * half + k);
        for (int c = 0; c < kRn; ++c) {
          const __m256i q8 = Load32(xc[c][i].qs + 128 * half + 32 * k);
          isum[c] = _mm256_add_epi32(isum[c],
                                     _mm256_madd_epi16(_mm256_maddubs_epi16(q, q8), scale));
          // Keeps GCC from reassociating the sums into "every product first", which put 8
          // products of each step on the stack.
          asm("" : "+x"(isum[c]));
        }
      }
    }
    const float d_w = _cvtsh_ss(w.d);
    for (int c = 0; c < kRn; ++c) {
      t->template Add<false>(c, isum[c], _mm256_setzero_si256(), d_w * xc[c][i].d, 0.0f);
    }
  }
};

// ---------------------------------------------------------------------------------------------

// One weight row (nb super-blocks at w) against kRn activation rows x_stride apart; y[c *
// y_stride] gets column c.
template <typename P, int kRn>
void RunTile(int64_t nb, const uint8_t* w, const uint8_t* x, size_t x_stride, float* y,
             size_t y_stride) {
  const auto* wb = reinterpret_cast<const typename P::Block*>(w);
  const BlockQ8_K* xc[kRn];
  for (int c = 0; c < kRn; ++c) xc[c] = reinterpret_cast<const BlockQ8_K*>(x + c * x_stride);
  typename P::template Accumulators<kRn> t;
  t.Zero();
  for (int64_t i = 0; i < nb; ++i) {
    if constexpr (kRn == 1) {
      const char* ahead = reinterpret_cast<const char*>(&wb[i]) + kAhead;
      for (size_t l = 0; l < sizeof(typename P::Block); l += 64) {
        _mm_prefetch(ahead + l, _MM_HINT_T0);
      }
    }
    P::template Step<kRn>(wb[i], xc, i, &t);
    t.EndBlock(i, nb);
  }
  t.Store(P::kHasMin, y, y_stride);
}

// The tile of width kRn when nc == kRn, else the next narrower one: every width 1..kMaxRn is
// instantiated, so the last, partial group of columns still runs as one tile.
template <typename P, int kRn>
FUCINA_ALWAYS_INLINE void RunCols(int nc, int64_t nb, const uint8_t* w, const uint8_t* x,
                                  size_t x_stride, float* y, size_t y_stride) {
  if constexpr (kRn > 1) {
    if (nc < kRn) {
      RunCols<P, kRn - 1>(nc, nb, w, x, x_stride, y, y_stride);
      return;
    }
  }
  RunTile<P, kRn>(nb, w, x, x_stride, y, y_stride);
}

// The caller (kernels/cpu/matmul.cc) hands over ~256 KiB of weight rows at a time, so the
// column groups outside pass over weights held in L2.
template <typename P>
void GemmK(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
           size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  const int64_t nb = k / kQK_K;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  for (int64_t c0 = 0; c0 < cols; c0 += kMaxRn) {
    const int nc = static_cast<int>(cols - c0 < kMaxRn ? cols - c0 : kMaxRn);
    for (int64_t r = 0; r < rows; ++r) {
      RunCols<P, kMaxRn>(nc, nb, wb + r * w_stride, xb + c0 * x_stride, x_stride,
                         y + c0 * y_stride + r, y_stride);
    }
  }
}

// One weight row against one activation row: the 1 x 1 tile.
template <typename P>
float Dot(int64_t n, const void* x, const BlockQ8_K* y) {
  float out;
  RunTile<P, 1>(n / kQK_K, static_cast<const uint8_t*>(x), reinterpret_cast<const uint8_t*>(y),
                0, &out, 0);
  return out;
}

}  // namespace

float VecDotQ4_KQ8_K(int64_t n, const BlockQ4_K* x, const BlockQ8_K* y) {
  return Dot<QxK<false>>(n, x, y);
}
float VecDotQ5_KQ8_K(int64_t n, const BlockQ5_K* x, const BlockQ8_K* y) {
  return Dot<QxK<true>>(n, x, y);
}
float VecDotQ6_KQ8_K(int64_t n, const BlockQ6_K* x, const BlockQ8_K* y) {
  return Dot<Q6K>(n, x, y);
}

void GemmQ4_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmK<QxK<false>>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmK<QxK<true>>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ6_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmK<Q6K>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx2
