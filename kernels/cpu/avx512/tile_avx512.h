// Private to kernels/cpu/avx512: register transposes shared by the row-transposed tile kernels
// (gemm_avx512.cc for the legacy formats, gemm_k_avx512.cc for the k-quants), and the
// horizontal reductions of the dot-product tiles (gemm_avx512.cc, gemm_float_avx512.cc).
//
// A tile holds 16 weight rows, one per int32 lane: the same 16-byte piece of each row is loaded
// and transposed so that vector k holds dword k (4 consecutive bytes) of every row. Lane 4l + i
// holds row 4i + l (the 4x4 transpose of the row index); StoreTile undoes it.
//
// Everything here has internal linkage (anonymous namespace, inline): these files are compiled
// with AVX-512 flags and must not share out-of-line copies with other translation units.
#ifndef FUCINA_KERNELS_CPU_AVX512_TILE_AVX512_H_
#define FUCINA_KERNELS_CPU_AVX512_TILE_AVX512_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/avx2/avx2_util.h"

namespace fucina::avx512 {
namespace {

#define FUCINA_TILE_INLINE inline __attribute__((always_inline))

constexpr int kTRows = 16;  // weight rows per transposed tile.
constexpr int kTCols = 8;   // activation rows per transposed tile.

// Chunk l of the result = 16 bytes at r[l] (l < 4).
FUCINA_TILE_INLINE __m512i Load4x16(const uint8_t* r0, const uint8_t* r1, const uint8_t* r2,
                                    const uint8_t* r3) {
  __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r0)));
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1)), 1);
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r2)), 2);
  return _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(r3)), 3);
}

FUCINA_TILE_INLINE void Load16x16(const uint8_t* const* rp, size_t off, __m512i z[4]) {
  for (int i = 0; i < 4; ++i) {
    z[i] = Load4x16(rp[4 * i] + off, rp[4 * i + 1] + off, rp[4 * i + 2] + off, rp[4 * i + 3] + off);
  }
}

// The 16 bytes at rp[q] + off of the 16 rows -> t[k] whose lane 4l + i is dword k of row 4i + l.
FUCINA_TILE_INLINE void LoadTransposed(const uint8_t* const* rp, size_t off, __m512i t[4]) {
  __m512i z[4];
  Load16x16(rp, off, z);
  const __m512i a = _mm512_unpacklo_epi32(z[0], z[1]);  // per chunk: z0.d0 z1.d0 z0.d1 z1.d1
  const __m512i b = _mm512_unpackhi_epi32(z[0], z[1]);  // z0.d2 z1.d2 z0.d3 z1.d3
  const __m512i c = _mm512_unpacklo_epi32(z[2], z[3]);
  const __m512i d = _mm512_unpackhi_epi32(z[2], z[3]);
  t[0] = _mm512_unpacklo_epi64(a, c);
  t[1] = _mm512_unpackhi_epi64(a, c);
  t[2] = _mm512_unpacklo_epi64(b, d);
  t[3] = _mm512_unpackhi_epi64(b, d);
}

// Dwords 0 and 1 of the 16 bytes at rp[q] + off of the 16 rows, same lane order.
FUCINA_TILE_INLINE void LoadDwords01(const uint8_t* const* rp, size_t off, __m512i* d0,
                                     __m512i* d1) {
  __m512i z[4];
  Load16x16(rp, off, z);
  const __m512i a = _mm512_unpacklo_epi32(z[0], z[1]);
  const __m512i c = _mm512_unpacklo_epi32(z[2], z[3]);
  *d0 = _mm512_unpacklo_epi64(a, c);
  *d1 = _mm512_unpackhi_epi64(a, c);
}

// Dword 0 alone (the unused dword 1 folds away inline).
FUCINA_TILE_INLINE __m512i LoadDword0(const uint8_t* const* rp, size_t off) {
  __m512i d0, d1;
  LoadDwords01(rp, off, &d0, &d1);
  return d0;
}

// Dword 3 of the 16 bytes at rp[q] + off of the 16 rows, same lane order (for fields at the end
// of a block: the load stays inside it).
FUCINA_TILE_INLINE __m512i LoadDword3(const uint8_t* const* rp, size_t off) {
  __m512i z[4];
  Load16x16(rp, off, z);
  return _mm512_unpackhi_epi64(_mm512_unpackhi_epi32(z[0], z[1]),
                               _mm512_unpackhi_epi32(z[2], z[3]));
}

// The f16 in the low half of each dword, as floats.
FUCINA_TILE_INLINE __m512 LowHalves(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }

// A vpshufb pattern repeated in every dword of every 128-bit lane: `base` for dword 0, plus 4
// per byte for the following dwords (so byte indices stay within their own dword).
FUCINA_TILE_INLINE __m512i DwordPattern(uint32_t base) {
  const __m128i v = _mm_setr_epi32(static_cast<int>(base), static_cast<int>(base + 0x04040404u),
                                   static_cast<int>(base + 0x08080808u),
                                   static_cast<int>(base + 0x0C0C0C0Cu));
  return _mm512_broadcast_i32x4(v);
}

// Broadcast of the 4 bytes at p as one dword.
FUCINA_TILE_INLINE __m512i BroadcastDword(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// Writes (or adds to) rows [0, rows) of a tile accumulator (lanes in transposed order, or row r
// in lane r when `natural`).
FUCINA_TILE_INLINE void StoreTile(__m512 acc, int rows, float* out, bool accumulate,
                                  bool natural = false) {
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
  __m512 v = natural ? acc : _mm512_permutexvar_ps(order, acc);
  if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, out));
  _mm512_mask_storeu_ps(out, mask, v);
}

// Pointers to the 16 rows of the tile starting at row r0 (of `rows`); rows past the end repeat
// the last row (their results are never stored).
FUCINA_TILE_INLINE void TileRows(const uint8_t* w, size_t w_stride, int64_t r0, int nr,
                                 const uint8_t* rp[kTRows]) {
  for (int r = 0; r < kTRows; ++r) rp[r] = w + (r0 + (r < nr ? r : nr - 1)) * w_stride;
}

// Software prefetch for decode-shaped calls, which read each weight byte once. A tile reads 16
// rows side by side, a few bytes of each per step: the hardware prefetchers see 16 short
// streams and keep too few lines in flight (a single-column matvec reached ~1/3 of the plain
// read bandwidth from L3). So while tile t runs, the same block offsets of the 16 rows
// `ahead` bytes further (the next tile) are requested into L2. Called once per block j at byte
// offset `off` of each row; every line of the next tile's rows is touched once or twice.
// Prefetches never fault, so rows past the end of the matrix are harmless.
template <size_t kBlockBytes>
FUCINA_TILE_INLINE void PrefetchNextTile(const uint8_t* const* rp, size_t ahead, size_t off,
                                         int64_t j) {
  if constexpr (kBlockBytes <= 64) {
    // One prefetch per row every `every` blocks: consecutive ones are <= 64 bytes apart.
    constexpr int64_t every = 64 / kBlockBytes;
    if (j % every != 0) return;
    for (int r = 0; r < kTRows; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(rp[r] + ahead + off), _MM_HINT_T1);
    }
  } else {
    for (int r = 0; r < kTRows; ++r) {
      for (size_t o = 0; o < kBlockBytes; o += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(rp[r] + ahead + off + o), _MM_HINT_T1);
      }
    }
  }
}

// The same for the k-quant tiles (Q4_K, Q5_K, Q6_K; blocks of 144-210 bytes), in address
// order. A pass reads bytes [first, first + n * kBlockBytes) of each of the 16 rows; the next
// tile's 16 such ranges, taken in row order, form one sequence, and step j of the pass requests
// its bytes [j, j + 1) * 16 * kBlockBytes into L1: a linear run through the next tile where a
// pass reads whole rows. Per row, as above, it made 16 interleaved streams of 3-4 lines a step,
// and on a Zen 5 core the decode matvec ran at 35-57% of the read bandwidth (Q6_K, Q4_K)
// against 70-90% with runs (`fucina bench kernels`). The legacy types' 18-34 byte blocks keep
// the per-row form, which measured as well or better for them.
template <size_t kBlockBytes>
FUCINA_TILE_INLINE void PrefetchNextTileRun(const uint8_t* const* rp, size_t ahead, size_t first,
                                            int64_t n, int64_t j) {
  constexpr size_t kStep = kTRows * kBlockBytes;
  const size_t span = static_cast<size_t>(n) * kBlockBytes;  // one row's range
  if (first == 0 && kTRows * span == ahead) {
    // Whole rows back to back (ahead is 16 row strides): the run starts at a known offset.
    const char* run = reinterpret_cast<const char*>(rp[0]) + ahead + j * kStep;
    for (size_t o = 0; o < kStep; o += 64) _mm_prefetch(run + o, _MM_HINT_T0);
    return;
  }
  size_t row = static_cast<size_t>(j) * kStep / span;
  size_t from = static_cast<size_t>(j) * kStep % span;
  for (size_t left = kStep; left > 0 && row < kTRows; ++row, from = 0) {
    const char* base = reinterpret_cast<const char*>(rp[row]) + ahead + first;
    const size_t to = span - from < left ? span : from + left;
    for (size_t o = from; o < to; o += 64) _mm_prefetch(base + o, _MM_HINT_T0);
    left -= to - from;
  }
}

// Requests the first `row_bytes` of the 16 rows at rp into L2 at once: the start of a
// decode-shaped call, before PrefetchNextTile keeps one tile ahead. (A call often starts where
// another thread's work item ended, so nothing has prefetched these rows.)
FUCINA_TILE_INLINE void PrefetchTile(const uint8_t* const* rp, size_t row_bytes) {
  for (int r = 0; r < kTRows; ++r) {
    for (size_t o = 0; o < row_bytes; o += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(rp[r] + o), _MM_HINT_T1);
    }
  }
}

// Decode-shaped calls on kTiles16 weights (one sequential stream per tile) request the
// `bytes` at p + ahead into L2, each line three times: at `ahead`, 2/3 and 1/3 of it, i.e.
// again as the read comes closer (the quants kStreamAhead ahead; the meta, a few bytes per
// block after the tile's quants, one tile ahead: PrefetchTileBlock). The stream's own
// prefetchers kept too few lines in flight, and on a Zen 4 core single requests were not
// enough either: `bench kernels`, 1 thread, 3072 x 1024 matvec from memory, % of the plain
// read bandwidth:
//   Q4_K tiles: prefetcht0 4 KiB ahead 28%, none 36%, prefetcht1 16 KiB 64-67%, twice 69-79%,
//   three times 82-97%;
//   Q8_0 tiles: prefetcht0 4 KiB 46-53%, prefetcht1 16 KiB 63-66%, twice 72-78%, three times
//   88-89%.
// kFar more requests go 2, 3, ... times `ahead` on, farther than the rest: where the kernel's
// arithmetic is light, they keep more of the stream in flight, and at the end of a call they
// reach into the next weight matrix in the file, which a decode step reads next (below).
// Prefetches never fault, so lines past the end of the matrix are harmless.
constexpr size_t kStreamAhead = 16384;
template <int kFar>
FUCINA_TILE_INLINE void PrefetchStream(const uint8_t* p, size_t bytes, size_t ahead) {
  for (size_t l = 0; l < bytes; l += 64) {
    const char* line = reinterpret_cast<const char*>(p + l);
    for (int f = kFar; f > 0; --f) _mm_prefetch(line + ahead * (f + 1), _MM_HINT_T1);
    _mm_prefetch(line + ahead, _MM_HINT_T1);
    _mm_prefetch(line + ahead * 2 / 3, _MM_HINT_T1);
    _mm_prefetch(line + ahead / 3, _MM_HINT_T1);
  }
}

// What a tile kernel requests while it reads one block of a kTiles16 tile: its quant_bytes
// at `quants`, kStreamAhead on (PrefetchStream<kFar>), and its meta_bytes at `meta` one tile
// (tile_bytes) on, i.e. the same block's meta in the next tile, needed a whole tile later. (A
// distance along the meta proportional to kStreamAhead lands in the next tile's quants, which
// the quant stream requests anyway, so a tile's first meta lines were fetched only as the tile
// began: Q8_0 3072 x 1024 tiles, 1 thread, 25.5 -> 26.2 GB/s, Q6_K 27.3 -> 28.7 alternated.)
template <int kFar>
FUCINA_TILE_INLINE void PrefetchTileBlock(const uint8_t* quants, size_t quant_bytes,
                                          const uint8_t* meta, size_t meta_bytes,
                                          size_t tile_bytes) {
  PrefetchStream<kFar>(quants, quant_bytes, kStreamAhead);
  for (size_t l = 0; l < meta_bytes; l += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(meta + l + tile_bytes), _MM_HINT_T1);
  }
}

// Sums of 4 vectors: lane i = horizontal sum of v[i].
FUCINA_TILE_INLINE __m128 Reduce4(__m512 v0, __m512 v1, __m512 v2, __m512 v3) {
  // 128-bit chunks q0..q3: fold q2,q3 onto q0,q1 for two vectors at once.
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(v0, v1, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(v2, v3, _MM_SHUFFLE(3, 2, 3, 2)));
  // Chunk i now holds 4 partial sums of v[i].
  __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(1, 0, 3, 2)));
  t = _mm512_add_ps(t, _mm512_permute_ps(t, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0,
                                                                        0, 0, 0, 0, 0, 0, 0, 0),
                                                      t));
}

// Stores (or adds to y) lanes r < rows of v (rows in 1..4).
FUCINA_TILE_INLINE void StoreRows(float* y, int rows, __m128 v, bool accumulate = false) {
  const __mmask8 mask = static_cast<__mmask8>((1u << rows) - 1);
  if (accumulate) v = _mm_add_ps(v, _mm_maskz_loadu_ps(mask, y));
  _mm_mask_storeu_ps(y, mask, v);
}

// A 64-byte aligned per-thread buffer of at least `bytes` (avx2::ThreadScratch). Prefill-shaped
// calls unpack a block of weight rows into it once and run every group of activation rows over
// the unpacked copy instead of transposing the rows again for each group.
inline void* TileScratch(size_t bytes) { return avx2::ThreadScratch(bytes); }

}  // namespace
}  // namespace fucina::avx512

#endif  // FUCINA_KERNELS_CPU_AVX512_TILE_AVX512_H_
