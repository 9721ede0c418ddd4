// Test helper: the SIMD levels this machine runs, for tests that check each one.
#ifndef FUCINA_TESTS_KERNELS_SIMD_ISAS_H_
#define FUCINA_TESTS_KERNELS_SIMD_ISAS_H_

#include <vector>

#include "kernels/cpu/isa.h"

namespace fucina {

// AVX2 up to DetectedIsa(); empty on a CPU without AVX2.
inline std::vector<Isa> SimdIsas() {
  std::vector<Isa> isas;
  for (int i = static_cast<int>(Isa::kAvx2); i <= static_cast<int>(DetectedIsa()); ++i) {
    isas.push_back(static_cast<Isa>(i));
  }
  return isas;
}

}  // namespace fucina

#endif  // FUCINA_TESTS_KERNELS_SIMD_ISAS_H_
