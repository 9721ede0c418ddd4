// AVX2 + FMA + F16C kernel for Q8_0 weights in the kTiles16 layout (kernels/tile_layout.h),
// the GemmFn contract of kernels/cpu/gemm_isa.h.
//
// Rows in lanes: half h of a tile's block is 8 vectors (one per dword k of the block) whose
// lane r holds quants 4k..4k+3 of row 8h + r. An activation block is 8 broadcast dwords; per
// dword, u8 x s8 multiply-adds give the 8 rows' partial sums in lanes, and the block's integer
// sums accumulate there, so a block costs one convert, one scale product and one FMA for all
// 8 rows (the row-major tiles pay those per pair, plus the horizontal sums). The integer
// chain per dword is |q| * (y * sign(q)) (vpsignb, vpmaddubsw, vpmaddwd): the tile stores
// q + 128 for the AVX-512 kernel's vpdpbusd, whose u8 operand cannot go into vpmaddubsw as it
// is (two products of up to 255 * 127 saturate its int16 pair sums), so each weight vector is
// flipped back to q and its magnitude taken once, for every column of the pass. |q| <= 128
// and |y| <= 127 (the Q8 quantizers' range) keep every pair sum within int16.
//
// Every (row, column) then does the same thing whatever the call's shape: per block, the exact
// integer sum, converted, times d_w * d_x, one FMA into its lane, chunks of kChunk blocks
// summed into the output in order. Decode (one column, both halves of a tile at once: two
// chains and whole cache lines) and prefill (a half tile against kCols columns) agree bit for
// bit.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/quant/blocks.h"

namespace fucina::avx2 {
namespace {

constexpr int kTileRows = 16;
constexpr int kQuantBytes = 512;  // one block of a tile: 16 rows x 32 quants
constexpr int kCols = 4;          // activation rows of a prefill pass (8 rows x 4 columns)
constexpr int kChunk = 128;       // blocks per pass, whose activation scales are converted once
// Decode-shaped calls prefetch the tile's quant stream this far ahead (as the AVX-512 kernel),
// and the next tile's scales while this one runs: they sit after its quants, so the quant
// prefetch reaches them only as that tile ends, and each tile began with a few demand misses
// (1-thread Q8_0 matvec ~15% below the row-major kernel it replaced).
constexpr size_t kAhead = 4096;

// Column c's block scales (f32) for blocks [b0, b0 + n) of one pass.
struct Meta {
  float d[kCols][kChunk];
};

FUCINA_ALWAYS_INLINE __m256i BroadcastDword(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// kH halves of the tile at `tile` (first half h0) against kC activation rows xc, blocks
// [b0, b0 + n): acc[h][c] lane r gains row 8 (h0 + h) + r's dot with column c.
template <int kH, int kC>
FUCINA_ALWAYS_INLINE void Pass(const uint8_t* tile, int64_t nb, int h0, const BlockQ8_0* const* xc,
                               int64_t b0, int64_t n, const Meta& meta, size_t next_tile,
                               __m256 acc[kH][kC]) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < kH; ++h) {
    for (int c = 0; c < kC; ++c) acc[h][c] = _mm256_setzero_ps();
  }
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = b0 + j;
    const uint8_t* qs = tile + b * kQuantBytes + 32 * h0;
    if (next_tile != 0) {
      for (int l = 0; l < kQuantBytes; l += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(qs + kAhead + l), _MM_HINT_T0);
      }
      _mm_prefetch(reinterpret_cast<const char*>(tile + next_tile + nb * kQuantBytes + b * 32),
                   _MM_HINT_T0);
    }
    __m256i sum[kH][kC];
    for (int h = 0; h < kH; ++h) {
      for (int c = 0; c < kC; ++c) sum[h][c] = _mm256_setzero_si256();
    }
    // Dword k of every column before dword k + 1: kH * kC independent integer chains.
    for (int k = 0; k < 8; ++k) {
      __m256i q[kH], magnitude[kH];
      for (int h = 0; h < kH; ++h) {
        q[h] = _mm256_xor_si256(Load32(qs + 64 * k + 32 * h), flip);
        magnitude[h] = _mm256_sign_epi8(q[h], q[h]);
      }
      for (int c = 0; c < kC; ++c) {
        const __m256i y = BroadcastDword(xc[c][b].qs + 4 * k);
        for (int h = 0; h < kH; ++h) {
          const __m256i pairs = _mm256_maddubs_epi16(magnitude[h], _mm256_sign_epi8(y, q[h]));
          sum[h][c] = _mm256_add_epi32(sum[h][c], _mm256_madd_epi16(pairs, ones));
          // Keeps GCC from reassociating the chains into "every product first, then the
          // sums", which spilled a dozen vectors per block.
          asm("" : "+x"(sum[h][c]));
        }
      }
    }
    const uint8_t* fields = tile + nb * kQuantBytes + b * 32 + 16 * h0;
    for (int h = 0; h < kH; ++h) {
      const __m256 d = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(fields + 16 * h)));
      for (int c = 0; c < kC; ++c) {
        const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(meta.d[c][j]));
        acc[h][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[h][c]), scale, acc[h][c]);
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

// One pass over tile rows [0, rows) for activation columns xc[0, kC).
template <int kH, int kC>
FUCINA_ALWAYS_INLINE void RunPass(const uint8_t* tile, int64_t nb, int h0, int rows,
                                  const BlockQ8_0* const* xc, int64_t b0, int64_t n,
                                  const Meta& meta, size_t next_tile, float* y,
                                  size_t y_stride) {
  __m256 acc[kH][kC];
  Pass<kH, kC>(tile, nb, h0, xc, b0, n, meta, next_tile, acc);
  for (int h = 0; h < kH; ++h) {
    const int lo = 8 * (h0 + h);
    if (rows <= lo) break;
    for (int c = 0; c < kC; ++c) {
      StoreRows(acc[h][c], rows - lo, y + c * y_stride + lo, b0 > 0);
    }
  }
}

// The call's work: nb blocks, rows in tiles of 16 from wb (tile t at t * tile_stride).
void Tiles(int64_t nb, const uint8_t* wb, size_t tile_stride, int64_t rows, const uint8_t* xb,
           size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  Meta meta;
  for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
    const int nc = static_cast<int>(cols - c0 < kCols ? cols - c0 : kCols);
    const BlockQ8_0* xc[kCols];
    for (int c = 0; c < kCols; ++c) {
      xc[c] = reinterpret_cast<const BlockQ8_0*>(xb + (c0 + (c < nc ? c : 0)) * x_stride);
    }
    for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
      const int64_t n = nb - b0 < kChunk ? nb - b0 : kChunk;
      for (int c = 0; c < nc; ++c) {
        for (int64_t j = 0; j < n; ++j) meta.d[c][j] = _cvtsh_ss(xc[c][b0 + j].d);
      }
      for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
        const uint8_t* tile = wb + (r0 / kTileRows) * tile_stride;
        const int nr = static_cast<int>(rows - r0 < kTileRows ? rows - r0 : kTileRows);
        float* yt = y + c0 * y_stride + r0;
        if (cols == 1) {
          RunPass<2, 1>(tile, nb, 0, nr, xc, b0, n, meta, tile_stride, yt, y_stride);
          continue;
        }
        for (int h = 0; h < 2 && 8 * h < nr; ++h) {
          switch (nc) {
            case 4: RunPass<1, 4>(tile, nb, h, nr, xc, b0, n, meta, 0, yt, y_stride); break;
            case 3: RunPass<1, 3>(tile, nb, h, nr, xc, b0, n, meta, 0, yt, y_stride); break;
            case 2: RunPass<1, 2>(tile, nb, h, nr, xc, b0, n, meta, 0, yt, y_stride); break;
            default: RunPass<1, 1>(tile, nb, h, nr, xc, b0, n, meta, 0, yt, y_stride);
          }
        }
      }
    }
  }
}

// Block b's quants of 8 GGUF rows rp[0..8), transposed: q[k] lane r = dword k of row r (an
// 8 x 8 transpose of dwords).
FUCINA_ALWAYS_INLINE void Transpose8(const BlockQ8_0* const* rp, int64_t b, __m256i q[8]) {
  __m256i v[8], t[8], u[8];
  for (int r = 0; r < 8; ++r) v[r] = Load32(rp[r][b].qs);
  for (int r = 0; r < 8; r += 2) {
    t[r] = _mm256_unpacklo_epi32(v[r], v[r + 1]);      // dwords 0, 1 | 4, 5 of rows r, r + 1
    t[r + 1] = _mm256_unpackhi_epi32(v[r], v[r + 1]);  // dwords 2, 3 | 6, 7
  }
  for (int g = 0; g < 8; g += 4) {  // rows g..g+3: u[g + i] holds dwords i | 4 + i
    u[g] = _mm256_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm256_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm256_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm256_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    q[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
    q[4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
  }
}

// The d of block b of 8 GGUF rows, lane r = row r's.
FUCINA_ALWAYS_INLINE __m256 Scales8(const BlockQ8_0* const* rp, int64_t b) {
  return _mm256_cvtph_ps(_mm_setr_epi16(
      static_cast<int16_t>(rp[0][b].d), static_cast<int16_t>(rp[1][b].d),
      static_cast<int16_t>(rp[2][b].d), static_cast<int16_t>(rp[3][b].d),
      static_cast<int16_t>(rp[4][b].d), static_cast<int16_t>(rp[5][b].d),
      static_cast<int16_t>(rp[6][b].d), static_cast<int16_t>(rp[7][b].d)));
}

// One column against 16 GGUF rows rp (an edge repeating its last row), transposing each
// block in registers: Pass<2, 1>'s arithmetic on the same values, so the same bits.
void RowsDecode(int64_t nb, const BlockQ8_0* const* rp, int rows, const BlockQ8_0* x,
                float* y) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
    const int64_t end = nb - b0 < kChunk ? nb : b0 + kChunk;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = b0; b < end; ++b) {
      const float dx = _cvtsh_ss(x[b].d);
      for (int h = 0; h < 2; ++h) {
        __m256i q[8];
        Transpose8(rp + 8 * h, b, q);
        __m256i sum = _mm256_setzero_si256();
        for (int k = 0; k < 8; ++k) {
          const __m256i y4 = BroadcastDword(x[b].qs + 4 * k);
          const __m256i pairs =
              _mm256_maddubs_epi16(_mm256_sign_epi8(q[k], q[k]), _mm256_sign_epi8(y4, q[k]));
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
        }
        const __m256 scale = _mm256_mul_ps(Scales8(rp + 8 * h, b), _mm256_set1_ps(dx));
        acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, acc[h]);
      }
    }
    for (int h = 0; h < 2 && 8 * h < rows; ++h) StoreRows(acc[h], rows - 8 * h, y + 8 * h, b0 > 0);
  }
}

// Block b of 8 GGUF rows rp[0..8) as half of a kTiles16 block at out (q + 128).
FUCINA_ALWAYS_INLINE void PackHalf(const BlockQ8_0* const* rp, int64_t b, uint8_t* out) {
  __m256i q[8];
  Transpose8(rp, b, q);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int k = 0; k < 8; ++k) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 64 * k), _mm256_xor_si256(q[k], flip));
  }
}

// The rows of GGUF tile t of `rows` rows at wb: an edge repeats its last row.
FUCINA_ALWAYS_INLINE void TileRows(const uint8_t* wb, size_t w_stride, int64_t rows, int64_t t,
                                   const BlockQ8_0* rp[kTileRows]) {
  for (int r = 0; r < kTileRows; ++r) {
    const int64_t row = std::min<int64_t>(t * kTileRows + r, rows - 1);
    rp[r] = reinterpret_cast<const BlockQ8_0*>(wb + row * w_stride);
  }
}

}  // namespace

void GemmTilesQ8_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                       size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  Tiles(k / 32, static_cast<const uint8_t*>(w), kTileRows * w_stride, rows,
        static_cast<const uint8_t*>(x), x_stride, cols, y, y_stride);
}

// Row-major Q8_0 (matrices whose rows are not a multiple of 16, expert stacks, views that are
// not repacked), with the kTiles16 kernel's arithmetic so both layouts give the same bits.
// Decode transposes each block in registers. Larger calls pack their rows into kTiles16 tiles
// in per-thread scratch first (the caller hands over ~256 KiB of rows at a time, so the copy
// stays in L2) and run the tile kernel over them.
void GemmQ8_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  const int64_t nb = k / 32;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const auto* wb = static_cast<const uint8_t*>(w);
  const BlockQ8_0* rp[kTileRows];
  if (cols == 1) {
    for (int64_t t = 0; t < tiles; ++t) {
      TileRows(wb, w_stride, rows, t, rp);
      const int nr = static_cast<int>(std::min<int64_t>(kTileRows, rows - t * kTileRows));
      RowsDecode(nb, rp, nr, static_cast<const BlockQ8_0*>(x), y + t * kTileRows);
    }
    return;
  }
  const size_t tile_bytes = static_cast<size_t>(nb) * kTileRows * sizeof(BlockQ8_0);
  thread_local std::vector<uint8_t> scratch;  // grows to the largest call, then stays
  if (scratch.size() < tiles * tile_bytes) scratch.resize(tiles * tile_bytes);
  for (int64_t t = 0; t < tiles; ++t) {
    uint8_t* tile = scratch.data() + t * tile_bytes;
    TileRows(wb, w_stride, rows, t, rp);
    uint8_t* fields = tile + nb * kQuantBytes;
    for (int64_t b = 0; b < nb; ++b) {
      PackHalf(rp, b, tile + b * kQuantBytes);
      PackHalf(rp + 8, b, tile + b * kQuantBytes + 32);
      for (int r = 0; r < kTileRows; ++r) std::memcpy(fields + b * 32 + 2 * r, &rp[r][b].d, 2);
    }
  }
  Tiles(nb, scratch.data(), tile_bytes, rows, static_cast<const uint8_t*>(x), x_stride, cols, y,
        y_stride);
}

}  // namespace fucina::avx2
