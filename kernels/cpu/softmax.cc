#include "kernels/softmax.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"

namespace fucina {

void SoftmaxRef(float* x, int64_t rows, int64_t n, float scale, const float* mask,
                int64_t mask_row_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const float* mr = mask != nullptr ? mask + r * mask_row_stride : nullptr;
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < n; ++j) {
      // The masked logit is formed in float, as the SIMD paths and ggml do.
      const float y = scale * xr[j] + (mr != nullptr ? mr[j] : 0.0f);
      xr[j] = y;
      if (y > max) max = y;
    }
    if (max == -std::numeric_limits<double>::infinity()) {
      for (int64_t j = 0; j < n; ++j) xr[j] = 0.0f;
      continue;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(xr[j]) - max);
    for (int64_t j = 0; j < n; ++j) {
      xr[j] = static_cast<float>(std::exp(static_cast<double>(xr[j]) - max) / sum);
    }
  }
}

void Softmax(float* x, int64_t rows, int64_t n, float scale, const float* mask,
             int64_t mask_row_stride) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return avx512::Softmax(x, rows, n, scale, mask, mask_row_stride);
    case Isa::kAvx2:
      return avx2::Softmax(x, rows, n, scale, mask, mask_row_stride);
    case Isa::kScalar:
      break;
  }
  SoftmaxRef(x, rows, n, scale, mask, mask_row_stride);
}

namespace {

using MaxFn = float (*)(const float*, int64_t);
using ExpFn = float (*)(const float*, float, float*, int64_t);
using FindFn = int64_t (*)(const float*, int64_t, float);

double LogSumExpWith(MaxFn max_of, ExpFn exp_of, const float* x, int64_t n, float* scratch) {
  if (n <= 0) return -std::numeric_limits<double>::infinity();
  const float max = max_of(x, n);  // NaNs ignored; -inf when every entry is -inf or NaN
  if (std::isinf(max)) return max;
  exp_of(x, max, scratch, n);
  // The exps summed in double (8 chains): a vocabulary's 150k float terms summed in float
  // lanes drift by ~1e-5 relative, which a logprob would carry.
  double lane[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += scratch[j + l];
  }
  double sum = 0.0;
  for (; j < n; ++j) sum += scratch[j];
  for (double v : lane) sum += v;
  // A NaN entry makes the sum NaN: such rows (never seen from a healthy model) take the
  // reference, which skips them.
  if (std::isnan(sum)) return LogSumExpRef(x, n);
  return max + std::log(sum);
}

// ArgMax from a level's max and find: two vector passes (the second stops at the max).
int64_t ArgMaxWith(MaxFn max_of, FindFn find_of, const float* x, int64_t n) {
  const float max = max_of(x, n);  // NaNs ignored; -inf when every entry is -inf or NaN
  if (std::isinf(max) && max < 0) return 0;
  return find_of(x, n, max);  // nothing is above the max
}

}  // namespace

int64_t ArgMaxRef(const float* x, int64_t n) {
  int64_t best = 0;
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] > max) {  // false for NaN
      max = x[i];
      best = i;
    }
  }
  return best;
}

int64_t ArgMax(const float* x, int64_t n) { return ArgMaxIsa(x, n, ActiveIsa()); }

int64_t FindAtLeastRef(const float* x, int64_t n, float value) {
  int64_t i = 0;
  while (i < n && !(x[i] >= value)) ++i;
  return i;
}

int64_t FindAtLeast(const float* x, int64_t n, float value) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return avx512::FindAtLeastF32(x, n, value);
    case Isa::kAvx2:
      return avx2::FindAtLeastF32(x, n, value);
    case Isa::kScalar:
      break;
  }
  return FindAtLeastRef(x, n, value);
}

int64_t ArgMaxIsa(const float* x, int64_t n, Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return ArgMaxWith(avx512::MaxF32, avx512::FindAtLeastF32, x, n);
    case Isa::kAvx2:
      return ArgMaxWith(avx2::MaxF32, avx2::FindAtLeastF32, x, n);
    case Isa::kScalar:
      break;
  }
  return ArgMaxRef(x, n);
}

double LogSumExpRef(const float* x, int64_t n) {
  double max = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] > max) max = x[j];  // false for NaN
  }
  if (std::isinf(max)) return max;
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    if (!std::isnan(x[j])) sum += std::exp(static_cast<double>(x[j]) - max);
  }
  return max + std::log(sum);
}

double LogSumExp(const float* x, int64_t n, float* scratch) {
  return LogSumExpIsa(x, n, scratch, ActiveIsa());
}

double LogSumExpIsa(const float* x, int64_t n, float* scratch, Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return LogSumExpWith(avx512::MaxF32, avx512::ExpF32, x, n, scratch);
    case Isa::kAvx2:
      return LogSumExpWith(avx2::MaxF32, avx2::ExpF32, x, n, scratch);
    case Isa::kScalar:
      break;
  }
  return LogSumExpRef(x, n);
}

}  // namespace fucina
