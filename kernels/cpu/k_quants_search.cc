// Scalar reference quantizers for the k-quants (Q4_K, Q5_K, Q6_K weights; Q8_K activations).
//
// The weight quantizers are ggml's quantize_row_q*_K_ref without an importance matrix: a small
// search per sub-block for the scale (and min) that minimises a weighted squared error
// (make_qkx2_quants for Q4_K/Q5_K, make_qx_quants for Q6_K), then 6- or 8-bit quantization of
// those scales against one f16 super-scale, then re-rounding of every value against the scale
// actually stored. Every float operation is kept in ggml's order so the produced bytes are
// identical to llama-quantize's (this file is built without FMA, so nothing is contracted).
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/k_quants.h"

namespace fucina {
namespace {

// Below this a group is treated as all zeros.
constexpr float kGroupMaxEps = 1e-15f;

// Round to nearest, ties to even, for |fval| <= 2^22 - 1: adding 1.5 * 2^23 puts the integer
// part in the low mantissa bits. This is ggml's rounding; roundf (ties away from zero) would
// differ on exact halves and break byte-exactness with ggml-produced files.
inline int NearestInt(float fval) {
  const float val = fval + 12582912.f;
  int32_t i;
  std::memcpy(&i, &val, sizeof(i));
  return (i & 0x007fffff) - 0x00400000;
}

// As in k_quants.cc: sub-block j's 6-bit scale and min from the 12 packed bytes.
inline void GetScaleMinK4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Inverse of GetScaleMinK4 for all eight sub-blocks (values already clamped to 0..63).
inline void PackScalesMins(const uint8_t ls[8], const uint8_t lm[8], uint8_t packed[12]) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      packed[j] = ls[j];
      packed[j + 4] = lm[j];
    } else {
      packed[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
      packed[j - 4] |= (ls[j] >> 4) << 6;
      packed[j] |= (lm[j] >> 4) << 6;
    }
  }
}

// Asymmetric quantization of n values to L[i] in [0, nmax]: x ~ scale * L - the_min.
// Tries nstep + 1 inverse scales (rmin + rdelta * is + nmax) / (max - min) and keeps the
// least-squares (scale, min) fit with the smallest weighted error. Returns scale; *the_min is
// stored negated (>= 0) because the formats subtract it. Laux is scratch of n bytes.
float MakeQkx2Quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                     float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = NearestInt(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(l < 0 ? 0 : (l > nmax ? nmax : l));
    float diff = scale * L[i] + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = NearestInt(iscale * (x[i] - min));
      l = l < 0 ? 0 : (l > nmax ? nmax : l);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// The value of largest magnitude among x[0..n) (the first one on ties; 0 when all are 0), and
// via amax_out its magnitude.
inline float LargestMagnitude(const float* x, int n, float* amax_out) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  *amax_out = amax;
  return max;
}

// Symmetric quantization of n values to L[i] in [0, 2*nmax) (stored offset by nmax), weights
// x^2 (ggml's rmse_type 1, no importance matrix). The sign of the scale follows the value of
// largest magnitude so that value maps to -nmax, the end with one more level. Tries 18 nearby
// inverse scales and keeps the least-squares scale with the best weighted fit.
float MakeQxQuants(int n, int nmax, const float* x, int8_t* L) {
  float amax;
  const float max = LargestMagnitude(x, n, &amax);
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  auto clamp = [nmax](int l) { return l < -nmax ? -nmax : (l > nmax - 1 ? nmax - 1 : l); };
  float iscale = -nmax / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp(NearestInt(iscale * x[i]));
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp(NearestInt(iscale * x[i]));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = static_cast<int8_t>(nmax + clamp(NearestInt(iscale * x[i])));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q4_K and Q5_K share everything but the number of levels and the search grid; this fills
// d, dmin, scales and L (one level index per element, 0..nmax) for one super-block.
void QuantizeSuperBlockQx_K(const float* x, int nmax, float rmin, float rdelta, int nstep,
                            f16_t* d_out, f16_t* dmin_out, uint8_t packed[kKScaleSize],
                            uint8_t L[kQK_K]) {
  uint8_t laux[32];
  float weights[32];
  float mins[kQK_K / 32];
  float scales[kQK_K / 32];
  float max_scale = 0;  // scales are positive because the min is taken out.
  float max_min = 0;
  for (int j = 0; j < kQK_K / 32; ++j) {
    const float* xj = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xj[l] * xj[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xj[l]);
    scales[j] = MakeQkx2Quants(32, nmax, xj, weights, L + 32 * j, &mins[j], laux, rmin, rdelta,
                               nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < kQK_K / 32; ++j) {
    // ggml truncates to uint8_t before clamping; kept for identical bytes.
    const uint8_t s = static_cast<uint8_t>(NearestInt(inv_scale * scales[j]));
    const uint8_t m = static_cast<uint8_t>(NearestInt(inv_min * mins[j]));
    ls[j] = s < 63 ? s : 63;
    lm[j] = m < 63 ? m : 63;
  }
  std::memset(packed, 0, kKScaleSize);
  PackScalesMins(ls, lm, packed);
  *d_out = Fp32ToFp16(max_scale / 63.f);
  *dmin_out = Fp32ToFp16(max_min / 63.f);

  // Re-round against the scales as stored (6-bit times f16), not the searched ones.
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t sc, m;
    GetScaleMinK4(j, packed, &sc, &m);
    const float d = Fp16ToFp32(*d_out) * sc;
    if (!d) continue;
    const float dm = Fp16ToFp32(*dmin_out) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = NearestInt((x[32 * j + ii] + dm) / d);
      L[32 * j + ii] = static_cast<uint8_t>(l < 0 ? 0 : (l > nmax ? nmax : l));
    }
  }
}

}  // namespace

void QuantizeRowQ4_K(const float* x, BlockQ4_K* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < nb; ++i) {
    QuantizeSuperBlockQx_K(x, 15, -1.f, 0.1f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < kQK_K; j += 64) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
      q += 32;
    }
    x += kQK_K;
  }
}

void QuantizeRowQ5_K(const float* x, BlockQ5_K* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < nb; ++i) {
    QuantizeSuperBlockQx_K(x, 31, -0.5f, 0.1f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* qh = y[i].qh;
    uint8_t* ql = y[i].qs;
    std::memset(qh, 0, kQK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n64 = 0; n64 < kQK_K; n64 += 64) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n64 + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[n64 + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 <<= 2;
      m2 <<= 2;
      ql += 32;
    }
    x += kQK_K;
  }
}

void QuantizeRowQ6_K(const float* x, BlockQ6_K* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < nb; ++i) {
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float scale = MakeQxQuants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      y[i].d = Fp32ToFp16(0.f);
      x += kQK_K;
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = Fp32ToFp16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const int l = NearestInt(iscale * scales[ib]);
      y[i].scales[ib] = static_cast<int8_t>(l < 127 ? l : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = Fp16ToFp32(y[i].d) * y[i].scales[j];
      if (!d) continue;
      for (int ii = 0; ii < 16; ++ii) {
        int l = NearestInt(x[16 * j + ii] / d);
        l = l < -32 ? -32 : (l > 31 ? 31 : l);
        L[16 * j + ii] = static_cast<int8_t>(l + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l + 0] & 0xF;
        const uint8_t q2 = L[j + l + 32] & 0xF;
        const uint8_t q3 = L[j + l + 64] & 0xF;
        const uint8_t q4 = L[j + l + 96] & 0xF;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                                     ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
      }
      ql += 64;
      qh += 32;
    }
    x += kQK_K;
  }
}

void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  for (int64_t i = 0; i < nb; ++i) {
    // The signed value of largest magnitude (first one on ties) maps to -127.
    float amax;
    const float max = LargestMagnitude(x, kQK_K, &amax);
    if (!amax) {
      // ggml leaves bsums untouched here; they are zeroed so the block is fully defined.
      y[i].d = 0;
      std::memset(y[i].qs, 0, kQK_K);
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      x += kQK_K;
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) {
      const int v = NearestInt(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[j * 16 + ii];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
    x += kQK_K;
  }
}

}  // namespace fucina
