// Deterministic fuzz replay: thousands of structure-aware mutants of the seeds in
// tests/data/gguf/ through File::FromBytes. Each must either parse into a self-consistent file
// (tensors inside the buffer, aligned, non-overlapping, sizes matching shapes) or be rejected with
// InvalidArgument and a message naming the input. Run under -DFUCINA_SANITIZE=ON to also catch
// out-of-bounds reads. FUCINA_FUZZ_ITERS overrides the default 3000 mutants.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "models/gguf/gguf.h"
#include "tests/fuzz/gguf_mutator.h"

namespace fucina::gguf::fuzz {
namespace {

using ::testing::HasSubstr;

struct Seed {
  std::string name;
  std::vector<uint8_t> bytes;
};

std::vector<Seed> LoadSeeds() {
  std::vector<Seed> seeds;
  const std::filesystem::path dir = std::filesystem::path(FUCINA_TEST_DATA_DIR) / "gguf";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".gguf") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    seeds.push_back({entry.path().filename().string(),
                     std::vector<uint8_t>((std::istreambuf_iterator<char>(in)),
                                          std::istreambuf_iterator<char>())});
  }
  std::sort(seeds.begin(), seeds.end(),
            [](const Seed& a, const Seed& b) { return a.name < b.name; });
  return seeds;
}

int Iterations() {
  const char* env = std::getenv("FUCINA_FUZZ_ITERS");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 3000;
}

TEST(GgufFuzzReplay, SeedsParseAsExpected) {
  const std::vector<Seed> seeds = LoadSeeds();
  ASSERT_GE(seeds.size(), 2u) << "seeds missing from " << FUCINA_TEST_DATA_DIR << "/gguf";
  for (const Seed& s : seeds) {
    const Layout layout = ParseLayout(s.bytes);
    EXPECT_TRUE(layout.complete) << s.name;
    EXPECT_FALSE(layout.kvs.empty()) << s.name;
    EXPECT_FALSE(layout.tensor_infos.empty()) << s.name;
    auto f = File::FromBytes(s.bytes, s.name);
    if (s.name == "smollm2_header.gguf") {
      // Cut at the data offset on purpose: everything up to the tensor data is valid.
      ASSERT_FALSE(f.ok());
      EXPECT_THAT(std::string(f.status().message()), HasSubstr("token_embd.weight"));
      continue;
    }
    ASSERT_TRUE(f.ok()) << s.name << ": " << f.status();
    EXPECT_EQ(CheckParsedFile(**f, s.bytes.size()), "") << s.name;
  }
}

TEST(GgufFuzzReplay, MutatorIsDeterministic) {
  const std::vector<Seed> seeds = LoadSeeds();
  ASSERT_FALSE(seeds.empty());
  for (uint64_t k = 0; k < 50; ++k) {
    EXPECT_EQ(Mutate(seeds[0].bytes, k), Mutate(seeds[0].bytes, k));
  }
  int changed = 0;
  for (uint64_t k = 0; k < 50; ++k) changed += Mutate(seeds[0].bytes, k) != seeds[0].bytes;
  EXPECT_GT(changed, 40);
}

TEST(GgufFuzzReplay, MutantsParseOrFailCleanly) {
  const std::vector<Seed> seeds = LoadSeeds();
  ASSERT_FALSE(seeds.empty());
  const int iters = Iterations();
  int ok = 0, rejected = 0;
  for (int i = 0; i < iters; ++i) {
    const Seed& seed = seeds[i % seeds.size()];
    // Half the mutants are mutated again to reach states one mutation cannot.
    std::vector<uint8_t> mutant = Mutate(seed.bytes, 0x5EED0000ull + i);
    if (i % 2 == 1) mutant = Mutate(mutant, 0xA5A5A5A5ull * (i + 1));
    const std::string name = absl::StrCat("mutant-", i, "-of-", seed.name);
    auto f = File::FromBytes(mutant, name);
    if (f.ok()) {
      ++ok;
      const std::string problem = CheckParsedFile(**f, mutant.size());
      ASSERT_EQ(problem, "") << name;
    } else {
      ++rejected;
      ASSERT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << name << f.status();
      ASSERT_THAT(std::string(f.status().message()), HasSubstr(name));
    }
  }
  std::cout << "gguf fuzz replay: " << iters << " mutants of " << seeds.size() << " seeds, " << ok
            << " parsed OK, " << rejected << " rejected\n";
  RecordProperty("parsed_ok", ok);
  RecordProperty("rejected", rejected);
  // Both outcomes must occur, or the mutator has stopped exercising one side of the reader.
  EXPECT_GT(ok, iters / 100);
  EXPECT_GT(rejected, iters / 4);
}

}  // namespace
}  // namespace fucina::gguf::fuzz
