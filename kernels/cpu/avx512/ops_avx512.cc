// AVX-512 (F/BW/VL/DQ) paths of the transformer ops (contracts in kernels/cpu/ops_isa.h).
// Same algorithms as the AVX2 file at 16 lanes; row tails use lane masks instead of scalar
// loops. Like that file, it calls no inline function from shared headers.
// GCC 12's avx512fintrin.h passes _mm512_undefined_*() as the pass-through operand of unmasked
// intrinsics (roundscale, cvtph, reductions), which -Wmaybe-uninitialized reports falsely.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/ops_isa.h"

namespace fucina::avx512 {
namespace {

// exp(x) for 16 lanes: as the AVX2 Exp8 (Cody-Waite reduction, degree-7 Taylor), with the
// 2^n scaling done by vscalefps, which handles overflow to inf and gradual underflow itself.
inline __m512 Exp16(__m512 x) {
  // max/min return the second operand when one is NaN: NaN propagates.
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 TailMask(int64_t k) {
  return static_cast<__mmask16>((1u << static_cast<unsigned>(k)) - 1u);
}

inline __m512 LoadF16(const f16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 MaskLoadF16(__mmask16 m, const f16_t* p) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

inline __m512 LoadQ8(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline float HalfToFloat(f16_t h) { return _cvtsh_ss(h); }

inline float SqrtScalar(float x) { return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x))); }

inline __m512 Silu16(__m512 x) {
  const __m512 e = Exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

inline __m512 GeluTanh16(__m512 x) {
  // 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi) x (1 + 0.044715 x^2).
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 inner = _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x2, _mm512_set1_ps(1.0f));
  const __m512 m2u = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0f * 0.79788456080286535f), x),
                                   inner);
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), Exp16(m2u)));
}

template <typename F>
inline void Map(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, f(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

}  // namespace

void ExpF32(const float* x, float* y, int64_t n) { Map(x, y, n, Exp16); }

void Silu(const float* x, float* y, int64_t n) { Map(x, y, n, Silu16); }

void GeluTanh(const float* x, float* y, int64_t n) { Map(x, y, n, GeluTanh16); }

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(i + 16 <= n ? 16 : n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 u = _mm512_maskz_loadu_ps(m, up + i);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(Silu16(g), u));
  }
}

void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t n,
             float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
      const __m512 v0 = _mm512_loadu_ps(xr + j), v1 = _mm512_loadu_ps(xr + j + 16);
      const __m512 v2 = _mm512_loadu_ps(xr + j + 32), v3 = _mm512_loadu_ps(xr + j + 48);
      a0 = _mm512_fmadd_ps(v0, v0, a0);
      a1 = _mm512_fmadd_ps(v1, v1, a1);
      a2 = _mm512_fmadd_ps(v2, v2, a2);
      a3 = _mm512_fmadd_ps(v3, v3, a3);
    }
    for (; j < n; j += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(TailMask(j + 16 <= n ? 16 : n - j), xr + j);
      a0 = _mm512_fmadd_ps(v, v, a0);
    }
    const float sum =
        _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    const __m512 vs = _mm512_set1_ps(1.0f / SqrtScalar(sum / static_cast<float>(n) + eps));
    for (j = 0; j < n; j += 16) {
      const __mmask16 m = TailMask(j + 16 <= n ? 16 : n - j);
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + j), vs);
      if (weight != nullptr) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + j));
      _mm512_mask_storeu_ps(yr + j, m, v);
    }
  }
}

void Softmax(float* x, int64_t rows, int64_t n, float scale, const float* mask,
             int64_t mask_row_stride) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const float* mr = mask != nullptr ? mask + r * mask_row_stride : nullptr;
    __m512 vmax = neg_inf;
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = TailMask(j + 16 <= n ? 16 : n - j);
      __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + j), vscale);
      if (mr != nullptr) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(m, mr + j));
      _mm512_mask_storeu_ps(xr + j, m, y);
      vmax = _mm512_mask_max_ps(vmax, m, vmax, y);  // lanes past the end keep -inf.
    }
    const float row_max = _mm512_reduce_max_ps(vmax);
    if (row_max == -__builtin_inff()) {
      for (int64_t j = 0; j < n; ++j) xr[j] = 0.0f;
      continue;
    }
    const __m512 vm = _mm512_set1_ps(row_max);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = TailMask(j + 16 <= n ? 16 : n - j);
      const __m512 e = _mm512_maskz_mov_ps(
          m, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, xr + j), vm)));
      _mm512_mask_storeu_ps(xr + j, m, e);
      vsum = _mm512_add_ps(vsum, e);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = TailMask(j + 16 <= n ? 16 : n - j);
      _mm512_mask_storeu_ps(xr + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + j), inv));
    }
  }
}

// ---- Attention tiles. ----

namespace {

inline const uint8_t* Row(const void* base, int64_t stride_bytes, int t) {
  return static_cast<const uint8_t*>(base) + t * stride_bytes;
}

// `load(m, d)` gives 16 values at dim d with lanes outside mask m zero.
template <typename Load>
inline float Dot(const float* q, int head_dim, Load load) {
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  int d = 0;
  for (; d + 32 <= head_dim; d += 32) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), load(__mmask16(0xFFFF), d), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + d + 16), load(__mmask16(0xFFFF), d + 16), a1);
  }
  for (; d < head_dim; d += 16) {
    const __mmask16 m = TailMask(d + 16 <= head_dim ? 16 : head_dim - d);
    a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), load(m, d), a0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// acc[d] += sum_t p[t] * row_t[d] with 4 registers (64 dims) live across the tile;
// `load(t, m, d)` gives 16 values of row t at dim d (lanes outside m zero).
template <typename Load>
inline void Accum(const float* p, int n_keys, int head_dim, float* acc, Load load) {
  const __mmask16 all = 0xFFFF;
  int d = 0;
  for (; d + 64 <= head_dim; d += 64) {
    __m512 c0 = _mm512_loadu_ps(acc + d), c1 = _mm512_loadu_ps(acc + d + 16);
    __m512 c2 = _mm512_loadu_ps(acc + d + 32), c3 = _mm512_loadu_ps(acc + d + 48);
    for (int t = 0; t < n_keys; ++t) {
      const __m512 w = _mm512_set1_ps(p[t]);
      c0 = _mm512_fmadd_ps(w, load(t, all, d), c0);
      c1 = _mm512_fmadd_ps(w, load(t, all, d + 16), c1);
      c2 = _mm512_fmadd_ps(w, load(t, all, d + 32), c2);
      c3 = _mm512_fmadd_ps(w, load(t, all, d + 48), c3);
    }
    _mm512_storeu_ps(acc + d, c0);
    _mm512_storeu_ps(acc + d + 16, c1);
    _mm512_storeu_ps(acc + d + 32, c2);
    _mm512_storeu_ps(acc + d + 48, c3);
  }
  for (; d < head_dim; d += 16) {
    const __mmask16 m = TailMask(d + 16 <= head_dim ? 16 : head_dim - d);
    __m512 c = _mm512_maskz_loadu_ps(m, acc + d);
    for (int t = 0; t < n_keys; ++t) c = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), load(t, m, d), c);
    _mm512_mask_storeu_ps(acc + d, m, c);
  }
}

}  // namespace

void AttnScoresF32(const float* q, const void* k, int64_t stride_bytes, int n_keys, int head_dim,
                   float* s) {
  for (int t = 0; t < n_keys; ++t) {
    const float* row = reinterpret_cast<const float*>(Row(k, stride_bytes, t));
    s[t] = Dot(q, head_dim, [&](__mmask16 m, int d) { return _mm512_maskz_loadu_ps(m, row + d); });
  }
}

void AttnScoresF16(const float* q, const void* k, int64_t stride_bytes, int n_keys, int head_dim,
                   float* s) {
  for (int t = 0; t < n_keys; ++t) {
    const f16_t* row = reinterpret_cast<const f16_t*>(Row(k, stride_bytes, t));
    s[t] = Dot(q, head_dim, [&](__mmask16 m, int d) {
      return m == 0xFFFF ? LoadF16(row + d) : MaskLoadF16(m, row + d);
    });
  }
}

void AttnScoresQ8_0(const float* q, const void* k, int64_t stride_bytes, int n_keys,
                    int head_dim, float* s) {
  const int nb = head_dim / kQK8_0;
  for (int t = 0; t < n_keys; ++t) {
    const BlockQ8_0* row = reinterpret_cast<const BlockQ8_0*>(Row(k, stride_bytes, t));
    __m512 acc = _mm512_setzero_ps();
    for (int b = 0; b < nb; ++b) {
      const float* qb = q + b * kQK8_0;
      __m512 bs = _mm512_mul_ps(_mm512_loadu_ps(qb), LoadQ8(row[b].qs));
      bs = _mm512_fmadd_ps(_mm512_loadu_ps(qb + 16), LoadQ8(row[b].qs + 16), bs);
      acc = _mm512_fmadd_ps(_mm512_set1_ps(HalfToFloat(row[b].d)), bs, acc);
    }
    s[t] = _mm512_reduce_add_ps(acc);
  }
}

void AttnAccumF32(const float* p, const void* v, int64_t stride_bytes, int n_keys, int head_dim,
                  float* acc) {
  Accum(p, n_keys, head_dim, acc, [&](int t, __mmask16 m, int d) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(Row(v, stride_bytes, t)) + d);
  });
}

void AttnAccumF16(const float* p, const void* v, int64_t stride_bytes, int n_keys, int head_dim,
                  float* acc) {
  Accum(p, n_keys, head_dim, acc, [&](int t, __mmask16 m, int d) {
    const f16_t* row = reinterpret_cast<const f16_t*>(Row(v, stride_bytes, t)) + d;
    return m == 0xFFFF ? LoadF16(row) : MaskLoadF16(m, row);
  });
}

void AttnAccumQ8_0(const float* p, const void* v, int64_t stride_bytes, int n_keys, int head_dim,
                   float* acc) {
  const int nb = head_dim / kQK8_0;
  for (int b = 0; b < nb; ++b) {
    float* a = acc + b * kQK8_0;
    __m512 c0 = _mm512_loadu_ps(a), c1 = _mm512_loadu_ps(a + 16);
    for (int t = 0; t < n_keys; ++t) {
      const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(Row(v, stride_bytes, t))[b];
      const __m512 w = _mm512_set1_ps(p[t] * HalfToFloat(blk.d));
      c0 = _mm512_fmadd_ps(w, LoadQ8(blk.qs), c0);
      c1 = _mm512_fmadd_ps(w, LoadQ8(blk.qs + 16), c1);
    }
    _mm512_storeu_ps(a, c0);
    _mm512_storeu_ps(a + 16, c1);
  }
}

}  // namespace fucina::avx512
