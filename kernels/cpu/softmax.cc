#include "kernels/softmax.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"

namespace fucina {

void SoftmaxRef(float* x, int64_t rows, int64_t n, float scale, const float* mask,
                int64_t mask_row_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const float* mr = mask != nullptr ? mask + r * mask_row_stride : nullptr;
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      // The masked logit is formed in float, as the SIMD paths and ggml do.
      const float y = scale * xr[j] + (mr != nullptr ? mr[j] : 0.0f);
      xr[j] = y;
      if (y > max) max = y;
    }
    if (max == -std::numeric_limits<double>::infinity()) {
      for (int64_t j = 0; j < n; ++j) xr[j] = 0.0f;
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(xr[j]) - max);
    for (int64_t j = 0; j < n; ++j) {
      xr[j] = static_cast<float>(std::exp(static_cast<double>(xr[j]) - max) / sum);
    }
  }
}

void Softmax(float* x, int64_t rows, int64_t n, float scale, const float* mask,
             int64_t mask_row_stride) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return avx512::Softmax(x, rows, n, scale, mask, mask_row_stride);
    case Isa::kAvx2:
      return avx2::Softmax(x, rows, n, scale, mask, mask_row_stride);
    case Isa::kScalar:
      break;
  }
  SoftmaxRef(x, rows, n, scale, mask, mask_row_stride);
}

}  // namespace fucina
