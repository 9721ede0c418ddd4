// Scalar IEEE half and bfloat16 conversions, bit-exact with ggml's reference conversions
// (round-to-nearest-even; NaN stays NaN). The SIMD paths use F16C / AVX-512 BF16 instead
// and are tested against these.
#ifndef FUCINA_KERNELS_FP16_H_
#define FUCINA_KERNELS_FP16_H_

#include <cstdint>
#include <cstring>

namespace fucina {

// These helpers are `static inline` on purpose: headers included by kernels/cpu/avx2/ and
// avx512/ files are compiled there with ISA flags, and an ordinary inline function is one
// COMDAT symbol the linker may take from an AVX-512 object for use on any CPU. Internal
// linkage gives each object its own copy. (The same holds for any inline code those files use.)

using f16_t = uint16_t;   // IEEE 754 binary16 bits.
using bf16_t = uint16_t;  // bfloat16 bits (upper half of an f32).

static inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Half -> float, exact for every input (including subnormals, inf, NaN).
static inline float Fp16ToFp32(f16_t h) {
  // Maxim Kapustin's branch-light method, as in ggml (fp16 to fp32 via exponent rebias).
  const uint32_t w = static_cast<uint32_t>(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = BitsToFloat(0x7800000u);  // 2^-112
  const float normalized = BitsToFloat((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = BitsToFloat((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result =
      sign | (two_w < denormalized_cutoff ? FloatToBits(denormalized) : FloatToBits(normalized));
  return BitsToFloat(result);
}

// Float -> half with round-to-nearest-even; overflow -> inf, NaN -> NaN.
static inline f16_t Fp32ToFp16(float f) {
  const float scale_to_inf = BitsToFloat(0x77800000u);   // 2^112
  const float scale_to_zero = BitsToFloat(0x08800000u);  // 2^-110
  float abs_f = BitsToFloat(FloatToBits(f) & 0x7FFFFFFFu);
  float base = (abs_f * scale_to_inf) * scale_to_zero;
  const uint32_t w = FloatToBits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = BitsToFloat((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = FloatToBits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<f16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float Bf16ToFp32(bf16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// Float -> bfloat16 with round-to-nearest-even; NaN is kept quiet (ggml's rule).
static inline bf16_t Fp32ToBf16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<bf16_t>((u >> 16) | 64);
  return static_cast<bf16_t>((u + (0x7FFFu + ((u >> 16) & 1))) >> 16);
}

}  // namespace fucina

#endif  // FUCINA_KERNELS_FP16_H_
