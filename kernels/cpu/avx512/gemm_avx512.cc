// AVX-512 (F/BW/VL/DQ + VNNI) tile kernels for kernels/cpu/gemm_isa.h: row-transposed tiles
// of 16 weight rows x 8 activation rows for the legacy formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1),
// described further down.
#include "kernels/cpu/avx512/undefined_vectors.h"  // before any intrinsics: GCC bug 105593

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/cpu/avx512/avx512_util.h"
#include "kernels/cpu/avx512/tile_avx512.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina::avx512 {
namespace {

// Row-transposed tiles: 16 weight rows, one per int32 lane.
//
// Per block, the quants of 16 rows are transposed in registers (4x4 dword transposes) so that
// vector k holds dword k (4 consecutive quants) of every row. An activation block is then 8
// broadcast dwords: 8 vpdpbusd give the 16 rows' integer block sums in lanes, and one convert,
// one scale product and one FMA apply the 16 rows' scales at once. No pair needs its own
// conversion or horizontal sum, so the work per activation block is ~11 instructions for 512
// multiply-adds; the transposes are paid once per weight block and shared by up to 8
// activation rows. Per-activation metadata (f32 scale, s of Q8_1, the offset correction
// -c * sum(y)) is prepared once per group of activation rows and reused by every row tile.
//
// Lane order: lane 4l + i holds row 4i + l (a 4x4 transpose of the row index), undone by one
// permute per output vector.

constexpr int kTChunk = 128;  // blocks of activation metadata prepared at once (k = 4096).

// The legacy types' tile streams are requested 5 times a line (PrefetchStream<2>: 48, 32, 16,
// 10.7 and 5.3 KiB ahead): ~11 instructions per 512 multiply-adds leave room for them, and
// the farthest reach the next matrix's first tiles before the call ends. Qwen3-0.6B-shape
// Q8_0 decode, 1 thread, alternated runs: 3 requests 34.6-39.1 t/s, 4 (32 KiB farthest)
// 38.3-41.6, 5 41.4-46.1, 6 (64 KiB) 44.7-45.0; SmolLM2 Q4_1 208-222 -> 276-289 t/s with 5.
// On 2 threads Q8_0 read 46-51 t/s against 47-56, SmolLM2 270-273 against 257-267: noise.
constexpr int kLegacyFarRequests = 2;

struct ActivationMeta {
  float d[kTCols][kTChunk];
  float s[kTCols][kTChunk];
  int32_t corr[kTCols][kTChunk];
};

// 16 f16 fields of a kTiles16 tile as floats.
FUCINA_ALWAYS_INLINE __m512 TileFields(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Weight side of one block for 16 rows: q[k] pairs with activation dword k (unsigned bytes),
// d the rows' scales, m their offsets (kHasMin).
struct T8_0 {
  using W = BlockQ8_0;
  using X = BlockQ8_0;
  static constexpr int kOffset = 128;
  static constexpr bool kHasMin = false;
  static constexpr int kTileQuantBytes = 512;
  static FUCINA_ALWAYS_INLINE void Prep(const uint8_t* const* rp, size_t off, __m512i q[8],
                                        __m512* d, __m512*) {
    LoadTransposed(rp, off + offsetof(W, qs), q);
    LoadTransposed(rp, off + offsetof(W, qs) + 16, q + 4);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int k = 0; k < 8; ++k) q[k] = _mm512_xor_si512(q[k], flip);
    *d = LowHalves(LoadDword0(rp, off));
  }
  // Block b of a kTiles16 tile of nb blocks (kernels/tile_layout.h): natural lane order.
  static FUCINA_ALWAYS_INLINE void LoadTiles(const uint8_t* tile, int64_t nb, int64_t b,
                                             __m512i q[8], __m512* d, __m512*) {
    const uint8_t* qs = tile + b * kTileQuantBytes;
    for (int k = 0; k < 8; ++k) q[k] = _mm512_loadu_si512(qs + 64 * k);
    *d = TileFields(tile + nb * kTileQuantBytes + b * 32);
  }
};

// Nibble k-th dwords: the low nibbles are elements 4k..4k+3, the high ones 16 + 4k...
FUCINA_ALWAYS_INLINE void SplitNibbles(const __m512i t[4], __m512i q[8]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    q[k] = _mm512_and_si512(t[k], low4);
    q[4 + k] = _mm512_and_si512(_mm512_srli_epi16(t[k], 4), low4);
  }
}

// The 16 quant bytes at rp[q] + qs_off of the 16 rows (Q4_0/Q4_1/Q5_0/Q5_1 nibbles),
// transposed and split: q[v] holds elements 4v..4v+3 of every row.
FUCINA_ALWAYS_INLINE void TransposedNibbles(const uint8_t* const* rp, size_t qs_off,
                                            __m512i q[8]) {
  __m512i t[4];
  LoadTransposed(rp, qs_off, t);
  SplitNibbles(t, q);
}

// The 4 quant vectors of a Q4_0/Q4_1 block in a kTiles16 tile (at qs), split as Prep splits
// the transposed ones.
FUCINA_ALWAYS_INLINE void TileNibbles(const uint8_t* qs, __m512i q[8]) {
  __m512i t[4];
  for (int k = 0; k < 4; ++k) t[k] = _mm512_loadu_si512(qs + 64 * k);
  SplitNibbles(t, q);
}

struct T4_0 {
  using W = BlockQ4_0;
  using X = BlockQ8_0;
  static constexpr int kOffset = 8;
  static constexpr bool kHasMin = false;
  static constexpr int kTileQuantBytes = 256;
  static FUCINA_ALWAYS_INLINE void Prep(const uint8_t* const* rp, size_t off, __m512i q[8],
                                        __m512* d, __m512*) {
    TransposedNibbles(rp, off + offsetof(W, qs), q);
    *d = LowHalves(LoadDword0(rp, off));
  }
  static FUCINA_ALWAYS_INLINE void LoadTiles(const uint8_t* tile, int64_t nb, int64_t b,
                                             __m512i q[8], __m512* d, __m512*) {
    TileNibbles(tile + b * kTileQuantBytes, q);
    *d = TileFields(tile + nb * kTileQuantBytes + b * 32);
  }
};

struct T4_1 {
  using W = BlockQ4_1;
  using X = BlockQ8_1;
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = true;
  static constexpr int kTileQuantBytes = 256;
  static FUCINA_ALWAYS_INLINE void Prep(const uint8_t* const* rp, size_t off, __m512i q[8],
                                        __m512* d, __m512* m) {
    TransposedNibbles(rp, off + offsetof(W, qs), q);
    const __m512i h = LoadDword0(rp, off);
    *d = LowHalves(h);
    *m = LowHalves(_mm512_srli_epi32(h, 16));
  }
  static FUCINA_ALWAYS_INLINE void LoadTiles(const uint8_t* tile, int64_t nb, int64_t b,
                                             __m512i q[8], __m512* d, __m512* m) {
    TileNibbles(tile + b * kTileQuantBytes, q);
    const uint8_t* fields = tile + nb * kTileQuantBytes + b * 64;
    *d = TileFields(fields);
    *m = TileFields(fields + 32);
  }
};

// Bit 4 of the Q5_0/Q5_1 quants: element e of a block has its fifth bit at bit e of the
// block's qh, and q[v] holds elements 4v..4v+3 of every row (SplitNibbles), so byte j of q[v]
// takes bit 4v + j of its lane's qh (qh: the rows' qh dwords, LoadTransposed's lane order).
// Per pair of quant vectors: one byte of qh spread over its lane's 4 bytes, two bit tests,
// two masked adds.
FUCINA_ALWAYS_INLINE void AddFifthBits(__m512i qh, __m512i q[8]) {
  const __m512i sixteen = _mm512_set1_epi8(16);
  const __m512i low = _mm512_set1_epi32(0x08040201);                      // byte j: bit j
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0x80402010u));  // byte j: bit 4 + j
  for (int u = 0; u < 4; ++u) {
    const __m512i b = _mm512_shuffle_epi8(qh, DwordPattern(0x01010101u * u));
    q[2 * u] = _mm512_mask_add_epi8(q[2 * u], _mm512_test_epi8_mask(b, low), q[2 * u], sixteen);
    q[2 * u + 1] = _mm512_mask_add_epi8(q[2 * u + 1], _mm512_test_epi8_mask(b, high),
                                        q[2 * u + 1], sixteen);
  }
}

// Q5_0 and Q5_1 have no kTiles16 layout (no LoadTiles): decode transposes as it goes, prefill
// through the unpacked copy. A block's first 8 bytes (Q5_0: d, qh, 2 quant bytes; Q5_1: d, m,
// qh) come from one 16-byte load per row, as dwords 0 and 1: a second 16-row load for qh
// alone made decode compute-bound.
struct T5_0 {
  using W = BlockQ5_0;
  using X = BlockQ8_0;
  static constexpr int kOffset = 16;
  static constexpr bool kHasMin = false;
  static FUCINA_ALWAYS_INLINE void Prep(const uint8_t* const* rp, size_t off, __m512i q[8],
                                        __m512* d, __m512*) {
    TransposedNibbles(rp, off + offsetof(W, qs), q);
    __m512i h0, h1;  // d | qh[0..1] << 16, qh[2..3] | qs[0..1] << 16
    LoadDwords01(rp, off, &h0, &h1);
    AddFifthBits(_mm512_or_si512(_mm512_srli_epi32(h0, 16), _mm512_slli_epi32(h1, 16)), q);
    *d = LowHalves(h0);
  }
};

struct T5_1 {
  using W = BlockQ5_1;
  using X = BlockQ8_1;
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = true;
  static FUCINA_ALWAYS_INLINE void Prep(const uint8_t* const* rp, size_t off, __m512i q[8],
                                        __m512* d, __m512* m) {
    TransposedNibbles(rp, off + offsetof(W, qs), q);
    __m512i h, qh;  // d | m << 16, qh
    LoadDwords01(rp, off, &h, &qh);
    AddFifthBits(qh, q);
    *d = LowHalves(h);
    *m = LowHalves(_mm512_srli_epi32(h, 16));
  }
};

// Metadata of activation rows xc[0..nc) for blocks [b0, b0 + n).
template <typename P>
void PrepareMeta(const uint8_t* const* xc, int nc, int64_t b0, int64_t n, ActivationMeta* meta) {
  using X = typename P::X;
  for (int c = 0; c < nc; ++c) {
    const X* x = reinterpret_cast<const X*>(xc[c]) + b0;
    for (int64_t j = 0; j < n; ++j) {
      meta->d[c][j] = _cvtsh_ss(x[j].d);
      if constexpr (P::kHasMin) meta->s[c][j] = _cvtsh_ss(x[j].s);
      if constexpr (P::kOffset != 0) meta->corr[c][j] = -P::kOffset * avx2::SumInt8x32(x[j].qs);
    }
  }
}

// One block of a 16-row tile as TransposedTile uses it (the unpacked copy of prefill calls).
struct PackedBlock {
  __m512i q[8];
  __m512 d, m;
};

// Where a tile's blocks come from: GGUF rows, loaded and transposed as the tile goes (decode);
// the per-thread unpacked copy of those rows (prefill); or weights already in the kTiles16
// layout (kernels/tile_layout.h), read as they are by both.
enum class Source { kRows, kScratch, kTiles };

// The block source of one 16-row tile: rp (kRows), pk (kScratch, blocks counted from the
// start of the row) or tile + nb (kTiles).
struct TileBlocks {
  const uint8_t* const* rp = nullptr;
  const PackedBlock* pk = nullptr;
  const uint8_t* tile = nullptr;
  int64_t nb = 0;
  // 0 for no prefetch; else kRows: the distance in bytes to the next tile's rows; kTiles:
  // kStreamAhead (PrefetchTileBlock).
  size_t ahead = 0;
};

template <typename P, int kRn, Source kSource>
FUCINA_ALWAYS_INLINE void TransposedTile(const TileBlocks& src, const uint8_t* const* xc,
                                         int64_t b0, int64_t n, const ActivationMeta& meta,
                                         int rows, float* y, size_t y_stride, bool accumulate) {
  using W = typename P::W;
  using X = typename P::X;
  __m512 acc[kRn];
  for (int c = 0; c < kRn; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = b0 + j;
    __m512i q[8];
    __m512 d, m = _mm512_setzero_ps();
    if constexpr (kSource == Source::kScratch) {
      for (int k = 0; k < 8; ++k) q[k] = _mm512_load_si512(&src.pk[b].q[k]);
      d = _mm512_load_ps(&src.pk[b].d);
      if constexpr (P::kHasMin) m = _mm512_load_ps(&src.pk[b].m);
    } else if constexpr (kSource == Source::kTiles) {
      if (src.ahead != 0) {
        constexpr size_t kMeta = P::kHasMin ? 64 : 32;  // meta bytes a block: d (and m)
        PrefetchTileBlock<kLegacyFarRequests>(
            src.tile + b * P::kTileQuantBytes, P::kTileQuantBytes,
            src.tile + src.nb * P::kTileQuantBytes + b * kMeta, kMeta,
            src.nb * (P::kTileQuantBytes + kMeta));
      }
      P::LoadTiles(src.tile, src.nb, b, q, &d, &m);
    } else {
      PrefetchNextTile<sizeof(W)>(src.rp, src.ahead, b * sizeof(W), j);
      P::Prep(src.rp, b * sizeof(W), q, &d, &m);
    }
    // The columns' integer sums advance together, dword k of every column before dword k + 1:
    // each sum is a chain of 8 dependent vpdpbusd, and interleaved in program order the two
    // ports see kRn independent chains at every step instead of a scheduler full of waiting
    // links (column by column, prefill-shaped calls ran 15-25% slower).
    __m512i sum[kRn];
    for (int c = 0; c < kRn; ++c) {
      sum[c] = P::kOffset != 0 ? _mm512_set1_epi32(meta.corr[c][j]) : _mm512_setzero_si512();
    }
    for (int k = 0; k < 8; ++k) {
      for (int c = 0; c < kRn; ++c) {
        const uint8_t* yq = xc[c] + b * sizeof(X) + offsetof(X, qs);
        sum[c] = _mm512_dpbusd_epi32(sum[c], q[k], BroadcastDword(yq + 4 * k));
      }
    }
    for (int c = 0; c < kRn; ++c) {
      acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[c]),
                               _mm512_mul_ps(d, _mm512_set1_ps(meta.d[c][j])), acc[c]);
      if constexpr (P::kHasMin) acc[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(meta.s[c][j]), acc[c]);
    }
  }
  // Packed tiles hold row r in lane r; transposed ones in lane 4(r % 4) + r / 4.
  for (int c = 0; c < kRn; ++c) {
    StoreTile(acc[c], rows, y + c * y_stride, accumulate, kSource == Source::kTiles);
  }
}

// Groups of kTCols activation rows that share each pass over the weights: a 16-row tile of up
// to kTChunk blocks is read from memory once, by the first group (with the tile stream's
// prefetch), and by the others from L1, where each group of 8 used to stream the whole matrix
// again without prefetch. 4 groups' metadata is 48 KiB of stack.
constexpr int kTGroups = 4;

template <typename P, Source kSource>
void TransposedColumns(const uint8_t* wb, size_t w_stride, int64_t rows, const PackedBlock* pk,
                       int64_t nb, const uint8_t* xb, size_t x_stride, int64_t cols, float* y,
                       size_t y_stride) {
  ActivationMeta meta[kTGroups];
  if (kSource == Source::kRows && rows > 0 && cols > 0) {
    const uint8_t* rp[kTRows];
    TileRows(wb, w_stride, 0, static_cast<int>(rows < kTRows ? rows : kTRows), rp);
    PrefetchTile(rp, static_cast<size_t>(nb < kTChunk ? nb : kTChunk) * sizeof(typename P::W));
  }
  constexpr int64_t kPassCols = kTGroups * kTCols;
  for (int64_t p0 = 0; p0 < cols; p0 += kPassCols) {
    const int64_t pass_cols = cols - p0 < kPassCols ? cols - p0 : kPassCols;
    const int groups = static_cast<int>((pass_cols + kTCols - 1) / kTCols);
    const uint8_t* xc[kTGroups][kTCols];
    int nc[kTGroups];
    for (int g = 0; g < groups; ++g) {
      const int64_t c0 = p0 + g * kTCols;
      nc[g] = static_cast<int>(cols - c0 < kTCols ? cols - c0 : kTCols);
      for (int c = 0; c < kTCols; ++c) xc[g][c] = xb + (c0 + (c < nc[g] ? c : 0)) * x_stride;
    }
    for (int64_t b0 = 0; b0 < nb; b0 += kTChunk) {
      const int64_t n = nb - b0 < kTChunk ? nb - b0 : kTChunk;
      for (int g = 0; g < groups; ++g) PrepareMeta<P>(xc[g], nc[g], b0, n, &meta[g]);
      for (int64_t r0 = 0; r0 < rows; r0 += kTRows) {
        const int nr = static_cast<int>(rows - r0 < kTRows ? rows - r0 : kTRows);
        const uint8_t* rp[kTRows];
        TileBlocks src;
        src.nb = nb;
        if constexpr (kSource == Source::kRows) {
          TileRows(wb, w_stride, r0, nr, rp);
          src.rp = rp;
          src.ahead = kTRows * w_stride;
        } else if constexpr (kSource == Source::kScratch) {
          src.pk = pk + (r0 / kTRows) * nb;
        } else {
          src.tile = wb + r0 * w_stride;
          // Later passes find the weights in L2 (the caller's blocks are sized for it).
          if (p0 == 0) src.ahead = kStreamAhead;
        }
        const bool acc = b0 > 0;
        for (int g = 0; g < groups; ++g) {
          float* yt = y + (p0 + g * kTCols) * y_stride + r0;
#define FUCINA_TILE_CASE(n_cols)                                                            \
  case n_cols:                                                                               \
    TransposedTile<P, n_cols, kSource>(src, xc[g], b0, n, meta[g], nr, yt, y_stride, acc);   \
    break;
          switch (nc[g]) {
            FUCINA_TILE_CASE(8) FUCINA_TILE_CASE(7) FUCINA_TILE_CASE(6) FUCINA_TILE_CASE(5)
            FUCINA_TILE_CASE(4) FUCINA_TILE_CASE(3) FUCINA_TILE_CASE(2)
            default:
              TransposedTile<P, 1, kSource>(src, xc[g], b0, n, meta[g], nr, yt, y_stride, acc);
          }
#undef FUCINA_TILE_CASE
          src.ahead = 0;  // the first group brought the tile in
        }
      }
    }
  }
}

// Decode-shaped calls (one group of activation rows) transpose as they go. Larger ones unpack
// all row tiles once into per-thread scratch (the caller passes ~256 KiB of weight rows, so
// the copy stays in L2) and run every group of activation rows over it.
template <typename P>
void GemmTransposed(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                    size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  const int64_t nb = k / 32;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  const int64_t tiles = (rows + kTRows - 1) / kTRows;
  PackedBlock* pk = nullptr;
  if (cols > kTCols) {
    pk = static_cast<PackedBlock*>(TileScratch(tiles * nb * sizeof(PackedBlock)));
  }
  if (pk == nullptr) {
    TransposedColumns<P, Source::kRows>(wb, w_stride, rows, nullptr, nb, xb, x_stride, cols, y,
                                        y_stride);
    return;
  }
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t r0 = t * kTRows;
    const uint8_t* rp[kTRows];
    TileRows(wb, w_stride, r0, static_cast<int>(rows - r0 < kTRows ? rows - r0 : kTRows), rp);
    PackedBlock* out = pk + t * nb;
    for (int64_t b = 0; b < nb; ++b) {
      __m512i q[8];
      __m512 d, m = _mm512_setzero_ps();
      P::Prep(rp, b * sizeof(typename P::W), q, &d, &m);
      for (int i = 0; i < 8; ++i) _mm512_store_si512(&out[b].q[i], q[i]);
      _mm512_store_ps(&out[b].d, d);
      _mm512_store_ps(&out[b].m, m);
    }
  }
  TransposedColumns<P, Source::kScratch>(wb, w_stride, rows, pk, nb, xb, x_stride, cols, y,
                                         y_stride);
}

// Weights in the kTiles16 layout: every call reads the tiles as they are.
template <typename P>
void GemmTiles16(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                 size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  TransposedColumns<P, Source::kTiles>(static_cast<const uint8_t*>(w), w_stride, rows, nullptr,
                                       k / 32, static_cast<const uint8_t*>(x), x_stride, cols, y,
                                       y_stride);
}

}  // namespace

void GemmQ8_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmTransposed<T8_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ4_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmTransposed<T4_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ4_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmTransposed<T4_1>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ8_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmTiles16<T8_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ4_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmTiles16<T4_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ4_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmTiles16<T4_1>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmTransposed<T5_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmTransposed<T5_1>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx512
