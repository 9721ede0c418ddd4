#include "kernels/tile_layout.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "kernels/type_traits.h"

namespace fucina {
namespace {

// Where a block's parts are, for the types with a kTiles16 layout: its quants, and the rest
// (its meta) as runs of `count` fields of `width` bytes each.
struct FieldRun {
  int offset, width, count;
};
struct BlockShape {
  int64_t elements;  // per block: 32, or a k-quant super-block's 256
  int block_bytes;   // the GGUF block
  int qs_offset;     // its quants, quant_bytes of them
  int quant_bytes;
  uint8_t flip;      // xor applied to every quant byte when packed (Q8_0: int8 -> q + 128)
  FieldRun runs[2];  // the meta in packed order; unused runs have count 0
};

bool ShapeOf(GgmlType type, BlockShape* s) {
  switch (type) {
    case GgmlType::kQ8_0: *s = {32, 34, 2, 32, 0x80, {{0, 2, 1}}}; return true;
    case GgmlType::kQ4_0: *s = {32, 18, 2, 16, 0x00, {{0, 2, 1}}}; return true;
    case GgmlType::kQ4_1: *s = {32, 20, 4, 16, 0x00, {{0, 2, 2}}}; return true;
    // d (and m); qh, one 4-byte field; qs.
    case GgmlType::kQ5_0: *s = {32, 22, 6, 16, 0x00, {{0, 2, 1}, {2, 4, 1}}}; return true;
    case GgmlType::kQ5_1: *s = {32, 24, 8, 16, 0x00, {{0, 2, 2}, {4, 4, 1}}}; return true;
    // d, dmin; 12 packed scale bytes; qs (Q5_K: qh and qs as one run of quants).
    case GgmlType::kQ4_K: *s = {256, 144, 16, 128, 0x00, {{0, 2, 2}, {4, 1, 12}}}; return true;
    case GgmlType::kQ5_K: *s = {256, 176, 16, 160, 0x00, {{0, 2, 2}, {4, 1, 12}}}; return true;
    // ql and qh as one run of quants; 16 scale bytes, d.
    case GgmlType::kQ6_K: *s = {256, 210, 0, 192, 0x00, {{192, 1, 16}, {208, 2, 1}}}; return true;
    default: return false;
  }
}

// Row r of one tile: `row` (GGUF layout, nb blocks) <-> `tile` (packed). Quants move a dword
// at a time: dword v of row r's block b is at b * 16 * QB + 64 v + 4 r. The other bytes of a
// block are its meta, 16 * (block_bytes - QB) bytes per tile block after all the quants: each
// field of width w, in the runs' order, for rows 0..15 (row r at w * r).
template <bool kPack>
void ConvertRow(const BlockShape& s, int64_t nb, uint8_t* row, uint8_t* tile, int r) {
  const uint32_t flip = 0x01010101u * s.flip;
  const size_t meta_bytes = kTileRows * (s.block_bytes - s.quant_bytes);
  uint8_t* const meta = tile + static_cast<size_t>(nb) * kTileRows * s.quant_bytes;
  const auto move = [](uint8_t* from, uint8_t* to, size_t n) { std::memcpy(to, from, n); };
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* block = row + b * s.block_bytes;
    uint8_t* quants = tile + static_cast<size_t>(b) * kTileRows * s.quant_bytes + 4 * r;
    uint8_t* packed = meta + b * meta_bytes;
    for (const FieldRun& run : s.runs) {
      for (int f = 0; f < run.count; ++f, packed += kTileRows * run.width) {
        uint8_t* in_block = block + run.offset + f * run.width;
        uint8_t* in_tile = packed + r * run.width;
        kPack ? move(in_block, in_tile, run.width) : move(in_tile, in_block, run.width);
      }
    }
    for (int v = 0; v < s.quant_bytes / 4; ++v) {
      uint8_t* from = kPack ? block + s.qs_offset + 4 * v : quants + 64 * v;
      uint8_t* to = kPack ? quants + 64 * v : block + s.qs_offset + 4 * v;
      uint32_t dword;
      std::memcpy(&dword, from, 4);
      dword ^= flip;
      std::memcpy(to, &dword, 4);
    }
  }
}

// One tile: 16 rows `rows_bytes` (row-major, RowBytes apart) <-> `tile`.
template <bool kPack>
void Convert(const BlockShape& s, int64_t nb, uint8_t* rows_bytes, uint8_t* tile) {
  const size_t row_bytes = static_cast<size_t>(nb) * s.block_bytes;
  for (int r = 0; r < kTileRows; ++r) ConvertRow<kPack>(s, nb, rows_bytes + r * row_bytes, tile, r);
}

}  // namespace

bool TileLayoutApplies(const WeightView& w) {
  BlockShape s;
  if (w.layout != WeightLayout::kRows || !ShapeOf(w.type, &s)) return false;
  if (w.rows <= 0) return false;
  if (w.row_stride != static_cast<size_t>(RowBytes(w.type, w.cols))) return false;
  const CpuTypeTraits* t = GetCpuTraits(w.type);
  return t != nullptr && t->gemm_tiles16 != nullptr;
}

int64_t TileCount(const WeightView& w) { return (w.rows + kTileRows - 1) / kTileRows; }

size_t PackedBytes(const WeightView& w) {
  return static_cast<size_t>(TileCount(w)) * kTileRows * w.row_stride;
}

void PackTiles16(const WeightView& w, int64_t tile_begin, int64_t tile_end, void* dst) {
  BlockShape s;
  if (!ShapeOf(w.type, &s)) return;
  const int64_t nb = w.cols / s.elements;
  const size_t tile_bytes = kTileRows * w.row_stride;
  // A copy of the source rows: packing in place overwrites them.
  thread_local std::vector<uint8_t> rows;
  rows.resize(tile_bytes);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t valid = std::min<int64_t>(kTileRows, w.rows - t * kTileRows);
    std::memcpy(rows.data(), static_cast<const uint8_t*>(w.data) + t * tile_bytes,
                valid * w.row_stride);
    for (int64_t r = valid; r < kTileRows; ++r) {  // a ragged last tile: repeat its last row
      std::memcpy(rows.data() + r * w.row_stride, rows.data() + (valid - 1) * w.row_stride,
                  w.row_stride);
    }
    Convert<true>(s, nb, rows.data(), static_cast<uint8_t*>(dst) + t * tile_bytes);
  }
}

void PackTileRow(GgmlType type, int64_t cols, const void* row, int lane, void* tile) {
  BlockShape s;
  if (!ShapeOf(type, &s)) return;
  // ConvertRow<true> only reads the row.
  ConvertRow<true>(s, cols / s.elements, static_cast<uint8_t*>(const_cast<void*>(row)),
                   static_cast<uint8_t*>(tile), lane);
}

void UnpackTileRow(GgmlType type, int64_t cols, const void* tile, int lane, void* row) {
  BlockShape s;
  if (!ShapeOf(type, &s)) return;
  // ConvertRow<false> only reads the tile.
  ConvertRow<false>(s, cols / s.elements, static_cast<uint8_t*>(row),
                    static_cast<uint8_t*>(const_cast<void*>(tile)), lane);
}

void UnpackTiles16(const WeightView& w, void* dst) {
  BlockShape s;
  if (!ShapeOf(w.type, &s)) return;
  const int64_t nb = w.cols / s.elements;
  const size_t tile_bytes = kTileRows * w.row_stride;
  std::vector<uint8_t> tile(tile_bytes), rows(tile_bytes);
  for (int64_t t = 0; t < TileCount(w); ++t) {
    std::memcpy(tile.data(), static_cast<const uint8_t*>(w.data) + t * tile_bytes, tile_bytes);
    Convert<false>(s, nb, rows.data(), tile.data());
    const int64_t valid = std::min<int64_t>(kTileRows, w.rows - t * kTileRows);
    std::memcpy(static_cast<uint8_t*>(dst) + t * tile_bytes, rows.data(), valid * w.row_stride);
  }
}

}  // namespace fucina
