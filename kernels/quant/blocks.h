// ggml quantization block layouts, byte-for-byte as stored in GGUF files.
//
// A quantized row of n elements is n / kBlock consecutive blocks (n must be a multiple of
// the block size). Each struct's size is asserted against ggml's type_size.
#ifndef FUCINA_KERNELS_QUANT_BLOCKS_H_
#define FUCINA_KERNELS_QUANT_BLOCKS_H_

#include <cstdint>

#include "kernels/fp16.h"

namespace fucina {

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK4_1 = 32;
inline constexpr int kQK5_0 = 32;
inline constexpr int kQK5_1 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK8_1 = 32;
inline constexpr int kQK_K = 256;      // super-block size of the k-quants.
inline constexpr int kKScaleSize = 12;  // packed 6-bit scales/mins of Q4_K and Q5_K.

// x[i] = d * (q[i] - 8); element j in low nibble of qs[j], element j+16 in the high nibble.
struct BlockQ4_0 {
  f16_t d;
  uint8_t qs[kQK4_0 / 2];
};

// x[i] = d * q[i] + m.
struct BlockQ4_1 {
  f16_t d;
  f16_t m;
  uint8_t qs[kQK4_1 / 2];
};

// x[i] = d * (q[i] - 16); the 5th bit of element j is bit j of qh (little-endian uint32).
struct BlockQ5_0 {
  f16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK5_0 / 2];
};

// x[i] = d * q[i] + m; qh as in Q5_0.
struct BlockQ5_1 {
  f16_t d;
  f16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};

// x[i] = d * qs[i].
struct BlockQ8_0 {
  f16_t d;
  int8_t qs[kQK8_0];
};

// Activation format for Q4_1/Q5_1 dots: s = d * sum(qs) carries the offset term.
struct BlockQ8_1 {
  f16_t d;
  f16_t s;
  int8_t qs[kQK8_1];
};

// 8 sub-blocks of 32 with 6-bit scales and mins (packed in `scales`):
// x = d * sc * q - dmin * m, q in [0, 15].
struct BlockQ4_K {
  f16_t d;
  f16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qs[kQK_K / 2];
};

// As Q4_K with a 5th bit per element in qh.
struct BlockQ5_K {
  f16_t d;
  f16_t dmin;
  uint8_t scales[kKScaleSize];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};

// 16 sub-blocks of 16, 8-bit signed scales: x = d * scales[j] * (q - 32), q in [0, 63]
// (low 4 bits in ql, high 2 bits in qh).
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  f16_t d;
};

// Activation format for k-quant dots: f32 scale, bsums[j] = sum of qs[16j .. 16j+15].
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);

}  // namespace fucina

#endif  // FUCINA_KERNELS_QUANT_BLOCKS_H_
