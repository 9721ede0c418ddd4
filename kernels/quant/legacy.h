// Plain float types (F32, F16, BF16) and the 32-element "legacy" quants (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q8_1): conversion to/from f32 and the dot products a matvec uses.
//
// Contract for every function here: n is a multiple of the format's block size (1 for the float
// types); rows are contiguous blocks; nothing is allocated. The unqualified functions are the
// scalar references, bit-exact with ggml's reference C code (quantize_row_*_ref,
// dequantize_row_*, ggml_vec_dot_*). The avx2:: and avx512:: functions compute the same values:
// quantizers and dequantizers bit-exact, dots within float reassociation error (tests state the
// tolerance).
//
// Dot pairs (weights x activations), as ggml's vec_dot_type:
//   Q4_0, Q5_0, Q8_0 x Q8_0;  Q4_1, Q5_1 x Q8_1;  F32, F16, BF16 x F32.
#ifndef FUCINA_KERNELS_QUANT_LEGACY_H_
#define FUCINA_KERNELS_QUANT_LEGACY_H_

#include <cstdint>

#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina {

void ConvertF32ToF16(const float* x, f16_t* y, int64_t n);
void ConvertF16ToF32(const f16_t* x, float* y, int64_t n);
void ConvertF32ToBf16(const float* x, bf16_t* y, int64_t n);
void ConvertBf16ToF32(const bf16_t* x, float* y, int64_t n);

void DequantizeRowQ4_0(const BlockQ4_0* x, float* y, int64_t n);
void DequantizeRowQ4_1(const BlockQ4_1* x, float* y, int64_t n);
void DequantizeRowQ5_0(const BlockQ5_0* x, float* y, int64_t n);
void DequantizeRowQ5_1(const BlockQ5_1* x, float* y, int64_t n);
void DequantizeRowQ8_0(const BlockQ8_0* x, float* y, int64_t n);

// Round-to-nearest quantizers (ggml's quantize_row_*_ref): weights and activations alike.
void QuantizeRowQ4_0(const float* x, BlockQ4_0* y, int64_t n);
void QuantizeRowQ4_1(const float* x, BlockQ4_1* y, int64_t n);
void QuantizeRowQ5_0(const float* x, BlockQ5_0* y, int64_t n);
void QuantizeRowQ5_1(const float* x, BlockQ5_1* y, int64_t n);
void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n);
void QuantizeRowQ8_1(const float* x, BlockQ8_1* y, int64_t n);

float VecDotF32(int64_t n, const float* x, const float* y);
float VecDotF16F32(int64_t n, const f16_t* x, const float* y);
float VecDotBf16F32(int64_t n, const bf16_t* x, const float* y);
float VecDotQ4_0Q8_0(int64_t n, const BlockQ4_0* x, const BlockQ8_0* y);
float VecDotQ4_1Q8_1(int64_t n, const BlockQ4_1* x, const BlockQ8_1* y);
float VecDotQ5_0Q8_0(int64_t n, const BlockQ5_0* x, const BlockQ8_0* y);
float VecDotQ5_1Q8_1(int64_t n, const BlockQ5_1* x, const BlockQ8_1* y);
float VecDotQ8_0Q8_0(int64_t n, const BlockQ8_0* x, const BlockQ8_0* y);

#define FUCINA_LEGACY_ISA_DECLS                                                \
  void ConvertF32ToF16(const float* x, f16_t* y, int64_t n);                   \
  void ConvertF16ToF32(const f16_t* x, float* y, int64_t n);                   \
  void ConvertBf16ToF32(const bf16_t* x, float* y, int64_t n);                 \
  void QuantizeRowQ8_0(const float* x, BlockQ8_0* y, int64_t n);               \
  void QuantizeRowQ8_1(const float* x, BlockQ8_1* y, int64_t n);               \
  float VecDotF32(int64_t n, const float* x, const float* y);                  \
  float VecDotF16F32(int64_t n, const f16_t* x, const float* y);               \
  float VecDotBf16F32(int64_t n, const bf16_t* x, const float* y);             \
  float VecDotQ4_0Q8_0(int64_t n, const BlockQ4_0* x, const BlockQ8_0* y);     \
  float VecDotQ4_1Q8_1(int64_t n, const BlockQ4_1* x, const BlockQ8_1* y);     \
  float VecDotQ5_0Q8_0(int64_t n, const BlockQ5_0* x, const BlockQ8_0* y);     \
  float VecDotQ5_1Q8_1(int64_t n, const BlockQ5_1* x, const BlockQ8_1* y);     \
  float VecDotQ8_0Q8_0(int64_t n, const BlockQ8_0* x, const BlockQ8_0* y);

// Only callable when ActiveIsa() is at least the namespace's level (kernels/cpu/isa.h).
namespace avx2 { FUCINA_LEGACY_ISA_DECLS }
namespace avx512 { FUCINA_LEGACY_ISA_DECLS }

}  // namespace fucina

#endif  // FUCINA_KERNELS_QUANT_LEGACY_H_
