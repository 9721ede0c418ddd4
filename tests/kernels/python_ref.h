// Test helper: runs the independent Python references next to this file (ggml's own numpy
// implementation from PyPI `gguf`) with the interpreter named by $FUCINA_PYTHON.
#ifndef FUCINA_TESTS_KERNELS_PYTHON_REF_H_
#define FUCINA_TESTS_KERNELS_PYTHON_REF_H_

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fucina::testing_ref {

inline const char* Python() { return std::getenv("FUCINA_PYTHON"); }

#define FUCINA_SKIP_WITHOUT_PYTHON()                                                      \
  if (::fucina::testing_ref::Python() == nullptr)                                         \
  GTEST_SKIP() << "FUCINA_PYTHON is unset: set it to a python with numpy and gguf "       \
                  "(scripts/test.sh does) to compare against ggml's numpy reference"

// tests/kernels/<script>: a sibling of FUCINA_TEST_DATA_DIR, built textually because the data
// folder need not exist.
inline std::string ScriptPath(const std::string& script) {
  const std::string data_dir = FUCINA_TEST_DATA_DIR;
  return data_dir.substr(0, data_dir.rfind('/')) + "/kernels/" + script;
}

// Runs `script TYPE IN OUT` on `input` and returns OUT's bytes; empty (with a gtest failure)
// if the script fails.
inline std::vector<uint8_t> RunScript(const std::string& script, const std::string& type,
                                      const void* input, size_t bytes) {
  static int counter = 0;
  const std::string in = ::testing::TempDir() + "fucina_ref_" + std::to_string(::getpid()) +
                         "_" + std::to_string(counter++) + ".bin";
  const std::string out = in + ".out";
  {
    std::ofstream f(in, std::ios::binary);
    f.write(static_cast<const char*>(input), static_cast<std::streamsize>(bytes));
    if (!f.good()) {
      ADD_FAILURE() << "cannot write " << in;
      return {};
    }
  }
  const std::string cmd = std::string("'") + Python() + "' '" + ScriptPath(script) + "' " +
                          type + " '" + in + "' '" + out + "'";
  const int rc = std::system(cmd.c_str());
  std::vector<uint8_t> result;
  if (rc != 0) {
    ADD_FAILURE() << "reference script failed (" << rc << "): " << cmd;
  } else {
    std::ifstream f(out, std::ios::binary);
    result.assign(std::istreambuf_iterator<char>(f), {});
  }
  std::remove(in.c_str());
  std::remove(out.c_str());
  return result;
}

// RunScript on the bytes of `input`'s elements.
template <typename T>
std::vector<uint8_t> RunScript(const std::string& script, const std::string& type,
                               const std::vector<T>& input) {
  return RunScript(script, type, input.data(), input.size() * sizeof(T));
}

// ggml's numpy dequantizer on raw blocks of `type` ("Q4_K", "F16", ...).
inline std::vector<float> Dequantize(const std::string& type, const void* blocks, size_t bytes) {
  const std::vector<uint8_t> raw = RunScript("gguf_dequant_ref.py", type, blocks, bytes);
  std::vector<float> values(raw.size() / sizeof(float));
  if (!raw.empty()) std::memcpy(values.data(), raw.data(), values.size() * sizeof(float));
  return values;
}

}  // namespace fucina::testing_ref

#endif  // FUCINA_TESTS_KERNELS_PYTHON_REF_H_
