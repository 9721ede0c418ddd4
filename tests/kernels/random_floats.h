// Test helper: reproducible uniform floats for the kernel tests' operands.
#ifndef FUCINA_TESTS_KERNELS_RANDOM_FLOATS_H_
#define FUCINA_TESTS_KERNELS_RANDOM_FLOATS_H_

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace fucina {

// n floats uniform in [lo, hi) from a generator seeded with `seed`.
inline std::vector<float> Random(int64_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace fucina

#endif  // FUCINA_TESTS_KERNELS_RANDOM_FLOATS_H_
