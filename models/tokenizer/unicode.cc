#include "models/tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace fucina {
namespace {

// Flags of the BMP, looked up once per code point on every tokenization: a flat table trades
// 128 KiB for skipping the binary search on nearly all text.
const std::array<uint16_t, 0x10000>& BmpFlags() {
  static const auto* table = [] {
    auto* t = new std::array<uint16_t, 0x10000>();
    using unicode_internal::kCodepointRanges;
    using unicode_internal::kNumCodepointRanges;
    for (int i = 0; i < kNumCodepointRanges && kCodepointRanges[i].first < 0x10000; ++i) {
      const uint32_t end = i + 1 < kNumCodepointRanges
                               ? std::min<uint32_t>(kCodepointRanges[i + 1].first, 0x10000)
                               : 0x10000;
      std::fill(t->begin() + kCodepointRanges[i].first, t->begin() + end,
                kCodepointRanges[i].flags);
    }
    return t;
  }();
  return *table;
}

struct ByteMaps {
  std::array<std::string, 256> to_utf8;
  std::array<int16_t, 324> from_cp;  // Images are all below U+0144.
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in increasing byte order.
const ByteMaps& GetByteMaps() {
  static const ByteMaps* maps = [] {
    auto* m = new ByteMaps();
    m->from_cp.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : 256 + next++;
      AppendUtf8(cp, &m->to_utf8[b]);
      m->from_cp[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return *maps;
}

}  // namespace

uint16_t CodepointFlags(uint32_t cp) {
  if (cp < 0x10000) return BmpFlags()[cp];
  if (cp > kMaxCodepoint) return 0;
  using unicode_internal::kCodepointRanges;
  using unicode_internal::kNumCodepointRanges;
  const auto* end = kCodepointRanges + kNumCodepointRanges;
  const auto* it = std::upper_bound(
      kCodepointRanges, end, cp,
      [](uint32_t v, const unicode_internal::CodepointRange& r) { return v < r.first; });
  return (it - 1)->flags;  // kCodepointRanges[0].first == 0, so it > kCodepointRanges.
}

const char* UnicodeTablesVersion() { return unicode_internal::kUnicodeVersion; }

std::vector<uint32_t> DecodeUtf8Lenient(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  auto cont = [&](size_t i) { return i < n && (s[i] & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      i += 1;
    } else if ((b & 0xE0) == 0xC0 && cont(i + 1)) {
      out.push_back((uint32_t{b & 0x1Fu} << 6) | (s[i + 1] & 0x3F));
      i += 2;
    } else if ((b & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
      out.push_back((uint32_t{b & 0x0Fu} << 12) | (uint32_t{s[i + 1] & 0x3Fu} << 6) |
                    (s[i + 2] & 0x3F));
      i += 3;
    } else if ((b & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      out.push_back((uint32_t{b & 0x07u} << 18) | (uint32_t{s[i + 1] & 0x3Fu} << 12) |
                    (uint32_t{s[i + 2] & 0x3Fu} << 6) | (s[i + 3] & 0x3F));
      i += 4;
    } else {
      out.push_back(kReplacementChar);
      i += 1;
    }
  }
  return out;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | ((cp >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const std::string& ByteToUnicodeUtf8(uint8_t byte) { return GetByteMaps().to_utf8[byte]; }

int UnicodeToByte(uint32_t cp) {
  const auto& maps = GetByteMaps();
  return cp < maps.from_cp.size() ? maps.from_cp[cp] : -1;
}

}  // namespace fucina
