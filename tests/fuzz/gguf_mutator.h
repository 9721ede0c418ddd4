// Structure-aware GGUF mutator shared by the replay test and the libFuzzer harness.
//
// It locates the header counts, every KV's key length / type / string lengths / array element
// type and length, and every tensor info's name length / n_dims / dims / type / offset in a seed,
// then rewrites some of those fields with boundary values (0, 1, -1, 2^31, 2^63, off-by-one,
// other type ids...), duplicates entries (duplicate keys and names), corrupts names, and also
// flips random bytes and truncates. Everything is a deterministic function of the input bytes
// and a 64-bit seed.
#ifndef FUCINA_TESTS_FUZZ_GGUF_MUTATOR_H_
#define FUCINA_TESTS_FUZZ_GGUF_MUTATOR_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/gguf/gguf.h"

namespace fucina::gguf::fuzz {

enum class FieldKind {
  kVersion,
  kTensorCount,
  kKvCount,
  kKeyLength,
  kValueType,
  kStringLength,  // String values, array string items.
  kArrayType,
  kArrayLength,
  kScalar,        // Scalar value bytes (bools, general.alignment, ...).
  kNameLength,    // Tensor name length.
  kNDims,
  kDim,
  kTensorType,
  kTensorOffset,
  kNumKinds,
};

struct Field {
  FieldKind kind;
  size_t offset;  // Into the buffer.
  size_t width;   // 1, 2, 4 or 8 bytes.
};

// A byte range holding one whole KV entry or tensor info.
struct Range {
  size_t begin;
  size_t end;
};

struct Layout {
  std::vector<Field> fields;
  std::vector<Range> kvs;
  std::vector<Range> tensor_infos;
  std::vector<Range> names;  // Key and tensor-name bytes.
  size_t infos_end = 0;      // Where the last parsed tensor info ends.
  bool complete = false;     // Whole header, KV and tensor-info region parsed.
};

// Lenient: stops at the first structure that does not fit, keeping what it found.
Layout ParseLayout(std::span<const uint8_t> bytes);

// Applies 1-4 mutations to a copy of `input`; the result is at most max(input.size(), 64) +
// 4096 bytes (entry duplication grows it).
std::vector<uint8_t> Mutate(std::span<const uint8_t> input, uint64_t seed);

// libFuzzer's custom-mutator contract: mutates data[0, size) in place within max_size bytes and
// returns the new size.
size_t MutateInPlace(uint8_t* data, size_t size, size_t max_size, uint64_t seed);

// Checks a successfully parsed file against the invariants the reader promises for a
// `buffer_size`-byte input (tensors in bounds, aligned, non-overlapping, sizes matching shapes,
// unique names and keys) and reads every tensor byte and metadata value so sanitizers see any
// bad pointer. Empty if consistent, else a description of the first violation.
std::string CheckParsedFile(const File& file, uint64_t buffer_size);

}  // namespace fucina::gguf::fuzz

#endif  // FUCINA_TESTS_FUZZ_GGUF_MUTATOR_H_
