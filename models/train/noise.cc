#include "models/train/noise.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>

// The recipe in noise.h is only reproducible if each + and * rounds on its own: a fused
// multiply-add (which -ffp-contract=fast or an FMA-enabled -march would emit) changes bits.
// models/CMakeLists.txt builds this file with -ffp-contract=off; refuse a build that reverts it.
#if defined(__FAST_MATH__)
#error "models/train/noise.cc must not be built with -ffast-math: its results must be bit-exact"
#endif

namespace fucina {
namespace {

constexpr uint64_t kPhiloxM0 = 0xD2E7470EE14C6C93ull;
constexpr uint64_t kPhiloxM1 = 0xCA5A826395121157ull;
constexpr uint64_t kPhiloxW0 = 0x9E3779B97F4A7C15ull;  // golden ratio
constexpr uint64_t kPhiloxW1 = 0xBB67AE8584CAA73Bull;  // sqrt(3) - 1

constexpr double kSqrt2 = 0x1.6a09e667f3bcdp+0;
constexpr double kLn2 = 0x1.62e42fefa39efp-1;
constexpr double kTwoPiOver2p53 = 0x1.921fb54442d18p-51;

// L[k] = 1 / (2k + 1): ln(m) = 2 s sum_k s^(2k) / (2k + 1), s = (m - 1) / (m + 1). |s| <= 0.172,
// so the first omitted term is below 2^-56 relative.
constexpr double kLogCoef[11] = {
    0x1.0000000000000p+0, 0x1.5555555555555p-2, 0x1.999999999999ap-3, 0x1.2492492492492p-3,
    0x1.c71c71c71c71cp-4, 0x1.745d1745d1746p-4, 0x1.3b13b13b13b14p-4, 0x1.1111111111111p-4,
    0x1.e1e1e1e1e1e1ep-5, 0x1.af286bca1af28p-5, 0x1.8618618618618p-5};
// Taylor coefficients of sin and cos for |phi| <= pi/4; first omitted terms below 1e-18.
constexpr double kSinCoef[9] = {
    0x1.0000000000000p+0,  -0x1.5555555555555p-3, 0x1.1111111111111p-7,
    -0x1.a01a01a01a01ap-13, 0x1.71de3a556c734p-19, -0x1.ae64567f544e4p-26,
    0x1.6124613a86d09p-33, -0x1.ae7f3e733b81fp-41, 0x1.952c77030ad4ap-49};
constexpr double kCosCoef[10] = {
    0x1.0000000000000p+0,   -0x1.0000000000000p-1, 0x1.5555555555555p-5,
    -0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-16, -0x1.27e4fb7789f5cp-22,
    0x1.1eed8eff8d898p-29,  -0x1.93974a8c07c9dp-37, 0x1.ae7f3e733b81fp-45,
    -0x1.6827863b97d97p-53};

template <int N>
double Horner(const double (&coef)[N], double z) {
  double p = coef[N - 1];
  for (int k = N - 2; k >= 0; --k) p = p * z + coef[k];
  return p;
}

// ln(v * 2^-53) for v in [1, 2^53].
double LogUnit(uint64_t v) {
  int e = 63 - std::countl_zero(v);
  double m = std::ldexp(static_cast<double>(v), -e);  // exact: v < 2^54 fits a double.
  if (m > kSqrt2) {
    m = m * 0.5;
    e = e + 1;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double p = Horner(kLogCoef, s * s);
  return static_cast<double>(e - 53) * kLn2 + (2.0 * s) * p;
}

// The four normals of `block`, in lane order.
std::array<float, 4> NormalBlock(const NoiseKey& key, uint64_t block) {
  const std::array<uint64_t, 4> x =
      Philox4x64_10({block, key.member, key.generation, 0}, {key.seed, key.parameter});
  const std::array<float, 2> a = NormalPair(x[0], x[1]);
  const std::array<float, 2> b = NormalPair(x[2], x[3]);
  return {a[0], a[1], b[0], b[1]};
}

// A dispatch per 16 Ki elements (~0.4 ms of work on one core at ~25 ns an element).
constexpr int64_t kGrain = int64_t{1} << 14;

}  // namespace

std::array<uint64_t, 4> Philox4x64_10(const std::array<uint64_t, 4>& counter,
                                      const std::array<uint64_t, 2>& key) {
  uint64_t x0 = counter[0], x1 = counter[1], x2 = counter[2], x3 = counter[3];
  uint64_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kPhiloxW0;
      k1 += kPhiloxW1;
    }
    const unsigned __int128 p0 = static_cast<unsigned __int128>(kPhiloxM0) * x0;
    const unsigned __int128 p1 = static_cast<unsigned __int128>(kPhiloxM1) * x2;
    const uint64_t hi0 = static_cast<uint64_t>(p0 >> 64), lo0 = static_cast<uint64_t>(p0);
    const uint64_t hi1 = static_cast<uint64_t>(p1 >> 64), lo1 = static_cast<uint64_t>(p1);
    x0 = hi1 ^ x1 ^ k0;
    x1 = lo1;
    x2 = hi0 ^ x3 ^ k1;
    x3 = lo0;
  }
  return {x0, x1, x2, x3};
}

std::array<float, 2> NormalPair(uint64_t radius_word, uint64_t angle_word) {
  const double r = std::sqrt(-2.0 * LogUnit((radius_word >> 11) + 1));

  const uint64_t a = angle_word >> 11;
  const uint64_t octant = a >> 50;
  const uint64_t quadrant = octant >> 1;
  const uint64_t t = a & ((uint64_t{1} << 50) - 1);
  const bool odd = (octant & 1) != 0;
  const double phi = static_cast<double>(odd ? (uint64_t{1} << 50) - t : t) * kTwoPiOver2p53;
  const double z = phi * phi;
  const double sin_phi = phi * Horner(kSinCoef, z);
  const double cos_phi = Horner(kCosCoef, z);
  // An odd octant measures phi back from the next quadrant boundary.
  const double co = odd ? sin_phi : cos_phi;
  const double si = odd ? cos_phi : sin_phi;
  double c, s;
  switch (quadrant) {
    case 0: c = co, s = si; break;
    case 1: c = -si, s = co; break;
    case 2: c = -co, s = -si; break;
    default: c = si, s = -co; break;
  }
  return {static_cast<float>(r * c), static_cast<float>(r * s)};
}

void FillNormal(const NoiseKey& key, int64_t offset, int64_t n, float* out) {
  assert(offset >= 0);
  const int64_t end = offset + n;
  for (int64_t i = offset; i < end;) {
    const std::array<float, 4> block = NormalBlock(key, static_cast<uint64_t>(i) >> 2);
    const int64_t lane = i & 3;
    const int64_t take = std::min<int64_t>(4 - lane, end - i);
    std::copy_n(block.begin() + lane, take, out);
    out += take;
    i += take;
  }
}

void FillNormal(const NoiseKey& key, int64_t offset, int64_t n, float* out, ThreadPool& pool) {
  pool.ParallelFor(n, kGrain, [&](int64_t begin, int64_t end, int) {
    FillNormal(key, offset + begin, end - begin, out + begin);
  });
}

void FillNormalRef(const NoiseKey& key, int64_t offset, int64_t n, float* out) {
  assert(offset >= 0);
  for (int64_t j = 0; j < n; ++j) {
    const uint64_t i = static_cast<uint64_t>(offset + j);
    const std::array<uint64_t, 4> x =
        Philox4x64_10({i / 4, key.member, key.generation, 0}, {key.seed, key.parameter});
    const int lane = static_cast<int>(i % 4);
    const std::array<float, 2> pair = NormalPair(x[lane < 2 ? 0 : 2], x[lane < 2 ? 1 : 3]);
    out[j] = pair[lane % 2];
  }
}

}  // namespace fucina
