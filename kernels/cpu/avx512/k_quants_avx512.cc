// AVX-512 (F/BW/VL/DQ + VNNI) k-quant kernels: the Q8_K activation quantizer and the
// Q*_K x Q8_K dots.
//
// The dots work on 64 weights per instruction: _mm512_maddubs_epi16 (u8 weight x s8
// activation, adjacent pairs summed to s16; cannot saturate for 4-, 5- or 6-bit weights) then
// VNNI _mm512_dpwssd_epi32 multiplies those s16 pairs by the sub-block scale and accumulates
// into int32 in one instruction. Scales are unpacked once per super-block and spread to the
// lanes of their sub-block with a permute. Integer sums are exact; only the float
// accumulation order differs from the scalar reference.
#include "kernels/cpu/avx512/undefined_vectors.h"  // before any intrinsics: GCC bug 105593

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx512/avx512_util.h"
#include "kernels/cpu/k_scales.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/k_quants.h"

namespace fucina::avx512 {
namespace {

// Index vector for _mm512_permutexvar_epi16: s16 lanes 0..15 read lane a, 16..31 lane b.
inline __m512i SplitIndex(int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(a))),
                            _mm256_set1_epi16(static_cast<int16_t>(b)), 1);
}

}  // namespace

void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  const __m512i k127 = _mm512_set1_epi32(127);
  for (int64_t i = 0; i < nb; ++i) {
    __m512 vmax = _mm512_setzero_ps();
    for (int j = 0; j < kQK_K; j += 16) {
      vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_loadu_ps(x + j)));
    }
    const float amax = _mm512_reduce_max_ps(vmax);
    if (!amax) {
      y[i].d = 0;
      std::memset(y[i].qs, 0, kQK_K);
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      x += kQK_K;
      continue;
    }
    // The reference keeps the signed value of the first element reaching amax.
    const __m512 vamax = _mm512_set1_ps(amax);
    float max = 0;
    for (int j = 0; j < kQK_K; j += 16) {
      const __mmask16 hit =
          _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(x + j)), vamax, _CMP_EQ_OQ);
      if (hit) {
        max = x[j + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m512 viscale = _mm512_set1_ps(iscale);
    // One vector is exactly one 16-element bsums group.
    for (int j = 0; j < kQK_K; j += 16) {
      const __m512 v = _mm512_mul_ps(viscale, _mm512_loadu_ps(x + j));
      // Round to nearest even, the reference's magic-number rounding.
      const __m512i q = _mm512_min_epi32(
          _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), k127);
      y[i].bsums[j / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[i].qs + j), _mm512_cvtepi32_epi8(q));
    }
    y[i].d = 1 / iscale;
    x += kQK_K;
  }
}

namespace {

// Q4_K (kHighBit false) and Q5_K. One 64-byte load of qs covers 128 weights: its low nibbles
// are sub-blocks 4t and 4t+2 (elements 128t+0..31 and 128t+64..95), its high nibbles 4t+1 and
// 4t+3. The min term uses the activations' 16-element sums.
template <bool kHighBit>
inline float DotQxK(int64_t nb, const uint8_t* x_bytes, size_t block_bytes, const BlockQ8_K* y) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i k16 = _mm512_set1_epi8(16);
  const __m512i idx_lo[2] = {SplitIndex(0, 2), SplitIndex(4, 6)};
  const __m512i idx_hi[2] = {SplitIndex(1, 3), SplitIndex(5, 7)};
  __m512 acc = _mm512_setzero_ps();
  __m256 acc_min = _mm256_setzero_ps();
  const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  for (int64_t i = 0; i < nb; ++i) {
    // Both layouts start with d, dmin, scales[12]; Q5_K then has qh[32] before qs.
    const uint8_t* blk = x_bytes + i * block_bytes;
    f16_t d16, dmin16;
    std::memcpy(&d16, blk, 2);
    std::memcpy(&dmin16, blk + 2, 2);
    const uint8_t* qh = blk + 4 + kKScaleSize;
    const uint8_t* qs = kHighBit ? qh + kQK_K / 8 : qh;
    const float d = _cvtsh_ss(d16) * y[i].d;
    const float dmin = _cvtsh_ss(dmin16) * y[i].d;

    const __m128i sm = UnpackScalesMins(blk + 4);
    const __m512i scales16 = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(sm));

    // Min term: each min (bytes 8..15 of sm) duplicated onto the two bsums of its sub-block.
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup_mins));
    const __m256i min_prod = _mm256_madd_epi16(
        mins16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums)));
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(min_prod), acc_min);

    __m512i hbits;
    if constexpr (kHighBit) {
      hbits = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)));
    }
    const int8_t* q8 = y[i].qs;
    __m512i sumi_lo = _mm512_setzero_si512();
    __m512i sumi_hi = _mm512_setzero_si512();
    for (int t = 0; t < 2; ++t) {
      const __m512i q4 = _mm512_loadu_si512(qs + 64 * t);
      __m512i lo = _mm512_and_si512(q4, low4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q4, 4), low4);
      if constexpr (kHighBit) {
        // Sub-block s takes bit s of qh: bits 4t, 4t+2 for the low nibbles, 4t+1, 4t+3 high.
        const __m512i bit_lo = _mm512_inserti64x4(
            _mm512_set1_epi8(static_cast<char>(1 << (4 * t))),
            _mm256_set1_epi8(static_cast<char>(1 << (4 * t + 2))), 1);
        const __m512i bit_hi = _mm512_slli_epi16(bit_lo, 1);
        lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hbits, bit_lo), lo, k16);
        hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(hbits, bit_hi), hi, k16);
      }
      const __m512i q8lo = LoadQs(q8 + 128 * t, q8 + 128 * t + 64);
      const __m512i q8hi = LoadQs(q8 + 128 * t + 32, q8 + 128 * t + 96);
      sumi_lo = _mm512_dpwssd_epi32(sumi_lo, _mm512_maddubs_epi16(lo, q8lo),
                                    _mm512_permutexvar_epi16(idx_lo[t], scales16));
      sumi_hi = _mm512_dpwssd_epi32(sumi_hi, _mm512_maddubs_epi16(hi, q8hi),
                                    _mm512_permutexvar_epi16(idx_hi[t], scales16));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_add_epi32(sumi_lo, sumi_hi)),
                          acc);
  }
  // Fold the min term into the main accumulator's low half before the one reduction.
  acc = _mm512_sub_ps(acc, _mm512_insertf32x8(_mm512_setzero_ps(), acc_min, 0));
  return _mm512_reduce_add_ps(acc);
}

}  // namespace

float VecDotQ4_KQ8_K(int64_t n, const BlockQ4_K* x, const BlockQ8_K* y) {
  return DotQxK<false>(n / kQK_K, reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ4_K), y);
}

float VecDotQ5_KQ8_K(int64_t n, const BlockQ5_K* x, const BlockQ8_K* y) {
  return DotQxK<true>(n / kQK_K, reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ5_K), y);
}

// Per super-block: d * sum_j sc_j * <q_j - 32, q8_j> over 16 sub-blocks of 16, with the -32
// folded out through the activations' block sums (<q - 32, q8> = <q, q8> - 32 * bsum). A 64-byte
// load of ql gives, from its low nibbles, elements 0..63 of a 128-element half and, from its
// high nibbles, elements 64..127; the matching 2-bit pieces of qh come from per-half shifts.
float VecDotQ6_KQ8_K(int64_t n, const BlockQ6_K* x, const BlockQ8_K* y) {
  const int64_t nb = n / kQK_K;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i low2 = _mm512_set1_epi8(0x03);
  // s16 shift counts: first 32 bytes from qh bits 0-1 (resp. 4-5), last 32 from bits 2-3 (6-7).
  const __m512i shift_a = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  const __m512i shift_b = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
  // Vector v of the super-block holds sub-blocks 4v..4v+3, 8 s16 lanes each.
  __m512i scale_idx[4];
  for (int v = 0; v < 4; ++v) {
    alignas(64) int16_t idx[32];
    for (int l = 0; l < 32; ++l) idx[l] = static_cast<int16_t>(4 * v + l / 8);
    scale_idx[v] = _mm512_load_si512(idx);
  }
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = _cvtsh_ss(x[i].d) * y[i].d;
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums));
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5);
    const __m512i scales = _mm512_zextsi256_si512(sc16);

    __m512i sumi_a = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(offset));
    __m512i sumi_b = _mm512_setzero_si512();
    for (int half = 0; half < 2; ++half) {
      const __m512i l = _mm512_loadu_si512(x[i].ql + 64 * half);
      const __m512i h = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh + 32 * half)));
      const __m512i qa = _mm512_or_si512(
          _mm512_and_si512(l, low4),
          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, shift_a), low2), 4));
      const __m512i qb = _mm512_or_si512(
          _mm512_and_si512(_mm512_srli_epi16(l, 4), low4),
          _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(h, shift_b), low2), 4));
      const __m512i q8a = _mm512_loadu_si512(y[i].qs + 128 * half);
      const __m512i q8b = _mm512_loadu_si512(y[i].qs + 128 * half + 64);
      sumi_a = _mm512_dpwssd_epi32(sumi_a, _mm512_maddubs_epi16(qa, q8a),
                                   _mm512_permutexvar_epi16(scale_idx[2 * half], scales));
      sumi_b = _mm512_dpwssd_epi32(sumi_b, _mm512_maddubs_epi16(qb, q8b),
                                   _mm512_permutexvar_epi16(scale_idx[2 * half + 1], scales));
    }
    acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(_mm512_add_epi32(sumi_a, sumi_b)),
                          acc);
  }
  return _mm512_reduce_add_ps(acc);
}

}  // namespace fucina::avx512
