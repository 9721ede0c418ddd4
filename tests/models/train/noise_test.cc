#include "models/train/noise.h"

#include <unistd.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "kernels/cpu/thread_pool.h"

namespace fucina {
namespace {

constexpr uint64_t kOnes = ~uint64_t{0};

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = std::bit_cast<uint32_t>(v[i]);
  return bits;
}

// Runs tests/models/train/noise_ref.py (numpy's Philox, the header's recipe in plain Python) on
// `requests` (see the script's usage) and returns its output lines; empty with a failure if it
// fails.
std::vector<std::string> RunReference(const std::vector<std::string>& requests) {
  const std::string path = ::testing::TempDir() + "fucina_noise_ref_" +
                           std::to_string(::getpid()) + ".txt";
  {
    std::ofstream f(path);
    for (const std::string& r : requests) f << r << "\n";
  }
  const std::string cmd = std::string("'") + std::getenv("FUCINA_PYTHON") + "' '" +
                          FUCINA_TEST_SOURCE_DIR + "/models/train/noise_ref.py' '" + path + "'";
  std::string output;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "cannot run " << cmd;
    return {};
  }
  char buf[4096];
  for (size_t got; (got = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) output.append(buf, got);
  const int rc = ::pclose(pipe);
  std::remove(path.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "reference script failed (" << rc << "): " << cmd;
    return {};
  }
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  EXPECT_EQ(lines.size(), requests.size());
  return lines;
}

std::vector<uint64_t> ParseHex(const std::string& line) {
  std::vector<uint64_t> words;
  std::istringstream in(line);
  for (std::string w; in >> w;) words.push_back(std::stoull(w, nullptr, 16));
  return words;
}

#define SKIP_WITHOUT_PYTHON()                                                           \
  if (std::getenv("FUCINA_PYTHON") == nullptr)                                          \
  GTEST_SKIP() << "FUCINA_PYTHON is unset: set it to a python with numpy (scripts/test.sh " \
                  "does) to compare against numpy's Philox and a Python Box-Muller"

// Random123's known-answer vectors (kat_vectors, philox4x64_10): zeros, all ones, digits of pi.
TEST(Philox4x64_10, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(Philox4x64_10({0, 0, 0, 0}, {0, 0}),
            (std::array<uint64_t, 4>{0x16554d9eca36314cull, 0xdb20fe9d672d0fdcull,
                                     0xd7e772cee186176bull, 0x7e68b68aec7ba23bull}));
  EXPECT_EQ(Philox4x64_10({kOnes, kOnes, kOnes, kOnes}, {kOnes, kOnes}),
            (std::array<uint64_t, 4>{0x87b092c3013fe90bull, 0x438c3c67be8d0224ull,
                                     0x9cc7d7c69cd777b6ull, 0xa09caebf594f0ba0ull}));
  EXPECT_EQ(Philox4x64_10({0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                           0x082efa98ec4e6c89ull},
                          {0x452821e638d01377ull, 0xbe5466cf34e90c6cull}),
            (std::array<uint64_t, 4>{0xa528f45403e61d95ull, 0x38c72dbd566e9788ull,
                                     0xa5a1610e72fd18b5ull, 0x57bd43b5e52b7fe6ull}));
}

TEST(Philox4x64_10, MatchesNumpy) {
  SKIP_WITHOUT_PYTHON();
  // Counters where numpy's pre-increment carries or wraps: (0,0,0,0) starts from all ones,
  // (0,1,0,0) and (0,0,0,1) borrow across words.
  const std::vector<std::pair<std::array<uint64_t, 4>, std::array<uint64_t, 2>>> cases = {
      {{0, 0, 0, 0}, {0, 0}},
      {{kOnes, kOnes, kOnes, kOnes}, {kOnes, kOnes}},
      {{0, 1, 0, 0}, {1, 0}},
      {{0, 0, 0, 1}, {0, 1}},
      {{kOnes, 0, kOnes, 0}, {0x0123456789abcdefull, 0xfedcba9876543210ull}},
      {{7, 3, 2, 0}, {42, 5}},
      {{0x8000000000000000ull, 0, 0, 0x8000000000000000ull}, {kOnes, 0}},
  };
  std::vector<std::string> requests;
  for (const auto& [c, k] : cases) {
    requests.push_back(absl::StrFormat("philox %x %x %x %x %x %x", c[0], c[1], c[2], c[3], k[0],
                                       k[1]));
  }
  const std::vector<std::string> lines = RunReference(requests);
  ASSERT_EQ(lines.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::array<uint64_t, 4> got = Philox4x64_10(cases[i].first, cases[i].second);
    EXPECT_EQ(std::vector<uint64_t>(got.begin(), got.end()), ParseHex(lines[i])) << requests[i];
  }
}

TEST(NormalPair, MatchesPythonRecipe) {
  SKIP_WITHOUT_PYTHON();
  // Extremes of the radius (u = 2^-53, u = 1, the sqrt(2) mantissa split) and the angle at
  // and beside every octant boundary, plus a scramble of ordinary words.
  std::vector<std::pair<uint64_t, uint64_t>> cases = {
      {0, 0}, {kOnes, kOnes}, {kOnes, 0}, {0, kOnes}, {uint64_t{0x6a09e667f3bcd} << 11, 0}};
  for (uint64_t octant = 0; octant < 8; ++octant) {
    const uint64_t boundary = octant << 61;
    cases.push_back({0x0123456789abcdefull, boundary});
    cases.push_back({0x0123456789abcdefull, boundary + (uint64_t{1} << 11)});
    cases.push_back({0x0123456789abcdefull, boundary - (uint64_t{1} << 11)});
  }
  for (uint64_t i = 0; i < 64; ++i) {
    const std::array<uint64_t, 4> x = Philox4x64_10({i, 0, 0, 0}, {99, 0});
    cases.push_back({x[0], x[1]});
    cases.push_back({x[2] >> (i % 60), x[3]});  // small radius words: u near 2^-53
  }
  std::vector<std::string> requests;
  for (const auto& [w0, w1] : cases) requests.push_back(absl::StrFormat("pair %x %x", w0, w1));
  const std::vector<std::string> lines = RunReference(requests);
  ASSERT_EQ(lines.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::array<float, 2> got = NormalPair(cases[i].first, cases[i].second);
    EXPECT_EQ(
        (std::vector<uint64_t>{std::bit_cast<uint32_t>(got[0]), std::bit_cast<uint32_t>(got[1])}),
        ParseHex(lines[i]))
        << requests[i] << " -> " << got[0] << ", " << got[1];
  }
}

TEST(FillNormal, MatchesPythonRecipe) {
  SKIP_WITHOUT_PYTHON();
  struct Case {
    NoiseKey key;
    int64_t offset, n;
  };
  const std::vector<Case> cases = {
      {{0, 0, 0, 0}, 0, 1000},
      {{12345, 7, 3, 11}, 3, 997},
      {{kOnes, kOnes, kOnes, kOnes}, 1, 6},
      {{0xdeadbeefcafef00dull, 1000000, 255, 1234}, (int64_t{1} << 40) + 5, 301},
      {{1, 2, 3, 4}, (int64_t{1} << 62) + 2, 50},
  };
  std::vector<std::string> requests;
  for (const Case& c : cases) {
    requests.push_back(absl::StrFormat("normal %x %x %x %x %x %x", c.key.seed, c.key.generation,
                                       c.key.member, c.key.parameter, c.offset, c.n));
  }
  const std::vector<std::string> lines = RunReference(requests);
  ASSERT_EQ(lines.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    std::vector<float> got(cases[i].n);
    FillNormal(cases[i].key, cases[i].offset, cases[i].n, got.data());
    const std::vector<uint32_t> bits = Bits(got);
    EXPECT_EQ(std::vector<uint64_t>(bits.begin(), bits.end()), ParseHex(lines[i])) << requests[i];
  }
}

TEST(FillNormal, ThreadedAndSplitsMatchReference) {
  const NoiseKey key{77, 5, 9, 3};
  ThreadPool pool(4);
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 0}, {0, 1}, {1, 2}, {3, 5}, {7, 100003}, {2, 65537}, {(int64_t{1} << 33) + 1, 4099}};
  for (const auto& [offset, n] : ranges) {
    std::vector<float> ref(n), single(n), threaded(n);
    FillNormalRef(key, offset, n, ref.data());
    FillNormal(key, offset, n, single.data());
    FillNormal(key, offset, n, threaded.data(), pool);
    EXPECT_EQ(Bits(single), Bits(ref)) << "offset " << offset << " n " << n;
    EXPECT_EQ(Bits(threaded), Bits(ref)) << "offset " << offset << " n " << n;
    // Cut anywhere, not only at block (4-element) boundaries.
    for (int64_t cut : {int64_t{1}, int64_t{3}, n / 2 + 1, n - 2}) {
      if (cut <= 0 || cut >= n) continue;
      std::vector<float> pieces(n);
      FillNormal(key, offset, cut, pieces.data());
      FillNormal(key, offset + cut, n - cut, pieces.data() + cut);
      EXPECT_EQ(Bits(pieces), Bits(ref)) << "offset " << offset << " n " << n << " cut " << cut;
    }
  }
}

TEST(FillNormal, IsStandardNormal) {
  constexpr int64_t kN = 1'000'000;
  std::vector<float> z(kN);
  ThreadPool pool(2);
  FillNormal({2024, 1, 0, 0}, 0, kN, z.data(), pool);
  double sum = 0, sum2 = 0, sum4 = 0, lag1 = 0, max_abs = 0;
  int64_t within_one = 0;
  for (int64_t i = 0; i < kN; ++i) {
    const double x = z[i];
    sum += x;
    sum2 += x * x;
    sum4 += x * x * x * x;
    if (i > 0) lag1 += x * z[i - 1];
    within_one += std::fabs(x) < 1.0;
    max_abs = std::max(max_abs, std::fabs(x));
  }
  // Bounds are 5 standard errors of each estimate for n = 1e6 draws of N(0, 1): mean 1e-3,
  // E[x^2] sqrt(2)e-3, E[x^4] sqrt(96)e-3, lag-1 product 1e-3, P(|x| < 1) 4.7e-4.
  const double n = kN;
  EXPECT_NEAR(sum / n, 0.0, 5e-3);
  EXPECT_NEAR(sum2 / n, 1.0, 7.1e-3);
  EXPECT_NEAR(sum4 / n, 3.0, 4.9e-2);
  EXPECT_NEAR(lag1 / n, 0.0, 5e-3);  // cos/sin halves of a pair are uncorrelated
  EXPECT_NEAR(within_one / n, 0.682689, 2.4e-3);
  EXPECT_LE(max_abs, 8.58);  // sqrt(-2 ln 2^-53): the largest radius the recipe can give
  EXPECT_GT(max_abs, 4.0);
}

TEST(FillNormal, EveryKeyFieldSelectsItsOwnStream) {
  constexpr int64_t kN = 4096;
  const NoiseKey base{10, 20, 30, 40};
  std::vector<NoiseKey> keys = {base, base, base, base, base};
  keys[1].seed += 1;
  keys[2].generation += 1;
  keys[3].member += 1;
  keys[4].parameter += 1;
  std::vector<std::vector<float>> streams;
  for (const NoiseKey& k : keys) {
    streams.emplace_back(kN);
    FillNormal(k, 0, kN, streams.back().data());
  }
  for (size_t a = 0; a < streams.size(); ++a) {
    for (size_t b = a + 1; b < streams.size(); ++b) {
      double dot = 0;
      int64_t equal = 0;
      for (int64_t i = 0; i < kN; ++i) {
        dot += static_cast<double>(streams[a][i]) * streams[b][i];
        equal += streams[a][i] == streams[b][i];
      }
      // Independent streams: correlation within 5 / sqrt(n), and equal floats only by chance.
      EXPECT_NEAR(dot / kN, 0.0, 5.0 / std::sqrt(static_cast<double>(kN))) << a << " vs " << b;
      EXPECT_LT(equal, 4) << a << " vs " << b;
    }
  }
}

}  // namespace
}  // namespace fucina
