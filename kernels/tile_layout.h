// The 16-row tile layout of weight matrices (WeightLayout::kTiles16): GGUF rows repacked at
// load time so that a tile kernel reads each tile as one sequential stream of aligned vectors.
//
// Why: a decode matvec streams every weight byte once. In GGUF's row-major layout a 16-row tile
// kernel reads 16 rows side by side, a few bytes of each per step; the hardware prefetchers see
// 16 short streams, and the matvec stayed at 50-65% of the read bandwidth on 2 threads however
// the software prefetch was placed. Repacked, a tile is two sequential streams (quants, then
// scales), and the in-register transposes of every block disappear from decode and prefill.
//
// Format, for the types of TileLayoutApplies (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K),
// per 16 consecutive rows with nb blocks each (QB quant bytes per block: Q8_0 32, Q4_x/Q5_x 16,
// Q4_K 128, Q5_K 160 (qh and qs), Q6_K 192 (ql and qh); its other bytes are meta: Q8_0 and
// Q4_0 d, Q4_1 d and m, Q5_0 d and its qh dword, Q5_1 d, m and qh, Q4_K and Q5_K d, dmin and
// 12 packed scale bytes, Q6_K 16 scale bytes and d):
//   [nb * 16 * QB quant bytes][nb * 16 * meta bytes]
//   quants of block b: QB / 4 vectors of 64 bytes; bytes 4r..4r+3 of vector v are dword v of
//     row r's quants (Q8_0 stores q + 128, unsigned, the form vpdpbusd multiplies).
//   meta of block b: each field in the order above (f16 values, or single scale bytes), the
//     16 rows' side by side (SIMD code unpacks 16 rows' scales at once).
// A tile is 16 * RowBytes(type, cols) bytes, the same as its 16 rows, so tile t starts at
// t * 16 * row_stride and row slices at multiples of 16 stay valid.
#ifndef FUCINA_KERNELS_TILE_LAYOUT_H_
#define FUCINA_KERNELS_TILE_LAYOUT_H_

#include <cstddef>
#include <cstdint>

#include "kernels/matmul.h"

namespace fucina {

constexpr int64_t kTileRows = 16;

// Whether `w` (row-major, dense) can be repacked to kTiles16 and the active ISA has kernels
// for that layout: a tiled type. Rows that are not a multiple of 16 leave a ragged last tile,
// whose missing rows PackTiles16 fills by repeating the last row (the kernels compute and drop
// them): such a matrix takes PackedBytes(w), more than its rows, so it cannot be packed in
// place. (A vocabulary of 262145 tokens, or 32001, makes a head of that shape.)
bool TileLayoutApplies(const WeightView& w);

// Bytes of `w` packed: whole tiles, the last one padded.
size_t PackedBytes(const WeightView& w);

// Tiles of `w` packed, the ragged last one included.
int64_t TileCount(const WeightView& w);

// Repacks tiles [tile_begin, tile_end) of `w` (layout kRows, dense) into `dst`, which holds
// the whole packed matrix (PackedBytes(w)). `dst` may equal w.data (in place) when w.rows is a
// multiple of 16.
void PackTiles16(const WeightView& w, int64_t tile_begin, int64_t tile_end, void* dst);

// The inverse: row-major rows of a kTiles16 matrix `w` into `dst` (w.rows * w.row_stride bytes,
// not aliasing w.data). For paths without a tile kernel (the scalar reference, lower ISAs).
void UnpackTiles16(const WeightView& w, void* dst);

// One row of a tile (a KV cache written a position at a time): `row` (RowBytes(type, cols)
// bytes, GGUF layout) into row `lane` (0..15) of the tile at `tile`, whose other rows are left
// as they are; and back. No-ops for types without the layout.
void PackTileRow(GgmlType type, int64_t cols, const void* row, int lane, void* tile);
void UnpackTileRow(GgmlType type, int64_t cols, const void* tile, int lane, void* row);

}  // namespace fucina

#endif  // FUCINA_KERNELS_TILE_LAYOUT_H_
