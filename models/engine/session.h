// One conversation stream on a whole model: prefix-reusing prefill, sampling, stop tokens,
// text emitted at UTF-8 character boundaries.
//
// The session remembers which tokens its KV cache holds; a new request reuses the longest
// common prefix and prefills only the rest (multi-turn chat re-sends the whole conversation).
// Not thread-safe: one request at a time.
#ifndef FUCINA_MODELS_ENGINE_SESSION_H_
#define FUCINA_MODELS_ENGINE_SESSION_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "models/engine/model.h"
#include "models/sampler/sampler.h"
#include "models/speculative/drafter.h"
#include "models/tokenizer/tokenizer.h"

namespace fucina {

struct GenerationOptions {
  int64_t max_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> stop_tokens;  // in addition to the vocabulary's end-of-generation ids
  bool ignore_eos = false;           // keep going past end-of-generation tokens (benchmarks)
  int64_t prefill_chunk = 512;       // prompt tokens per forward call (bounds scratch memory)
  // Speculative decoding without a draft model (models/speculative/): tokens proposed by the
  // drafter are checked by one forward pass over all of them; the output is exactly the tokens
  // plain decoding gives (greedy or seeded), only fewer passes.
  bool speculative = false;
  std::vector<int32_t> spec_reference;  // a document the output may copy from (tokens)
  DrafterOptions drafter;
  // Constrained decoding (a GrammarMatcher, models/grammar; null: none), owned by the caller:
  // every token is sampled among those it allows, drafts it refuses are cut before the pass,
  // and the reply ends ("stop") once it is complete.
  TokenConstraint* constraint = nullptr;
};

struct GenerationResult {
  std::vector<int32_t> tokens;   // generated ids, the stop token included
  std::vector<SampleResult> samples;  // one per generated token (logprobs)
  std::string text;              // decoded generated text (a stop token's text excluded)
  std::string finish_reason;     // "stop" (end-of-generation or stop token) or "length"
  int64_t prompt_tokens = 0;
  int64_t reused_tokens = 0;     // prompt tokens served from the cache
  double prefill_seconds = 0;
  double decode_seconds = 0;
  // Speculative decoding: verify passes that carried drafts, the drafts, the accepted ones,
  // and accepted_per_position[i]: passes whose draft i was accepted.
  int64_t draft_passes = 0, draft_tokens = 0, accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;
  int64_t forward_passes = 0;  // decode passes (one per token without speculation)
};

// Called with each generated token and the text it completes (possibly empty while a UTF-8
// character is incomplete). Return false to stop (finish_reason "stop").
using TokenCallback = std::function<bool(int32_t id, std::string_view text)>;

class Session {
 public:
  // `model` (a whole model) and `tokenizer` must outlive the session.
  Session(Model& model, const Tokenizer& tokenizer, std::unique_ptr<KvCache> kv);

  // Continues `prompt` (the whole token sequence of the conversation so far). Errors: empty
  // prompt, prompt + max_tokens beyond the cache's capacity (names both), bad token ids.
  absl::StatusOr<GenerationResult> Generate(std::span<const int32_t> prompt,
                                            const GenerationOptions& options,
                                            const TokenCallback& on_token = nullptr);

  // Tokens whose K/V rows the cache holds (prompt + generated so far).
  const std::vector<int32_t>& cached_tokens() const { return cached_; }
  KvCache& kv() { return *kv_; }
  void Reset();

 private:
  Model& model_;
  const Tokenizer& tokenizer_;
  std::unique_ptr<KvCache> kv_;
  std::vector<int32_t> cached_;
};

}  // namespace fucina

#endif  // FUCINA_MODELS_ENGINE_SESSION_H_
