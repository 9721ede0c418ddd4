// AVX-512 (F/BW/VL/DQ + VNNI) tile kernels of the k-quants (Q4_K, Q5_K, Q6_K) for
// kernels/cpu/gemm_isa.h, in the row-transposed scheme of tile_avx512.h: 16 weight rows x up
// to 8 activation rows, one weight row per int32 lane, activation dwords broadcast into
// vpdpbusd. Per super-block the rows' headers are transposed once and unpacked lane-wise; the
// quants are transposed 16 bytes at a time and shared by every activation row of the tile.
// Q4_K, Q5_K and Q6_K weights in the kTiles16 layout (kernels/tile_layout.h) are read as they are,
// through the same unpackers (a block source hands out dwords of 16 rows either way).
//
// Q4_K / Q5_K: each 32-element sub-block costs 8 vpdpbusd per activation row, scaled in float
// by (scale * d) of each row at once; the min term sum_j m_j * bsum_j is 4 vpdpwssd on int16
// pairs per activation row and super-block.
// Q6_K: each 16-element sub-block costs 4 vpdpbusd on the unsigned 6-bit quants and one int32
// multiply by its signed scale; the -32 offset comes back as 32 * sum_j sc_j * bsum_j (8
// vpdpwssd). The whole super-block is summed in int32, exactly as the scalar reference, and
// converted once.
#include "kernels/cpu/avx512/undefined_vectors.h"  // before any intrinsics: GCC bug 105593

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
// Where a tile's super-blocks come from (gemm_avx512.cc has the same three for the legacy
// formats). Each source hands out 16 bytes of its 16 rows' block b at a byte offset as
// dwords (vector i holds dword i of every row) and says which lane holds which row.

// GGUF rows, transposed as they are read (decode-shaped calls): LoadTransposed's lane order.
template <typename W>
struct RowsIn {
  static constexpr bool kNatural = false;
  static constexpr bool kScratch = false;
  const uint8_t* const* rp;
  FUCINA_TILE_INLINE void Dwords(int64_t b, size_t at, __m512i out[4]) const {
    LoadTransposed(rp, b * sizeof(W) + at, out);
  }
};

// Weights in the kTiles16 layout (kernels/tile_layout.h), read as they are: row r in lane r.
// Block b's quants (the kQuantBytes from byte kQsOffset of a GGUF block) are kQuantBytes / 4
// vectors from tile + b * 16 * kQuantBytes; its meta follows all the tile's quants,
// 16 * (sizeof(W) - kQuantBytes) bytes per block. Dwords takes offsets in the GGUF block.
template <typename Block, size_t kQsOffset, size_t kQuantBytes>
struct TilesIn {
  using W = Block;
  static constexpr bool kNatural = true;
  static constexpr bool kScratch = false;
  static constexpr size_t kQuantStep = kTRows * kQuantBytes;
  static constexpr size_t kMetaStep = kTRows * (sizeof(W) - kQuantBytes);
  const uint8_t* tile;
  int64_t nb;
  FUCINA_TILE_INLINE void Dwords(int64_t b, size_t at, __m512i out[4]) const {
    const uint8_t* v = tile + b * kQuantStep + kTRows * (at - kQsOffset);
    for (int i = 0; i < 4; ++i) out[i] = _mm512_loadu_si512(v + 64 * i);
  }
  FUCINA_TILE_INLINE const uint8_t* Meta(int64_t b) const {
    return tile + nb * kQuantStep + b * kMetaStep;
  }
  // Decode-shaped calls request the quants and meta of the blocks ahead, three times a line:
  // the k-quant unpacking leaves less room for more (Qwen3-0.6B-shape Q4_K_M decode,
  // alternated runs: 1 thread 64-67 t/s with 3, 68-69 with 4, 67 with 5; 2 threads 74-75
  // with 3, 65-72 with 4, 61-76 with 5).
  FUCINA_TILE_INLINE void Prefetch(int64_t b) const {
    PrefetchTileBlock<0>(tile + b * kQuantStep, kQuantStep, Meta(b), kMetaStep,
                         nb * (kQuantStep + kMetaStep));
  }
};

// The unpacked copy of prefill calls (kPacked: PackedQxK or PackedQ6K), in the lane order of
// what it was unpacked from.
template <typename kPacked, bool kNaturalOrder>
struct ScratchIn {
  static constexpr bool kNatural = kNaturalOrder;
  static constexpr bool kScratch = true;
  const kPacked* pk;
};

// Prefill-shaped calls: every row tile of the call unpacked (U::Pack) into pk, tiles * nb
// super-blocks, from the kTiles16 layout (TIn) or from the GGUF rows (TIn::W's blocks).
template <typename U, typename TIn, bool kTiles, typename Packed>
void UnpackCall(const uint8_t* wb, size_t w_stride, int64_t rows, int64_t nb, Packed* pk) {
  for (int64_t t = 0; t * kTRows < rows; ++t) {
    Packed* out = pk + t * nb;
    if constexpr (kTiles) {
      const TIn in{wb + t * kTRows * w_stride, nb};
      for (int64_t b = 0; b < nb; ++b) U().Pack(in, b, out + b);
    } else {
      const uint8_t* rp[kTRows];
      const int64_t left = rows - t * kTRows;
      TileRows(wb, w_stride, t * kTRows, static_cast<int>(left < kTRows ? left : kTRows), rp);
      const RowsIn<typename TIn::W> in{rp};
      for (int64_t b = 0; b < nb; ++b) U().Pack(in, b, out + b);
    }
  }
}

// Where a call's tiles come from: the GGUF rows, the per-thread unpacked copy, or kTiles16
// weights.
enum class Source { kRows, kScratch, kTiles };

// A call's prefetch for its tiles (their `ahead`), 0 for none: on GGUF rows the next tile's
// rows, this many bytes on; on kTiles16 weights, for decode-shaped calls (up to kTCols
// columns), along the stream (nonzero: PrefetchTileBlock has its own distances); the scratch
// copy of prefill-shaped calls is in L2.
template <Source kSource>
size_t CallAhead(size_t w_stride, int64_t cols) {
  if (kSource == Source::kRows) return kTRows * w_stride;
  if (kSource == Source::kTiles && cols <= kTCols) return kStreamAhead;
  return 0;
}

// run(in) with the block source of the row tile at r0 (nr rows): TIn over kTiles16 weights,
// RowsIn over TIn::W's GGUF rows, or the scratch copy pk (unpacked from tiles when kNatural).
template <Source kSource, bool kNatural, typename TIn, typename Packed, typename Run>
FUCINA_TILE_INLINE void WithTileSource(const uint8_t* wb, size_t w_stride, int64_t r0, int nr,
                                       int64_t nb, const Packed* pk, const Run& run) {
  if constexpr (kSource == Source::kRows) {
    const uint8_t* rp[kTRows];
    TileRows(wb, w_stride, r0, nr, rp);
    run(RowsIn<typename TIn::W>{rp});
  } else if constexpr (kSource == Source::kTiles) {
    run(TIn{wb + r0 * w_stride, nb});
  } else {
    run(ScratchIn<Packed, kNatural>{pk + (r0 / kTRows) * nb});
  }
}

// 16 bytes from each of 4 byte fields of a kTiles16 meta (p: field f of row r at p + 16 f + r)
// -> lane r = the 4 bytes as one dword, field f in byte f (what LoadTransposed gives for 4
// consecutive bytes of a GGUF block).
FUCINA_TILE_INLINE __m512i FieldBytesToDwords(const uint8_t* p) {
  __m512i f[4];
  for (int i = 0; i < 4; ++i) {
    f[i] = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * i)));
  }
  constexpr int kOr3 = 0xFE;  // a | b | c
  return _mm512_ternarylogic_epi32(
      _mm512_ternarylogic_epi32(f[0], _mm512_slli_epi32(f[1], 8), _mm512_slli_epi32(f[2], 16),
                                kOr3),
      _mm512_slli_epi32(f[3], 24), _mm512_setzero_si512(), kOr3);
}

// 16 f16 fields of a kTiles16 meta as floats.
FUCINA_TILE_INLINE __m512 FieldHalves(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

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

// A super-block of 16 rows unpacked: the sub-block pair t's quants (lo: sub-block 2t, hi:
// 2t + 1) as unsigned bytes in dword order, their scale * d, the mins as int16 pairs and dmin.
struct PackedQxK {
  __m512i lo[4][8], hi[4][8];
  __m512 sd[4][2];
  __m512i mins[4];
  __m512 dmin;
};

// kHigh: Q5_K (block with qh[32] before qs; element 32s + l of a 64-element pair takes bit s
// of qh[l] as its 5th bit), else Q4_K.
template <bool kHigh>
struct QxKUnpacker {
  using W = typename std::conditional<kHigh, BlockQ5_K, BlockQ4_K>::type;
  __m512 d, dmin;
  __m512i sc[2], mn[2], qh[8];

  // The header of super-block b of the 16 rows.
  template <typename In>
  FUCINA_TILE_INLINE void Header(const In& in, int64_t b) {
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f);
    const __m512i m4 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i m2 = _mm512_set1_epi32(0x03030303);
    __m512i h[4];  // d|dmin, then scale bytes 0-3, 4-7, 8-11 (kernels/quant/blocks.h).
    if constexpr (In::kNatural) {
      // The tile's meta: d, dmin (16 f16 each), then the 12 scale bytes, 16 rows each.
      const uint8_t* meta = in.Meta(b);
      d = FieldHalves(meta);
      dmin = FieldHalves(meta + 32);
      for (int i = 1; i < 4; ++i) h[i] = FieldBytesToDwords(meta + 64 * i);
    } else {
      in.Dwords(b, 0, h);
      d = LowHalves(h[0]);
      dmin = LowHalves(_mm512_srli_epi32(h[0], 16));
    }
    // As get_scale_min_k4: scales 0-3, 4-7 and mins 0-3, 4-7 as bytes of one dword each.
    sc[0] = _mm512_and_si512(h[1], m6);
    sc[1] = _mm512_or_si512(_mm512_and_si512(h[3], m4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[1], 6), m2), 4));
    mn[0] = _mm512_and_si512(h[2], m6);
    mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(h[3], 4), m4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(h[2], 6), m2), 4));
    if constexpr (kHigh) {
      in.Dwords(b, offsetof(BlockQ5_K, qh), qh);
      in.Dwords(b, offsetof(BlockQ5_K, qh) + 16, qh + 4);
    }
  }

  // Sub-blocks 2t (lo) and 2t + 1 (hi) of super-block b: quants and scale * d.
  template <typename In>
  FUCINA_TILE_INLINE void Quants(const In& in, int64_t b, int t, __m512i lo[8], __m512i hi[8],
                                 __m512 sd[2]) const {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    // 32 bytes of qs: low nibbles are sub-block 2t, high nibbles 2t + 1.
    __m512i tq[8];
    in.Dwords(b, offsetof(W, qs) + 32 * t, tq);
    in.Dwords(b, offsetof(W, qs) + 32 * t + 16, tq + 4);
    for (int k = 0; k < 8; ++k) {
      if constexpr (kHigh) {
        lo[k] = _mm512_ternarylogic_epi32(tq[k], _mm512_and_si512(BitTo4(qh[k], 2 * t), bit4),
                                          low4, kAndCOrB);
        hi[k] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(tq[k], 4),
                                          _mm512_and_si512(BitTo4(qh[k], 2 * t + 1), bit4), low4,
                                          kAndCOrB);
      } else {
        lo[k] = _mm512_and_si512(tq[k], low4);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(tq[k], 4), low4);
      }
    }
    for (int i = 0; i < 2; ++i) {
      // Byte s % 4 of dword sc[s / 4], zero-extended (pattern bytes with the high bit give 0).
      const int sb = 2 * t + i;
      const __m512i pat = DwordPattern(0x80808000u + static_cast<uint32_t>(sb % 4));
      sd[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_shuffle_epi8(sc[sb / 4], pat)), d);
    }
  }

  // Mins (m_2p, m_2p+1) as int16 pairs, p < 4.
  FUCINA_TILE_INLINE void Mins(__m512i mins[4]) const {
    const __m512i pair01 = DwordPattern(0x80018000u);
    const __m512i pair23 = DwordPattern(0x80038002u);
    mins[0] = _mm512_shuffle_epi8(mn[0], pair01);
    mins[1] = _mm512_shuffle_epi8(mn[0], pair23);
    mins[2] = _mm512_shuffle_epi8(mn[1], pair01);
    mins[3] = _mm512_shuffle_epi8(mn[1], pair23);
  }

  // The whole super-block b into *out.
  template <typename In>
  FUCINA_TILE_INLINE void Pack(const In& in, int64_t b, PackedQxK* out) {
    Header(in, b);
    for (int t = 0; t < 4; ++t) {
      __m512i lo[8], hi[8];
      __m512 sd[2];
      Quants(in, b, t, lo, hi, sd);
      for (int k = 0; k < 8; ++k) {
        _mm512_store_si512(&out->lo[t][k], lo[k]);
        _mm512_store_si512(&out->hi[t][k], hi[k]);
      }
      _mm512_store_ps(&out->sd[t][0], sd[0]);
      _mm512_store_ps(&out->sd[t][1], sd[1]);
    }
    __m512i mins[4];
    Mins(mins);
    for (int p = 0; p < 4; ++p) _mm512_store_si512(&out->mins[p], mins[p]);
    _mm512_store_ps(&out->dmin, dmin);
  }
};

// `ahead`: CallAhead's.
template <bool kHigh, int kRn, typename In>
FUCINA_TILE_INLINE void QxKTile(const In& in, const uint8_t* const* xc, int64_t b0, int64_t n,
                                const KActivationMeta& meta, int rows, float* y, size_t y_stride,
                                bool accumulate, size_t ahead) {
  using U = QxKUnpacker<kHigh>;
  constexpr bool kPacked = In::kScratch;
  __m512 acc[kRn];
  for (int c = 0; c < kRn; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = b0 + j;
    U u;
    if constexpr (!kPacked) {
      if constexpr (In::kNatural) {
        if (ahead != 0) in.Prefetch(b);
      } else {
        PrefetchNextTileRun<sizeof(typename U::W)>(in.rp, ahead, b0 * sizeof(typename U::W), n,
                                                   j);
      }
      u.Header(in, b);
    }
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      __m512i lo[8], hi[8];
      __m512 sd[2];
      if constexpr (kPacked) {
        sd[0] = _mm512_load_ps(&in.pk[b].sd[t][0]);
        sd[1] = _mm512_load_ps(&in.pk[b].sd[t][1]);
      } else {
        u.Quants(in, b, t, lo, hi, sd);
      }
      // The integer sums of a group of columns advance together, dword k of every column
      // before dword k + 1 (as in gemm_avx512.cc's TransposedTile): each sum is a chain of 8
      // dependent vpdpbusd. The packed copy is read one dword step at a time, so only two
      // weight vectors are live and all columns fit in one group; unpacked quants occupy 16
      // registers, leaving room for groups of 2.
      constexpr int kGroup = kPacked ? kRn : 2;
      for (int c0 = 0; c0 < kRn; c0 += kGroup) {
        const int nc = kRn - c0 < kGroup ? kRn - c0 : kGroup;
        __m512i sum_lo[kGroup], sum_hi[kGroup];
        for (int c = 0; c < kGroup; ++c) sum_lo[c] = sum_hi[c] = _mm512_setzero_si512();
        for (int k = 0; k < 8; ++k) {
          __m512i qlo, qhi;
          if constexpr (kPacked) {
            qlo = _mm512_load_si512(&in.pk[b].lo[t][k]);
            qhi = _mm512_load_si512(&in.pk[b].hi[t][k]);
          } else {
            qlo = lo[k];
            qhi = hi[k];
          }
          for (int c = 0; c < nc; ++c) {
            const uint8_t* yq =
                xc[c0 + c] + b * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs) + 64 * t;
            sum_lo[c] = _mm512_dpbusd_epi32(sum_lo[c], qlo, BroadcastDword(yq + 4 * k));
            sum_hi[c] = _mm512_dpbusd_epi32(sum_hi[c], qhi, BroadcastDword(yq + 32 + 4 * k));
          }
        }
        for (int c = 0; c < nc; ++c) {
          const __m512 dx = _mm512_set1_ps(meta.d[c0 + c][j]);
          acc[c0 + c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_lo[c]), _mm512_mul_ps(sd[0], dx),
                                        acc[c0 + c]);
          acc[c0 + c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum_hi[c]), _mm512_mul_ps(sd[1], dx),
                                        acc[c0 + c]);
        }
      }
    }
    __m512i mins[4];
    __m512 dmin;
    if constexpr (kPacked) {
      for (int p = 0; p < 4; ++p) mins[p] = _mm512_load_si512(&in.pk[b].mins[p]);
      dmin = _mm512_load_ps(&in.pk[b].dmin);
    } else {
      u.Mins(mins);
      dmin = u.dmin;
    }
    for (int c = 0; c < kRn; ++c) {
      __m512i ms = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {
        ms = _mm512_dpwssd_epi32(ms, mins[p], _mm512_set1_epi32(meta.bsum_pairs[c][j][p]));
      }
      acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ms),
                                _mm512_mul_ps(dmin, _mm512_set1_ps(meta.d[c][j])), acc[c]);
    }
  }
  for (int c = 0; c < kRn; ++c) {
    StoreTile(acc[c], rows, y + c * y_stride, accumulate, In::kNatural);
  }
}

// Q4_K and Q5_K in the kTiles16 layout: Q4_K's quants are its qs, Q5_K's its qh and qs (one
// run, as the GGUF block has them); the meta (d, dmin, 12 scale bytes) is the same.
template <bool kHigh, typename W = typename QxKUnpacker<kHigh>::W>
using QxKTilesIn = TilesIn<W, kHigh ? offsetof(BlockQ5_K, qh) : offsetof(W, qs),
                           kHigh ? sizeof(BlockQ5_K::qh) + sizeof(BlockQ5_K::qs) : sizeof(W::qs)>;

// The walk over one call's tiles: groups of kTCols activation rows, chunks of kKChunk
// super-blocks (their activation metadata prepared once), row tiles. kNatural: the scratch
// copy was unpacked from kTiles16 weights (row r in lane r).
template <bool kHigh, Source kSource, bool kNatural = false>
void QxKColumns(const uint8_t* wb, size_t w_stride, int64_t rows, const PackedQxK* pk, int64_t nb,
                const uint8_t* xb, size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  using W = typename QxKUnpacker<kHigh>::W;
  KActivationMeta meta;
  if (kSource == Source::kRows && rows > 0 && cols > 0) {
    const uint8_t* rp[kTRows];
    TileRows(wb, w_stride, 0, static_cast<int>(rows < kTRows ? rows : kTRows), rp);
    PrefetchTile(rp, static_cast<size_t>(nb < kKChunk ? nb : kKChunk) * sizeof(W));
  }
  const size_t ahead = CallAhead<kSource>(w_stride, cols);
  for (int64_t c0 = 0; c0 < cols; c0 += kTCols) {
    const int nc = static_cast<int>(cols - c0 < kTCols ? cols - c0 : kTCols);
    const uint8_t* xc[kTCols];
    for (int c = 0; c < kTCols; ++c) xc[c] = xb + (c0 + (c < nc ? c : 0)) * x_stride;
    for (int64_t b0 = 0; b0 < nb; b0 += kKChunk) {
      const int64_t n = nb - b0 < kKChunk ? nb - b0 : kKChunk;
      PrepareQ4KMeta(xc, nc, b0, n, &meta);
      for (int64_t r0 = 0; r0 < rows; r0 += kTRows) {
        const int nr = static_cast<int>(rows - r0 < kTRows ? rows - r0 : kTRows);
        float* yt = y + c0 * y_stride + r0;
        const bool acc = b0 > 0;
        const auto run = [&](const auto& in) {
#define FUCINA_TILE_CASE(n_cols)                                                       \
  case n_cols:                                                                          \
    QxKTile<kHigh, n_cols>(in, xc, b0, n, meta, nr, yt, y_stride, acc, ahead); \
    break;
          switch (nc) {
            FUCINA_TILE_CASE(8) FUCINA_TILE_CASE(7) FUCINA_TILE_CASE(6) FUCINA_TILE_CASE(5)
            FUCINA_TILE_CASE(4) FUCINA_TILE_CASE(3) FUCINA_TILE_CASE(2)
            default: QxKTile<kHigh, 1>(in, xc, b0, n, meta, nr, yt, y_stride, acc, ahead);
          }
#undef FUCINA_TILE_CASE
        };
        WithTileSource<kSource, kNatural, QxKTilesIn<kHigh>>(wb, w_stride, r0, nr, nb, pk, run);
      }
    }
  }
}

// As GemmTransposed (gemm_avx512.cc): decode-shaped calls unpack as they go, larger ones unpack
// every row tile once into per-thread scratch. kTiles: w is in the kTiles16 layout.
template <bool kHigh, bool kTiles = false>
void GemmQxK(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
             size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  using U = QxKUnpacker<kHigh>;
  constexpr Source kDirect = kTiles ? Source::kTiles : Source::kRows;
  const int64_t nb = k / kQK_K;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  const int64_t tiles = (rows + kTRows - 1) / kTRows;
  PackedQxK* pk = nullptr;
  if (cols > kTCols) pk = static_cast<PackedQxK*>(TileScratch(tiles * nb * sizeof(PackedQxK)));
  if (pk == nullptr) {
    QxKColumns<kHigh, kDirect>(wb, w_stride, rows, nullptr, nb, xb, x_stride, cols, y, y_stride);
    return;
  }
  UnpackCall<U, QxKTilesIn<kHigh>, kTiles>(wb, w_stride, rows, nb, pk);
  QxKColumns<kHigh, Source::kScratch, kTiles>(wb, w_stride, rows, pk, nb, xb, x_stride, cols, y,
                                              y_stride);
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

// A super-block of 16 rows unpacked: the quants of sub-block j = 8h + 2g + s as q[j][4]
// (unsigned 6-bit, dword order), each sub-block's scale as int32, the scale pairs for the
// offset term and d.
struct PackedQ6K {
  __m512i q[16][4];
  __m512i scale[16];
  __m512i pairs[8];
  __m512 d;
};

struct Q6KUnpacker {
  __m512i sc[4];  // lane dword t = scales 4t..4t+3 (int8).
  __m512 d;

  template <typename In>
  FUCINA_TILE_INLINE void Header(const In& in, int64_t b) {
    if constexpr (In::kNatural) {
      // The tile's meta: the 16 scale bytes, 16 rows each, then d (16 f16).
      const uint8_t* meta = in.Meta(b);
      for (int t = 0; t < 4; ++t) sc[t] = FieldBytesToDwords(meta + 64 * t);
      d = FieldHalves(meta + 256);
    } else {
      const size_t off = b * sizeof(BlockQ6_K);
      LoadTransposed(in.rp, off + offsetof(BlockQ6_K, scales), sc);
      // d is the last 2 bytes of the block: dword 3 of the 16 bytes ending there, high half.
      d = LowHalves(_mm512_srli_epi32(LoadDword3(in.rp, off + sizeof(BlockQ6_K) - 16), 16));
    }
  }
  // Sub-block sb's scale, sign-extended: byte sb % 4 of dword sc[sb / 4].
  FUCINA_TILE_INLINE __m512i Scale(int sb) const {
    return _mm512_srai_epi32(_mm512_slli_epi32(sc[sb / 4], 24 - 8 * (sb % 4)), 24);
  }
  // (scales[2p], scales[2p + 1]) as int16 pairs.
  FUCINA_TILE_INLINE __m512i Pair(int p) const {
    const __m512i pat = DwordPattern(p % 2 ? 0x03800280u : 0x01800080u);
    return _mm512_srai_epi16(_mm512_shuffle_epi8(sc[p / 2], pat), 8);
  }
  // Dwords 4s..4s+3 of each 32-byte piece of half h: qa, qb (ql) and qh.
  template <typename In>
  static FUCINA_TILE_INLINE void Load(const In& in, int64_t b, int h, int s, __m512i qa[4],
                                      __m512i qb[4], __m512i qh[4]) {
    in.Dwords(b, offsetof(BlockQ6_K, ql) + 64 * h + 16 * s, qa);
    in.Dwords(b, offsetof(BlockQ6_K, qh) + 32 * h + 16 * s, qh);
    in.Dwords(b, offsetof(BlockQ6_K, ql) + 64 * h + 32 + 16 * s, qb);
  }
  // Group g's quants from what Load gave.
  static FUCINA_TILE_INLINE void Group(const __m512i qa[4], const __m512i qb[4],
                                       const __m512i qh[4], int g, __m512i q[4]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    const __m512i mask30 = _mm512_set1_epi8(0x30);
    const __m512i* src = (g & 1) ? qb : qa;
    for (int i = 0; i < 4; ++i) {
      const __m512i nib = g >> 1 ? _mm512_srli_epi16(src[i], 4) : src[i];
      q[i] = _mm512_ternarylogic_epi32(nib, HighPair(qh[i], g, mask30), low4, kAndCOrB);
    }
  }

  template <typename In>
  FUCINA_TILE_INLINE void Pack(const In& in, int64_t b, PackedQ6K* out) {
    Header(in, b);
    for (int h = 0; h < 2; ++h) {
      for (int s = 0; s < 2; ++s) {
        __m512i qa[4], qb[4], qh[4];
        Load(in, b, h, s, qa, qb, qh);
        for (int g = 0; g < 4; ++g) {
          __m512i q[4];
          Group(qa, qb, qh, g, q);
          for (int i = 0; i < 4; ++i) _mm512_store_si512(&out->q[8 * h + 2 * g + s][i], q[i]);
        }
      }
    }
    for (int sb = 0; sb < 16; ++sb) _mm512_store_si512(&out->scale[sb], Scale(sb));
    for (int p = 0; p < 8; ++p) _mm512_store_si512(&out->pairs[p], Pair(p));
    _mm512_store_ps(&out->d, d);
  }
};

template <int kRn, typename In>
FUCINA_TILE_INLINE void Q6KTile(const In& in, const uint8_t* const* xc, int64_t nb, int rows,
                                float* y, size_t y_stride, size_t ahead) {
  constexpr bool kPacked = In::kScratch;
  __m512 acc[kRn];
  for (int c = 0; c < kRn; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    Q6KUnpacker u;
    if constexpr (!kPacked) {
      if constexpr (In::kNatural) {
        if (ahead != 0) in.Prefetch(b);
      } else {
        PrefetchNextTileRun<sizeof(BlockQ6_K)>(in.rp, ahead, 0, nb, b);
      }
      u.Header(in, b);
    }
    __m512i tot[kRn];
    for (int c = 0; c < kRn; ++c) tot[c] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#pragma GCC unroll 2
      for (int s = 0; s < 2; ++s) {
        __m512i qa[4], qb[4], qh[4];
        if constexpr (!kPacked) Q6KUnpacker::Load(in, b, h, s, qa, qb, qh);
        // Groups 0 and 2 read qa, 1 and 3 qb, so each is live for half of the loop.
#pragma GCC unroll 4
        for (int gi = 0; gi < 4; ++gi) {
          const int g = (gi >> 1) | ((gi & 1) << 1);
          const int sb = 8 * h + 2 * g + s;
          __m512i q[4], scale;
          if constexpr (kPacked) {
            for (int i = 0; i < 4; ++i) q[i] = _mm512_load_si512(&in.pk[b].q[sb][i]);
            scale = _mm512_load_si512(&in.pk[b].scale[sb]);
          } else {
            Q6KUnpacker::Group(qa, qb, qh, g, q);
            scale = u.Scale(sb);
          }
          for (int c = 0; c < kRn; ++c) {
            const uint8_t* yq = xc[c] + b * sizeof(BlockQ8_K) + offsetof(BlockQ8_K, qs) + 16 * sb;
            __m512i sum = _mm512_setzero_si512();
            for (int i = 0; i < 4; ++i) {
              sum = _mm512_dpbusd_epi32(sum, q[i], BroadcastDword(yq + 4 * i));
            }
            tot[c] = _mm512_add_epi32(tot[c], _mm512_mullo_epi32(sum, scale));
          }
        }
      }
    }
    __m512i pairs[8];
    __m512 d;
    if constexpr (kPacked) {
      for (int p = 0; p < 8; ++p) pairs[p] = _mm512_load_si512(&in.pk[b].pairs[p]);
      d = _mm512_load_ps(&in.pk[b].d);
    } else {
      for (int p = 0; p < 8; ++p) pairs[p] = u.Pair(p);
      d = u.d;
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
  for (int c = 0; c < kRn; ++c) {
    StoreTile(acc[c], rows, y + c * y_stride, false, In::kNatural);
  }
}

// Q6_K in the kTiles16 layout: the quants are ql then qh (192 bytes, 48 dwords), the meta the
// 16 scale bytes then d.
using Q6KTilesIn =
    TilesIn<BlockQ6_K, offsetof(BlockQ6_K, ql), sizeof(BlockQ6_K::ql) + sizeof(BlockQ6_K::qh)>;

// As QxKColumns, without chunks of k (the metadata is read from the activation blocks).
template <Source kSource, bool kNatural = false>
void Q6KColumns(const uint8_t* wb, size_t w_stride, int64_t rows, const PackedQ6K* pk,
                int64_t nb, const uint8_t* xb, size_t x_stride, int64_t cols, float* y,
                size_t y_stride) {
  if (kSource == Source::kRows && rows > 0 && cols > 0) {
    const uint8_t* rp[kTRows];
    TileRows(wb, w_stride, 0, static_cast<int>(rows < kTRows ? rows : kTRows), rp);
    PrefetchTile(rp, static_cast<size_t>(nb) * sizeof(BlockQ6_K));
  }
  const size_t ahead = CallAhead<kSource>(w_stride, cols);
  for (int64_t c0 = 0; c0 < cols; c0 += kTCols) {
    const int nc = static_cast<int>(cols - c0 < kTCols ? cols - c0 : kTCols);
    const uint8_t* xc[kTCols];
    for (int c = 0; c < kTCols; ++c) xc[c] = xb + (c0 + (c < nc ? c : 0)) * x_stride;
    for (int64_t r0 = 0; r0 < rows; r0 += kTRows) {
      const int nr = static_cast<int>(rows - r0 < kTRows ? rows - r0 : kTRows);
      float* yt = y + c0 * y_stride + r0;
      const auto run = [&](const auto& in) {
#define FUCINA_TILE_CASE(n_cols) \
  case n_cols: Q6KTile<n_cols>(in, xc, nb, nr, yt, y_stride, ahead); break;
        switch (nc) {
          FUCINA_TILE_CASE(8) FUCINA_TILE_CASE(7) FUCINA_TILE_CASE(6) FUCINA_TILE_CASE(5)
          FUCINA_TILE_CASE(4) FUCINA_TILE_CASE(3) FUCINA_TILE_CASE(2)
          default: Q6KTile<1>(in, xc, nb, nr, yt, y_stride, ahead);
        }
#undef FUCINA_TILE_CASE
      };
      WithTileSource<kSource, kNatural, Q6KTilesIn>(wb, w_stride, r0, nr, nb, pk, run);
    }
  }
}

template <bool kTiles>
void GemmQ6K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
             size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  constexpr Source kDirect = kTiles ? Source::kTiles : Source::kRows;
  const int64_t nb = k / kQK_K;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  const int64_t tiles = (rows + kTRows - 1) / kTRows;
  PackedQ6K* pk = nullptr;
  if (cols > kTCols) pk = static_cast<PackedQ6K*>(TileScratch(tiles * nb * sizeof(PackedQ6K)));
  if (pk == nullptr) {
    Q6KColumns<kDirect>(wb, w_stride, rows, nullptr, nb, xb, x_stride, cols, y, y_stride);
    return;
  }
  UnpackCall<Q6KUnpacker, Q6KTilesIn, kTiles>(wb, w_stride, rows, nb, pk);
  Q6KColumns<Source::kScratch, kTiles>(wb, w_stride, rows, pk, nb, xb, x_stride, cols, y,
                                       y_stride);
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
  GemmQ6K<false>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ4_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmQxK<false, true>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ5_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmQxK<true, true>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ6_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmQ6K<true>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx512
