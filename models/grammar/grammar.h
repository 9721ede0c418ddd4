// Constrained decoding: a reply held to a JSON schema, a regular expression or a Lark grammar.
//
// The grammar engine is llguidance (Rust, behind grammar_capi.h). GrammarVocab is the model's
// token table as the engine sees it: every token's bytes, control tokens kept apart so no
// grammar produces them, built once per model. A GrammarMatcher is one reply's grammar state:
// before each sampled token it gives the mask of allowed tokens (the sampler draws among those
// only), and the sampled token advances it. Once the grammar is complete and nothing more may
// follow, the matcher is stopped: the reply ends there ("stop").
//
// End of generation: the engine allows the vocabulary's EOS once the grammar may end; every
// other end-of-generation id (<|im_end|>, <|eot_id|>, ...) is allowed exactly when EOS is, so
// the chat's own turn end closes a reply.
#ifndef FUCINA_MODELS_GRAMMAR_GRAMMAR_H_
#define FUCINA_MODELS_GRAMMAR_GRAMMAR_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/sampler/sampler.h"
#include "models/tokenizer/tokenizer.h"

struct FucinaGrammarVocab;
struct FucinaGrammarMatcher;

namespace fucina {

// What a request holds its reply to.
struct GrammarSpec {
  enum class Kind { kNone, kJsonSchema, kRegex, kLark };
  Kind kind = Kind::kNone;
  std::string text;  // the schema (JSON text), the regex or the Lark grammar

  bool empty() const { return kind == Kind::kNone; }
  static GrammarSpec JsonSchema(std::string schema) { return {Kind::kJsonSchema, std::move(schema)}; }
  static GrammarSpec Regex(std::string re) { return {Kind::kRegex, std::move(re)}; }
  static GrammarSpec Lark(std::string grammar) { return {Kind::kLark, std::move(grammar)}; }
  // Any JSON object (OpenAI's response_format json_object).
  static GrammarSpec JsonObject() { return JsonSchema(R"({"type":"object"})"); }
};

// "json_schema", "regex", "lark" ("" for kNone): the names the wire and the flags use.
const char* GrammarKindName(GrammarSpec::Kind kind);
// The kind GrammarKindName names; nullopt for any other name (kNone included).
std::optional<GrammarSpec::Kind> GrammarKindFromName(std::string_view name);

// The longest a grammar may take to compile by default before it is refused.
inline constexpr std::chrono::milliseconds kDefaultGrammarCompileLimit{2000};

class GrammarMatcher;

// Compiles run on a small pool of threads shared by the process. Those queued or running now,
// ones past their deadline included (a compile cannot be stopped once started), and the most
// there may be before Compile refuses more.
int GrammarCompilesInFlight();
int MaxGrammarCompilesInFlight();

class GrammarVocab : public std::enable_shared_from_this<GrammarVocab> {
 public:
  // The token table of `tokenizer` (bytes of every token; control, unknown and unused tokens
  // and tokens without text marked special). Takes ~100 ms for a 150k vocabulary.
  static absl::StatusOr<std::shared_ptr<const GrammarVocab>> Create(const Tokenizer& tokenizer);
  ~GrammarVocab();

  // A matcher at the start of `spec`'s grammar. INVALID_ARGUMENT with the engine's own message
  // for a grammar or schema it rejects, or naming the limit one is past (grammar bytes, Lark
  // rules and literals, $ref chain depth: see llguidance_capi/src/checks.rs); DEADLINE_EXCEEDED
  // when compiling takes longer than `limit` (a grammar too expensive to serve; the compile
  // finishes on its pool thread and is dropped), and at once when `limit` is not positive;
  // RESOURCE_EXHAUSTED while MaxGrammarCompilesInFlight() compiles are queued or running in
  // this process, or when no pool thread took this one up within `limit` (the caller may retry
  // later).
  absl::StatusOr<std::unique_ptr<GrammarMatcher>> Compile(
      const GrammarSpec& spec,
      std::chrono::milliseconds limit = kDefaultGrammarCompileLimit) const;

  int32_t vocab_size() const { return vocab_size_; }
  size_t mask_words() const { return (static_cast<size_t>(vocab_size_) + 31) / 32; }

 private:
  GrammarVocab() = default;
  FucinaGrammarVocab* vocab_ = nullptr;
  int32_t vocab_size_ = 0;
  int32_t eos_ = 0;
  std::vector<int32_t> end_ids_;  // every end-of-generation id but eos_
  friend class GrammarMatcher;
};

class GrammarMatcher : public TokenConstraint {
 public:
  ~GrammarMatcher() override;
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  // The tokens allowed next, one bit per token (mask_words() words). Only end-of-generation
  // tokens once stopped.
  absl::Status Mask(std::vector<uint32_t>* mask) override;
  // Advances by the sampled `token` (an end-of-generation id counts as EOS). FAILED_PRECONDITION
  // when the grammar does not allow it.
  absl::Status Accept(int32_t token) override;
  // How many of `tokens` the grammar accepts in order from here, without advancing.
  absl::StatusOr<size_t> Validate(std::span<const int32_t> tokens) override;
  // The grammar is complete and nothing may follow: the reply ends.
  bool stopped() const override;
  // A copy in the same state.
  std::unique_ptr<GrammarMatcher> Clone() const;

 private:
  GrammarMatcher(std::shared_ptr<const GrammarVocab> vocab, FucinaGrammarMatcher* m)
      : vocab_(std::move(vocab)), m_(m) {}
  uint32_t EngineToken(int32_t token) const;

  std::shared_ptr<const GrammarVocab> vocab_;
  FucinaGrammarMatcher* m_;
  friend class GrammarVocab;
};

inline bool MaskAllows(std::span<const uint32_t> mask, int32_t token) {
  return (mask[static_cast<size_t>(token) >> 5] >> (token & 31)) & 1u;
}

}  // namespace fucina

#endif  // FUCINA_MODELS_GRAMMAR_GRAMMAR_H_
