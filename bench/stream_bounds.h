// Loops that stream memory doing the least work a kernel must do per byte: the bounds
// `fucina bench kernels` measures its kernels against, in the same run.
//
// A matvec must read every weight once, so its bound is a plain read (ReadRange), the faster
// of the hardware prefetchers alone and software prefetch ahead of the loads (on a Zen 5
// core the latter read 38-40 GB/s against 35-36 on 1 thread, 48-51 against 41-44 on 2, and
// the decode kernels, which prefetch, beat the hardware-only read). Decode
// attention must also turn every cached K/V value into something it can multiply: an f16
// value into f32 (one vcvtph2ps per 16 values (8 on AVX2), the only f16 -> f32 path of these
// ISAs), a q8_0 key block into an integer dot (one vpdpbusd per block; AVX2 has none, and
// makes it of vpmaddubsw and vpmaddwd, as llama.cpp does), a q8_0 value block into
// f32 to weight it by the f32 softmax probabilities; and then multiply it once for each query
// head sharing its kv head (an FMA per 16 values, a vpdpbusd per key block). On this class of
// machine a stream that computes as it reads runs well below a plain read (the extra
// instructions per cache line cost memory-level parallelism), so that is the bound an
// attention kernel is held to. Every function returns a value that depends on every byte
// read, so no load is optimized away.
#ifndef FUCINA_BENCH_STREAM_BOUNDS_H_
#define FUCINA_BENCH_STREAM_BOUNDS_H_

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina::cli {

// Plain read of n uint64 words from p; a tail of fewer than 32 words (256 bytes) is skipped.
// `prefetch`: each line is also requested 16 KiB ahead into L1.
uint64_t ReadRange(const uint64_t* p, int64_t n, bool prefetch);

// Whether the conversion streams below have a SIMD path at the active ISA (AVX-512 VNNI or
// AVX2); at the scalar level they run plain loops, not a bound for anything.
bool HasConversionStreams();

// The streams below serve `heads` query heads per kv head (a GQA group, 1..8; more are
// measured as 8, an optimistic bound for them): each value read enters one product per head.
// `isa` (tests) picks the SIMD level, at most DetectedIsa(); at kScalar they run plain loops,
// the reference the others are tested against.

// Every one of the n f16 values (n % 64 == 0 read whole) converted to f32 and multiply-added
// once per head.
float ConvertF16Stream(const f16_t* p, int64_t n, int heads, Isa isa = ActiveIsa());

// Each q8_0 block's 32 quants dotted with a constant vector per head (one vpdpbusd each; on
// AVX2 vpmaddubsw and vpmaddwd), summed.
int32_t DotQ8_0Stream(const BlockQ8_0* blocks, int64_t nb, int heads, Isa isa = ActiveIsa());

// Each q8_0 block converted to 32 f32 values and multiply-added once per head by the head's
// weight times the block's scale, summed.
float DequantQ8_0Stream(const BlockQ8_0* blocks, int64_t nb, int heads,
                        Isa isa = ActiveIsa());

}  // namespace fucina::cli

#endif  // FUCINA_BENCH_STREAM_BOUNDS_H_
