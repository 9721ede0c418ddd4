//! C ABI over llguidance for constrained decoding: a grammar (JSON schema, regex or Lark)
//! becomes a per-step mask over the vocabulary, and sampled tokens advance it.
//!
//! A `FucinaGrammarVocab` is the model's token table (the bytes of each token; control tokens
//! marked so no grammar ever produces them) with llguidance's token trie and parser factory.
//! It is built once per model, is immutable, and may be shared by threads. A
//! `FucinaGrammarMatcher` is one request's grammar state; it is used by one thread at a time.
//!
//! Ownership: every `char*` handed out (error messages) is allocated here and released with
//! `fucina_grammar_free`. No pointer passed in is retained after a call returns. Panics never
//! cross the ABI: they are caught and reported as errors.

use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;

mod checks;

pub struct FucinaGrammarVocab {
    factory: ParserFactory,
    n_vocab: usize,
}

pub struct FucinaGrammarMatcher {
    matcher: Matcher,
    n_vocab: usize,
}

fn set_err(err: *mut *mut c_char, msg: &str) {
    if err.is_null() {
        return;
    }
    let clean: String = msg.chars().map(|c| if c == '\0' { ' ' } else { c }).collect();
    unsafe { *err = CString::new(clean).unwrap_or_default().into_raw() };
}

/// Runs `f`, turning an Err or a panic into a non-zero return with a message in *err.
fn guard(err: *mut *mut c_char, f: impl FnOnce() -> Result<(), String>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(msg)) => {
            set_err(err, &msg);
            1
        }
        Err(_) => {
            set_err(err, "internal error in the grammar engine (a panic was caught)");
            2
        }
    }
}

unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, String> {
    if p.is_null() {
        return Err(format!("{what} is null"));
    }
    CStr::from_ptr(p).to_str().map_err(|_| format!("{what} is not UTF-8"))
}

/// The token table: token i's bytes are data[offsets[i]..offsets[i+1]]; special[i] != 0 marks
/// a control token (<|im_end|>, ...), which the trie keeps apart from text. `eos` is the token
/// a grammar allows once it may end.
#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_vocab_new(
    data: *const u8,
    offsets: *const u64,
    special: *const u8,
    n_vocab: u32,
    eos: u32,
    out: *mut *mut FucinaGrammarVocab,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        if out.is_null() || offsets.is_null() || special.is_null() || n_vocab == 0 {
            return Err("null argument or empty vocabulary".into());
        }
        if eos >= n_vocab {
            return Err(format!("eos token {eos} outside the vocabulary of {n_vocab}"));
        }
        let n = n_vocab as usize;
        let offsets = std::slice::from_raw_parts(offsets, n + 1);
        let special = std::slice::from_raw_parts(special, n);
        let total = offsets[n] as usize;
        let data: &[u8] = if total == 0 { &[] } else { std::slice::from_raw_parts(data, total) };
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(n);
        for i in 0..n {
            let (a, b) = (offsets[i] as usize, offsets[i + 1] as usize);
            if a > b || b > total {
                return Err(format!("token {i}: offsets out of order"));
            }
            let bytes = &data[a..b];
            if special[i] != 0 || bytes.is_empty() {
                // Control tokens (and tokens with no text) as the trie names specials.
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(if bytes.is_empty() {
                    format!("[{i}]").into_bytes()
                } else {
                    bytes.to_vec()
                }.as_slice());
                words.push(w);
            } else {
                words.push(bytes.to_vec());
            }
        }
        let info = TokRxInfo::new(n_vocab, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        *factory.limits_mut() = parser_limits();
        *out = Box::into_raw(Box::new(FucinaGrammarVocab { factory, n_vocab: n }));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_vocab_free(vocab: *mut FucinaGrammarVocab) {
    if !vocab.is_null() {
        drop(Box::from_raw(vocab));
    }
}

/// The engine's limits. A compile cannot be cancelled once started, so these (with the checks
/// in checks.rs, made before it starts) are what bounds its time and memory; the per-token limits
/// bound each mask. Measured on one core: a grammar at the limits compiles in well under a second.
fn parser_limits() -> ParserLimits {
    ParserLimits {
        // Symbols in the grammar's productions (the default 500k is "a few megabytes of JSON";
        // the largest real schemas llguidance knows of need ~200k).
        max_grammar_size: 250_000,
        // Regex AST nodes built for the initial lexer, ~50k a millisecond.
        initial_lexer_fuel: 1_000_000,
        // No dump of the parser state (the tokens so far, the grammar) in error messages: they
        // reach clients.
        verbose_errors: false,
        ..ParserLimits::default()
    }
}

/// A matcher for `text` read as `kind`: "json_schema" (a JSON Schema document), "regex" or
/// "lark". The text is first held to the limits in checks.rs (a message naming the limit), and
/// JSON gets fixed whitespace unless its schema's "x-guidance" says otherwise. Errors carry
/// llguidance's own message.
#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_matcher_new(
    vocab: *const FucinaGrammarVocab,
    kind: *const c_char,
    text: *const c_char,
    out: *mut *mut FucinaGrammarMatcher,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        if vocab.is_null() || out.is_null() {
            return Err("null argument".into());
        }
        let vocab = &*vocab;
        let kind = str_arg(kind, "grammar kind")?;
        let text = str_arg(text, "grammar")?;
        checks::check_size(text)?;
        let grammar = match kind {
            "json_schema" => {
                let mut schema: Value = serde_json::from_str(text)
                    .map_err(|e| format!("the JSON schema is not valid JSON: {e}"))?;
                checks::check_schema(&schema)?;
                checks::default_json_whitespace(&mut schema);
                TopLevelGrammar::from_json_schema(schema)
            }
            "regex" => TopLevelGrammar::from_regex(text),
            "lark" => TopLevelGrammar::from_lark(checks::check_lark(text)?),
            _ => return Err(format!("unknown grammar kind '{kind}'")),
        };
        let parser = vocab.factory.create_parser(grammar);
        let matcher = Matcher::new(parser);
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        *out = Box::into_raw(Box::new(FucinaGrammarMatcher { matcher, n_vocab: vocab.n_vocab }));
        Ok(())
    })
}

/// A copy in the same state (to try drafts without touching the original).
#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_matcher_clone(
    m: *const FucinaGrammarMatcher,
) -> *mut FucinaGrammarMatcher {
    if m.is_null() {
        return std::ptr::null_mut();
    }
    let m = &*m;
    Box::into_raw(Box::new(FucinaGrammarMatcher {
        matcher: m.matcher.deep_clone(),
        n_vocab: m.n_vocab,
    }))
}

#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_matcher_free(m: *mut FucinaGrammarMatcher) {
    if !m.is_null() {
        drop(Box::from_raw(m));
    }
}

/// The tokens allowed next: bit (i % 32) of mask[i / 32] is set when token i is. `n_words` must
/// be ceil(n_vocab / 32). Once the grammar has stopped only the eos token is allowed.
#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_matcher_mask(
    m: *mut FucinaGrammarMatcher,
    mask: *mut u32,
    n_words: usize,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        if m.is_null() || mask.is_null() {
            return Err("null argument".into());
        }
        let m = &mut *m;
        if n_words != m.n_vocab.div_ceil(32) {
            return Err(format!("mask of {n_words} words for a vocabulary of {}", m.n_vocab));
        }
        let vob = m.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        let out = std::slice::from_raw_parts_mut(mask, n_words);
        out.fill(0);
        let words = vob.as_slice();
        let k = words.len().min(n_words);
        out[..k].copy_from_slice(&words[..k]);
        // The trie may size its vector past n_vocab; nothing beyond it is a token.
        if m.n_vocab % 32 != 0 {
            out[n_words - 1] &= (1u32 << (m.n_vocab % 32)) - 1;
        }
        Ok(())
    })
}

/// Advances the grammar by `n` tokens (an error if one is not allowed; the matcher is then
/// unusable).
#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_matcher_consume(
    m: *mut FucinaGrammarMatcher,
    tokens: *const u32,
    n: usize,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        if m.is_null() || (tokens.is_null() && n > 0) {
            return Err("null argument".into());
        }
        let tokens = if n == 0 { &[][..] } else { std::slice::from_raw_parts(tokens, n) };
        (*m).matcher.consume_tokens(tokens).map_err(|e| e.to_string())
    })
}

/// How many of tokens[0..n) the grammar accepts in order from the current state, without
/// advancing it (speculative drafts).
#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_matcher_validate(
    m: *mut FucinaGrammarMatcher,
    tokens: *const u32,
    n: usize,
    accepted: *mut usize,
    err: *mut *mut c_char,
) -> i32 {
    guard(err, || {
        if m.is_null() || accepted.is_null() || (tokens.is_null() && n > 0) {
            return Err("null argument".into());
        }
        let tokens = if n == 0 { &[][..] } else { std::slice::from_raw_parts(tokens, n) };
        *accepted = (*m).matcher.validate_tokens(tokens).map_err(|e| e.to_string())?;
        Ok(())
    })
}

/// 1 once the grammar is complete and nothing more can follow (the reply ends), else 0.
#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_matcher_is_stopped(m: *const FucinaGrammarMatcher) -> i32 {
    if m.is_null() {
        return 1;
    }
    i32::from((*m).matcher.is_stopped())
}

/// 1 when the grammar may end here (the eos token is allowed), else 0.
#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_matcher_is_accepting(m: *mut FucinaGrammarMatcher) -> i32 {
    if m.is_null() {
        return 0;
    }
    i32::from((*m).matcher.is_accepting().unwrap_or(false))
}

#[no_mangle]
pub unsafe extern "C" fn fucina_grammar_free(s: *mut c_char) {
    if !s.is_null() {
        drop(CString::from_raw(s));
    }
}
