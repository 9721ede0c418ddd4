// Private: the SIMD halves of the transformer ops (norm, softmax, activations, attention inner
// loops). The public entry points in kernels/*.h dispatch here; tests call these directly to
// check every ISA the machine has against the scalar references.
#ifndef FUCINA_KERNELS_CPU_OPS_ISA_H_
#define FUCINA_KERNELS_CPU_OPS_ISA_H_

#include <cstdint>

#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina {

// Attention tile kernels (kernels/cpu/attention.cc). A tile is up to 32 keys of one kv head,
// converted once into an f32 buffer and then used by every query row (the heads of a GQA
// group, times a few queries in prefill). Buffers are row-major with a leading dimension `ld`
// (floats per row) that is a multiple of 16; dims past head_dim are zero in q and k.
//   AttnLoadRows{F32,F16}: dst[t * ld + d] = row t (at `rows` + t * stride_bytes, one cache
//     position apart) element d as f32, for t < n_rows, d < head_dim; exact (the same values
//     as LoadKvHead). Row types: F32 float[head_dim], F16 f16_t[head_dim]. Columns >= head_dim
//     are not written.
//   AttnTileScores: s[r * s_ld + t] = dot(q[r * ld ..], k[t * ld ..]) over ld dims, for
//     r < n_rows, t < n_keys <= 32. k must hold round_up(n_keys, 16) readable rows (keys are
//     reduced 16 at a time); rows past n_keys may hold anything, even NaN: each stored lane
//     sums only its own key's products, and only t < n_keys is stored.
//   AttnTileAccum: acc[r * ld + d] += sum_{t < n_keys} p[r * p_ld + t] * v[t * ld + d] for
//     r < n_rows, d < ld.
// Each output value's summation order depends only on its own row and the key count, never on
// n_rows, so results do not change with how rows are batched.

// Attention tile kernels that read the cache rows directly instead of an f32 tile buffer
// (decode: with a query row or two per kv head, staging K and V cost more than using them).
// q8_0 has the V side only: its K is scored by integer dots (attention.cc).
//   AttnRowScores{F32,F16}(q, n_rows, ld, rows, stride_bytes, head_dim, n_keys, s, s_ld)
//     == AttnLoadRows*(rows, stride_bytes, n_keys, head_dim, ld, buf) then
//        AttnTileScores(q, n_rows, ld, buf, n_keys, s, s_ld), bit for bit;
//   AttnRowAccum{F32,F16}(p, p_ld, n_rows, rows, stride_bytes, head_dim, n_keys, ld, acc)
//     == the same load then AttnTileAccum(p, p_ld, n_rows, buf, n_keys, ld, acc), bit for bit.
//   AttnRowAccumQ8_0(p, p_ld, n_rows, rows, stride_bytes, head_dim, n_keys, ld, acc): rows
//     of BlockQ8_0[head_dim / 32] (head_dim % 32 == 0, ld == head_dim); for r < n_rows,
//     d < ld, in key order t = 0, 1, ..: acc[r * ld + d] = fma(w, q, acc[r * ld + d]) with
//     w = p[r * p_ld + t] * d_t (f32 product; d_t the scale of row t's block holding d) and
//     q row t's int8 value d. The scale goes with the weight, not the value (AttnLoadRows
//     has no q8_0 form: every SIMD level reads q8_0 V through this kernel alone), so the
//     inner loop has no multiply by the scale; each value is still the fused rounding of one
//     term, as in AttnTileAccum.
// Only the n_keys rows are read (no padding rows past them).

// Same contracts as the public functions of the same name (kernels/norm.h, softmax.h,
// activations.h). ExpF32: y[i] = exp(x[i] - shift) of the f32 difference (attention's scores
// less their running max: subtracted in the vectors, where a separate pass stored the
// differences 4 floats at a time and the exp's 16-float loads waited on store forwarding),
// max relative error ~2 ulp over the whole float range (results below ~1e-45 flush to 0,
// above FLT_MAX go to inf, NaN stays NaN); it returns the sum of y[0, n) in span order:
// ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)), a_l the sum of y[t] for t % 8 == l in
// increasing t (every level and attention.cc's scalar path add so: the order depends on n
// alone). MaxF32: the largest of x[0, n) (n > 0), NaNs ignored. FindAtLeastF32: the first i
// with x[i] >= value, n when none.
#define FUCINA_OPS_ISA_DECLS                                                                   \
  float ExpF32(const float* x, float shift, float* y, int64_t n);                              \
  float MaxF32(const float* x, int64_t n);                                                     \
  int64_t FindAtLeastF32(const float* x, int64_t n, float value);                                \
  void RmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t n,         \
               float* out);                                                                    \
  void Softmax(float* x, int64_t rows, int64_t n, float scale, const float* mask,              \
               int64_t mask_row_stride);                                                       \
  void Silu(const float* x, float* y, int64_t n);                                              \
  void GeluTanh(const float* x, float* y, int64_t n);                                          \
  void SwiGlu(const float* gate, const float* up, float* out, int64_t n);                      \
  void AttnLoadRowsF32(const void* rows, int64_t stride_bytes, int n_rows, int head_dim,        \
                       int ld, float* dst);                                                    \
  void AttnLoadRowsF16(const void* rows, int64_t stride_bytes, int n_rows, int head_dim,        \
                       int ld, float* dst);                                                    \
  void AttnTileScores(const float* q, int n_rows, int ld, const float* k, int n_keys,           \
                      float* s, int s_ld);                                                     \
  void AttnTileAccum(const float* p, int p_ld, int n_rows, const float* v, int n_keys, int ld,  \
                     float* acc);                                                              \
  void AttnRowScoresF32(const float* q, int n_rows, int ld, const void* rows,                  \
                        int64_t stride_bytes, int head_dim, int n_keys, float* s, int s_ld);    \
  void AttnRowScoresF16(const float* q, int n_rows, int ld, const void* rows,                  \
                        int64_t stride_bytes, int head_dim, int n_keys, float* s, int s_ld);    \
  void AttnRowAccumF32(const float* p, int p_ld, int n_rows, const void* rows,                 \
                       int64_t stride_bytes, int head_dim, int n_keys, int ld, float* acc);    \
  void AttnRowAccumF16(const float* p, int p_ld, int n_rows, const void* rows,                 \
                       int64_t stride_bytes, int head_dim, int n_keys, int ld, float* acc);    \
  void AttnRowAccumQ8_0(const float* p, int p_ld, int n_rows, const void* rows,                \
                        int64_t stride_bytes, int head_dim, int n_keys, int ld, float* acc);

// Only callable when ActiveIsa() is at least the namespace's level (kernels/cpu/isa.h).
namespace avx2 {
FUCINA_OPS_ISA_DECLS
// AVX-512 machines run this one too (a vocabulary-long map, bound by its divides).
void SoftCap(float* x, int64_t n, float cap);
// GeGLU through GeGlu's table of f16 GELU values (kernels/activations.h), bit for bit: a gather
// of 8 entries. AVX-512 machines run it too.
void GeGlu(const float* gate, const float* up, float* out, int64_t n, const float* table);
}  // namespace avx2
namespace avx512 {
FUCINA_OPS_ISA_DECLS
}  // namespace avx512

#undef FUCINA_OPS_ISA_DECLS

// The attention entry points of an ISA file, written once: each file expands this in its
// namespace after defining its TileScores / TileAccum templates over the row sources
// BufferRows{base, ld}, CacheRowsF32<kTail> / CacheRowsF16<kTail>{{base, stride}, head_dim}
// (kTail: head_dim % 16 != 0) and CacheRowsQ8_0{{base, stride}}.
#define FUCINA_ATTN_ROWS_ENTRY(Type)                                                          \
  void AttnRowScores##Type(const float* q, int n_rows, int ld, const void* rows,              \
                           int64_t stride_bytes, int head_dim, int n_keys, float* s,           \
                           int s_ld) {                                                        \
    const auto* base = static_cast<const uint8_t*>(rows);                                     \
    if (head_dim % 16 == 0) {                                                                 \
      TileScores(q, n_rows, ld, CacheRows##Type<false>{{base, stride_bytes}, head_dim}, n_keys, \
                 s, s_ld);                                                                    \
    } else {                                                                                  \
      TileScores(q, n_rows, ld, CacheRows##Type<true>{{base, stride_bytes}, head_dim}, n_keys,  \
                 s, s_ld);                                                                    \
    }                                                                                         \
  }                                                                                           \
  void AttnRowAccum##Type(const float* p, int p_ld, int n_rows, const void* rows,             \
                          int64_t stride_bytes, int head_dim, int n_keys, int ld, float* acc) { \
    const auto* base = static_cast<const uint8_t*>(rows);                                     \
    if (head_dim % 16 == 0) {                                                                 \
      TileAccum(p, p_ld, n_rows, CacheRows##Type<false>{{base, stride_bytes}, head_dim}, n_keys, \
                ld, acc);                                                                     \
    } else {                                                                                  \
      TileAccum(p, p_ld, n_rows, CacheRows##Type<true>{{base, stride_bytes}, head_dim}, n_keys, \
                ld, acc);                                                                     \
    }                                                                                         \
  }
#define FUCINA_ATTN_ENTRY_POINTS                                                              \
  void AttnTileScores(const float* q, int n_rows, int ld, const float* k, int n_keys,          \
                      float* s, int s_ld) {                                                    \
    TileScores(q, n_rows, ld, BufferRows{k, ld}, n_keys, s, s_ld);                             \
  }                                                                                           \
  void AttnTileAccum(const float* p, int p_ld, int n_rows, const float* v, int n_keys, int ld, \
                     float* acc) {                                                            \
    TileAccum(p, p_ld, n_rows, BufferRows{v, ld}, n_keys, ld, acc);                            \
  }                                                                                           \
  FUCINA_ATTN_ROWS_ENTRY(F32)                                                                 \
  FUCINA_ATTN_ROWS_ENTRY(F16)                                                                 \
  void AttnRowAccumQ8_0(const float* p, int p_ld, int n_rows, const void* rows,               \
                        int64_t stride_bytes, int /*head_dim: whole blocks, ld*/, int n_keys,  \
                        int ld, float* acc) {                                                  \
    TileAccum(p, p_ld, n_rows,                                                                \
              CacheRowsQ8_0{{static_cast<const uint8_t*>(rows), stride_bytes}}, n_keys, ld,   \
              acc);                                                                           \
  }

}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_OPS_ISA_H_
