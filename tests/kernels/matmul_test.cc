// MatMul (threaded, per-ISA) against the scalar reference and against a double-precision
// product of the dequantized weights and activations.
#include "kernels/matmul.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/type_traits.h"

namespace fucina {
namespace {

struct Case {
  GgmlType type;
  int64_t rows, cols, m;
};

std::string Name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(TypeName(c.type)) + "_" + std::to_string(c.rows) + "x" +
         std::to_string(c.cols) + "_m" + std::to_string(c.m);
}

class MatMulTest : public testing::TestWithParam<Case> {};

TEST_P(MatMulTest, MatchesScalarReferenceOnEveryIsaAndThreadCount) {
  const Case& c = GetParam();
  std::mt19937 rng(123);
  std::normal_distribution<float> nd;
  std::vector<float> wf(c.rows * c.cols), x(c.m * c.cols);
  for (float& v : wf) v = nd(rng);
  for (float& v : x) v = nd(rng);
  const CpuTypeTraits* traits = GetCpuTraits(c.type, Isa::kScalar);
  ASSERT_NE(traits, nullptr);
  const size_t row_bytes = RowBytes(c.type, c.cols);
  std::vector<uint8_t> w(row_bytes * c.rows);
  for (int64_t r = 0; r < c.rows; ++r) {
    traits->from_float(wf.data() + r * c.cols, w.data() + r * row_bytes, c.cols);
  }
  const WeightView view = WeightView::Dense(w.data(), c.type, c.rows, c.cols);

  std::vector<float> ref(c.m * c.rows);
  MatMulRef(view, x.data(), c.m, ref.data());

  // The reference itself against a double-precision product of the dequantized weights: the
  // only differences are the activation quantization and float rounding.
  std::vector<float> wd(c.cols);
  double max_rel = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    traits->to_float(w.data() + r * row_bytes, wd.data(), c.cols);
    for (int64_t i = 0; i < c.m; ++i) {
      double exact = 0, mag = 0;
      for (int64_t k = 0; k < c.cols; ++k) {
        exact += static_cast<double>(wd[k]) * x[i * c.cols + k];
        mag += std::fabs(static_cast<double>(wd[k]) * x[i * c.cols + k]);
      }
      max_rel = std::max(max_rel, std::fabs(ref[i * c.rows + r] - exact) / mag);
    }
  }
  // Q8 activations carry ~1/254 relative error per element; f32/f16/bf16 dots stay in float.
  const bool float_dot = GetCpuTraits(c.type, Isa::kScalar)->vec_dot_type == GgmlType::kF32;
  EXPECT_LT(max_rel, float_dot ? 1e-5 : 1e-2) << "reference vs exact";

  for (int isa = 0; isa <= static_cast<int>(DetectedIsa()); ++isa) {
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      std::vector<float> y(c.m * c.rows, NAN);
      MatMulIsa(view, x.data(), c.m, y.data(), pool, static_cast<Isa>(isa));
      for (int64_t j = 0; j < c.m * c.rows; ++j) {
        // Same quantized activations, same integer sums; only float accumulation order differs.
        const double tol = 1e-4 * (1.0 + std::fabs(ref[j])) + 1e-5 * c.cols / 32;
        ASSERT_NEAR(y[j], ref[j], tol) << IsaName(static_cast<Isa>(isa)) << " threads=" << threads
                                       << " index=" << j;
      }
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                     GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    cases.push_back({t, 1, 32, 1});
    cases.push_back({t, 37, 96, 1});
    cases.push_back({t, 67, 160, 5});
  }
  for (GgmlType t : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    cases.push_back({t, 1, 256, 1});
    cases.push_back({t, 37, 768, 1});
    cases.push_back({t, 67, 512, 70});  // crosses the 64-row activation tile
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatMulTest, testing::ValuesIn(Cases()), Name);

// Decode-shaped calls on matrices whose per-thread share is 1 MiB or more take one contiguous
// share per thread rather than small items in turn: every thread count gives the one-thread
// result bit for bit (a row's sum does not depend on who computes it), near the reference.
TEST(MatMulShares, LargeDecodeCallsSplitInSharesMatchOneThreadExactly) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (GgmlType t : {GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kQ4_K}) {
    const int64_t rows = 12288, cols = 512;
    const CpuTypeTraits* traits = GetCpuTraits(t, Isa::kScalar);
    const size_t row_bytes = RowBytes(t, cols);
    std::vector<float> wf(cols);
    std::vector<uint8_t> w(row_bytes * rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : wf) v = nd(rng);
      traits->from_float(wf.data(), w.data() + r * row_bytes, cols);
    }
    const WeightView view = WeightView::Dense(w.data(), t, rows, cols);
    for (int64_t m : {int64_t{1}, int64_t{5}}) {
      std::vector<float> x(m * cols);
      for (float& v : x) v = nd(rng);
      std::vector<float> ref(m * rows);
      MatMulRef(view, x.data(), m, ref.data());
      ThreadPool one_thread(1);
      std::vector<float> want(m * rows);
      MatMul(view, x.data(), m, want.data(), one_thread);
      for (int threads : {2, 3}) {
        ASSERT_GE(rows * static_cast<int64_t>(row_bytes) / threads, int64_t{1} << 20)
            << "the case must take the shares path";
        ThreadPool pool(threads);
        std::vector<float> y(m * rows, NAN);
        MatMul(view, x.data(), m, y.data(), pool);
        for (int64_t j = 0; j < m * rows; ++j) {
          ASSERT_EQ(y[j], want[j]) << TypeName(t) << " threads=" << threads << " index=" << j;
          ASSERT_NEAR(y[j], ref[j], 1e-4 * (1.0 + std::fabs(ref[j])) + 1e-5 * cols / 32);
        }
      }
    }
  }
}

}  // namespace
}  // namespace fucina
