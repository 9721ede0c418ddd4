#include "models/engine/session.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Session::Session(Model& model, const Tokenizer& tokenizer, std::unique_ptr<KvCache> kv)
    : model_(model), tokenizer_(tokenizer), kv_(std::move(kv)) {}

void Session::Reset() {
  kv_->Clear();
  cached_.clear();
}

absl::StatusOr<GenerationResult> Session::Generate(std::span<const int32_t> prompt,
                                                   const GenerationOptions& options,
                                                   const TokenCallback& on_token) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (n + options.max_tokens > kv_->capacity()) {
    return absl::OutOfRangeError(absl::StrCat("prompt of ", n, " tokens + ", options.max_tokens,
                                              " new tokens exceeds the context of ",
                                              kv_->capacity(), " (--ctx)"));
  }
  GenerationResult result;
  result.prompt_tokens = n;

  // Longest common prefix with the cache; at least the last prompt token is recomputed so its
  // logits exist.
  int64_t reuse = 0;
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(cached_.size()), n - 1);
  while (reuse < limit && cached_[reuse] == prompt[reuse]) ++reuse;
  // A sliding-window ring rolls back only so far (kv_cache.h): past that, start over.
  if (!kv_->Truncate(std::min<int64_t>(reuse, kv_->len())).ok()) kv_->Clear();
  cached_.resize(kv_->len());
  result.reused_tokens = kv_->len();

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<float>> logits;
  for (int64_t pos = kv_->len(); pos < n;) {
    const int64_t count = std::min(options.prefill_chunk, n - pos);
    logits = model_.ForwardStep(*kv_, prompt.subspan(pos, count), pos);
    if (!logits.ok()) {
      // Keep the cache consistent with what we know it holds.
      cached_.assign(prompt.begin(), prompt.begin() + kv_->len());
      return logits.status();
    }
    cached_.insert(cached_.end(), prompt.begin() + pos, prompt.begin() + pos + count);
    pos += count;
  }
  result.prefill_seconds = SecondsSince(t0);

  const auto t1 = std::chrono::steady_clock::now();
  Sampler sampler(options.sampling);
  Utf8Stream utf8;
  result.finish_reason = "length";
  for (int64_t i = 0; i < options.max_tokens; ++i) {
    SampleResult sample = sampler.Sample(*logits, cached_);
    const int32_t id = sample.id;
    result.tokens.push_back(id);
    result.samples.push_back(std::move(sample));
    const bool stop = (!options.ignore_eos && tokenizer_.IsEndOfGeneration(id)) ||
                      std::find(options.stop_tokens.begin(), options.stop_tokens.end(), id) !=
                          options.stop_tokens.end();
    std::string text;
    if (!stop) {
      text = utf8.Push(tokenizer_.TokenToPiece(id));
      result.text += text;
    }
    if (stop) {
      result.finish_reason = "stop";
      if (on_token) on_token(id, "");
      break;
    }
    if (on_token && !on_token(id, text)) {
      result.finish_reason = "stop";
      break;
    }
    if (i + 1 == options.max_tokens) break;
    const int32_t step[] = {id};
    logits = model_.ForwardStep(*kv_, step, kv_->len());
    if (!logits.ok()) return logits.status();
    cached_.push_back(id);
  }
  const std::string rest = utf8.Flush();
  result.text += rest;
  if (on_token && !rest.empty()) on_token(-1, rest);
  result.decode_seconds = SecondsSince(t1);
  return result;
}

}  // namespace fucina
