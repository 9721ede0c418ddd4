// Text that may not be shown yet: the tail of generated text that could still become a stop
// string or a tag, held back until the next tokens decide.
#ifndef FUCINA_COORDINATOR_TEXT_HOLD_H_
#define FUCINA_COORDINATOR_TEXT_HOLD_H_

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace fucina {

// Length of the longest suffix of `text` that is a proper prefix of `tag` (0 for an empty tag).
inline size_t PartialPrefixAtEnd(std::string_view text, std::string_view tag) {
  if (tag.empty()) return 0;
  for (size_t k = std::min(text.size(), tag.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_TEXT_HOLD_H_
