// `fucina bench kernels`, decode attention section: the rate a long-context decode step streams
// its KV cache at, against a plain read of the same bytes and against the least conversion work
// each cache type needs (bench/stream_bounds.h), all measured in the same run.
#ifndef FUCINA_BENCH_ATTENTION_BENCH_H_
#define FUCINA_BENCH_ATTENTION_BENCH_H_

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace fucina::cli {

struct DecodeAttentionShape {
  int64_t context = 4000;  // positions each query attends to.
  int num_heads = 16;      // query heads; Qwen3-0.6B's shape.
  int num_heads_kv = 8;
  int head_dim = 128;
};

// Prints one table row per KV type (f16, q8_0) and thread count (`one`, `all`): GB/s of K+V
// bytes for a plain read, the conversion stream and AttentionHeads (one query per kv head
// group, split over kv heads as the engine does), and attention as a share of both bounds.
// Layers' caches are cycled so the bytes read per pass exceed `working_set_bytes` (larger than
// the last-level cache), as a model's layers are.
void ReportDecodeAttention(const DecodeAttentionShape& shape, int64_t working_set_bytes,
                           ThreadPool& one, ThreadPool& all, double min_seconds);

}  // namespace fucina::cli

#endif  // FUCINA_BENCH_ATTENTION_BENCH_H_
