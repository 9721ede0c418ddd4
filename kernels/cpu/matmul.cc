#include "kernels/matmul.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <unistd.h>

#include "kernels/tile_layout.h"
#include "kernels/type_traits.h"

namespace fucina {
namespace {

// Weights a tiled call keeps in L2 while its activation tiles pass over them (tiles_job).
constexpr int64_t kL2BlockBytes = 256 << 10;

// Bytes of quantized activations a tiled call takes against one weight block (tiles_job): what
// the core's L2 holds beside the block, halved for everything else that passes through it;
// 128 KiB on a 512 KiB L2, and on the 2 MiB L2 of recent Xeons a 512-token prompt is one
// chunk, as before chunking (the AVX-512 tiles unpack weights once per call). sysconf gives
// the per-core L2 (glibc reads cpuid); where it is unknown, 1 MiB is assumed.
int64_t ActivationChunkBytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    const int64_t size = l2 > 0 ? static_cast<int64_t>(l2) : int64_t{1} << 20;
    return std::max<int64_t>(64 << 10, (size - kL2BlockBytes) / 2);
  }();
  return bytes;
}

// How MatMul sizes its work items: ~`bytes` of weight rows, at least `min_rows`, and at least
// `per_thread` items per thread for dynamic balance.
struct ItemSize {
  int64_t bytes;
  int64_t min_rows;
  int per_thread;
};

int64_t ItemRows(const ItemSize& size, int64_t rows, size_t row_bytes, int threads) {
  const int64_t grain = std::max<int64_t>(
      size.min_rows, size.bytes / static_cast<int64_t>(std::max<size_t>(row_bytes, 1)));
  return std::max<int64_t>(1, std::min(grain, rows / (size.per_thread * threads)));
}

// vec_dot matvecs are bandwidth-bound: items must be large enough to amortise the dispatch
// (~16 KiB of weights or more) and small enough to balance 2-16 cores.
constexpr ItemSize kVecDotItems = {16 << 10, 4, 4};

// Decode-shaped tiled calls (one group of activation rows: a single stream, or a few lockstep
// ones) stream every weight byte once, and the kernels prefetch one tile of 16 rows ahead:
// items of ~64 KiB keep most of that prefetch inside the thread's own item (with 16-row items
// it mostly fetched rows another thread was about to read), and each item pays its start-up
// (activation metadata, the first tile's prefetch) once for many tiles, while at least two
// items per thread still balance the load.
constexpr ItemSize kDecodeItems = {64 << 10, 32, 2};

// Decode-shaped tiled calls on large matrices take one contiguous share per thread instead:
// with 64 KiB items handed out in turn, each thread's reads jumped every item, and the hardware
// prefetchers started over. On a 2-core VM with 2 threads, Qwen3-0.6B-shaped decode went from
// 24-27 to 33 t/s (Q8_0, one stream), 138-140 -> 185 (Q8_0, 8 streams), 14-15 -> 17 (F16)
// and 42-48 -> 53 (Q4_K_M); the 4096 x 4096 Q8_0 matvec from 67% to 80% of the read
// bandwidth. Below a share of 1 MiB (a 135M model's layers) balancing the threads matters more
// (SmolLM2 at 8 streams lost ~4% with shares): those keep kDecodeItems.
constexpr ItemSize kDecodeShares = {int64_t{1} << 40, 32, 1};
constexpr int64_t kMinShareBytes = 1 << 20;

// Prefill-shaped tiled calls: an item reads every activation row once from the shared cache
// (512 rows of a 1024-wide layer are ~0.5 MiB quantized) for its weight rows, so items of 16
// rows spent most of their time re-reading activations, and two threads doing so at once
// scaled poorly. Items of one L2 block of weights, at least ~4 per thread: Qwen3-0.6B-shaped
// Q8_0 prefill on 2 threads of a Zen 5 went from 494-511 to 685-701 t/s, BF16 and Q4_K_M +9%;
// one thread unchanged.
constexpr ItemSize kPrefillItems = {kL2BlockBytes, 16, 4};

// Activation rows the tiled kernels take in one pass over the weights (their widest tile).
constexpr int64_t kDecodeColumns = 8;

// Tiled kernels compute up to 16 weight rows at a time: work items are multiples of 16 rows.
int64_t RoundUp16(int64_t n) { return std::max<int64_t>(16, (n + 15) & ~int64_t{15}); }

// Activation rows processed against one tile of weight rows while it is hot in L1/L2.
constexpr int64_t kActivationTile = 64;

void Run(const CpuTypeTraits& wt, const CpuTypeTraits& xt, const WeightView& w, const float* x,
         int64_t m, float* y, ThreadPool* pool) {
  GemmFn gemm = wt.gemm;
  if (w.layout == WeightLayout::kTiles16) {
    gemm = wt.gemm_tiles16;
    if (gemm == nullptr) {
      // No kernel reads the packed layout at this ISA (the scalar reference, lower ISAs in
      // tests): run on a row-major copy.
      std::vector<uint8_t> rows(w.rows * w.row_stride);
      UnpackTiles16(w, rows.data());
      WeightView dense = w;
      dense.data = rows.data();
      dense.layout = WeightLayout::kRows;
      Run(wt, xt, dense, x, m, y, pool);
      return;
    }
  }
  const int64_t k = w.cols;
  const size_t xq_row = static_cast<size_t>(RowBytes(wt.vec_dot_type, k));
  // Quantized activations: per calling thread, grow-only (decode reuses it every step).
  thread_local std::vector<uint8_t> scratch;
  const uint8_t* xq;
  if (wt.vec_dot_type == GgmlType::kF32) {
    xq = reinterpret_cast<const uint8_t*>(x);
  } else {
    if (scratch.size() < xq_row * m) scratch.resize(xq_row * m);
    uint8_t* dst = scratch.data();
    auto quantize = [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) xt.from_float(x + i * k, dst + i * xq_row, k);
    };
    if (pool != nullptr && m > 1) {
      pool->ParallelFor(m, 8, quantize);
    } else {
      quantize(0, m, 0);
    }
    xq = dst;
  }

  const auto* wbase = static_cast<const uint8_t*>(w.data);
  if (gemm != nullptr) {
    // Tiled kernels: a work item is a run of weight rows against every activation row. Within
    // it, blocks of ~256 KiB of weights stay in L2 while all activation tiles pass over them
    // (large enough that per-activation-tile setup is shared by many weight tiles).
    const int64_t l2_rows =
        RoundUp16(kL2BlockBytes / static_cast<int64_t>(std::max<size_t>(w.row_stride, 1)));
    // The activations go by in chunks (ActivationChunkBytes), so a chunk and the weight block
    // fit in L2 together: when every activation row streamed past each block (584 KiB of Q8_K
    // for a 512-token prompt of width 1024), they evicted the block it was reusing, and two
    // threads then re-read their blocks from L3 at once (Zen 3, 512 KiB L2: Q4_K
    // prefill-shaped matmul on 2 threads, batch 512, 98-113 -> 139-145 GFLOP/s). Chunks are
    // whole 8-column tiles.
    const int64_t chunk = std::max<int64_t>(
        8, (ActivationChunkBytes() / static_cast<int64_t>(std::max<size_t>(xq_row, 1))) &
               ~int64_t{7});
    auto tiles_job = [&](int64_t r0, int64_t r1, int) {
      for (int64_t b0 = r0; b0 < r1; b0 += l2_rows) {
        const int64_t b1 = std::min(r1, b0 + l2_rows);
        for (int64_t i0 = 0; i0 < m; i0 += chunk) {
          gemm(k, wbase + b0 * w.row_stride, w.row_stride, b1 - b0, xq + i0 * xq_row, xq_row,
               std::min(chunk, m - i0), y + i0 * w.rows + b0, static_cast<size_t>(w.rows));
        }
      }
    };
    if (pool != nullptr) {
      const int threads = pool->num_threads();
      const int64_t share = w.rows * static_cast<int64_t>(w.row_stride) / threads;
      const ItemSize& size = m > kDecodeColumns       ? kPrefillItems
                             : share >= kMinShareBytes ? kDecodeShares
                                                       : kDecodeItems;
      const int64_t grain = RoundUp16(ItemRows(size, w.rows, w.row_stride, threads));
      pool->ParallelFor(w.rows, grain, tiles_job);
    } else {
      tiles_job(0, w.rows, 0);
    }
    return;
  }
  auto rows_job = [&](int64_t r0, int64_t r1, int) {
    for (int64_t i0 = 0; i0 < m; i0 += kActivationTile) {
      const int64_t i1 = std::min(m, i0 + kActivationTile);
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* wrow = wbase + r * w.row_stride;
        for (int64_t i = i0; i < i1; ++i) y[i * w.rows + r] = wt.vec_dot(k, wrow, xq + i * xq_row);
      }
    }
  };
  if (pool != nullptr) {
    pool->ParallelFor(w.rows, ItemRows(kVecDotItems, w.rows, w.row_stride, pool->num_threads()),
                      rows_job);
  } else {
    rows_job(0, w.rows, 0);
  }
}

}  // namespace

WeightView WeightView::Dense(const void* data, GgmlType type, int64_t rows, int64_t cols) {
  return WeightView{data, type, rows, cols, static_cast<size_t>(RowBytes(type, cols))};
}

void MatMulIsa(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool& pool,
               Isa isa) {
  const CpuTypeTraits* wt = GetCpuTraits(w.type, isa);
  const CpuTypeTraits* xt = GetCpuTraits(wt->vec_dot_type, isa);
  Run(*wt, *xt, w, x, m, y, &pool);
}

void MatMul(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool& pool) {
  MatMulIsa(w, x, m, y, pool, ActiveIsa());
}

void MatMulRef(const WeightView& w, const float* x, int64_t m, float* y) {
  const CpuTypeTraits* wt = GetCpuTraits(w.type, Isa::kScalar);
  const CpuTypeTraits* xt = GetCpuTraits(wt->vec_dot_type, Isa::kScalar);
  Run(*wt, *xt, w, x, m, y, nullptr);
}

}  // namespace fucina
