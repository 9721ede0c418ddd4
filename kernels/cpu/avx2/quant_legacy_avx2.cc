// AVX2 + FMA + F16C paths for kernels/quant/legacy.h (FUCINA_LEGACY_ISA_DECLS).
//
// Conversions and quantizers are bit-exact with the scalar references in
// kernels/cpu/quant_legacy.cc; dots differ only by float summation order.
//
// Precondition of the integer dots (as in ggml's AVX2 code): the Q8 activations' quants are
// in [-127, 127], which is all QuantizeRowQ8_0/Q8_1 produce. The sign trick below computes
// |x| * (y * sign(x)) with _mm256_maddubs_epi16, and negating y = -128 would wrap.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/legacy.h"

namespace fucina::avx2 {
namespace {

constexpr int kLanes = 8;  // f32 lanes of a __m256.

// F16C conversions: exact for half -> float, round-to-nearest-even for float -> half, which
// equals Fp32ToFp16 for every non-NaN input.
inline float HalfToFloat(f16_t h) { return _cvtsh_ss(h); }
inline f16_t FloatToHalf(float f) {
  return static_cast<f16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Float -> half for 8 lanes with the scalar NaN rule: any NaN becomes sign | 0x7E00. F16C
// would keep the payload's top bits, so NaNs are first replaced by the canonical quiet NaN.
inline __m128i ConvertToHalf(__m256 v) {
  const __m256 sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0f));
  const __m256 quiet_nan = _mm256_or_ps(sign, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)));
  v = _mm256_blendv_ps(v, quiet_nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

inline __m256 LoadHalf(const f16_t* x) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
}

inline __m256 LoadBf16(const bf16_t* x) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// roundf semantics (half away from zero) on 8 lanes. trunc(v) then +-1 where |v - trunc(v)|
// >= 0.5; v - trunc(v) is exact (same sign, |trunc(v)| <= |v| < 2 |trunc(v)| or trunc = 0).
inline __m256 RoundHalfAwayFromZero(__m256 v) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(v, t));
  const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign_bit), _mm256_set1_ps(1.0f));
  const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  return _mm256_add_ps(t, _mm256_and_ps(up, step));
}

// Quantizes one block of 32 floats to int8 with roundf(x * id) into qs; returns the f32
// scale d = amax / 127 and, via sum_out, the sum of the quants.
inline float QuantizeBlock8(const float* x, int8_t* qs, int* sum_out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + k * kLanes);
  const __m256 amax_v = _mm256_max_ps(
      _mm256_max_ps(_mm256_and_ps(v[0], abs_mask), _mm256_and_ps(v[1], abs_mask)),
      _mm256_max_ps(_mm256_and_ps(v[2], abs_mask), _mm256_and_ps(v[3], abs_mask)));
  const float d = HorizontalMax(amax_v) / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m256 idv = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    q[k] = _mm256_cvtps_epi32(RoundHalfAwayFromZero(_mm256_mul_ps(v[k], idv)));
  }
  if (sum_out != nullptr) {
    *sum_out = HorizontalSum(
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  }
  // packs interleave the two 128-bit halves; the permute restores element order.
  const __m256i q01 = _mm256_packs_epi32(q[0], q[1]);
  const __m256i q23 = _mm256_packs_epi32(q[2], q[3]);
  const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23),
                                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), packed);
  return d;
}

// ---- Integer block sums: 8 int32 lanes whose total is the block's sum of q_x * q_y. ----

// Unsigned x (0..255, products with y must fit the int16 pair sums) times signed y.
inline __m256i SumU8I8(__m256i x, __m256i y) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
}

// Signed x times signed y via |x| * (y * sign(x)); see the file comment for y's range.
inline __m256i SumI8I8(__m256i x, __m256i y) {
  return SumU8I8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

inline __m256i BlockSum(const BlockQ8_0& x, const BlockQ8_0& y) {
  return SumI8I8(Load32(x.qs), Load32(y.qs));
}

inline __m256i BlockSum(const BlockQ4_0& x, const BlockQ8_0& y) {
  return SumI8I8(_mm256_sub_epi8(UnpackNibbles(x.qs), _mm256_set1_epi8(8)), Load32(y.qs));
}

inline __m256i BlockSum(const BlockQ4_1& x, const BlockQ8_1& y) {
  return SumU8I8(UnpackNibbles(x.qs), Load32(y.qs));
}

inline __m256i BlockSum(const BlockQ5_0& x, const BlockQ8_0& y) {
  // q - 16 as int8: the nibble when the 5th bit is set, else the nibble with 0xF0 on top.
  const __m256i high = _mm256_andnot_si256(BytesFromBits(x.qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
  return SumI8I8(_mm256_or_si256(UnpackNibbles(x.qs), high), Load32(y.qs));
}

inline __m256i BlockSum(const BlockQ5_1& x, const BlockQ8_1& y) {
  const __m256i high = _mm256_and_si256(BytesFromBits(x.qh), _mm256_set1_epi8(0x10));
  return SumU8I8(_mm256_or_si256(UnpackNibbles(x.qs), high), Load32(y.qs));
}

// The offset term m_x * s_y of the _1 formats (zero for the symmetric ones).
inline float OffsetTerm(const BlockQ4_1& x, const BlockQ8_1& y) {
  return HalfToFloat(x.m) * HalfToFloat(y.s);
}
inline float OffsetTerm(const BlockQ5_1& x, const BlockQ8_1& y) {
  return HalfToFloat(x.m) * HalfToFloat(y.s);
}
template <typename X, typename Y>
inline float OffsetTerm(const X&, const Y&) { return 0.0f; }

template <typename X, typename Y>
inline __m256 ScaledBlock(const X& x, const Y& y, __m256 acc) {
  const __m256 scale = _mm256_set1_ps(HalfToFloat(x.d) * HalfToFloat(y.d));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(BlockSum(x, y)), scale, acc);
}

// Four blocks per iteration into two independent accumulators (hides the FMA latency),
// then the 0..3 remaining blocks.
template <bool kHasOffset, typename X, typename Y>
float DotBlocks(int64_t n, const X* x, const Y* y) {
  const int64_t nb = n / 32;
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  float offsets = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    acc0 = ScaledBlock(x[i], y[i], acc0);
    acc1 = ScaledBlock(x[i + 1], y[i + 1], acc1);
    acc0 = ScaledBlock(x[i + 2], y[i + 2], acc0);
    acc1 = ScaledBlock(x[i + 3], y[i + 3], acc1);
    if constexpr (kHasOffset) {
      offsets += OffsetTerm(x[i], y[i]) + OffsetTerm(x[i + 1], y[i + 1]) +
                 OffsetTerm(x[i + 2], y[i + 2]) + OffsetTerm(x[i + 3], y[i + 3]);
    }
  }
  for (; i < nb; ++i) {
    acc0 = ScaledBlock(x[i], y[i], acc0);
    if constexpr (kHasOffset) offsets += OffsetTerm(x[i], y[i]);
  }
  return HorizontalSum(_mm256_add_ps(acc0, acc1)) + offsets;
}

// Float dots: 4 x 8 lanes per iteration, then 8 at a time, then a zero-padded last vector.
template <typename T, typename Load>
float DotFloat(int64_t n, const T* x, const float* y, Load load) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm256_fmadd_ps(load(x + i + k * kLanes), _mm256_loadu_ps(y + i + k * kLanes),
                               acc[k]);
    }
  }
  for (; i + kLanes <= n; i += kLanes) {
    acc[0] = _mm256_fmadd_ps(load(x + i), _mm256_loadu_ps(y + i), acc[0]);
  }
  if (i < n) {
    T xt[kLanes] = {};
    float yt[kLanes] = {};
    std::memcpy(xt, x + i, (n - i) * sizeof(T));
    std::memcpy(yt, y + i, (n - i) * sizeof(float));
    acc[1] = _mm256_fmadd_ps(load(xt), _mm256_loadu_ps(yt), acc[1]);
  }
  return HorizontalSum(
      _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

}  // namespace

void ConvertF32ToF16(const float* x, f16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), ConvertToHalf(_mm256_loadu_ps(x + i)));
  }
  if (i < n) {  // Same vector path on a padded copy so the tail follows the same rules.
    float xt[kLanes] = {};
    f16_t yt[kLanes];
    std::memcpy(xt, x + i, (n - i) * sizeof(float));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(yt), ConvertToHalf(_mm256_loadu_ps(xt)));
    std::memcpy(y + i, yt, (n - i) * sizeof(f16_t));
  }
}

void ConvertF16ToF32(const f16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(y + i, LoadHalf(x + i));
  if (i < n) {
    f16_t xt[kLanes] = {};
    float yt[kLanes];
    std::memcpy(xt, x + i, (n - i) * sizeof(f16_t));
    _mm256_storeu_ps(yt, LoadHalf(xt));
    std::memcpy(y + i, yt, (n - i) * sizeof(float));
  }
}

void ConvertBf16ToF32(const bf16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) _mm256_storeu_ps(y + i, LoadBf16(x + i));
  for (; i < n; ++i) y[i] = Bf16ToFp32(x[i]);  // A shift: no rounding to diverge.
}

void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n) {
  const int64_t nb = n / kQK8_0;
  for (int64_t i = 0; i < nb; ++i) {
    y[i].d = FloatToHalf(QuantizeBlock8(x + i * kQK8_0, y[i].qs, nullptr));
  }
}

void QuantizeRowQ8_1(const float* x, BlockQ8_1* y, int64_t n) {
  const int64_t nb = n / kQK8_1;
  for (int64_t i = 0; i < nb; ++i) {
    int sum = 0;
    const float d = QuantizeBlock8(x + i * kQK8_1, y[i].qs, &sum);
    y[i].d = FloatToHalf(d);
    y[i].s = FloatToHalf(static_cast<float>(sum) * d);
  }
}

float VecDotF32(int64_t n, const float* x, const float* y) {
  return DotFloat(n, x, y, [](const float* p) { return _mm256_loadu_ps(p); });
}

float VecDotF16F32(int64_t n, const f16_t* x, const float* y) {
  return DotFloat(n, x, y, [](const f16_t* p) { return LoadHalf(p); });
}

float VecDotBf16F32(int64_t n, const bf16_t* x, const float* y) {
  return DotFloat(n, x, y, [](const bf16_t* p) { return LoadBf16(p); });
}

float VecDotQ4_0Q8_0(int64_t n, const BlockQ4_0* x, const BlockQ8_0* y) {
  return DotBlocks<false>(n, x, y);
}

float VecDotQ4_1Q8_1(int64_t n, const BlockQ4_1* x, const BlockQ8_1* y) {
  return DotBlocks<true>(n, x, y);
}

float VecDotQ5_0Q8_0(int64_t n, const BlockQ5_0* x, const BlockQ8_0* y) {
  return DotBlocks<false>(n, x, y);
}

float VecDotQ5_1Q8_1(int64_t n, const BlockQ5_1* x, const BlockQ8_1* y) {
  return DotBlocks<true>(n, x, y);
}

float VecDotQ8_0Q8_0(int64_t n, const BlockQ8_0* x, const BlockQ8_0* y) {
  return DotBlocks<false>(n, x, y);
}

}  // namespace fucina::avx2
