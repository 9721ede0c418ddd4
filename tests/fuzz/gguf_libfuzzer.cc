// libFuzzer harness for the GGUF reader (built with -DFUCINA_FUZZ=ON and clang):
//   gguf_libfuzzer -max_total_time=60 corpus/ tests/data/gguf/
// Inputs parse or fail cleanly; a parsed file violating the reader's invariants traps.
// The custom mutator is the structure-aware one shared with the replay test.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>

#include "models/gguf/gguf.h"
#include "tests/fuzz/gguf_mutator.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = fucina::gguf::File::FromBytes(std::span<const uint8_t>(data, size), "fuzz-input");
  if (f.ok()) {
    const std::string problem = fucina::gguf::fuzz::CheckParsedFile(**f, size);
    if (!problem.empty()) {
      std::fprintf(stderr, "invariant violated: %s\n", problem.c_str());
      std::abort();
    }
  } else if (f.status().message().empty()) {
    std::fprintf(stderr, "error without a message\n");
    std::abort();
  }
  return 0;
}

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  // Mostly structure-aware; sometimes libFuzzer's own byte-level mutations.
  if (seed % 8 == 0) return LLVMFuzzerMutate(data, size, max_size);
  return fucina::gguf::fuzz::MutateInPlace(data, size, max_size, seed);
}
