// C ABI of the grammar engine in llguidance_capi/src/lib.rs (a Rust staticlib over
// llguidance). Only grammar.cc includes this; everything else uses fucina::GrammarVocab and
// fucina::GrammarMatcher.
//
// Conventions: functions return 0 on success, non-zero on failure with a message in *err (a
// char* the caller releases with fucina_grammar_free). Masks are one bit per token: bit
// (i % 32) of word i / 32. A vocab is immutable and may be used from several threads; a
// matcher by one thread at a time.
#ifndef FUCINA_MODELS_GRAMMAR_GRAMMAR_CAPI_H_
#define FUCINA_MODELS_GRAMMAR_GRAMMAR_CAPI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FucinaGrammarVocab FucinaGrammarVocab;
typedef struct FucinaGrammarMatcher FucinaGrammarMatcher;

// Token i's bytes are data[offsets[i], offsets[i + 1]) (n_vocab + 1 offsets); special[i] != 0
// marks a control token.
int fucina_grammar_vocab_new(const uint8_t* data, const uint64_t* offsets, const uint8_t* special,
                             uint32_t n_vocab, uint32_t eos, FucinaGrammarVocab** out,
                             char** err);
void fucina_grammar_vocab_free(FucinaGrammarVocab* vocab);

// kind: "json_schema", "regex" or "lark".
int fucina_grammar_matcher_new(const FucinaGrammarVocab* vocab, const char* kind,
                               const char* text, FucinaGrammarMatcher** out, char** err);
FucinaGrammarMatcher* fucina_grammar_matcher_clone(const FucinaGrammarMatcher* m);
void fucina_grammar_matcher_free(FucinaGrammarMatcher* m);
// n_words = ceil(n_vocab / 32).
int fucina_grammar_matcher_mask(FucinaGrammarMatcher* m, uint32_t* mask, size_t n_words,
                                char** err);
int fucina_grammar_matcher_consume(FucinaGrammarMatcher* m, const uint32_t* tokens, size_t n,
                                   char** err);
int fucina_grammar_matcher_validate(FucinaGrammarMatcher* m, const uint32_t* tokens, size_t n,
                                    size_t* accepted, char** err);
int fucina_grammar_matcher_is_stopped(const FucinaGrammarMatcher* m);
int fucina_grammar_matcher_is_accepting(FucinaGrammarMatcher* m);
void fucina_grammar_free(char* s);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // FUCINA_MODELS_GRAMMAR_GRAMMAR_CAPI_H_
