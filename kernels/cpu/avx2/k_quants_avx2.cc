// AVX2 k-quant kernels: the Q8_K activation quantizer (the Q*_K x Q8_K dots and tiles are in
// gemm_k_avx2.cc).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/k_quants.h"

namespace fucina::avx2 {

void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256i kPerm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < nb; ++i) {
    __m256 vmax = _mm256_setzero_ps();
    for (int j = 0; j < kQK_K; j += 8) {
      vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + j)));
    }
    const float amax = HorizontalMax(vmax);
    if (!amax) {
      y[i].d = 0;
      std::memset(y[i].qs, 0, kQK_K);
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      x += kQK_K;
      continue;
    }
    // The reference keeps the signed value of the first element reaching amax.
    const __m256 vamax = _mm256_set1_ps(amax);
    float max = 0;
    for (int j = 0; j < kQK_K; j += 8) {
      const __m256 ax = _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + j));
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(ax, vamax, _CMP_EQ_OQ));
      if (mask) {
        max = x[j + __builtin_ctz(mask)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 viscale = _mm256_set1_ps(iscale);
    const __m256i k127 = _mm256_set1_epi32(127);
    for (int j = 0; j < kQK_K; j += 32) {
      // cvtps rounds to nearest even, as the reference's magic-number rounding does.
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 v = _mm256_mul_ps(viscale, _mm256_loadu_ps(x + j + 8 * k));
        q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(v), k127);
      }
      y[i].bsums[j / 16] = static_cast<int16_t>(HorizontalSum(_mm256_add_epi32(q[0], q[1])));
      y[i].bsums[j / 16 + 1] = static_cast<int16_t>(HorizontalSum(_mm256_add_epi32(q[2], q[3])));
      // packs works within 128-bit lanes; the permute restores element order.
      const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
      const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
      const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), kPerm);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + j), p);
    }
    y[i].d = 1 / iscale;
    x += kQK_K;
  }
}

}  // namespace fucina::avx2
