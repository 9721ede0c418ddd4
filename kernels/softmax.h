// Numerically stable row softmax, in place, with an optional scale and additive mask:
//   y[r][j] = scale * x[r][j] + (mask ? mask[r * mask_row_stride + j] : 0)
//   x[r][j] = exp(y[r][j] - max_j y[r]) / sum_j exp(y[r][j] - max_j y[r])
// Shapes: x [rows, n]; mask rows of n floats, mask_row_stride apart (0 = one row shared by all
// rows). Mask entries may be -inf; a row whose entries are all -inf becomes all zeros (not
// NaN), so a fully masked row contributes nothing downstream.
#ifndef FUCINA_KERNELS_SOFTMAX_H_
#define FUCINA_KERNELS_SOFTMAX_H_

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace fucina {

// Dispatched by ActiveIsa(). SIMD paths use a polynomial exp (max relative error ~2 ulp,
// ~1.4e-7 measured, tested against std::exp) and float sums; results match SoftmaxRef within
// 1e-6 relative + 1e-12 absolute per element.
void Softmax(float* x, int64_t rows, int64_t n, float scale, const float* mask,
             int64_t mask_row_stride);

// Scalar reference: exp and the normalizing sum in double, rounded to float at the end.
void SoftmaxRef(float* x, int64_t rows, int64_t n, float scale, const float* mask,
                int64_t mask_row_stride);

// log(sum_j exp(x[j])) over x[0, n): the normalizer of a log-softmax (a sampled token's
// logprob is x[id] - LogSumExp). NaN entries count as -inf; -inf when every entry is (or n is
// 0), +inf when one is +inf. Dispatched by ActiveIsa(): the SIMD paths take the max and the
// exps of the differences in vectors (Softmax's exp, ~2 ulp) and sum them in double, within
// 1e-6 of LogSumExpRef for rows up to 256k entries; `scratch` holds n floats.
double LogSumExp(const float* x, int64_t n, float* scratch);
// The same at a given ISA level (at most DetectedIsa()), for tests.
double LogSumExpIsa(const float* x, int64_t n, float* scratch, Isa isa);

// Scalar reference: the max, then std::exp of the differences summed in double.
double LogSumExpRef(const float* x, int64_t n);

// The first index of the largest of x[0, n) (n > 0): a greedy sampler's choice, ties to the
// lowest id. NaN entries count as -inf; 0 when every entry is -inf or NaN. Dispatched by
// ActiveIsa(): the SIMD paths take the max, then find its first index, in vectors.
int64_t ArgMax(const float* x, int64_t n);
// The same at a given ISA level (at most DetectedIsa()), for tests.
int64_t ArgMaxIsa(const float* x, int64_t n, Isa isa);

// Scalar reference: one pass, keeping the first strictly larger entry.
int64_t ArgMaxRef(const float* x, int64_t n);

// The first i with x[i] >= value, n when none (NaN entries never match): how a sampler's
// bounded heap skips the long run of a row's tokens below its worst kept one. Dispatched by
// ActiveIsa(), vector compares; FindAtLeastRef is the scalar loop.
int64_t FindAtLeast(const float* x, int64_t n, float value);
int64_t FindAtLeastRef(const float* x, int64_t n, float value);

}  // namespace fucina

#endif  // FUCINA_KERNELS_SOFTMAX_H_
