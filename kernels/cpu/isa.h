// Runtime CPU feature detection. Kernels choose a path once (type_traits.cc) from the best
// level this CPU supports; FUCINA_ISA=scalar|avx2|avx512 caps it (tests and benchmarks).
#ifndef FUCINA_KERNELS_CPU_ISA_H_
#define FUCINA_KERNELS_CPU_ISA_H_

#include <string_view>

namespace fucina {

// Ordered: each level implies the ones below it.
enum class Isa {
  kScalar = 0,
  kAvx2 = 1,    // AVX2 + FMA + F16C.
  kAvx512 = 2,  // AVX-512 F/BW/VL/DQ + VNNI (Cascade Lake, Zen 4 and later). BF16 is separate.
};

// What the CPU supports, ignoring FUCINA_ISA.
Isa DetectedIsa();
// DetectedIsa() capped by the FUCINA_ISA environment variable (read once).
Isa ActiveIsa();
// Whether AVX512_BF16 is present (only meaningful when DetectedIsa() == kAvx512).
bool HasAvx512Bf16();

std::string_view IsaName(Isa isa);

}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_ISA_H_
