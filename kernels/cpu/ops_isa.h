// Private: the SIMD halves of the transformer ops (norm, softmax, activations, attention inner
// loops). The public entry points in kernels/*.h dispatch here; tests call these directly to
// check every ISA the machine has against the scalar references.
#ifndef FUCINA_KERNELS_CPU_OPS_ISA_H_
#define FUCINA_KERNELS_CPU_OPS_ISA_H_

#include <cstdint>

#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina {

// Attention tile kernels. K/V rows of one kv head sit `stride_bytes` apart (one cache
// position). Types: F32 rows are float[head_dim], F16 rows f16_t[head_dim], Q8_0 rows
// BlockQ8_0[head_dim / 32].
//   Scores: s[t] = dot(q, row t) for t < n_keys.
//   Accum:  acc[d] += sum_t p[t] * row_t[d] for d < head_dim.
using AttnScoresFn = void (*)(const float* q, const void* k, int64_t stride_bytes, int n_keys,
                              int head_dim, float* s);
using AttnAccumFn = void (*)(const float* p, const void* v, int64_t stride_bytes, int n_keys,
                             int head_dim, float* acc);

// Same contracts as the public functions of the same name (kernels/norm.h, softmax.h,
// activations.h). ExpF32: y[i] = exp(x[i]), max relative error ~2 ulp over the whole float
// range (results below ~1e-45 flush to 0, above FLT_MAX go to inf, NaN stays NaN).
#define FUCINA_OPS_ISA_DECLS                                                                   \
  void ExpF32(const float* x, float* y, int64_t n);                                            \
  void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t n,         \
               float* out);                                                                    \
  void Softmax(float* x, int64_t rows, int64_t n, float scale, const float* mask,              \
               int64_t mask_row_stride);                                                       \
  void Silu(const float* x, float* y, int64_t n);                                              \
  void GeluTanh(const float* x, float* y, int64_t n);                                          \
  void SwiGlu(const float* gate, const float* up, float* out, int64_t n);                      \
  void AttnScoresF32(const float* q, const void* k, int64_t stride_bytes, int n_keys,          \
                     int head_dim, float* s);                                                  \
  void AttnScoresF16(const float* q, const void* k, int64_t stride_bytes, int n_keys,          \
                     int head_dim, float* s);                                                  \
  void AttnScoresQ8_0(const float* q, const void* k, int64_t stride_bytes, int n_keys,         \
                      int head_dim, float* s);                                                 \
  void AttnAccumF32(const float* p, const void* v, int64_t stride_bytes, int n_keys,           \
                    int head_dim, float* acc);                                                 \
  void AttnAccumF16(const float* p, const void* v, int64_t stride_bytes, int n_keys,           \
                    int head_dim, float* acc);                                                 \
  void AttnAccumQ8_0(const float* p, const void* v, int64_t stride_bytes, int n_keys,          \
                     int head_dim, float* acc);

// Only callable when ActiveIsa() is at least the namespace's level (kernels/cpu/isa.h).
namespace avx2 {
FUCINA_OPS_ISA_DECLS
}  // namespace avx2
namespace avx512 {
FUCINA_OPS_ISA_DECLS
}  // namespace avx512

#undef FUCINA_OPS_ISA_DECLS

}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_OPS_ISA_H_
