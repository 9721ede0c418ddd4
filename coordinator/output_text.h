// What a request's client is shown of its generated tokens: the scheduler's output stage.
// Text is released at UTF-8 character boundaries (the bytes of a broken character become
// U+FFFD), a stop string is never shown (the longest tail that could still begin one is held
// back until the next tokens decide), and the reply ends on an end-of-generation token, a stop
// token id, a stop string or the token budget. No workers, no threads: one per request, fed one
// sampled token at a time.
#ifndef FUCINA_COORDINATOR_OUTPUT_TEXT_H_
#define FUCINA_COORDINATOR_OUTPUT_TEXT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "models/tokenizer/tokenizer.h"

namespace fucina {

struct GenerateJob;

class OutputText {
 public:
  // Borrows `tokenizer` and `job`, which outlive it. `max_tokens`: the reply's budget (the
  // job's, capped by the context left).
  OutputText(const Tokenizer& tokenizer, const GenerateJob& job, int64_t max_tokens);

  struct Step {
    std::string text;           // what may be shown now (possibly empty)
    std::string finish_reason;  // "stop" | "length" when the reply ends with this token
    std::string stop_sequence;  // the stop string that ended it, if one did
  };
  // The next sampled token; `complete`: the reply's grammar is complete with it (it ends with
  // "stop"). After a step with a finish reason, nothing more is pushed.
  Step Push(int32_t id, bool complete = false);

  int64_t tokens() const { return tokens_; }
  int64_t max_tokens() const { return max_tokens_; }

 private:
  const Tokenizer& tokenizer_;
  const GenerateJob& job_;
  int64_t max_tokens_;
  int64_t tokens_ = 0;
  Utf8Stream utf8_;
  std::string held_;  // decoded text not yet shown (may start a stop string)
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_OUTPUT_TEXT_H_
