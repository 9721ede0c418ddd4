// Norm, softmax, activation and RoPE kernels: every ISA path on this machine against the
// scalar references, plus hand-computed cases for the references themselves.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activations.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/softmax.h"
#include "tests/kernels/random_floats.h"

namespace fucina {
namespace {

constexpr int64_t kSizes[] = {1, 7, 31, 33, 64, 1003};
constexpr float kInf = std::numeric_limits<float>::infinity();

// One implementation under test: a name and a callable for each op.
struct Path {
  std::string name;
  std::function<void(const float*, float*, int64_t)> exp;
  std::function<void(const float*, const float*, float, int64_t, int64_t, float*)> rms_norm;
  std::function<void(float*, int64_t, int64_t, float, const float*, int64_t)> softmax;
  std::function<void(const float*, float*, int64_t)> silu;
  std::function<void(const float*, float*, int64_t)> gelu_tanh;
  std::function<void(const float*, const float*, float*, int64_t)> swiglu;
};

// ExpF32 with no shift: y = exp(x - 0) == exp(x) for every x.
std::function<void(const float*, float*, int64_t)> Unshifted(
    float (*exp)(const float*, float, float*, int64_t)) {
  return [exp](const float* x, float* y, int64_t n) { exp(x, 0.0f, y, n); };
}

// The dispatched entry points plus every SIMD namespace the CPU supports.
std::vector<Path> Paths() {
  std::vector<Path> paths;
  paths.push_back({std::string("dispatch:") + std::string(IsaName(ActiveIsa())), nullptr,
                   RmsNorm, Softmax, Silu, GeluTanh, SwiGlu});
  if (DetectedIsa() >= Isa::kAvx2) {
    paths.push_back({"avx2", Unshifted(avx2::ExpF32), avx2::RmsNorm, avx2::Softmax, avx2::Silu,
                     avx2::GeluTanh, avx2::SwiGlu});
  }
  if (DetectedIsa() >= Isa::kAvx512) {
    paths.push_back({"avx512", Unshifted(avx512::ExpF32), avx512::RmsNorm, avx512::Softmax,
                     avx512::Silu, avx512::GeluTanh, avx512::SwiGlu});
  }
  return paths;
}

// Tracks max over i of |got - want| / (rel * |want| + abs); the check is that it is <= 1.
struct ErrorStat {
  double worst_ratio = 0.0;
  double max_abs = 0.0;
  double max_rel = 0.0;
  void Add(double got, double want, double rel, double abs) {
    const double err = std::fabs(got - want);
    worst_ratio = std::max(worst_ratio, err / (rel * std::fabs(want) + abs));
    max_abs = std::max(max_abs, err);
    // Relative error is reported where it means something (not for results near underflow).
    if (std::fabs(want) > 1e-20) max_rel = std::max(max_rel, err / std::fabs(want));
  }
};

void Report(const std::string& what, const ErrorStat& s) {
  std::printf("  %-28s max_abs %.3g max_rel %.3g (worst/tolerance %.3f)\n", what.c_str(),
              s.max_abs, s.max_rel, s.worst_ratio);
}

TEST(ExpTest, WithinThreeUlpOverTheWholeRange) {
  for (const Path& p : Paths()) {
    if (!p.exp) continue;
    SCOPED_TRACE(p.name);
    std::vector<float> x;
    for (double v = -110.0; v <= 90.0; v += 0.0137) x.push_back(static_cast<float>(v));
    for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 88.72f, 88.7228f, -87.3f, -103.9f}) {
      x.push_back(v);
    }
    std::vector<float> y(x.size());
    p.exp(x.data(), y.data(), static_cast<int64_t>(x.size()));
    ErrorStat stat;
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(static_cast<double>(x[i]));
      if (want > std::numeric_limits<float>::max()) {
        EXPECT_EQ(y[i], kInf) << x[i];
      } else {
        // 3e-7 relative (~2.5 ulp) in the normal range; subnormal results are absolute 2^-149.
        stat.Add(y[i], want, 3e-7, 1.5e-45);
      }
    }
    Report(p.name + " exp", stat);
    EXPECT_LE(stat.worst_ratio, 1.0);
    const float special[] = {kInf, -kInf, std::numeric_limits<float>::quiet_NaN(), 0.0f};
    float out[4];
    p.exp(special, out, 4);
    EXPECT_EQ(out[0], kInf);
    EXPECT_EQ(out[1], 0.0f);
    EXPECT_TRUE(std::isnan(out[2]));
    EXPECT_EQ(out[3], 1.0f);
  }
}

// The shift is subtracted in f32 before the exp (attention's scores less their running max):
// the same bits as the exp of the differences, on every length (tails are masked).
TEST(ExpTest, ShiftIsTheFloatDifference) {
  using ExpFn = float (*)(const float*, float, float*, int64_t);
  std::vector<std::pair<std::string, ExpFn>> fns;
  if (DetectedIsa() >= Isa::kAvx2) fns.push_back({"avx2", avx2::ExpF32});
  if (DetectedIsa() >= Isa::kAvx512) fns.push_back({"avx512", avx512::ExpF32});
  for (const auto& [name, exp] : fns) {
    for (int64_t n : {1, 7, 16, 31, 32, 45}) {
      SCOPED_TRACE(name + " n=" + std::to_string(n));
      const std::vector<float> x = Random(n, -30.0f, 10.0f, 40 + n);
      for (float shift : {0.0f, 3.25f, -7.1f, 11.0f}) {
        std::vector<float> diff(x.size()), want(x.size()), got(x.size());
        for (int64_t i = 0; i < n; ++i) diff[i] = x[i] - shift;
        exp(diff.data(), 0.0f, want.data(), n);
        exp(x.data(), shift, got.data(), n);
        EXPECT_EQ(got, want) << "shift " << shift;
      }
    }
  }
}

// ExpF32's sum is the sum of what it wrote, in span order (ops_isa.h): a_l adds y[t] for
// t % 8 == l in increasing t, then ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)). Every
// level adds so, which keeps attention's row sums independent of how a span is cut; lengths
// cover the 8- and 16-lane tails. MaxF32 is the largest value, wherever it sits.
TEST(ExpTest, SumAndMaxOfASpan) {
  struct Level {
    std::string name;
    float (*exp)(const float*, float, float*, int64_t);
    float (*max)(const float*, int64_t);
  };
  std::vector<Level> levels;
  if (DetectedIsa() >= Isa::kAvx2) levels.push_back({"avx2", avx2::ExpF32, avx2::MaxF32});
  if (DetectedIsa() >= Isa::kAvx512) levels.push_back({"avx512", avx512::ExpF32, avx512::MaxF32});
  for (const Level& level : levels) {
    for (int64_t n = 1; n <= 70; ++n) {
      SCOPED_TRACE(level.name + " n=" + std::to_string(n));
      std::vector<float> x = Random(n, -20.0f, 5.0f, 90 + n);
      // Spread magnitudes so that a different order of the adds gives different bits.
      for (int64_t i = 0; i < n; i += 3) x[i] += 12.0f;
      std::vector<float> y(n + 1, -1.0f);
      const float sum = level.exp(x.data(), 4.5f, y.data(), n);
      EXPECT_EQ(y[n], -1.0f) << "wrote past n";
      float a[8] = {};
      for (int64_t t = 0; t < n; ++t) a[t % 8] += y[t];
      const float want = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
      EXPECT_EQ(sum, want);
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        std::vector<float> m = x;
        m[at] = 40.0f;
        EXPECT_EQ(level.max(m.data(), n), 40.0f) << "max at " << at;
      }
      EXPECT_EQ(level.max(x.data(), n), *std::max_element(x.begin(), x.end()));
    }
  }
}

// The normalizer of a sampled token's logprob, over vocabulary-sized rows: every level within
// 1e-6 of the reference; NaN entries count as -inf; all -inf (or empty) gives -inf.
TEST(LogSumExpTest, LevelsMatchTheReferenceOnVocabularyRows) {
  std::vector<Isa> levels = {Isa::kScalar};
  if (DetectedIsa() >= Isa::kAvx2) levels.push_back(Isa::kAvx2);
  if (DetectedIsa() >= Isa::kAvx512) levels.push_back(Isa::kAvx512);
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{49152}, int64_t{151936}, int64_t{262144}}) {
    // Logits as a model gives them: a few peaks well above a broad floor.
    std::vector<float> x = Random(n, -12.0f, 8.0f, 7 + static_cast<uint32_t>(n));
    for (int64_t i = 0; i < n; i += 997) x[i] += 15.0f;
    std::vector<float> scratch(n);
    const double want = LogSumExpRef(x.data(), n);
    // In double over the same terms: the reference itself.
    double max = -kInf, sum = 0.0;
    for (float v : x) max = std::max<double>(max, v);
    for (float v : x) sum += std::exp(double(v) - max);
    EXPECT_NEAR(want, max + std::log(sum), 1e-6);
    for (Isa isa : levels) {
      SCOPED_TRACE(std::string(IsaName(isa)) + " n=" + std::to_string(n));
      EXPECT_NEAR(LogSumExpIsa(x.data(), n, scratch.data(), isa), want, 1e-6);
      if (n == 1) continue;
      std::vector<float> with_nan = x;
      with_nan[n / 2] = std::numeric_limits<float>::quiet_NaN();
      const double got = LogSumExpIsa(with_nan.data(), n, scratch.data(), isa);
      EXPECT_FALSE(std::isnan(got));
      EXPECT_NEAR(got, LogSumExpRef(with_nan.data(), n), 1e-6);
    }
  }
  for (Isa isa : levels) {
    const float none[3] = {-kInf, std::numeric_limits<float>::quiet_NaN(), -kInf};
    float scratch[3];
    EXPECT_EQ(LogSumExpIsa(none, 3, scratch, isa), -kInf) << IsaName(isa);
    EXPECT_EQ(LogSumExpIsa(none, 0, scratch, isa), -kInf) << IsaName(isa);
    const float one[2] = {2.0f, -kInf};
    EXPECT_DOUBLE_EQ(LogSumExpIsa(one, 2, scratch, isa), 2.0) << IsaName(isa);
    const float two[2] = {std::log(3.0f), std::log(5.0f)};
    EXPECT_NEAR(LogSumExpIsa(two, 2, scratch, isa), std::log(8.0), 1e-6) << IsaName(isa);
  }
}

// A greedy sample's choice: every level picks the reference's index (the first of the largest,
// NaN as -inf), wherever the max falls and however often it repeats.
TEST(ArgMaxTest, LevelsPickTheFirstLargestAsTheReferenceDoes) {
  std::vector<Isa> levels = {Isa::kScalar};
  if (DetectedIsa() >= Isa::kAvx2) levels.push_back(Isa::kAvx2);
  if (DetectedIsa() >= Isa::kAvx512) levels.push_back(Isa::kAvx512);
  for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{17}, int64_t{4096}, int64_t{49152}}) {
    std::vector<float> x = Random(n, -12.0f, 8.0f, 3 + static_cast<uint32_t>(n));
    for (int64_t at : {int64_t{0}, n / 3, n - 1}) {
      std::vector<float> row = x;
      row[at] = 20.0f;
      if (at + 5 < n) row[at + 5] = 20.0f;  // a tie after it: the first one wins
      if (at > 0) row[at - 1] = std::numeric_limits<float>::quiet_NaN();
      ASSERT_EQ(ArgMaxRef(row.data(), n), at);
      for (Isa isa : levels) {
        EXPECT_EQ(ArgMaxIsa(row.data(), n, isa), at) << IsaName(isa) << " n=" << n;
      }
    }
  }
  for (Isa isa : levels) {
    const float none[3] = {-kInf, std::numeric_limits<float>::quiet_NaN(), -kInf};
    EXPECT_EQ(ArgMaxIsa(none, 3, isa), 0) << IsaName(isa);
    const float inf[3] = {1.0f, kInf, kInf};
    EXPECT_EQ(ArgMaxIsa(inf, 3, isa), 1) << IsaName(isa);
  }
  // The search a sampler's heap skips with: the first entry at or above a bound, as the loop
  // finds it, for bounds at, between and above the entries (NaN never matches).
  std::vector<float> x = Random(1000, -12.0f, 8.0f, 11);
  x[500] = std::numeric_limits<float>::quiet_NaN();
  for (float bound : {-kInf, -3.0f, 7.9f, x[777], 9.0f, kInf}) {
    for (int64_t from : {int64_t{0}, int64_t{5}, int64_t{499}, int64_t{999}}) {
      EXPECT_EQ(FindAtLeast(x.data() + from, 1000 - from, bound),
                FindAtLeastRef(x.data() + from, 1000 - from, bound))
          << bound << " from " << from;
    }
  }
}

TEST(RmsNormTest, ReferenceHandCase) {
  const float x[2] = {3.0f, 4.0f};
  const float w[2] = {2.0f, -1.0f};
  float y[2];
  RmsNormRef(x, w, 0.0f, 1, 2, y);
  const double s = 1.0 / std::sqrt(12.5);  // mean of squares (9 + 16) / 2.
  EXPECT_NEAR(y[0], 3.0 * s * 2.0, 1e-6);
  EXPECT_NEAR(y[1], -4.0 * s, 1e-6);
}

TEST(RmsNormTest, PathsMatchReference) {
  constexpr int64_t kRows = 9;
  constexpr float kEps = 1e-5f;
  for (const Path& p : Paths()) {
    ErrorStat stat;
    for (int64_t n : kSizes) {
      SCOPED_TRACE(p.name + " n=" + std::to_string(n));
      const std::vector<float> x = Random(kRows * n, -3.0f, 3.0f, 1 + n);
      const std::vector<float> w = Random(n, -2.0f, 2.0f, 2 + n);
      for (const float* weight : {w.data(), static_cast<const float*>(nullptr)}) {
        std::vector<float> want(x.size()), got(x.size());
        RmsNormRef(x.data(), weight, kEps, kRows, n, want.data());
        p.rms_norm(x.data(), weight, kEps, kRows, n, got.data());
        for (size_t i = 0; i < x.size(); ++i) stat.Add(got[i], want[i], 2e-6, 1e-30);
        std::vector<float> in_place = x;  // out == x is allowed.
        p.rms_norm(in_place.data(), weight, kEps, kRows, n, in_place.data());
        EXPECT_EQ(in_place, got);
      }
    }
    Report(p.name + " rms_norm", stat);
    EXPECT_LE(stat.worst_ratio, 1.0);
  }
}

TEST(SoftmaxTest, ReferenceHandCase) {
  float x[3] = {0.0f, std::log(2.0f), std::log(5.0f)};  // exp: 1, 2, 5.
  SoftmaxRef(x, 1, 3, 1.0f, nullptr, 0);
  EXPECT_NEAR(x[0], 1.0 / 8.0, 1e-7);
  EXPECT_NEAR(x[1], 2.0 / 8.0, 1e-7);
  EXPECT_NEAR(x[2], 5.0 / 8.0, 1e-7);
  // Scale and a mask with -inf: logits 2 * [1, 1, 7] + [0, 0, -inf].
  float y[3] = {1.0f, 1.0f, 7.0f};
  const float mask[3] = {0.0f, 0.0f, -kInf};
  SoftmaxRef(y, 1, 3, 2.0f, mask, 0);
  EXPECT_FLOAT_EQ(y[0], 0.5f);
  EXPECT_FLOAT_EQ(y[1], 0.5f);
  EXPECT_EQ(y[2], 0.0f);
}

TEST(SoftmaxTest, PathsMatchReference) {
  constexpr int64_t kRows = 6;
  for (const Path& p : Paths()) {
    ErrorStat stat;
    for (int64_t n : kSizes) {
      SCOPED_TRACE(p.name + " n=" + std::to_string(n));
      const std::vector<float> x = Random(kRows * n, -40.0f, 40.0f, 3 + n);
      // Causal-style mask rows (row r sees the first r * n / kRows + 1 entries) and a shared
      // row with a few -inf holes.
      std::vector<float> causal(kRows * n, 0.0f);
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t j = r * n / kRows + 1; j < n; ++j) causal[r * n + j] = -kInf;
      }
      std::vector<float> shared = Random(n, -1.0f, 1.0f, 4 + n);
      for (int64_t j = 1; j < n; j += 3) shared[j] = -kInf;
      struct Case {
        const float* mask;
        int64_t stride;
        float scale;
      };
      for (const Case& c : {Case{nullptr, 0, 1.0f}, Case{causal.data(), n, 0.125f},
                            Case{shared.data(), 0, 2.0f}}) {
        std::vector<float> want = x, got = x;
        SoftmaxRef(want.data(), kRows, n, c.scale, c.mask, c.stride);
        p.softmax(got.data(), kRows, n, c.scale, c.mask, c.stride);
        for (size_t i = 0; i < x.size(); ++i) stat.Add(got[i], want[i], 1e-6, 1e-12);
        for (int64_t r = 0; r < kRows; ++r) {
          double sum = 0.0;
          for (int64_t j = 0; j < n; ++j) sum += got[r * n + j];
          EXPECT_NEAR(sum, 1.0, 2e-6);
        }
      }
    }
    Report(p.name + " softmax", stat);
    EXPECT_LE(stat.worst_ratio, 1.0);
  }
}

TEST(SoftmaxTest, FullyMaskedRowIsZeroAndHugeLogitsStayFinite) {
  for (const Path& p : Paths()) {
    SCOPED_TRACE(p.name);
    std::vector<float> x = {1.0f, 2.0f, 3.0f, 1e30f, -1e30f, 5.0f, 3e38f, 3e38f, -3e38f};
    const std::vector<float> mask = {-kInf, -kInf, -kInf, 0, 0, 0, 0, 0, 0};
    p.softmax(x.data(), 3, 3, 1.0f, mask.data(), 3);
    EXPECT_EQ(x[0], 0.0f);
    EXPECT_EQ(x[1], 0.0f);
    EXPECT_EQ(x[2], 0.0f);
    EXPECT_FLOAT_EQ(x[3], 1.0f);
    EXPECT_EQ(x[4], 0.0f);
    EXPECT_EQ(x[5], 0.0f);
    EXPECT_FLOAT_EQ(x[6], 0.5f);
    EXPECT_FLOAT_EQ(x[7], 0.5f);
    EXPECT_EQ(x[8], 0.0f);
  }
}

TEST(ActivationTest, PathsMatchReference) {
  for (const Path& p : Paths()) {
    ErrorStat silu_stat, gelu_stat, swiglu_stat;
    for (int64_t n : kSizes) {
      SCOPED_TRACE(p.name + " n=" + std::to_string(n));
      const std::vector<float> x = Random(n, -20.0f, 20.0f, 5 + n);
      const std::vector<float> up = Random(n, -4.0f, 4.0f, 6 + n);
      std::vector<float> want(n), got(n);
      SiluRef(x.data(), want.data(), n);
      p.silu(x.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) silu_stat.Add(got[i], want[i], 5e-7, 1e-30);
      GeluTanhRef(x.data(), want.data(), n);
      p.gelu_tanh(x.data(), got.data(), n);
      // exp(-2u) turns the float rounding of u into a relative error ~|2u| ulp, which only
      // matters for large negative x where the result is tiny: hence the absolute 1e-11.
      for (int64_t i = 0; i < n; ++i) gelu_stat.Add(got[i], want[i], 1e-6, 1e-11);
      SwiGluRef(x.data(), up.data(), want.data(), n);
      p.swiglu(x.data(), up.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) swiglu_stat.Add(got[i], want[i], 6e-7, 1e-30);
    }
    Report(p.name + " silu", silu_stat);
    Report(p.name + " gelu_tanh", gelu_stat);
    Report(p.name + " swiglu", swiglu_stat);
    EXPECT_LE(silu_stat.worst_ratio, 1.0);
    EXPECT_LE(gelu_stat.worst_ratio, 1.0);
    EXPECT_LE(swiglu_stat.worst_ratio, 1.0);
  }
}

// Soft-capping at Gemma's cap of 30 over the logit range and the branch point |t| = 1/4 (x =
// 7.5), zeros and signs, every tail length; and the cap's limits.
TEST(ActivationTest, SoftCapMatchesReference) {
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> want = Random(n, -60.0f, 60.0f, 9 + n);
    for (int64_t i = 0; i < n; i += 7) want[i] *= 1e-3f;  // small |t|, the polynomial
    if (n > 3) want[0] = 0.0f, want[1] = -0.0f, want[2] = 7.5f, want[3] = -7.5f;
    std::vector<float> got = want;
    SoftCapRef(want.data(), n, 30.0f);
    SoftCap(got.data(), n, 30.0f);
    ErrorStat stat;
    for (int64_t i = 0; i < n; ++i) {
      stat.Add(got[i], want[i], 1e-6, 1e-30);
      EXPECT_EQ(std::signbit(got[i]), std::signbit(want[i])) << i;
    }
    Report("softcap", stat);
    EXPECT_LE(stat.worst_ratio, 1.0);
  }
  float x[4] = {1e6f, -1e6f, 0.0f, 1e-20f};
  SoftCap(x, 4, 30.0f);
  EXPECT_EQ(x[0], 30.0f);
  EXPECT_EQ(x[1], -30.0f);
  EXPECT_EQ(x[2], 0.0f);
  EXPECT_FLOAT_EQ(x[3], 1e-20f);
}

TEST(ActivationTest, ReferenceHandValues) {
  const float x[3] = {0.0f, 1.0f, -1.0f};
  float y[3];
  SiluRef(x, y, 3);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 1.0 / (1.0 + std::exp(-1.0)), 1e-7);
  EXPECT_NEAR(y[2], -1.0 / (1.0 + std::exp(1.0)), 1e-7);
  // GELU(1) = Phi(1) = 0.841344746..., GELU(-1) = -(1 - Phi(1)).
  GeluErf(x, y, 3);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_NEAR(y[1], 0.8413447460685429, 1e-7);
  EXPECT_NEAR(y[2], -0.15865525393145707, 1e-7);
  // The tanh form approximates the erf form to within 1e-3 everywhere.
  const std::vector<float> v = Random(4001, -6.0f, 6.0f, 7);
  std::vector<float> a(v.size()), b(v.size());
  GeluTanhRef(v.data(), a.data(), 4001);
  GeluErfRef(v.data(), b.data(), 4001);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3) << v[i];
}

TEST(ActivationTest, FusedSwiGluSplitsGateThenUp) {
  for (int64_t ff : kSizes) {
    SCOPED_TRACE("ff=" + std::to_string(ff));
    constexpr int64_t kRows = 4;
    const std::vector<float> gate_up = Random(kRows * 2 * ff, -6.0f, 6.0f, 8 + ff);
    std::vector<float> want(kRows * ff), got(kRows * ff);
    for (int64_t r = 0; r < kRows; ++r) {
      const float* row = gate_up.data() + r * 2 * ff;
      SwiGluRef(row, row + ff, want.data() + r * ff, ff);
    }
    std::vector<float> ref_fused(kRows * ff);
    SwiGluFusedRef(gate_up.data(), ref_fused.data(), kRows, ff);
    EXPECT_EQ(ref_fused, want);
    SwiGluFused(gate_up.data(), got.data(), kRows, ff);
    for (int64_t i = 0; i < kRows * ff; ++i) {
      EXPECT_NEAR(got[i], want[i], 6e-7 * std::fabs(want[i]));
    }
    std::vector<float> in_place = gate_up;
    SwiGluFused(in_place.data(), in_place.data(), kRows, ff);
    for (int64_t i = 0; i < kRows * ff; ++i) EXPECT_EQ(in_place[i], got[i]);
  }
}

// ggml's GeGLU rule written out from its definition (ggml_vec_geglu_f32 with GGML_GELU_FP16,
// ggml_gelu_f32), with the compiler's _Float16 for the f16 roundings (round to nearest even,
// as F16C's _cvtss_sh and ggml's scalar converter do): nothing here calls fucina's code.
float GgmlGeGlu(float x, float up) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x * up;
  const float v = static_cast<float>(static_cast<_Float16>(x));
  const float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  const float kCoefA = 0.044715f;
  const float g = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * v * (1.0f + kCoefA * v * v)));
  return static_cast<float>(static_cast<_Float16>(g)) * up;
}

// Gates at every f16 value in (-10, 10), halfway between neighbours (the f16 rounding ties,
// which go to the even one) and one float step either side of those, at and around +-10, and
// far outside.
std::vector<float> GeGluSweep() {
  std::vector<float> x;
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    _Float16 h;
    const uint16_t b16 = static_cast<uint16_t>(bits);
    std::memcpy(&h, &b16, sizeof(h));
    const float f = static_cast<float>(h);
    if (!std::isfinite(f) || std::fabs(f) >= 10.5f) continue;
    x.push_back(f);
    // The next f16 away from zero; the midpoint is exact in float.
    _Float16 next_h;
    const uint16_t n16 = static_cast<uint16_t>(bits + 1);
    std::memcpy(&next_h, &n16, sizeof(next_h));
    const float next = static_cast<float>(next_h);
    if (!std::isfinite(next) || (bits & 0x7FFF) == 0x7FFF) continue;
    const float mid = 0.5f * (f + next);
    x.push_back(mid);
    x.push_back(std::nextafter(mid, 0.0f));
    x.push_back(std::nextafter(mid, 2.0f * mid));
  }
  for (float edge : {10.0f, -10.0f}) {
    x.push_back(edge);
    x.push_back(std::nextafter(edge, 0.0f));
    x.push_back(std::nextafter(edge, 2.0f * edge));
  }
  for (float big : {11.0f, 1e3f, 3e38f, -11.0f, -1e3f, -3e38f}) x.push_back(big);
  return x;
}

TEST(ActivationTest, GeGluReferenceIsGgmlsRule) {
  const std::vector<float> x = GeGluSweep();
  ASSERT_GT(x.size(), 100000u);
  const int64_t n = static_cast<int64_t>(x.size());
  // Up values of both signs, not 1, so the product's rounding is part of what is checked.
  const std::vector<float> up = Random(n, -3.0f, 3.0f, 21);
  std::vector<float> ref(n), table(n);
  GeGluRef(x.data(), up.data(), ref.data(), n);
  GeGlu(x.data(), up.data(), table.data(), n);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = GgmlGeGlu(x[i], up[i]);
    // Bitwise: -0 and +0 count as different (memcmp), so the sign of zero products matches.
    if (std::memcmp(&ref[i], &want, sizeof(float)) != 0 && mismatches++ < 5) {
      ADD_FAILURE() << "GeGluRef(" << x[i] << ", " << up[i] << ") = " << ref[i] << ", ggml "
                    << want;
    }
    if (std::memcmp(&table[i], &ref[i], sizeof(float)) != 0 && mismatches++ < 5) {
      ADD_FAILURE() << "GeGlu(" << x[i] << ", " << up[i] << ") = " << table[i] << ", Ref "
                    << ref[i];
    }
  }
  EXPECT_EQ(mismatches, 0);
  // Hand values: past the clamps, and GELU(1) to f16 (0.8413 -> 0.84130859375).
  const float gate[4] = {-10.0f, 10.0f, 1.0f, 25.0f}, ones[4] = {1.0f, 1.0f, 1.0f, -2.0f};
  float y[4];
  GeGlu(gate, ones, y, 4);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[1], 10.0f);
  EXPECT_EQ(y[2], 0.84130859375f);
  EXPECT_EQ(y[3], -50.0f);
}

TEST(ActivationTest, FusedGeGluSplitsGateThenUp) {
  for (int64_t ff : kSizes) {
    SCOPED_TRACE("ff=" + std::to_string(ff));
    constexpr int64_t kRows = 4;
    const std::vector<float> gate_up = Random(kRows * 2 * ff, -12.0f, 12.0f, 9 + ff);
    std::vector<float> want(kRows * ff), got(kRows * ff);
    for (int64_t r = 0; r < kRows; ++r) {
      const float* row = gate_up.data() + r * 2 * ff;
      GeGluRef(row, row + ff, want.data() + r * ff, ff);
    }
    GeGluFused(gate_up.data(), got.data(), kRows, ff);
    EXPECT_EQ(got, want);
    std::vector<float> in_place = gate_up;
    GeGluFused(in_place.data(), in_place.data(), kRows, ff);
    EXPECT_EQ(std::vector<float>(in_place.begin(), in_place.begin() + kRows * ff), want);
  }
}

// ---- RoPE ----

TEST(RopeTest, HandComputedNormalAndNeox) {
  // head_dim 4, pos 1, base 1e4: theta_0 = 1, theta_1 = 1e4^(-1/2) = 0.01.
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.01), s1 = std::sin(0.01);
  RopeParams p;
  p.head_dim = 4;
  p.n_rot = 4;
  p.freq_base = 10000.0f;
  const int64_t pos = 1;
  for (bool ref : {false, true}) {
    SCOPED_TRACE(ref ? "ref" : "fast");
    p.mode = RopeMode::kNormal;  // pairs (0, 1) and (2, 3).
    float x[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    ref ? RopeBatchRef(x, 1, 1, p, &pos) : Rope(x, 1, p, pos);
    EXPECT_NEAR(x[0], 1 * c0 - 2 * s0, 1e-6);
    EXPECT_NEAR(x[1], 1 * s0 + 2 * c0, 1e-6);
    EXPECT_NEAR(x[2], 3 * c1 - 4 * s1, 1e-6);
    EXPECT_NEAR(x[3], 3 * s1 + 4 * c1, 1e-6);
    p.mode = RopeMode::kNeox;  // pairs (0, 2) and (1, 3).
    float y[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    ref ? RopeBatchRef(y, 1, 1, p, &pos) : Rope(y, 1, p, pos);
    EXPECT_NEAR(y[0], 1 * c0 - 3 * s0, 1e-6);
    EXPECT_NEAR(y[2], 1 * s0 + 3 * c0, 1e-6);
    EXPECT_NEAR(y[1], 2 * c1 - 4 * s1, 1e-6);
    EXPECT_NEAR(y[3], 2 * s1 + 4 * c1, 1e-6);
  }
}

// ggml's rope_f32 for ext_factor 0, attn_factor 1, freq_scale 1: theta built by repeated
// float products (theta *= base^(-2/n_rot)), divided by the frequency factor, float cos/sin.
void GgmlStyleRope(float* x, int num_heads, const RopeParams& p, int64_t pos) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / p.n_rot);
  std::vector<float> cache(p.n_rot);
  float theta = static_cast<float>(pos);
  for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
    const float ff = p.freq_factors != nullptr ? p.freq_factors[i0 / 2] : 1.0f;
    cache[i0] = std::cos(theta / ff);
    cache[i0 + 1] = std::sin(theta / ff);
    theta *= theta_scale;
  }
  for (int h = 0; h < num_heads; ++h) {
    float* v = x + h * p.head_dim;
    for (int i0 = 0; i0 < p.n_rot; i0 += 2) {
      const int ic = p.mode == RopeMode::kNormal ? i0 : i0 / 2;
      const int off = p.mode == RopeMode::kNormal ? 1 : p.n_rot / 2;
      const float x0 = v[ic], x1 = v[ic + off];
      v[ic] = x0 * cache[i0] - x1 * cache[i0 + 1];
      v[ic + off] = x0 * cache[i0 + 1] + x1 * cache[i0];
    }
  }
}

TEST(RopeTest, PartialRotaryWithFreqFactorsMatchesReferenceAndGgml) {
  constexpr int kHeads = 3;
  const float freq_factors[4] = {1.0f, 2.0f, 8.0f, 32.0f};
  for (RopeMode mode : {RopeMode::kNormal, RopeMode::kNeox}) {
    for (const float* ff : {static_cast<const float*>(nullptr), freq_factors}) {
      RopeParams p;
      p.head_dim = 12;
      p.n_rot = 8;  // dims 8..11 pass through.
      p.freq_base = 500000.0f;
      p.mode = mode;
      p.freq_factors = ff;
      const std::vector<int64_t> pos = {0, 1, 2, 17, 63, 1000, 4095, 131071};
      const int64_t n_tok = static_cast<int64_t>(pos.size());
      const std::vector<float> x = Random(n_tok * kHeads * p.head_dim, -2.0f, 2.0f, 9);
      std::vector<float> want = x, got = x;
      RopeBatchRef(want.data(), n_tok, kHeads, p, pos.data());
      RopeBatch(got.data(), n_tok, kHeads, p, pos.data());
      ErrorStat stat;
      for (size_t i = 0; i < x.size(); ++i) {
        if (static_cast<int>(i % p.head_dim) >= p.n_rot) {
          EXPECT_EQ(got[i], x[i]);
          EXPECT_EQ(want[i], x[i]);
        }
        stat.Add(got[i], want[i], 0.0, 1e-6);  // |x| <= 2: a few ulp of the magnitude.
      }
      Report(std::string(mode == RopeMode::kNeox ? "neox" : "normal") + (ff ? "+ff" : ""), stat);
      EXPECT_LE(stat.worst_ratio, 1.0);
      // ggml agrees while its float theta recurrence has not drifted (small positions).
      for (int64_t t = 0; t < 5; ++t) {
        std::vector<float> g(x.begin() + t * kHeads * p.head_dim,
                             x.begin() + (t + 1) * kHeads * p.head_dim);
        GgmlStyleRope(g.data(), kHeads, p, pos[t]);
        for (size_t i = 0; i < g.size(); ++i) {
          EXPECT_NEAR(g[i], want[t * kHeads * p.head_dim + i], 1e-5) << "t=" << t;
        }
      }
    }
  }
}

TEST(RopeTest, SharedTableEqualsPerCallAndKeepsRelativePositions) {
  RopeParams p;
  p.head_dim = 64;
  p.n_rot = 64;
  p.mode = RopeMode::kNeox;
  const std::vector<int64_t> pos = {5, 3, 102, 100};
  const std::vector<float> x = Random(4 * p.head_dim, -1.0f, 1.0f, 10);
  std::vector<float> batch = x, table_applied = x, single = x;
  RopeBatch(batch.data(), 4, 1, p, pos.data());
  RopeTable table;
  table.Build(p, pos.data(), 4);
  ApplyRope(table, table_applied.data(), 4, 1);
  for (int t = 0; t < 4; ++t) Rope(single.data() + t * p.head_dim, 1, p, pos[t]);
  EXPECT_EQ(batch, table_applied);
  EXPECT_EQ(batch, single);
  // Rows 0/2 hold the same q and rows 1/3 the same k at positions shifted by 97: the rotated
  // dot product depends only on the position difference (2 in both cases).
  std::vector<float> y = x;
  std::copy(y.begin(), y.begin() + p.head_dim, y.begin() + 2 * p.head_dim);
  std::copy(y.begin() + p.head_dim, y.begin() + 2 * p.head_dim, y.begin() + 3 * p.head_dim);
  RopeBatch(y.data(), 4, 1, p, pos.data());
  double d0 = 0, d1 = 0;
  for (int i = 0; i < p.head_dim; ++i) {
    d0 += y[i] * y[p.head_dim + i];
    d1 += y[2 * p.head_dim + i] * y[3 * p.head_dim + i];
  }
  EXPECT_NEAR(d0, d1, 1e-5);
}

}  // namespace
}  // namespace fucina
