// AVX2 + FMA + F16C kernels for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K and Q5_K weights in the
// kTiles16 layout (kernels/tile_layout.h), and for the legacy formats row-major with the same
// arithmetic (row-major Q4_K/Q5_K is gemm_k_avx2.cc's, in the same arithmetic); the GemmFn
// contract of kernels/cpu/gemm_isa.h.
//
// Rows in lanes: half h of a tile's block holds, per dword k of the block, a vector whose lane
// r has quants 4k..4k+3 of row 8h + r. An activation block is 8 broadcast dwords; per dword,
// u8 x s8 multiply-adds give the 8 rows' partial sums in lanes, and the block's integer sums
// accumulate there, so a block costs one convert, one scale product and one FMA for all 8 rows
// (the row-major pair tiles paid those per pair, plus a gather of the activation scales and
// the horizontal sums, and were bound by instruction issue).
//
// Q8_0: the tile stores q + 128 for the AVX-512 kernel's vpdpbusd, which cannot go into
// vpmaddubsw as it is (two products of up to 255 * 127 saturate its int16 pair sums), so each
// weight vector is flipped back to q and goes in as |q| * (y * sign(q)): |q| <= 128 and
// |y| <= 127 (the Q8 quantizers' range) keep every pair sum within int16, and q = -128 is
// exact. Q4_0/Q4_1: the nibbles go in unsigned as they are; Q4_0's offset is -8 * sum(y) per
// activation block, added to the integer sum, and Q4_1's m_w * s_y a second FMA. Q5_0/Q5_1:
// the same with the fifth bit OR-ed in as 16 (Q5_0's offset -16 * sum(y)).
//
// Every (row, column) does the same thing whatever the call's shape or the weights' layout:
// per block, the exact integer sum, converted, times d_w * d_x, one FMA into its lane (Q4_1:
// then m_w * s_x), chunks of kChunk blocks summed into the output in order. So decode (one
// column, both halves of a tile at once: two chains and whole cache lines), prefill (a half
// tile against kCols columns) and row-major weights (transposed in registers for decode,
// packed into tiles in scratch for larger calls) all agree bit for bit.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/quant/blocks.h"
#include "kernels/tile_layout.h"

namespace fucina::avx2 {
namespace {

constexpr int kCols = 4;     // activation rows of a prefill pass (8 rows x 4 columns)
constexpr int kChunk = 128;  // blocks per pass, whose activation metadata is prepared once
// Decode-shaped calls prefetch the tiles' byte stream this far ahead (PrefetchTileStream).
constexpr size_t kAhead = 4096;

// dword k of 8 rows: a + 4 rows of b's dwords in the two 128-bit halves -> rows in lanes.
// t: 4 vectors, lane halves [row i | row 4 + i], 4 dwords each. Out: q[k] lane r = dword k of
// row r.
FUCINA_ALWAYS_INLINE void Transpose4x4Halves(const __m256i t[4], __m256i q[4]) {
  const __m256i a = _mm256_unpacklo_epi32(t[0], t[1]);  // dwords 0, 1 of rows 0, 1 | 4, 5
  const __m256i b = _mm256_unpackhi_epi32(t[0], t[1]);  // dwords 2, 3
  const __m256i c = _mm256_unpacklo_epi32(t[2], t[3]);  // dwords 0, 1 of rows 2, 3 | 6, 7
  const __m256i d = _mm256_unpackhi_epi32(t[2], t[3]);
  q[0] = _mm256_unpacklo_epi64(a, c);
  q[1] = _mm256_unpackhi_epi64(a, c);
  q[2] = _mm256_unpacklo_epi64(b, d);
  q[3] = _mm256_unpackhi_epi64(b, d);
}

// The weight side of one format. kLoads 32-byte vectors per half block (the tile's vector v
// at 64 v + 32 h), each giving kPerLoad dwords' weights (Dword u of load i is dword
// Index(i, u) of the block); Pairs is the u8 x s8 step for one dword against a broadcast
// activation dword.
struct T8_0 {
  using W = BlockQ8_0;
  using X = BlockQ8_0;
  static constexpr bool kSuper = false;
  static constexpr int kLoads = 8;
  static constexpr int kQuantBytes = 512;  // one block of a tile: 16 rows x 32 quants
  static constexpr int kFields = 1;
  static constexpr bool kHigh = false;   // no fifth bit
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = false;
  // A tile's vector (q + 128) as its raw form here (q).
  static FUCINA_ALWAYS_INLINE __m256i FromTile(__m256i v) {
    return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static FUCINA_ALWAYS_INLINE __m256i ToTile(__m256i v) { return FromTile(v); }
  static constexpr int kPerLoad = 1;
  static FUCINA_ALWAYS_INLINE __m256i Dword(__m256i v, int) { return v; }
  static constexpr int Index(int i, int) { return i; }
  static FUCINA_ALWAYS_INLINE __m256i Pairs(__m256i q, __m256i y) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
  }
  // Block b's quants of GGUF rows rp[0..8) in raw form, rows in lanes (8 x 8 dwords).
  static FUCINA_ALWAYS_INLINE void Transpose(const W* const* rp, int64_t b, __m256i v[8]) {
    __m256i t[8], u[8];
    for (int r = 0; r < 8; r += 2) {
      t[r] = _mm256_unpacklo_epi32(Load32(rp[r][b].qs), Load32(rp[r + 1][b].qs));
      t[r + 1] = _mm256_unpackhi_epi32(Load32(rp[r][b].qs), Load32(rp[r + 1][b].qs));
    }
    for (int g = 0; g < 8; g += 4) {  // rows g..g+3: u[g + i] holds dwords i | 4 + i
      u[g] = _mm256_unpacklo_epi64(t[g], t[g + 2]);
      u[g + 1] = _mm256_unpackhi_epi64(t[g], t[g + 2]);
      u[g + 2] = _mm256_unpacklo_epi64(t[g + 1], t[g + 3]);
      u[g + 3] = _mm256_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
      v[4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
    }
  }
};

// Q4_0/Q4_1: a tile's vector v holds bytes 4v..4v+3 of each row's qs: low nibbles are elements
// 4v..4v+3 (dword v), high ones 16 + 4v.. (dword 4 + v).
template <typename WB, typename XB, int kOff, bool kMin>
struct T4 {
  using W = WB;
  using X = XB;
  static constexpr bool kSuper = false;
  static constexpr int kLoads = 4;
  static constexpr int kQuantBytes = 256;
  static constexpr int kFields = kMin ? 2 : 1;
  static constexpr bool kHigh = false;
  static constexpr int kOffset = kOff;
  static constexpr bool kHasMin = kMin;
  static FUCINA_ALWAYS_INLINE __m256i FromTile(__m256i v) { return v; }
  static FUCINA_ALWAYS_INLINE __m256i ToTile(__m256i v) { return v; }
  static constexpr int kPerLoad = 2;
  static FUCINA_ALWAYS_INLINE __m256i Dword(__m256i v, int u) {
    return _mm256_and_si256(u == 0 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  }
  static constexpr int Index(int i, int u) { return 4 * u + i; }
  static FUCINA_ALWAYS_INLINE __m256i Pairs(__m256i q, __m256i y) {
    return _mm256_maddubs_epi16(q, y);  // |q| <= 15: no saturation
  }
  static FUCINA_ALWAYS_INLINE void Transpose(const W* const* rp, int64_t b, __m256i v[4]) {
    __m256i t[4];
    for (int i = 0; i < 4; ++i) {
      t[i] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(rp[4 + i][b].qs),
                                 reinterpret_cast<const __m128i*>(rp[i][b].qs));
    }
    Transpose4x4Halves(t, v);
  }
};
using T4_0 = T4<BlockQ4_0, BlockQ8_0, 8, false>;
using T4_1 = T4<BlockQ4_1, BlockQ8_1, 0, true>;

// Q5_0/Q5_1: Q4_0/Q4_1's nibbles with a fifth bit from qh, OR-ed in as 16 (HighBit); the
// tile's meta has each row's qh dword after the f16 fields. Unsigned quants of <= 31 keep
// vpmaddubsw's pair sums within 2 * 31 * 127; Q5_0's offset is -16 * sum(y).
template <typename WB, typename XB, int kOff, bool kMin>
struct T5 : T4<WB, XB, kOff, kMin> {
  static constexpr bool kHigh = true;
};
using T5_0 = T5<BlockQ5_0, BlockQ8_0, 16, false>;
using T5_1 = T5<BlockQ5_1, BlockQ8_1, 0, true>;

// 0x10 in the bytes of dword k (elements 4k..4k+3) of each row whose qh bit is set; hb holds
// the 8 rows' qh dwords in lanes. Byte k / 2 of a lane's dword goes to its 4 bytes, and each
// byte tests its own bit.
FUCINA_ALWAYS_INLINE __m256i HighBit(__m256i hb, int k) {
  const __m256i lane_bytes = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                                              0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
  const __m256i bits = _mm256_set1_epi32(static_cast<int>(0x08040201u << (4 * (k % 2))));
  const __m256i x = _mm256_and_si256(
      _mm256_shuffle_epi8(hb, _mm256_add_epi8(lane_bytes, _mm256_set1_epi8(static_cast<char>(k / 2)))),
      bits);
  return _mm256_and_si256(_mm256_cmpeq_epi8(x, bits), _mm256_set1_epi8(0x10));
}

// The qh dwords of 8 GGUF rows' block b in lanes.
template <typename W>
FUCINA_ALWAYS_INLINE __m256i RowsQh(const W* const* rp, int64_t b) {
  int32_t q[8];
  for (int r = 0; r < 8; ++r) std::memcpy(&q[r], rp[r][b].qh, 4);
  return _mm256_setr_epi32(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]);
}

// Q4_K (the KPass below). A tile's super-block is 32 vectors of 64 bytes, vector v holding qs
// bytes 4v..4v+3 of the 16 rows: of chunk q = v / 8 (64 elements), the low nibbles are
// elements 4 (v % 8).. of sub-block 2q, the high ones of sub-block 2q + 1. Then 256 bytes of
// meta: d and dmin of the 16 rows (f16), then the 12 packed scale bytes, byte k of the 16 rows
// at 64 + 16 k.
struct TK4 {
  using W = BlockQ4_K;
  using X = BlockQ8_K;
  static constexpr bool kSuper = true;
  static constexpr bool kHigh = false;
  static constexpr int kQsAt = 0;            // qs within a tile block's quants
  static constexpr int kQuantBytes = 2048;  // 16 rows x 128
};
// Q5_K: the tile block's quants are its qh (8 vectors, vector v holding qh bytes 4v..4v+3 of
// the 16 rows: element 4v + i of sub-block s takes bit s of byte i as its fifth bit), then
// its qs as Q4_K's; the meta is Q4_K's.
struct TK5 {
  using W = BlockQ5_K;
  using X = BlockQ8_K;
  static constexpr bool kSuper = true;
  static constexpr bool kHigh = true;
  static constexpr int kQsAt = 512;
  static constexpr int kQuantBytes = 2560;  // 16 rows x (32 + 128)
};

// Bytes of a tile block's meta: the rest of its 16 rows' blocks after their quants (d; m or
// dmin; Q5's qh; Q4_K's scale bytes), kernels/tile_layout.h.
template <typename P>
constexpr int64_t kMetaOf =
    kTileRows * static_cast<int64_t>(sizeof(typename P::W)) - P::kQuantBytes;

// Per column c, per block j of a pass: d_x, and s_x (Q8_1) or -kOffset * sum(y).
struct Meta {
  float d[kCols][kChunk];
  float s[kCols][kChunk];
  int32_t corr[kCols][kChunk];
};

template <typename P>
void PrepareMeta(const typename P::X* const* xc, int nc, int64_t b0, int64_t n, Meta* meta) {
  for (int c = 0; c < nc; ++c) {
    for (int64_t j = 0; j < n; ++j) {
      const auto& x = xc[c][b0 + j];
      meta->d[c][j] = _cvtsh_ss(x.d);
      if constexpr (P::kHasMin) meta->s[c][j] = _cvtsh_ss(x.s);
      if constexpr (P::kOffset != 0) meta->corr[c][j] = -P::kOffset * SumInt8x32(x.qs);
    }
  }
}

FUCINA_ALWAYS_INLINE __m256i BroadcastDword(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// Field f (d, or m) of 8 rows' block b, as floats in row lanes. (Built in a register: eight
// 2-byte stores read back as one vector would miss store forwarding.)
template <typename P>
FUCINA_ALWAYS_INLINE __m256 RowFields(const typename P::W* const* rp, int64_t b, int f) {
  const auto field = [&](int r) {
    uint16_t h;
    std::memcpy(&h, reinterpret_cast<const uint8_t*>(&rp[r][b]) + 2 * f, 2);
    return static_cast<int16_t>(h);
  };
  return _mm256_cvtph_ps(_mm_setr_epi16(field(0), field(1), field(2), field(3), field(4),
                                        field(5), field(6), field(7)));
}

// Where the kH halves of a pass get their blocks: kTiles16 tiles (half h of the tile at
// tiles[h], its 8 rows at 32 * half[h] in each vector), or GGUF rows (rows[h]: 8 row pointers).
template <typename P>
struct Source {
  const uint8_t* tile[2] = {};
  int half[2] = {};
  const typename P::W* const* rows[2] = {};
  int64_t nb = 0;
  // Decode: bytes to the next tile. Tiles prefetch its scales (and their own quants ahead);
  // GGUF rows prefetch the next tile's rows into L2, 16 rows side by side being 16 short
  // streams to the hardware prefetchers.
  size_t next_tile = 0;
};

// Decode's prefetch at block b of a kTiles16 tile: kAhead further along the tile's bytes, a
// block's worth of them (its share of the quants and of the meta after them, so the stream
// runs on into the next tile without a hole), and block b's meta in the next tile, which the
// stream reaches only as that tile ends. Prefetching just the quant bytes ahead left a
// meta-sized hole per tile that the next tile's loads then missed: Q4_K decode on 1024-wide
// rows (4 super-blocks, 2 KiB of meta a tile) read 9-11 GB/s where 4096-wide read 13-14.
// The block's lines go out in kParts parts, part `part` at the block's step of that number
// (Q4_K: its 8 sub-blocks; the legacy formats: their kLoads vectors), the meta with the
// first: all 36 of a Q4_K block at its start read 13.5-13.9 GB/s, spread 16.1-17.3 (1024-wide,
// 1 thread; q8_0 16.1-17.6 -> 18.3-19.3), and an unrolled burst of them only 11-11.7.
template <typename P, int kParts>
FUCINA_ALWAYS_INLINE void PrefetchTileStream(const Source<P>& src, int64_t b, int part) {
  constexpr int64_t kStep = P::kQuantBytes + kMetaOf<P>;
  constexpr int64_t kLines = ((kStep + 63) / 64 + kParts - 1) / kParts;  // per part
  const uint8_t* ahead = src.tile[0] + b * kStep + kAhead;
  const int64_t end = (part + 1) * kLines * 64 < kStep ? (part + 1) * kLines * 64 : kStep;
  for (int64_t l = part * kLines * 64; l < end; l += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(ahead + l), _MM_HINT_T0);
  }
  if (part != 0) return;
  const uint8_t* meta = src.tile[0] + src.next_tile + src.nb * P::kQuantBytes + b * kMetaOf<P>;
  for (int64_t l = 0; l < kMetaOf<P>; l += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(meta + l), _MM_HINT_T0);
  }
}

// kH halves against kC activation rows xc, blocks [b0, b0 + n): acc[h][c] lane r gains row r
// of half h's dot with column c.
template <typename P, bool kRowMajor, int kH, int kC>
FUCINA_ALWAYS_INLINE void Pass(const Source<P>& src, const typename P::X* const* xc, int64_t b0,
                               int64_t n, const Meta& meta, __m256 acc[kH][kC]) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t meta_bytes = kMetaOf<P>;
  for (int h = 0; h < kH; ++h) {
    for (int c = 0; c < kC; ++c) acc[h][c] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = b0 + j;
    if (kRowMajor && src.next_tile != 0) {
      // A block (<= 34 bytes) starts in every 64-byte line, so its start covers the rows.
      for (int h = 0; h < kH; ++h) {
        for (int r = 0; r < 8; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(&src.rows[h][r][b]) + src.next_tile,
                       _MM_HINT_T1);
        }
      }
    }
    __m256i sum[kH][kC];
    for (int h = 0; h < kH; ++h) {
      for (int c = 0; c < kC; ++c) {
        sum[h][c] = P::kOffset != 0 ? _mm256_set1_epi32(meta.corr[c][j]) : _mm256_setzero_si256();
      }
    }
    for (int h = 0; h < kH; ++h) {
      __m256i raw[P::kLoads];
      __m256i hb = _mm256_setzero_si256();  // the 8 rows' qh dwords (Q5_0/Q5_1)
      const uint8_t* qs = nullptr;
      if constexpr (kRowMajor) {
        P::Transpose(src.rows[h], b, raw);
        if constexpr (P::kHigh) hb = RowsQh(src.rows[h], b);
      } else {
        qs = src.tile[h] + b * P::kQuantBytes + 32 * src.half[h];
        if constexpr (P::kHigh) {
          hb = Load32(src.tile[h] + src.nb * P::kQuantBytes + b * meta_bytes + 32 * P::kFields +
                      32 * src.half[h]);
        }
      }
      // Dword k of every column before dword k + 1: kC independent integer chains. Unrolled
      // whole, or GCC keeps the loop and spills the chains each iteration.
#pragma GCC unroll 8
      for (int i = 0; i < P::kLoads; ++i) {
        if (!kRowMajor && h == 0 && src.next_tile != 0) {
          PrefetchTileStream<P, P::kLoads>(src, b, i);
        }
        const __m256i v = kRowMajor ? raw[i] : P::FromTile(Load32(qs + 64 * i));
#pragma GCC unroll 2
        for (int u = 0; u < P::kPerLoad; ++u) {
          const int k = P::Index(i, u);
          __m256i q = P::Dword(v, u);
          if constexpr (P::kHigh) q = _mm256_or_si256(q, HighBit(hb, k));
#pragma GCC unroll 4
          for (int c = 0; c < kC; ++c) {
            const __m256i y = BroadcastDword(xc[c][b].qs + 4 * k);
            sum[h][c] = _mm256_add_epi32(sum[h][c], _mm256_madd_epi16(P::Pairs(q, y), ones));
            // Keeps GCC from reassociating the chains into "every product first, then the
            // sums", which spilled a dozen vectors per block.
            asm("" : "+x"(sum[h][c]));
          }
        }
      }
    }
    for (int h = 0; h < kH; ++h) {
      __m256 d, m = _mm256_setzero_ps();
      if constexpr (kRowMajor) {
        d = RowFields<P>(src.rows[h], b, 0);
        if constexpr (P::kHasMin) m = RowFields<P>(src.rows[h], b, 1);
      } else {
        const uint8_t* f =
            src.tile[h] + src.nb * P::kQuantBytes + b * meta_bytes + 16 * src.half[h];
        d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f)));
        if constexpr (P::kHasMin) {
          m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f + 32)));
        }
      }
      for (int c = 0; c < kC; ++c) {
        const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(meta.d[c][j]));
        acc[h][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[h][c]), scale, acc[h][c]);
        if constexpr (P::kHasMin) {
          acc[h][c] = _mm256_fmadd_ps(m, _mm256_set1_ps(meta.s[c][j]), acc[h][c]);
        }
      }
    }
  }
}

// Per column c, per super-block j of a Q4_K pass: d_x, and the sums b of y over its 8
// sub-blocks as int16 pairs (b_2i, b_2i+1) (|b| <= 32 * 128).
struct KMeta {
  float d[kCols][kKDotChunk];
  int32_t b_pairs[kCols][kKDotChunk][4];
};

void PrepareKMeta(const BlockQ8_K* const* xc, int nc, int64_t b0, int64_t n, KMeta* meta) {
  for (int c = 0; c < nc; ++c) {
    for (int64_t j = 0; j < n; ++j) {
      const BlockQ8_K& x = xc[c][b0 + j];
      meta->d[c][j] = x.d;
      const __m128i b = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums)),
                                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.bsums + 8)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(meta->b_pairs[c][j]), b);
    }
  }
}

// Scale j (kMin: min j) of 16 rows, one byte per row, from a tile super-block's 12 scale-byte
// planes at p: GGUF's get_scale_min_k4 on every row at once. (16-bit shifts: the bits a byte
// takes from its neighbour are masked off.) Scales unpack at their sub-block, mins once at the
// block's end for both halves: all 16 unpacked up front outlived the registers and went
// through the stack (decode in L2, 1024-wide rows: 24-26 -> 25-27.6 GB/s; from memory no
// change).
template <bool kMin>
FUCINA_ALWAYS_INLINE __m128i KScale(const uint8_t* p, int j) {
  const auto plane = [&](int k) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
  };
  const __m128i m6 = _mm_set1_epi8(0x3F), m4 = _mm_set1_epi8(0x0F), m30 = _mm_set1_epi8(0x30);
  if (j < 4) return _mm_and_si128(plane(kMin ? 4 + j : j), m6);
  const __m128i hi = plane(4 + j);  // plane 8 + (j - 4)
  const __m128i hi_bits = kMin ? _mm_srli_epi16(hi, 4) : hi;
  const __m128i top = _mm_srli_epi16(plane(kMin ? j : j - 4), 2);  // mid or lo of j - 4
  return _mm_or_si128(_mm_and_si128(hi_bits, m4), _mm_and_si128(top, m30));
}

// Half h's 8 rows of one scale plane as int16 pairs (s, s) in row lanes.
FUCINA_ALWAYS_INLINE __m256i ScalePairs(__m128i s, int h) {
  // Byte 0x80 + 8h keeps its top bit: vpshufb zeroes it.
  const __m256i base = _mm256_setr_epi8(0, -128, 0, -128, 1, -128, 1, -128, 2, -128, 2, -128, 3,
                                        -128, 3, -128, 4, -128, 4, -128, 5, -128, 5, -128, 6,
                                        -128, 6, -128, 7, -128, 7, -128);
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(s),
                             _mm256_add_epi8(base, _mm256_set1_epi8(static_cast<char>(8 * h))));
}

// Half h's 8 rows of mins a and b as int16 pairs (a, b) in row lanes.
FUCINA_ALWAYS_INLINE __m256i MinPairs(__m128i a, __m128i b, int h) {
  return _mm256_cvtepu8_epi16(h == 0 ? _mm_unpacklo_epi8(a, b) : _mm_unpackhi_epi8(a, b));
}

// Q4_K and Q5_K: kH halves of kTiles16 tiles against kC activation rows, super-blocks
// [b0, b0 + n); acc[h][c] lane r is row r's KDotStep sum (avx2_util.h) over them. Per
// sub-block and column, 8 u8 x s8 vpmaddubsw (one per activation dword) add into int16 lanes,
// each summing 16 products of a nibble and an activation, |.| <= 16 * 15 * 128 < 2^15; one
// vpmaddwd by the rows' scale pairs takes them to int32. The min term is 4 vpmaddwd of the
// rows' min pairs by the column's sub-block sums. So 8 rows' sub-block costs ~17 integer ops
// per column, where the row-major tile spent ~24 per row and column, and the 6-bit scales
// unpack once for 16 rows. Q5_K ORs each quant's fifth bit in as 16; its int16 lanes then
// take 8 products of up to 31 * 128 before going to int32 (16 would overflow), so two
// vpmaddwd a sub-block.
template <typename P, int kH, int kC>
FUCINA_ALWAYS_INLINE void KPass(const Source<P>& src, const BlockQ8_K* const* xc, int64_t b0,
                                int64_t n, const KMeta& meta, __m256 acc[kH][kC]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  constexpr int kRun = P::kHigh ? 4 : 8;  // activation dwords summed in int16
  for (int h = 0; h < kH; ++h) {
    for (int c = 0; c < kC; ++c) acc[h][c] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = b0 + j;
    const uint8_t* quants = src.tile[0] + b * P::kQuantBytes;  // Q5_K: qh first
    const uint8_t* qs = quants + P::kQsAt;
    const uint8_t* mb = src.tile[0] + src.nb * P::kQuantBytes + b * kMetaOf<P>;
    __m256i isum[kH][kC];
    for (int h = 0; h < kH; ++h) {
      for (int c = 0; c < kC; ++c) isum[h][c] = _mm256_setzero_si256();
    }
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      if (src.next_tile != 0) PrefetchTileStream<P, 8>(src, b, s);
      // Sub-block s: the low (s even) or high nibbles of chunk s / 2.
      const uint8_t* qv = qs + 64 * 8 * (s / 2);
      const __m128i scale = KScale<false>(mb + 64, s);
      __m256i sum[kH][kC];
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) {
        if (v % kRun == 0) {
          for (int h = 0; h < kH; ++h) {
            for (int c = 0; c < kC; ++c) sum[h][c] = _mm256_setzero_si256();
          }
        }
        for (int h = 0; h < kH; ++h) {
          const __m256i w = Load32(qv + 64 * v + 32 * src.half[h]);
          __m256i q = _mm256_and_si256(s % 2 == 0 ? w : _mm256_srli_epi16(w, 4), low4);
          if constexpr (P::kHigh) {
            // Bit s of each qh byte to bit 4 (16-bit shifts: the bits a byte takes from its
            // neighbour are masked off).
            const __m256i hv = Load32(quants + 64 * v + 32 * src.half[h]);
            const __m256i at4 = s < 4 ? _mm256_slli_epi16(hv, 4 - s)
                                : s > 4 ? _mm256_srli_epi16(hv, s - 4)
                                        : hv;
            q = _mm256_or_si256(q, _mm256_and_si256(at4, bit4));
          }
#pragma GCC unroll 4
          for (int c = 0; c < kC; ++c) {
            const __m256i y = BroadcastDword(xc[c][b].qs + 32 * s + 4 * v);
            sum[h][c] = _mm256_add_epi16(sum[h][c], _mm256_maddubs_epi16(q, y));
            asm("" : "+x"(sum[h][c]));  // as in Pass: keep the chains
          }
        }
        if (v % kRun == kRun - 1) {
          for (int h = 0; h < kH; ++h) {
            const __m256i pairs = ScalePairs(scale, src.half[h]);
            for (int c = 0; c < kC; ++c) {
              isum[h][c] = _mm256_add_epi32(isum[h][c], _mm256_madd_epi16(sum[h][c], pairs));
            }
          }
        }
      }
    }
    __m128i mn[8];  // the 16 rows' mins, for both halves
    for (int i = 0; i < 8; ++i) mn[i] = KScale<true>(mb + 64, i);
    for (int h = 0; h < kH; ++h) {
      const uint8_t* f = mb + 16 * src.half[h];
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f)));
      const __m256 dmin =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(f + 32)));
      __m256i mins[4];
      for (int i = 0; i < 4; ++i) mins[i] = MinPairs(mn[2 * i], mn[2 * i + 1], src.half[h]);
      for (int c = 0; c < kC; ++c) {
        __m256i msum = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) {
          msum = _mm256_add_epi32(
              msum, _mm256_madd_epi16(mins[i], _mm256_set1_epi32(meta.b_pairs[c][j][i])));
        }
        const __m256 dx = _mm256_set1_ps(meta.d[c][j]);
        acc[h][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[h][c]), _mm256_mul_ps(d, dx),
                                    acc[h][c]);
        acc[h][c] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dx),
                                     acc[h][c]);
      }
    }
  }
}

// Lanes [0, rows) of v into out (rows <= 8), added to what is there when `accumulate`.
FUCINA_ALWAYS_INLINE void StoreRows(__m256 v, int rows, float* out, bool accumulate) {
  if (rows >= 8) {
    if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(out));
    _mm256_storeu_ps(out, v);
    return;
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int r = 0; r < rows; ++r) out[r] = accumulate ? out[r] + t[r] : t[r];
}

// A format's activation metadata, blocks per pass and elements per block.
template <typename P>
using MetaOf = std::conditional_t<P::kSuper, KMeta, Meta>;
template <typename P>
constexpr int64_t kChunkOf = P::kSuper ? kKDotChunk : kChunk;
template <typename P>
constexpr int64_t kBlockOf = P::kSuper ? 256 : 32;

// One pass; rows[h] valid rows of half h land at y + c * y_stride + 8 * h.
template <typename P, bool kRowMajor, int kH, int kC>
FUCINA_ALWAYS_INLINE void RunPass(const Source<P>& src, const int rows[kH],
                                  const typename P::X* const* xc, int64_t b0, int64_t n,
                                  const MetaOf<P>& meta, float* y, size_t y_stride) {
  __m256 acc[kH][kC];
  if constexpr (P::kSuper) {
    KPass<P, kH, kC>(src, xc, b0, n, meta, acc);
  } else {
    Pass<P, kRowMajor, kH, kC>(src, xc, b0, n, meta, acc);
  }
  for (int h = 0; h < kH; ++h) {
    if (rows[h] <= 0) continue;
    for (int c = 0; c < kC; ++c) StoreRows(acc[h][c], rows[h], y + c * y_stride + 8 * h, b0 > 0);
  }
}

// The rows of GGUF tile t of `rows` rows at wb: an edge repeats its last row.
template <typename W>
FUCINA_ALWAYS_INLINE void TileRows(const uint8_t* wb, size_t w_stride, int64_t rows, int64_t t,
                                   const W* rp[kTileRows]) {
  for (int r = 0; r < kTileRows; ++r) {
    const int64_t row = t * kTileRows + r < rows ? t * kTileRows + r : rows - 1;
    rp[r] = reinterpret_cast<const W*>(wb + row * w_stride);
  }
}

// Column groups of kCols that take each tile in turn: a set is the widest decode-shaped call
// (matmul.cc's kDecodeColumns, a lockstep batch of 8 streams).
constexpr int kGroups = 2;
static_assert(kGroups * kCols == 8, "a set of groups is a lockstep batch of 8 columns");

// kTiles16 weights: nb blocks, rows in tiles of 16 from wb (tile t at t * tile_stride).
// Columns go in sets of kGroups groups, and every group of a set passes over a tile's chunk
// before the next tile: the first group's pass brings it in from memory (and prefetches ahead
// as decode does), the others find it in L1 where a chunk fits (on 1024-wide rows 17 KiB of
// Q8_0, 9 KiB of Q4_K), else in L2 as before. With the groups outermost, a lockstep batch of
// 8 streamed each block of rows from memory in its first group's pass alone, a 4-column pass
// that needs the bytes nearly as fast as the read bound, then ran its second group from L2
// with memory idle; and each prefill group re-read the whole block from L2.
template <typename P>
void Tiles(int64_t nb, const uint8_t* wb, size_t tile_stride, int64_t rows, const uint8_t* xb,
           size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  using X = typename P::X;
  constexpr int64_t chunk = kChunkOf<P>;
  MetaOf<P> meta[kGroups];
  for (int64_t s0 = 0; s0 < cols; s0 += kGroups * kCols) {
    int groups = 0;
    int nc[kGroups];
    const X* xc[kGroups][kCols];
    for (int64_t c0 = s0; c0 < cols && groups < kGroups; c0 += kCols, ++groups) {
      nc[groups] = static_cast<int>(cols - c0 < kCols ? cols - c0 : kCols);
      for (int c = 0; c < kCols; ++c) {
        xc[groups][c] = reinterpret_cast<const X*>(xb + (c0 + (c < nc[groups] ? c : 0)) * x_stride);
      }
    }
    for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
      const int64_t n = nb - b0 < chunk ? nb - b0 : chunk;
      for (int g = 0; g < groups; ++g) {
        if constexpr (P::kSuper) {
          PrepareKMeta(xc[g], nc[g], b0, n, &meta[g]);
        } else {
          PrepareMeta<P>(xc[g], nc[g], b0, n, &meta[g]);
        }
      }
      for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
        const int nr = static_cast<int>(rows - r0 < kTileRows ? rows - r0 : kTileRows);
        const int valid[2] = {nr < 8 ? nr : 8, nr - 8};
        Source<P> src;
        src.nb = nb;
        src.tile[0] = src.tile[1] = wb + (r0 / kTileRows) * tile_stride;
        if (cols <= 2) {
          // Decode, and a GQA pair's attention scores: both halves of a tile at once, whole
          // cache lines streamed by one pass.
          float* yt = y + r0;
          src.half[1] = 1;
          src.next_tile = tile_stride;
          if (cols == 1) {
            RunPass<P, false, 2, 1>(src, valid, xc[0], b0, n, meta[0], yt, y_stride);
          } else {
            RunPass<P, false, 2, 2>(src, valid, xc[0], b0, n, meta[0], yt, y_stride);
          }
          continue;
        }
        for (int g = 0; g < groups; ++g) {
          float* yt = y + (s0 + g * kCols) * y_stride + r0;
          for (int h = 0; h < 2 && valid[h] > 0; ++h) {
            src.half[0] = h;
            // The first pass over a tile brings it in from memory (the caller's block of rows
            // then stays in L2 for the other sets): it prefetches as decode does, so that
            // lockstep batches and each block's first columns overlap the loads with the
            // arithmetic.
            src.next_tile = s0 == 0 && g == 0 && h == 0 ? tile_stride : 0;
            float* yh = yt + 8 * h;
            const X* const* x = xc[g];
            const MetaOf<P>& mg = meta[g];
            switch (nc[g]) {
              case 4: RunPass<P, false, 1, 4>(src, valid + h, x, b0, n, mg, yh, y_stride); break;
              case 3: RunPass<P, false, 1, 3>(src, valid + h, x, b0, n, mg, yh, y_stride); break;
              case 2: RunPass<P, false, 1, 2>(src, valid + h, x, b0, n, mg, yh, y_stride); break;
              default: RunPass<P, false, 1, 1>(src, valid + h, x, b0, n, mg, yh, y_stride);
            }
          }
        }
      }
    }
  }
}

// One column against row-major weights, each block transposed in registers (Pass<2, 1>'s
// arithmetic, so the same bits as the tiles).
template <typename P>
void RowsColumn(int64_t nb, const uint8_t* wb, size_t w_stride, int64_t rows,
                const typename P::X* x, float* y) {
  using W = typename P::W;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const typename P::X* xc[1] = {x};
  const W* rp[kTileRows];
  Meta meta;
  for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
    const int64_t n = nb - b0 < kChunk ? nb - b0 : kChunk;
    PrepareMeta<P>(xc, 1, b0, n, &meta);
    for (int64_t t = 0; t < tiles; ++t) {
      TileRows(wb, w_stride, rows, t, rp);
      const int nr = static_cast<int>(rows - t * kTileRows < kTileRows ? rows - t * kTileRows
                                                                       : kTileRows);
      const int valid[2] = {nr < 8 ? nr : 8, nr - 8};
      Source<P> src;
      src.rows[0] = rp;
      src.rows[1] = rp + 8;
      src.next_tile = kTileRows * w_stride;
      RunPass<P, true, 2, 1>(src, valid, xc, b0, n, meta, y + t * kTileRows, 1);
    }
  }
}

// Row-major weights with the tiles' arithmetic. Decode transposes each block in registers;
// larger calls pack their rows into kTiles16 tiles in per-thread scratch (the caller hands over
// ~256 KiB of rows at a time, so the copy stays in L2) and run Tiles over them, or, where the
// scratch cannot be had, take the columns one at a time.
template <typename P>
void Rows(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
          size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  using W = typename P::W;
  using X = typename P::X;
  const int64_t nb = k / 32;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* xb = static_cast<const uint8_t*>(x);
  const size_t tile_bytes = static_cast<size_t>(nb) * kTileRows * sizeof(W);
  auto* scratch = cols > 1 ? static_cast<uint8_t*>(ThreadScratch(tiles * tile_bytes)) : nullptr;
  if (scratch == nullptr) {
    for (int64_t c = 0; c < cols; ++c) {
      RowsColumn<P>(nb, wb, w_stride, rows, reinterpret_cast<const X*>(xb + c * x_stride),
                    y + c * y_stride);
    }
    return;
  }
  const W* rp[kTileRows];
  for (int64_t t = 0; t < tiles; ++t) {
    uint8_t* tile = scratch + t * tile_bytes;
    TileRows(wb, w_stride, rows, t, rp);
    uint8_t* meta = tile + nb * P::kQuantBytes;
    for (int64_t b = 0; b < nb; ++b) {
      for (int h = 0; h < 2; ++h) {
        __m256i v[P::kLoads];
        P::Transpose(rp + 8 * h, b, v);
        for (int i = 0; i < P::kLoads; ++i) {
          _mm256_storeu_si256(
              reinterpret_cast<__m256i*>(tile + b * P::kQuantBytes + 64 * i + 32 * h),
              P::ToTile(v[i]));
        }
      }
      uint8_t* m = meta + b * kMetaOf<P>;
      for (int f = 0; f < P::kFields; ++f) {
        for (int r = 0; r < kTileRows; ++r) {
          std::memcpy(m + 32 * f + 2 * r, reinterpret_cast<const uint8_t*>(&rp[r][b]) + 2 * f, 2);
        }
      }
      if constexpr (P::kHigh) {
        for (int r = 0; r < kTileRows; ++r) std::memcpy(m + 32 * P::kFields + 4 * r, rp[r][b].qh, 4);
      }
    }
  }
  Tiles<P>(nb, scratch, tile_bytes, rows, xb, x_stride, cols, y, y_stride);
}

// GemmFn over kTiles16 weights (tile t at t * 16 * w_stride).
template <typename P>
void TilesGemm(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
               size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  Tiles<P>(k / kBlockOf<P>, static_cast<const uint8_t*>(w), kTileRows * w_stride, rows,
           static_cast<const uint8_t*>(x), x_stride, cols, y, y_stride);
}

}  // namespace

void GemmTilesQ8_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  TilesGemm<T8_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ4_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  TilesGemm<T4_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ4_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  TilesGemm<T4_1>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ4_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  TilesGemm<TK4>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ5_KQ8_K(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  TilesGemm<TK5>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ8_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  Rows<T8_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ4_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  Rows<T4_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ4_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  Rows<T4_1>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ5_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  TilesGemm<T5_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmTilesQ5_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  TilesGemm<T5_1>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  Rows<T5_0>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  Rows<T5_1>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx2
