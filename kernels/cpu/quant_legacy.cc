// Scalar references for kernels/quant/legacy.h: F32/F16/BF16 conversions and the 32-element
// legacy quants. Each function follows ggml's reference C formula operation for operation
// (same operand order, same float roundings) so that quantized bytes and dot results are
// bit-identical to ggml's quantize_row_*_ref / dequantize_row_* / ggml_vec_dot_*_generic.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>

#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/legacy.h"

// Bit-exactness needs every `a * b + c` rounded twice, as ggml's x86-64 reference build does:
// a global -mfma/-march flag must not let the compiler fuse them (GCC contracts across
// statements even in ISO C++ mode).
#pragma GCC optimize("fp-contract=off")

namespace fucina {
namespace {

// The 5th bit of element j (0..31) of a Q5 block, as 0 or 0x10.
inline int Q5HighBit(uint32_t qh, int j) { return static_cast<int>((qh >> j) & 1u) << 4; }

inline uint32_t LoadQh(const uint8_t qh[4]) {
  uint32_t v;
  std::memcpy(&v, qh, sizeof(v));
  return v;
}

inline void StoreQh(uint32_t v, uint8_t qh[4]) { std::memcpy(qh, &v, sizeof(v)); }

// Value of the element with the largest magnitude, first one on ties (ggml's Q4_0/Q5_0 rule:
// the scale's sign comes from it, so the extreme maps exactly to -8 / -16).
inline float SignedAbsMax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

inline void MinMax(const float* x, int n, float* min_out, float* max_out) {
  float min = 3.40282347e+38f;
  float max = -3.40282347e+38f;
  for (int j = 0; j < n; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  *min_out = min;
  *max_out = max;
}

inline float AbsMax(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
  return amax;
}

}  // namespace

void ConvertF32ToF16(const float* x, f16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToFp16(x[i]);
}

void ConvertF16ToF32(const f16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Fp16ToFp32(x[i]);
}

void ConvertF32ToBf16(const float* x, bf16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Fp32ToBf16(x[i]);
}

void ConvertBf16ToF32(const bf16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Bf16ToFp32(x[i]);
}

// ---- Dequantization: exact in f32 (int * f16-valued float, then + m for the _1 types). ----

void DequantizeRowQ4_0(const BlockQ4_0* x, float* y, int64_t n) {
  const int64_t nb = n / kQK4_0;
  for (int64_t i = 0; i < nb; ++i, y += kQK4_0) {
    const float d = Fp16ToFp32(x[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      y[j] = static_cast<float>((x[i].qs[j] & 0x0F) - 8) * d;
      y[j + kQK4_0 / 2] = static_cast<float>((x[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeRowQ4_1(const BlockQ4_1* x, float* y, int64_t n) {
  const int64_t nb = n / kQK4_1;
  for (int64_t i = 0; i < nb; ++i, y += kQK4_1) {
    const float d = Fp16ToFp32(x[i].d);
    const float m = Fp16ToFp32(x[i].m);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      y[j] = static_cast<float>(x[i].qs[j] & 0x0F) * d + m;
      y[j + kQK4_1 / 2] = static_cast<float>(x[i].qs[j] >> 4) * d + m;
    }
  }
}

void DequantizeRowQ5_0(const BlockQ5_0* x, float* y, int64_t n) {
  const int64_t nb = n / kQK5_0;
  for (int64_t i = 0; i < nb; ++i, y += kQK5_0) {
    const float d = Fp16ToFp32(x[i].d);
    const uint32_t qh = LoadQh(x[i].qh);
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const int q0 = ((x[i].qs[j] & 0x0F) | Q5HighBit(qh, j)) - 16;
      const int q1 = ((x[i].qs[j] >> 4) | Q5HighBit(qh, j + kQK5_0 / 2)) - 16;
      y[j] = static_cast<float>(q0) * d;
      y[j + kQK5_0 / 2] = static_cast<float>(q1) * d;
    }
  }
}

void DequantizeRowQ5_1(const BlockQ5_1* x, float* y, int64_t n) {
  const int64_t nb = n / kQK5_1;
  for (int64_t i = 0; i < nb; ++i, y += kQK5_1) {
    const float d = Fp16ToFp32(x[i].d);
    const float m = Fp16ToFp32(x[i].m);
    const uint32_t qh = LoadQh(x[i].qh);
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const int q0 = (x[i].qs[j] & 0x0F) | Q5HighBit(qh, j);
      const int q1 = (x[i].qs[j] >> 4) | Q5HighBit(qh, j + kQK5_1 / 2);
      y[j] = static_cast<float>(q0) * d + m;
      y[j + kQK5_1 / 2] = static_cast<float>(q1) * d + m;
    }
  }
}

void DequantizeRowQ8_0(const BlockQ8_0* x, float* y, int64_t n) {
  const int64_t nb = n / kQK8_0;
  for (int64_t i = 0; i < nb; ++i, y += kQK8_0) {
    const float d = Fp16ToFp32(x[i].d);
    for (int j = 0; j < kQK8_0; ++j) y[j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// ---- Quantization. The scale is computed and applied in f32, then stored as f16. ----
// Conversions go through int8_t first exactly as ggml's casts do; the values are in range
// for finite inputs (|x * id| <= 8 or 16 up to rounding; see the test's round-trip bounds).

void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n) {
  const int64_t nb = n / kQK4_0;
  for (int64_t i = 0; i < nb; ++i, x += kQK4_0) {
    const float d = SignedAbsMax(x, kQK4_0) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[j + kQK4_0 / 2] * id;
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRowQ4_1(const float* x, BlockQ4_1* y, int64_t n) {
  const int64_t nb = n / kQK4_1;
  for (int64_t i = 0; i < nb; ++i, x += kQK4_1) {
    float min, max;
    MinMax(x, kQK4_1, &min, &max);
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    y[i].m = Fp32ToFp16(min);
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[j + kQK4_1 / 2] - min) * id;
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x0 + 0.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(x1 + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeRowQ5_0(const float* x, BlockQ5_0* y, int64_t n) {
  const int64_t nb = n / kQK5_0;
  for (int64_t i = 0; i < nb; ++i, x += kQK5_0) {
    const float d = SignedAbsMax(x, kQK5_0) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      const float x0 = x[j] * id;
      const float x1 = x[j + kQK5_0 / 2] * id;
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(x0 + 16.5f)));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(x1 + 16.5f)));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>(q0 >> 4) << j;
      qh |= static_cast<uint32_t>(q1 >> 4) << (j + kQK5_0 / 2);
    }
    StoreQh(qh, y[i].qh);
  }
}

void QuantizeRowQ5_1(const float* x, BlockQ5_1* y, int64_t n) {
  const int64_t nb = n / kQK5_1;
  for (int64_t i = 0; i < nb; ++i, x += kQK5_1) {
    float min, max;
    MinMax(x, kQK5_1, &min, &max);
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    y[i].m = Fp32ToFp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      const float x0 = (x[j] - min) * id;
      const float x1 = (x[j + kQK5_1 / 2] - min) * id;
      // ggml has no clamp here: (x - min) * id <= 31 up to rounding, so + 0.5 truncates to
      // at most 31.
      const int q0 = static_cast<uint8_t>(x0 + 0.5f);
      const int q1 = static_cast<uint8_t>(x1 + 0.5f);
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + kQK5_1 / 2);
    }
    StoreQh(qh, y[i].qh);
  }
}

// roundf rounds half away from zero; the SIMD quantizers reproduce exactly this.
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  const int64_t nb = n / kQK8_0;
  for (int64_t i = 0; i < nb; ++i, x += kQK8_0) {
    const float d = AbsMax(x, kQK8_0) / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    for (int j = 0; j < kQK8_0; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    }
  }
}

void QuantizeRowQ8_1(const float* x, BlockQ8_1* y, int64_t n) {
  const int64_t nb = n / kQK8_1;
  for (int64_t i = 0; i < nb; ++i, x += kQK8_1) {
    const float d = AbsMax(x, kQK8_1) / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = Fp32ToFp16(d);
    int sum = 0;
    for (int j = 0; j < kQK8_1; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
      sum += y[i].qs[j];
    }
    // The f32 scale, not its f16 rounding, as ggml does.
    y[i].s = Fp32ToFp16(static_cast<float>(sum) * d);
  }
}

// ---- Dot products. Float types accumulate f32 products in double (ggml_float); the quant
// dots sum each block exactly in int32, then accumulate block results in f32 in order. ----

float VecDotF32(int64_t n, const float* x, const float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

float VecDotF16F32(int64_t n, const f16_t* x, const float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(Fp16ToFp32(x[i]) * y[i]);
  return static_cast<float>(sum);
}

float VecDotBf16F32(int64_t n, const bf16_t* x, const float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(Bf16ToFp32(x[i]) * y[i]);
  return static_cast<float>(sum);
}

float VecDotQ4_0Q8_0(int64_t n, const BlockQ4_0* x, const BlockQ8_0* y) {
  const int64_t nb = n / kQK8_0;
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      sumi += ((x[i].qs[j] & 0x0F) - 8) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + kQK4_0 / 2];
    }
    sum += static_cast<float>(sumi) * Fp16ToFp32(x[i].d) * Fp16ToFp32(y[i].d);
  }
  return sum;
}

float VecDotQ4_1Q8_1(int64_t n, const BlockQ4_1* x, const BlockQ8_1* y) {
  const int64_t nb = n / kQK8_1;
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK4_1 / 2; ++j) {
      sumi += (x[i].qs[j] & 0x0F) * y[i].qs[j];
      sumi += (x[i].qs[j] >> 4) * y[i].qs[j + kQK4_1 / 2];
    }
    sum += (Fp16ToFp32(x[i].d) * Fp16ToFp32(y[i].d)) * static_cast<float>(sumi) +
           Fp16ToFp32(x[i].m) * Fp16ToFp32(y[i].s);
  }
  return sum;
}

float VecDotQ5_0Q8_0(int64_t n, const BlockQ5_0* x, const BlockQ8_0* y) {
  const int64_t nb = n / kQK8_0;
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = LoadQh(x[i].qh);
    int sumi = 0;
    for (int j = 0; j < kQK5_0 / 2; ++j) {
      sumi += (((x[i].qs[j] & 0x0F) | Q5HighBit(qh, j)) - 16) * y[i].qs[j];
      sumi += (((x[i].qs[j] >> 4) | Q5HighBit(qh, j + kQK5_0 / 2)) - 16) *
              y[i].qs[j + kQK5_0 / 2];
    }
    sum += (Fp16ToFp32(x[i].d) * Fp16ToFp32(y[i].d)) * static_cast<float>(sumi);
  }
  return sum;
}

float VecDotQ5_1Q8_1(int64_t n, const BlockQ5_1* x, const BlockQ8_1* y) {
  const int64_t nb = n / kQK8_1;
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = LoadQh(x[i].qh);
    int sumi = 0;
    for (int j = 0; j < kQK5_1 / 2; ++j) {
      sumi += ((x[i].qs[j] & 0x0F) | Q5HighBit(qh, j)) * y[i].qs[j];
      sumi += ((x[i].qs[j] >> 4) | Q5HighBit(qh, j + kQK5_1 / 2)) * y[i].qs[j + kQK5_1 / 2];
    }
    sum += (Fp16ToFp32(x[i].d) * Fp16ToFp32(y[i].d)) * static_cast<float>(sumi) +
           Fp16ToFp32(x[i].m) * Fp16ToFp32(y[i].s);
  }
  return sum;
}

float VecDotQ8_0Q8_0(int64_t n, const BlockQ8_0* x, const BlockQ8_0* y) {
  const int64_t nb = n / kQK8_0;
  float sum = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < kQK8_0; ++j) sumi += x[i].qs[j] * y[i].qs[j];
    sum += static_cast<float>(sumi) * (Fp16ToFp32(x[i].d) * Fp16ToFp32(y[i].d));
  }
  return sum;
}

}  // namespace fucina
