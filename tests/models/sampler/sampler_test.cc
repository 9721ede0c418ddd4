// Sampler and Rng. Expected values are derived independently of the code under test: the RNG
// against a Python re-implementation (rng_ref.py, run with $FUCINA_PYTHON) and values pinned
// from it, filters and penalties against sets/numbers worked out by hand from the formulas,
// and sampling frequencies against softmax(logits / T) computed here in double.
#include "models/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/sampler/rng.h"

namespace fucina {
namespace {

using ::testing::ElementsAre;

std::vector<int32_t> Ids(const std::vector<Candidate>& c) {
  std::vector<int32_t> ids;
  for (const Candidate& x : c) ids.push_back(x.id);
  return ids;
}

std::vector<Candidate> FromLogits(const std::vector<float>& logits) {
  std::vector<Candidate> c;
  for (size_t i = 0; i < logits.size(); ++i) c.push_back({int32_t(i), logits[i]});
  return c;
}

// Softmax in double.
std::vector<double> Softmax(const std::vector<float>& logits, double temperature = 1.0) {
  double max = -INFINITY;
  for (float x : logits) max = std::max(max, double(x) / temperature);
  std::vector<double> p;
  double sum = 0;
  for (float x : logits) {
    p.push_back(std::exp(double(x) / temperature - max));
    sum += p.back();
  }
  for (double& v : p) v /= sum;
  return p;
}

SamplingParams NoFilters(float temperature) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

// ----- Rng ---------------------------------------------------------------------------------

TEST(Rng, SplitMix64PublishedVector) {
  // SplitMix64 from state 0: the reference outputs published with the algorithm.
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64Next(&state), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(SplitMix64Next(&state), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(SplitMix64Next(&state), 0x06C45D188009454Full);
}

TEST(Rng, PinnedGoldenSequence) {
  // From tests/models/sampler/rng_ref.py (independent Python implementation of rng.h).
  Rng a(0);
  EXPECT_EQ(a.NextU64(), 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(a.NextU64(), 0xbf6e1f784956452aull);
  EXPECT_EQ(a.NextU64(), 0x1a5f849d4933e6e0ull);
  EXPECT_EQ(a.NextU64(), 0x6aa594f1262d2d2cull);
  Rng b(42);
  EXPECT_EQ(b.NextFloat(), 1406987 * 0x1.0p-24f);
  EXPECT_EQ(b.NextFloat(), 6358233 * 0x1.0p-24f);
  EXPECT_EQ(b.NextFloat(), 11409235 * 0x1.0p-24f);
  EXPECT_EQ(b.NextFloat(), 15513773 * 0x1.0p-24f);
}

TEST(Rng, NextFloatInUnitIntervalAndReproducible) {
  Rng a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 100000; ++i) {
    const float x = a.NextFloat();
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    ASSERT_EQ(x, b.NextFloat());
    differs |= (x != c.NextFloat());
  }
  EXPECT_TRUE(differs);
}

// The output of rng_ref.py (the Python re-implementation) run with `args`.
void RunReference(const char* python, const std::string& args, std::string* out) {
  const std::string cmd = std::string("'") + python + "' '" FUCINA_TEST_SOURCE_DIR
                          "/models/sampler/rng_ref.py' " + args;
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out->append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << cmd;
}

TEST(Rng, MatchesPythonReference) {
  const char* python = std::getenv("FUCINA_PYTHON");
  if (python == nullptr) GTEST_SKIP() << "FUCINA_PYTHON is not set (scripts/test.sh sets it)";
  constexpr int kCount = 2000;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{42}, uint64_t{0xDEADBEEF},
                        std::numeric_limits<uint64_t>::max()}) {
    SCOPED_TRACE(seed);
    std::string out;
    ASSERT_NO_FATAL_FAILURE(RunReference(
        python, std::to_string(seed) + " " + std::to_string(kCount), &out));
    std::istringstream lines(out);
    Rng u(seed), f(seed);
    int count = 0;
    std::string hex;
    uint64_t top24;
    while (lines >> hex >> top24) {
      ASSERT_EQ(u.NextU64(), std::stoull(hex, nullptr, 16)) << "value " << count;
      ASSERT_EQ(f.NextFloat(), float(top24) * 0x1.0p-24f) << "value " << count;
      ++count;
    }
    EXPECT_EQ(count, kCount);
  }
  // PositionDraw: the first float of a generator keyed by seed and position.
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, std::numeric_limits<uint64_t>::max()}) {
    SCOPED_TRACE(seed);
    std::string out;
    ASSERT_NO_FATAL_FAILURE(RunReference(
        python, "position " + std::to_string(seed) + " " + std::to_string(kCount), &out));
    std::istringstream lines(out);
    int64_t position = 0;
    uint64_t top24;
    while (lines >> top24) {
      ASSERT_EQ(PositionDraw(seed, position), float(top24) * 0x1.0p-24f) << position;
      ++position;
    }
    EXPECT_EQ(position, kCount);
  }
}

// ----- Filters and penalties ---------------------------------------------------------------

TEST(Filters, TopKKeepsTheKHighestTiesByLowerId) {
  std::vector<Candidate> c = FromLogits({1.0f, 3.0f, 2.0f, 3.0f, 0.5f, -1.0f});
  ApplyTopK(c, 3);
  EXPECT_THAT(Ids(c), ElementsAre(1, 3, 2));
  c = FromLogits({1.0f, 3.0f, 2.0f});
  ApplyTopK(c, 0);  // Off: all kept, sorted.
  EXPECT_THAT(Ids(c), ElementsAre(1, 2, 0));
  c = FromLogits({1.0f, 3.0f});
  ApplyTopK(c, 5);
  EXPECT_THAT(Ids(c), ElementsAre(1, 0));
}

// Probabilities 0.1, 0.5, 0.15, 0.25 on ids 0..3 (given as log-probabilities).
std::vector<float> FourWay() {
  return {std::log(0.10f), std::log(0.50f), std::log(0.15f), std::log(0.25f)};
}

TEST(Filters, TopPKeepsTheSmallestPrefixReachingP) {
  auto run = [](float p) {
    std::vector<Candidate> c = FromLogits(FourWay());
    ApplyTopK(c, 0);
    ApplyTopP(c, p);
    return Ids(c);
  };
  // Sorted masses 0.5, 0.25, 0.15, 0.1 -> cumulative 0.5, 0.75, 0.9, 1.0.
  EXPECT_THAT(run(0.45f), ElementsAre(1));
  EXPECT_THAT(run(0.70f), ElementsAre(1, 3));
  EXPECT_THAT(run(0.80f), ElementsAre(1, 3, 2));
  EXPECT_THAT(run(0.95f), ElementsAre(1, 3, 2, 0));
  EXPECT_THAT(run(1.00f), ElementsAre(1, 3, 2, 0));
}

// Top-k off: the nucleus found by sorting only the leading candidates is the one sorting the
// whole vocabulary gives, for small and large nuclei (the latter past every partial sort) and
// with masked (-inf) entries.
TEST(Filters, SortAndApplyTopPEqualsSortingEverything) {
  const int n = 49152;
  for (int shape = 0; shape < 3; ++shape) {
    std::vector<float> logits(n);
    uint64_t state = 17 + shape;
    for (int i = 0; i < n; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float u = static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
      // 0: a peaked model (a few tokens far above the rest); 1: nearly flat; 2: peaked with
      // a masked half.
      logits[i] = shape == 1 ? u : (i % 4099 == 0 ? 12.0f + u : 8.0f * u - 4.0f);
      if (shape == 2 && i % 2 == 1) logits[i] = -std::numeric_limits<float>::infinity();
    }
    for (float p : {0.05f, 0.5f, 0.9f, 0.95f, 0.999f, 1.0f}) {
      SCOPED_TRACE("shape " + std::to_string(shape) + " p " + std::to_string(p));
      std::vector<Candidate> want = FromLogits(logits);
      ApplyTopK(want, 0);
      ApplyTopP(want, p);
      std::vector<Candidate> got = FromLogits(logits);
      SortAndApplyTopP(got, p);
      EXPECT_EQ(Ids(got), Ids(want));
    }
  }
}

TEST(Filters, MinPKeepsTokensAtLeastPTimesTheBest) {
  auto run = [](float p) {
    std::vector<Candidate> c = FromLogits(FourWay());
    ApplyTopK(c, 0);
    ApplyMinP(c, p);
    return Ids(c);
  };
  // Best 0.5: min_p 0.35 -> >= 0.175; 0.28 -> >= 0.14; 0.19 -> >= 0.095.
  EXPECT_THAT(run(0.35f), ElementsAre(1, 3));
  EXPECT_THAT(run(0.28f), ElementsAre(1, 3, 2));
  EXPECT_THAT(run(0.19f), ElementsAre(1, 3, 2, 0));
  EXPECT_THAT(run(0.9f), ElementsAre(1));
  EXPECT_THAT(run(0.0f), ElementsAre(1, 3, 2, 0));
}

TEST(Filters, PenaltiesFollowTheFormulas) {
  std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  // Window of the last 6: {1, 1, 2, 0, 1, 7}; the leading 3 and 4 fall outside it, 7 and -2
  // are outside the vocabulary and ignored.
  const std::vector<int32_t> history = {3, 4, -2, 1, 1, 2, 0, 1, 7};
  SamplingParams p;
  p.penalty_last_n = 6;
  p.repetition_penalty = 1.25f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  ApplyPenalties(logits, history, p);
  EXPECT_FLOAT_EQ(logits[0], 2.0f / 1.25f - (1 * 0.5f + 0.25f));   // count 1, positive.
  EXPECT_FLOAT_EQ(logits[1], -1.0f * 1.25f - (3 * 0.5f + 0.25f));  // count 3, negative.
  EXPECT_FLOAT_EQ(logits[2], 0.5f / 1.25f - (1 * 0.5f + 0.25f));
  EXPECT_FLOAT_EQ(logits[3], 3.0f);  // Outside the window.
  EXPECT_FLOAT_EQ(logits[4], 1.0f);  // Never seen.

  // penalty_last_n = -1: the whole history; 0: off.
  std::vector<float> all = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  p.penalty_last_n = -1;
  ApplyPenalties(all, history, p);
  EXPECT_FLOAT_EQ(all[3], 3.0f / 1.25f - 0.75f);
  EXPECT_FLOAT_EQ(all[4], 1.0f / 1.25f - 0.75f);
  std::vector<float> off = {2.0f, -1.0f};
  p.penalty_last_n = 0;
  ApplyPenalties(off, history, p);
  EXPECT_THAT(off, ElementsAre(2.0f, -1.0f));
}

TEST(Sampler, ChainOrderTopKThenTopPThenMinPThenTemperature) {
  // Raw probabilities 0.4 0.3 0.1 0.1 0.05 0.05 on ids 5,4,3,2,1,0.
  const std::vector<float> logits = {std::log(0.05f), std::log(0.05f), std::log(0.1f),
                                     std::log(0.1f), std::log(0.3f), std::log(0.4f)};
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 4;       // ids 5 4 2 3 (tie 0.1: lower id first) -> renormalized over 0.9.
  p.top_p = 0.85f;   // masses 0.444 0.333 0.111 0.111: cumulative 0.444 0.778 0.889 -> 3 kept.
  p.min_p = 0.3f;    // >= 0.3 * 0.444 = 0.133 of the renormalized mass -> ids 5 4.
  Sampler s(p);
  std::vector<Candidate> c = s.Candidates(logits, {});
  ASSERT_THAT(Ids(c), ElementsAre(5, 4));
  EXPECT_FLOAT_EQ(c[0].logit, std::log(0.4f) / 0.5f);  // Tempered last.
  EXPECT_FLOAT_EQ(c[1].logit, std::log(0.3f) / 0.5f);
  p.min_p = 0.0f;
  EXPECT_THAT(Ids(Sampler(p).Candidates(logits, {})), ElementsAre(5, 4, 2));
}

// ----- Sampling ----------------------------------------------------------------------------

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(NoFilters(0.0f));
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 2.0f, -1.0f, 1.9f}, {}).id, 1);
  EXPECT_EQ(s.Sample(std::vector<float>{0.1f, 2.0f, -1.0f, 2.0f}, {}).id, 1);
  SamplingParams neg = NoFilters(-1.0f);
  EXPECT_EQ(Sampler(neg).Sample(std::vector<float>{3.0f, 3.0f}, {}).id, 0);
  // Penalties apply before the argmax: repeating token 1 hands the pick to token 3.
  SamplingParams pen = NoFilters(0.0f);
  pen.repetition_penalty = 1.1f;
  const std::vector<int32_t> history = {1};
  EXPECT_EQ(Sampler(pen).Sample(std::vector<float>{0.1f, 2.0f, -1.0f, 1.9f}, history).id, 3);
}

TEST(Sampler, SeededSequenceIsReproducible) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = std::sin(float(i)) * 2.0f;
  SamplingParams p;
  p.seed = 1234;
  Sampler a(p), b(p);
  p.seed = 1235;
  Sampler c(p);
  std::vector<int32_t> first, history;
  bool differs = false;
  for (int i = 0; i < 200; ++i) {
    const int32_t x = a.Sample(logits, history).id;
    ASSERT_EQ(x, b.Sample(logits, history).id);
    differs |= (x != c.Sample(logits, history).id);
    first.push_back(x);
    history.push_back(x);
  }
  EXPECT_TRUE(differs);
  a.Reset(1234);
  history.clear();
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(a.Sample(logits, history).id, first[i]);
    history.push_back(first[i]);
  }
}

TEST(Sampler, TheDrawIsThePositionsWhateverCameBefore) {
  // With equal weights over three the pick is floor(3 u) for the position's draw u; greedy,
  // peaked and skipped positions before it change nothing.
  const std::vector<float> peaked = {10.0f, 0.0f, 0.0f}, flat = {0.0f, 0.0f, 0.0f};
  SamplingParams p = NoFilters(1.0f);
  p.min_p = 0.5f;
  p.seed = 11;
  Sampler s(p);
  std::vector<int32_t> history = {7};
  for (int i = 0; i < 100; ++i) {
    if (i % 3 == 0) {
      ASSERT_EQ(s.Sample(peaked, history).id, 0);
    }
    if (i % 5 == 0) history.push_back(7);  // a position sampled elsewhere
    const auto position = static_cast<int64_t>(history.size());
    const int32_t want = static_cast<int32_t>(3.0 * double(PositionDraw(11, position)));
    ASSERT_EQ(s.Sample(flat, history).id, want) << "round " << i;
    history.push_back(want);
  }
}

// Counts over `draws` samples must be within 3 sigma of draws * expected (binomial).
void ExpectFrequencies(Sampler& s, const std::vector<float>& logits,
                       const std::vector<double>& expected, int draws) {
  std::vector<int> counts(logits.size());
  // Each draw at its own position (ids outside the vocabulary: no penalty applies).
  std::vector<int32_t> history;
  for (int i = 0; i < draws; ++i) {
    ++counts[s.Sample(logits, history).id];
    history.push_back(-1);
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    const double mean = draws * expected[i];
    const double sigma = std::sqrt(draws * expected[i] * (1 - expected[i]));
    EXPECT_LE(std::abs(counts[i] - mean), 3 * sigma + 1e-9)
        << "token " << i << ": " << counts[i] << " vs " << mean << " +- " << sigma;
  }
}

TEST(Sampler, FrequenciesMatchSoftmaxOverTemperature) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -3.0f};
  for (float t : {0.7f, 1.0f, 1.6f}) {
    SCOPED_TRACE(t);
    SamplingParams p = NoFilters(t);
    p.seed = 99;
    Sampler s(p);
    ExpectFrequencies(s, logits, Softmax(logits, t), 20000);
  }
}

TEST(Sampler, FrequenciesAfterTopKAreRenormalized) {
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -0.5f, 2.0f, -3.0f};
  SamplingParams p = NoFilters(1.5f);
  p.top_k = 3;  // Keeps ids 4, 0, 1.
  p.seed = 7;
  Sampler s(p);
  std::vector<double> expected = Softmax({2.0f, 1.0f, 0.5f}, 1.5);
  ExpectFrequencies(s, logits, {expected[1], expected[2], 0, 0, expected[0], 0}, 20000);
}

TEST(Sampler, LogprobsAreLogSoftmaxOfRawLogits) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = 4.0f * std::cos(0.37f * float(i));
  std::vector<double> ref = Softmax(logits);
  SamplingParams p;  // llama.cpp defaults, plus penalties: none of it changes the logprobs.
  p.repetition_penalty = 1.3f;
  p.top_logprobs = 5;
  p.seed = 3;
  Sampler s(p);
  const std::vector<int32_t> history = {0, 17, 17, 500};
  for (int i = 0; i < 50; ++i) {
    SampleResult r = s.Sample(logits, history);
    ASSERT_GE(r.id, 0);
    EXPECT_NEAR(r.logprob, std::log(ref[r.id]), 1e-5);
    ASSERT_EQ(r.top.size(), 5u);
    std::vector<int32_t> order(logits.size());
    for (size_t j = 0; j < order.size(); ++j) order[j] = int32_t(j);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (size_t j = 0; j < r.top.size(); ++j) {
      EXPECT_EQ(r.top[j].id, order[j]);
      EXPECT_NEAR(r.top[j].logprob, std::log(ref[order[j]]), 1e-5);
      if (j > 0) {
        EXPECT_GE(r.top[j - 1].logprob, r.top[j].logprob);
      }
    }
  }
}

TEST(Sampler, TopLogprobsClampedAndTiesByLowerId) {
  SamplingParams p = NoFilters(0.0f);
  p.top_logprobs = 10;
  SampleResult r = Sampler(p).Sample(std::vector<float>{0.0f, 1.0f, 0.0f}, {});
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].id, 1);
  EXPECT_EQ(r.top[1].id, 0);
  EXPECT_EQ(r.top[2].id, 2);
  const double z = std::log(2.0 + std::exp(1.0));
  EXPECT_NEAR(r.top[0].logprob, 1.0 - z, 1e-6);
  EXPECT_NEAR(r.top[1].logprob, -z, 1e-6);
  EXPECT_NEAR(r.logprob, 1.0 - z, 1e-6);
}

TEST(Sampler, MaskedAndNanLogitsAreNeverDrawn) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {-inf, 0.0f, std::nanf(""), 0.0f, -inf};
  SamplingParams p = NoFilters(1.0f);
  p.seed = 5;
  Sampler s(p);
  std::vector<int32_t> history;
  for (int i = 0; i < 1000; ++i) {
    SampleResult r = s.Sample(logits, history);
    history.push_back(r.id);
    ASSERT_TRUE(r.id == 1 || r.id == 3) << r.id;
    ASSERT_NEAR(r.logprob, std::log(0.5), 1e-6);
  }
  EXPECT_EQ(s.Sample(std::vector<float>{}, {}).id, -1);
}

TEST(Sampler, LogitBiasAppliesBeforeEverythingAndLogprobsStayRaw) {
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 1.9f};
  SamplingParams p = NoFilters(0.0f);
  // -100 bans the argmax; +100 forces a token the model ranks last; out-of-vocab ids do nothing.
  p.logit_bias = {{1, -100.0f}, {7, 50.0f}};
  EXPECT_EQ(Sampler(p).Sample(logits, {}).id, 3);
  p.logit_bias = {{2, 100.0f}};
  SampleResult forced = Sampler(p).Sample(logits, {});
  EXPECT_EQ(forced.id, 2);
  // Reported under the model's own distribution, as without a bias.
  const SampleResult plain = Sampler(NoFilters(0.0f)).Sample(logits, {});
  double z = 0;
  for (float x : logits) z += std::exp(double(x));
  EXPECT_NEAR(forced.logprob, -1.0 - std::log(z), 1e-5);
  EXPECT_NEAR(plain.logprob, 2.0 - std::log(z), 1e-5);
  // A bias adds to the logit: +0.15 lifts token 3 (1.9) over token 1 (2.0), +0.05 does not.
  p.logit_bias = {{3, 0.15f}};
  EXPECT_EQ(Sampler(p).Sample(logits, {}).id, 3);
  p.logit_bias = {{3, 0.05f}};
  EXPECT_EQ(Sampler(p).Sample(logits, {}).id, 1);
}

TEST(ValidateSamplingParams, EveryFieldHasItsRange) {
  EXPECT_TRUE(ValidateSamplingParams(SamplingParams(), 100).ok());
  struct Case {
    void (*set)(SamplingParams&);
    const char* request_name;
    const char* flag;
  } cases[] = {
      {[](SamplingParams& p) { p.temperature = -0.1f; }, "field 'temperature'", "--temp"},
      {[](SamplingParams& p) { p.temperature = std::nanf(""); }, "field 'temperature'", "--temp"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "field 'top_p'", "--top-p"},
      {[](SamplingParams& p) { p.min_p = 1.5f; }, "field 'min_p'", "--min-p"},
      {[](SamplingParams& p) { p.top_k = -2; }, "field 'top_k'", "--top-k"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "field 'repetition_penalty'",
       "--repeat-penalty"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; }, "field 'presence_penalty'",
       "--presence-penalty"},
      {[](SamplingParams& p) { p.frequency_penalty = -std::numeric_limits<float>::infinity(); },
       "field 'frequency_penalty'", "--frequency-penalty"},
      {[](SamplingParams& p) { p.top_logprobs = 21; }, "field 'top_logprobs'", "top_logprobs"},
      {[](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }, "field 'logit_bias'",
       "logit_bias"},
      {[](SamplingParams& p) { p.logit_bias = {{1, -100.5f}}; }, "field 'logit_bias'",
       "logit_bias"},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.set(p);
    const absl::Status request = ValidateSamplingParams(p, 100);
    EXPECT_TRUE(absl::IsInvalidArgument(request)) << c.request_name;
    EXPECT_EQ(request.message().rfind(c.request_name, 0), 0u) << request;
    const absl::Status flag = ValidateSamplingParams(p, 100, SamplingFieldNames::kFlags);
    EXPECT_EQ(flag.message().rfind(c.flag, 0), 0u) << flag;
  }
  // Without a vocabulary size, ids are not checked (the CLI's defaults carry none anyway).
  SamplingParams p;
  p.logit_bias = {{123456, 1.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p, 0).ok());
}

// A constraint's mask: only allowed tokens are drawn, greedy or sampled (whatever the seed);
// logprobs stay those of the raw distribution.
TEST(Sampler, AMaskRestrictsTheDrawButNotTheLogprobs) {
  const std::vector<float> logits = {5.0f, 4.0f, 3.0f, 2.0f, 1.0f, 0.5f, 0.0f, -1.0f,
                                     -2.0f, -3.0f, -4.0f, -5.0f, 6.0f, 1.5f, 2.5f, 3.5f,
                                     0.1f, 0.2f, 0.3f, 0.4f, 0.6f, 0.7f, 0.8f, 0.9f,
                                     1.1f, 1.2f, 1.3f, 1.4f, 1.6f, 1.7f, 1.8f, 1.9f, 7.0f};
  // Allowed: tokens 2, 9 and 32 (the last, in the mask's second word).
  const std::vector<uint32_t> mask = {(1u << 2) | (1u << 9), 1u};
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.top_logprobs = 1;
  SampleResult r = Sampler(greedy).Sample(logits, {}, mask);
  EXPECT_EQ(r.id, 32);
  const std::vector<uint32_t> no_32 = {(1u << 2) | (1u << 9), 0u};
  r = Sampler(greedy).Sample(logits, {}, no_32);
  EXPECT_EQ(r.id, 2);
  // The raw distribution: the unmasked softmax.
  const SampleResult unmasked = Sampler(greedy).Sample(logits, {});
  EXPECT_EQ(unmasked.id, 32);
  ASSERT_EQ(r.top.size(), 1u);
  EXPECT_EQ(r.top[0].id, 32);
  EXPECT_FLOAT_EQ(r.top[0].logprob, unmasked.logprob);
  SamplingParams sampled;
  sampled.temperature = 1.5f;
  sampled.top_k = 0;
  sampled.top_p = 1;
  sampled.min_p = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    sampled.seed = seed;
    const int32_t id = Sampler(sampled).Sample(logits, {}, no_32).id;
    EXPECT_TRUE(id == 2 || id == 9) << "seed " << seed << ": " << id;
  }
}

// The chain spelled out stage by stage over a copy of the row: the reference the one-pass
// Filter (block by block, biases and penalties on their tokens only) must equal exactly.
std::vector<Candidate> ChainByStages(const SamplingParams& p, std::vector<float> work,
                                     const std::vector<int32_t>& history,
                                     const std::vector<uint32_t>& allowed) {
  for (size_t i = 0; i < work.size(); ++i) {
    if (std::isnan(work[i])) work[i] = -INFINITY;
    if (!allowed.empty() && ((allowed[i >> 5] >> (i & 31)) & 1u) == 0) work[i] = -INFINITY;
  }
  ApplyLogitBias(work, p.logit_bias);
  ApplyPenalties(work, history, p);
  if (p.temperature <= 0) {
    const auto best = std::max_element(work.begin(), work.end());  // the first of the largest
    return {{int32_t(best - work.begin()), *best}};
  }
  std::vector<Candidate> c = FromLogits(work);
  if (p.top_k > 0) {
    ApplyTopK(c, p.top_k);
    ApplyTopP(c, p.top_p);
  } else {
    ApplyTopK(c, 0);
    ApplyTopP(c, p.top_p);
  }
  ApplyMinP(c, p.min_p);
  for (Candidate& x : c) x.logit /= p.temperature;
  return c;
}

// Rows longer than the pass's block (4096), with peaks, ties across blocks, NaN, a mask,
// repeated biases and penalised history: greedy, top-k, top-p alone and min-p alone give the
// candidates the stages give, and Sample's logprobs are the raw log-softmax.
TEST(Sampler, OnePassEqualsTheStagesComposed) {
  const int n = 10000;
  std::vector<float> row(n);
  uint64_t state = 12345;
  for (float& x : row) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = float((state >> 40) % 2000) / 100.0f - 10.0f;  // many ties: a 0.01 grid
  }
  row[4095] = row[4096] = row[9999] = 14.0f;  // tied peaks in three blocks
  row[17] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int32_t> history;
  for (int i = 0; i < 300; ++i) history.push_back((i * 7919) % n);
  history.push_back(4096);
  history.push_back(4096);
  std::vector<uint32_t> mask((n + 31) / 32, 0xffffffffu);
  mask[4095 / 32] &= ~(1u << (4095 % 32));  // the first peak masked
  for (int i = 0; i < n; i += 3) mask[i / 32] &= ~(1u << (i % 32));

  std::vector<SamplingParams> chains;
  SamplingParams greedy = NoFilters(0.0f);
  greedy.repetition_penalty = 1.3f;
  greedy.frequency_penalty = 0.5f;
  greedy.logit_bias = {{5000, 3.0f}, {5000, 2.5f}, {123, -100.0f}, {n + 5, 1.0f}};
  chains.push_back(greedy);
  SamplingParams top_k = greedy;
  top_k.temperature = 0.7f;
  top_k.top_k = 40;
  top_k.top_p = 0.9f;
  top_k.min_p = 0.05f;
  top_k.presence_penalty = -0.4f;
  top_k.penalty_last_n = -1;
  chains.push_back(top_k);
  SamplingParams top_p = NoFilters(1.2f);
  top_p.top_p = 0.5f;
  top_p.logit_bias = greedy.logit_bias;
  chains.push_back(top_p);
  SamplingParams min_p = NoFilters(0.9f);
  min_p.min_p = 0.2f;
  chains.push_back(min_p);
  for (size_t c = 0; c < chains.size(); ++c) {
    for (const std::vector<uint32_t>& allowed : {std::vector<uint32_t>{}, mask}) {
      SCOPED_TRACE("chain " + std::to_string(c) + (allowed.empty() ? "" : ", masked"));
      Sampler sampler(chains[c]);
      const std::vector<Candidate> got = sampler.Candidates(row, history, allowed);
      const std::vector<Candidate> want = ChainByStages(chains[c], row, history, allowed);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].id, want[i].id) << i;
        EXPECT_EQ(got[i].logit, want[i].logit) << i;
      }
    }
  }
  SamplingParams logprobs = top_k;
  logprobs.top_logprobs = 5;
  const SampleResult r = Sampler(logprobs).Sample(row, history);
  double max = -INFINITY, sum = 0;
  for (float x : row) {
    if (!std::isnan(x)) max = std::max<double>(max, x);
  }
  for (float x : row) {
    if (!std::isnan(x)) sum += std::exp(double(x) - max);
  }
  const double log_z = max + std::log(sum);
  EXPECT_NEAR(r.logprob, row[r.id] - log_z, 1e-5);
  ASSERT_EQ(r.top.size(), 5u);
  EXPECT_THAT(std::vector<int32_t>({r.top[0].id, r.top[1].id, r.top[2].id}),
              ElementsAre(4095, 4096, 9999));  // the raw peaks, ties by lower id
  for (const TokenLogprob& t : r.top) EXPECT_NEAR(t.logprob, row[t.id] - log_z, 1e-5);
}

}  // namespace
}  // namespace fucina
