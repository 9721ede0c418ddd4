// Row-wise RMS normalization (llama-family "rms_norm" + the elementwise weight multiply that
// ggml graphs apply right after it).
//
// For each row r of x[rows, n]:
//   scale = 1 / sqrt(mean_j(x[r][j]^2) + eps)
//   out[r][j] = (x[r][j] * scale) * (weight ? weight[j] : 1)
// out may alias x (in place). Shapes: x, out [rows, n] row-major; weight [n] or null.
#ifndef FUCINA_KERNELS_NORM_H_
#define FUCINA_KERNELS_NORM_H_

#include <cstdint>

namespace fucina {

// Dispatched by ActiveIsa(). The SIMD paths sum squares in float with several vector
// accumulators; results match RmsNormRef within ~1e-6 relative (tests use 1e-5).
void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t n, float* out);

// Scalar reference: the sum of squares is accumulated in double (as ggml's ggml_float), the
// mean and scale are then taken in float exactly as ggml_compute_forward_rms_norm_f32 does.
void RmsNormRef(const float* x, const float* weight, float eps, int64_t rows, int64_t n,
                float* out);

}  // namespace fucina

#endif  // FUCINA_KERNELS_NORM_H_
