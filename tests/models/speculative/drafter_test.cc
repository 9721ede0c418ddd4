// The drafter's pieces against references written the slow way: the suffix automaton's match
// is the longest suffix of the stream found in the text (brute force over every start), and
// its first occurrence is the earliest; the drafter continues a repeat, a reference document,
// and token-recycled successors, and stops drafting when acceptance collapses; VerifyDrafts
// emits exactly the tokens plain sampling gives, position by position.
#include "models/speculative/drafter.h"

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "models/sampler/sampler.h"
#include "models/speculative/suffix_automaton.h"
#include "models/speculative/verify.h"

namespace fucina {
namespace {

// The longest suffix of `stream` occurring in `text`, and the end index of its first
// occurrence (-1 when empty).
std::pair<int64_t, int64_t> BruteMatch(const std::vector<int32_t>& text,
                                       const std::vector<int32_t>& stream) {
  for (int64_t len = std::min(text.size(), stream.size()); len > 0; --len) {
    for (int64_t end = len - 1; end < static_cast<int64_t>(text.size()); ++end) {
      bool same = true;
      for (int64_t i = 0; i < len && same; ++i) {
        same = text[end - len + 1 + i] == stream[stream.size() - len + i];
      }
      if (same) return {len, end};
    }
  }
  return {0, -1};
}

TEST(SuffixAutomatonTest, MatchesAreTheLongestSuffixAndItsFirstOccurrence) {
  std::mt19937 rng(7);
  for (int alphabet : {2, 3, 5}) {
    SuffixAutomaton sam;
    std::vector<int32_t> text, stream;
    SuffixAutomaton::Match match;
    for (int i = 0; i < 300; ++i) {
      // The text grows; a separate stream is matched against it as it grows too.
      const int32_t t = static_cast<int32_t>(rng() % alphabet);
      sam.Append(t);
      text.push_back(t);
      match = sam.Normalize(match);
      const int32_t s = static_cast<int32_t>(rng() % alphabet);
      match = sam.Step(match, s);
      stream.push_back(s);
      const auto [len, end] = BruteMatch(text, stream);
      ASSERT_EQ(match.length, len) << "alphabet " << alphabet << " step " << i;
      ASSERT_EQ(sam.FirstEnd(match), end) << "alphabet " << alphabet << " step " << i;
    }
  }
}

TEST(DrafterTest, ARepeatIsContinued) {
  Drafter d;
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9, 10, 11, 1, 2, 5, 6, 7};
  d.Accept(prompt);
  // "5 6 7" occurred before, followed by 8 9 10 ...
  EXPECT_EQ(d.Draft(3), (std::vector<int32_t>{8, 9, 10}));
  EXPECT_EQ(d.Draft(2), (std::vector<int32_t>{8, 9}));
  // A stream without a repeat drafts nothing (nothing recycled yet either).
  Drafter fresh;
  fresh.Accept(std::vector<int32_t>{1, 2, 3, 4});
  EXPECT_TRUE(fresh.Draft(4).empty());
}

TEST(DrafterTest, AReferenceDocumentIsContinued) {
  Drafter d;
  d.SetReference(std::vector<int32_t>{40, 41, 42, 43, 44, 45});
  d.Accept(std::vector<int32_t>{1, 2, 41, 42});
  EXPECT_EQ(d.Draft(3), (std::vector<int32_t>{43, 44, 45}));
  // The longer match wins: the stream's own repeat of 3 beats the reference's 1.
  Drafter both;
  both.SetReference(std::vector<int32_t>{9, 70});
  both.Accept(std::vector<int32_t>{7, 8, 9, 60, 7, 8, 9});
  EXPECT_EQ(both.Draft(1), (std::vector<int32_t>{60}));
}

TEST(DrafterTest, RecycledSuccessorsChainWhenNothingMatches) {
  Drafter d(DrafterOptions{.max_draft = 4, .successors = 2});
  // The model chose 4 after 3, then 9 after 3 (the latest first), and 12 after 9.
  d.Observe(3, 4);
  d.Observe(3, 9);
  d.Observe(9, 12);
  d.Accept(std::vector<int32_t>{1, 2, 3});
  EXPECT_EQ(d.Draft(4), (std::vector<int32_t>{9, 12}));  // nothing known after 12
}

TEST(DrafterTest, CollapsedAcceptanceDraftsOnlyAProbe) {
  Drafter d;
  d.Accept(std::vector<int32_t>{1, 2, 3, 1, 2, 3, 1, 2});
  ASSERT_FALSE(d.Draft(8).empty());
  for (int i = 0; i < 20; ++i) d.Record(8, 0);
  ASSERT_LT(d.acceptance(), Drafter::kCollapsed);
  int drafted = 0, probes = 0;
  for (int i = 0; i < 4 * Drafter::kProbeEvery; ++i) {
    const std::vector<int32_t> draft = d.Draft(8);
    drafted += static_cast<int>(draft.size());
    probes += !draft.empty();
  }
  EXPECT_EQ(probes, 4);
  EXPECT_EQ(drafted, 4);  // one token each
  // Acceptance recovers: drafts grow again.
  for (int i = 0; i < 20; ++i) d.Record(1, 1);
  EXPECT_GT(d.Draft(8).size(), 1u);
}

// Logits rows that prefer token (position * 3) % vocab, fuzzily.
std::vector<float> Rows(int rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> out(rows * vocab);
  for (int r = 0; r < rows; ++r) {
    for (int64_t v = 0; v < vocab; ++v) out[r * vocab + v] = noise(rng);
    out[r * vocab + (r * 3) % vocab] += 3.0f;
  }
  return out;
}

TEST(VerifyTest, EmitsWhatPlainSamplingGivesPositionByPosition) {
  constexpr int64_t kVocab = 12;
  constexpr int kRows = 6;
  for (float temperature : {0.0f, 0.7f, 1.5f}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      SamplingParams p;
      p.temperature = temperature;
      p.seed = seed;
      p.repetition_penalty = 1.3f;  // penalties see the drafts as history
      const std::vector<float> rows = Rows(kRows, kVocab, static_cast<uint32_t>(seed));
      // Plain decoding of the same rows: one sample per position, each fed back.
      std::vector<int32_t> history = {4, 5}, plain;
      Sampler plain_sampler(p);
      for (int r = 0; r < kRows; ++r) {
        const int32_t id = plain_sampler
                               .Sample(std::span<const float>(rows).subspan(r * kVocab, kVocab),
                                       history)
                               .id;
        plain.push_back(id);
        history.push_back(id);
      }
      // Drafts that agree for the first two positions, then one that cannot.
      std::vector<int32_t> drafts = {plain[0], plain[1],
                                     static_cast<int32_t>((plain[2] + 1) % kVocab), plain[3],
                                     plain[4]};
      // The pass's tokens: the history through the last emitted one (5), then the drafts.
      auto pass = [](std::vector<int32_t> d) {
        d.insert(d.begin(), {4, 5});
        return d;
      };
      Sampler sampler(p);
      const Verified v = *VerifyDrafts(sampler, rows, kVocab, pass(drafts), drafts.size());
      EXPECT_EQ(v.accepted, 2);
      EXPECT_EQ(v.tokens, (std::vector<int32_t>{plain[0], plain[1], plain[2]}));
      // Every draft right: all accepted plus the sample after the last.
      drafts = {plain.begin(), plain.begin() + kRows - 1};
      const Verified all = *VerifyDrafts(sampler, rows, kVocab, pass(drafts), drafts.size());
      EXPECT_EQ(all.accepted, kRows - 1);
      EXPECT_EQ(all.tokens, plain);
    }
  }
}

}  // namespace
}  // namespace fucina
