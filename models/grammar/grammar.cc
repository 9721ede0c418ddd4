#include "models/grammar/grammar.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "models/grammar/grammar_capi.h"

namespace fucina {
namespace {

// Takes ownership of an error string from the C ABI. The engine appends a dump of its state
// (the tokens so far, counters, the grammar) after "\n<state>", or "\n<non-verbose/>" where
// it keeps it to itself: kept out of messages a client sees, and the rest bounded.
std::string TakeError(char* err) {
  std::string msg = err != nullptr ? err : "unknown error";
  fucina_grammar_free(err);
  for (const char* tail : {"\n<state>", "\n<non-verbose/>"}) {
    if (const size_t at = msg.find(tail); at != std::string::npos) msg.resize(at);
  }
  constexpr size_t kMaxMessage = 2000;
  if (msg.size() > kMaxMessage) msg = msg.substr(0, kMaxMessage) + "...";
  return msg;
}

// Grammars compile on a few long-lived threads with a large stack: llguidance recurses once per
// rule or $ref link in places, and a deep grammar overflowed the 8 MB default and took the
// process with it. The limits in llguidance_capi keep the depth far below this; the stack is
// reserved address space, touched only as deep as a compile goes.
constexpr size_t kCompileStackBytes = size_t{256} << 20;

// A compile cannot be cancelled once started: one refused at its deadline runs on to its end. So
// compiles are counted from submission until they finish (abandoned ones included) and new
// ones are refused while kMaxInFlight are queued or running, rather than each refusal leaving a
// thread and its memory behind.
class CompilePool {
 public:
  struct Task {
    std::function<void()> run;
  };

  static CompilePool& Get() {
    static CompilePool* const pool = new CompilePool();  // never destroyed: its threads live on
    return *pool;
  }

  // Queues `task`; false when the pool is full or no thread can be started.
  bool TrySubmit(std::shared_ptr<Task> task) {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_ >= max_in_flight_) return false;
    if (idle_ == 0 && threads_ < max_threads_ && StartThread()) ++threads_;
    if (threads_ == 0) return false;
    ++in_flight_;
    queue_.push_back(std::move(task));
    cv_.notify_one();
    return true;
  }

  // Takes back a task that has not started (it will not run); false once it has.
  bool Withdraw(const std::shared_ptr<Task>& task) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = std::find(queue_.begin(), queue_.end(), task);
    if (it == queue_.end()) return false;
    queue_.erase(it);
    --in_flight_;
    return true;
  }

  int in_flight() {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }
  int max_in_flight() const { return max_in_flight_; }

 private:
  CompilePool() {
    // At least two threads, so that one slow compile does not hold up every other one.
    max_threads_ = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);
    max_in_flight_ = 4 * max_threads_;
  }

  // Under mu_.
  bool StartThread() {
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0) return false;
    pthread_t thread;
    const bool ok = pthread_attr_setstacksize(&attr, kCompileStackBytes) == 0 &&
                    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
                    pthread_create(&thread, &attr, &CompilePool::ThreadMain, this) == 0;
    pthread_attr_destroy(&attr);
    return ok;
  }

  static void* ThreadMain(void* self) {
    static_cast<CompilePool*>(self)->Loop();
    return nullptr;
  }

  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return !queue_.empty(); });
      --idle_;
      std::shared_ptr<Task> task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task->run();
      task.reset();
      lock.lock();
      --in_flight_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  int in_flight_ = 0, threads_ = 0, idle_ = 0;
  int max_threads_ = 2, max_in_flight_ = 8;
};

// What a client reads when the engine gives up mid-reply (its per-token limits, e.g. a lexer
// grown past max_lexer_states, or a parser row past max_items_in_row): the engine's reason on
// one line, without its own prefixes.
std::string MidReplyError(std::string engine, const std::string& where = "past this point") {
  if (const size_t nl = engine.find('\n'); nl != std::string::npos) engine.resize(nl);
  for (std::string_view prefix : {"lexer error: ", "parser error: ", "Parser Error: "}) {
    if (engine.starts_with(prefix)) engine.erase(0, prefix.size());
  }
  constexpr size_t kMaxReason = 200;
  if (engine.size() > kMaxReason) engine = engine.substr(0, kMaxReason) + "...";
  return absl::StrCat("the reply could not be held to its grammar ", where, " (", engine, ")");
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

int GrammarCompilesInFlight() { return CompilePool::Get().in_flight(); }
int MaxGrammarCompilesInFlight() { return CompilePool::Get().max_in_flight(); }

GrammarVocab::~GrammarVocab() { fucina_grammar_vocab_free(vocab_); }

absl::StatusOr<std::unique_ptr<GrammarMatcher>> GrammarVocab::Compile(
    const GrammarSpec& spec, std::chrono::milliseconds limit) const {
  if (spec.empty()) return absl::InvalidArgumentError("grammar: no grammar given");
  // No time at all: refused before starting (waiting zero would accept a compile that happened
  // to finish before this thread looked, so the answer would depend on scheduling).
  if (limit.count() <= 0) return CompileTimeout(spec, limit);
  // The compile runs on the pool so that a grammar too expensive to compile is refused at
  // `limit`; its thread finishes it and frees what it made.
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
  auto task = std::make_shared<CompilePool::Task>();
  task->run = [shared, self, kind = std::string(GrammarKindName(spec.kind)), text = spec.text] {
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
  };
  CompilePool& pool = CompilePool::Get();
  if (!pool.TrySubmit(task)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "grammar: ", pool.max_in_flight(),
        " grammars are compiling already (the most at once); try again shortly"));
  }
  {
    std::unique_lock<std::mutex> lock(shared->mu);
    if (!shared->cv.wait_for(lock, limit, [&] { return shared->done; })) {
      shared->abandoned = true;
      lock.unlock();
      // Not started yet (every thread busy with other grammars): it never will, and this
      // grammar is not the one to blame.
      if (pool.Withdraw(task)) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "grammar: no compile thread came free within ", limit.count(),
            " ms (other grammars are compiling); try again shortly"));
      }
      return CompileTimeout(spec, limit);
    }
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
    return absl::InternalError(MidReplyError(TakeError(err)));
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
        MidReplyError(TakeError(err), absl::StrCat("at token ", token)));
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
    return absl::InternalError(MidReplyError(TakeError(err)));
  }
  return accepted;
}

bool GrammarMatcher::stopped() const { return fucina_grammar_matcher_is_stopped(m_) != 0; }

std::unique_ptr<GrammarMatcher> GrammarMatcher::Clone() const {
  return std::unique_ptr<GrammarMatcher>(
      new GrammarMatcher(vocab_, fucina_grammar_matcher_clone(m_)));
}

}  // namespace fucina
