// The tokenizer of a GGUF fixture written for the purpose and removed again. By default a
// random-weight fixture's byte-level vocabulary; `write` may write another (e.g. one with
// Qwen3's real tokenizer).
#ifndef FUCINA_TESTS_COORDINATOR_FIXTURE_TOKENIZER_H_
#define FUCINA_TESTS_COORDINATOR_FIXTURE_TOKENIZER_H_

#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"
#include "models/engine/fixture.h"
#include "models/gguf/gguf.h"
#include "models/tokenizer/tokenizer.h"

namespace fucina {

inline absl::StatusOr<std::unique_ptr<Tokenizer>> FixtureTokenizer(
    const std::string& tag,
    const std::function<absl::Status(const std::string& path)>& write = nullptr) {
  const std::string path =
      testing::TempDir() + "/" + tag + "_" + std::to_string(getpid()) + ".gguf";
  absl::Status made;
  if (write) {
    made = write(path);
  } else {
    ThreadPool pool(1);
    made = MakeFixture(FixtureOptions(), path, pool);
  }
  if (!made.ok()) return made;
  auto file = gguf::File::Open(path);
  std::remove(path.c_str());  // the mapping keeps what the tokenizer reads
  if (!file.ok()) return file.status();
  return Tokenizer::FromGguf(**file);
}

}  // namespace fucina

#endif  // FUCINA_TESTS_COORDINATOR_FIXTURE_TOKENIZER_H_
