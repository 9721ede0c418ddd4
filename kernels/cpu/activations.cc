#include "kernels/activations.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"
#include "kernels/fp16.h"

namespace fucina {
namespace {

constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
constexpr float kGeluCoefA = 0.044715f;
constexpr double kSqrtHalf = 0.70710678118654752440084436210485;

inline float SiluScalar(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace

void SiluRef(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = SiluScalar(x[i]);
}

void Silu(const float* x, float* y, int64_t n) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return avx512::Silu(x, y, n);
    case Isa::kAvx2:
      return avx2::Silu(x, y, n);
    case Isa::kScalar:
      break;
  }
  SiluRef(x, y, n);
}

void GeluTanhRef(const float* x, float* y, int64_t n) {
  // ggml's formula; tanh taken in double so the reference itself does not lose digits where
  // 1 + tanh(u) cancels (large negative x).
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double u = kSqrt2OverPi * v * (1.0 + kGeluCoefA * v * v);
    y[i] = static_cast<float>(0.5 * v * (1.0 + std::tanh(u)));
  }
}

void GeluTanh(const float* x, float* y, int64_t n) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return avx512::GeluTanh(x, y, n);
    case Isa::kAvx2:
      return avx2::GeluTanh(x, y, n);
    case Isa::kScalar:
      break;
  }
  GeluTanhRef(x, y, n);
}

void SoftCapRef(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] * inv) * cap;
}

void SoftCap(float* x, int64_t n, float cap) {
  if (ActiveIsa() >= Isa::kAvx2) return avx2::SoftCap(x, n, cap);
  SoftCapRef(x, n, cap);
}

void GeluErfRef(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v * kSqrtHalf)));
  }
}

void GeluErf(const float* x, float* y, int64_t n) { GeluErfRef(x, y, n); }

void SwiGluRef(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = SiluScalar(gate[i]) * up[i];
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return avx512::SwiGlu(gate, up, out, n);
    case Isa::kAvx2:
      return avx2::SwiGlu(gate, up, out, n);
    case Isa::kScalar:
      break;
  }
  SwiGluRef(gate, up, out, n);
}

void SwiGluFusedRef(const float* gate_up, float* out, int64_t rows, int64_t ff) {
  for (int64_t r = 0; r < rows; ++r) {
    SwiGluRef(gate_up + r * 2 * ff, gate_up + r * 2 * ff + ff, out + r * ff, ff);
  }
}

void SwiGluFused(const float* gate_up, float* out, int64_t rows, int64_t ff) {
  for (int64_t r = 0; r < rows; ++r) {
    SwiGlu(gate_up + r * 2 * ff, gate_up + r * 2 * ff + ff, out + r * ff, ff);
  }
}

namespace {

// ggml_gelu_f32 in float, on an f16-rounded input, rounded to f16.
float GeluF16(float x) {
  const float v = Fp16ToFp32(Fp32ToFp16(x));
  const float g = 0.5f * v *
                  (1.0f + std::tanh(static_cast<float>(kSqrt2OverPi) * v *
                                    (1.0f + static_cast<float>(kGeluCoefA) * v * v)));
  return Fp16ToFp32(Fp32ToFp16(g));
}

float GeGluOne(float gate, float up, const float* table) {
  if (gate <= -10.0f) return 0.0f;
  if (gate >= 10.0f) return gate * up;
  return (table != nullptr ? table[Fp32ToFp16(gate)] : GeluF16(gate)) * up;
}

const float* GeluF16Table() {
  static const std::vector<float>* table = [] {
    auto* t = new std::vector<float>(65536);
    for (uint32_t h = 0; h < 65536; ++h) {
      (*t)[h] = GeluF16(Fp16ToFp32(static_cast<f16_t>(h)));
    }
    return t;
  }();
  return table->data();
}

}  // namespace

void GeGluRef(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = GeGluOne(gate[i], up[i], nullptr);
}

void GeGlu(const float* gate, const float* up, float* out, int64_t n) {
  const float* table = GeluF16Table();
  if (ActiveIsa() >= Isa::kAvx2) return avx2::GeGlu(gate, up, out, n, table);
  for (int64_t i = 0; i < n; ++i) out[i] = GeGluOne(gate[i], up[i], table);
}

void GeGluFused(const float* gate_up, float* out, int64_t rows, int64_t ff) {
  for (int64_t r = 0; r < rows; ++r) {
    GeGlu(gate_up + r * 2 * ff, gate_up + r * 2 * ff + ff, out + r * ff, ff);
  }
}

}  // namespace fucina
