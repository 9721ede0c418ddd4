// A fixed, fully specified pseudo-random generator for sampling, so that a seed names the same
// token sequence on every machine, compiler and process (std::mt19937 is portable but the
// std::*_distribution algorithms are not, so none are used).
//
// Algorithm (tests/models/sampler/rng_ref.py re-implements it independently):
//   * Seeding: the four 64-bit state words are the first four outputs of SplitMix64 started at
//     `seed`:  x += 0x9E3779B97F4A7C15; z = x; z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9;
//            z = (z ^ (z >> 27)) * 0x94D049BB133111EB; out = z ^ (z >> 31).
//     (SplitMix64 never yields four zero words, so the state is never all zero.)
//   * NextU64: xoshiro256** (Blackman & Vigna 2018):
//       out = rotl(s1 * 5, 7) * 9; t = s1 << 17;
//       s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3; s2 ^= t; s3 = rotl(s3, 45).
//   * NextFloat: the top 24 bits of NextU64, times 2^-24: a float in [0, 1), exactly one of
//     the 2^24 multiples of 2^-24 (every one exactly representable), so no rounding to 1.0.
//   * PositionDraw(seed, position): the first NextFloat of a generator seeded with
//     seed XOR SplitMix64(position) (one SplitMix64 step from state `position`). Sampling draws
//     by position: a counter, not a stream, so a verify pass can sample any position with the
//     draw plain decoding gives it.
#ifndef FUCINA_MODELS_SAMPLER_RNG_H_
#define FUCINA_MODELS_SAMPLER_RNG_H_

#include <cmath>
#include <cstdint>

namespace fucina {

// One SplitMix64 step: advances *state and returns the next output.
inline uint64_t SplitMix64Next(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Standard normals over SplitMix64 started at `seed`, by Box-Muller in double: u1 and u2 are
// (next() >> 11) * 2^-53 (u1 taken as 1 - u1 so log never sees 0), one normal per pair:
// sqrt(-2 ln u1) cos(2 pi u2). Weight initialisation (fixtures, LoRA A); not for sampling.
class NormalStream {
 public:
  explicit NormalStream(uint64_t seed) : state_(seed) {}
  double Uniform() { return static_cast<double>(SplitMix64Next(&state_) >> 11) * 0x1.0p-53; }
  double Normal() {
    const double u1 = 1.0 - Uniform();
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }

 private:
  uint64_t state_;
};

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t sm = seed;
    for (uint64_t& w : s_) w = SplitMix64Next(&sm);
  }

  uint64_t NextU64() {
    const uint64_t out = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return out;
  }

  // Uniform in [0, 1): (NextU64() >> 40) * 2^-24.
  float NextFloat() { return static_cast<float>(NextU64() >> 40) * 0x1.0p-24f; }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s_[4];
};

// The sampling draw of sequence position `position` (the index the sampled token takes).
inline float PositionDraw(uint64_t seed, int64_t position) {
  uint64_t p = static_cast<uint64_t>(position);
  return Rng(seed ^ SplitMix64Next(&p)).NextFloat();
}

}  // namespace fucina

#endif  // FUCINA_MODELS_SAMPLER_RNG_H_
