// AVX2 + FMA + F16C paths of the transformer ops (contracts in kernels/cpu/ops_isa.h).
//
// Everything here lives in fucina::avx2 or an unnamed namespace and calls no inline function
// from shared headers, so no AVX2-encoded copy of a shared inline symbol can be picked by the
// linker for code that runs on older CPUs.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/ops_isa.h"

namespace fucina::avx2 {
namespace {

// exp(x) for 8 lanes. x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite split of ln2), exp(r) by its
// degree-7 Taylor polynomial (truncation < 6e-9 relative), then scaled by 2^n as two factors
// 2^(n/2) * 2^(n - n/2) so that every n in the clamped range [-150, 129] stays a normal power
// of two and over/underflow happen in the final multiply, correctly rounded to inf / subnormal.
inline __m256 Exp8(__m256 x) {
  // max(lo, x) and min(hi, x) return x when x is NaN (second operand), so NaN propagates.
  x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane mask with the first `k` (0..8) lanes set, for maskload/maskstore of row tails.
inline __m256i TailMask(int64_t k) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(k)), idx);
}

inline __m256 LoadF16(const f16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline __m256 LoadQ8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline float HalfToFloat(f16_t h) { return _cvtsh_ss(h); }

inline float SqrtScalar(float x) { return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x))); }

inline __m256 Silu8(__m256 x) {
  const __m256 e = Exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

inline __m256 GeluTanh8(__m256 x) {
  // 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)), u = sqrt(2/pi) x (1 + 0.044715 x^2).
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 inner = _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x2, _mm256_set1_ps(1.0f));
  const __m256 m2u = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.79788456080286535f), x),
                                   inner);
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), Exp8(m2u)));
}

// Applies f to n floats of x into y, 8 at a time, the tail through masked loads/stores.
template <typename F>
inline void Map(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(y + i, m, f(_mm256_maskload_ps(x + i, m)));
  }
}

}  // namespace

void ExpF32(const float* x, float* y, int64_t n) { Map(x, y, n, Exp8); }

void Silu(const float* x, float* y, int64_t n) { Map(x, y, n, Silu8); }

void GeluTanh(const float* x, float* y, int64_t n) { Map(x, y, n, GeluTanh8); }

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 u = _mm256_loadu_ps(up + i);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(Silu8(g), u));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 g = _mm256_maskload_ps(gate + i, m);
    const __m256 u = _mm256_maskload_ps(up + i, m);
    _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(Silu8(g), u));
  }
}

void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t n,
             float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = out + r * n;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
      const __m256 v0 = _mm256_loadu_ps(xr + j), v1 = _mm256_loadu_ps(xr + j + 8);
      const __m256 v2 = _mm256_loadu_ps(xr + j + 16), v3 = _mm256_loadu_ps(xr + j + 24);
      a0 = _mm256_fmadd_ps(v0, v0, a0);
      a1 = _mm256_fmadd_ps(v1, v1, a1);
      a2 = _mm256_fmadd_ps(v2, v2, a2);
      a3 = _mm256_fmadd_ps(v3, v3, a3);
    }
    for (; j + 8 <= n; j += 8) {
      const __m256 v = _mm256_loadu_ps(xr + j);
      a0 = _mm256_fmadd_ps(v, v, a0);
    }
    if (j < n) {
      const __m256 v = _mm256_maskload_ps(xr + j, TailMask(n - j));
      a1 = _mm256_fmadd_ps(v, v, a1);
    }
    const float sum = HorizontalSum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    const float scale = 1.0f / SqrtScalar(sum / static_cast<float>(n) + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    auto apply = [&](int64_t k, __m256 v) {
      v = _mm256_mul_ps(v, vs);
      return weight != nullptr ? _mm256_mul_ps(v, _mm256_loadu_ps(weight + k)) : v;
    };
    for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(yr + j, apply(j, _mm256_loadu_ps(xr + j)));
    if (j < n) {
      const __m256i m = TailMask(n - j);
      __m256 v = _mm256_mul_ps(_mm256_maskload_ps(xr + j, m), vs);
      if (weight != nullptr) v = _mm256_mul_ps(v, _mm256_maskload_ps(weight + j, m));
      _mm256_maskstore_ps(yr + j, m, v);
    }
  }
}

void Softmax(float* x, int64_t rows, int64_t n, float scale, const float* mask,
             int64_t mask_row_stride) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const float* mr = mask != nullptr ? mask + r * mask_row_stride : nullptr;
    // Pass 1: logits (scale * x + mask) written back, running max.
    __m256 vmax = neg_inf;
    int64_t j = 0;
    for (; j < n; j += 8) {
      const bool full = j + 8 <= n;
      const __m256i m = TailMask(full ? 8 : n - j);
      __m256 y = _mm256_mul_ps(_mm256_maskload_ps(xr + j, m), vscale);
      if (mr != nullptr) y = _mm256_add_ps(y, _mm256_maskload_ps(mr + j, m));
      _mm256_maskstore_ps(xr + j, m, y);
      // Lanes past the end must not raise the max.
      vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(neg_inf, y, _mm256_castsi256_ps(m)));
    }
    const float row_max = HorizontalMax(vmax);
    if (row_max == -__builtin_inff()) {
      for (j = 0; j < n; ++j) xr[j] = 0.0f;
      continue;
    }
    // Pass 2: exponentials and their sum (tail lanes masked out of both).
    const __m256 vm = _mm256_set1_ps(row_max);
    __m256 vsum = _mm256_setzero_ps();
    for (j = 0; j < n; j += 8) {
      const __m256i m = TailMask(j + 8 <= n ? 8 : n - j);
      const __m256 e = Exp8(_mm256_sub_ps(_mm256_maskload_ps(xr + j, m), vm));
      const __m256 em = _mm256_and_ps(e, _mm256_castsi256_ps(m));
      _mm256_maskstore_ps(xr + j, m, em);
      vsum = _mm256_add_ps(vsum, em);
    }
    // Pass 3: normalize.
    const __m256 inv = _mm256_set1_ps(1.0f / HorizontalSum(vsum));
    for (j = 0; j < n; j += 8) {
      const __m256i m = TailMask(j + 8 <= n ? 8 : n - j);
      _mm256_maskstore_ps(xr + j, m, _mm256_mul_ps(_mm256_maskload_ps(xr + j, m), inv));
    }
  }
}

// ---- Attention tiles. ----

namespace {

inline const uint8_t* Row(const void* base, int64_t stride_bytes, int t) {
  return static_cast<const uint8_t*>(base) + t * stride_bytes;
}

// Dot of q with one row whose 8-lane chunks come from `load(d)`; scalar `at(d)` for the tail.
template <typename Load, typename At>
inline float Dot(const float* q, int head_dim, Load load, At at) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int d = 0;
  for (; d + 16 <= head_dim; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load(d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), load(d + 8), a1);
  }
  for (; d + 8 <= head_dim; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load(d), a0);
  float sum = HorizontalSum(_mm256_add_ps(a0, a1));
  for (; d < head_dim; ++d) sum += q[d] * at(d);
  return sum;
}

// acc[d] += sum_t p[t] * row_t[d], keeping 4 accumulator registers (32 dims) live across
// all rows of the tile; `load(t, d)` gives 8 values of row t at dim d, `at(t, d)` one.
template <typename Load, typename At>
inline void Accum(const float* p, int n_keys, int head_dim, float* acc, Load load, At at) {
  int d = 0;
  for (; d + 32 <= head_dim; d += 32) {
    __m256 c0 = _mm256_loadu_ps(acc + d), c1 = _mm256_loadu_ps(acc + d + 8);
    __m256 c2 = _mm256_loadu_ps(acc + d + 16), c3 = _mm256_loadu_ps(acc + d + 24);
    for (int t = 0; t < n_keys; ++t) {
      const __m256 w = _mm256_set1_ps(p[t]);
      c0 = _mm256_fmadd_ps(w, load(t, d), c0);
      c1 = _mm256_fmadd_ps(w, load(t, d + 8), c1);
      c2 = _mm256_fmadd_ps(w, load(t, d + 16), c2);
      c3 = _mm256_fmadd_ps(w, load(t, d + 24), c3);
    }
    _mm256_storeu_ps(acc + d, c0);
    _mm256_storeu_ps(acc + d + 8, c1);
    _mm256_storeu_ps(acc + d + 16, c2);
    _mm256_storeu_ps(acc + d + 24, c3);
  }
  for (; d + 8 <= head_dim; d += 8) {
    __m256 c = _mm256_loadu_ps(acc + d);
    for (int t = 0; t < n_keys; ++t) c = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load(t, d), c);
    _mm256_storeu_ps(acc + d, c);
  }
  for (; d < head_dim; ++d) {
    for (int t = 0; t < n_keys; ++t) acc[d] += p[t] * at(t, d);
  }
}

}  // namespace

void AttnScoresF32(const float* q, const void* k, int64_t stride_bytes, int n_keys, int head_dim,
                   float* s) {
  for (int t = 0; t < n_keys; ++t) {
    const float* row = reinterpret_cast<const float*>(Row(k, stride_bytes, t));
    s[t] = Dot(
        q, head_dim, [&](int d) { return _mm256_loadu_ps(row + d); },
        [&](int d) { return row[d]; });
  }
}

void AttnScoresF16(const float* q, const void* k, int64_t stride_bytes, int n_keys, int head_dim,
                   float* s) {
  for (int t = 0; t < n_keys; ++t) {
    const f16_t* row = reinterpret_cast<const f16_t*>(Row(k, stride_bytes, t));
    s[t] = Dot(
        q, head_dim, [&](int d) { return LoadF16(row + d); },
        [&](int d) { return HalfToFloat(row[d]); });
  }
}

void AttnScoresQ8_0(const float* q, const void* k, int64_t stride_bytes, int n_keys,
                    int head_dim, float* s) {
  const int nb = head_dim / kQK8_0;
  for (int t = 0; t < n_keys; ++t) {
    const BlockQ8_0* row = reinterpret_cast<const BlockQ8_0*>(Row(k, stride_bytes, t));
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
      const float* qb = q + b * kQK8_0;
      const int8_t* qs = row[b].qs;
      // sum_j q[j] * qs[j] over the block, then one multiply by the block scale.
      __m256 bs = _mm256_mul_ps(_mm256_loadu_ps(qb), LoadQ8(qs));
      bs = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 8), LoadQ8(qs + 8), bs);
      bs = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 16), LoadQ8(qs + 16), bs);
      bs = _mm256_fmadd_ps(_mm256_loadu_ps(qb + 24), LoadQ8(qs + 24), bs);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(HalfToFloat(row[b].d)), bs, acc);
    }
    s[t] = HorizontalSum(acc);
  }
}

void AttnAccumF32(const float* p, const void* v, int64_t stride_bytes, int n_keys, int head_dim,
                  float* acc) {
  auto row = [&](int t) { return reinterpret_cast<const float*>(Row(v, stride_bytes, t)); };
  Accum(
      p, n_keys, head_dim, acc, [&](int t, int d) { return _mm256_loadu_ps(row(t) + d); },
      [&](int t, int d) { return row(t)[d]; });
}

void AttnAccumF16(const float* p, const void* v, int64_t stride_bytes, int n_keys, int head_dim,
                  float* acc) {
  auto row = [&](int t) { return reinterpret_cast<const f16_t*>(Row(v, stride_bytes, t)); };
  Accum(
      p, n_keys, head_dim, acc, [&](int t, int d) { return LoadF16(row(t) + d); },
      [&](int t, int d) { return HalfToFloat(row(t)[d]); });
}

void AttnAccumQ8_0(const float* p, const void* v, int64_t stride_bytes, int n_keys, int head_dim,
                   float* acc) {
  // One block (32 dims) of accumulators at a time; the weight of row t in block b is
  // p[t] * d_tb, so the int8 values are converted and used by a single FMA each.
  const int nb = head_dim / kQK8_0;
  for (int b = 0; b < nb; ++b) {
    float* a = acc + b * kQK8_0;
    __m256 c0 = _mm256_loadu_ps(a), c1 = _mm256_loadu_ps(a + 8);
    __m256 c2 = _mm256_loadu_ps(a + 16), c3 = _mm256_loadu_ps(a + 24);
    for (int t = 0; t < n_keys; ++t) {
      const BlockQ8_0& blk = reinterpret_cast<const BlockQ8_0*>(Row(v, stride_bytes, t))[b];
      const __m256 w = _mm256_set1_ps(p[t] * HalfToFloat(blk.d));
      c0 = _mm256_fmadd_ps(w, LoadQ8(blk.qs), c0);
      c1 = _mm256_fmadd_ps(w, LoadQ8(blk.qs + 8), c1);
      c2 = _mm256_fmadd_ps(w, LoadQ8(blk.qs + 16), c2);
      c3 = _mm256_fmadd_ps(w, LoadQ8(blk.qs + 24), c3);
    }
    _mm256_storeu_ps(a, c0);
    _mm256_storeu_ps(a + 8, c1);
    _mm256_storeu_ps(a + 16, c2);
    _mm256_storeu_ps(a + 24, c3);
  }
}

}  // namespace fucina::avx2
