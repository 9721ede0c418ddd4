// The kTiles16 weight layout (kernels/tile_layout.h): the packed bytes are where the format
// says, packing is lossless and works in place, and the kernels that read it compute exactly
// what the row-major tile kernels compute on the same rows (bit for bit: the same integer
// block sums, scales and summation order), which gemm_test checks against the scalar vec_dot.
#include "kernels/tile_layout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/type_traits.h"
#include "tests/kernels/simd_isas.h"

namespace fucina {
namespace {

constexpr GgmlType kPackedTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                     GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                     GgmlType::kQ5_K, GgmlType::kQ6_K};

// Rows with a heavy tail (every 23rd value x30): extreme codes, scales over a wide range.
std::vector<uint8_t> RandomMatrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> f(rows * cols);
  for (size_t i = 0; i < f.size(); ++i) f[i] = nd(rng) * (i % 23 == 5 ? 30.0f : 1.0f);
  const size_t row_bytes = RowBytes(type, cols);
  std::vector<uint8_t> out(rows * row_bytes);
  const CpuTypeTraits* t = GetCpuTraits(type, Isa::kScalar);
  for (int64_t r = 0; r < rows; ++r) t->from_float(&f[r * cols], &out[r * row_bytes], cols);
  return out;
}

std::vector<float> RandomActivations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

std::vector<uint8_t> Packed(const WeightView& w) {
  std::vector<uint8_t> out(PackedBytes(w));
  PackTiles16(w, 0, TileCount(w), out.data());
  return out;
}

// A block's parts as the format lays them out (kernels/tile_layout.h), written out here
// rather than taken from the implementation.
struct Field {
  int offset, width;  // in the GGUF block
};
struct Parts {
  int qs_offset, qs_bytes;
  uint8_t flip;
  std::vector<Field> meta;  // in packed order
};
std::vector<Field> Run(int offset, int width, int count) {
  std::vector<Field> out;
  for (int i = 0; i < count; ++i) out.push_back({offset + i * width, width});
  return out;
}
Parts PartsOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return {2, 32, 0x80, Run(0, 2, 1)};
    case GgmlType::kQ4_0: return {2, 16, 0, Run(0, 2, 1)};
    case GgmlType::kQ4_1: return {4, 16, 0, Run(0, 2, 2)};
    case GgmlType::kQ5_0: return {6, 16, 0, {{0, 2}, {2, 4}}};  // d, qh, qs
    case GgmlType::kQ5_1: return {8, 16, 0, {{0, 2}, {2, 2}, {4, 4}}};
    case GgmlType::kQ6_K: {  // ql and qh are one run of quants; 16 scale bytes, d
      std::vector<Field> meta = Run(192, 1, 16);
      meta.push_back({208, 2});
      return {0, 192, 0, meta};
    }
    default: {  // Q4_K: d, dmin, 12 scale bytes, qs; Q5_K: the same, qh and qs one run
      std::vector<Field> meta = Run(0, 2, 2), scales = Run(4, 1, 12);
      meta.insert(meta.end(), scales.begin(), scales.end());
      return {16, type == GgmlType::kQ5_K ? 160 : 128, 0, meta};
    }
  }
}

int64_t BlockOf(GgmlType type) { return TypeInfo(type).block_size; }

TEST(TileLayoutTest, BytesSitWhereTheFormatSays) {
  const int64_t rows = 32, nb = 3;  // 2 tiles, 3 blocks
  for (GgmlType type : kPackedTypes) {
    const int64_t cols = nb * BlockOf(type);
    const std::vector<uint8_t> w = RandomMatrix(type, rows, cols, 3);
    const WeightView view = WeightView::Dense(w.data(), type, rows, cols);
    const std::vector<uint8_t> p = Packed(view);
    const size_t block = RowBytes(type, BlockOf(type));
    const Parts parts = PartsOf(type);
    const int qs_bytes = parts.qs_bytes;
    const size_t meta_bytes = kTileRows * (block - qs_bytes);
    const size_t tile_bytes = kTileRows * view.row_stride;
    for (int64_t row = 0; row < rows; ++row) {
      const uint8_t* tile = p.data() + (row / kTileRows) * tile_bytes;
      const int r = static_cast<int>(row % kTileRows);
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* src = w.data() + row * view.row_stride + b * block;
        const uint8_t* meta = tile + nb * kTileRows * qs_bytes + b * meta_bytes;
        size_t at = 0;  // each field's 16 rows side by side
        for (const Field& f : parts.meta) {
          ASSERT_EQ(std::memcmp(meta + at + r * f.width, src + f.offset, f.width), 0)
              << TypeName(type) << " field at " << f.offset;
          at += 16 * f.width;
        }
        for (int i = 0; i < qs_bytes; ++i) {
          const uint8_t got = tile[b * kTileRows * qs_bytes + (i / 4) * 64 + 4 * r + i % 4];
          ASSERT_EQ(got, src[parts.qs_offset + i] ^ parts.flip)
              << TypeName(type) << " row " << row << " block " << b << " byte " << i;
        }
      }
    }
  }
}

TEST(TileLayoutTest, PackingInPlaceAndUnpackingAreLossless) {
  for (GgmlType type : kPackedTypes) {
    const std::vector<uint8_t> w = RandomMatrix(type, 48, 7 * BlockOf(type), 4);
    const WeightView view = WeightView::Dense(w.data(), type, 48, 7 * BlockOf(type));
    const std::vector<uint8_t> copy = Packed(view);
    std::vector<uint8_t> in_place = w;
    WeightView v2 = view;
    v2.data = in_place.data();
    PackTiles16(v2, 0, 3, in_place.data());
    EXPECT_EQ(in_place, copy) << TypeName(type);
    WeightView packed = view;
    packed.data = copy.data();
    packed.layout = WeightLayout::kTiles16;
    std::vector<uint8_t> back(w.size());
    UnpackTiles16(packed, back.data());
    EXPECT_EQ(back, w) << TypeName(type);
  }
}

// A ragged last tile (rows not a multiple of 16): packed into a padded copy whose missing rows
// repeat the last row, and unpacked to exactly the rows there were.
TEST(TileLayoutTest, RaggedLastTilePadsWithItsLastRow) {
  for (GgmlType type : kPackedTypes) {
    for (int64_t rows : {1, 21, 37}) {
      SCOPED_TRACE(std::string(TypeName(type)) + " rows=" + std::to_string(rows));
      const int64_t cols = 3 * BlockOf(type);
      const std::vector<uint8_t> w = RandomMatrix(type, rows, cols, 5);
      const WeightView view = WeightView::Dense(w.data(), type, rows, cols);
      ASSERT_EQ(TileCount(view), (rows + 15) / 16);
      ASSERT_EQ(PackedBytes(view), TileCount(view) * 16 * view.row_stride);
      const std::vector<uint8_t> p = Packed(view);
      // The padded matrix: the rows, then the last one repeated up to the tile's end.
      std::vector<uint8_t> padded(p.size());
      for (int64_t r = 0; r < TileCount(view) * 16; ++r) {
        std::memcpy(&padded[r * view.row_stride], &w[std::min(r, rows - 1) * view.row_stride],
                    view.row_stride);
      }
      EXPECT_EQ(p, Packed(WeightView::Dense(padded.data(), type, TileCount(view) * 16, cols)));
      WeightView packed = view;
      packed.data = p.data();
      packed.layout = WeightLayout::kTiles16;
      std::vector<uint8_t> back(w.size() + 7, 0xA5);  // no write past the rows
      UnpackTiles16(packed, back.data());
      EXPECT_EQ(std::vector<uint8_t>(back.begin(), back.begin() + w.size()), w);
      EXPECT_EQ(back.back(), 0xA5);
    }
  }
}

TEST(TileLayoutTest, RowsPackOneAtATimeAsTheWholeTileDoes) {
  // A KV cache writes a position at a time: each row into its lane, the other lanes kept.
  const int64_t rows = 16;
  for (GgmlType type : kPackedTypes) {
    SCOPED_TRACE(std::string(TypeName(type)));
    const int64_t cols = 2 * BlockOf(type);
    const std::vector<uint8_t> w = RandomMatrix(type, rows, cols, 9);
    const size_t row_bytes = RowBytes(type, cols);
    const std::vector<uint8_t> want = Packed(WeightView::Dense(w.data(), type, rows, cols));
    std::vector<uint8_t> tile(want.size(), 0x5A);
    for (int lane : {3, 0, 15, 7, 1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14}) {
      PackTileRow(type, cols, &w[lane * row_bytes], lane, tile.data());
    }
    EXPECT_EQ(tile, want);
    std::vector<uint8_t> row(row_bytes);
    for (int lane = 0; lane < 16; ++lane) {
      UnpackTileRow(type, cols, tile.data(), lane, row.data());
      EXPECT_EQ(0, std::memcmp(row.data(), &w[lane * row_bytes], row_bytes)) << lane;
    }
  }
}

TEST(TileLayoutTest, AppliesOnlyToTiledTypesAtAnIsaThatReadsThem) {
  // AVX2 and AVX-512 read Q8_0/Q4_0/Q4_1/Q4_K/Q5_K packed; Q5_0/Q5_1 have AVX2 packed kernels
  // (AVX-512 keeps its row-major ones), Q6_K an AVX-512 one (AVX2 keeps its row kernel).
  const bool reads = ActiveIsa() >= Isa::kAvx2;
  const std::vector<uint8_t> buf(64 * RowBytes(GgmlType::kQ6_K, 256));
  for (GgmlType type : kPackedTypes) {
    const bool avx2_only = type == GgmlType::kQ5_0 || type == GgmlType::kQ5_1;
    bool want = avx2_only ? ActiveIsa() == Isa::kAvx2 : reads;
    if (type == GgmlType::kQ6_K) want = ActiveIsa() == Isa::kAvx512;
    const int64_t cols = BlockOf(type) * 2;
    EXPECT_EQ(TileLayoutApplies(WeightView::Dense(buf.data(), type, 32, cols)), want)
        << TypeName(type);
    // A ragged last tile is padded in the packed copy.
    EXPECT_EQ(TileLayoutApplies(WeightView::Dense(buf.data(), type, 40, cols)), want)
        << TypeName(type);
  }
  EXPECT_FALSE(TileLayoutApplies(WeightView::Dense(buf.data(), GgmlType::kQ2_K, 32, 256)));
  EXPECT_FALSE(TileLayoutApplies(WeightView::Dense(buf.data(), GgmlType::kF16, 32, 64)));
  WeightView strided = WeightView::Dense(buf.data(), GgmlType::kQ8_0, 16, 64);
  strided.row_stride += 8;
  EXPECT_FALSE(TileLayoutApplies(strided));
  WeightView packed = WeightView::Dense(buf.data(), GgmlType::kQ8_0, 16, 64);
  packed.layout = WeightLayout::kTiles16;
  EXPECT_FALSE(TileLayoutApplies(packed));
}

// The packed kernel against the row-major tile kernel of the same ISA, every shape class:
// one tile, several and a ragged last one, odd block counts, k past the activation chunks
// (128 blocks, Q4_K 16), decode (1..8 activation rows) and prefill-shaped (more than 8) calls.
TEST(TileLayoutTest, PackedKernelsEqualRowKernelsBitForBit) {
  bool ran = false;
  for (Isa isa : SimdIsas()) {
    for (GgmlType type : kPackedTypes) {
      const CpuTypeTraits* t = GetCpuTraits(type, isa);
      if (t->gemm_tiles16 == nullptr) continue;
      ran = true;
      const CpuTypeTraits* xt = GetCpuTraits(t->vec_dot_type, Isa::kScalar);
      uint32_t seed = 10;
      for (int64_t rows : {16, 37, 48, 160}) {
        // Past two activation chunks (k-quants: 16 super-blocks, else 128 blocks).
        const int64_t most = BlockOf(type) == 256 ? 35 : 131;
        for (int64_t nb : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{18}, most}) {
          for (int64_t m : {1, 3, 8, 9, 20, 33}) {
            const int64_t k = nb * BlockOf(type);
            const std::vector<uint8_t> w = RandomMatrix(type, rows, k, seed++);
            const WeightView view = WeightView::Dense(w.data(), type, rows, k);
            const std::vector<uint8_t> p = Packed(view);
            const std::vector<float> xf = RandomActivations(m * k, seed++);
            const size_t x_row = RowBytes(t->vec_dot_type, k);
            std::vector<uint8_t> x(m * x_row);
            for (int64_t i = 0; i < m; ++i) xt->from_float(&xf[i * k], &x[i * x_row], k);
            std::vector<float> want(m * rows, NAN), got(m * rows, NAN);
            t->gemm(k, w.data(), view.row_stride, rows, x.data(), x_row, m, want.data(), rows);
            t->gemm_tiles16(k, p.data(), view.row_stride, rows, x.data(), x_row, m, got.data(),
                            rows);
            ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
                << TypeName(type) << " " << IsaName(isa) << " rows=" << rows << " nb=" << nb
                << " m=" << m;
          }
        }
      }
    }
  }
  if (!ran) GTEST_SKIP() << "no kernel reads the packed layout on this CPU";
}

// The largest codes a k-quant tile kernel sums: every quant at its top (Q4_K 15, Q5_K 31),
// every scale and min 63, against activations all at 127, so each sub-block's integer sums
// are as large as they get (Q5_K's 16 products of 31 * 127 per int16 lane would overflow one
// run of vpmaddubsw adds). The packed kernel must still equal the row kernel, bit for bit.
TEST(TileLayoutTest, KQuantTilesAtTheirLargestCodesEqualRowKernels) {
  bool ran = false;
  for (Isa isa : SimdIsas()) {
    for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ5_K}) {
      const CpuTypeTraits* t = GetCpuTraits(type, isa);
      if (t->gemm_tiles16 == nullptr) continue;
      ran = true;
      const int64_t rows = 16, k = 2 * 256;
      const size_t block = RowBytes(type, 256);
      std::vector<uint8_t> w(rows * RowBytes(type, k), 0xFF);
      for (size_t at = 0; at < w.size(); at += block) {
        const uint16_t one = 0x3C00;  // d and dmin: 1.0 in f16
        std::memcpy(&w[at], &one, 2);
        std::memcpy(&w[at + 2], &one, 2);
      }
      const WeightView view = WeightView::Dense(w.data(), type, rows, k);
      const std::vector<uint8_t> p = Packed(view);
      const std::vector<float> xf(k, 1.0f);  // quantizes to 127 everywhere
      std::vector<uint8_t> x(RowBytes(t->vec_dot_type, k));
      GetCpuTraits(t->vec_dot_type, Isa::kScalar)->from_float(xf.data(), x.data(), k);
      std::vector<float> want(rows, NAN), got(rows, NAN);
      t->gemm(k, w.data(), view.row_stride, rows, x.data(), x.size(), 1, want.data(), rows);
      t->gemm_tiles16(k, p.data(), view.row_stride, rows, x.data(), x.size(), 1, got.data(),
                      rows);
      ASSERT_TRUE(std::isfinite(want[0])) << TypeName(type);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
          << TypeName(type) << " " << IsaName(isa) << ": " << want[0]
          << " against " << got[0];
    }
  }
  if (!ran) GTEST_SKIP() << "no k-quant kernel reads the packed layout on this CPU";
}

// MatMul on a packed view: the engine's path (work items, threads) equals the row-major one
// bit for bit, and the path without a packed kernel (the scalar reference) reads the packed
// view through a row-major copy.
TEST(TileLayoutTest, MatMulOnPackedViewsEqualsRowMajor) {
  for (GgmlType type : kPackedTypes) {
    const int64_t rows = 331, cols = 768;  // a ragged last tile
    const std::vector<uint8_t> w = RandomMatrix(type, rows, cols, 21);
    const WeightView view = WeightView::Dense(w.data(), type, rows, cols);
    const std::vector<uint8_t> p = Packed(view);
    WeightView packed = view;
    packed.data = p.data();
    packed.layout = WeightLayout::kTiles16;
    for (int64_t m : {1, 4, 37}) {
      const std::vector<float> x = RandomActivations(m * cols, 22);
      std::vector<float> want(m * rows), got(m * rows);
      MatMulRef(view, x.data(), m, want.data());
      MatMulRef(packed, x.data(), m, got.data());
      ASSERT_EQ(want, got) << TypeName(type) << " reference m=" << m;
      for (Isa isa : SimdIsas()) {
        for (int threads : {1, 3}) {
          ThreadPool pool(threads);
          MatMulIsa(view, x.data(), m, want.data(), pool, isa);
          MatMulIsa(packed, x.data(), m, got.data(), pool, isa);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
              << TypeName(type) << " " << IsaName(isa) << " threads=" << threads << " m=" << m;
        }
      }
    }
  }
}

}  // namespace
}  // namespace fucina
