// AVX-512 (F/BW/VL/DQ + VNNI) tile kernels of the k-quants (Q4_K, Q5_K, Q6_K) for
// kernels/cpu/gemm_isa.h, in the row-transposed scheme of tile_avx512.h: 16 weight rows x up
// to 8 activation rows, one weight row per int32 lane, activation dwords broadcast into
// vpdpbusd. Per super-block the rows' headers are transposed once and unpacked lane-wise; the
// quants are transposed 16 bytes at a time and shared by every activation row of the tile.
//
// Q4_K / Q5_K: each 32-element sub-block costs 8 vpdpbusd per activation row, scaled in float
// by (scale * d) of each row at once; the min term sum_j m_j * bsum_j is 4 vpdpwssd on int16
// pairs per activation row and super-block.
// Q6_K: each 16-element sub-block costs 4 vpdpbusd on the unsigned 6-bit quants and one int32
// multiply by its signed scale; the -32 offset comes back as 32 * sum_j sc_j * bsum_j (8
// vpdpwssd). The whole super-block is summed in int32, exactly as the scalar reference, and
// converted once.
// GCC 12's AVX-512 headers build "undefined" vectors as `__Y = __Y` (GCC bug 105593), which
// raises spurious (maybe-)uninitialized warnings wherever those intrinsics are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/avx512/tile_avx512.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/quant/blocks.h"

namespace fucina::avx512 {
namespace {

// vpternlogd immediates (a, b, c operand order): (a & c) | b, and (a & c) | (b & ~c).
constexpr int kAndCOrB = 0xEC;

// ---------------------------------------------------------------------------------------------
// Q4_K and Q5_K.

constexpr int kKChunk = 16;  // super-blocks of activation metadata prepared at once (k = 4096).

struct KActivationMeta {
  float d[kTCols][kKChunk];
  // (bsum32 of sub-block 2p, of 2p + 1) as int16 pairs, bsum32 = sum of its 32 quants.
  int32_t bsum_pairs[kTCols][kKChunk][4];
};

void PrepareQ4KMeta(const uint8_t* const* xc, int nc, int64_t b0, int64_t n,
                    KActivationMeta* meta) {
  for (int c = 0; c < nc; ++c) {
    const BlockQ8_K* x = reinterpret_cast<const BlockQ8_K*>(xc[c]) + b0;
    for (int64_t j = 0; j < n; ++j) {
      meta->d[c][j] = x[j].d;
      for (int p = 0; p < 4; ++p) {
        const int16_t* bs = x[j].bsums + 4 * p;
        const uint32_t lo = static_cast<uint16_t>(bs[0] + bs[1]);
        const uint32_t hi = static_cast<uint16_t>(bs[2] + bs[3]);
        meta->bsum_pairs[c][j][p] = static_cast<int32_t>(lo | (hi << 16));
      }
    }
  }
}

// Bit 4 of each byte of the result = bit `bit` of the same byte of h (other bits arbitrary).
FUCINA_TILE_INLINE __m512i BitTo4(__m512i h, int bit) {
  if (bit < 4) return _mm512_slli_epi16(h, 4 - bit);
  if (bit > 4) return _mm512_srli_epi16(h, bit - 4);
  return h;
}

// kHigh: Q5_K (block with qh[32] before qs; element 32s + l of a 64-element pair takes bit s
// of qh[l] as its 5th bit), else Q4_K.
template <bool kHigh, int kRn>
FUCINA_TILE_INLINE void QxKTile(const uint8_t* const* rp, const uint8_t* const* xc, int64_t b0,
                                int64_t n, const KActivationMeta& meta, int rows, float* y,
                                size_t y_stride, bool accumulate) {
  using W = typename std::conditional<kHigh, BlockQ5_K, BlockQ4_K>::type;
  // Bytes with the high bit set give 0; 0x80 in the other positions of each pattern.
  const __m512i byte_pat[4] = {DwordPattern(0x80808000u), DwordPattern(0x80808001u),
                               DwordPattern(0x80808002u), DwordPattern(0x80808003u)};
  const __m512i pair01 = DwordPattern(0x80018000u);
  const __m512i pair23 = DwordPattern(0x80038002u);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f);
  const __m512i m4 = _mm512_set1_epi32(0x0f0f0f0f);
  const __m512i m2 = _mm512_set1_epi32(0x03030303);
  __m512 acc[kRn];
  for (int c = 0; c < kRn; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = b0 + j;
    const size_t off = b * sizeof(W);
    __m512i h[4];  // d|dmin, then scale bytes 0-3, 4-7, 8-11 (kernels/quant/blocks.h).
    LoadTransposed(rp, off, h);
    const __m512 d = LowHalves(h[0]);
    const __m512 dmin = LowHalves(_mm512_srli_epi32(h[0], 16));
    // As get_scale_min_k4: scales 0-3, 4-7 and mins 0-3, 4-7 as bytes of one dword each.
    __m512i sc[2], mn[2];
    sc[0] = _mm512_and_si512(h[1], m6);
    sc[1] = _mm512_or_si512(_mm512_and_si512(h[3], m4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[1], 6), m2), 4));
    mn[0] = _mm512_and_si512(h[2], m6);
    mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 4), m4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[2], 6), m2), 4));
    __m512i qh[8];
    if constexpr (kHigh) {
      LoadTransposed(rp, off + offsetof(BlockQ5_K, qh), qh);
      LoadTransposed(rp, off + offsetof(BlockQ5_K, qh) + 16, qh + 4);
    }
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      // 32 bytes of qs: low nibbles are sub-block 2t, high nibbles 2t + 1.
      __m512i tq[8];
      LoadTransposed(rp, off + offsetof(W, qs) + 32 * t, tq);
      LoadTransposed(rp, off + offsetof(W, qs) + 32 * t + 16, tq + 4);
      __m512i lo[8], hi[8];
      for (int k = 0; k < 8; ++k) {
        if constexpr (kHigh) {
          lo[k] = _mm512_ternarylogic_epi32(tq[k], _mm512_and_si512(BitTo4(qh[k], 2 * t), bit4),
                                            low4, kAndCOrB);
          hi[k] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(tq[k], 4),
                                            _mm512_and_si512(BitTo4(qh[k], 2 * t + 1), bit4),
                                            low4, kAndCOrB);
        } else {
          lo[k] = _mm512_and_si512(tq[k], low4);
          hi[k] = _mm512_and_si512(_mm512_srli_epi16(tq[k], 4), low4);
        }
      }
      const int s_lo = 2 * t, s_hi = 2 * t + 1;
      const __m512 sd_lo = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_shuffle_epi8(sc[s_lo / 4], byte_pat[s_lo % 4])), d);
      const __m512 sd_hi = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_shuffle_epi8(sc[s_hi / 4], byte_pat[s_hi % 4])), d);
      for (int c = 0; c < kRn; ++c) {
        const uint8_t* yq = xc[c] + b * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs) + 64 * t;
        __m512i sum_lo = _mm512_setzero_si512();
        __m512i sum_hi = _mm512_setzero_si512();
        for (int k = 0; k < 8; ++k) {
          sum_lo = _mm512_dpbusd_epi32(sum_lo, lo[k], BroadcastDword(yq + 4 * k));
          sum_hi = _mm512_dpbusd_epi32(sum_hi, hi[k], BroadcastDword(yq + 32 + 4 * k));
        }
        const __m512 dx = _mm512_set1_ps(meta.d[c][j]);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_lo), _mm512_mul_ps(sd_lo, dx), acc[c]);
        acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_hi), _mm512_mul_ps(sd_hi, dx), acc[c]);
      }
    }
    const __m512i mins[4] = {_mm512_shuffle_epi8(mn[0], pair01), _mm512_shuffle_epi8(mn[0], pair23),
                             _mm512_shuffle_epi8(mn[1], pair01), _mm512_shuffle_epi8(mn[1], pair23)};
    for (int c = 0; c < kRn; ++c) {
      __m512i ms = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {
        ms = _mm512_dpwssd_epi32(ms, mins[p], _mm512_set1_epi32(meta.bsum_pairs[c][j][p]));
      }
      acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms),
                                _mm512_mul_ps(dmin, _mm512_set1_ps(meta.d[c][j])), acc[c]);
    }
  }
  for (int c = 0; c < kRn; ++c) StoreTile(acc[c], rows, y + c * y_stride, accumulate);
}

template <bool kHigh>
void GemmQxK(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
             size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  const int64_t nb = k / kQK_K;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  KActivationMeta meta;
  for (int64_t c0 = 0; c0 < cols; c0 += kTCols) {
    const int nc = static_cast<int>(cols - c0 < kTCols ? cols - c0 : kTCols);
    const uint8_t* xc[kTCols];
    for (int c = 0; c < kTCols; ++c) xc[c] = xb + (c0 + (c < nc ? c : 0)) * x_stride;
    for (int64_t b0 = 0; b0 < nb; b0 += kKChunk) {
      const int64_t n = nb - b0 < kKChunk ? nb - b0 : kKChunk;
      PrepareQ4KMeta(xc, nc, b0, n, &meta);
      for (int64_t r0 = 0; r0 < rows; r0 += kTRows) {
        const int nr = static_cast<int>(rows - r0 < kTRows ? rows - r0 : kTRows);
        const uint8_t* rp[kTRows];
        TileRows(wb, w_stride, r0, nr, rp);
        float* yt = y + c0 * y_stride + r0;
        const bool acc = b0 > 0;
        switch (nc) {
          case 8: QxKTile<kHigh, 8>(rp, xc, b0, n, meta, nr, yt, y_stride, acc); break;
          case 7: QxKTile<kHigh, 7>(rp, xc, b0, n, meta, nr, yt, y_stride, acc); break;
          case 6: QxKTile<kHigh, 6>(rp, xc, b0, n, meta, nr, yt, y_stride, acc); break;
          case 5: QxKTile<kHigh, 5>(rp, xc, b0, n, meta, nr, yt, y_stride, acc); break;
          case 4: QxKTile<kHigh, 4>(rp, xc, b0, n, meta, nr, yt, y_stride, acc); break;
          case 3: QxKTile<kHigh, 3>(rp, xc, b0, n, meta, nr, yt, y_stride, acc); break;
          case 2: QxKTile<kHigh, 2>(rp, xc, b0, n, meta, nr, yt, y_stride, acc); break;
          default: QxKTile<kHigh, 1>(rp, xc, b0, n, meta, nr, yt, y_stride, acc); break;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Q6_K. Element 128h + 32g + l (half h, group g < 4, l < 32) is
//   (ql[64h + 32(g & 1) + l] >> 4(g >> 1)) & 15 | ((qh[32h + l] >> 2g) & 3) << 4,
// minus 32; sub-block j = 8h + 2g + l / 16 has scale scales[j].

// Bits 4-5 of each byte = bits 2g, 2g + 1 of the same byte of h; the rest zero.
FUCINA_TILE_INLINE __m512i HighPair(__m512i h, int g, __m512i mask30) {
  __m512i s = h;
  if (g == 0) s = _mm512_slli_epi16(h, 4);
  if (g == 1) s = _mm512_slli_epi16(h, 2);
  if (g == 3) s = _mm512_srli_epi16(h, 2);
  return _mm512_and_si512(s, mask30);
}

template <int kRn>
FUCINA_TILE_INLINE void Q6KTile(const uint8_t* const* rp, const uint8_t* const* xc, int64_t nb,
                                int rows, float* y, size_t y_stride) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i mask30 = _mm512_set1_epi8(0x30);
  // Scale bytes (2q, 2q + 1) of each dword as sign-extended int16 pairs (after a >> 8).
  const __m512i pair_pat[2] = {DwordPattern(0x01800080u), DwordPattern(0x03800280u)};
  __m512 acc[kRn];
  for (int c = 0; c < kRn; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const size_t off = b * sizeof(BlockQ6_K);
    __m512i sc[4];  // lane dword t = scales 4t..4t+3 (int8).
    LoadTransposed(rp, off + offsetof(BlockQ6_K, scales), sc);
    // d is the last 2 bytes of the block: dword 3 of the 16 bytes ending there, high half.
    const __m512 d = LowHalves(_mm512_srli_epi32(
        LoadDword3(rp, off + sizeof(BlockQ6_K) - 16), 16));
    __m512i tot[kRn];
    for (int c = 0; c < kRn; ++c) tot[c] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
      for (int s = 0; s < 2; ++s) {
        // Dwords 4s..4s+3 of each 32-byte piece: sub-block j = 8h + 2g + s of every group.
        __m512i qa[4], qb[4], qh[4];
        LoadTransposed(rp, off + offsetof(BlockQ6_K, ql) + 64 * h + 16 * s, qa);
        LoadTransposed(rp, off + offsetof(BlockQ6_K, qh) + 32 * h + 16 * s, qh);
        LoadTransposed(rp, off + offsetof(BlockQ6_K, ql) + 64 * h + 32 + 16 * s, qb);
        // Groups 0 and 2 read qa, 1 and 3 qb, so each is live for half of the loop.
#pragma GCC unroll 4
        for (int gi = 0; gi < 4; ++gi) {
          const int g = (gi >> 1) | ((gi & 1) << 1);
          const __m512i* src = (g & 1) ? qb : qa;
          __m512i q[4];
          for (int i = 0; i < 4; ++i) {
            const __m512i nib = g >> 1 ? _mm512_srli_epi16(src[i], 4) : src[i];
            q[i] = _mm512_ternarylogic_epi32(nib, HighPair(qh[i], g, mask30), low4, kAndCOrB);
          }
          const int sb = 8 * h + 2 * g + s;
          // Sub-block sb's scale, sign-extended: byte sb % 4 of dword sc[sb / 4].
          const __m512i scale =
              _mm512_srai_epi32(_mm512_slli_epi32(sc[sb / 4], 24 - 8 * (sb % 4)), 24);
          for (int c = 0; c < kRn; ++c) {
            const uint8_t* yq = xc[c] + b * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs) +
                                128 * h + 32 * g + 16 * s;
            __m512i sum = _mm512_setzero_si512();
            for (int i = 0; i < 4; ++i) {
              sum = _mm512_dpbusd_epi32(sum, q[i], BroadcastDword(yq + 4 * i));
            }
            tot[c] = _mm512_add_epi32(tot[c], _mm512_mullo_epi32(sum, scale));
          }
        }
      }
    }
    __m512i pairs[8];  // (scales[2p], scales[2p + 1]) as int16 pairs.
    for (int p = 0; p < 8; ++p) {
      pairs[p] = _mm512_srai_epi16(_mm512_shuffle_epi8(sc[p / 2], pair_pat[p % 2]), 8);
    }
    for (int c = 0; c < kRn; ++c) {
      const BlockQ8_K* xb = reinterpret_cast<const BlockQ8_K*>(xc[c]) + b;
      __m512i corr = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p) {
        corr = _mm512_dpwssd_epi32(corr, pairs[p], BroadcastDword(xb->bsums + 2 * p));
      }
      const __m512i sum = _mm512_sub_epi32(tot[c], _mm512_slli_epi32(corr, 5));
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(xb->d)),
                               acc[c]);
    }
  }
  for (int c = 0; c < kRn; ++c) StoreTile(acc[c], rows, y + c * y_stride, false);
}

void GemmQ6K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
             size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  const int64_t nb = k / kQK_K;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  for (int64_t c0 = 0; c0 < cols; c0 += kTCols) {
    const int nc = static_cast<int>(cols - c0 < kTCols ? cols - c0 : kTCols);
    const uint8_t* xc[kTCols];
    for (int c = 0; c < kTCols; ++c) xc[c] = xb + (c0 + (c < nc ? c : 0)) * x_stride;
    for (int64_t r0 = 0; r0 < rows; r0 += kTRows) {
      const int nr = static_cast<int>(rows - r0 < kTRows ? rows - r0 : kTRows);
      const uint8_t* rp[kTRows];
      TileRows(wb, w_stride, r0, nr, rp);
      float* yt = y + c0 * y_stride + r0;
      switch (nc) {
        case 8: Q6KTile<8>(rp, xc, nb, nr, yt, y_stride); break;
        case 7: Q6KTile<7>(rp, xc, nb, nr, yt, y_stride); break;
        case 6: Q6KTile<6>(rp, xc, nb, nr, yt, y_stride); break;
        case 5: Q6KTile<5>(rp, xc, nb, nr, yt, y_stride); break;
        case 4: Q6KTile<4>(rp, xc, nb, nr, yt, y_stride); break;
        case 3: Q6KTile<3>(rp, xc, nb, nr, yt, y_stride); break;
        case 2: Q6KTile<2>(rp, xc, nb, nr, yt, y_stride); break;
        default: Q6KTile<1>(rp, xc, nb, nr, yt, y_stride); break;
      }
    }
  }
}

}  // namespace

void GemmQ4_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmQxK<false>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmQxK<true>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ6_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmQ6K(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx512
