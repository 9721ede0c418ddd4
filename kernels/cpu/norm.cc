#include "kernels/norm.h"

#include <cmath>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"

namespace fucina {

void RmsNormRef(const float* x, const float* weight, float eps, int64_t rows, int64_t n,
                float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += static_cast<double>(xr[j]) * xr[j];
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t j = 0; j < n; ++j) {
      const float v = xr[j] * scale;
      yr[j] = weight != nullptr ? v * weight[j] : v;
    }
  }
}

void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t n,
             float* out) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return avx512::RmsNorm(x, weight, eps, rows, n, out);
    case Isa::kAvx2:
      return avx2::RmsNorm(x, weight, eps, rows, n, out);
    case Isa::kScalar:
      break;
  }
  RmsNormRef(x, weight, eps, rows, n, out);
}

}  // namespace fucina
