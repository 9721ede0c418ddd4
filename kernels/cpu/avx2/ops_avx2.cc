// AVX2 + FMA + F16C paths of the transformer ops (contracts in kernels/cpu/ops_isa.h).
//
// Everything here lives in fucina::avx2 or an unnamed namespace, and the shared AVX2 helpers
// (avx2_util.h) are static inline, so no AVX2-encoded copy of a shared inline symbol can be
// picked by the linker for code that runs on older CPUs.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/avx2/avx2_util.h"
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

// tanh(t): (1 - e) / (1 + e) with e = exp(-2|t|) and t's sign, or below |t| = 1/4, where
// 1 - e cancels, t + t^3 P(t^2) (Taylor to t^11; the next term is < 1e-10 relative there).
inline __m256 Tanh8(__m256 t) {
  const __m256 sign = _mm256_and_ps(t, _mm256_set1_ps(-0.0f));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), t);
  const __m256 e = Exp8(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
  const __m256 big = _mm256_div_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), e),
                                   _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 a2 = _mm256_mul_ps(a, a);
  __m256 p = _mm256_set1_ps(-1382.0f / 155925.0f);
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(62.0f / 2835.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-17.0f / 315.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(2.0f / 15.0f));
  p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1.0f / 3.0f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, a2), a, a);
  const __m256 is_small = _mm256_cmp_ps(a, _mm256_set1_ps(0.25f), _CMP_LT_OQ);
  // Both on |t| and then t's sign: tanh(-0) = -0.
  return _mm256_or_ps(_mm256_blendv_ps(big, small, is_small), sign);
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

// out[i] = f(a[i], b[i]) for n floats, 8 at a time, the tail through masked loads/stores.
// out may alias a or b (each step reads its lanes before it writes them).
template <typename F>
inline void Map2(const float* a, const float* b, float* out, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(out + i, m, f(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m)));
  }
}

}  // namespace

float ExpF32(const float* x, float shift, float* y, int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  // Lane l of `sum` adds y[t] for t % 8 == l in increasing t; a tail's missing lanes add +0,
  // which leaves a sum of exps (never -0) unchanged.
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    _mm256_storeu_ps(y + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), s));
    _mm256_maskstore_ps(y + i, m, e);
    sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(m)));
  }
  return SpanOrderSum(sum);
}

float MaxF32(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
  if (i < n) {
    const __m256i k = TailMask(n - i);
    m = _mm256_blendv_ps(m, _mm256_max_ps(_mm256_maskload_ps(x + i, k), m),
                         _mm256_castsi256_ps(k));
  }
  return HorizontalMax(m);
}

int64_t FindAtLeastF32(const float* x, int64_t n, float value) {
  const __m256 v = _mm256_set1_ps(value);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), v, _CMP_GE_OQ));
    if (hit != 0) return i + __builtin_ctz(hit);
  }
  for (; i < n; ++i) {
    if (x[i] >= value) return i;
  }
  return n;
}

void Silu(const float* x, float* y, int64_t n) { Map(x, y, n, Silu8); }

void GeluTanh(const float* x, float* y, int64_t n) { Map(x, y, n, GeluTanh8); }

void SoftCap(float* x, int64_t n, float cap) {
  const __m256 inv = _mm256_set1_ps(1.0f / cap), c = _mm256_set1_ps(cap);
  Map(x, x, n, [&](__m256 v) { return _mm256_mul_ps(Tanh8(_mm256_mul_ps(v, inv)), c); });
}

void GeGlu(const float* gate, const float* up, float* out, int64_t n, const float* table) {
  const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
  Map2(gate, up, out, n, [&](__m256 g, __m256 u) {
    // vcvtps2ph rounds to nearest even, as Fp32ToFp16: the same table entry.
    const __m256i h = _mm256_cvtepu16_epi32(
        _mm256_cvtps_ph(g, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256 v = _mm256_mul_ps(_mm256_i32gather_ps(table, h, 4), u);
    const __m256 above = _mm256_blendv_ps(v, _mm256_mul_ps(g, u), _mm256_cmp_ps(g, hi, _CMP_GE_OQ));
    return _mm256_andnot_ps(_mm256_cmp_ps(g, lo, _CMP_LE_OQ), above);  // +0 at or below -10
  });
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  Map2(gate, up, out, n, [](__m256 g, __m256 u) { return _mm256_mul_ps(Silu8(g), u); });
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

// ---- Attention tiles (contracts in ops_isa.h). ----

namespace {

inline const uint8_t* Row(const void* base, int64_t stride_bytes, int t) {
  return static_cast<const uint8_t*>(base) + t * stride_bytes;
}

// Lane t of the result = sum of the 8 lanes of v[t]: the 8 horizontal sums of a key block
// done together (7 hadds/permutes + 1 add instead of 8 full reductions). Every lane is folded
// by the same tree, ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)), so a sum does not
// depend on which vectors share the call.
inline __m256 Reduce8(const __m256* v) {
  // Per 128-bit half: [sum v0, sum v1, sum v2, sum v3] over that half's 4 lanes.
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
  const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
  // [h0.lo + h0.hi, h1.lo + h1.hi].
  return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

// Where the tile kernels read dims [d, d + 8) of key/value row t as f32: the tile buffer
// (AttnLoadRows* output, ld floats a row, zero past head_dim), or the cache rows themselves,
// converted in registers to the very values AttnLoadRows* stores (dims past head_dim read as
// zero). Either way a kernel does the same operations in the same order on the same values,
// so the direct and the staged paths give identical bits.
//
// Plan(rows, n) and Prefetch(row, plan, i): step i of n over `rows` rows from `row` on,
// kRowsAhead bytes further along the head's span (avx2_util.h); the buffer needs none.
struct BufferRows {
  const float* base;
  int ld;
  const void* Row(int t) const { return base + t * ld; }
  __m256 Load(const void* row, int d) const {
    return _mm256_loadu_ps(static_cast<const float*>(row) + d);
  }
  PrefetchPlan Plan(int, int) const { return {}; }
  void Prefetch(const void*, const PrefetchPlan&, int) const {}
};

// A KV head's span in the cache: rows `stride` bytes apart from `base`.
struct CacheSpan {
  const uint8_t* base;
  int64_t stride;
  const void* Row(int t) const { return base + t * stride; }
  PrefetchPlan Plan(int rows, int n) const { return PlanRows(rows * stride, n); }
  void Prefetch(const void* row, const PrefetchPlan& plan, int i) const {
    PrefetchRows(row, plan, i);
  }
};

// kTail: head_dim is not a multiple of 16, so a dims step may run past it (partly or wholly).
template <bool kTail>
struct CacheRowsF32 : CacheSpan {
  int head_dim;
  __m256 Load(const void* row, int d) const {
    const float* r = static_cast<const float*>(row);
    if (!kTail || d + 8 <= head_dim) return _mm256_loadu_ps(r + d);
    return _mm256_maskload_ps(r + d, TailMask(head_dim - d));  // no lanes once d >= head_dim
  }
};

template <bool kTail>
struct CacheRowsF16 : CacheSpan {
  int head_dim;
  __m256 Load(const void* row, int d) const {
    const f16_t* r = static_cast<const f16_t*>(row);
    if (!kTail || d + 8 <= head_dim) return LoadF16(r + d);
    f16_t part[8] = {};  // +0.0 past the row, as the buffer's padding
    for (int i = 0; d + i < head_dim && i < 8; ++i) part[i] = r[d + i];
    return LoadF16(part);
  }
};

// q8_0 value rows (head_dim % 32 == 0), read only by AccumBlock's overload below.
struct CacheRowsQ8_0 : CacheSpan {};

// s[r * s_ld + t] = dot(q row r, key row t) over ld dims, for t < n_keys. Rows go in pairs
// over groups of 4 keys, so each key vector is loaded (converted, from a cache) once for both
// (decode's GQA pair, 8 accumulators); a last odd row takes 8 keys at a time. Either way a
// score is its 8 lane sums in dims order, folded by Reduce8: the bits do not depend on the
// pairing. Keys past n_keys in the last group are read again from the last key (the cache may
// end there) and never stored.
template <typename Rows>
void TileScores(const float* q, int n_rows, int ld, const Rows k, int n_keys, float* s,
                int s_ld) {
  const PrefetchPlan plan = k.Plan(4, ld / 8);
  int r = 0;
  for (; r + 2 <= n_rows; r += 2) {
    const float* q0 = q + r * ld;
    const float* q1 = q0 + ld;
    for (int t0 = 0; t0 < n_keys; t0 += 4) {
      const void* row[4];
      #pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) row[j] = k.Row(t0 + j < n_keys ? t0 + j : n_keys - 1);
      // a[j]: row r against key j; a[4 + j]: row r + 1 against key j.
      __m256 a[8];
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
      for (int d = 0; d < ld; d += 8) {
        const __m256 qv0 = _mm256_loadu_ps(q0 + d), qv1 = _mm256_loadu_ps(q1 + d);
        k.Prefetch(row[0], plan, d / 8);
        #pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m256 kv = k.Load(row[j], d);
          a[j] = _mm256_fmadd_ps(qv0, kv, a[j]);
          a[4 + j] = _mm256_fmadd_ps(qv1, kv, a[4 + j]);
        }
      }
      const __m256 sums = Reduce8(a);
      const __m128i m = _mm256_castsi256_si128(TailMask(n_keys - t0));  // lanes 0..3
      _mm_maskstore_ps(s + r * s_ld + t0, m, _mm256_castps256_ps128(sums));
      _mm_maskstore_ps(s + (r + 1) * s_ld + t0, m, _mm256_extractf128_ps(sums, 1));
    }
  }
  if (r == n_rows) return;
  const float* qr = q + r * ld;
  for (int t0 = 0; t0 < n_keys; t0 += 8) {
    const void* row[8];
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) row[j] = k.Row(t0 + j < n_keys ? t0 + j : n_keys - 1);
    __m256 a[8];
    #pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) a[j] = _mm256_setzero_ps();
    for (int d = 0; d < ld; d += 8) {
      const __m256 qv = _mm256_loadu_ps(qr + d);
      k.Prefetch(row[0], plan, d / 8);
      k.Prefetch(row[4], plan, d / 8);
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(qv, k.Load(row[j], d), a[j]);
    }
    _mm256_maskstore_ps(s + r * s_ld + t0, TailMask(n_keys - t0), Reduce8(a));
  }
}

// vv[j] = dims [d0 + 8 j, d0 + 8 j + 8) of `row`, for j < C.
template <int C, typename Rows>
inline void LoadChunks(const Rows& v, const void* row, int d0, __m256* vv) {
  #pragma GCC unroll 16
  for (int j = 0; j < C; ++j) vv[j] = v.Load(row, d0 + 8 * j);
}

// c[r][j] = acc[r * ld + d0 + 8 j ..], the R x C accumulators of a block of rows and dims.
template <int R, int C>
inline __attribute__((always_inline)) void LoadAccumulators(const float* acc, int ld, int d0,
                                                         __m256 (&c)[R][C]) {
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    #pragma GCC unroll 16
    for (int j = 0; j < C; ++j) c[r][j] = _mm256_loadu_ps(acc + r * ld + d0 + 8 * j);
  }
}

template <int R, int C>
inline __attribute__((always_inline)) void StoreAccumulators(const __m256 (&c)[R][C], int ld,
                                                          int d0, float* acc) {
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    #pragma GCC unroll 16
    for (int j = 0; j < C; ++j) _mm256_storeu_ps(acc + r * ld + d0 + 8 * j, c[r][j]);
  }
}

// acc[r * ld + d] += sum_t p[r * p_ld + t] * v row t [d] for R rows and dims
// [d0, d0 + 8 C): R * C accumulators stay in registers across the keys.
template <int R, int C, typename Rows>
inline void AccumBlock(const float* p, int p_ld, const Rows& v, int n_keys, int ld, int d0,
                       float* acc) {
  __m256 c[R][C];
  LoadAccumulators<R, C>(acc, ld, d0, c);
  const PrefetchPlan plan = v.Plan(8, 8);
  for (int t = 0; t < n_keys; ++t) {
    // An eighth of 8 rows ahead per key, on the first dims block only.
    if (d0 == 0) v.Prefetch(v.Row(t & ~7), plan, t & 7);
    __m256 vv[C];
    LoadChunks<C>(v, v.Row(t), d0, vv);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r * p_ld + t);
      #pragma GCC unroll 16
      for (int j = 0; j < C; ++j) c[r][j] = _mm256_fmadd_ps(w, vv[j], c[r][j]);
    }
  }
  StoreAccumulators<R, C>(c, ld, d0, acc);
}

// AttnRowAccumQ8_0 (ops_isa.h) for R rows and dims [d0, d0 + 8 C): C is 4 (d0 % 32 == 0), 2
// (d0 % 16 == 0) or 1, so the chunks lie in one block. A key's R weights (the row's p times
// the block's scale, broadcast) take R multiplies where the scaled values took C. Made in a
// pass ahead of the values, as on AVX-512, they cost this level more than they saved (q8_0
// decode after 4,000 positions -6%, AVX2 code on a Zen 4 core): with 8-float vectors there are
// no broadcast FMA operands to feed.
template <int R, int C>
inline void AccumBlock(const float* p, int p_ld, const CacheRowsQ8_0& v, int n_keys, int ld,
                       int d0, float* acc) {
  const int64_t block = d0 / kQK8_0 * static_cast<int64_t>(sizeof(BlockQ8_0));
  const int at = offsetof(BlockQ8_0, qs) + d0 % kQK8_0;
  __m256 c[R][C];
  LoadAccumulators<R, C>(acc, ld, d0, c);
  const PrefetchPlan plan = v.Plan(8, 8);
  const uint8_t* row = static_cast<const uint8_t*>(v.Row(0)) + block;
  for (int t = 0; t < n_keys; ++t, row += v.stride) {
    // An eighth of 8 rows ahead per key, on the first dims block only.
    if (d0 == 0) v.Prefetch(v.Row(t & ~7), plan, t & 7);
    const __m256 scale =
        _mm256_set1_ps(HalfToFloat(reinterpret_cast<const BlockQ8_0*>(row)->d));
    __m256 q[C];
    #pragma GCC unroll 16
    for (int j = 0; j < C; ++j) q[j] = LoadQ8(reinterpret_cast<const int8_t*>(row + at) + 8 * j);
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 wr = _mm256_mul_ps(_mm256_broadcast_ss(p + r * p_ld + t), scale);
      #pragma GCC unroll 16
      for (int j = 0; j < C; ++j) c[r][j] = _mm256_fmadd_ps(wr, q[j], c[r][j]);
    }
  }
  StoreAccumulators<R, C>(c, ld, d0, acc);
}

// All dims for R rows: chunks of 8 C dims, then 8-dim chunks for the rest (ld % 8 == 0).
template <int R, int C, typename Rows>
inline void AccumRows(const float* p, int p_ld, const Rows& v, int n_keys, int ld, float* acc) {
  int d = 0;
  for (; d + 8 * C <= ld; d += 8 * C) AccumBlock<R, C>(p, p_ld, v, n_keys, ld, d, acc);
  for (; d < ld; d += 8) AccumBlock<R, 1>(p, p_ld, v, n_keys, ld, d, acc);
}

// Keys per weights pass of AccumRowsShared: their weights sit on the stack.
constexpr int kFoldKeys = 32;

// AttnRowAccumQ8_0 for groups of 3-4 rows (prefill). Their accumulators fill the registers at
// 16 dims a pass, so AccumBlock would make each key's weights (the row's p times the block's
// scale) twice a block, once per half. Here a block's weights are made once for up to
// kFoldKeys keys, then both halves read them as broadcast loads: the same multiplies, in
// the same order, so the same bits. q8_0 KV prefill of 4,000 positions, AVX2 code on a Zen 4
// core, 1 thread: 66.8-67.4 -> 68.6-69.7 t/s.
template <int R>
inline void AccumRowsShared(const float* p, int p_ld, const CacheRowsQ8_0& v, int n_keys,
                            int ld, float* acc) {
  const PrefetchPlan plan = v.Plan(8, 8);
  for (int d0 = 0; d0 < ld; d0 += kQK8_0) {
    const int64_t block = d0 / kQK8_0 * static_cast<int64_t>(sizeof(BlockQ8_0));
    for (int t0 = 0; t0 < n_keys; t0 += kFoldKeys) {
      const int nk = n_keys - t0 < kFoldKeys ? n_keys - t0 : kFoldKeys;
      const uint8_t* rows = static_cast<const uint8_t*>(v.Row(t0)) + block;
      alignas(32) float w[kFoldKeys * R];  // w[t * R + r]: row r's weight for key t0 + t
      for (int t = 0; t < nk; ++t) {
        const float d = HalfToFloat(reinterpret_cast<const BlockQ8_0*>(rows + t * v.stride)->d);
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) w[t * R + r] = p[r * p_ld + t0 + t] * d;
      }
      #pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        __m256 c[R][2];
        LoadAccumulators<R, 2>(acc, ld, d0 + 16 * half, c);
        const int at = offsetof(BlockQ8_0, qs) + 16 * half;
        for (int t = 0; t < nk; ++t) {
          // An eighth of 8 rows ahead per key, on the first pass over the keys only.
          if (d0 == 0 && half == 0) v.Prefetch(v.Row((t0 + t) & ~7), plan, (t0 + t) & 7);
          const int8_t* q = reinterpret_cast<const int8_t*>(rows + t * v.stride + at);
          const __m256 q0 = LoadQ8(q), q1 = LoadQ8(q + 8);
          #pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const __m256 wr = _mm256_broadcast_ss(w + t * R + r);
            c[r][0] = _mm256_fmadd_ps(wr, q0, c[r][0]);
            c[r][1] = _mm256_fmadd_ps(wr, q1, c[r][1]);
          }
        }
        StoreAccumulators<R, 2>(c, ld, d0 + 16 * half, acc);
      }
    }
  }
}

// q8_0 value rows: ld == head_dim, a multiple of 32, so passes cover whole blocks.
template <int R, int C>
inline void AccumRows(const float* p, int p_ld, const CacheRowsQ8_0& v, int n_keys, int ld,
                      float* acc) {
  if constexpr (R >= 3) {
    AccumRowsShared<R>(p, p_ld, v, n_keys, ld, acc);
  } else {
    for (int d = 0; d < ld; d += 8 * C) AccumBlock<R, C>(p, p_ld, v, n_keys, ld, d, acc);
  }
}

template <typename Rows>
void TileAccum(const float* p, int p_ld, int n_rows, const Rows& v, int n_keys, int ld,
               float* acc) {
  int r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    AccumRows<4, 2>(p + r * p_ld, p_ld, v, n_keys, ld, acc + r * ld);
  }
  const float* pr = p + r * p_ld;
  float* ar = acc + r * ld;
  switch (n_rows - r) {
    case 3:
      AccumRows<3, 2>(pr, p_ld, v, n_keys, ld, ar);
      break;
    case 2:
      AccumRows<2, 4>(pr, p_ld, v, n_keys, ld, ar);
      break;
    case 1:
      AccumRows<1, 4>(pr, p_ld, v, n_keys, ld, ar);
      break;
    default:
      break;
  }
}

}  // namespace

void AttnLoadRowsF32(const void* rows, int64_t stride_bytes, int n_rows, int head_dim, int ld,
                     float* dst) {
  for (int t = 0; t < n_rows; ++t) {
    const float* src = reinterpret_cast<const float*>(Row(rows, stride_bytes, t));
    float* o = dst + t * ld;
    int d = 0;
    for (; d + 8 <= head_dim; d += 8) _mm256_storeu_ps(o + d, _mm256_loadu_ps(src + d));
    for (; d < head_dim; ++d) o[d] = src[d];
  }
}

void AttnLoadRowsF16(const void* rows, int64_t stride_bytes, int n_rows, int head_dim, int ld,
                     float* dst) {
  for (int t = 0; t < n_rows; ++t) {
    const f16_t* src = reinterpret_cast<const f16_t*>(Row(rows, stride_bytes, t));
    float* o = dst + t * ld;
    int d = 0;
    for (; d + 8 <= head_dim; d += 8) _mm256_storeu_ps(o + d, LoadF16(src + d));
    for (; d < head_dim; ++d) o[d] = HalfToFloat(src[d]);
  }
}

FUCINA_ATTN_ENTRY_POINTS

}  // namespace fucina::avx2
