// AVX-512 (F/BW/VL/DQ + VNNI) paths for kernels/quant/legacy.h (FUCINA_LEGACY_ISA_DECLS).
//
// Conversions and quantizers are bit-exact with the scalar references in
// kernels/cpu/quant_legacy.cc; dots differ only by float summation order. Tails use masked
// loads/stores, so every n goes through the same vector code.
//
// The integer dots process two blocks per 512-bit register with VNNI's vpdpbusd (u8 x s8,
// four products summed into each int32 lane, no saturation). Signed x is handled by the
// offset identity sum((x + c) * y) - c * sum(y), with both terms from vpdpbusd, so unlike the
// AVX2 sign trick every int8 activation value (including -128) is exact. AVX512_BF16
// instructions are not used: the Isa::kAvx512 level does not imply them.
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() (a self-initialized variable) as the
// pass-through of unmasked builtins, which -W(maybe-)uninitialized reports at -O3 inside the
// header. Silenced for the header's own lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/avx512_util.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/legacy.h"

namespace fucina::avx512 {
namespace {

constexpr int kLanes = 16;  // f32 lanes of a __m512.

inline __mmask16 TailMask(int64_t remaining) {
  return remaining >= kLanes ? static_cast<__mmask16>(0xFFFF)
                             : static_cast<__mmask16>((1u << remaining) - 1);
}

inline float HalfToFloat(f16_t h) { return _cvtsh_ss(h); }
inline f16_t FloatToHalf(float f) {
  return static_cast<f16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Float -> half with the scalar NaN rule (sign | 0x7E00); see the AVX2 twin.
inline __m256i ConvertToHalf(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i quiet_nan = _mm512_or_si512(
      _mm512_and_si512(bits, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
      _mm512_set1_epi32(0x7FC00000));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  v = _mm512_castsi512_ps(_mm512_mask_mov_epi32(bits, is_nan, quiet_nan));
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

inline __m512 LoadHalf(const f16_t* x, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x));
}

inline __m512 LoadBf16(const bf16_t* x, __mmask16 m) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

inline __m512 LoadF32(const float* x, __mmask16 m) { return _mm512_maskz_loadu_ps(m, x); }

// roundf semantics (half away from zero); see the AVX2 twin for why v - trunc(v) is exact.
inline __m512 RoundHalfAwayFromZero(__m512 v) {
  const __m512i sign_bit = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
  const __m512 step = _mm512_castsi512_ps(_mm512_or_si512(
      _mm512_and_si512(_mm512_castps_si512(v), sign_bit), _mm512_castps_si512(_mm512_set1_ps(1.0f))));
  const __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  return _mm512_mask_add_ps(t, up, t, step);
}

// One block of 32 floats -> int8 quants (roundf(x * id)); returns d = amax / 127 in f32.
inline float QuantizeBlock8(const float* x, int8_t* qs, int* sum_out) {
  const __m512 v0 = _mm512_loadu_ps(x);
  const __m512 v1 = _mm512_loadu_ps(x + kLanes);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const float d = amax / 127;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const __m512 idv = _mm512_set1_ps(id);
  const __m512i q0 = _mm512_cvtps_epi32(RoundHalfAwayFromZero(_mm512_mul_ps(v0, idv)));
  const __m512i q1 = _mm512_cvtps_epi32(RoundHalfAwayFromZero(_mm512_mul_ps(v1, idv)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + kLanes), _mm512_cvtsepi32_epi8(q1));
  if (sum_out != nullptr) *sum_out = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
  return d;
}

// ---- Integer sums of two blocks a, b: int32 lanes 0..7 total block a, 8..15 block b. ----

// sum(u * y) for unsigned u, minus `offset` * sum(y) (the offset that made u unsigned).
inline __m512i SumU8I8(__m512i u, __m512i y, char offset) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i dot = _mm512_dpbusd_epi32(zero, u, y);
  if (offset == 0) return dot;
  return _mm512_sub_epi32(dot, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(offset), y));
}

inline __m512i PairSum(const BlockQ8_0& xa, const BlockQ8_0& xb, const BlockQ8_0& ya,
                       const BlockQ8_0& yb) {
  // x + 128 as u8 is x with its sign bit flipped.
  const __m512i u = _mm512_xor_si512(LoadQs(xa.qs, xb.qs), _mm512_set1_epi8(static_cast<char>(0x80)));
  return SumU8I8(u, LoadQs(ya.qs, yb.qs), static_cast<char>(0x80));
}

inline __m512i PairSum(const BlockQ4_0& xa, const BlockQ4_0& xb, const BlockQ8_0& ya,
                       const BlockQ8_0& yb) {
  return SumU8I8(UnpackNibbles(xa.qs, xb.qs), LoadQs(ya.qs, yb.qs), 8);
}

inline __m512i PairSum(const BlockQ4_1& xa, const BlockQ4_1& xb, const BlockQ8_1& ya,
                       const BlockQ8_1& yb) {
  return SumU8I8(UnpackNibbles(xa.qs, xb.qs), LoadQs(ya.qs, yb.qs), 0);
}

inline __m512i PairSum(const BlockQ5_0& xa, const BlockQ5_0& xb, const BlockQ8_0& ya,
                       const BlockQ8_0& yb) {
  const __m512i with_high = AddHighBits(UnpackNibbles(xa.qs, xb.qs), xa.qh, xb.qh);
  return SumU8I8(with_high, LoadQs(ya.qs, yb.qs), 16);
}

inline __m512i PairSum(const BlockQ5_1& xa, const BlockQ5_1& xb, const BlockQ8_1& ya,
                       const BlockQ8_1& yb) {
  const __m512i with_high = AddHighBits(UnpackNibbles(xa.qs, xb.qs), xa.qh, xb.qh);
  return SumU8I8(with_high, LoadQs(ya.qs, yb.qs), 0);
}

inline float OffsetTerm(const BlockQ4_1& x, const BlockQ8_1& y) {
  return HalfToFloat(x.m) * HalfToFloat(y.s);
}
inline float OffsetTerm(const BlockQ5_1& x, const BlockQ8_1& y) {
  return HalfToFloat(x.m) * HalfToFloat(y.s);
}
template <typename X, typename Y>
inline float OffsetTerm(const X&, const Y&) { return 0.0f; }

template <typename X, typename Y>
inline __m512 ScaledPair(const X& xa, const X& xb, const Y& ya, const Y& yb, __m512 acc) {
  const __m512 scale = _mm512_mask_blend_ps(
      static_cast<__mmask16>(0xFF00), _mm512_set1_ps(HalfToFloat(xa.d) * HalfToFloat(ya.d)),
      _mm512_set1_ps(HalfToFloat(xb.d) * HalfToFloat(yb.d)));
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(PairSum(xa, xb, ya, yb)), scale, acc);
}

// Four blocks (two pairs) per iteration into two accumulators; a last odd block is paired
// with all-zero blocks (scale 0, quants 0), which add exactly nothing.
template <bool kHasOffset, typename X, typename Y>
float DotBlocks(int64_t n, const X* x, const Y* y) {
  static constexpr X kZeroX{};
  static constexpr Y kZeroY{};
  const int64_t nb = n / 32;
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  float offsets = 0.0f;
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    acc0 = ScaledPair(x[i], x[i + 1], y[i], y[i + 1], acc0);
    acc1 = ScaledPair(x[i + 2], x[i + 3], y[i + 2], y[i + 3], acc1);
    if constexpr (kHasOffset) {
      offsets += OffsetTerm(x[i], y[i]) + OffsetTerm(x[i + 1], y[i + 1]) +
                 OffsetTerm(x[i + 2], y[i + 2]) + OffsetTerm(x[i + 3], y[i + 3]);
    }
  }
  for (; i + 2 <= nb; i += 2) {
    acc0 = ScaledPair(x[i], x[i + 1], y[i], y[i + 1], acc0);
    if constexpr (kHasOffset) offsets += OffsetTerm(x[i], y[i]) + OffsetTerm(x[i + 1], y[i + 1]);
  }
  if (i < nb) {
    acc1 = ScaledPair(x[i], kZeroX, y[i], kZeroY, acc1);
    if constexpr (kHasOffset) offsets += OffsetTerm(x[i], y[i]);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + offsets;
}

// Float dots: 4 x 16 lanes per iteration, then 16 at a time, then one masked vector.
template <typename T, typename Load>
float DotFloat(int64_t n, const T* x, const float* y, Load load) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  const __mmask16 all = static_cast<__mmask16>(0xFFFF);
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm512_fmadd_ps(load(x + i + k * kLanes, all), _mm512_loadu_ps(y + i + k * kLanes),
                               acc[k]);
    }
  }
  for (; i < n; i += kLanes) {
    const __mmask16 m = TailMask(n - i);
    acc[0] = _mm512_fmadd_ps(load(x + i, m), _mm512_maskz_loadu_ps(m, y + i), acc[0]);
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

}  // namespace

void ConvertF32ToF16(const float* x, f16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = TailMask(n - i);
    _mm256_mask_storeu_epi16(y + i, m, ConvertToHalf(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

void ConvertF16ToF32(const f16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, LoadHalf(x + i, m));
  }
}

void ConvertBf16ToF32(const bf16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += kLanes) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, LoadBf16(x + i, m));
  }
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
  return DotFloat(n, x, y, LoadF32);
}

float VecDotF16F32(int64_t n, const f16_t* x, const float* y) {
  return DotFloat(n, x, y, LoadHalf);
}

float VecDotBf16F32(int64_t n, const bf16_t* x, const float* y) {
  return DotFloat(n, x, y, LoadBf16);
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

}  // namespace fucina::avx512
