// libFuzzer harness for the HTTP request path (see http_fuzz_target.h). docs/testing.md says how
// to build and run it; the committed corpus is tests/data/http/.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/http_fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string err = fucina::FuzzHttpRequest(data, size);
  if (!err.empty()) {
    std::fprintf(stderr, "invariant broken: %s\n", err.c_str());
    std::abort();
  }
  return 0;
}
