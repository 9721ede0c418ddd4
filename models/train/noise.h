// Counter-based Gaussian noise for evolution-strategies training.
//
// ES workers exchange only seeds and fitness scalars, so every worker must regenerate the same
// perturbation for (job seed, generation, member pair, parameter, element) on its own, bit for
// bit, on any machine, thread count or ISA; the noise is never stored or sent. Hence a
// counter-based generator (each element's value is a pure function of its key and index, so
// threads may split a tensor anywhere) and a Box-Muller transform built only from IEEE-754
// double +, -, *, / and sqrt, which are correctly rounded everywhere, instead of libm's log,
// sin and cos, whose last bits differ between libraries (and numpy's SIMD versions).
//
// The recipe, complete enough to reimplement elsewhere (tests/models/train/noise_ref.py does,
// in Python on numpy's Philox):
//
//   Block. Element i (i >= 0) of the noise vector for key (seed, generation, member,
//   parameter) lies in block b = i / 4, lane i % 4. The block's four 64-bit words are
//     (x0, x1, x2, x3) = Philox4x64_10(counter = (b, member, generation, 0),
//                                       key = (seed, parameter)).
//   Lanes 0 and 1 are NormalPair(x0, x1)[0] and [1]; lanes 2 and 3 are NormalPair(x2, x3)[0]
//   and [1]. Counter word 3 is always 0 here: another use of a job's seed (data order, say)
//   must put a nonzero tag there so it never reuses noise words.
//
//   NormalPair(w0, w1), every step in IEEE-754 binary64 with round-to-nearest-even, no fused
//   multiply-add, left to right as written:
//     Radius. v = (w0 >> 11) + 1, an integer in [1, 2^53], so u = v * 2^-53 lies in (0, 1].
//       e = floor(log2(v)) (63 - countl_zero(v)); m = double(v) * 2^-e, exact, in [1, 2).
//       If m > kSqrt2: m = m * 0.5 and e = e + 1 (so m lies in (sqrt(2)/2, sqrt(2)]).
//       s = (m - 1) / (m + 1); z = s * s;
//       p = L[10]; for k = 9 down to 0: p = p * z + L[k];     L[k] = double(1 / (2k + 1))
//       log_u = double(e - 53) * kLn2 + (2 * s) * p;          ln(u) = ln(m) + (e - 53) ln 2
//       r = sqrt(-2 * log_u)   (-0.0 when u = 1, as IEEE sqrt(-0) is).
//     Angle. a = w1 >> 11, an integer in [0, 2^53), the angle 2 pi a / 2^53.
//       octant = a >> 50 (0..7), quadrant q = octant >> 1, t = a & (2^50 - 1).
//       Even octant: phi = double(t) * kTwoPiOver2p53;  co = cos(phi), si = sin(phi).
//       Odd octant:  phi = double(2^50 - t) * kTwoPiOver2p53;  co = sin(phi), si = cos(phi)
//         (the angle is q * pi/2 + (pi/2 - phi)).
//       with, for phi in [0, pi/4] and z = phi * phi,
//         sin(phi) = phi * S(z): p = S[8]; for k = 7 down to 0: p = p * z + S[k];
//                                                              S[k] = double((-1)^k / (2k+1)!)
//         cos(phi) = C(z):       p = C[9]; for k = 8 down to 0: p = p * z + C[k];
//                                                              C[k] = double((-1)^k / (2k)!)
//       Rotate by the quadrant: (cos, sin) = q0: (co, si); q1: (-si, co); q2: (-co, -si);
//       q3: (si, -co).
//     Result: {float(r * cos), float(r * sin)}, each rounded to nearest-even binary32.
//   double(x) of a rational x is the nearest binary64 (round half to even); the constants are
//     kSqrt2 = 0x1.6a09e667f3bcdp+0, kLn2 = 0x1.62e42fefa39efp-1,
//     kTwoPiOver2p53 = 0x1.921fb54442d18p-51 (double(2 pi) * 2^-53).
//
// The truncated series are accurate to ~1e-16, far below float's resolution; |result| <= 8.6.
//
// Thread safety: all functions are pure; FillNormal with a pool follows ThreadPool's one-job
// rule.
#ifndef FUCINA_MODELS_TRAIN_NOISE_H_
#define FUCINA_MODELS_TRAIN_NOISE_H_

#include <array>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace fucina {

// Philox4x64 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11; the Random123 reference): a keyed bijection of 256-bit counters, word 0 the least
// significant. numpy's np.random.Philox is the same function, but random_raw increments the
// counter first: Philox(counter=C - 1, key=k0 + 2^64 k1).random_raw(4) is block C.
std::array<uint64_t, 4> Philox4x64_10(const std::array<uint64_t, 4>& counter,
                                      const std::array<uint64_t, 2>& key);

// Two independent standard normals from two uniform 64-bit words, as the recipe above says.
std::array<float, 2> NormalPair(uint64_t radius_word, uint64_t angle_word);

// Names one noise vector. `member` is the antithetic pair index: +eps and -eps share it and
// the caller applies the sign. `parameter` is the caller's stable index of the tensor.
struct NoiseKey {
  uint64_t seed = 0;
  uint64_t generation = 0;
  uint64_t member = 0;
  uint64_t parameter = 0;
};

// Writes elements [offset, offset + n) of `key`'s noise vector to out[0, n). Requires
// offset >= 0 and offset + n <= INT64_MAX; n <= 0 writes nothing. Any split of a range gives
// the same values, so callers may cut a tensor anywhere.
void FillNormal(const NoiseKey& key, int64_t offset, int64_t n, float* out);

// The same values, with [offset, offset + n) split over `pool`.
void FillNormal(const NoiseKey& key, int64_t offset, int64_t n, float* out, ThreadPool& pool);

// Scalar reference: one element at a time, straight from the recipe (no block reuse).
void FillNormalRef(const NoiseKey& key, int64_t offset, int64_t n, float* out);

}  // namespace fucina

#endif  // FUCINA_MODELS_TRAIN_NOISE_H_
