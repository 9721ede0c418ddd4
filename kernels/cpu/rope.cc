#include "kernels/rope.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace fucina {
namespace {

// Inverse frequency of pair i in double: base^(-2i / n_rot) / freq_factor[i].
inline double InvFreq(const RopeParams& p, int i) {
  const double f = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_rot);
  return p.freq_factors != nullptr ? f / p.freq_factors[i] : f;
}

// Rotates one head vector with precomputed cos/sin [n_rot / 2]. Written as plain strided loops
// over contiguous arrays so the compiler vectorizes them at the baseline ISA; RoPE is a tiny
// share of a layer's work, so it has no hand-written SIMD path.
inline void RotateHead(RopeMode mode, int n_rot, const float* c, const float* s, float* x) {
  const int half = n_rot / 2;
  if (mode == RopeMode::kNeox) {
    float* a = x;
    float* b = x + half;
    for (int i = 0; i < half; ++i) {
      const float x0 = a[i];
      const float x1 = b[i];
      a[i] = x0 * c[i] - x1 * s[i];
      b[i] = x0 * s[i] + x1 * c[i];
    }
  } else {
    for (int i = 0; i < half; ++i) {
      const float x0 = x[2 * i];
      const float x1 = x[2 * i + 1];
      x[2 * i] = x0 * c[i] - x1 * s[i];
      x[2 * i + 1] = x0 * s[i] + x1 * c[i];
    }
  }
}

}  // namespace

void RopeTable::Build(const RopeParams& params, const int64_t* pos, int64_t n_pos) {
  params_ = params;
  params_.freq_factors = nullptr;  // folded into the table; the pointer need not outlive it.
  n_pos_ = n_pos;
  const int half = params.n_rot / 2;
  cos_.resize(static_cast<size_t>(n_pos * half));
  sin_.resize(static_cast<size_t>(n_pos * half));
  // One inverse-frequency row per call; angles per (position, pair) in double.
  std::vector<double> f(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) f[i] = InvFreq(params, i);
  for (int64_t t = 0; t < n_pos; ++t) {
    const double p = static_cast<double>(pos[t]);
    float* c = cos_.data() + t * half;
    float* s = sin_.data() + t * half;
    for (int i = 0; i < half; ++i) {
      const double theta = p * f[i];
      c[i] = static_cast<float>(std::cos(theta));
      s[i] = static_cast<float>(std::sin(theta));
    }
  }
}

void ApplyRope(const RopeTable& table, float* x, int64_t n_tokens, int num_heads) {
  const RopeParams& p = table.params();
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* c = table.Cos(t);
    const float* s = table.Sin(t);
    for (int h = 0; h < num_heads; ++h) {
      RotateHead(p.mode, p.n_rot, c, s, x + (t * num_heads + h) * p.head_dim);
    }
  }
}

void RopeBatch(float* x, int64_t n_tokens, int num_heads, const RopeParams& params,
               const int64_t* pos) {
  RopeTable table;
  table.Build(params, pos, n_tokens);
  ApplyRope(table, x, n_tokens, num_heads);
}

void Rope(float* x, int num_heads, const RopeParams& params, int64_t pos) {
  RopeBatch(x, 1, num_heads, params, &pos);
}

void RopeBatchRef(float* x, int64_t n_tokens, int num_heads, const RopeParams& params,
                  const int64_t* pos) {
  const int half = params.n_rot / 2;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * params.head_dim;
      for (int i = 0; i < half; ++i) {
        const double theta =
            static_cast<double>(pos[t]) *
            std::pow(static_cast<double>(params.freq_base), -2.0 * i / params.n_rot) /
            (params.freq_factors != nullptr ? params.freq_factors[i] : 1.0);
        const int i0 = params.mode == RopeMode::kNeox ? i : 2 * i;
        const int i1 = params.mode == RopeMode::kNeox ? i + half : 2 * i + 1;
        const double x0 = v[i0];
        const double x1 = v[i1];
        v[i0] = static_cast<float>(x0 * std::cos(theta) - x1 * std::sin(theta));
        v[i1] = static_cast<float>(x0 * std::sin(theta) + x1 * std::cos(theta));
      }
    }
  }
}

}  // namespace fucina
