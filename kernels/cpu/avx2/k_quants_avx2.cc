// AVX2 k-quant kernels: the Q8_K activation quantizer and the Q*_K x Q8_K dots.
//
// The dots are the decode hot loop (one pass over every weight per token), so the weights are
// read once, unpacked in registers and multiplied as bytes: _mm256_maddubs_epi16 (u8 weight x
// s8 activation, pairs summed to s16; never saturates: |15*127*2|, |31*127*2|, |63*128*2| all
// fit) then _mm256_madd_epi16 with the sub-block scale into int32. Integer sums are exact, so
// the only difference from the scalar reference is the order of the float accumulation.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/avx2/avx2_util.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/k_quants.h"

namespace fucina::avx2 {
namespace {

// The 12 packed bytes of Q4_K/Q5_K scales as 8 scales (bytes 0..7) then 8 mins (bytes 8..15),
// 6 bits each (the same regrouping as ggml's generic dot).
inline __m128i UnpackScalesMins(const uint8_t* packed) {
  constexpr uint32_t kMask6 = 0x3f3f3f3f, kMask4 = 0x0f0f0f0f, kMask2 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, packed, 12);
  u[3] = ((u[2] >> 4) & kMask4) | (((u[1] >> 6) & kMask2) << 4);
  const uint32_t mins_lo = u[1] & kMask6;
  u[1] = (u[2] & kMask4) | (((u[0] >> 6) & kMask2) << 4);
  u[2] = mins_lo;
  u[0] &= kMask6;
  // Built from registers: a 16-byte load right after four 4-byte stores would stall on store
  // forwarding, and this runs once per super-block in the hot loop.
  return _mm_set_epi32(static_cast<int>(u[3]), static_cast<int>(u[2]), static_cast<int>(u[1]),
                       static_cast<int>(u[0]));
}

// `scales` holds the 8 sub-block scales as s16 in both 128-bit lanes; returns scale k in all
// 16 lanes (k is a constant after unrolling, so the control vector is too).
inline __m256i BroadcastScale(__m256i scales, int k) {
  return _mm256_shuffle_epi8(scales, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * k)));
}

// The Q4_K/Q5_K min term mins[j/2] * bsums[j] as 8 int32 partial sums. `sm` holds the mins in
// bytes 8..15; each is duplicated to meet the two 16-element bsums of its 32-element sub-block.
inline __m256i MinTerm(__m128i sm, const int16_t* bsums) {
  const __m128i dup = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup));
  return _mm256_madd_epi16(mins16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)));
}

}  // namespace

void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256i kPerm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < nb; ++i) {
    __m256 vmax = _mm256_setzero_ps();
    for (int j = 0; j < kQK_K; j += 8) {
      vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + j)));
    }
    const float amax = HorizontalMax(vmax);
    if (!amax) {
      y[i].d = 0;
      std::memset(y[i].qs, 0, kQK_K);
      std::memset(y[i].bsums, 0, sizeof(y[i].bsums));
      x += kQK_K;
      continue;
    }
    // The reference keeps the signed value of the first element reaching amax.
    const __m256 vamax = _mm256_set1_ps(amax);
    float max = 0;
    for (int j = 0; j < kQK_K; j += 8) {
      const __m256 ax = _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + j));
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(ax, vamax, _CMP_EQ_OQ));
      if (mask) {
        max = x[j + __builtin_ctz(mask)];
        break;
      }
    }
    const float iscale = -127.f / max;
    const __m256 viscale = _mm256_set1_ps(iscale);
    const __m256i k127 = _mm256_set1_epi32(127);
    for (int j = 0; j < kQK_K; j += 32) {
      // cvtps rounds to nearest even, as the reference's magic-number rounding does.
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 v = _mm256_mul_ps(viscale, _mm256_loadu_ps(x + j + 8 * k));
        q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(v), k127);
      }
      y[i].bsums[j / 16] = static_cast<int16_t>(HorizontalSum(_mm256_add_epi32(q[0], q[1])));
      y[i].bsums[j / 16 + 1] = static_cast<int16_t>(HorizontalSum(_mm256_add_epi32(q[2], q[3])));
      // packs works within 128-bit lanes; the permute restores element order.
      const __m256i p01 = _mm256_packs_epi32(q[0], q[1]);
      const __m256i p23 = _mm256_packs_epi32(q[2], q[3]);
      const __m256i p = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), kPerm);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + j), p);
    }
    y[i].d = 1 / iscale;
    x += kQK_K;
  }
}

namespace {

// Q4_K and Q5_K differ only in the 5th bit; kHighBit selects Q5_K. Per super-block:
//   d * sum_j scale_j * <q_j, q8_j>  -  dmin * sum_j min_j * (sum of q8 over sub-block j).
template <bool kHighBit>
inline float DotQxK(int64_t nb, const uint8_t* x_bytes, size_t block_bytes, const BlockQ8_K* y) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  __m256 acc_min = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    // Both layouts start with d, dmin, scales[12]; Q5_K then has qh[32] before qs.
    const uint8_t* blk = x_bytes + i * block_bytes;
    f16_t d16, dmin16;
    std::memcpy(&d16, blk, 2);
    std::memcpy(&dmin16, blk + 2, 2);
    const uint8_t* scales_packed = blk + 4;
    const uint8_t* qh = blk + 4 + kKScaleSize;
    const uint8_t* qs = kHighBit ? qh + kQK_K / 8 : qh;

    const float d = _cvtsh_ss(d16) * y[i].d;
    const float dmin = _cvtsh_ss(dmin16) * y[i].d;
    const __m128i sm = UnpackScalesMins(scales_packed);
    const __m256i scales16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(MinTerm(sm, y[i].bsums)),
                              acc_min);

    const int8_t* q8 = y[i].qs;
    __m256i hbits;
    if constexpr (kHighBit) hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
    __m256i sumi0 = _mm256_setzero_si256();
    __m256i sumi1 = _mm256_setzero_si256();
    for (int j = 0; j < kQK_K / 64; ++j) {
      const __m256i q4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      __m256i lo = _mm256_and_si256(q4, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
      if constexpr (kHighBit) {
        // Sub-block 2j takes bit 2j of qh, sub-block 2j+1 bit 2j+1; set bits add 16.
        const __m256i bit_lo = _mm256_set1_epi8(static_cast<char>(1 << (2 * j)));
        const __m256i bit_hi = _mm256_set1_epi8(static_cast<char>(2 << (2 * j)));
        const __m256i k16 = _mm256_set1_epi8(16);
        lo = _mm256_or_si256(
            lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit_lo), bit_lo), k16));
        hi = _mm256_or_si256(
            hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit_hi), bit_hi), k16));
      }
      const __m256i q8l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 64 * j));
      const __m256i q8h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 64 * j + 32));
      const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, q8l),
                                           BroadcastScale(scales16, 2 * j));
      const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, q8h),
                                           BroadcastScale(scales16, 2 * j + 1));
      sumi0 = _mm256_add_epi32(sumi0, pl);
      sumi1 = _mm256_add_epi32(sumi1, ph);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(sumi0, sumi1)),
                          acc);
  }
  return HorizontalSum(acc) - HorizontalSum(acc_min);
}

}  // namespace

float VecDotQ4_KQ8_K(int64_t n, const BlockQ4_K* x, const BlockQ8_K* y) {
  return DotQxK<false>(n / kQK_K, reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ4_K), y);
}

float VecDotQ5_KQ8_K(int64_t n, const BlockQ5_K* x, const BlockQ8_K* y) {
  return DotQxK<true>(n / kQK_K, reinterpret_cast<const uint8_t*>(x), sizeof(BlockQ5_K), y);
}

// Per super-block: d * sum_j sc_j * <q_j - 32, q8_j> over 16 sub-blocks of 16. The -32 offset
// is folded out with the activations' block sums: <q - 32, q8> = <q, q8> - 32 * bsum, so the
// byte products stay unsigned x signed for maddubs.
float VecDotQ6_KQ8_K(int64_t n, const BlockQ6_K* x, const BlockQ8_K* y) {
  const int64_t nb = n / kQK_K;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x03);
  // After broadcasting the dword holding scales (s, s+1), this puts scale s in the low 128-bit
  // lane (elements 0..15 of a chunk) and s+1 in the high one.
  const __m256i split_pair = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                              2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float d = _cvtsh_ss(x[i].d) * y[i].d;
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);  // 16 scales as s16.
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums));
    const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5);

    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* q8 = y[i].qs;
    __m256i sumi0 = _mm256_setzero_si256();
    __m256i sumi1 = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
      // Elements 32k..32k+31 of this half: nibble of l[k&1], qh bits 2k..2k+1.
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, low4),
                             _mm256_slli_epi16(_mm256_and_si256(h, low2), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), low2), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), low2), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), low2), 4));
      for (int k = 0; k < 4; ++k) {
        const int pair = 4 * half + k;  // this chunk's sub-blocks are 2*pair and 2*pair+1.
        const __m256i scale = _mm256_shuffle_epi8(
            _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(pair)), split_pair);
        const __m256i q8v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * k));
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], q8v), scale);
        if (k & 1) {
          sumi1 = _mm256_add_epi32(sumi1, p);
        } else {
          sumi0 = _mm256_add_epi32(sumi0, p);
        }
      }
      ql += 64;
      qh += 32;
      q8 += 128;
    }
    const __m256i sumi = _mm256_sub_epi32(_mm256_add_epi32(sumi0, sumi1), offset);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return HorizontalSum(acc);
}

}  // namespace fucina::avx2
