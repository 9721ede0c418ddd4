// Private to the SIMD k-quant kernels (kernels/cpu/avx2, kernels/cpu/avx512): the Q4_K/Q5_K
// scale regrouping both ISAs start from.
//
// `static inline` (internal linkage), as in avx2_util.h: each including file is compiled with
// its own ISA flags and must keep its own copy.
#ifndef FUCINA_KERNELS_CPU_K_SCALES_H_
#define FUCINA_KERNELS_CPU_K_SCALES_H_

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace fucina {

// The 12 packed bytes of Q4_K/Q5_K scales as 8 scales (bytes 0..7) then 8 mins (bytes 8..15),
// 6 bits each (the same regrouping as ggml's generic dot).
static inline __attribute__((always_inline)) __m128i UnpackScalesMins(const uint8_t* packed) {
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

}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_K_SCALES_H_
