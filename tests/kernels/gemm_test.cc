// Tiled kernels (CpuTypeTraits::gemm, kernels/cpu/gemm_isa.h) against the scalar per-pair
// vec_dot on every ISA the machine has, and MatMul's tiled path against MatMulRef.
//
// Both sides see the same quantized weights and activations and compute the same integer block
// sums with the same per-block scales; only the float summation order differs, so the
// tolerance is a few float ulps of the sum of the blocks' magnitudes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/fp16.h"
#include "kernels/ggml_type.h"
#include "kernels/matmul.h"
#include "kernels/type_traits.h"
#include "tests/kernels/simd_isas.h"

namespace fucina {
namespace {

constexpr GgmlType kTiledTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                    GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                    GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kF32,
                                    GgmlType::kF16,  GgmlType::kBF16};

// Random rows with a heavy tail (every 29th value x20), so some blocks hit the quantizers'
// extreme codes and the scales span a wide range.
std::vector<float> RandomRows(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = nd(rng) * (i % 29 == 3 ? 20.0f : 1.0f);
  return v;
}

// `count` rows of `cols` elements quantized with the scalar from_float of `type`, `stride`
// bytes apart (stride >= RowBytes; the gap is filled with garbage the kernels must not read
// as data).
std::vector<uint8_t> QuantizeRows(GgmlType type, const std::vector<float>& src, int64_t count,
                                  int64_t cols, size_t stride) {
  const CpuTypeTraits* t = GetCpuTraits(type, Isa::kScalar);
  std::vector<uint8_t> out(stride * count, 0xA5);
  for (int64_t r = 0; r < count; ++r) t->from_float(src.data() + r * cols, out.data() + r * stride, cols);
  return out;
}

// Quantized operands of a gemm call: `rows` weight rows of `type` (each w_pad bytes past its
// RowBytes) and `cols` activation rows of the ISA's vec_dot_type, random with seeds seed and
// seed + 1.
struct Operands {
  size_t w_stride, x_stride;
  std::vector<uint8_t> w, x;
};
Operands QuantizedOperands(GgmlType type, const CpuTypeTraits& traits, int64_t rows,
                           int64_t cols, int64_t k, size_t w_pad, uint32_t seed) {
  Operands o;
  o.w_stride = RowBytes(type, k) + w_pad;
  o.x_stride = RowBytes(traits.vec_dot_type, k);
  o.w = QuantizeRows(type, RandomRows(rows * k, seed), rows, k, o.w_stride);
  o.x = QuantizeRows(traits.vec_dot_type, RandomRows(cols * k, seed + 1), cols, k, o.x_stride);
  return o;
}

// Bound on every partial sum either side forms for one dot: the kernels split a block's
// weights as d * q (+ m), and |d * q| <= 2 max|w| of the block (the offset m is within the
// block's range), while a quantized activation is within 1% of the float one.
double Magnitude(const float* w, const float* x, int64_t k, int block) {
  double mag = 0;
  for (int64_t b = 0; b < k; b += block) {
    double wmax = 0, xsum = 0;
    for (int64_t j = b; j < b + block; ++j) {
      wmax = std::max(wmax, std::fabs(static_cast<double>(w[j])));
      xsum += std::fabs(static_cast<double>(x[j]));
    }
    mag += 2.0 * wmax * xsum * 1.01;
  }
  return mag;
}

struct Shape {
  int64_t rows, k, m;
};

// Shapes for a block size: 1 row / 1 column, tile edges (rows and m not multiples of 4 or 2),
// one block and many blocks (odd and even block counts).
std::vector<Shape> Shapes(int block) {
  std::vector<Shape> s;
  for (int64_t nb : {1, 2, 3, 7, 18}) {
    for (int64_t rows : {1, 3, 4, 5, 13}) {
      for (int64_t m : {1, 2, 3, 4, 5, 9}) s.push_back({rows, nb * block, m});
    }
  }
  s.push_back({67, 40 * block, 11});
  if (block == 1) {
    // Float weights: k past the kernels' 1024-element chunks with a ragged tail, and k
    // between one vector and two.
    s.push_back({23, 2085, 14});
    s.push_back({6, 17, 7});
  }
  if (block == 256) {
    // k-quants: one pass of three column groups (AVX-512: up to 4 groups of 8 share a pass)
    // with a ragged last one, and past a pass (those unpack the weights first).
    s.push_back({37, 5 * block, 20});
    s.push_back({21, 3 * block, 40});
  }
  if (block == 32) {
    // Past one pass of column groups (AVX-512: 4 groups of 8) and a ragged last group.
    s.push_back({130, 48 * block, 33});
    s.push_back({37, 9 * block, 20});
    s.push_back({21, 131 * block, 10});  // k past the kernels' 128-block activation chunks.
  }
  return s;
}

TEST(GemmTest, TiledKernelsArePresentWhereImplemented) {
  for (Isa isa : SimdIsas()) {
    for (GgmlType type : kTiledTypes) {
      EXPECT_NE(GetCpuTraits(type, isa)->gemm, nullptr) << TypeName(type) << " " << IsaName(isa);
    }
  }
  // The scalar level is the reference: it never has a tiled kernel.
  for (GgmlType type : kTiledTypes) EXPECT_EQ(GetCpuTraits(type, Isa::kScalar)->gemm, nullptr);
}

class GemmTypeTest : public testing::TestWithParam<GgmlType> {};

TEST_P(GemmTypeTest, MatchesScalarVecDotOnEveryIsaAndShape) {
  const GgmlType type = GetParam();
  const CpuTypeTraits* ref = GetCpuTraits(type, Isa::kScalar);
  ASSERT_NE(ref, nullptr);
  const int block = static_cast<int>(TypeInfo(type).block_size);
  bool ran = false;
  for (Isa isa : SimdIsas()) {
    const GemmFn gemm = GetCpuTraits(type, isa)->gemm;
    if (gemm == nullptr) continue;
    ran = true;
    double max_err = 0, max_rel = 0;
    uint32_t seed = 1;
    for (const Shape& sh : Shapes(block)) {
      // Padded strides: rows 8 bytes apart from dense, y rows 3 floats wider than `rows`.
      const size_t w_stride = RowBytes(type, sh.k) + 8;
      const size_t x_stride = RowBytes(ref->vec_dot_type, sh.k) + 4;
      const size_t y_stride = sh.rows + 3;
      const std::vector<float> xf = RandomRows(sh.m * sh.k, seed++);
      const std::vector<uint8_t> w =
          QuantizeRows(type, RandomRows(sh.rows * sh.k, seed++), sh.rows, sh.k, w_stride);
      const std::vector<uint8_t> x = QuantizeRows(ref->vec_dot_type, xf, sh.m, sh.k, x_stride);
      std::vector<float> y(sh.m * y_stride, -7.0f);
      gemm(sh.k, w.data(), w_stride, sh.rows, x.data(), x_stride, sh.m, y.data(), y_stride);

      std::vector<float> wd(sh.k);
      for (int64_t r = 0; r < sh.rows; ++r) {
        ref->to_float(w.data() + r * w_stride, wd.data(), sh.k);
        for (int64_t c = 0; c < sh.m; ++c) {
          double expected, mag, tol;
          if (block == 1) {
            // Float weights: every product is exact in f32, so the oracle is the exact sum
            // (in double), and the kernel's error is that of its own f32 additions: k / 8
            // per lane (8 lanes on AVX2, 16 on AVX-512), one per 1024-element chunk, 4 for
            // the lane tree.
            expected = 0;
            mag = 0;
            for (int64_t j = 0; j < sh.k; ++j) {
              const double p = static_cast<double>(wd[j]) * xf[c * sh.k + j];
              expected += p;
              mag += std::fabs(p);
            }
            tol = 1.2e-7 * static_cast<double>(sh.k / 8 + sh.k / 1024 + 8) * mag + 1e-30;
          } else {
            expected = ref->vec_dot(sh.k, w.data() + r * w_stride, x.data() + c * x_stride);
            // Each of the ~k / block float additions may round (a few more for the lanes).
            mag = Magnitude(wd.data(), xf.data() + c * sh.k, sh.k, block);
            tol = 2.4e-7 * static_cast<double>(sh.k / block + 2) * mag + 1e-30;
          }
          const float got = y[c * y_stride + r];
          ASSERT_NEAR(got, expected, tol)
              << TypeName(type) << " " << IsaName(isa) << " rows=" << sh.rows << " k=" << sh.k
              << " m=" << sh.m << " r=" << r << " c=" << c;
          max_err = std::max(max_err, static_cast<double>(std::fabs(got - expected)));
          max_rel = std::max(max_rel, std::fabs(got - expected) / mag);
        }
      }
      // Padding of y is untouched.
      for (int64_t c = 0; c < sh.m; ++c) {
        for (size_t r = sh.rows; r < y_stride; ++r) ASSERT_EQ(y[c * y_stride + r], -7.0f);
      }
    }
    std::printf("  %s %s: max |err| %.3g, max |err| / magnitude %.3g\n", TypeName(type).data(),
                std::string(IsaName(isa)).c_str(), max_err, max_rel);
  }
  if (!ran) GTEST_SKIP() << "no tiled kernel for " << TypeName(type) << " on this CPU's ISAs";
}

INSTANTIATE_TEST_SUITE_P(AllTiledTypes, GemmTypeTest, testing::ValuesIn(kTiledTypes),
                         [](const testing::TestParamInfo<GgmlType>& info) {
                           return std::string(TypeName(info.param));
                         });

// A row's dot product does not depend on how the call walks its tiles: decode-shaped calls
// over back-to-back rows walk row tiles outer (gemm_float_loop.h), padded rows and wider calls
// chunks outer; each activation row alone and within a wide call gives the same bits. k spans
// several 1024-element chunks and a tail; rows end in a partial tile.
TEST(GemmTest, FloatTileWalksGiveTheSameBits) {
  const int64_t k = 2500, rows = 13;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    for (Isa isa : SimdIsas()) {
      const GemmFn gemm = GetCpuTraits(type, isa)->gemm;
      if (gemm == nullptr) continue;
      SCOPED_TRACE(std::string(TypeName(type)) + " " + std::string(IsaName(isa)));
      const int64_t cols = 9;
      const size_t dense = RowBytes(type, k), padded = dense + 64;
      const std::vector<float> wf = RandomRows(rows * k, 71);
      const std::vector<uint8_t> wd = QuantizeRows(type, wf, rows, k, dense);
      const std::vector<uint8_t> wp = QuantizeRows(type, wf, rows, k, padded);
      const std::vector<float> x = RandomRows(cols * k, 72);
      std::vector<float> wide(cols * rows);
      gemm(k, wd.data(), dense, rows, x.data(), k * sizeof(float), cols, wide.data(), rows);
      for (int64_t c = 0; c < cols; ++c) {
        for (const auto& [w, stride] : {std::pair{&wd, dense}, std::pair{&wp, padded}}) {
          std::vector<float> one(rows, -1.0f);
          gemm(k, w->data(), stride, rows, x.data() + c * k, k * sizeof(float), 1, one.data(),
               rows);
          ASSERT_EQ(0, std::memcmp(one.data(), wide.data() + c * rows, rows * sizeof(float)))
              << "column " << c << " stride " << stride;
        }
      }
    }
  }
}

// The same for the quantized tiles: decode-shaped calls (up to 8 activation rows) read the
// weight rows as they go, wider ones through a per-thread unpacked copy of the call's rows;
// both must give each activation row the bits it gets alone (the engine's batched and
// single-stream steps agree bit for bit). 19 rows end in a partial 16-row tile.
TEST(GemmTest, QuantTileWalksGiveTheSameBits) {
  const int64_t rows = 19, cols = 11;
  for (GgmlType type : kTiledTypes) {
    const int64_t block = TypeInfo(type).block_size;
    if (block == 1) continue;
    const int64_t k = 9 * block;  // 288 for the legacy types, 2304 for the k-quants
    for (Isa isa : SimdIsas()) {
      const CpuTypeTraits* traits = GetCpuTraits(type, isa);
      if (traits->gemm == nullptr) continue;
      SCOPED_TRACE(std::string(TypeName(type)) + " " + std::string(IsaName(isa)));
      const Operands op = QuantizedOperands(type, *traits, rows, cols, k, 0, 81);
      std::vector<float> wide(cols * rows);
      traits->gemm(k, op.w.data(), op.w_stride, rows, op.x.data(), op.x_stride, cols,
                   wide.data(), rows);
      for (int64_t c = 0; c < cols; ++c) {
        std::vector<float> one(rows, -1.0f);
        traits->gemm(k, op.w.data(), op.w_stride, rows, op.x.data() + c * op.x_stride,
                     op.x_stride, 1, one.data(), rows);
        ASSERT_EQ(0, std::memcmp(one.data(), wide.data() + c * rows, rows * sizeof(float)))
            << "column " << c;
      }
    }
  }
}

// Every code of the legacy formats at its extreme: random quant bytes (Q8_0 weights include
// -128, the 4- and 5-bit ones every nibble and high bit), activations of +-127 and scales of 1
// (m = 1, s = 3 for the _1 formats). Every partial sum is then an integer below 2^24, exact in
// any float order, so each ISA's tiles must give the scalar vec_dot's value exactly: a
// saturated pair sum or a sign trick that wraps would show. Shapes cover the decode tile (one
// column, rows past a multiple of 4) and every width of the prefill tiles (1..9 columns).
TEST(GemmTest, LegacyTilesAreExactAtTheExtremeCodes) {
  constexpr GgmlType kLegacy[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                  GgmlType::kQ5_0, GgmlType::kQ5_1};
  constexpr f16_t kOne = 0x3C00, kThree = 0x4200;
  std::mt19937 rng(7);
  // `count` rows of k elements of `type`, blocks of random bytes whose leading f16 fields (d,
  // and m or s for the _1 formats) are set to one and three.
  const auto make_rows = [&](GgmlType type, int64_t count, int64_t k, bool activations) {
    const GgmlTypeInfo& info = TypeInfo(type);
    const bool two_fields = type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 ||
                            type == GgmlType::kQ8_1;
    std::vector<uint8_t> out(count * (k / info.block_size) * info.type_size);
    for (size_t b = 0; b < out.size(); b += info.type_size) {
      for (int64_t j = 0; j < info.type_size; ++j) {
        // Activations: +-127 and a few values between (their quants never reach -128).
        out[b + j] = activations ? static_cast<uint8_t>(static_cast<int8_t>(
                                       rng() % 4 == 0 ? static_cast<int>(rng() % 255) - 127
                                                      : (rng() % 2 ? 127 : -127)))
                                 : static_cast<uint8_t>(rng());
      }
      std::memcpy(&out[b], &kOne, sizeof(kOne));
      if (two_fields) std::memcpy(&out[b + 2], activations ? &kThree : &kOne, sizeof(kOne));
    }
    return out;
  };
  for (GgmlType type : kLegacy) {
    const CpuTypeTraits* ref = GetCpuTraits(type, Isa::kScalar);
    const int64_t k = 9 * 32, rows = 6;
    const size_t w_stride = RowBytes(type, k), x_stride = RowBytes(ref->vec_dot_type, k);
    const std::vector<uint8_t> w = make_rows(type, rows, k, false);
    for (int64_t cols = 1; cols <= 9; ++cols) {
      const std::vector<uint8_t> x = make_rows(ref->vec_dot_type, cols, k, true);
      for (Isa isa : SimdIsas()) {
        SCOPED_TRACE(std::string(TypeName(type)) + " " + std::string(IsaName(isa)) +
                     " cols=" + std::to_string(cols));
        const GemmFn gemm = GetCpuTraits(type, isa)->gemm;
        ASSERT_NE(gemm, nullptr);
        std::vector<float> y(cols * rows);
        gemm(k, w.data(), w_stride, rows, x.data(), x_stride, cols, y.data(), rows);
        for (int64_t c = 0; c < cols; ++c) {
          for (int64_t r = 0; r < rows; ++r) {
            ASSERT_EQ(y[c * rows + r],
                      ref->vec_dot(k, w.data() + r * w_stride, x.data() + c * x_stride))
                << "row " << r << " column " << c;
          }
        }
      }
    }
  }
}

// The AVX2 k-quant tiles do, for every (weight row, activation row) pair, the operations of
// that ISA's vec_dot in its order: a tile gives each pair the dot's bits, so MatMul's tiled
// and per-dot paths (and prefill against decode) agree exactly on AVX2 machines.
TEST(GemmTest, Avx2KQuantTilesGiveTheDotsBits) {
  if (DetectedIsa() < Isa::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU";
  const int64_t rows = 7, cols = 11;  // a full 8-column tile and a 3-column edge
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(TypeName(type));
    const CpuTypeTraits* traits = GetCpuTraits(type, Isa::kAvx2);
    const int64_t k = 5 * TypeInfo(type).block_size;
    // Padded weight rows: the stride is honoured.
    const Operands op = QuantizedOperands(type, *traits, rows, cols, k, 16, 91);
    std::vector<float> y(cols * rows);
    traits->gemm(k, op.w.data(), op.w_stride, rows, op.x.data(), op.x_stride, cols, y.data(),
                 rows);
    for (int64_t c = 0; c < cols; ++c) {
      for (int64_t r = 0; r < rows; ++r) {
        const float dot =
            traits->vec_dot(k, op.w.data() + r * op.w_stride, op.x.data() + c * op.x_stride);
        ASSERT_EQ(0, std::memcmp(&dot, &y[c * rows + r], sizeof(float)))
            << "row " << r << " column " << c << ": " << dot << " against " << y[c * rows + r];
      }
    }
  }
}

// MatMul's tiled path (work items of weight rows, L1 sub-blocks) against the reference, with
// prefill-shaped batches and several thread counts.
TEST(GemmTest, MatMulTiledPathMatchesReference) {
  struct Case {
    GgmlType type;
    int64_t rows, cols, m;
  };
  const Case cases[] = {{GgmlType::kQ4_1, 577, 576, 37}, {GgmlType::kQ8_0, 203, 1536, 9},
                        {GgmlType::kQ4_0, 1001, 64, 70}, {GgmlType::kQ4_K, 131, 768, 13},
                        {GgmlType::kQ6_K, 66, 512, 5},   {GgmlType::kQ5_1, 9, 96, 1},
                        {GgmlType::kQ5_K, 40, 1024, 9},  {GgmlType::kQ6_K, 300, 1024, 1},
                        {GgmlType::kF16, 131, 1100, 15}, {GgmlType::kBF16, 70, 2048, 7},
                        {GgmlType::kF32, 33, 200, 1},
                        // Activations past MatMul's L2-sized chunks (several chunks and a ragged
                        // last one where L2 is 512 KiB or 1 MiB).
                        {GgmlType::kQ8_0, 64, 4096, 100}, {GgmlType::kF32, 20, 2048, 70}};
  for (const Case& c : cases) {
    const std::vector<float> wf = RandomRows(c.rows * c.cols, 11);
    const std::vector<float> x = RandomRows(c.m * c.cols, 12);
    const size_t row_bytes = RowBytes(c.type, c.cols);
    const std::vector<uint8_t> w = QuantizeRows(c.type, wf, c.rows, c.cols, row_bytes);
    const WeightView view = WeightView::Dense(w.data(), c.type, c.rows, c.cols);
    std::vector<float> ref(c.m * c.rows);
    MatMulRef(view, x.data(), c.m, ref.data());
    const int block = static_cast<int>(TypeInfo(c.type).block_size);
    std::vector<double> tol(c.m * c.rows);
    std::vector<float> wd(c.cols);
    for (int64_t r = 0; r < c.rows; ++r) {
      GetCpuTraits(c.type, Isa::kScalar)->to_float(w.data() + r * row_bytes, wd.data(), c.cols);
      for (int64_t i = 0; i < c.m; ++i) {
        tol[i * c.rows + r] = 2.4e-7 * static_cast<double>(c.cols / block + 2) *
                              Magnitude(wd.data(), x.data() + i * c.cols, c.cols, block);
      }
    }
    for (Isa isa : SimdIsas()) {
      for (int threads : {1, 3}) {
        ThreadPool pool(threads);
        std::vector<float> y(c.m * c.rows, NAN);
        MatMulIsa(view, x.data(), c.m, y.data(), pool, isa);
        for (int64_t j = 0; j < c.m * c.rows; ++j) {
          ASSERT_NEAR(y[j], ref[j], tol[j]) << TypeName(c.type) << " " << IsaName(isa)
                                         << " threads=" << threads << " index=" << j;
        }
      }
    }
  }
}

}  // namespace
}  // namespace fucina
