#include "models/engine/session.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "models/speculative/verify.h"

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
  std::unique_ptr<Drafter> drafter;
  if (options.speculative) {
    drafter = std::make_unique<Drafter>(options.drafter);
    drafter->SetReference(options.spec_reference);
    drafter->Accept(cached_);
  }
  const int64_t vocab = model_.config().vocab_size;
  Utf8Stream utf8;
  result.finish_reason = "length";
  // `logits` holds the rows of the last pass: over [t, drafts...] (t: the last token emitted,
  // or the prompt's last), so row i predicts the token after drafts[i - 1].
  std::vector<int32_t> drafts;
  bool done = false;
  while (!done) {
    const int64_t fed = kv_->len();  // the pass's tokens sit at [fed - drafts - 1, fed)
    const int32_t first = cached_[cached_.size() - drafts.size() - 1];  // t
    absl::StatusOr<Verified> verified =
        VerifyDrafts(sampler, *logits, vocab, cached_, drafts.size(), options.constraint);
    if (!verified.ok()) {
      // The cache holds the pass: keep it consistent with what is known.
      cached_.resize(kv_->len());
      return verified.status();
    }
    Verified& v = *verified;
    if (!drafts.empty()) {
      ++result.draft_passes;
      result.draft_tokens += static_cast<int64_t>(drafts.size());
      result.accepted_tokens += v.accepted;
      if (result.accepted_per_position.size() < drafts.size()) {
        result.accepted_per_position.resize(drafts.size());
      }
      for (int i = 0; i < v.accepted; ++i) ++result.accepted_per_position[i];
      drafter->Record(static_cast<int>(drafts.size()), v.accepted);
    }
    // Emit in order until a stop; `emitted` tokens of this pass reach the output.
    size_t emitted = 0;
    for (size_t k = 0; k < v.tokens.size() && !done; ++k) {
      const int32_t id = v.tokens[k];
      result.tokens.push_back(id);
      result.samples.push_back(std::move(v.samples[k]));
      ++emitted;
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
        done = true;
      } else if (on_token && !on_token(id, text)) {
        result.finish_reason = "stop";
        done = true;
      } else if (static_cast<int64_t>(result.tokens.size()) == options.max_tokens) {
        done = true;
      }
    }
    if (v.stopped && !done) {
      result.finish_reason = "stop";  // the grammar is complete
      done = true;
    }
    // The cache keeps the pass's first token and the drafts that were emitted but the last
    // emitted token: plain decoding has fed exactly those.
    const int64_t keep = fed - static_cast<int64_t>(drafts.size()) + emitted - 1;
    if (absl::Status s = kv_->Truncate(keep); !s.ok()) return s;
    cached_.resize(keep);
    if (done) break;
    const int32_t next = result.tokens.back();
    if (drafter != nullptr) {
      drafter->Emitted(first, std::span<const int32_t>(result.tokens).last(emitted));
      // Drafts past max_tokens could never be emitted.
      const int64_t room = options.max_tokens - static_cast<int64_t>(result.tokens.size()) - 1;
      drafts = drafter->Draft(static_cast<int>(std::min<int64_t>(room, options.drafter.max_draft)));
      if (options.constraint != nullptr && !drafts.empty()) {
        // Drafts the grammar refuses (it has accepted `next` already) could never be
        // accepted: not worth a row.
        absl::StatusOr<size_t> ok = options.constraint->Validate(drafts);
        if (!ok.ok()) return ok.status();
        drafts.resize(*ok);
      }
    }
    std::vector<int32_t> step = {next};
    step.insert(step.end(), drafts.begin(), drafts.end());
    logits = drafts.empty() ? model_.ForwardStep(*kv_, step, kv_->len())
                            : model_.ForwardStepAllLogits(*kv_, step, kv_->len());
    if (!logits.ok()) {
      cached_.resize(kv_->len());
      return logits.status();
    }
    ++result.forward_passes;
    cached_.insert(cached_.end(), step.begin(), step.end());
  }
  const std::string rest = utf8.Flush();
  result.text += rest;
  if (on_token && !rest.empty()) on_token(-1, rest);
  result.decode_seconds = SecondsSince(t1);
  return result;
}

}  // namespace fucina
