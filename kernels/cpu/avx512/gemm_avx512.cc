// AVX-512 (F/BW/VL/DQ + VNNI) tile kernels for kernels/cpu/gemm_isa.h.
//
// Two schemes. Q8_0, Q4_0 and Q4_1 (the common formats) use row-transposed tiles of 16
// weight rows x 8 activation rows, described further down. Q5_0 and Q5_1 use pair tiles of
// 4 x 4: one 512-bit register holds two consecutive blocks of a row, as in the vec_dot kernels
// (quant_legacy_avx512.cc); per step the 4 weight rows are unpacked once to unsigned bytes and
// every activation row meets each weight row with one vpdpbusd, whose starting value folds in
// the offset that made the weights unsigned (sum((q + c) * y) - c * sum(y)). Each (row,
// column) pair then costs a convert, a scale product and an FMA into its own accumulator; the
// 16 accumulators are reduced together at the end, and the m_w * s_y term of Q5_1 is an outer
// product per block kept in one more vector (lane 4c + r).
// GCC 12's AVX-512 headers build "undefined" vectors as `__Y = __Y` (GCC bug 105593), which
// raises spurious (maybe-)uninitialized warnings wherever those intrinsics are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/avx512_util.h"
#include "kernels/cpu/avx512/tile_avx512.h"
#include "kernels/cpu/gemm_isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina::avx512 {
namespace {

#define FUCINA_ALWAYS_INLINE inline __attribute__((always_inline))

constexpr int kRm = 4;  // weight rows per tile (fixed; short edges repeat the last row).
constexpr int kMaxRn = 4;  // activation rows per tile (1..4 instantiated).

// ---------------------------------------------------------------------------------------------
// Legacy formats.

// The f16 fields at the start of two blocks as floats [d_a, e_a, d_b, e_b], where e is the
// second f16 field (m of Q4_1/Q5_1, s of Q8_1) when kTwo, else 0.
template <bool kTwo>
FUCINA_ALWAYS_INLINE __m128 HalfFields(const void* a, const void* b) {
  uint32_t ua = 0, ub = 0;
  std::memcpy(&ua, a, kTwo ? 4 : 2);
  std::memcpy(&ub, b, kTwo ? 4 : 2);
  const uint64_t both = static_cast<uint64_t>(ua) | (static_cast<uint64_t>(ub) << 32);
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(both)));
}

// Pair-tile formats: the unsigned quants of two blocks, the offset c subtracted back
// (as c * sum(y)), and whether the format has the m * s term.
struct Q5_0Policy {
  using W = BlockQ5_0;
  using X = BlockQ8_0;
  static constexpr char kOffset = 16;
  static constexpr bool kHasMin = false;
  static FUCINA_ALWAYS_INLINE __m512i Quants(const W& a, const W& b) {
    return AddHighBits(UnpackNibbles(a.qs, b.qs), a.qh, b.qh);
  }
};
struct Q5_1Policy {
  using W = BlockQ5_1;
  using X = BlockQ8_1;
  static constexpr char kOffset = 0;
  static constexpr bool kHasMin = true;
  static FUCINA_ALWAYS_INLINE __m512i Quants(const W& a, const W& b) {
    return AddHighBits(UnpackNibbles(a.qs, b.qs), a.qh, b.qh);
  }
};

template <typename P, int kRn>
struct LegacyTile {
  using W = typename P::W;
  using X = typename P::X;

  __m512 acc[kRm][kRn];
  __m512 offs;  // kHasMin: lane 4c + r accumulates m_w * s_y of pair (r, c).

  // Blocks (i, i + 1) of every row, or block i and an all-zero block (which adds nothing).
  template <bool kPair>
  FUCINA_ALWAYS_INLINE void Step(const W* const* wr, const X* const* xc, int64_t i) {
    static constexpr W kZeroW{};
    static constexpr X kZeroX{};
    // Scale of lanes 0..7 from block a (field 0), of lanes 8..15 from block b (field 2).
    const __m512i idx_d = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    __m512i q[kRm];
    __m512 dw[kRm];
    __m512 fields_w = _mm512_setzero_ps();  // row r's [d_a, m_a, d_b, m_b] in chunk r.
    for (int r = 0; r < kRm; ++r) {
      const W& a = wr[r][i];
      const W& b = kPair ? wr[r][i + 1] : kZeroW;
      q[r] = P::Quants(a, b);
      const __m128 f = HalfFields<P::kHasMin>(&a, &b);
      dw[r] = _mm512_permutexvar_ps(idx_d, _mm512_castps128_ps512(f));
      if constexpr (P::kHasMin) fields_w = _mm512_insertf32x4(fields_w, f, r);
    }
    __m512 fields_x = _mm512_setzero_ps();  // column c's [d_a, s_a, d_b, s_b] in chunk c.
    for (int c = 0; c < kRn; ++c) {
      const X& a = xc[c][i];
      const X& b = kPair ? xc[c][i + 1] : kZeroX;
      const __m512i yq = LoadQs(a.qs, b.qs);
      __m512i init = _mm512_setzero_si512();
      if constexpr (P::kOffset != 0) {
        init = _mm512_sub_epi32(init, _mm512_dpbusd_epi32(init, _mm512_set1_epi8(P::kOffset), yq));
      }
      const __m128 f = HalfFields<P::kHasMin>(&a, &b);
      const __m512 dx = _mm512_permutexvar_ps(idx_d, _mm512_castps128_ps512(f));
      if constexpr (P::kHasMin) fields_x = _mm512_insertf32x4(fields_x, f, c);
      for (int r = 0; r < kRm; ++r) {
        const __m512i sum = _mm512_dpbusd_epi32(init, q[r], yq);
        acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw[r], dx), acc[r][c]);
      }
    }
    if constexpr (P::kHasMin) {
      // Lane 4c + r: m_r (field 1 or 3 of chunk r) times s_c (field 1 or 3 of chunk c).
      const __m512i m_a = _mm512_setr_epi32(1, 5, 9, 13, 1, 5, 9, 13, 1, 5, 9, 13, 1, 5, 9, 13);
      const __m512i s_a = _mm512_setr_epi32(1, 1, 1, 1, 5, 5, 5, 5, 9, 9, 9, 9, 13, 13, 13, 13);
      const __m512i two = _mm512_set1_epi32(2);
      offs = _mm512_fmadd_ps(_mm512_permutexvar_ps(m_a, fields_w),
                             _mm512_permutexvar_ps(s_a, fields_x), offs);
      if constexpr (kPair) {
        offs = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_add_epi32(m_a, two), fields_w),
                               _mm512_permutexvar_ps(_mm512_add_epi32(s_a, two), fields_x), offs);
      }
    }
  }

  void Run(int64_t nb, const uint8_t* w, size_t w_stride, int rows, const uint8_t* x,
           size_t x_stride, float* y, size_t y_stride) {
    const W* wr[kRm];
    for (int r = 0; r < kRm; ++r) {
      wr[r] = reinterpret_cast<const W*>(w + (r < rows ? r : rows - 1) * w_stride);
    }
    const X* xc[kRn];
    for (int c = 0; c < kRn; ++c) xc[c] = reinterpret_cast<const X*>(x + c * x_stride);
    for (int r = 0; r < kRm; ++r) {
      for (int c = 0; c < kRn; ++c) acc[r][c] = _mm512_setzero_ps();
    }
    offs = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2) Step<true>(wr, xc, i);
    if (i < nb) Step<false>(wr, xc, i);
    alignas(64) float o[16];
    if constexpr (P::kHasMin) _mm512_store_ps(o, offs);
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
  for (int64_t c0 = 0; c0 < cols; c0 += kMaxRn) {
    const int64_t nc = cols - c0 < kMaxRn ? cols - c0 : kMaxRn;
    const uint8_t* xt = xb + c0 * x_stride;
    for (int64_t r0 = 0; r0 < rows; r0 += kRm) {
      const int nr = static_cast<int>(rows - r0 < kRm ? rows - r0 : kRm);
      const uint8_t* wt = wb + r0 * w_stride;
      float* yt = y + c0 * y_stride + r0;
      switch (nc) {
        case 4: LegacyTile<P, 4>().Run(nb, wt, w_stride, nr, xt, x_stride, yt, y_stride); break;
        case 3: LegacyTile<P, 3>().Run(nb, wt, w_stride, nr, xt, x_stride, yt, y_stride); break;
        case 2: LegacyTile<P, 2>().Run(nb, wt, w_stride, nr, xt, x_stride, yt, y_stride); break;
        default: LegacyTile<P, 1>().Run(nb, wt, w_stride, nr, xt, x_stride, yt, y_stride); break;
      }
    }
  }
}


// ---------------------------------------------------------------------------------------------
// Row-transposed tiles for Q8_0, Q4_0, Q4_1: 16 weight rows, one per int32 lane.
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

struct ActivationMeta {
  float d[kTCols][kTChunk];
  float s[kTCols][kTChunk];
  int32_t corr[kTCols][kTChunk];
};

// Weight side of one block for 16 rows: q[k] pairs with activation dword k (unsigned bytes),
// d the rows' scales, m their offsets (kHasMin).
struct T8_0 {
  using W = BlockQ8_0;
  using X = BlockQ8_0;
  static constexpr int kOffset = 128;
  static constexpr bool kHasMin = false;
  static FUCINA_ALWAYS_INLINE void Prep(const uint8_t* const* rp, size_t off, __m512i q[8],
                                        __m512* d, __m512*) {
    LoadTransposed(rp, off + offsetof(W, qs), q);
    LoadTransposed(rp, off + offsetof(W, qs) + 16, q + 4);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int k = 0; k < 8; ++k) q[k] = _mm512_xor_si512(q[k], flip);
    *d = LowHalves(LoadDword0(rp, off));
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

struct T4_0 {
  using W = BlockQ4_0;
  using X = BlockQ8_0;
  static constexpr int kOffset = 8;
  static constexpr bool kHasMin = false;
  static FUCINA_ALWAYS_INLINE void Prep(const uint8_t* const* rp, size_t off, __m512i q[8],
                                        __m512* d, __m512*) {
    __m512i t[4];
    LoadTransposed(rp, off + offsetof(W, qs), t);
    SplitNibbles(t, q);
    *d = LowHalves(LoadDword0(rp, off));
  }
};

struct T4_1 {
  using W = BlockQ4_1;
  using X = BlockQ8_1;
  static constexpr int kOffset = 0;
  static constexpr bool kHasMin = true;
  static FUCINA_ALWAYS_INLINE void Prep(const uint8_t* const* rp, size_t off, __m512i q[8],
                                        __m512* d, __m512* m) {
    __m512i t[4];
    LoadTransposed(rp, off + offsetof(W, qs), t);
    SplitNibbles(t, q);
    const __m512i h = LoadDword0(rp, off);
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
      if constexpr (P::kOffset != 0) {
        // sum(y) from the sum of y + 128 (sign bit flipped), 32 bytes per block.
        const __m256i u = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[j].qs)),
            _mm256_set1_epi8(static_cast<char>(0x80)));
        const __m256i s4 = _mm256_sad_epu8(u, _mm256_setzero_si256());
        const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
        const int sum = static_cast<int>(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
        meta->corr[c][j] = -P::kOffset * sum;
      }
    }
  }
}

// One block of a 16-row tile as TransposedTile uses it (the unpacked copy of prefill calls).
struct PackedBlock {
  __m512i q[8];
  __m512 d, m;
};

// kPacked: the rows' blocks come unpacked from pk[b] (b counted from the start of the row),
// else they are loaded and transposed from rp.
template <typename P, int kRn, bool kPacked>
FUCINA_ALWAYS_INLINE void TransposedTile(const uint8_t* const* rp, const PackedBlock* pk,
                                         const uint8_t* const* xc, int64_t b0, int64_t n,
                                         const ActivationMeta& meta, int rows, float* y,
                                         size_t y_stride, bool accumulate, size_t ahead) {
  using W = typename P::W;
  using X = typename P::X;
  __m512 acc[kRn];
  for (int c = 0; c < kRn; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t b = b0 + j;
    __m512i q[8];
    __m512 d, m = _mm512_setzero_ps();
    if constexpr (kPacked) {
      for (int k = 0; k < 8; ++k) q[k] = _mm512_load_si512(&pk[b].q[k]);
      d = _mm512_load_ps(&pk[b].d);
      if constexpr (P::kHasMin) m = _mm512_load_ps(&pk[b].m);
    } else {
      PrefetchNextTile<sizeof(W)>(rp, ahead, b * sizeof(W), j);
      P::Prep(rp, b * sizeof(W), q, &d, &m);
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
  for (int c = 0; c < kRn; ++c) StoreTile(acc[c], rows, y + c * y_stride, accumulate);
}

template <typename P, bool kPacked>
void TransposedColumns(const uint8_t* wb, size_t w_stride, int64_t rows, const PackedBlock* pk,
                       int64_t nb, const uint8_t* xb, size_t x_stride, int64_t cols, float* y,
                       size_t y_stride) {
  ActivationMeta meta;
  const size_t ahead = kTRows * w_stride;
  if (!kPacked && rows > 0 && cols > 0) {
    const uint8_t* rp[kTRows];
    TileRows(wb, w_stride, 0, static_cast<int>(rows < kTRows ? rows : kTRows), rp);
    PrefetchTile(rp, static_cast<size_t>(nb < kTChunk ? nb : kTChunk) * sizeof(typename P::W));
  }
  for (int64_t c0 = 0; c0 < cols; c0 += kTCols) {
    const int nc = static_cast<int>(cols - c0 < kTCols ? cols - c0 : kTCols);
    const uint8_t* xc[kTCols];
    for (int c = 0; c < kTCols; ++c) xc[c] = xb + (c0 + (c < nc ? c : 0)) * x_stride;
    for (int64_t b0 = 0; b0 < nb; b0 += kTChunk) {
      const int64_t n = nb - b0 < kTChunk ? nb - b0 : kTChunk;
      PrepareMeta<P>(xc, nc, b0, n, &meta);
      for (int64_t r0 = 0; r0 < rows; r0 += kTRows) {
        const int nr = static_cast<int>(rows - r0 < kTRows ? rows - r0 : kTRows);
        const uint8_t* rp[kTRows];
        TileRows(wb, w_stride, r0, nr, rp);
        const PackedBlock* tile = kPacked ? pk + (r0 / kTRows) * nb : nullptr;
        float* yt = y + c0 * y_stride + r0;
        const bool acc = b0 > 0;
#define FUCINA_TILE_CASE(n_cols)                                                          \
  case n_cols:                                                                             \
    TransposedTile<P, n_cols, kPacked>(rp, tile, xc, b0, n, meta, nr, yt, y_stride, acc, \
                                       ahead);                                             \
    break;
        switch (nc) {
          FUCINA_TILE_CASE(8) FUCINA_TILE_CASE(7) FUCINA_TILE_CASE(6) FUCINA_TILE_CASE(5)
          FUCINA_TILE_CASE(4) FUCINA_TILE_CASE(3) FUCINA_TILE_CASE(2)
          default:
            TransposedTile<P, 1, kPacked>(rp, tile, xc, b0, n, meta, nr, yt, y_stride, acc, ahead);
        }
#undef FUCINA_TILE_CASE
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
    TransposedColumns<P, false>(wb, w_stride, rows, nullptr, nb, xb, x_stride, cols, y, y_stride);
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
  TransposedColumns<P, true>(wb, w_stride, rows, pk, nb, xb, x_stride, cols, y, y_stride);
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
void GemmQ5_0Q8_0(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q5_0Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}
void GemmQ5_1Q8_1(int64_t k, const void* w, size_t w_stride, int64_t rows, const void* x,
                  size_t x_stride, int64_t cols, float* y, size_t y_stride) {
  GemmLegacy<Q5_1Policy>(k, w, w_stride, rows, x, x_stride, cols, y, y_stride);
}

}  // namespace fucina::avx512
