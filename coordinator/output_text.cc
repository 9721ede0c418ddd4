#include "coordinator/output_text.h"

#include <algorithm>

#include "coordinator/request.h"
#include "coordinator/text_hold.h"

namespace fucina {

OutputText::OutputText(const Tokenizer& tokenizer, const GenerateJob& job, int64_t max_tokens)
    : tokenizer_(tokenizer), job_(job), max_tokens_(max_tokens) {}

OutputText::Step OutputText::Push(int32_t id, bool complete) {
  ++tokens_;
  Step step;
  const bool stop_token =
      (!job_.ignore_eos && tokenizer_.IsEndOfGeneration(id)) ||
      std::find(job_.stop_token_ids.begin(), job_.stop_token_ids.end(), id) !=
          job_.stop_token_ids.end();
  if (stop_token) {
    step.finish_reason = "stop";  // the token itself is not text of the reply
  } else {
    held_ += ValidUtf8(utf8_.Push(tokenizer_.TokenToPiece(id)));
    if (complete) {
      step.finish_reason = "stop";
    } else if (tokens_ >= max_tokens_) {
      step.finish_reason = "length";
    }
  }
  if (!step.finish_reason.empty()) held_ += ValidUtf8(utf8_.Flush());
  // Stop strings: cut at the first occurrence; otherwise hold back the longest tail that could
  // still begin one.
  size_t cut = std::string::npos;
  for (const std::string& s : job_.stop) {
    if (s.empty()) continue;
    const size_t at = held_.find(s);
    if (at != std::string::npos && at < cut) {
      cut = at;
      step.stop_sequence = s;
    }
  }
  if (cut != std::string::npos) {
    step.text = held_.substr(0, cut);
    held_.clear();
    step.finish_reason = "stop";
  } else if (!step.finish_reason.empty()) {
    step.text = std::move(held_);
    held_.clear();
  } else {
    size_t keep = 0;
    for (const std::string& s : job_.stop) keep = std::max(keep, PartialPrefixAtEnd(held_, s));
    step.text = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
  }
  return step;
}

}  // namespace fucina
