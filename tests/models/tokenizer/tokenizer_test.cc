// Self-contained tests of the tokenizer pieces on small synthetic vocabularies (the parity test
// compares whole vocabularies with llama.cpp). Expected values follow from the regex and
// algorithm definitions written out in each test, not from running the code.
#include "models/tokenizer/tokenizer.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/gguf/gguf.h"
#include "models/gguf/writer.h"
#include "models/tokenizer/bpe.h"
#include "models/tokenizer/pretokenize.h"
#include "models/tokenizer/unicode.h"

namespace fucina {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;

TEST(Unicode, ClassesOfKnownCodepoints) {
  EXPECT_EQ(CodepointFlags('a'), kCpLetter);
  EXPECT_EQ(CodepointFlags('7'), kCpNumber);
  EXPECT_EQ(CodepointFlags(' '), kCpSeparator | kCpWhitespace);
  EXPECT_EQ(CodepointFlags('\n'), kCpControl | kCpWhitespace);
  EXPECT_EQ(CodepointFlags('$'), kCpSymbol);
  EXPECT_EQ(CodepointFlags('_'), kCpPunctuation);
  EXPECT_EQ(CodepointFlags(0x00E9), kCpLetter);                    // é
  EXPECT_EQ(CodepointFlags(0x0301), kCpMark);                      // combining acute
  EXPECT_EQ(CodepointFlags(0x0660), kCpNumber);                    // Arabic-Indic zero
  EXPECT_EQ(CodepointFlags(0x3000), kCpSeparator | kCpWhitespace);  // ideographic space
  EXPECT_EQ(CodepointFlags(0x0085), kCpControl | kCpWhitespace);
  EXPECT_EQ(CodepointFlags(0x4E2D), kCpLetter);    // 中
  EXPECT_EQ(CodepointFlags(0x1F600), kCpSymbol);   // 😀 (outside the BMP table)
  EXPECT_EQ(CodepointFlags(0x20000), kCpLetter);   // CJK extension B
  EXPECT_EQ(CodepointFlags(0xE000), kCpControl);   // private use
  EXPECT_EQ(CodepointFlags(0x0378), kCpUndefined);
  EXPECT_EQ(CodepointFlags(0x10FFFF), kCpUndefined);
  EXPECT_EQ(CodepointFlags(0x110000), 0);
  EXPECT_STRNE(UnicodeTablesVersion(), "");
}

TEST(Unicode, LenientDecodingReplacesEachBadByte) {
  EXPECT_THAT(DecodeUtf8Lenient("a\xff"
                                "b"),
              ElementsAre('a', kReplacementChar, 'b'));
  // A truncated 3-byte sequence: the lead byte and the lone continuation byte each fail.
  EXPECT_THAT(DecodeUtf8Lenient("\xe2\x82"), ElementsAre(kReplacementChar, kReplacementChar));
  EXPECT_THAT(DecodeUtf8Lenient("\xe2\x82\xac"), ElementsAre(0x20AC));
  EXPECT_THAT(DecodeUtf8Lenient("\xf0\x9f\x98\x80"), ElementsAre(0x1F600));
  // Overlong forms are decoded, not rejected (as llama.cpp does).
  EXPECT_THAT(DecodeUtf8Lenient("\xc0\x80"), ElementsAre(0));
  std::string s;
  for (uint32_t cp : {0x24u, 0xA2u, 0x20ACu, 0x10348u}) AppendUtf8(cp, &s);
  EXPECT_EQ(s, "$\xc2\xa2\xe2\x82\xac\xf0\x90\x8d\x88");
}

TEST(Unicode, ByteLevelMapIsABijection) {
  EXPECT_EQ(ByteToUnicodeUtf8(' '), "\xc4\xa0");   // Ġ
  EXPECT_EQ(ByteToUnicodeUtf8('\n'), "\xc4\x8a");  // Ċ
  EXPECT_EQ(ByteToUnicodeUtf8('A'), "A");
  for (int b = 0; b < 256; ++b) {
    const std::vector<uint32_t> cps = DecodeUtf8Lenient(ByteToUnicodeUtf8(b));
    ASSERT_EQ(cps.size(), 1u);
    EXPECT_EQ(UnicodeToByte(cps[0]), b);
  }
  EXPECT_EQ(UnicodeToByte(0x4E2D), -1);
}

TEST(PreTokenize, Gpt2Regex) {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  EXPECT_THAT(PreTokenize(PreTokenizer::kGpt2, "I'm  here 42x!!\n"),
              ElementsAre("I", "'m", " ", " here", " 42", "x", "!!", "\n"));
  // Contractions are case-sensitive here.
  EXPECT_THAT(PreTokenize(PreTokenizer::kGpt2, "IT'S"), ElementsAre("IT", "'", "S"));
}

TEST(PreTokenize, Llama3AndQwen2Regexes) {
  // \p{N}{1,3} vs \p{N}; case-insensitive contractions; \s*[\r\n]+; [^\r\n\p{L}\p{N}]?\p{L}+.
  EXPECT_THAT(PreTokenize(PreTokenizer::kLlama3, "12345 IT'S\n\n  x"),
              ElementsAre("123", "45", " IT", "'S", "\n\n", " ", " x"));
  EXPECT_THAT(PreTokenize(PreTokenizer::kQwen2, "123 (a)"),
              ElementsAre("1", "2", "3", " (", "a", ")"));
  // Qwen3.5 keeps combining marks in letter runs.
  EXPECT_THAT(PreTokenize(PreTokenizer::kQwen2, "e\xcc\x81x"), ElementsAre("e", "\xcc\x81x"));
  EXPECT_THAT(PreTokenize(PreTokenizer::kQwen35, "e\xcc\x81x"), ElementsAre("e\xcc\x81x"));
}

TEST(PreTokenize, StagedRegexes) {
  // Starcoder: \p{N} first, so a space before digits is left alone.
  EXPECT_THAT(PreTokenize(PreTokenizer::kStarcoder, "ab 12"), ElementsAre("ab", " ", "1", "2"));
  // Default: punctuation runs, GPT-2, \p{N}+, then [0-9]{3} inside number runs.
  EXPECT_THAT(PreTokenize(PreTokenizer::kDefault, "x+=1234567;"),
              ElementsAre("x", "+=", "123", "456", "7", ";"));
  // Gemma 4: [^\n]+|[\n]+ only.
  EXPECT_THAT(PreTokenize(PreTokenizer::kNewlines, "a b\r\n\nc\n"),
              ElementsAre("a b\r", "\n\n", "c", "\n"));
}

TEST(PreTokenize, WordsConcatenateToTheText) {
  const std::string text = "  Mixed\t\ttext: 3.14, ÀÉ 中文 😀👍🏽\r\n\r\n  end  ";
  for (PreTokenizer k : {PreTokenizer::kDefault, PreTokenizer::kGpt2, PreTokenizer::kLlama3,
                         PreTokenizer::kQwen2, PreTokenizer::kQwen35, PreTokenizer::kStarcoder,
                         PreTokenizer::kFalcon, PreTokenizer::kNewlines}) {
    std::string joined;
    for (const std::string& w : PreTokenize(k, text)) {
      EXPECT_FALSE(w.empty());
      joined += w;
    }
    EXPECT_EQ(joined, text);
  }
}

TEST(Bpe, MergesByRankThenLeftmost) {
  BpeMerges m;
  m.Add("b c", 0);
  m.Add("a b", 1);
  m.Add("a bc", 2);
  m.Add("b c", 5);  // Duplicate: keeps rank 0.
  EXPECT_EQ(m.Rank("b", "c"), 0);
  EXPECT_EQ(m.Rank("x", "y"), -1);
  std::vector<std::string_view> pieces;
  BpeMergeWord("abc", m, &pieces);  // "b c" (rank 0) beats "a b" (rank 1), then "a bc".
  EXPECT_THAT(pieces, ElementsAre("abc"));
  pieces.clear();
  BpeMergeWord("abab", m, &pieces);  // Equal ranks: leftmost first; no "ab ab" merge.
  EXPECT_THAT(pieces, ElementsAre("ab", "ab"));
}

// A byte-level vocabulary: the 256 byte symbols, then merged tokens and special tokens.
std::string WriteBpeVocab(const std::string& name, const std::string& pre,
                          const std::string& model_name = "") {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(ByteToUnicodeUtf8(b));
  std::vector<int32_t> types(256, 1);
  auto add = [&](const std::string& t, int type) {
    tokens.push_back(t);
    types.push_back(type);
  };
  add("he", 1);             // 256
  add("ll", 1);             // 257
  add("hell", 1);           // 258
  add("hello", 1);          // 259
  add("\xc4\xa0w", 1);      // 260 "Ġw"
  add("<|im_end|>", 3);     // 261
  add("<think>", 4);        // 262
  add("<|endoftext|>", 3);  // 263
  const std::string path = testing::TempDir() + "/" + name + ".gguf";
  auto w = gguf::Writer::Create(path);
  EXPECT_TRUE(w.ok());
  (*w)->SetValue("general.architecture", gguf::Value::Str("llama"));
  if (!model_name.empty()) (*w)->SetValue("general.name", gguf::Value::Str(model_name));
  (*w)->SetValue("tokenizer.ggml.model", gguf::Value::Str("gpt2"));
  if (!pre.empty()) (*w)->SetValue("tokenizer.ggml.pre", gguf::Value::Str(pre));
  (*w)->SetValue("tokenizer.ggml.tokens", gguf::Value::StrArray(tokens));
  (*w)->SetValue("tokenizer.ggml.token_type", gguf::Value::I32Array(types));
  (*w)->SetValue("tokenizer.ggml.merges",
                 gguf::Value::StrArray({"h e", "l l", "he ll", "hell o", "\xc4\xa0 w"}));
  (*w)->SetValue("tokenizer.ggml.eos_token_id", gguf::Value::U32(263));
  EXPECT_TRUE((*w)->Finish().ok());
  return path;
}

std::unique_ptr<Tokenizer> Load(const std::string& path) {
  auto file = gguf::File::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  auto tok = Tokenizer::FromGguf(**file);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

TEST(Tokenizer, ControlTokenTextInPlainRangesStaysText) {
  auto t = Load(WriteBpeVocab("bpe_plain", "gpt-2"));
  ASSERT_NE(t, nullptr);
  // "<|im_end|>he<|im_end|>": the second control text lies in a plain range, the first not.
  const std::string text = "<|im_end|>he<|im_end|>";
  const std::vector<std::pair<size_t, size_t>> plain = {{10, text.size()}};
  std::vector<int32_t> want = {261};
  for (int32_t id : t->Encode("he<|im_end|>", false, false)) want.push_back(id);
  EXPECT_EQ(t->EncodeWithPlainRanges(text, false, plain), want);
  // No range: parse_special as before; a range over the whole text: none is parsed.
  EXPECT_EQ(t->EncodeWithPlainRanges(text, false, {}), t->Encode(text, false, true));
  const std::vector<std::pair<size_t, size_t>> all = {{0, text.size()}};
  EXPECT_EQ(t->EncodeWithPlainRanges(text, false, all), t->Encode(text, false, false));
  // User-defined tokens are matched everywhere, as without parse_special.
  EXPECT_THAT(t->EncodeWithPlainRanges("he<think>", false, all), ElementsAre(256, 262));
}

TEST(Tokenizer, BpeSpecialTokensAndDefaults) {
  auto t = Load(WriteBpeVocab("bpe_basic", "gpt-2"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 264);
  EXPECT_THAT(t->Encode("hello w", false, false), ElementsAre(259, 260));
  // Control tokens only with parse_special; user-defined ones always.
  const std::vector<int32_t> im_end_as_text = t->Encode("<|im_end|>", false, false);
  EXPECT_GT(im_end_as_text.size(), 1u);
  EXPECT_THAT(t->Encode("<|im_end|>", false, true), ElementsAre(261));
  EXPECT_THAT(t->Encode("he<think>", false, false), ElementsAre(256, 262));
  // gpt2 defaults: BOS = 11 (in range here), no add_bos / add_eos unless the file says so.
  EXPECT_EQ(t->bos_id(), 11);
  EXPECT_EQ(t->eos_id(), 263);
  EXPECT_FALSE(t->add_bos());
  EXPECT_THAT(t->Encode("he", true, false), ElementsAre(256));
  // End of generation: EOS and the <|im_end|> text.
  EXPECT_TRUE(t->IsEndOfGeneration(261));
  EXPECT_TRUE(t->IsEndOfGeneration(263));
  EXPECT_FALSE(t->IsEndOfGeneration(262));
  EXPECT_EQ(t->TokenToPiece(260), " w");
  EXPECT_EQ(t->TokenToPiece(262), "<think>");
  EXPECT_EQ(t->TokenId("\xc4\xa0w"), 260);
  EXPECT_EQ(t->TokenId("nope"), std::nullopt);
  EXPECT_EQ(t->Decode(t->Encode("hello w<|im_end|>", false, true)), "hello w<|im_end|>");
  EXPECT_EQ(t->Decode(t->Encode("hello w<|im_end|>", false, true), /*skip_special=*/true),
            "hello w");
}

TEST(Tokenizer, InvalidUtf8IsTokenizedAsReplacementCharacter) {
  auto t = Load(WriteBpeVocab("bpe_utf8", "qwen2"));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Encode("a\xff"
                      "b",
                      false, false),
            t->Encode("a\xef\xbf\xbd"
                      "b",
                      false, false));
}

TEST(Tokenizer, Llama3DefaultsAndRstripByModelName) {
  auto t = Load(WriteBpeVocab("bpe_llama3", "llama-bpe"));
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->add_bos());  // llama.cpp's default for the llama3 family.
  EXPECT_THAT(t->Encode("he", true, false), ElementsAre(11, 256));
  // Phi-3 files get rstrip on special tokens: spaces after <|im_end|> are dropped.
  auto phi = Load(WriteBpeVocab("bpe_phi3", "gpt-2", "Phi-3 mini"));
  ASSERT_NE(phi, nullptr);
  EXPECT_THAT(phi->Encode("<|im_end|>  he", false, true), ElementsAre(261, 256));
  EXPECT_THAT(t->Encode("<|im_end|> he", false, true), ElementsAre(261, ' ', 256));  // Ġ = byte 32
}

TEST(Tokenizer, ErrorsNameTheKey) {
  auto open_error = [](const std::string& path) {
    auto file = gguf::File::Open(path);
    EXPECT_TRUE(file.ok());
    auto tok = Tokenizer::FromGguf(**file);
    EXPECT_FALSE(tok.ok());
    return std::string(tok.status().message());
  };
  EXPECT_THAT(open_error(WriteBpeVocab("bpe_bad_pre", "gpt2")),
              testing::AllOf(HasSubstr("tokenizer.ggml.pre"), HasSubstr("'gpt2'")));
  auto write = [](const std::string& name, const std::function<void(gguf::Writer&)>& fill) {
    const std::string path = testing::TempDir() + "/" + name + ".gguf";
    auto w = gguf::Writer::Create(path);
    EXPECT_TRUE(w.ok());
    fill(**w);
    EXPECT_TRUE((*w)->Finish().ok());
    return path;
  };
  EXPECT_THAT(open_error(write("no_model", [](gguf::Writer&) {})),
              HasSubstr("tokenizer.ggml.model"));
  EXPECT_THAT(open_error(write("bad_model",
                               [](gguf::Writer& w) {
                                 w.SetValue("tokenizer.ggml.model", gguf::Value::Str("t9"));
                               })),
              testing::AllOf(HasSubstr("tokenizer.ggml.model"), HasSubstr("'t9'")));
  EXPECT_THAT(open_error(write("no_tokens",
                               [](gguf::Writer& w) {
                                 w.SetValue("tokenizer.ggml.model", gguf::Value::Str("llama"));
                               })),
              HasSubstr("tokenizer.ggml.tokens"));
  EXPECT_THAT(open_error(write("bad_merges",
                               [](gguf::Writer& w) {
                                 w.SetValue("tokenizer.ggml.model", gguf::Value::Str("gpt2"));
                                 w.SetValue("tokenizer.ggml.merges", gguf::Value::I32Array({1}));
                                 w.SetValue("tokenizer.ggml.tokens", gguf::Value::StrArray({"a"}));
                               })),
              HasSubstr("tokenizer.ggml.merges"));
  EXPECT_THAT(open_error(write("short_scores",
                               [](gguf::Writer& w) {
                                 w.SetValue("tokenizer.ggml.model", gguf::Value::Str("llama"));
                                 w.SetValue("tokenizer.ggml.tokens",
                                            gguf::Value::StrArray({"a", "b"}));
                                 w.SetValue("tokenizer.ggml.scores", gguf::Value::F32Array({0}));
                               })),
              HasSubstr("tokenizer.ggml.scores"));
}

// SPM: <unk> <s> </s>, 256 byte tokens, then pieces scored so "▁h" + "i" wins over "h" + "i".
TEST(Tokenizer, SpmLeadingSpaceAndByteFallback) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
    scores.push_back(0);
  }
  const std::string sp = "\xe2\x96\x81";
  for (const auto& [t, s] : std::vector<std::pair<std::string, float>>{
           {sp, -1}, {"h", -1}, {"i", -1}, {sp + "h", -2}, {"hi", -3}, {sp + "hi", -4}}) {
    tokens.push_back(t);
    types.push_back(1);
    scores.push_back(s);
  }
  const int32_t kSp = 259, kSpH = 262, kSpHi = 264;
  const std::string path = testing::TempDir() + "/spm_small.gguf";
  {
    auto w = gguf::Writer::Create(path);
    ASSERT_TRUE(w.ok());
    (*w)->SetValue("tokenizer.ggml.model", gguf::Value::Str("llama"));
    (*w)->SetValue("tokenizer.ggml.tokens", gguf::Value::StrArray(tokens));
    (*w)->SetValue("tokenizer.ggml.token_type", gguf::Value::I32Array(types));
    (*w)->SetValue("tokenizer.ggml.scores", gguf::Value::F32Array(scores));
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto t = Load(path);
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->add_bos());  // SPM default; BOS 1, EOS 2.
  // "▁hi": "▁h" (-2) merges before "hi" (-3), then "▁h"+"i" = "▁hi".
  EXPECT_THAT(t->Encode("hi", true, false), ElementsAre(1, kSpHi));
  // "é" is no token: its two UTF-8 bytes fall back to <0xC3> <0xA9>.
  EXPECT_THAT(t->Encode("h\xc3\xa9", false, false), ElementsAre(kSpH, 3 + 0xC3, 3 + 0xA9));
  // After a special token the text gets the space prefix again.
  EXPECT_THAT(t->Encode("</s>hi", false, true), ElementsAre(2, kSpHi));
  EXPECT_THAT(t->Encode(" ", false, false), ElementsAre(kSp, kSp));
  // Decode drops the prefix space of the first piece only.
  EXPECT_EQ(t->Decode(t->Encode("hi hi", false, false)), "hi hi");
  EXPECT_EQ(t->Decode(t->Encode("hi", true, false), /*skip_special=*/true), " hi");
  EXPECT_EQ(t->TokenToPiece(3 + 0x41), "A");
}

// "gemma4": <pad> <eos> <bos>, 256 byte tokens, then pieces formed by merges over raw UTF-8.
TEST(Tokenizer, Gemma4BpeWithSpacesAsU2581) {
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>"};
  std::vector<int32_t> types = {3, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
  }
  const std::string sp = "\xe2\x96\x81";
  for (const std::string& t : {sp, std::string("h"), std::string("i"), sp + "h", std::string("hi"),
                               sp + "hi", std::string("\n"), std::string("\n\n"),
                               std::string("\n\n\n")}) {
    tokens.push_back(t);
    types.push_back(1);
  }
  const int32_t kH = 260, kHi = 263, kSpHi = 264, kNl = 265, kNl2 = 266, kNl3 = 267;
  const std::string path = testing::TempDir() + "/gemma4_small.gguf";
  {
    auto w = gguf::Writer::Create(path);
    ASSERT_TRUE(w.ok());
    (*w)->SetValue("tokenizer.ggml.model", gguf::Value::Str("gemma4"));
    // Ignored: a "gemma4" vocabulary always uses Gemma 4's pre-tokenizer.
    (*w)->SetValue("tokenizer.ggml.pre", gguf::Value::Str("qwen2"));
    (*w)->SetValue("tokenizer.ggml.tokens", gguf::Value::StrArray(tokens));
    (*w)->SetValue("tokenizer.ggml.token_type", gguf::Value::I32Array(types));
    // No merge builds "\n\n\n" from "\n\n" + "\n".
    (*w)->SetValue("tokenizer.ggml.merges",
                   gguf::Value::StrArray({sp + " h", "h i", sp + "h i", "\n \n"}));
    (*w)->SetValue("tokenizer.ggml.bos_token_id", gguf::Value::U32(2));
    (*w)->SetValue("tokenizer.ggml.eos_token_id", gguf::Value::U32(1));
    (*w)->SetValue("tokenizer.ggml.add_bos_token", gguf::Value::Bool(false));
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto t = Load(path);
  ASSERT_NE(t, nullptr);
  EXPECT_TRUE(t->add_bos());  // Forced on for Gemma 4 despite the key.
  EXPECT_EQ(t->bos_id(), 2);
  EXPECT_TRUE(t->IsEndOfGeneration(1));
  // "hi▁hi": "▁h" (rank 0) and "hi" (rank 1) first, then "▁h" + "i" (rank 2).
  EXPECT_THAT(t->Encode("hi hi", true, false), ElementsAre(2, kHi, kSpHi));
  // A newline run that is a token is taken whole; one that is not is merged as usual.
  EXPECT_THAT(t->Encode("hi\n\n\nhi", false, false), ElementsAre(kHi, kNl3, kHi));
  EXPECT_THAT(t->Encode("\n\n\n\n\n", false, false), ElementsAre(kNl2, kNl2, kNl));
  // "é" is no token: its UTF-8 bytes fall back to <0xC3> <0xA9>.
  EXPECT_THAT(t->Encode("h\xc3\xa9", false, false), ElementsAre(kH, 3 + 0xC3, 3 + 0xA9));
  EXPECT_EQ(t->TokenToPiece(kSpHi), " hi");
  EXPECT_EQ(t->Decode(t->Encode(" hi\xc3\xa9\n\n\n", true, false), /*skip_special=*/true),
            " hi\xc3\xa9\n\n\n");
}

TEST(Utf8Stream, HoldsIncompleteCharacters) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("h\xe2\x82"), "h");
  EXPECT_EQ(s.pending_bytes(), 2u);
  EXPECT_EQ(s.Push("\xac!"), "\xe2\x82\xac!");
  EXPECT_EQ(s.Push("\xf0\x9f"), "");
  EXPECT_EQ(s.Push("\x98"), "");
  EXPECT_EQ(s.Push("\x80"), "\xf0\x9f\x98\x80");
  // Invalid bytes pass through at once; a broken sequence is released when proven invalid.
  EXPECT_EQ(s.Push("\xff"), "\xff");
  EXPECT_EQ(s.Push("\xe2"), "");
  EXPECT_EQ(s.Push("x"), "\xe2x");
  EXPECT_EQ(s.Push("\xed\xa0"), "\xed\xa0");  // Surrogate prefix: invalid at the second byte.
  EXPECT_EQ(s.Push("\xc3"), "");
  EXPECT_EQ(s.Flush(), "\xc3");
  EXPECT_EQ(s.pending_bytes(), 0u);
}

}  // namespace
}  // namespace fucina
