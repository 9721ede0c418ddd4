#include "models/grammar/grammar.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "models/grammar/grammar_capi.h"

namespace fucina {
namespace {

// Takes ownership of an error string from the C ABI. The engine appends a dump of its state
// (the tokens so far, counters, the grammar) after "\n<state>": kept out of messages a client
// sees, and the rest bounded.
std::string TakeError(char* err) {
  std::string msg = err != nullptr ? err : "unknown error";
  fucina_grammar_free(err);
  if (const size_t at = msg.find("\n<state>"); at != std::string::npos) msg.resize(at);
  constexpr size_t kMaxMessage = 2000;
  if (msg.size() > kMaxMessage) msg = msg.substr(0, kMaxMessage) + "...";
  return msg;
}

absl::Status CompileTimeout(const GrammarSpec& spec, std::chrono::milliseconds limit) {
  return absl::DeadlineExceededError(absl::StrCat(
      "the ", GrammarKindName(spec.kind), " grammar took longer than ", limit.count(),
      " ms to compile (a grammar this expensive is refused)"));
}

}  // namespace

const char* GrammarKindName(GrammarSpec::Kind kind) {
  switch (kind) {
    case GrammarSpec::Kind::kJsonSchema: return "json_schema";
    case GrammarSpec::Kind::kRegex: return "regex";
    case GrammarSpec::Kind::kLark: return "lark";
    case GrammarSpec::Kind::kNone: break;
  }
  return "";
}

std::optional<GrammarSpec::Kind> GrammarKindFromName(std::string_view name) {
  for (GrammarSpec::Kind kind : {GrammarSpec::Kind::kJsonSchema, GrammarSpec::Kind::kRegex,
                                 GrammarSpec::Kind::kLark}) {
    if (name == GrammarKindName(kind)) return kind;
  }
  return std::nullopt;
}

absl::StatusOr<std::shared_ptr<const GrammarVocab>> GrammarVocab::Create(
    const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  if (n <= 0) return absl::InvalidArgumentError("grammar: the tokenizer has no tokens");
  const std::vector<int32_t>& eog = tokenizer.end_of_generation_ids();
  const std::optional<int32_t> eos = tokenizer.eos_id();
  if (!eos.has_value() && eog.empty()) {
    return absl::FailedPreconditionError(
        "grammar: the tokenizer has no end-of-generation token, so no reply could end");
  }
  std::string data;
  std::vector<uint64_t> offsets = {0};
  std::vector<uint8_t> special(n);
  offsets.reserve(n + 1);
  for (int32_t i = 0; i < n; ++i) {
    const uint32_t attrs = tokenizer.TokenAttributes(i);
    const bool control =
        (attrs & (kTokenAttrControl | kTokenAttrUnknown | kTokenAttrUnused)) != 0;
    const std::string piece = tokenizer.TokenToPiece(i);
    special[i] = control || piece.empty();
    data += piece;
    offsets.push_back(data.size());
  }
  std::shared_ptr<GrammarVocab> v(new GrammarVocab());
  v->vocab_size_ = n;
  v->eos_ = eos.value_or(eog.front());
  for (int32_t id : eog) {
    if (id != v->eos_) v->end_ids_.push_back(id);
  }
  char* err = nullptr;
  if (fucina_grammar_vocab_new(reinterpret_cast<const uint8_t*>(data.data()), offsets.data(),
                               special.data(), static_cast<uint32_t>(n),
                               static_cast<uint32_t>(v->eos_), &v->vocab_, &err) != 0) {
    return absl::InternalError(absl::StrCat("grammar: token table: ", TakeError(err)));
  }
  return std::shared_ptr<const GrammarVocab>(std::move(v));
}

GrammarVocab::~GrammarVocab() { fucina_grammar_vocab_free(vocab_); }

absl::StatusOr<std::unique_ptr<GrammarMatcher>> GrammarVocab::Compile(
    const GrammarSpec& spec, std::chrono::milliseconds limit) const {
  if (spec.empty()) return absl::InvalidArgumentError("grammar: no grammar given");
  // No time at all: refused before starting (waiting zero would accept a compile that happened
  // to finish before this thread looked, so the answer would depend on scheduling).
  if (limit.count() <= 0) return CompileTimeout(spec, limit);
  // The compile runs on a thread of its own so that a grammar too expensive to compile is
  // refused at `limit`; that thread finishes on its own and frees what it made.
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, abandoned = false;
    int rc = 0;
    FucinaGrammarMatcher* matcher = nullptr;
    char* err = nullptr;
  };
  auto shared = std::make_shared<Shared>();
  auto self = shared_from_this();
  std::thread([shared, self, kind = std::string(GrammarKindName(spec.kind)), text = spec.text] {
    FucinaGrammarMatcher* m = nullptr;
    char* err = nullptr;
    const int rc = fucina_grammar_matcher_new(self->vocab_, kind.c_str(), text.c_str(), &m, &err);
    std::lock_guard<std::mutex> lock(shared->mu);
    if (shared->abandoned) {
      fucina_grammar_matcher_free(m);
      fucina_grammar_free(err);
      return;
    }
    shared->done = true;
    shared->rc = rc;
    shared->matcher = m;
    shared->err = err;
    shared->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mu);
  if (!shared->cv.wait_for(lock, limit, [&] { return shared->done; })) {
    shared->abandoned = true;
    return CompileTimeout(spec, limit);
  }
  if (shared->rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", GrammarKindName(spec.kind), ": ", TakeError(shared->err)));
  }
  return std::unique_ptr<GrammarMatcher>(new GrammarMatcher(self, shared->matcher));
}

GrammarMatcher::~GrammarMatcher() { fucina_grammar_matcher_free(m_); }

uint32_t GrammarMatcher::EngineToken(int32_t token) const {
  for (int32_t id : vocab_->end_ids_) {
    if (id == token) return static_cast<uint32_t>(vocab_->eos_);
  }
  return static_cast<uint32_t>(token);
}

absl::Status GrammarMatcher::Mask(std::vector<uint32_t>* mask) {
  mask->assign(vocab_->mask_words(), 0);
  char* err = nullptr;
  if (fucina_grammar_matcher_mask(m_, mask->data(), mask->size(), &err) != 0) {
    return absl::InternalError(absl::StrCat("grammar mask: ", TakeError(err)));
  }
  if (MaskAllows(*mask, vocab_->eos_)) {
    for (int32_t id : vocab_->end_ids_) (*mask)[id >> 5] |= 1u << (id & 31);
  }
  return absl::OkStatus();
}

absl::Status GrammarMatcher::Accept(int32_t token) {
  if (token < 0 || token >= vocab_->vocab_size_) {
    return absl::InvalidArgumentError(absl::StrCat("grammar: token ", token, " is outside the vocabulary"));
  }
  const uint32_t t = EngineToken(token);
  char* err = nullptr;
  if (fucina_grammar_matcher_consume(m_, &t, 1, &err) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("grammar: token ", token, " is not allowed here: ", TakeError(err)));
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> GrammarMatcher::Validate(std::span<const int32_t> tokens) {
  std::vector<uint32_t> t;
  t.reserve(tokens.size());
  for (int32_t id : tokens) {
    if (id < 0 || id >= vocab_->vocab_size_) break;
    t.push_back(EngineToken(id));
  }
  size_t accepted = 0;
  char* err = nullptr;
  if (fucina_grammar_matcher_validate(m_, t.data(), t.size(), &accepted, &err) != 0) {
    return absl::InternalError(absl::StrCat("grammar: ", TakeError(err)));
  }
  return accepted;
}

bool GrammarMatcher::stopped() const { return fucina_grammar_matcher_is_stopped(m_) != 0; }

std::unique_ptr<GrammarMatcher> GrammarMatcher::Clone() const {
  return std::unique_ptr<GrammarMatcher>(
      new GrammarMatcher(vocab_, fucina_grammar_matcher_clone(m_)));
}

}  // namespace fucina
