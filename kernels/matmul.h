// Matrix-vector and matrix-matrix products with weights in any GGUF dtype that has CPU kernels.
//
// Layout: weights W are [rows, cols] row-major as GGUF stores a 2-D tensor with dims
// {cols, rows} (each row `cols` elements, RowBytes(type, cols) bytes, `row_stride` apart).
// Activations x are [m, cols] f32 row-major; the result y is [m, rows] f32:
//   y[i, r] = sum_c W[r, c] * x[i, c]
// Activations are quantized once to the weight type's vec_dot_type (llama.cpp's numerics).
#ifndef FUCINA_KERNELS_MATMUL_H_
#define FUCINA_KERNELS_MATMUL_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ggml_type.h"

namespace fucina {

// How a weight matrix's bytes are arranged.
enum class WeightLayout : uint8_t {
  kRows,     // row-major, `row_stride` apart (GGUF's layout)
  kTiles16,  // groups of 16 rows repacked for the tile kernels (kernels/tile_layout.h)
};

// A borrowed view of a weight matrix (typically into a GGUF mapping, or its repacked copy).
struct WeightView {
  const void* data = nullptr;
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;        // output features.
  int64_t cols = 0;        // input features; a multiple of the type's block size.
  size_t row_stride = 0;   // bytes between rows; RowBytes(type, cols) when dense.
  WeightLayout layout = WeightLayout::kRows;  // kTiles16: dense, rows a multiple of 16.

  static WeightView Dense(const void* data, GgmlType type, int64_t rows, int64_t cols);
};

// y[m, w.rows] = x[m, w.cols] . W^T, on `pool`. Precondition: HasMatVec(w.type). x and y must
// not alias. Thread-safe for distinct pools (scratch is per calling thread).
void MatMul(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool& pool);

// The same using the scalar reference kernels, single-threaded: the oracle for tests.
void MatMulRef(const WeightView& w, const float* x, int64_t m, float* y);

// The same at an explicit ISA (tests and benchmarks). Precondition: isa <= DetectedIsa().
void MatMulIsa(const WeightView& w, const float* x, int64_t m, float* y, ThreadPool& pool,
               Isa isa);

}  // namespace fucina

#endif  // FUCINA_KERNELS_MATMUL_H_
