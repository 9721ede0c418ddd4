// A regular expression a client sends (a rule reward, the tensors of a full-mode job), held to
// what a server can afford: RE2's linear-time engine (no backtracking, so no pattern can pin a
// thread), a bounded length and a bounded compiled size, compiled before any work is queued.
//
// Syntax: RE2's (https://github.com/google/re2/wiki/Syntax), which covers the ECMAScript
// patterns these fields used to take except lookaround and backreferences; those are refused
// with an error naming the construct.
#ifndef FUCINA_MODELS_TRAIN_PATTERN_H_
#define FUCINA_MODELS_TRAIN_PATTERN_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace re2 {
class RE2;
}

namespace fucina::train {

// The longest pattern accepted, in bytes.
inline constexpr size_t kMaxPatternBytes = 4096;
// What one compiled pattern may hold (RE2's max_mem; a larger program is refused).
inline constexpr int64_t kMaxPatternMemory = 8 << 20;

class Pattern {
 public:
  // `field` names the request field in errors ("rule", "tensors"). INVALID_ARGUMENT for an
  // empty or over-long pattern, a construct RE2 does not have (naming it), any other syntax
  // error (RE2's message), or a pattern whose program would exceed kMaxPatternMemory.
  static absl::StatusOr<Pattern> Compile(std::string_view pattern, std::string_view field);

  // The whole of `text` matches.
  bool FullMatch(std::string_view text) const;
  // Some part of `text` matches.
  bool Search(std::string_view text) const;
  const std::string& pattern() const;

 private:
  explicit Pattern(std::shared_ptr<const re2::RE2> re) : re_(std::move(re)) {}
  std::shared_ptr<const re2::RE2> re_;  // immutable, so copies share it across threads
};

}  // namespace fucina::train

#endif  // FUCINA_MODELS_TRAIN_PATTERN_H_
