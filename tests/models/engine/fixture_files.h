// Fixture files a parameterized engine test suite writes once (SetUpTestSuite) and removes at
// its end, one per named variant.
#ifndef FUCINA_TESTS_MODELS_ENGINE_FIXTURE_FILES_H_
#define FUCINA_TESTS_MODELS_ENGINE_FIXTURE_FILES_H_

#include <unistd.h>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/thread_pool.h"
#include "models/engine/fixture.h"
#include "models/engine/model.h"

namespace fucina {

struct FixtureVariant {
  const char* name;
  FixtureOptions options;
};

// <test temp dir>/<prefix>_<pid>_<name>.gguf: parallel test processes do not collide.
inline std::string FixtureTempPath(const std::string& prefix, const std::string& name) {
  return testing::TempDir() + "/" + prefix + "_" + std::to_string(getpid()) + "_" + name +
         ".gguf";
}

// Writes every variant; `paths` gets their files in order. Fails the calling test on error.
inline void MakeFixtureFiles(const std::string& prefix,
                             const std::vector<FixtureVariant>& variants, ThreadPool& pool,
                             std::vector<std::string>* paths) {
  for (const FixtureVariant& v : variants) {
    const std::string path = FixtureTempPath(prefix, v.name);
    const absl::Status made = MakeFixture(v.options, path, pool);
    ASSERT_TRUE(made.ok()) << v.name << ": " << made;
    paths->push_back(path);
  }
}

// A 2-layer Qwen3 shape with a byte vocabulary, weights large enough (init_std 0.1) that the
// branches move the residual, so perturbations and adapters inside them change the output.
inline FixtureOptions SmallQwen3Fixture(uint64_t seed) {
  FixtureOptions o;
  o.arch = "qwen3";
  o.num_layers = 2;
  o.hidden = 32;
  o.ffn = 64;
  o.num_heads = 2;
  o.num_heads_kv = 1;
  o.head_dim = 16;
  o.init_std = 0.1;
  o.seed = seed;
  return o;
}

// The logits of every position of `prompt` (at most 16 tokens) on a fresh f32 cache of `m`;
// empty (with a test failure) on an error.
inline std::vector<float> PromptLogits(Model& m, std::span<const int32_t> prompt) {
  auto kv = m.NewKvCache(16, GgmlType::kF32);
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return {};
  auto logits = m.ForwardStepAllLogits(**kv, prompt, 0);
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>{};
}

inline void RemoveFixtureFiles(std::vector<std::string>* paths) {
  for (const std::string& p : *paths) std::remove(p.c_str());
  paths->clear();
}

}  // namespace fucina

#endif  // FUCINA_TESTS_MODELS_ENGINE_FIXTURE_FILES_H_
