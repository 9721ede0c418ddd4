// Private to kernels/cpu/avx512: loads and unpacking of 32-element legacy blocks, two blocks
// per 512-bit register, shared by quant_legacy_avx512.cc (vec_dot), gemm_avx512.cc (tiles)
// and k_quants_avx512.cc (Q8_K activation pieces).
//
// Everything here is `static inline` (internal linkage): the including files are compiled with
// AVX-512 flags, and an ordinary inline function would let the linker keep one AVX-512-compiled
// copy for the whole program (see docs/kernels.md). always_inline because the tile kernels rely
// on these disappearing into their loops.
#ifndef FUCINA_KERNELS_CPU_AVX512_AVX512_UTIL_H_
#define FUCINA_KERNELS_CPU_AVX512_AVX512_UTIL_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

// GCC 12's AVX-512 intrinsics pass a self-initialized "undefined" vector (GCC bug 105593),
// which -W(maybe-)uninitialized reports where they are inlined; silenced for these lines.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace fucina::avx512 {

#define FUCINA_AVX512_INLINE static inline __attribute__((always_inline))

// Two 32-byte pieces as one vector (low half = a, high half = b).
FUCINA_AVX512_INLINE __m512i LoadQs(const int8_t* a, const int8_t* b) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// Two blocks' 16 packed bytes each -> 64 bytes in element order: a's low nibbles (elements
// 0..15), a's high nibbles (16..31), then b's.
FUCINA_AVX512_INLINE __m512i UnpackNibbles(const uint8_t* a, const uint8_t* b) {
  const __m256i packed = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(packed),
                                          _mm256_srli_epi16(packed, 4), 1);  // [a, b, a>>4, b>>4]
  return _mm512_and_si512(_mm512_shuffle_i64x2(both, both, _MM_SHUFFLE(3, 1, 2, 0)),
                          _mm512_set1_epi8(0x0F));
}

// Adds 16 to the bytes of UnpackNibbles' result whose 5th bit is set (qh, bit j <-> element j
// of its block).
FUCINA_AVX512_INLINE __m512i AddHighBits(__m512i q, const uint8_t* qh_a, const uint8_t* qh_b) {
  uint32_t a, b;
  std::memcpy(&a, qh_a, sizeof(a));
  std::memcpy(&b, qh_b, sizeof(b));
  const __mmask64 m = static_cast<__mmask64>(a) | (static_cast<__mmask64>(b) << 32);
  return _mm512_mask_add_epi8(q, m, q, _mm512_set1_epi8(0x10));
}

#undef FUCINA_AVX512_INLINE

}  // namespace fucina::avx512

#pragma GCC diagnostic pop

#endif  // FUCINA_KERNELS_CPU_AVX512_AVX512_UTIL_H_
