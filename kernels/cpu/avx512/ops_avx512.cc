// AVX-512 (F/BW/VL/DQ) paths of the transformer ops (contracts in kernels/cpu/ops_isa.h).
// Same algorithms as the AVX2 file at 16 lanes; row tails use lane masks instead of scalar
// loops. Like that file, it calls no inline function from shared headers but avx2_util.h's
// static ones (internal linkage: the attention prefetch plan).
#include "kernels/cpu/avx512/undefined_vectors.h"  // before any intrinsics: GCC bug 105593

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/cpu/avx512/tile_avx512.h"
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

float ExpF32(const float* x, float shift, float* y, int64_t n) {
  const __m512 s = _mm512_set1_ps(shift);
  // Lane l of `sum` adds y[t] for t % 8 == l in increasing t: each 16-lane exp adds its low
  // half, then its high half; a tail's missing lanes leave their partial sums untouched.
  __m256 sum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(y + i, e);
    sum = _mm256_add_ps(sum, _mm512_castps512_ps256(e));
    sum = _mm256_add_ps(sum, _mm512_extractf32x8_ps(e, 1));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s));
    _mm512_mask_storeu_ps(y + i, m, e);
    sum = _mm256_mask_add_ps(sum, static_cast<__mmask8>(m), sum, _mm512_castps512_ps256(e));
    sum = _mm256_mask_add_ps(sum, static_cast<__mmask8>(m >> 8), sum,
                             _mm512_extractf32x8_ps(e, 1));
  }
  return avx2::SpanOrderSum(sum);
}

float MaxF32(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-__builtin_inff());
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + i), m);
  if (i < n) {
    const __mmask16 k = TailMask(n - i);
    m = _mm512_mask_max_ps(m, k, _mm512_maskz_loadu_ps(k, x + i), m);
  }
  return _mm512_reduce_max_ps(m);
}

int64_t FindAtLeastF32(const float* x, int64_t n, float value) {
  const __m512 v = _mm512_set1_ps(value);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = TailMask(i + 16 <= n ? 16 : n - i);
    const __mmask16 hit = _mm512_mask_cmp_ps_mask(k, _mm512_maskz_loadu_ps(k, x + i), v,
                                                  _CMP_GE_OQ);
    if (hit != 0) return i + __builtin_ctz(hit);
  }
  return n;
}

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

// ---- Attention tiles (contracts in ops_isa.h). ----

namespace {

inline const uint8_t* Row(const void* base, int64_t stride_bytes, int t) {
  return static_cast<const uint8_t*>(base) + t * stride_bytes;
}

// Lane t of the result = sum of the 16 lanes of v[t]: the 16 horizontal sums of a key block
// done together by a transpose-and-add tree (45 shuffles/adds instead of 16 full reductions).
inline __m512 Reduce16(const __m512* v) {
  __m512 u[8], w[4];
  #pragma GCC unroll 16
  for (int i = 0; i < 8; ++i) {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3].
    u[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  #pragma GCC unroll 16
  for (int i = 0; i < 4; ++i) {
    // Per 128-bit lane: partial sums of rows 4i .. 4i + 3.
    const __m512d x = _mm512_castps_pd(u[2 * i]), y = _mm512_castps_pd(u[2 * i + 1]);
    w[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // Fold the four 128-bit lanes: 0x88 picks lanes (0, 2) of each operand, 0xDD lanes (1, 3).
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88),
                                  _mm512_shuffle_f32x4(w[0], w[1], 0xDD));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88),
                                  _mm512_shuffle_f32x4(w[2], w[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
}

using avx2::PlanRows;
using avx2::PrefetchPlan;

// Step i of `plan` over the rows from `rows` on, as the tile streams of the matvecs request
// theirs (PrefetchStream, tile_avx512.h): into L2, each line three times as the read comes
// closer (16, 10.7 and 5.3 KiB ahead). One prefetcht0 6 KiB ahead (avx2::PrefetchRows) held
// decode attention after 4,000 positions on a Zen 4 core to ~50% of the conversion bound.
FUCINA_TILE_INLINE void PrefetchRowsToL2(const void* rows, const PrefetchPlan& plan, int i) {
  const char* p = static_cast<const char*>(rows);
  const int64_t stop = (i + 1) * plan.per;  // no std::min in ISA files (docs/kernels.md)
  const int64_t end = stop < plan.lines ? stop : plan.lines;
  for (int64_t l = i * plan.per; l < end; ++l) {
    PrefetchStream<0>(reinterpret_cast<const uint8_t*>(p + 64 * l), 64, kStreamAhead);
  }
}

// Where the tile kernels read dims [d, d + 16) of key/value row t as f32: the tile buffer
// (AttnLoadRows* output, ld floats a row, zero past head_dim), or the cache rows themselves,
// converted in registers to the very values AttnLoadRows* stores (dims past head_dim read as
// zero). Either way a kernel does the same operations in the same order on the same values,
// so the direct and the staged paths give identical bits.
//
// Row(t) is where row t starts and Load(row, d) reads dims [d, d + 16) of it: TileScores takes
// the row addresses of a key group once, ahead of its dims loop, because computed inside it
// they ran through vmovq/imul chains on the ports the FMAs need (decode after 4,000 positions
// spent 3-5x the FMA time on them).
//
// Plan(n) and Prefetch(row, plan, i): cache rows are read once per token, in position order,
// along a head's contiguous span, so the kernels request the span kRowsAhead bytes past the
// rows they read: step i of n over the 8 rows from `row` on, in address order, spread over a
// group's dims steps (one burst per tile queued on the fill buffers). The hardware
// prefetchers stop at each 4 KiB page, 16 f16 rows of 128 dims. Measured: +17% where the span
// comes from L3 (544 positions, 1 thread); from DRAM within this machine's noise.
struct BufferRows {
  const float* base;
  int ld;
  const void* Row(int t) const { return base + t * ld; }
  __m512 Load(const void* row, int d) const {
    return _mm512_loadu_ps(static_cast<const float*>(row) + d);
  }
  PrefetchPlan Plan(int) const { return {}; }
  void Prefetch(const void*, const PrefetchPlan&, int) const {}
};

// A KV head's span in the cache: rows `stride` bytes apart from `base`.
struct CacheSpan {
  const uint8_t* base;
  int64_t stride;
  const void* Row(int t) const { return base + t * stride; }
  PrefetchPlan Plan(int n) const { return PlanRows(8 * stride, n); }
  void Prefetch(const void* row, const PrefetchPlan& plan, int i) const {
    PrefetchRowsToL2(row, plan, i);
  }
};

// kTail: head_dim is not a multiple of 16, the last dims load is masked.
template <bool kTail>
struct CacheRowsF32 : CacheSpan {
  int head_dim;
  __m512 Load(const void* row, int d) const {
    const float* r = static_cast<const float*>(row);
    return !kTail || d + 16 <= head_dim ? _mm512_loadu_ps(r + d)
                                        : _mm512_maskz_loadu_ps(TailMask(head_dim - d), r + d);
  }
};

template <bool kTail>
struct CacheRowsF16 : CacheSpan {
  int head_dim;
  __m512 Load(const void* row, int d) const {
    const f16_t* r = static_cast<const f16_t*>(row);
    return !kTail || d + 16 <= head_dim ? LoadF16(r + d)
                                        : MaskLoadF16(TailMask(head_dim - d), r + d);
  }
};

// q8_0 value rows (head_dim % 32 == 0), read only by AccumBlock's overload below.
struct CacheRowsQ8_0 : CacheSpan {};

// s[r * s_ld + t] = dot(q row r, key row t) over ld dims, for t < n_keys. Rows go in pairs
// over groups of 8 keys, so each key vector is loaded (converted, from a cache) once for both
// (decode's GQA pair); a last odd row takes 16 keys at a time. Either way a score is its 16
// lane sums in dims order, folded by Reduce16, whose tree is the same for every lane: the bits
// do not depend on the pairing. Keys past n_keys in the last group are read again from the
// last key (the cache may end there) and never stored.
template <typename Rows>
void TileScores(const float* q, int n_rows, int ld, const Rows k, int n_keys, float* s,
                int s_ld) {
  const PrefetchPlan plan = k.Plan(ld / 16);
  int r = 0;
  for (; r + 2 <= n_rows; r += 2) {
    const float* q0 = q + r * ld;
    const float* q1 = q0 + ld;
    for (int t0 = 0; t0 < n_keys; t0 += 8) {
      const void* row[8];
      #pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) row[j] = k.Row(t0 + j < n_keys ? t0 + j : n_keys - 1);
      // a[j]: row r against key j; a[8 + j]: row r + 1 against key j.
      __m512 a[16];
      #pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
      for (int d = 0; d < ld; d += 16) {
        const __m512 qv0 = _mm512_loadu_ps(q0 + d), qv1 = _mm512_loadu_ps(q1 + d);
        k.Prefetch(row[0], plan, d / 16);
        #pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const __m512 kv = k.Load(row[j], d);
          a[j] = _mm512_fmadd_ps(qv0, kv, a[j]);
          a[8 + j] = _mm512_fmadd_ps(qv1, kv, a[8 + j]);
        }
      }
      const __m512 sums = Reduce16(a);
      const __mmask8 m = static_cast<__mmask8>(TailMask(n_keys - t0 >= 8 ? 8 : n_keys - t0));
      _mm256_mask_storeu_ps(s + r * s_ld + t0, m, _mm512_castps512_ps256(sums));
      _mm256_mask_storeu_ps(s + (r + 1) * s_ld + t0, m, _mm512_extractf32x8_ps(sums, 1));
    }
  }
  if (r == n_rows) return;
  const float* qr = q + r * ld;
  for (int t0 = 0; t0 < n_keys; t0 += 16) {
    const void* row[16];
    #pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) row[j] = k.Row(t0 + j < n_keys ? t0 + j : n_keys - 1);
    const __mmask16 m = TailMask(n_keys - t0 >= 16 ? 16 : n_keys - t0);
    __m512 a[16];
    #pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) a[j] = _mm512_setzero_ps();
    for (int d = 0; d < ld; d += 16) {
      const __m512 qv = _mm512_loadu_ps(qr + d);
      k.Prefetch(row[0], plan, d / 16);
      k.Prefetch(row[8], plan, d / 16);
      #pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) a[j] = _mm512_fmadd_ps(qv, k.Load(row[j], d), a[j]);
    }
    _mm512_mask_storeu_ps(s + r * s_ld + t0, m, Reduce16(a));
  }
}

// vv[j] = dims [d0 + 16 j, d0 + 16 j + 16) of `row`, for j < C.
template <int C, typename Rows>
inline void LoadChunks(const Rows& v, const void* row, int d0, __m512* vv) {
  #pragma GCC unroll 16
  for (int j = 0; j < C; ++j) vv[j] = v.Load(row, d0 + 16 * j);
}

// c[r][j] = acc[r * ld + d0 + 16 j ..], the R x C accumulators of a block of rows and dims.
template <int R, int C>
FUCINA_TILE_INLINE void LoadAccumulators(const float* acc, int ld, int d0, __m512 (&c)[R][C]) {
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    #pragma GCC unroll 16
    for (int j = 0; j < C; ++j) c[r][j] = _mm512_loadu_ps(acc + r * ld + d0 + 16 * j);
  }
}

template <int R, int C>
FUCINA_TILE_INLINE void StoreAccumulators(const __m512 (&c)[R][C], int ld, int d0, float* acc) {
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    #pragma GCC unroll 16
    for (int j = 0; j < C; ++j) _mm512_storeu_ps(acc + r * ld + d0 + 16 * j, c[r][j]);
  }
}

// acc[r * ld + d] += sum_t p[r * p_ld + t] * v row t [d] for R rows and dims
// [d0, d0 + 16 C): R * C accumulators stay in registers across the keys.
template <int R, int C, typename Rows>
inline void AccumBlock(const float* p, int p_ld, const Rows v, int n_keys, int ld, int d0,
                       float* acc) {
  __m512 c[R][C];
  LoadAccumulators<R, C>(acc, ld, d0, c);
  const PrefetchPlan plan = v.Plan(8);
  for (int t = 0; t < n_keys; ++t) {
    // An eighth of 8 rows ahead per key, on the first dims block only.
    if (d0 == 0) v.Prefetch(v.Row(t & ~7), plan, t & 7);
    __m512 vv[C];
    LoadChunks<C>(v, v.Row(t), d0, vv);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 w = _mm512_set1_ps(p[r * p_ld + t]);
      #pragma GCC unroll 16
      for (int j = 0; j < C; ++j) c[r][j] = _mm512_fmadd_ps(w, vv[j], c[r][j]);
    }
  }
  StoreAccumulators<R, C>(c, ld, d0, acc);
}

// Keys per pass of the q8_0 AccumBlock: the weights of a pass sit on the stack.
constexpr int kFoldKeys = 32;

// Lane j = f16 word index[j] (< 64) of the 128 bytes from `blocks`, as f32; only the words in
// `words` (bit i of words[h]: word 32 h + i) are read, so the bytes past a short row are not.
FUCINA_TILE_INLINE __m256 ScalesAt(const uint8_t* blocks, const __mmask32* words,
                                   __m512i index) {
  const __m512i lo = _mm512_maskz_loadu_epi16(words[0], blocks);
  const __m512i hi = _mm512_maskz_loadu_epi16(words[1], blocks + 64);
  return _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(lo, index, hi)));
}

// AttnRowAccumQ8_0 (ops_isa.h) for R rows and dims [d0, d0 + 16 C): C is even (then
// d0 % 32 == 0) or 1. Weights are made for up to 32 keys at a time: chunk j's scale picked out
// of each row (ScalesAt) times the row's p, one copy per chunk even where two chunks share a
// block, so a weight feeds one FMA and the compiler folds its broadcast into the FMA
// ({1to16}). With the scale multiply left in the values loop, or one broadcast per block, the
// GQA pair's 128 dims took 33 and 26 cycles a key on a Zen 4 core instead of 19 (keys in L1;
// the weights add ~4).
template <int R, int C>
inline void AccumBlock(const float* p, int p_ld, const CacheRowsQ8_0& v, int n_keys, int ld,
                       int d0, float* acc) {
  const int first = d0 / kQK8_0, lead = d0 % kQK8_0;  // lead: 16 for a lone second-half chunk
  // Chunk j: its block's offset from block `first`, and its values' offset within the block.
  int at[C];
  __mmask32 words[2] = {0, 0};
  alignas(16) uint16_t index[8] = {};
  for (int j = 0; j < C; ++j) {
    const int block = (lead + 16 * j) / kQK8_0;
    at[j] = block * int{sizeof(BlockQ8_0)} + int{offsetof(BlockQ8_0, qs)} +
            (lead + 16 * j) % kQK8_0;
    const int word = block * int{sizeof(BlockQ8_0)} / 2;  // the block's d
    words[word / 32] |= __mmask32{1} << (word % 32);
    index[j] = static_cast<uint16_t>(word);
  }
  const __m512i scale_index =
      _mm512_castsi128_si512(_mm_load_si128(reinterpret_cast<const __m128i*>(index)));
  __m512 c[R][C];
  LoadAccumulators<R, C>(acc, ld, d0, c);
  const PrefetchPlan plan = v.Plan(8);
  for (int t0 = 0; t0 < n_keys; t0 += kFoldKeys) {
    const int nk = n_keys - t0 < kFoldKeys ? n_keys - t0 : kFoldKeys;
    const uint8_t* rows = static_cast<const uint8_t*>(v.Row(t0)) + first * sizeof(BlockQ8_0);
    // w[(t * R + r) * C + j]: row r's weight for chunk j of key t0 + t.
    alignas(64) float w[kFoldKeys * R * C];
    for (int t = 0; t < nk; ++t) {
      const __m256 scales = ScalesAt(rows + t * v.stride, words, scale_index);
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 wr = _mm256_mul_ps(_mm256_set1_ps(p[r * p_ld + t0 + t]), scales);
        _mm256_mask_storeu_ps(w + (t * R + r) * C, static_cast<__mmask8>((1 << C) - 1), wr);
      }
    }
    for (int t = 0; t < nk; ++t) {
      // An eighth of 8 rows ahead per key, on the first dims block only.
      if (d0 == 0) v.Prefetch(v.Row((t0 + t) & ~7), plan, (t0 + t) & 7);
      const int8_t* row = reinterpret_cast<const int8_t*>(rows + t * v.stride);
      #pragma GCC unroll 16
      for (int j = 0; j < C; ++j) {
        const __m512 q = LoadQ8(row + at[j]);
        #pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          c[r][j] = _mm512_fmadd_ps(_mm512_set1_ps(w[(t * R + r) * C + j]), q, c[r][j]);
        }
      }
    }
  }
  StoreAccumulators<R, C>(c, ld, d0, acc);
}

// All dims for R rows: chunks of 16 C dims (C chosen so R * C is about 8 independent FMA
// chains), then 16-dim chunks for the rest (ld % 16 == 0).
template <int R, int C, typename Rows>
inline void AccumRows(const float* p, int p_ld, const Rows& v, int n_keys, int ld, float* acc) {
  int d = 0;
  for (; d + 16 * C <= ld; d += 16 * C) AccumBlock<R, C>(p, p_ld, v, n_keys, ld, d, acc);
  for (; d < ld; d += 16) AccumBlock<R, 1>(p, p_ld, v, n_keys, ld, d, acc);
}

// Chunks a pass for blocks of 3 or 4 rows. q8_0 rows make their weights per pass (AccumBlock
// above), so they take wider passes: 4 chunks against 2, q8_0 KV prefill after 4,000 positions
// +5% on a Zen 4 core.
template <typename Rows>
constexpr int kGroupChunks = 2;
template <>
constexpr int kGroupChunks<CacheRowsQ8_0> = 4;

template <typename Rows>
void TileAccum(const float* p, int p_ld, int n_rows, const Rows& v, int n_keys, int ld,
               float* acc) {
  constexpr int kC = kGroupChunks<Rows>;
  int r = 0;
  for (; r + 4 <= n_rows; r += 4) {
    AccumRows<4, kC>(p + r * p_ld, p_ld, v, n_keys, ld, acc + r * ld);
  }
  const float* pr = p + r * p_ld;
  float* ar = acc + r * ld;
  switch (n_rows - r) {
    case 3:
      AccumRows<3, kC>(pr, p_ld, v, n_keys, ld, ar);
      break;
    case 2:
      // Decode's GQA pair: a 128-dim value row in one pass, read in address order (the
      // hardware prefetchers follow it better than two half-row sweeps: +3-7%).
      if (ld % 128 == 0) {
        AccumRows<2, 8>(pr, p_ld, v, n_keys, ld, ar);
      } else {
        AccumRows<2, 4>(pr, p_ld, v, n_keys, ld, ar);
      }
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
    for (int d = 0; d < head_dim; d += 16) {
      const __mmask16 m = TailMask(d + 16 <= head_dim ? 16 : head_dim - d);
      _mm512_mask_storeu_ps(o + d, m, _mm512_maskz_loadu_ps(m, src + d));
    }
  }
}

void AttnLoadRowsF16(const void* rows, int64_t stride_bytes, int n_rows, int head_dim, int ld,
                     float* dst) {
  for (int t = 0; t < n_rows; ++t) {
    const f16_t* src = reinterpret_cast<const f16_t*>(Row(rows, stride_bytes, t));
    float* o = dst + t * ld;
    int d = 0;
    for (; d + 16 <= head_dim; d += 16) _mm512_storeu_ps(o + d, LoadF16(src + d));
    if (d < head_dim) {
      const __mmask16 m = TailMask(head_dim - d);
      _mm512_mask_storeu_ps(o + d, m, MaskLoadF16(m, src + d));
    }
  }
}

FUCINA_ATTN_ENTRY_POINTS

}  // namespace fucina::avx512
