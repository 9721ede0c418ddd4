#include "models/tokenizer/pretokenize.h"

#include <algorithm>
#include <cstddef>
#include <initializer_list>

#include "models/tokenizer/unicode.h"

namespace fucina {
namespace {

// A text as code points with their class flags, split into pieces; each stage re-splits every
// piece independently (a regex never matches across the boundary of an earlier piece).
struct Text {
  std::vector<uint32_t> cps;
  std::vector<uint16_t> flags;
};

// Outside [begin, end) a piece has no characters: kOut / flags 0, which no real code point has.
constexpr uint32_t kOut = 0xFFFFFFFF;

class Piece {
 public:
  Piece(const Text& t, size_t begin, size_t end, std::vector<size_t>* lens)
      : t_(t), begin_(begin), end_(end), prev_end_(begin), lens_(lens) {}

  uint32_t Cp(size_t pos) const { return pos >= begin_ && pos < end_ ? t_.cps[pos] : kOut; }
  uint16_t Flags(size_t pos) const { return pos >= begin_ && pos < end_ ? t_.flags[pos] : 0; }
  size_t begin() const { return begin_; }
  size_t end() const { return end_; }
  // Ends the current word at `end`; returns its length (0 adds nothing).
  size_t Cut(size_t end) {
    const size_t len = end - prev_end_;
    if (len > 0) lens_->push_back(len);
    prev_end_ = end;
    return len;
  }

 private:
  const Text& t_;
  size_t begin_, end_, prev_end_;
  std::vector<size_t>* lens_;
};

bool IsL(uint16_t f) { return f & kCpLetter; }
bool IsN(uint16_t f) { return f & kCpNumber; }
bool IsWs(uint16_t f) { return f & kCpWhitespace; }
bool IsCrLf(uint32_t c) { return c == '\r' || c == '\n'; }

// Lowercase for the case-insensitive contractions: only ASCII lowercases into [a-z] among the
// letters compared (tools/gen_unicode_tables.py asserts this for the whole table).
uint32_t LowerAscii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// 's 't 'm 'd 're 've 'll at `pos`: the contraction's length, or 0.
size_t Contraction(const Piece& p, size_t pos, bool ignore_case) {
  if (p.Cp(pos) != '\'' || pos + 1 >= p.end()) return 0;
  auto at = [&](size_t i) { return ignore_case ? LowerAscii(p.Cp(i)) : p.Cp(i); };
  const uint32_t c1 = at(pos + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 < p.end()) {
    const uint32_t c2 = at(pos + 2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
      return 3;
    }
  }
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void SplitGpt2(Piece& p) {
  for (size_t pos = p.begin(); pos < p.end();) {
    const uint32_t cp = p.Cp(pos);
    const uint16_t flags = p.Flags(pos);
    if (const size_t n = Contraction(p, pos, /*ignore_case=*/false)) {
      pos += p.Cut(pos + n);
      continue;
    }
    // With a leading space the class is decided by the character after it.
    uint16_t f2 = cp == ' ' ? p.Flags(pos + 1) : flags;
    if (IsL(f2) || IsN(f2)) {
      const uint16_t cls = IsL(f2) ? kCpLetter : kCpNumber;
      pos += cp == ' ';
      while (f2 & cls) f2 = p.Flags(++pos);
      p.Cut(pos);
      continue;
    }
    auto other = [](uint16_t f) { return !(IsWs(f) || IsL(f) || IsN(f)) && f != 0; };
    if (other(f2)) {
      pos += cp == ' ';
      while (other(f2)) f2 = p.Flags(++pos);
      p.Cut(pos);
      continue;
    }
    size_t num_ws = 0;
    while (IsWs(p.Flags(pos + num_ws))) ++num_ws;
    if (num_ws > 1 && p.Cp(pos + num_ws) != kOut) {  // \s+(?!\S): leave the last one.
      pos += num_ws - 1;
      p.Cut(pos);
      continue;
    }
    if (num_ws > 0) {
      pos += num_ws;
      p.Cut(pos);
      continue;
    }
    p.Cut(++pos);  // Nothing matches (e.g. U+FFFD after a space-less class change).
  }
}

// Llama 3 / Qwen2 / Qwen3.5:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with `marks` (Qwen3.5) \p{M} joins \p{L} in letter runs and leaves the punctuation class.
void SplitLlama3Like(Piece& p, size_t max_digits, bool marks) {
  const uint16_t letter = marks ? (kCpLetter | kCpMark) : kCpLetter;
  auto is_letter = [&](uint16_t f) { return (f & letter) != 0; };
  auto other = [&](uint16_t f) { return !(IsWs(f) || is_letter(f) || IsN(f)); };
  for (size_t pos = p.begin(); pos < p.end();) {
    const uint32_t cp = p.Cp(pos);
    const uint16_t flags = p.Flags(pos);
    if (const size_t n = Contraction(p, pos, /*ignore_case=*/true)) {
      pos += p.Cut(pos + n);
      continue;
    }
    if (!(IsCrLf(cp) || IsN(flags))) {
      if (is_letter(flags) || is_letter(p.Flags(pos + 1))) {
        ++pos;
        while (is_letter(p.Flags(pos))) ++pos;
        p.Cut(pos);
        continue;
      }
    }
    if (IsN(flags)) {
      size_t start = pos;
      while (IsN(p.Flags(pos))) {
        if (++pos - start >= max_digits) {
          p.Cut(pos);
          start = pos;
        }
      }
      p.Cut(pos);
      continue;
    }
    // The class test reads the character after a space, the "is there a character" test the
    // current one, as in llama.cpp (a lone trailing space becomes a word here).
    uint16_t f2 = cp == ' ' ? p.Flags(pos + 1) : flags;
    if (other(f2) && flags != 0) {
      pos += cp == ' ';
      while (other(f2) && f2 != 0) f2 = p.Flags(++pos);
      while (IsCrLf(p.Cp(pos))) ++pos;
      p.Cut(pos);
      continue;
    }
    size_t num_ws = 0;
    size_t last_crlf_end = 0;
    while (IsWs(p.Flags(pos + num_ws))) {
      if (IsCrLf(p.Cp(pos + num_ws))) last_crlf_end = pos + num_ws + 1;
      ++num_ws;
    }
    if (last_crlf_end > 0) {  // \s*[\r\n]+
      pos = last_crlf_end;
      p.Cut(pos);
      continue;
    }
    if (num_ws > 1 && p.Cp(pos + num_ws) != kOut) {
      pos += num_ws - 1;
      p.Cut(pos);
      continue;
    }
    if (num_ws > 0) {
      pos += num_ws;
      p.Cut(pos);
      continue;
    }
    p.Cut(++pos);
  }
}

// A regex that is one character class with '+': maximal runs of class members are words and
// so are the runs between them (what llama.cpp's regex_iterator loop yields).
template <typename Pred>
void SplitRuns(Piece& p, Pred in_class) {
  size_t pos = p.begin();
  while (pos < p.end()) {
    const bool member = in_class(pos);
    while (pos < p.end() && in_class(pos) == member) ++pos;
    p.Cut(pos);
  }
}

// A regex matching exactly `width` consecutive class members: leftmost non-overlapping matches
// are words; the text between matches forms one word per gap.
template <typename Pred>
void SplitFixed(Piece& p, size_t width, Pred in_class) {
  size_t pos = p.begin();
  while (pos < p.end()) {
    size_t k = 0;
    while (k < width && pos + k < p.end() && in_class(pos + k)) ++k;
    if (k == width) {
      p.Cut(pos);  // The gap before the match.
      pos += width;
      p.Cut(pos);
    } else {
      ++pos;
    }
  }
  p.Cut(p.end());
}

// llama.cpp matches \p{P} on a class byte for non-ASCII code points and on the ASCII punctuation
// list for ASCII, which together are exactly the P categories; `extra` adds ASCII characters.
bool IsPunctOr(const Piece& p, size_t pos, std::string_view extra) {
  const uint32_t c = p.Cp(pos);
  if (c < 0x80 && extra.find(static_cast<char>(c)) != std::string_view::npos) return true;
  return (p.Flags(pos) & kCpPunctuation) != 0;
}

using Stage = void (*)(Piece&);

// [^\n]+|[\n]+
void StageNewlineRuns(Piece& p) {
  SplitRuns(p, [&](size_t i) { return p.Cp(i) == '\n'; });
}

void StageGpt2(Piece& p) { SplitGpt2(p); }
void StageLlama3(Piece& p) { SplitLlama3Like(p, 3, false); }
void StageQwen2(Piece& p) { SplitLlama3Like(p, 1, false); }
void StageQwen35(Piece& p) { SplitLlama3Like(p, 1, true); }
// [\p{P}\$\+<=>\^~\|]+
void StagePunctRuns(Piece& p) {
  SplitRuns(p, [&](size_t i) { return IsPunctOr(p, i, "$+<=>^~|"); });
}
// [\p{P}\$\+<=>\^~\|`]+
void StagePunctRunsFalcon(Piece& p) {
  SplitRuns(p, [&](size_t i) { return IsPunctOr(p, i, "$+<=>^~|`"); });
}
// \p{N}+
void StageNumberRuns(Piece& p) {
  SplitRuns(p, [&](size_t i) { return IsN(p.Flags(i)); });
}
// \p{N}
void StageSingleNumbers(Piece& p) {
  SplitFixed(p, 1, [&](size_t i) { return IsN(p.Flags(i)); });
}
// [0-9][0-9][0-9]
void StageDigitTriples(Piece& p) {
  SplitFixed(p, 3, [&](size_t i) {
    const uint32_t c = p.Cp(i);
    return c >= '0' && c <= '9';
  });
}

std::vector<Stage> StagesOf(PreTokenizer kind) {
  switch (kind) {
    case PreTokenizer::kDefault:
      return {StagePunctRuns, StageGpt2, StageNumberRuns, StageDigitTriples};
    case PreTokenizer::kGpt2:
      return {StageGpt2};
    case PreTokenizer::kLlama3:
      return {StageLlama3};
    case PreTokenizer::kQwen2:
      return {StageQwen2};
    case PreTokenizer::kQwen35:
      return {StageQwen35};
    case PreTokenizer::kStarcoder:
      return {StageSingleNumbers, StageGpt2};
    case PreTokenizer::kFalcon:
      return {StagePunctRunsFalcon, StageGpt2, StageDigitTriples};
    case PreTokenizer::kNewlines:
      return {StageNewlineRuns};
  }
  return {};
}

bool In(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::optional<PreTokenizerSpec> FindPreTokenizer(std::string_view pre) {
  PreTokenizerSpec s;
  if (pre.empty() || pre == "default") {
    s.kind = PreTokenizer::kDefault;
  } else if (In(pre, {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                      "midm-2.0", "lfm2", "jina-v5-nano"})) {
    s.kind = PreTokenizer::kLlama3;
    s.ignore_merges = true;
    s.add_bos = true;
  } else if (In(pre, {"dbrx", "smaug-bpe"})) {
    s.kind = PreTokenizer::kLlama3;
  } else if (In(pre, {"glm4", "chatglm-bpe"})) {
    s.kind = PreTokenizer::kLlama3;
    s.no_bos = true;
  } else if (pre == "falcon") {
    s.kind = PreTokenizer::kFalcon;
  } else if (In(pre, {"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
                      "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "exaone4", "mpt", "olmo",
                      "jais", "trillion", "granite-docling"})) {
    s.kind = PreTokenizer::kGpt2;
  } else if (In(pre, {"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone",
                      "minerva-7b", "mellum2"})) {
    s.kind = PreTokenizer::kStarcoder;
  } else if (In(pre, {"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2",
                      "hunyuan", "solar-open", "grok-2"})) {
    s.kind = PreTokenizer::kQwen2;
  } else if (pre == "qwen35") {
    s.kind = PreTokenizer::kQwen35;
  } else if (In(pre, {"gemma4", "granite-embed-multi-311m"})) {
    s.kind = PreTokenizer::kNewlines;
    s.escape_whitespaces = true;
    s.newline_words_whole = true;
    s.force_add_bos = true;
  } else {
    return std::nullopt;
  }
  return s;
}

std::vector<std::string> PreTokenize(PreTokenizer kind, std::string_view text) {
  Text t;
  t.cps = DecodeUtf8Lenient(text);
  t.flags.resize(t.cps.size());
  for (size_t i = 0; i < t.cps.size(); ++i) t.flags[i] = CodepointFlags(t.cps[i]);

  std::vector<size_t> lens = {t.cps.size()};
  std::vector<size_t> next;
  for (Stage stage : StagesOf(kind)) {
    next.clear();
    size_t start = 0;
    for (size_t len : lens) {
      Piece piece(t, start, start + len, &next);
      stage(piece);
      start += len;
    }
    lens.swap(next);
  }

  std::vector<std::string> words;
  words.reserve(lens.size());
  size_t start = 0;
  for (size_t len : lens) {
    std::string& w = words.emplace_back();
    for (size_t i = start; i < start + len; ++i) AppendUtf8(t.cps[i], &w);
    start += len;
  }
  return words;
}

}  // namespace fucina
