// Unicode helpers for the tokenizers: code point classes, UTF-8 conversion with llama.cpp's
// error handling, and GPT-2's byte <-> printable code point mapping.
#ifndef FUCINA_MODELS_TOKENIZER_UNICODE_H_
#define FUCINA_MODELS_TOKENIZER_UNICODE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fucina {

// Class flags of one code point: exactly one of the category bits (from the general category)
// plus kCpWhitespace for the White_Space property. Values must match
// tools/gen_unicode_tables.py.
inline constexpr uint16_t kCpUndefined = 0x0001;    // Cn (unassigned).
inline constexpr uint16_t kCpNumber = 0x0002;       // \p{N}
inline constexpr uint16_t kCpLetter = 0x0004;       // \p{L}
inline constexpr uint16_t kCpSeparator = 0x0008;    // \p{Z}
inline constexpr uint16_t kCpMark = 0x0010;         // \p{M}
inline constexpr uint16_t kCpPunctuation = 0x0020;  // \p{P}
inline constexpr uint16_t kCpSymbol = 0x0040;       // \p{S}
inline constexpr uint16_t kCpControl = 0x0080;      // \p{C} except Cn.
inline constexpr uint16_t kCpWhitespace = 0x0100;   // \s

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Flags of `cp`; 0 above U+10FFFF (a value no in-range code point has).
uint16_t CodepointFlags(uint32_t cp);
// Unicode version of the tables.
const char* UnicodeTablesVersion();

// Decodes like llama.cpp's unicode_cpts_from_utf8: a lead byte with enough well-formed
// continuation bytes yields its code point (overlong forms and surrogates are not rejected);
// any other byte yields U+FFFD and decoding resumes at the next byte.
std::vector<uint32_t> DecodeUtf8Lenient(std::string_view text);
// Appends the UTF-8 form of `cp` (<= U+10FFFF; surrogates are encoded as 3 bytes).
void AppendUtf8(uint32_t cp, std::string* out);
// Length of the UTF-8 sequence a byte starts, from its high nibble only (1 for continuation
// bytes), as llama.cpp's unicode_len_utf8.
inline int Utf8SeqLen(uint8_t lead) {
  static constexpr int8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// GPT-2 byte-level encoding: each byte maps to a printable code point (bytes_to_unicode).
// ByteToUnicode returns that code point's UTF-8; UnicodeToByte inverts it (-1 if `cp` is not
// one of the 256 images).
const std::string& ByteToUnicodeUtf8(uint8_t byte);
int UnicodeToByte(uint32_t cp);

namespace unicode_internal {
struct CodepointRange {
  uint32_t first;
  uint16_t flags;
};
extern const CodepointRange kCodepointRanges[];
extern const int kNumCodepointRanges;
extern const char kUnicodeVersion[];
}  // namespace unicode_internal

}  // namespace fucina

#endif  // FUCINA_MODELS_TOKENIZER_UNICODE_H_
