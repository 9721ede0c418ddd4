// The 256-element k-quants (Q4_K, Q5_K, Q6_K) and their activation format Q8_K.
//
// Contract: n is a multiple of kQK_K; rows are contiguous blocks; nothing is allocated.
// The unqualified functions are the scalar references, bit-exact with ggml's reference C code
// (dequantize_row_q*_K, quantize_row_q*_K_ref — the make_qkx2_quants / make_qx_quants search —
// quantize_row_q8_K_ref, ggml_vec_dot_q*_K_q8_K generic). The avx2:: and avx512:: functions
// compute the same values: quantizers bit-exact, dots within float reassociation error.
#ifndef FUCINA_KERNELS_QUANT_K_QUANTS_H_
#define FUCINA_KERNELS_QUANT_K_QUANTS_H_

#include <cstdint>

#include "kernels/quant/blocks.h"

namespace fucina {

void DequantizeRowQ4_K(const BlockQ4_K* x, float* y, int64_t n);
void DequantizeRowQ5_K(const BlockQ5_K* x, float* y, int64_t n);
void DequantizeRowQ6_K(const BlockQ6_K* x, float* y, int64_t n);
void DequantizeRowQ8_K(const BlockQ8_K* x, float* y, int64_t n);

// Weight quantizers (no importance matrix), as llama-quantize without --imatrix.
void QuantizeRowQ4_K(const float* x, BlockQ4_K* y, int64_t n);
void QuantizeRowQ5_K(const float* x, BlockQ5_K* y, int64_t n);
void QuantizeRowQ6_K(const float* x, BlockQ6_K* y, int64_t n);
// Activation quantizer.
void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t n);

float VecDotQ4_KQ8_K(int64_t n, const BlockQ4_K* x, const BlockQ8_K* y);
float VecDotQ5_KQ8_K(int64_t n, const BlockQ5_K* x, const BlockQ8_K* y);
float VecDotQ6_KQ8_K(int64_t n, const BlockQ6_K* x, const BlockQ8_K* y);

#define FUCINA_K_ISA_DECLS                                                  \
  void QuantizeRowQ8_K(const float* x, BlockQ8_K* y, int64_t n);            \
  float VecDotQ4_KQ8_K(int64_t n, const BlockQ4_K* x, const BlockQ8_K* y);  \
  float VecDotQ5_KQ8_K(int64_t n, const BlockQ5_K* x, const BlockQ8_K* y);  \
  float VecDotQ6_KQ8_K(int64_t n, const BlockQ6_K* x, const BlockQ8_K* y);

// Only callable when ActiveIsa() is at least the namespace's level (kernels/cpu/isa.h).
namespace avx2 { FUCINA_K_ISA_DECLS }
namespace avx512 { FUCINA_K_ISA_DECLS }

}  // namespace fucina

#endif  // FUCINA_KERNELS_QUANT_K_QUANTS_H_
