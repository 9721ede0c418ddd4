#include "kernels/attention.h"

#include "kernels/type_traits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"
#include "kernels/fp16.h"
#include "kernels/ggml_type.h"
#include "kernels/quant/blocks.h"
#include "kernels/tile_layout.h"
#include "kernels/type_traits.h"

namespace fucina {
namespace {

// Keys per tile of the streaming softmax: a tile of K and V rows of one kv head is converted
// to f32 once (kTile * ld floats each, in L1) and used by every query row of a block.
constexpr int kTile = 32;
// Query rows per block: all heads of a GQA group that share the kv head, times as many
// queries (prefill) as fit; rows past 4 only amortize the tile conversion further.
constexpr int kMaxRows = 8;
// Tiles a q8_0 K cache is scored in per call: a score depends on its own key only, so scoring
// ahead changes no bit, and the tile kernel's setup (the quantized query's block sums, its
// meta, the row tiles' stores) is paid once per 1,024 keys instead of per 32. q8_0 decode
// attention after 4,000 positions (`fucina bench kernels`, Zen 4, 1 thread): 8 tiles against
// 1 +3-4%, 32 against 8 +2-4% more (the values of a span are added in one call too, where no
// running max rises). The direct f16 scores stay a tile at a time: 256 keys ahead of their
// values they lost ~5% (the K and V streams then run in long alternating bursts).
constexpr int kScoreTiles = 32;

const uint8_t* HeadRow(const KvLayout& l, const void* cache, int64_t pos, int kvh) {
  return static_cast<const uint8_t*>(cache) + l.RowOffset(pos, kvh);
}

// First position query position p sees.
int64_t FirstKey(const AttentionArgs& args, int64_t p) {
  return args.window > 0 ? std::max<int64_t>(0, p - args.window + 1) : 0;
}

// Scalar tile kernels used when the level is kScalar; same contracts as ops_isa.h.
inline float ScalarValue(const float* row, int d) { return row[d]; }
inline float ScalarValue(const f16_t* row, int d) { return Fp16ToFp32(row[d]); }
inline float ScalarValue(const BlockQ8_0* row, int d) {
  const BlockQ8_0& b = row[d / kQK8_0];
  return Fp16ToFp32(b.d) * static_cast<float>(b.qs[d % kQK8_0]);
}

template <typename T>
void ScalarLoadRows(const void* rows, int64_t stride_bytes, int n_rows, int head_dim, int ld,
                    float* dst) {
  for (int t = 0; t < n_rows; ++t) {
    const T* row =
        reinterpret_cast<const T*>(static_cast<const uint8_t*>(rows) + t * stride_bytes);
    for (int d = 0; d < head_dim; ++d) dst[t * ld + d] = ScalarValue(row, d);
  }
}

void ScalarTileScores(const float* q, int n_rows, int ld, const float* k, int n_keys, float* s,
                      int s_ld) {
  for (int r = 0; r < n_rows; ++r) {
    for (int t = 0; t < n_keys; ++t) {
      float sum = 0.0f;
      for (int d = 0; d < ld; ++d) sum += q[r * ld + d] * k[t * ld + d];
      s[r * s_ld + t] = sum;
    }
  }
}

void ScalarTileAccum(const float* p, int p_ld, int n_rows, const float* v, int n_keys, int ld,
                     float* acc) {
  for (int r = 0; r < n_rows; ++r) {
    for (int t = 0; t < n_keys; ++t) {
      for (int d = 0; d < ld; ++d) acc[r * ld + d] += p[r * p_ld + t] * v[t * ld + d];
    }
  }
}

// The scalar level's MaxF32 and ExpF32 (ops_isa.h): 8 interleaved partial results combined
// in a fixed order, the span order every level sums in, so a row's sum depends on n alone
// and never on the rows batched with it. (One running value was a chain of n dependent
// operations per query row and tile: a fifth of decode time after 4,000 positions. These
// loops compiled for the generic target ran the max in scalar `maxss`; the SIMD levels'
// own, with the sum taken as the exp is stored, made q8_0 decode attention after 4,000
// positions 19.8 -> 21.0 GB/s on a Zen 4 core.)
float ScalarMax(const float* s, int64_t n) {
  float m[8];
  std::fill(m, m + 8, -std::numeric_limits<float>::infinity());
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    for (int l = 0; l < 8; ++l) m[l] = std::max(m[l], s[t + l]);
  }
  for (int l = 0; t < n; ++t, ++l) m[l] = std::max(m[l], s[t]);
  return std::max(std::max(std::max(m[0], m[4]), std::max(m[1], m[5])),
                  std::max(std::max(m[2], m[6]), std::max(m[3], m[7])));
}

float ScalarExp(const float* x, float shift, float* y, int64_t n) {
  float a[8] = {};
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - shift);
    a[i % 8] += y[i];
  }
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

using LoadRowsFn = void (*)(const void* rows, int64_t stride_bytes, int n_rows, int head_dim,
                            int ld, float* dst);

using RowScoresFn = void (*)(const float* q, int n_rows, int ld, const void* rows,
                            int64_t stride_bytes, int head_dim, int n_keys, float* s, int s_ld);
using RowAccumFn = void (*)(const float* p, int p_ld, int n_rows, const void* rows,
                           int64_t stride_bytes, int head_dim, int n_keys, int ld, float* acc);

struct TileKernels {
  LoadRowsFn load;
  void (*scores)(const float* q, int n_rows, int ld, const float* k, int n_keys, float* s,
                 int s_ld);
  void (*accum)(const float* p, int p_ld, int n_rows, const float* v, int n_keys, int ld,
                float* acc);
  // y = exp(x - shift), returning the sum of y; the largest of x (ops_isa.h's ExpF32, MaxF32).
  float (*exp)(const float* x, float shift, float* y, int64_t n);
  float (*max)(const float* x, int64_t n);
  // The same scores and sums read from the cache rows without the f32 tile buffer, bit for bit
  // (ops_isa.h); null where an ISA has none. q8_0 V on a SIMD level has only `row_accum`
  // (its weights carry the block scales: no staged form), used for every block of rows.
  RowScoresFn row_scores = nullptr;
  RowAccumFn row_accum = nullptr;
  // q8_0 K: scores are integer dots against the query quantized to q8_0 (as llama.cpp does
  // for a q8_0 K cache): `quantize` makes the query rows, `gemm` (the matmul tile kernel, where
  // the level has one) or `vec_dot` scores a tile of keys.
  FromFloatFn quantize = nullptr;
  GemmFn gemm = nullptr;
  VecDotFn vec_dot = nullptr;
  GemmFn gemm_tiles16 = nullptr;  // the same over a tiles16 K cache, where the level has it.
};

// Query rows up to which a prefill block reads K and V straight from the cache: each row
// converts the keys again, which costs less than staging them for one or two rows and more for
// a prefill block. Decode blocks (one query per head: a GQA group's heads) read them straight
// at any group size: the span comes from memory once per token, and the direct kernels
// prefetch along it where the staging loads do not (decode after 4,000 positions on a Zen 5
// core, groups of 3, 4 and 8 heads: +26-44%, +37-80%, +26-33% against staging).
constexpr int kDirectRows = 2;

// The kernels of one SIMD level (its namespace in ops_isa.h): both levels have every kernel.
#define FUCINA_SIMD_KERNELS(ns)                                                               \
  [&] {                                                                                      \
    TileKernels k{nullptr, ns::AttnTileScores, ns::AttnTileAccum, ns::ExpF32, ns::MaxF32};    \
    if (type == GgmlType::kF16) {                                                            \
      k.load = ns::AttnLoadRowsF16;                                                          \
      k.row_scores = ns::AttnRowScoresF16;                                                   \
      k.row_accum = ns::AttnRowAccumF16;                                                     \
    } else if (type == GgmlType::kQ8_0) {                                                    \
      k.row_accum = ns::AttnRowAccumQ8_0;                                                    \
    } else {                                                                                 \
      k.load = ns::AttnLoadRowsF32;                                                          \
      k.row_scores = ns::AttnRowScoresF32;                                                   \
      k.row_accum = ns::AttnRowAccumF32;                                                     \
    }                                                                                        \
    return k;                                                                                \
  }()

TileKernels SelectFloatKernels(Isa isa, GgmlType type) {
  switch (isa) {
    case Isa::kAvx512:
      return FUCINA_SIMD_KERNELS(avx512);
    case Isa::kAvx2:
      return FUCINA_SIMD_KERNELS(avx2);
    case Isa::kScalar:
      break;
  }
  const LoadRowsFn load = type == GgmlType::kF16    ? ScalarLoadRows<f16_t>
                          : type == GgmlType::kQ8_0 ? ScalarLoadRows<BlockQ8_0>
                                                    : ScalarLoadRows<float>;
  return {load, ScalarTileScores, ScalarTileAccum, ScalarExp, ScalarMax};
}
#undef FUCINA_SIMD_KERNELS

TileKernels SelectKernels(Isa isa, GgmlType type) {
  TileKernels k = SelectFloatKernels(isa, type);
  if (type == GgmlType::kQ8_0) {
    const CpuTypeTraits* t = GetCpuTraits(GgmlType::kQ8_0, isa);
    k.quantize = t->from_float;
    k.gemm = t->gemm;
    k.vec_dot = t->vec_dot;
    k.gemm_tiles16 = t->gemm_tiles16;
  }
  return k;
}

// Scratch buffers only grow.
template <typename T>
void Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// scores[r * s_ld + t] = dot(key row t, query row r) over head_dim for t < n_keys, the query
// rows quantized (xq, x_row bytes apart): the integer block sums times both scales. Tiled keys
// (keys at a tile's start) are scored in whole tiles: lanes past n_keys hold other positions
// or stale rows, land in s[r * s_ld + t] for t < s_ld (s_ld >= n_keys rounded up to 16) and
// are never read. `unpacked`: scratch for levels without the tile kernel.
void ScoresQ8_0(const TileKernels& kern, const uint8_t* keys, int64_t stride, bool tiles16,
                int head_dim, int n_keys, const uint8_t* xq, size_t x_row, int rows, float* s,
                int s_ld, std::vector<uint8_t>& unpacked) {
  if (tiles16) {
    if (kern.gemm_tiles16 != nullptr) {
      const int whole = (n_keys + kTileRows - 1) / kTileRows * kTileRows;
      kern.gemm_tiles16(head_dim, keys, stride, whole, xq, x_row, rows, s, s_ld);
      return;
    }
    Grow(unpacked, n_keys * stride);
    for (int t = 0; t < n_keys; ++t) {
      UnpackTileRow(GgmlType::kQ8_0, head_dim, keys + t / kTileRows * kTileRows * stride,
                    t % kTileRows, unpacked.data() + t * stride);
    }
    keys = unpacked.data();
  }
  if (kern.gemm != nullptr) {
    kern.gemm(head_dim, keys, stride, n_keys, xq, x_row, rows, s, s_ld);
    return;
  }
  for (int r = 0; r < rows; ++r) {
    for (int t = 0; t < n_keys; ++t) {
      s[r * s_ld + t] = kern.vec_dot(head_dim, keys + t * stride, xq + r * x_row);
    }
  }
}

// Per-thread buffers of AttentionHeadsForIsa; they only grow.
struct AttnScratch {
  std::vector<float> kbuf, vbuf, qs, acc, s, run_max, run_sum;
  std::vector<int64_t> row_keys, row_first;
  std::vector<uint8_t> xq;  // q8_0 K: the quantized query rows
  std::vector<uint8_t> unpacked;  // tiles16 K at levels without the tile kernel
};

}  // namespace

absl::Status ValidateKvLayout(const KvLayout& layout) {
  if (layout.type != GgmlType::kF32 && layout.type != GgmlType::kF16 &&
      layout.type != GgmlType::kQ8_0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache type must be f32, f16 or q8_0, got ",
                     std::string(TypeName(layout.type))));
  }
  if (layout.capacity <= 0 || layout.num_heads_kv <= 0 || layout.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache sizes must be positive: capacity ", layout.capacity, ", kv heads ",
        layout.num_heads_kv, ", head_dim ", layout.head_dim));
  }
  if (layout.type == GgmlType::kQ8_0 && layout.head_dim % kQK8_0 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("q8_0 KV cache needs head_dim % 32 == 0, got ", layout.head_dim));
  }
  if (layout.tiles16 && (layout.type != GgmlType::kQ8_0 || layout.capacity % kTileRows != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a tiled KV cache must be q8_0 with a capacity that is a multiple of 16, got ",
        std::string(TypeName(layout.type)), " with capacity ", layout.capacity));
  }
  return absl::OkStatus();
}

bool KeyTilesApply(GgmlType type) {
  return type == GgmlType::kQ8_0 && GetCpuTraits(type)->gemm_tiles16 != nullptr;
}

void StoreKvRows(const KvLayout& layout, void* cache, int64_t pos, int64_t n, const float* src) {
  // The dtype table's converters: plain copy, f16 rounding or ggml's q8_0 rule (bit-exact
  // with the scalar references on every ISA).
  const FromFloatFn convert = GetCpuTraits(layout.type)->from_float;
  const int hd = layout.head_dim;
  thread_local std::vector<uint8_t> row;  // tiles16: the row in GGUF layout first
  row.resize(static_cast<size_t>(layout.HeadBytes()));
  auto* const base = static_cast<uint8_t*>(cache);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t p = pos + r;
    for (int h = 0; h < layout.num_heads_kv; ++h) {
      const float* x = src + (r * layout.num_heads_kv + h) * hd;
      if (layout.tiles16) {
        convert(x, row.data(), hd);
        PackTileRow(layout.type, hd, row.data(), static_cast<int>(p % kTileRows),
                    base + layout.RowOffset(p - p % kTileRows, h));
      } else {
        convert(x, base + layout.RowOffset(p, h), hd);
      }
    }
  }
}

void LoadKvHead(const KvLayout& layout, const void* cache, int64_t pos, int kvh, float* out) {
  const uint8_t* row;
  std::vector<uint8_t> unpacked;  // tiles16: the row in GGUF layout
  if (layout.tiles16) {
    unpacked.resize(static_cast<size_t>(layout.HeadBytes()));
    UnpackTileRow(layout.type, layout.head_dim, HeadRow(layout, cache, pos - pos % kTileRows, kvh),
                  static_cast<int>(pos % kTileRows), unpacked.data());
    row = unpacked.data();
  } else {
    row = HeadRow(layout, cache, pos, kvh);
  }
  for (int d = 0; d < layout.head_dim; ++d) {
    switch (layout.type) {
      case GgmlType::kF16:
        out[d] = ScalarValue(reinterpret_cast<const f16_t*>(row), d);
        break;
      case GgmlType::kQ8_0:
        out[d] = ScalarValue(reinterpret_cast<const BlockQ8_0*>(row), d);
        break;
      default:
        out[d] = ScalarValue(reinterpret_cast<const float*>(row), d);
        break;
    }
  }
}

void AttentionHeads(const AttentionArgs& args, int head_begin, int head_end, float* out) {
  AttentionHeadsForIsa(ActiveIsa(), args, head_begin, head_end, out);
}

void AttentionHeadsForIsa(Isa isa, const AttentionArgs& args, int head_begin, int head_end,
                          float* out) {
  const KvLayout& l = args.layout;
  const int hd = l.head_dim;
  const int ld = (hd + 15) / 16 * 16;  // buffer row length: whole SIMD vectors, zero padded.
  const int group = args.num_heads / l.num_heads_kv;
  const int64_t stride = l.HeadBytes();  // between positions of one kv head.
  const TileKernels kern = SelectKernels(isa, l.type);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int max_rows = std::max(kMaxRows, group);

  // Scratch reused across calls on each thread (decode makes one call per kv head and layer,
  // too short to pay for fresh allocations). Per query row r = qi * nh + g of a block: scaled
  // query, accumulator, scores, running max / sum, and the keys [first, end) the row may see.
  // K rows past a partial tile may hold stale values: only their own score lanes see them.
  const int64_t tile_rows = kTile;
  thread_local AttnScratch scratch;
  AttnScratch& sc = scratch;
  Grow(sc.kbuf, tile_rows * ld);
  Grow(sc.vbuf, tile_rows * ld);
  Grow(sc.qs, static_cast<int64_t>(max_rows) * ld);
  Grow(sc.acc, static_cast<int64_t>(max_rows) * ld);
  const int s_ld = kTile * kScoreTiles;  // scores a row: the tiles scored ahead
  Grow(sc.s, static_cast<int64_t>(max_rows) * s_ld);
  Grow(sc.run_max, max_rows);
  Grow(sc.run_sum, max_rows);
  Grow(sc.row_keys, max_rows);
  Grow(sc.row_first, max_rows);
  const size_t x_row = kern.quantize != nullptr ? static_cast<size_t>(l.HeadBytes()) : 0;
  Grow(sc.xq, static_cast<int64_t>(max_rows * x_row));
  float* const kbuf = sc.kbuf.data();
  float* const vbuf = sc.vbuf.data();
  float* const qs = sc.qs.data();
  float* const acc = sc.acc.data();
  float* const s = sc.s.data();
  float* const run_max = sc.run_max.data();
  float* const run_sum = sc.run_sum.data();
  int64_t* const row_keys = sc.row_keys.data();
  int64_t* const row_first = sc.row_first.data();
  // Padding columns [hd, ld) of q, K and V must be zero (the loads write only [0, hd)).
  for (int64_t t = 0; t < tile_rows; ++t) {
    std::fill(kbuf + t * ld + hd, kbuf + (t + 1) * ld, 0.0f);
    std::fill(vbuf + t * ld + hd, vbuf + (t + 1) * ld, 0.0f);
  }

  int h = head_begin;
  while (h < head_end) {
    const int kvh = h / group;
    const int h_end = std::min(head_end, (kvh + 1) * group);  // heads sharing kv head kvh.
    const int nh = h_end - h;
    const int64_t q_block = std::max(1, kMaxRows / nh);
    // Row of position j: base + (j % capacity) * stride. Tiles start at multiples of kTile
    // (whatever the window), so a key's tile and the order a row adds its tiles in depend on
    // positions only: a query gives the same bits whichever queries share its block. A ring's
    // capacity is a multiple of kTile (KvCache rounds it), so no tile wraps.
    const uint8_t* k_base = HeadRow(l, args.k_cache, 0, kvh);
    const uint8_t* v_base = HeadRow(l, args.v_cache, 0, kvh);
    auto wrap = [&](int64_t j) { return j % l.capacity; };
    for (int64_t i0 = 0; i0 < args.n_q; i0 += q_block) {
      const int64_t nqb = std::min(q_block, args.n_q - i0);
      const int rows = static_cast<int>(nqb) * nh;
      for (int r = 0; r < rows; ++r) {
        const int64_t i = i0 + r / nh;
        const float* qrow = args.q + (i * args.num_heads + h + r % nh) * hd;
        for (int d = 0; d < hd; ++d) qs[r * ld + d] = qrow[d] * args.scale;
        std::fill(qs + r * ld + hd, qs + (r + 1) * ld, 0.0f);
        if (kern.quantize != nullptr) kern.quantize(qs + r * ld, sc.xq.data() + r * x_row, hd);
        std::fill(acc + r * ld, acc + (r + 1) * ld, 0.0f);
        run_max[r] = kNegInf;
        run_sum[r] = 0.0f;
        row_keys[r] = args.pos0 + i + 1;
        row_first[r] = FirstKey(args, args.pos0 + i);
      }
      const int64_t n_keys = args.pos0 + i0 + nqb;  // what the block's last query sees.
      const int64_t first_tile = FirstKey(args, args.pos0 + i0) / kTile * kTile;
      const bool straight = rows <= kDirectRows || nqb == 1;
      const bool direct = kern.row_scores != nullptr && straight;
      const bool direct_v = kern.row_accum != nullptr && (straight || kern.load == nullptr);
      // Scores of keys [scored, scored_end) are in s, key j at column j - scored.
      int64_t scored = first_tile, scored_end = first_tile;
      // Direct V: the keys [pending, end) have their weights in s and are not yet added. One
      // call adds all the tiles of a scored span (q8_0 K: up to kScoreTiles) where nothing
      // is rescaled in between: the kernel's setup is paid once per span, and its sums run
      // key by key either way (the same bits). Flushed before a rescale, which must see every
      // earlier key, and before s is scored again.
      int64_t pending = first_tile;
      const auto add_pending = [&](int64_t end) {
        if (end > pending) {
          kern.row_accum(s + (pending - scored), s_ld, rows, v_base + wrap(pending) * stride,
                         stride, hd, static_cast<int>(end - pending), ld, acc);
        }
        pending = end;
      };
      for (int64_t j0 = first_tile; j0 < n_keys; j0 += kTile) {
        const int nt = static_cast<int>(std::min<int64_t>(kTile, n_keys - j0));
        if (direct_v && (kern.quantize == nullptr || j0 >= scored_end)) add_pending(j0);
        if (kern.quantize != nullptr) {
          if (j0 >= scored_end) {
            // Up to kScoreTiles tiles, never across the ring's end.
            const int n = static_cast<int>(std::min<int64_t>(
                {s_ld, n_keys - j0, l.capacity - wrap(j0)}));
            ScoresQ8_0(kern, k_base + wrap(j0) * stride, stride, args.k_tiles16, hd, n,
                       sc.xq.data(), x_row, rows, s, s_ld, sc.unpacked);
            scored = j0;
            scored_end = j0 + n;
          }
        } else if (direct) {
          kern.row_scores(qs, rows, ld, k_base + wrap(j0) * stride, stride, hd, nt, s, s_ld);
          scored = j0;
        } else {
          kern.load(k_base + wrap(j0) * stride, stride, nt, hd, ld, kbuf);
          kern.scores(qs, rows, ld, kbuf, nt, s, s_ld);
          scored = j0;
        }
        float* const st = s + (j0 - scored);  // this tile's scores, row r at st + r * s_ld
        for (int r = 0; r < rows; ++r) {
          float* sr = st + r * s_ld;
          // Keys outside the row's [first, end) get weight exactly 0, so a row's result is
          // the same whichever queries share its block; a tile it cannot see leaves it
          // untouched.
          const int lo = static_cast<int>(std::clamp<int64_t>(row_first[r] - j0, 0, nt));
          const int valid = static_cast<int>(std::clamp<int64_t>(row_keys[r] - j0, 0, nt));
          if (lo >= valid) {
            std::fill(sr, sr + nt, 0.0f);
            continue;
          }
          for (int t = 0; t < lo; ++t) sr[t] = kNegInf;
          const float tile_max = kern.max(sr + lo, valid - lo);
          if (tile_max > run_max[r]) {
            // Rescale what was accumulated under the old maximum (nothing on the first tile).
            if (run_sum[r] != 0.0f) {
              if (direct_v) add_pending(j0);
              const float c = std::exp(run_max[r] - tile_max);
              run_sum[r] *= c;
              for (int d = 0; d < ld; ++d) acc[r * ld + d] *= c;
            }
            run_max[r] = tile_max;
          }
          run_sum[r] += kern.exp(sr + lo, run_max[r], sr + lo, valid - lo);
          std::fill(sr, sr + lo, 0.0f);
          for (int t = valid; t < nt; ++t) sr[t] = 0.0f;
        }
        if (!direct_v) {
          kern.load(v_base + wrap(j0) * stride, stride, nt, hd, ld, vbuf);
          kern.accum(st, s_ld, rows, vbuf, nt, ld, acc);
        }
      }
      if (direct_v) add_pending(n_keys);
      for (int r = 0; r < rows; ++r) {
        const int64_t i = i0 + r / nh;
        float* o = out + (i * args.num_heads + h + r % nh) * hd;
        const float inv = 1.0f / run_sum[r];
        for (int d = 0; d < hd; ++d) o[d] = acc[r * ld + d] * inv;
      }
    }
    h = h_end;
  }
}

void Attention(const AttentionArgs& args, float* out) {
  AttentionHeads(args, 0, args.num_heads, out);
}

void AttentionRef(const AttentionArgs& args, float* out) {
  const KvLayout& l = args.layout;
  const int hd = l.head_dim;
  const int group = args.num_heads / l.num_heads_kv;
  std::vector<float> k(hd), v(hd), qf(hd);
  std::vector<double> scores, acc(hd);
  KvLayout k_layout = l;
  k_layout.tiles16 = args.k_tiles16;
  // A q8_0 K cache is scored against the scaled query quantized to q8_0 (its dequantized
  // values here), as the kernels and llama.cpp do; scale is then already applied.
  const bool quantized_q = l.type == GgmlType::kQ8_0;
  const CpuTypeTraits* q8_traits = GetCpuTraits(GgmlType::kQ8_0, Isa::kScalar);
  std::vector<uint8_t> q8(quantized_q ? RowBytes(GgmlType::kQ8_0, hd) : 0);
  for (int64_t i = 0; i < args.n_q; ++i) {
    const int64_t n_keys = args.pos0 + i + 1;
    const int64_t first = FirstKey(args, args.pos0 + i);
    scores.assign(static_cast<size_t>(n_keys), 0.0);
    for (int h = 0; h < args.num_heads; ++h) {
      const int kvh = h / group;
      const float* q = args.q + (i * args.num_heads + h) * hd;
      double q_scale = args.scale;
      if (quantized_q) {
        for (int d = 0; d < hd; ++d) qf[d] = q[d] * args.scale;
        q8_traits->from_float(qf.data(), q8.data(), hd);
        q8_traits->to_float(q8.data(), qf.data(), hd);
        q = qf.data();
        q_scale = 1.0;
      }
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = first; j < n_keys; ++j) {
        LoadKvHead(k_layout, args.k_cache, j, kvh, k.data());
        double dot = 0.0;
        for (int d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * k[d];
        scores[j] = dot * q_scale;
        max = std::max(max, scores[j]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = first; j < n_keys; ++j) {
        const double w = std::exp(scores[j] - max);
        sum += w;
        LoadKvHead(l, args.v_cache, j, kvh, v.data());
        for (int d = 0; d < hd; ++d) acc[d] += w * v[d];
      }
      float* o = out + (i * args.num_heads + h) * hd;
      for (int d = 0; d < hd; ++d) o[d] = static_cast<float>(acc[d] / sum);
    }
  }
}

}  // namespace fucina
