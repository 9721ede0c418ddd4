#include "kernels/cpu/isa.h"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace fucina {
namespace {

struct Features {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512bf16 = false;
  bool os_avx = false, os_avx512 = false;
};

uint64_t ReadXcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

Features Probe() {
  Features f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  if (osxsave) {
    const uint64_t xcr0 = ReadXcr0();
    f.os_avx = (xcr0 & 0x6) == 0x6;                // XMM + YMM state.
    f.os_avx512 = f.os_avx && (xcr0 & 0xE0) == 0xE0;  // opmask + ZMM state.
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = b & (1u << 5);
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512vnni = c & (1u << 11);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = a & (1u << 5);
  return f;
}

const Features& Cpu() {
  static const Features features = Probe();
  return features;
}

}  // namespace

Isa DetectedIsa() {
  const Features& f = Cpu();
  if (!(f.os_avx && f.avx2 && f.fma && f.f16c)) return Isa::kScalar;
  if (f.os_avx512 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni) {
    return Isa::kAvx512;
  }
  return Isa::kAvx2;
}

bool HasAvx512Bf16() { return DetectedIsa() == Isa::kAvx512 && Cpu().avx512bf16; }

Isa ActiveIsa() {
  static const Isa active = [] {
    Isa isa = DetectedIsa();
    if (const char* env = std::getenv("FUCINA_ISA")) {
      const std::string_view cap(env);
      Isa limit = isa;
      if (cap == "scalar") limit = Isa::kScalar;
      if (cap == "avx2") limit = Isa::kAvx2;
      if (static_cast<int>(limit) < static_cast<int>(isa)) isa = limit;
    }
    return isa;
  }();
  return active;
}

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

}  // namespace fucina
