// Causal grouped-query attention of a few new query positions against one layer's KV cache.
//
// KV cache (one tensor for K, one for V, same geometry): [num_heads_kv, capacity, head_dim] in
// f32, f16, or q8_0 (each head row of head_dim values is head_dim / 32 BlockQ8_0; head_dim must
// then be a multiple of 32). Head-major, so attention over one kv head reads one contiguous
// span, which the hardware prefetchers stream (position-major, a head's rows were a whole
// position apart and decode after 4,000 positions read them at ~6 GB/s). Position p lives in
// row p % capacity: a cache shorter than the sequence is a ring (sliding-window layers keep
// only their window plus some slack).
//
// A q8_0 K cache may store each span's rows as kTiles16 tiles of 16 positions
// (KvLayout::tiles16, kernels/tile_layout.h: the same bytes, dwords of 16 rows side by side),
// the form the integer-dot tile kernel streams as it is. Row-major, that kernel transposed every
// block of 16 keys in registers, and scoring ran at ~65% of its conversion bound (`fucina
// bench kernels`); tiled, at about the bound. V stays row-major: a value row is weighted
// whole.
//
// Queries q[n_q, num_heads, head_dim] f32 are at positions pos0 .. pos0 + n_q - 1 and their own
// K/V rows must already be stored (StoreKvRows) before the call. Query i at position p attends
// to positions [0, p] (causal), or with a window W to [max(0, p - W + 1), p]; the rows of every
// position a query sees must still be in the cache. Query head h reads kv head
// h / (num_heads / num_heads_kv) (GQA).
//   out[i, h, :] = sum_j softmax_j(scale * q[i, h] . K[j, kvh]) V[j, kvh]
// Output out[n_q, num_heads, head_dim] f32.
//
// The dispatched path streams over keys in tiles with an online softmax, so its scratch is
// O(head_dim) per query head regardless of context length; K and V are read in their stored
// type (F16C / int8 -> f32 conversion on the fly), never dequantized into a copy. A q8_0 K
// cache is scored with integer dots against the scaled query quantized to q8_0 per 32 dims,
// as llama.cpp does for a q8_0 K cache (AttentionRef defines the scores the same way).
#ifndef FUCINA_KERNELS_ATTENTION_H_
#define FUCINA_KERNELS_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/isa.h"
#include "kernels/ggml_type.h"

namespace fucina {

struct KvLayout {
  GgmlType type = GgmlType::kF32;  // kF32, kF16 or kQ8_0.
  int64_t capacity = 0;            // positions the cache can hold.
  int num_heads_kv = 0;
  int head_dim = 0;
  // q8_0 only: rows in tiles of 16 positions; capacity % 16 == 0. Position p is row p % 16 of
  // the tile at RowOffset(p - p % 16, kvh).
  bool tiles16 = false;

  // Bytes of one head row (head_dim values) and of one position (all kv heads).
  int64_t HeadBytes() const { return RowBytes(type, head_dim); }
  int64_t PositionBytes() const { return HeadBytes() * num_heads_kv; }
  int64_t TotalBytes() const { return PositionBytes() * capacity; }
  // Byte offset of kv head kvh's row for position pos; a head's rows are HeadBytes() apart.
  int64_t RowOffset(int64_t pos, int kvh) const {
    return (kvh * capacity + pos % capacity) * HeadBytes();
  }
};

// OK iff the type is supported, sizes are positive, q8_0 has head_dim % 32 == 0 and tiles16
// is q8_0 with capacity % 16 == 0.
absl::Status ValidateKvLayout(const KvLayout& layout);

// Whether a K cache of `type` should use tiles16 at the active ISA: q8_0 where the integer-dot
// tile kernel exists (other levels read tiles through a slower unpacking path).
bool KeyTilesApply(GgmlType type);

// Writes src[n, num_heads_kv, head_dim] (f32) for positions [pos, pos + n) into their rows
// (p % capacity), converting to the cache's type: f16 round-to-nearest-even, q8_0 with ggml's
// quantize_row_q8_0_ref rule (bit-exact with both). Precondition: layout valid, 0 <= pos,
// n <= capacity.
void StoreKvRows(const KvLayout& layout, void* cache, int64_t pos, int64_t n, const float* src);

// Reads back one head row (position pos, kv head kvh) as f32 [head_dim]; exact for every type.
void LoadKvHead(const KvLayout& layout, const void* cache, int64_t pos, int kvh, float* out);

struct AttentionArgs {
  const float* q = nullptr;  // [n_q, num_heads, head_dim]
  int64_t n_q = 0;
  int64_t pos0 = 0;          // position of q row 0.
  int64_t window = 0;        // 0: every earlier position; else the last `window` positions.
  int num_heads = 0;         // multiple of layout.num_heads_kv.
  float scale = 0.0f;        // usually 1 / sqrt(head_dim).
  KvLayout layout;           // both caches' geometry; the V cache's layout (rows).
  bool k_tiles16 = false;    // the K cache's rows are tiles16 (q8_0; then capacity % 16 == 0).
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
};

// Computes out[i, h, :] for all i and query heads h in [head_begin, head_end) only, so callers
// can split heads across threads; rows of other heads are not touched. Dispatched by
// ActiveIsa(); float dots and the SIMD exp of ops_isa.h, so it matches AttentionRef within a
// few 1e-7 of the output scale (attention_test.cc states the tolerance).
void AttentionHeads(const AttentionArgs& args, int head_begin, int head_end, float* out);

// The same with an explicit kernel level instead of ActiveIsa(), so tests and benchmarks can
// run every path; precondition: isa <= DetectedIsa().
void AttentionHeadsForIsa(Isa isa, const AttentionArgs& args, int head_begin, int head_end,
                          float* out);

// All heads.
void Attention(const AttentionArgs& args, float* out);

// Scalar reference: per (query, head) a two-pass softmax in double over the dequantized cache
// rows (LoadKvHead), so quantized caches are compared on identical contents.
void AttentionRef(const AttentionArgs& args, float* out);

}  // namespace fucina

#endif  // FUCINA_KERNELS_ATTENTION_H_
